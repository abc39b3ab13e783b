//! GC sweeps against the real test cluster (control plane only) with
//! scripted providers: a failing provider list skips that provider only, a
//! failing Proxy list skips the whole sweep, the per-sweep budget holds
//! across providers, and the `proxy_operator_gc_*` series count all of it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;
use support::sample;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::gc::{Gc, Settings};
use egress_proxies_operator::operator::Metrics;
use egress_proxies_operator::provider::registry::{ProviderType, Registry};
use egress_proxies_operator::provider::{
    CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider, ProviderError,
};
use kube::ResourceExt;

struct Scripted {
    name: String,
    fail_list: bool,
    fail_delete: bool,
    instances: Vec<Instance>,
    deleted: Arc<Mutex<Vec<String>>>,
    /// How long a list takes.
    list_delay: Duration,
    /// While instances are listed, a Proxy is created here (as a user's
    /// `kubectl apply` racing the sweep would) and its instance, already
    /// older than min-age, is listed too.
    born_during_list: Option<kube::Api<egress_proxies_operator::api::Proxy>>,
}

#[async_trait]
impl Provider for Scripted {
    fn name(&self) -> &str {
        &self.name
    }
    fn provider_type(&self) -> ProviderType {
        ProviderType::Kubernetes
    }
    async fn create(&self, _req: &CreateRequest) -> Result<String, ProviderError> {
        unreachable!("GC never creates")
    }
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        Err(ProviderError::new(
            ErrorClass::NotFound,
            Op::Get,
            &self.name,
            id,
            "gone",
        ))
    }
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        if self.fail_delete {
            return Err(ProviderError::new(
                ErrorClass::Permanent,
                Op::Delete,
                &self.name,
                id,
                "denied",
            ));
        }
        self.deleted
            .lock()
            .unwrap()
            .push(format!("{}:{id}", self.name));
        Ok(())
    }
    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        if self.fail_list {
            return Err(ProviderError::new(
                ErrorClass::Transient,
                Op::List,
                &self.name,
                "",
                "backend down",
            ));
        }
        tokio::time::sleep(self.list_delay).await;
        let mut instances = self.instances.clone();
        if let Some(api) = &self.born_during_list {
            let born = api
                .create(&Default::default(), &support::kube_proxy("born-mid-sweep"))
                .await
                .unwrap();
            instances.push(Instance {
                uid: born.uid().unwrap(),
                ..orphan("born-mid-sweep")
            });
        }
        Ok(Listing {
            instances,
            unread_scopes: Vec::new(),
        })
    }
}

fn orphan(id: &str) -> Instance {
    Instance {
        uid: format!("uid-{id}"),
        installation_id: "ours".into(),
        created_at: Some(Utc::now() - chrono::Duration::hours(1)),
        ..Instance::new(id, InstanceState::Running)
    }
}

/// A GC over scripted providers named `providers`: a name containing
/// `broken` fails its list, one containing `stuck` fails every delete;
/// each lists three orphans. With `may_list_proxies` false its client is a
/// ServiceAccount without RBAC (impersonated by the admin), so its Proxy
/// list is refused (403).
async fn setup(
    may_list_proxies: bool,
    max_deletes: u32,
    providers: &[&str],
) -> (Gc, Arc<Mutex<Vec<String>>>, Metrics) {
    let cluster = support::control_plane();
    support::install_crds(cluster);
    let client = if may_list_proxies {
        cluster.client().await
    } else {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig()).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        config.auth_info.impersonate =
            Some("system:serviceaccount:kube-system:gc-sweep-without-rbac".into());
        kube::Client::try_from(config).unwrap()
    };
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let yaml: String = std::iter::once("providers:\n".to_string())
        .chain(
            providers
                .iter()
                .map(|n| format!("  - name: {n}\n    type: kubernetes\n")),
        )
        .collect();
    let cfg = ProvidersConfig::from_slice(yaml.as_bytes()).unwrap();
    let d = deleted.clone();
    let metrics = Metrics::new();
    let registry = Registry::build(&cfg, &metrics.provider, |e| {
        let p: Arc<dyn Provider> = Arc::new(Scripted {
            name: e.name.clone(),
            fail_list: e.name.contains("broken"),
            fail_delete: e.name.contains("stuck"),
            instances: vec![orphan("x"), orphan("y"), orphan("z")],
            deleted: d.clone(),
            list_delay: Duration::ZERO,
            born_during_list: None,
        });
        Ok(p)
    })
    .unwrap();
    let gc = gc_of(
        client,
        registry,
        Duration::from_secs(60),
        max_deletes,
        &metrics,
    );
    (gc, deleted, metrics)
}

