//! One term of leadership: the health engine for the whole term, and the
//! work that depends on the providers (GC, provider health, fleet view,
//! create limits, the Proxy controller) for each provider set in force.
//! A reload ends that work (in-flight reconciles finish on the old set)
//! and starts it again on the new set; the controller's first list then
//! reconciles every Proxy, so those waiting for a provider that is now
//! configured go on by themselves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::reload::ProviderSet;
use super::runnables::drain;
use super::{runnables, Operator, SHUTDOWN_GRACE};
use crate::api::Proxy;
use crate::controller::{self, Context, HealthSource};
use crate::gc::{self, Gc};
use crate::proxy_store::ProxyStore;

/// The health engine's notifications, handed from one provider set's
/// controller to the next.
type Triggers = Arc<tokio::sync::Mutex<mpsc::Receiver<ObjectRef<Proxy>>>>;

impl Operator {
    /// Runs leader-only work until `term` is cancelled, then gives it the
    /// `grace` set by then and abandons the rest.
    pub(super) async fn lead_one_term(
        &self,
        term: &CancellationToken,
        grace: &Mutex<Duration>,
        proxies: ProxyStore,
        installation_id: String,
    ) {
        let s = &self.settings;
        let mut engine_work = JoinSet::new();
        let (engine, triggers) = runnables::spawn_health_engine(
            &mut engine_work,
            &s.health,
            proxies.clone(),
            &self.metrics,
            term.clone().cancelled_owned(),
        );
        let triggers: Triggers = Arc::new(tokio::sync::Mutex::new(triggers));
        let mut sets = self.providers.subscribe();
        loop {
            let set = sets.borrow_and_update().clone();
            let work_stop = term.child_token();
            let mut work = JoinSet::new();
            self.spawn_provider_work(
                &mut work,
                &work_stop,
                &set,
                proxies.clone(),
                installation_id.clone(),
                engine.clone(),
                triggers.clone(),
            );
            let reloaded = tokio::select! {
                changed = sets.changed() => changed.is_ok(),
                _ = term.cancelled() => false,
            };
            if reloaded {
                work_stop.cancel();
                let switched = tokio::select! {
                    _ = drain(&mut work, std::future::ready(()), SHUTDOWN_GRACE) => true,
                    // A step-down during the switch: the work left gets
                    // the term's grace below.
                    _ = term.cancelled() => false,
                };
                if switched {
                    info!("Restarted the leader's provider work on the reloaded providers config");
                    continue;
                }
            }
            term.cancelled().await;
            let grace = *grace.lock().unwrap_or_else(|p| p.into_inner());
            tokio::join!(
                drain(&mut work, std::future::ready(()), grace),
                drain(&mut engine_work, std::future::ready(()), grace)
            );
            return;
        }
    }

    /// GC, provider health, the fleet view, the create limits and the
    /// Proxy controller on `set`, all stopping when `stop` fires.
    #[allow(clippy::too_many_arguments)] // one call site; each is a different piece
    fn spawn_provider_work(
        &self,
        tasks: &mut JoinSet<()>,
        stop: &CancellationToken,
        set: &ProviderSet,
        proxies: ProxyStore,
        installation_id: String,
        engine: Arc<crate::health::Engine>,
        triggers: Triggers,
    ) {
        let s = &self.settings;
        let entries = &set.config.providers;
        let gc = Gc::new(
            self.client.clone(),
            set.registry.clone(),
            gc::Settings {
                interval: s.gc.interval,
                min_age: s.gc.min_age,
                max_deletes: s.gc.max_deletes,
                installation_id: installation_id.clone(),
            },
            self.metrics.gc.clone(),
        )
        .with_events(self.events.clone());
        let gc_stop = stop.clone().cancelled_owned();
        tasks.spawn(async move { gc.run(gc_stop).await });
        let fleet = Arc::new(
            crate::fleet::Fleet::new(
                Some(proxies.reader()),
                entries
                    .iter()
                    .map(|p| (p.name.clone(), p.max_unavailable))
                    .collect(),
                s.leases.max_ttl,
            )
            .with_leases(self.lease_store.get().cloned())
            .with_breaker_policies(
                entries
                    .iter()
                    .map(|p| (p.name.clone(), p.circuit_breaker))
                    .collect(),
            )
            .with_surges(
                entries
                    .iter()
                    .map(|p| (p.name.clone(), p.max_surge))
                    .collect(),
            ),
        );
        self.replacer.set_fleet(fleet.clone());
        let fresh = fleet.clone().keep_fresh(stop.clone().cancelled_owned());
        tasks.spawn(fresh);
        let states = fleet.clone();
        self.metrics.circuit.set_states(move || states.states());
        runnables::spawn_provider_health(
            tasks,
            self,
            &set.registry,
            &installation_id,
            fleet.clone(),
            stop,
        );
        let throttle = Arc::new(
            controller::throttle::Throttle::new(&set.config)
                .with_metrics(self.metrics.throttle.clone()),
        );
        let limiters = throttle.clone();
        self.metrics
            .throttle
            .set_limiters(move || limiters.gauges(chrono::Utc::now()));
        let pools = Arc::new(crate::pool::PoolContext {
            client: self.client.clone(),
            proxies: proxies.reader(),
            fleet: fleet.clone(),
            leases: self.lease_store.get().cloned(),
            providers: entries.iter().map(|p| (p.name.clone(), p.limits)).collect(),
            events: Some(self.events.clone()),
            metrics: Some(self.metrics.pool.clone()),
            scaling: Default::default(),
        });
        let (pool_proxies, pool_ns, pool_stop) = (
            proxies.clone(),
            s.proxy_namespace.clone(),
            stop.clone().cancelled_owned(),
        );
        tasks.spawn(async move {
            crate::pool::run(pools, &pool_proxies, pool_ns.as_deref(), pool_stop).await;
        });
        let health_source: Arc<dyn HealthSource> = engine;
        let ctx = Arc::new(
            Context::new(
                self.client.clone(),
                set.registry.clone(),
                installation_id,
                Some(health_source),
            )
            .with_metrics(self.metrics.reconcile.clone())
            .with_throttle(throttle)
            .with_fleet(fleet)
            .with_events(self.events.clone())
            .with_external_namespaces(s.health.defaults.external.clone())
            .with_credentials(s.health.defaults.credentials.clone())
            .with_checker(Arc::new(crate::health::check::Checker::new(
                s.health.defaults.clone(),
                s.health.tls.clone(),
            ))),
        );
        let ns = s.proxy_namespace.clone();
        let concurrency = s.max_concurrent_reconciles;
        let ctl_stop = stop.clone().cancelled_owned();
        tasks.spawn(async move {
            // The term's one engine notifies whichever set's controller
            // runs; each takes the receiver for one notification at a time.
            let events = futures::stream::unfold(triggers, |t| async move {
                let next = t.lock().await.recv().await;
                next.map(|r| (r, t))
            });
            controller::run(
                ctx,
                &proxies,
                ns.as_deref(),
                concurrency,
                Some(events),
                ctl_stop,
            )
            .await;
        });
    }
}
