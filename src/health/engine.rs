//! The engine: the I/O shell around [`Probes`]. It feeds it the Proxy
//! cache, runs the probes it says are due on a bounded pool of workers, and
//! publishes what it folds: the snapshot the reconciler reads, the
//! reconcile trigger, the metrics.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use kube::runtime::reflector::Store;
use rustls::ClientConfig;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tracing::{debug, info, Instrument};

use super::metrics::HealthMetrics;
use super::notify::Notifier;
use super::probe::{self, Depth, ProbeError, ProbeResult, Resolver};
use super::probes::{key_of, Defaults, Dropped, Folded, ProbeSpec, Probes, SYNC_EVERY};
use super::sizing::{pool_size, Latency};
use crate::api::health::{HealthReport, HealthSource};
use crate::api::Proxy;
use crate::proxy_store::{ProxyStore, Touch};

/// The health engine: the snapshot readers see, and the settings the loop
/// runs with.
pub struct Engine {
    defaults: Defaults,
    /// The most probes in flight (`--health-workers`).
    workers: usize,
    tls: Arc<ClientConfig>,
    dns: Arc<Resolver>,
    trace_probes: bool,
    metrics: HealthMetrics,
    /// Held probes (the benchmark's switch); none: never held.
    pause: Option<super::Pause>,
    /// Proxies seen failing between probes: probed at once.
    hints: super::Hints,
    /// Per `namespace/name` (the key the schedule interned): the spec
    /// probed (its UID and proxy host) and the report.
    snapshot: RwLock<HashMap<Arc<str>, Published>>,
    /// Walks of the whole Proxy cache so far.
    walks: AtomicU64,
}

impl HealthSource for Engine {
    fn verdict(&self, namespace: &str, name: &str, uid: &str) -> Option<bool> {
        self.report(namespace, name, uid).map(|r| r.healthy)
    }

    fn report(&self, namespace: &str, name: &str, uid: &str) -> Option<HealthReport> {
        let snap = self.snapshot.read().unwrap_or_else(|p| p.into_inner());
        let (spec, r) = snap.get(key_of(namespace, name).as_str())?;
        (spec.uid == uid).then(|| r.clone())
    }

    fn probed_host(&self, namespace: &str, name: &str, uid: &str) -> Option<String> {
        let snap = self.snapshot.read().unwrap_or_else(|p| p.into_inner());
        let (spec, _) = snap.get(key_of(namespace, name).as_str())?;
        (spec.uid == uid).then(|| spec.target.proxy_host.clone())
    }
}

/// A published verdict: the spec probed (its UID and proxy host) and
/// the report.
type Published = (Arc<ProbeSpec>, HealthReport);

const SYNC_EVERY_MS: u64 = SYNC_EVERY.as_millis() as u64;

/// How often a held engine looks at its switch again.
const PAUSED_POLL: std::time::Duration = std::time::Duration::from_millis(100);

struct Done {
    key: Arc<str>,
    spec: Arc<ProbeSpec>,
    depth: Depth,
    started_ms: u64,
    at: DateTime<Utc>,
    result: ProbeResult,
}

impl Engine {
    /// An engine; `workers` is the most probes in flight (at least 1):
    /// the pool is sized below it from the fleet's probe rate and the
    /// probes' latency ([`pool_size`]).
    pub fn new(
        defaults: Defaults,
        workers: usize,
        tls: Arc<ClientConfig>,
        trace_probes: bool,
        metrics: HealthMetrics,
    ) -> Self {
        Engine {
            defaults,
            workers: workers.max(1),
            tls,
            dns: Arc::new(Resolver::default()),
            trace_probes,
            metrics,
            pause: None,
            hints: super::Hints::default(),
            snapshot: RwLock::new(HashMap::new()),
            walks: AtomicU64::new(0),
        }
    }

    /// Probes are dispatched only while `pause` is off (`--bench-routes`).
    pub fn with_pause(mut self, pause: Option<super::Pause>) -> Self {
        self.pause = pause;
        self
    }

    /// Probes at once the proxies `hints` names.
    pub fn with_hints(mut self, hints: super::Hints) -> Self {
        self.hints = hints;
        self
    }

