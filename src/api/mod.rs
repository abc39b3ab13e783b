//! The custom resources (`Proxy`, `ProxyPool`, `ProviderHealth`), their conditions
//! and the names the operator shares with users and backends.

pub mod auth;
pub mod condition;
pub mod constants;
pub mod crd;
pub mod health;
pub mod instances;
pub mod pool;
pub mod provider_health;
pub mod proxy;
pub mod recycle;

pub use auth::{AuthMode, Builtin, ProxyAuth, SecretName};
pub use condition::{Condition, ConditionStatus};
pub use instances::{RetiringStatus, SurgeStatus};
pub use pool::{ProxyPool, ProxyPoolSpec, ProxyPoolStatus, ProxyTemplate, TemplateMetadata};
pub use provider_health::{ProviderHealth, ProviderHealthStatus, ProviderTarget};
pub use proxy::{
    CloudInit, Endpoint, HealthCheckSpec, Placement, Proxy, ProxyMode, ProxyPhase, ProxySpec,
    ProxyStatus, SecretKeyRef,
};
pub use recycle::RecycleSpec;