/// A GC of installation `ours` over `registry`, sweeping only when asked.
fn gc_of(
    client: kube::Client,
    registry: Registry,
    min_age: Duration,
    max_deletes: u32,
    metrics: &Metrics,
) -> Gc {
    let settings = Settings {
        interval: Duration::from_secs(3600),
        min_age,
        max_deletes,
        installation_id: "ours".into(),
    };
    Gc::new(client, registry, settings, metrics.gc.clone())
}

fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test]
async fn a_failing_provider_list_skips_only_that_provider_and_the_budget_holds() {
    let (mut gc, deleted, metrics) = setup(true, 2, &["a-broken", "b-fine"]).await;
    let before = now_seconds();
    let report = gc.sweep().await;
    assert!(report.ran);
    assert_eq!(report.failed_providers, ["a-broken"]);
    assert_eq!(report.deleted, 2, "budget of 2");
    assert_eq!(*deleted.lock().unwrap(), ["b-fine:x", "b-fine:y"]);

    let text = metrics.encode_prometheus_text().unwrap();
    assert_sweep_counters(&text, 1.0);
    for absent in [
        r#"proxy_operator_gc_sweeps_total{provider="a-broken",result="ok"}"#,
        r#"proxy_operator_gc_sweeps_total{provider="b-fine",result="error"}"#,
        r#"proxy_operator_gc_deleted_total{provider="a-broken"}"#,
        r#"proxy_operator_gc_last_success_timestamp_seconds{provider="a-broken"}"#,
        "proxy_operator_gc_delete_failures_total{",
    ] {
        assert!(!text.contains(absent), "{absent} in\n{text}");
    }
    let last = sample(
        &text,
        r#"proxy_operator_gc_last_success_timestamp_seconds{provider="b-fine"}"#,
    )
    .unwrap_or_else(|| panic!("no last-success time in\n{text}"));
    assert!(
        (before..=now_seconds()).contains(&last),
        "last success {last} not within the sweep"
    );

    // The scripted listing never changes: a second sweep deletes two again
    // and the counters add up.
    let report = gc.sweep().await;
    assert_eq!(report.deleted, 2);
    let text = metrics.encode_prometheus_text().unwrap();
    assert_sweep_counters(&text, 2.0);
}