    /// Walks of the whole Proxy cache so far (the start, relists, missed
    /// events, credentials changes and the once-a-minute safety net).
    pub fn walks(&self) -> u64 {
        self.walks.load(Ordering::Relaxed)
    }

    fn paused(&self) -> bool {
        self.pause.as_ref().is_some_and(super::Pause::is_paused)
    }

    /// Host names are resolved through `dns` (a cache).
    pub fn with_resolver(mut self, dns: Resolver) -> Self {
        self.dns = Arc::new(dns);
        self
    }

    fn publish(&self, key: &Arc<str>, spec: Arc<ProbeSpec>, report: HealthReport) {
        let mut snap = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        snap.insert(key.clone(), (spec, report));
    }

    fn withdraw(&self, key: &str) {
        let mut snap = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        snap.remove(key);
    }

    /// Runs until `shutdown` resolves, probing the Proxies in `store`: the
    /// targets follow the store's watch events one Proxy at a time; the
    /// whole store is walked only at the start, after a relist, when this
    /// loop missed events or the credentials changed, and every
    /// [`super::probes::WALK_EVERY`] as a safety net.
    pub async fn run(
        self: Arc<Self>,
        store: ProxyStore,
        mut notifier: Notifier,
        shutdown: impl Future<Output = ()>,
    ) {
        let epoch = Instant::now();
        let now_ms = || u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Subscribed before the first walk: nothing changed after it is
        // missed.
        let mut follow = Some(store.follow());
        let cache = store.reader();
        let mut credentials = self.defaults.credentials.version();
        // At most `slots` in flight, each sending one result: unbounded
        // is bounded.
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let mut latency = Latency::default();
        let mut slots = pool_size(0.0, latency.mean_ms(), self.workers);
        let mut in_flight = 0usize;
        let mut probes = Probes::new(self.defaults.clone())
            .with_slots(slots)
            .sharing(store.ids());
        let mut next_tick = 0u64;
        tokio::pin!(shutdown);
        info!(max_in_flight = self.workers, "Health engine started");
        loop {
            let now = now_ms();
            if let Some(rx) = follow.as_mut() {
                self.follow_changes(rx, &mut probes, &cache, now);
            }
            let seen = self.defaults.credentials.version();
            if seen != credentials || follow.is_none() {
                credentials = seen;
                probes.ask_walk();
            }
            if probes.sync_due(now) {
                self.sync(&mut probes, &cache, now);
            }
            if now >= next_tick {
                next_tick = now + SYNC_EVERY_MS;
                notifier.flush();
                let size = pool_size(probes.rate(), latency.mean_ms(), self.workers);
                if size != slots {
                    debug!(
                        slots = size,
                        probes_per_second = probes.rate(),
                        latency_ms = latency.mean_ms(),
                        "Resized the probe pool"
                    );
                    slots = size;
                    probes.set_slots(slots);
                }
            }
            for key in self.hints.take() {
                if probes.expedite(&key, now) {
                    debug!(proxy = %key, "Seen failing between probes; probing it now");
                }
            }
            let paused = self.paused();
            if !paused {
                for (key, spec, depth) in probes.due(now, slots.saturating_sub(in_flight)) {
                    in_flight += 1;
                    self.spawn_probe(key, (spec, depth), now, done_tx.clone());
                }
            }
            // Held, overdue probes would make the wait zero: look again
            // at the switch a little later instead.
            let wait = if paused {
                PAUSED_POLL
            } else {
                probes.wait(now, slots.saturating_sub(in_flight))
            };
            let changed = async {
                match follow.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut shutdown => break,
                Some(done) = done_rx.recv() => {
                    in_flight = in_flight.saturating_sub(1);
                    latency.observe(done.result.latency);
                    self.fold(&mut probes, done, now_ms(), &mut notifier);
                }
                touch = changed => match touch {
                    Ok(t) => self.follow_one(t, &mut probes, &cache, now_ms()),
                    Err(broadcast::error::RecvError::Lagged(_)) => probes.ask_walk(),
                    // The store is gone (it outlives the engine but for a
                    // bug): walk every second instead.
                    Err(broadcast::error::RecvError::Closed) => follow = None,
                },
                _ = tokio::time::sleep(wait) => {}
            }
        }
        info!(walks = probes.walks(), "Health engine stopped");
    }

