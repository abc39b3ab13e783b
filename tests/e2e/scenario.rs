//! The harness of the in-process reconcile scenarios: real Proxy objects
//! on the test cluster's API server (finalizer, annotations and status are
//! real writes), the in-memory fake provider behind the registry, a health
//! source the test sets, and one call of `reconcile` per pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use egress_proxies_operator::api::health::{HealthReport, HealthSource};
use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::controller::plan;
use egress_proxies_operator::controller::reconcile::reconcile;
use egress_proxies_operator::controller::throttle::Throttle;
use egress_proxies_operator::controller::{Context, Error};
use egress_proxies_operator::operator::Metrics;
use egress_proxies_operator::provider::fake::FakeProvider;
use egress_proxies_operator::provider::registry::Registry;
use egress_proxies_operator::provider::Provider;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{self, phase};

/// What the health engine would say, set by the test.
#[derive(Default)]
pub struct Verdicts(Mutex<HashMap<(String, String), HealthReport>>);

impl Verdicts {
    /// No verdict, as the engine has none while nothing runs to probe.
    pub fn clear(&self, p: &Proxy) {
        self.0
            .lock()
            .unwrap()
            .remove(&(p.name_any(), p.uid().unwrap()));
    }

    pub fn set(&self, p: &Proxy, healthy: bool, message: &str) {
        self.set_at(p, healthy, message, chrono::Utc::now());
    }

    /// A verdict probed at `at` (a test's clock).
    pub fn set_at(
        &self,
        p: &Proxy,
        healthy: bool,
        message: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let report = HealthReport {
            healthy,
            latency_ms: 12,
            probed_at: at,
            message: message.into(),
        };
        self.0
            .lock()
            .unwrap()
            .insert((p.name_any(), p.uid().unwrap()), report);
    }
}

impl HealthSource for Verdicts {
    fn verdict(&self, namespace: &str, name: &str, uid: &str) -> Option<bool> {
        self.report(namespace, name, uid).map(|r| r.healthy)
    }

    fn report(&self, _namespace: &str, name: &str, uid: &str) -> Option<HealthReport> {
        let v = self.0.lock().unwrap();
        v.get(&(name.to_string(), uid.to_string())).cloned()
    }
}

/// One scenario's world: a namespace, the fake behind a provider named
/// `fake`, the verdicts, and the context every pass shares.
pub struct Scenario {
    pub fake: FakeProvider,
    pub health: Arc<Verdicts>,
    pub ctx: Arc<Context>,
    pub proxies: Api<Proxy>,
}

impl Scenario {
    pub async fn new(prefix: &str) -> Scenario {
        Scenario::with(prefix, FakeProvider::new("fake")).await
    }

    pub async fn with(prefix: &str, fake: FakeProvider) -> Scenario {
        // No jitter: each pass's requeue is exactly the plan's.
        Scenario::jittered(prefix, fake, 0.0).await
    }

    /// A scenario whose requeue jitter is always `unit`.
    pub async fn jittered(prefix: &str, fake: FakeProvider, unit: f64) -> Scenario {
        Scenario::configured(prefix, fake, unit, "").await
    }

    /// A scenario whose provider entry `fake` also has `keys` (lines of
    /// the entry, e.g. its create limits).
    pub async fn configured(prefix: &str, fake: FakeProvider, unit: f64, keys: &str) -> Scenario {
        Scenario::built(prefix, fake, unit, keys, |ctx| ctx).await
    }

    /// [`Scenario::configured`], its context finished by `finish` (an
    /// injected clock, a fleet view).
    pub async fn built(
        prefix: &str,
        fake: FakeProvider,
        unit: f64,
        keys: &str,
        finish: impl FnOnce(Context) -> Context,
    ) -> Scenario {
        let ground = support::ground(prefix).await;
        let doc = format!("providers:\n  - name: fake\n    type: kubernetes\n{keys}");
        let cfg = ProvidersConfig::from_slice(doc.as_bytes()).unwrap();
        let metrics = Metrics::new();
        let f = fake.clone();
        let registry = Registry::build(&cfg, &metrics.provider, |_| {
            let p: Arc<dyn Provider> = Arc::new(f.clone());
            Ok(p)
        })
        .unwrap();
        let health = Arc::new(Verdicts::default());
        let source: Arc<dyn HealthSource> = health.clone();
        // The credentials watch the operator runs, on the test's runtime.
        let credentials =
            Arc::new(egress_proxies_operator::credentials::CredentialsCache::default());
        let watch = egress_proxies_operator::operator::runnables::credentials_watch(
            &credentials,
            ground.client.clone(),
            None,
        );
        tokio::spawn(watch.expect("a new cache has its writer"));
        let ctx = Context::new(
            ground.client.clone(),
            registry,
            ground.ns.clone(),
            Some(source),
        )
        .with_random(Arc::new(plan::Fixed(unit)))
        .with_throttle(Arc::new(Throttle::new(&cfg)))
        .with_credentials(credentials);
        let ctx = Arc::new(finish(ctx));
        Scenario {
            fake,
            health,
            ctx,
            proxies: ground.proxies(),
        }
    }

    pub async fn create(&self, name: &str, spec: serde_json::Value) -> Proxy {
        self.proxies
            .create(&PostParams::default(), &support::proxy(name, spec))
            .await
            .unwrap()
    }

    pub async fn get(&self, name: &str) -> Proxy {
        self.proxies.get(name).await.unwrap()
    }

    /// Merges `spec` into the Proxy's spec (a new generation).
    pub async fn edit_spec(&self, name: &str, spec: serde_json::Value) {
        self.proxies
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap();
    }

    /// One reconcile of the Proxy as the API server has it now.
    pub async fn pass(&self, name: &str) -> Result<Action, Error> {
        reconcile(Arc::new(self.get(name).await), self.ctx.clone()).await
    }

    /// A pass that must succeed.
    pub async fn ok(&self, name: &str) -> Action {
        match self.pass(name).await {
            Ok(a) => a,
            Err(e) => panic!("reconcile of {name} failed: {e}"),
        }
    }

    /// Passes until `done` holds for the Proxy (at most `max`); returns it
    /// and the last pass's action.
    pub async fn until(
        &self,
        name: &str,
        max: usize,
        done: impl Fn(&Proxy) -> bool,
    ) -> (Proxy, Action) {
        for _ in 0..max {
            let action = self.ok(name).await;
            let p = self.get(name).await;
            if done(&p) {
                return (p, action);
            }
        }
        panic!(
            "{name} did not get there in {max} passes: {:?}",
            self.get(name).await.status
        );
    }

    /// A new Proxy taken to Running: finalizer, create, provisioning, running.
    pub async fn running(&self, name: &str) -> Proxy {
        self.create(name, json!({"provider": "fake", "port": 3128}))
            .await;
        self.until(name, 6, |p| phase(p) == Some("Running")).await.0
    }
}