#[tokio::test]
async fn failed_deletes_are_counted_and_the_sweep_still_ends_ok() {
    let (mut gc, deleted, metrics) = setup(true, 20, &["c-stuck"]).await;
    let report = gc.sweep().await;
    assert!(report.ran);
    assert!(report.failed_providers.is_empty());
    assert_eq!(report.deleted, 0);
    assert!(deleted.lock().unwrap().is_empty());
    let text = metrics.encode_prometheus_text().unwrap();
    assert_eq!(
        sample(
            &text,
            r#"proxy_operator_gc_delete_failures_total{provider="c-stuck"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"proxy_operator_gc_sweeps_total{provider="c-stuck",result="ok"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("proxy_operator_gc_deleted_total{"), "{text}");
}

#[tokio::test]
async fn a_failing_proxy_list_skips_the_sweep() {
    // A client without RBAC for Proxies: listing them fails (403).
    let (mut gc, deleted, metrics) = setup(false, 20, &["a-broken", "b-fine"]).await;
    let report = gc.sweep().await;
    assert!(!report.ran);
    assert_eq!(report.deleted, 0);
    assert!(deleted.lock().unwrap().is_empty());
    // Every configured provider counts an error sweep; nothing succeeded.
    let text = metrics.encode_prometheus_text().unwrap();
    for p in ["a-broken", "b-fine"] {
        let series = format!(r#"proxy_operator_gc_sweeps_total{{provider="{p}",result="error"}}"#);
        assert_eq!(sample(&text, &series), Some(1.0), "{series} in\n{text}");
    }
    for absent in [
        r#"proxy_operator_gc_sweeps_total{provider="a-broken",result="ok"}"#,
        r#"proxy_operator_gc_sweeps_total{provider="b-fine",result="ok"}"#,
        "proxy_operator_gc_last_success_timestamp_seconds{",
        "proxy_operator_gc_deleted_total{",
    ] {
        assert!(!text.contains(absent), "{absent} in\n{text}");
    }
}

/// After `sweeps` sweeps of the scripted listing: one error and one ok
/// sweep each, two deletes each.
fn assert_sweep_counters(text: &str, sweeps: f64) {
    for (series, want) in [
        (
            r#"proxy_operator_gc_sweeps_total{provider="a-broken",result="error"}"#,
            sweeps,
        ),
        (
            r#"proxy_operator_gc_sweeps_total{provider="b-fine",result="ok"}"#,
            sweeps,
        ),
        (
            r#"proxy_operator_gc_deleted_total{provider="b-fine"}"#,
            2.0 * sweeps,
        ),
    ] {
        assert_eq!(sample(text, series), Some(want), "{series} in\n{text}");
    }
}

async fn racing_gc(
    proxies: Option<kube::Api<egress_proxies_operator::api::Proxy>>,
    list_delay: Duration,
    min_age: Duration,
) -> (Gc, Arc<Mutex<Vec<String>>>, Metrics) {
    let cluster = support::control_plane();
    support::install_crds(cluster);
    let client = cluster.client().await;
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let cfg = ProvidersConfig::from_slice(b"providers:\n  - name: racing\n    type: kubernetes\n")
        .unwrap();
    let metrics = Metrics::new();
    let d = deleted.clone();
    let registry = Registry::build(&cfg, &metrics.provider, move |_| {
        let p: Arc<dyn Provider> = Arc::new(Scripted {
            name: "racing".into(),
            fail_list: false,
            fail_delete: false,
            instances: vec![orphan("orphan")],
            deleted: d.clone(),
            list_delay,
            born_during_list: proxies.clone(),
        });
        Ok(p)
    })
    .unwrap();
    let gc = gc_of(client, registry, min_age, 20, &metrics);
    (gc, deleted, metrics)
}

#[tokio::test]
async fn a_proxy_created_while_instances_are_listed_keeps_its_instance() {
    let ground = support::ground_without_pods("gc-race").await;
    let (mut gc, deleted, _) = racing_gc(
        Some(ground.proxies()),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    let report = gc.sweep().await;
    assert!(report.ran);
    assert!(!report.aborted);
    // The true orphan goes; the instance of the Proxy that appeared during
    // the listing stays, although it is older than min-age.
    assert_eq!(*deleted.lock().unwrap(), ["racing:orphan"]);
    assert_eq!(report.deleted, 1);
}

#[tokio::test]
async fn a_sweep_past_half_its_min_age_deletes_nothing_and_says_aborted() {
    let (mut gc, deleted, metrics) =
        racing_gc(None, Duration::from_millis(1_200), Duration::from_secs(2)).await;
    let report = gc.sweep().await;
    assert!(report.ran);
    assert!(report.aborted, "{report:?}");
    assert!(deleted.lock().unwrap().is_empty());
    let text = metrics.encode_prometheus_text().unwrap();
    assert_eq!(
        sample(
            &text,
            r#"proxy_operator_gc_sweeps_total{provider="racing",result="aborted"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"proxy_operator_gc_sweeps_total{provider="racing",result="ok"}"#
        ),
        None,
        "{text}"
    );
}