    /// Takes every change already announced.
    fn follow_changes(
        &self,
        rx: &mut broadcast::Receiver<Touch>,
        probes: &mut Probes,
        cache: &Store<Proxy>,
        now: u64,
    ) {
        // A store gone is the process ending: the engine stops with it.
        crate::proxy_store::drain(rx, |t| self.follow_one(t, probes, cache, now));
    }

    /// Brings the one Proxy a change names in step (a relist or missed
    /// changes: all).
    fn follow_one(&self, touch: Touch, probes: &mut Probes, cache: &Store<Proxy>, now: u64) {
        let r = match touch {
            Touch::One(r) | Touch::Gone(r) => r,
            Touch::All => return probes.ask_walk(),
        };
        // The store as it is now, whatever the event said: a Proxy
        // deleted and made again is there.
        let current = cache.get(&r);
        let namespace = r.namespace.as_deref().unwrap_or_default();
        if let Some(d) = probes.sync_one((namespace, &r.name), current.as_deref(), now) {
            self.dropped([d]);
        }
    }

    /// Runs one probe and sends its result back.
    fn spawn_probe(
        &self,
        key: Arc<str>,
        (spec, depth): (Arc<ProbeSpec>, Depth),
        now: u64,
        tx: mpsc::UnboundedSender<Done>,
    ) {
        let (tls, dns, trace) = (self.tls.clone(), self.dns.clone(), self.trace_probes);
        tokio::spawn(async move {
            let run = probe::probe_with(&spec.target, &spec.wire, depth, &tls, &dns);
            let result = if trace {
                let span = tracing::info_span!(
                    parent: None,
                    "health.probe",
                    otel.kind = "client",
                    proxy = %key,
                    probe.full = depth == Depth::Full,
                    probe.ok = tracing::field::Empty,
                    probe.latency_ms = tracing::field::Empty,
                    otel.status_code = tracing::field::Empty,
                    otel.status_message = tracing::field::Empty,
                );
                let r = run.instrument(span.clone()).await;
                span.record("probe.ok", r.ok);
                span.record("probe.latency_ms", r.latency.as_millis() as u64);
                if let Some(e) = &r.error {
                    span.record("otel.status_code", "ERROR");
                    span.record("otel.status_message", e.to_string());
                }
                r
            } else {
                run.await
            };
            let _ = tx.send(Done {
                key,
                spec,
                depth,
                started_ms: now,
                at: Utc::now(),
                result,
            });
        });
    }

    /// Syncs `probes` with the whole cache and withdraws the verdicts it
    /// drops (and the series of Proxies that are gone).
    fn sync(&self, probes: &mut Probes, cache: &Store<Proxy>, now: u64) {
        let proxies = cache.state();
        let dropped = probes.sync(proxies.iter().map(|p| &**p), now);
        self.walks.store(probes.walks(), Ordering::Relaxed);
        debug!(
            proxies = proxies.len(),
            walks = probes.walks(),
            "Walked the Proxy cache"
        );
        self.dropped(dropped);
    }

    /// Withdraws the verdicts of `dropped` (and the series of the Proxies
    /// that are gone).
    fn dropped(&self, dropped: impl IntoIterator<Item = Dropped>) {
        for d in dropped {
            if d.gone {
                self.metrics.forget_proxy(&d.key, &ProbeError::REASONS);
            } else {
                debug!(proxy = %d.key, "Probe target changed; starting over");
            }
            self.withdraw(&d.key);
        }
    }

