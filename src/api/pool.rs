//! The `ProxyPool` custom resource: a fleet of Managed Proxies as one
//! object, what a ReplicaSet is to Pods (docs/pools.md).

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;
use super::proxy::ProxySpec;

/// The most Proxies one pool may ask for: far above a crawl's fleet, low
/// enough that a typo (`replicas: 100000`) is refused, not provisioned.
pub const MAX_REPLICAS: i32 = 1000;

/// Desired state of a pool: `replicas` Proxies made from `template`.
// clippy reads the repeated `type_ = ".."` of the printcolumns as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "ProxyPool",
    doc = "A fleet of Managed Proxies made from one template and kept at `replicas`: scaled with `kubectl scale`, rolled through the provider's replacement budget when the template changes, and deleted with its Proxies.",
    plural = "proxypools",
    singular = "proxypool",
    shortname = "ppool",
    namespaced,
    status = "ProxyPoolStatus",
    derive = "PartialEq",
    derive = "Default",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Leased",
        type_ = "integer",
        json_path = ".status.leasedReplicas"
    ),
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".spec.template.spec.provider"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    category = "egress-proxies"
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolSpec {
    /// How many Proxies the pool keeps (0 to 1000). `kubectl scale`
    /// writes it through the scale subresource.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// What each Proxy of the pool is made from.
    pub template: ProxyTemplate,
}

/// A Proxy of the pool, as a Deployment's Pod template: its labels,
/// annotations and spec.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(
    validation = Rule::new("!has(self.spec.mode) || self.spec.mode == 'Managed'")
        .message("a pool makes Managed Proxies only: spec.template.spec.mode must be Managed")
        .reason(Reason::FieldValueInvalid)
        .field_path(".spec.mode"),
    validation = Rule::new("has(self.spec.provider) && size(self.spec.provider) > 0")
        .message("spec.template.spec.provider is required")
        .reason(Reason::FieldValueRequired)
        .field_path(".spec.provider"),
    validation = Rule::new("has(self.spec.port)")
        .message("spec.template.spec.port is required")
        .reason(Reason::FieldValueRequired)
        .field_path(".spec.port")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyTemplate {
    /// Labels and annotations every Proxy of the pool carries (besides
    /// the pool's own label).
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The spec every Proxy of the pool gets. Its mode and provider
    /// cannot change (as a Proxy's): a pool on another provider is
    /// another pool.
    pub spec: ProxySpec,
}

/// The metadata a pool's template may set.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels of each Proxy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of each Proxy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Observed state of a pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Proxies of the pool that exist and are not being deleted (those
    /// draining before a scale-down included).
    #[serde(default)]
    pub replicas: i32,
    /// Of the Proxies the pool keeps, those Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Of the Proxies the pool keeps, those holding at least one lease.
    #[serde(default)]
    pub leased_replicas: i32,
    /// Of the Proxies the pool keeps, those made from the current template.
    #[serde(default)]
    pub updated_replicas: i32,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The label selector of the pool's Proxies, for the scale
    /// subresource (an HPA or KEDA reads it).
    #[serde(default)]
    pub selector: String,
    /// `Ready` (every Proxy the pool should keep is Ready and up to date)
    /// and `Progressing` (scaling or rolling).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
