//! The decorators every provider is wrapped in: metrics (a counter per
//! call by result, a latency histogram) inside tracing (a client span per
//! call). Both return the inner result unchanged, and neither forwards
//! `checker()`: health checks are never counted or traced as calls.
//! Observations (`observed`, `observe`) are forwarded untouched: they make
//! no call per Proxy, so the call counters count backend calls only.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use kube::runtime::reflector::Store;
use tracing::field::Empty;
use tracing::Instrument;

use super::error::result_label;
use super::metrics::ProviderMetrics;
use super::registry::ProviderType;
use super::{
    Changes, CreateRequest, ErrorClass, Instance, Listing, Observation, Op, Provider, ProviderError,
};
use crate::api::Proxy;

/// Counts and times every call.
pub struct MetricsProvider {
    inner: Arc<dyn Provider>,
    metrics: ProviderMetrics,
}

impl MetricsProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Provider>, metrics: ProviderMetrics) -> Self {
        MetricsProvider { inner, metrics }
    }

    fn record<T>(&self, op: Op, started: Instant, res: &Result<T, ProviderError>) {
        self.metrics.observe(
            self.inner.name(),
            op.as_str(),
            result_label(res),
            started.elapsed(),
        );
    }
}

#[async_trait]
impl Provider for MetricsProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn provider_type(&self) -> ProviderType {
        self.inner.provider_type()
    }
    // Observations are no calls: forwarded, neither counted nor traced.
    fn observed(&self, id: &str) -> Observation {
        self.inner.observed(id)
    }
    fn observe(&self, namespace: Option<&str>, proxies: &Store<Proxy>) -> Option<Changes> {
        self.inner.observe(namespace, proxies)
    }
    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        let t = Instant::now();
        let res = self.inner.create(req).await;
        self.record(Op::Create, t, &res);
        res
    }
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        let t = Instant::now();
        let res = self.inner.get(id).await;
        self.record(Op::Get, t, &res);
        res
    }
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let t = Instant::now();
        let res = self.inner.delete(id).await;
        self.record(Op::Delete, t, &res);
        res
    }
    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        let t = Instant::now();
        let res = self.inner.list_by_tag().await;
        self.record(Op::List, t, &res);
        res
    }
    async fn collect_shared(&self, installation_id: &str) -> Result<Vec<String>, ProviderError> {
        self.inner.collect_shared(installation_id).await
    }
}

/// A client span with the fields filled in as the call completes; span
/// names must be literals, hence a macro.
macro_rules! provider_span {
    ($name:literal, $provider:expr) => {
        tracing::info_span!(
            $name,
            otel.kind = "client",
            provider.name = %$provider,
            provider.id = Empty,
            provider.instances = Empty,
            provider.result = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        )
    };
}

/// Opens a client span per call: `provider.create|get|delete|list`.
pub struct TracingProvider {
    inner: Arc<dyn Provider>,
}

impl TracingProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Provider>) -> Self {
        TracingProvider { inner }
    }

    fn span(&self, op: Op, id: &str) -> tracing::Span {
        let name = self.inner.name();
        let span = match op {
            Op::Create => provider_span!("provider.create", name),
            Op::Get => provider_span!("provider.get", name),
            Op::Delete => provider_span!("provider.delete", name),
            Op::List => provider_span!("provider.list", name),
        };
        if !id.is_empty() {
            span.record("provider.id", id);
        }
        span
    }
}

/// Records the outcome on the span: Ok for success and for NotFound
/// (polling to NotFound is expected), Error with the message otherwise.
fn finish<T>(span: &tracing::Span, res: &Result<T, ProviderError>) {
    span.record("provider.result", result_label(res));
    match res {
        Err(e) if e.class() != ErrorClass::NotFound => {
            span.record("otel.status_code", "error");
            span.record("otel.status_description", e.to_string());
        }
        _ => {
            span.record("otel.status_code", "ok");
        }
    }
}

#[async_trait]
impl Provider for TracingProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn provider_type(&self) -> ProviderType {
        self.inner.provider_type()
    }
    // Observations are no calls: forwarded, neither counted nor traced.
    fn observed(&self, id: &str) -> Observation {
        self.inner.observed(id)
    }
    fn observe(&self, namespace: Option<&str>, proxies: &Store<Proxy>) -> Option<Changes> {
        self.inner.observe(namespace, proxies)
    }
    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        let span = self.span(Op::Create, "");
        let res = self.inner.create(req).instrument(span.clone()).await;
        if let Ok(id) = &res {
            if !id.is_empty() {
                span.record("provider.id", id.as_str());
            }
        }
        finish(&span, &res);
        res
    }
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        let span = self.span(Op::Get, id);
        let res = self.inner.get(id).instrument(span.clone()).await;
        finish(&span, &res);
        res
    }
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let span = self.span(Op::Delete, id);
        let res = self.inner.delete(id).instrument(span.clone()).await;
        finish(&span, &res);
        res
    }
    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        let span = self.span(Op::List, "");
        let res = self.inner.list_by_tag().instrument(span.clone()).await;
        if let Ok(l) = &res {
            span.record("provider.instances", l.instances.len() as i64);
        }
        finish(&span, &res);
        res
    }
    async fn collect_shared(&self, installation_id: &str) -> Result<Vec<String>, ProviderError> {
        self.inner.collect_shared(installation_id).await
    }
}
