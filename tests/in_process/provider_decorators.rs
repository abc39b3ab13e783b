//! The decorators every provider is wrapped in: counted by result class,
//! timed, traced as client spans, results passed through unchanged, and
//! the health checker never forwarded. The registry builds all or nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::operator::Metrics;
use egress_proxies_operator::provider::registry::{ProviderType, Registry};
use egress_proxies_operator::provider::{
    Checker, CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider,
    ProviderError, TargetStatus, UserData,
};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// A backend whose answers the test scripts.
struct Scripted {
    name: String,
    get_class: Option<ErrorClass>,
}

struct NoopChecker;

#[async_trait]
impl Checker for NoopChecker {
    async fn check(&self) -> Vec<TargetStatus> {
        vec![TargetStatus {
            name: "t".into(),
            ready: true,
            reason: "Reachable".into(),
            ..Default::default()
        }]
    }
}

#[async_trait]
impl Provider for Scripted {
    fn name(&self) -> &str {
        &self.name
    }
    fn provider_type(&self) -> ProviderType {
        ProviderType::Kubernetes
    }
    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        Ok(format!("default/{}", req.name))
    }
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        match self.get_class {
            Some(c) => Err(ProviderError::new(c, Op::Get, &self.name, id, "scripted")),
            None => Ok(Instance::new(id, InstanceState::Running)),
        }
    }
    async fn delete(&self, _id: &str) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        Ok(Listing {
            instances: vec![
                Instance::new("a", InstanceState::Running),
                Instance::new("b", InstanceState::Stopped),
            ],
            unread_scopes: vec![],
        })
    }
    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(NoopChecker))
    }
}

/// A closed span: its name and its fields as text.
type ClosedSpan = (String, BTreeMap<String, String>);

#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<ClosedSpan>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);
impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            format!("{value:?}").trim_matches('"').to_string(),
        );
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

struct SpanFields(BTreeMap<String, String>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorded {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut m = BTreeMap::new();
        attrs.record(&mut Fields(&mut m));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(m));
        }
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(f) = span.extensions_mut().get_mut::<SpanFields>() {
                values.record(&mut Fields(&mut f.0));
            }
        }
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<SpanFields>()
                .map(|f| f.0.clone())
                .unwrap_or_default();
            self.0
                .lock()
                .unwrap()
                .push((span.name().to_string(), fields));
        }
    }
}

fn registry_with(get_class: Option<ErrorClass>, metrics: &Metrics) -> Registry {
    let cfg =
        ProvidersConfig::from_slice(b"providers:\n  - name: pods\n    type: kubernetes\n").unwrap();
    Registry::build(&cfg, &metrics.provider, |entry| {
        Ok(Arc::new(Scripted {
            name: entry.name.clone(),
            get_class,
        }) as Arc<dyn Provider>)
    })
    .unwrap()
}

#[tokio::test]
async fn calls_are_counted_timed_and_traced() {
    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(recorded.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let metrics = Metrics::new();
    let reg = registry_with(None, &metrics);
    let p = reg.get("pods").unwrap();
    let req = CreateRequest {
        name: "proxy-abc".into(),
        cloud_init: UserData::new("SENTINEL-CLOUD-INIT"),
        ..Default::default()
    };
    assert_eq!(p.create(&req).await.unwrap(), "default/proxy-abc");
    assert_eq!(
        p.get("default/proxy-abc").await.unwrap().state,
        InstanceState::Running
    );
    p.delete("default/proxy-abc").await.unwrap();
    assert_eq!(p.list_by_tag().await.unwrap().instances.len(), 2);

    let text = metrics.encode().unwrap();
    for op in ["create", "get", "delete", "list"] {
        let line = format!("proxy_operator_provider_requests_total{{provider=\"pods\",op=\"{op}\",result=\"ok\"}} 1");
        assert!(text.contains(&line), "missing {line} in\n{text}");
        let count = format!("proxy_operator_provider_request_duration_seconds_count{{provider=\"pods\",op=\"{op}\"}} 1");
        assert!(text.contains(&count), "missing {count} in\n{text}");
    }

    let spans = recorded.0.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "provider.create",
            "provider.get",
            "provider.delete",
            "provider.list"
        ]
    );
    let (_, create) = &spans[0];
    assert_eq!(create["otel.kind"], "client");
    assert_eq!(create["provider.name"], "pods");
    assert_eq!(create["provider.id"], "default/proxy-abc");
    assert_eq!(create["provider.result"], "ok");
    assert_eq!(create["otel.status_code"], "ok");
    assert_eq!(spans[3].1["provider.instances"], "2");
    for (_, f) in &spans {
        assert!(
            f.values().all(|v| !v.contains("SENTINEL")),
            "cloud-init leaked into a span: {f:?}"
        );
    }
}

#[tokio::test]
async fn error_classes_reach_labels_and_span_status_unchanged() {
    for (class, label, status) in [
        (ErrorClass::NotFound, "not_found", "ok"),
        (ErrorClass::QuotaExceeded, "quota_exceeded", "error"),
        (ErrorClass::Transient, "transient", "error"),
        (ErrorClass::Unavailable, "unavailable", "error"),
        (ErrorClass::Permanent, "permanent", "error"),
    ] {
        let recorded = Recorded::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(recorded.clone()));
        let metrics = Metrics::new();
        let p = registry_with(Some(class), &metrics).get("pods").unwrap();
        let err = p.get("default/x").await.unwrap_err();
        assert_eq!(err.class(), class, "the decorators must not reclassify");
        assert_eq!(err.provider(), "pods");
        let line = format!("proxy_operator_provider_requests_total{{provider=\"pods\",op=\"get\",result=\"{label}\"}} 1");
        assert!(metrics.encode().unwrap().contains(&line), "{label}");
        let spans = recorded.0.lock().unwrap().clone();
        assert_eq!(spans[0].1["provider.result"], label);
        assert_eq!(spans[0].1["otel.status_code"], status, "{label}");
        if status == "error" {
            assert!(spans[0].1["otel.status_description"].contains("scripted"));
        }
    }
}

#[tokio::test]
async fn checkers_come_from_undecorated_providers_and_are_not_counted() {
    let metrics = Metrics::new();
    let reg = registry_with(None, &metrics);
    let p = reg.get("pods").unwrap();
    assert!(
        p.checker().is_none(),
        "decorators must not forward the checker"
    );
    let entry = &reg.checkers()[0];
    assert_eq!(
        (entry.name.as_str(), entry.provider_type),
        ("pods", ProviderType::Kubernetes)
    );
    let results = entry.checker.as_ref().unwrap().check().await;
    assert!(results[0].ready);
    assert!(
        !metrics.encode().unwrap().contains("provider=\"pods\""),
        "a check must not count as a call"
    );
}

#[test]
fn building_is_all_or_nothing_and_names_the_failing_provider() {
    let cfg = ProvidersConfig::from_slice(
        b"providers:\n  - name: a\n    type: kubernetes\n  - name: b\n    type: kubernetes\n",
    )
    .unwrap();
    let metrics = Metrics::new();
    let res = Registry::build(&cfg, &metrics.provider, |entry| {
        if entry.name == "b" {
            Err("image must be set".to_string())
        } else {
            Ok(Arc::new(Scripted {
                name: entry.name.clone(),
                get_class: None,
            }) as Arc<dyn Provider>)
        }
    });
    let err = res.err().expect("one failing constructor fails the build");
    assert_eq!(
        err.to_string(),
        "provider \"b\" (kubernetes): image must be set"
    );
}
