//! The custom resources (`Proxy`, `ProxyPool`, `ProviderHealth`), their conditions
//! and the names the operator shares with users and backends.

pub mod auth;
pub mod condition;
pub mod constants;
pub mod crd;
pub mod health;
pub mod instances;
pub mod limits;
pub mod pool;
pub mod provider_health;
pub mod proxy;
pub mod recycle;

pub use auth::{AuthMode, Builtin, ProxyAuth, SecretName};
pub use condition::{Condition, ConditionStatus};
pub use instances::{RetiringStatus, SurgeStatus};
pub use pool::{
    Autoscale, ProxyPool, ProxyPoolSpec, ProxyPoolStatus, ProxyTemplate, ScaleRecord,
    TemplateMetadata,
};
pub use provider_health::{ProviderHealth, ProviderHealthStatus, ProviderTarget};
pub use proxy::{
    CloudInit, Endpoint, HealthCheckSpec, Placement, Proxy, ProxyMode, ProxyPhase, ProxySpec,
    ProxyStatus, SecretKeyRef,
};
pub use recycle::RecycleSpec;

/// When an object was created, as the rest of the operator counts time.
pub fn created_at(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let t = meta.creation_timestamp.as_ref()?;
    chrono::DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().unsigned_abs())
}