    /// Folds a finished probe and publishes what `probes` says to.
    fn fold(&self, probes: &mut Probes, done: Done, now: u64, notifier: &mut Notifier) {
        let r = &done.result;
        let folded = probes.complete(
            &done.key,
            (&done.spec, done.depth),
            done.started_ms,
            now,
            done.at,
            r,
        );
        match folded {
            Folded::Gone => return,
            Folded::Stale => {
                debug!(proxy = %done.key, "Discarding a stale probe result");
                return;
            }
            Folded::Quiet | Folded::Publish(_) => {}
        }
        let reason = r.error.as_ref().map(ProbeError::reason);
        self.metrics
            .observe(&done.key, &done.spec.provider, reason, r.latency);
        let Folded::Publish(v) = folded else {
            return;
        };
        if v.is_news() {
            let error = r
                .error
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            info!(proxy = %done.key, healthy = v.report.healthy, latencyMillis = v.report.latency_ms, error, "Proxy health changed");
        }
        // The spec probed is the target's current one (a stale result
        // was discarded above), so its UID is the verdict's.
        debug_assert_eq!(v.uid, done.spec.uid);
        self.publish(&done.key, done.spec.clone(), v.report);
        if let Some((ns, name)) = done.key.split_once('/') {
            notifier.notify(ns, name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::probes::tests::{defaults, external, external_in};
    use super::*;
    use crate::proxy_store::HandFill;
    use std::time::Duration;

    /// A "proxy" that answers 200 to every request.
    async fn answering_proxy() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = c.read(&mut buf).await;
                    let _ = c
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        port
    }

    /// An engine of two slots over the default settings.
    fn engine(health: HealthMetrics) -> Engine {
        Engine::new(
            defaults(),
            2,
            super::super::probe::tls_config(None).unwrap(),
            false,
            health,
        )
    }

    /// `engine` running over a store listing `proxies`: the store's
    /// filler, the reconcile triggers, the stop and the task.
    fn run_over(
        engine: &Arc<Engine>,
        proxies: Vec<Proxy>,
        notify: usize,
    ) -> (
        HandFill,
        mpsc::Receiver<kube::runtime::reflector::ObjectRef<Proxy>>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let (store, mut fill) = ProxyStore::by_hand();
        fill.list(proxies);
        let (notifier, rx) = Notifier::channel(notify);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(engine.clone().run(store, notifier, async move {
            let _ = stop_rx.await;
        }));
        (fill, rx, stop_tx, task)
    }

    /// [`run_over`] a store holding the External Proxy `a` (UID `u1`) on
    /// `port`.
    fn run_over_a(
        engine: &Arc<Engine>,
        port: u16,
    ) -> (
        HandFill,
        mpsc::Receiver<kube::runtime::reflector::ObjectRef<Proxy>>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        run_over(engine, vec![external("a", "u1", port)], 4)
    }

    #[tokio::test]
    async fn the_loop_follows_the_stores_events_probes_notifies_restarts_and_prunes() {
        use kube::runtime::watcher::Event;
        let port = answering_proxy().await;
        let mut registry = crate::metrics::Registrar::new();
        let health = HealthMetrics::register(&mut registry, true);
        let metrics = registry.finish();
        let engine = Arc::new(engine(health));
        let (mut writer, mut rx, stop_tx, task) = run_over_a(&engine, port);
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (first.name.as_str(), first.namespace.as_deref()),
            ("a", Some("ns"))
        );
        assert_eq!(engine.verdict("ns", "a", "u1"), Some(true));
        assert_eq!(engine.verdict("ns", "a", "other-uid"), None);
        let r = engine.report("ns", "a", "u1").unwrap();
        assert!(r.message.contains("passed"), "{r:?}");
        // The verdict names the host it went through, so a replacement at
        // another address is not taken for healthy on it.
        assert_eq!(
            engine.probed_host("ns", "a", "u1").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(engine.probed_host("ns", "a", "other-uid"), None);
        // Recreated under the same name: the old verdict is gone, a new
        // first verdict comes for the new UID.
        writer.apply(Event::Apply(external("a", "u2", port)));
        let again = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.name, "a");
        assert_eq!(engine.verdict("ns", "a", "u1"), None);
        assert_eq!(engine.verdict("ns", "a", "u2"), Some(true));
        let text = metrics.encode().unwrap();
        assert!(text.contains("proxy=\"ns/a\""), "{text}");
        assert!(
            text.contains("{provider=\"\",proxy_namespace=\"ns\"}"),
            "the fleet-wide series: {text}"
        );
        // Deleted: pruned, series forgotten.
        writer.apply(Event::Delete(external("a", "u2", port)));
        let mut gone = false;
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if engine.verdict("ns", "a", "u2").is_none()
                && !metrics.encode().unwrap().contains("ns/a")
            {
                gone = true;
                break;
            }
        }
        assert!(gone, "pruned");
        // The change and the delete were followed from their events: the
        // only walk of the store was the first.
        assert_eq!(engine.walks(), 1, "walks of the store");
        // A relist (the watch restarted) is walked.
        writer.list([external("b", "u3", port)]);
        let relisted = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(relisted.name, "b");
        assert_eq!(engine.walks(), 2, "walks of the store");
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    /// The benchmark's switch: a held engine probes nothing; once let go,
    /// the overdue probes run.
    #[tokio::test]
    async fn a_held_engine_probes_nothing_until_let_go() {
        let port = answering_proxy().await;
        let mut registry = crate::metrics::Registrar::new();
        let health = HealthMetrics::register(&mut registry, true);
        let pause = crate::health::Pause::default();
        pause.set(true);
        let engine = Arc::new(engine(health).with_pause(Some(pause.clone())));
        let (_writer, mut rx, stop_tx, task) = run_over_a(&engine, port);
        let held = tokio::time::timeout(Duration::from_millis(2500), rx.recv()).await;
        assert!(held.is_err(), "a verdict while held: {held:?}");
        assert_eq!(engine.verdict("ns", "a", "u1"), None);
        pause.set(false);
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.name, "a");
        assert_eq!(engine.verdict("ns", "a", "u1"), Some(true));
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    /// A "proxy" that accepts connections and never answers.
    async fn tarpit() -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((c, _)) = l.accept().await {
                held.push(c);
            }
        });
        port
    }

    /// 40 tarpits in one namespace and 4 probe slots: the two proxies of
    /// another namespace still get their verdicts long before the first
    /// tarpit probe gives up (30 s). Without shares the tarpits would hold
    /// every slot for the whole timeout.
    #[tokio::test]
    async fn a_namespace_of_tarpits_does_not_hold_back_the_others() {
        let (good, bad) = (answering_proxy().await, tarpit().await);
        let mut registry = crate::metrics::Registrar::new();
        let engine = Arc::new(Engine::new(
            defaults(),
            4,
            super::super::probe::tls_config(None).unwrap(),
            false,
            HealthMetrics::register(&mut registry, false),
        ));
        let tarpits = (0..40).map(|i| {
            let name = format!("t{i}");
            external_in("tarpit", &name, &name, bad, 30)
        });
        let crawl = ["a", "b"].map(|name| external_in("crawl", name, name, good, 30));
        let (_fill, mut rx, stop_tx, task) = run_over(&engine, tarpits.chain(crawl).collect(), 64);
        let mut seen = std::collections::BTreeSet::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            while seen.len() < 2 {
                let n = rx.recv().await.unwrap();
                assert_eq!(n.namespace.as_deref(), Some("crawl"), "{n:?}");
                seen.insert(n.name);
            }
        })
        .await
        .expect("both crawl proxies probed while the tarpits held their slots");
        assert_eq!(engine.verdict("crawl", "a", "a"), Some(true));
        assert_eq!(engine.verdict("crawl", "b", "b"), Some(true));
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_result_for_an_old_uid_is_discarded() {
        let mut registry = crate::metrics::Registrar::new();
        let health = HealthMetrics::register(&mut registry, true);
        let metrics = registry.finish();
        let engine = Engine::new(
            defaults(),
            1,
            super::super::probe::tls_config(None).unwrap(),
            false,
            health,
        );
        let old = super::super::probes::probe_spec(&external("a", "u1", 1), &defaults()).unwrap();
        let mut probes = Probes::new(defaults());
        probes.sync([&external("a", "u2", 1)], 0);
        let (mut n, mut rx) = Notifier::channel(4);
        let done = Done {
            key: "ns/a".into(),
            spec: Arc::new(old),
            depth: Depth::Full,
            started_ms: 0,
            at: Utc::now(),
            result: ProbeResult {
                ok: true,
                latency: Duration::from_millis(5),
                error: None,
            },
        };
        engine.fold(&mut probes, done, 0, &mut n);
        assert_eq!(probes.state("ns/a"), None);
        assert!(rx.try_recv().is_err());
        assert_eq!(engine.verdict("ns", "a", "u1"), None);
        assert_eq!(engine.verdict("ns", "a", "u2"), None);
        assert!(!metrics.encode().unwrap().contains("ns/a"));
    }
}
