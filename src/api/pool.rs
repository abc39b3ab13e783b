//! The `ProxyPool` custom resource: a fleet of Managed Proxies as one
//! object, what a ReplicaSet is to Pods (docs/pools.md).

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;
use super::limits;
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
    /// How many Proxies the pool keeps (0 to 1000; default 1). `kubectl
    /// scale` writes it through the scale subresource; with `autoscale`
    /// the operator writes it (leave it out of applied manifests then).
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// What each Proxy of the pool is made from.
    pub template: ProxyTemplate,

    /// Sizing on lease demand: with it, the operator writes `replicas`
    /// itself (as a HorizontalPodAutoscaler writes a Deployment's), so a
    /// `kubectl scale` lasts until its next decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<Autoscale>,
}

fn one() -> i32 {
    1
}

/// How a pool follows its crawlers' demand (docs/pools.md#autoscaling).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[x_kube(
    validation = Rule::new("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas")
        .message("spec.autoscale.minReplicas must not exceed spec.autoscale.maxReplicas")
        .reason(Reason::FieldValueInvalid)
        .field_path(".minReplicas")
)]
#[serde(rename_all = "camelCase")]
pub struct Autoscale {
    /// The fewest Proxies while the pool is in use (0 to 1000). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub min_replicas: Option<i32>,
    /// The most Proxies demand may grow the pool to (1 to 1000).
    #[schemars(range(min = 1, max = 1000))]
    pub max_replicas: i32,
    /// The share of Ready Proxies holding a lease the pool aims at, in
    /// percent (1 to 100). Default 80: above it the pool grows, below it
    /// (for the whole stabilization window) it shrinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub target_utilization: Option<i32>,
    /// How long demand must stay low before the pool shrinks, e.g. `5m`
    /// (the default); at most `24h`. The pool shrinks to the largest size
    /// demand asked for within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::DURATION_MAX))]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub scale_down_stabilization: Option<String>,
    /// Scale to zero after this long without a lease or an acquire naming
    /// the pool, e.g. `30m`; off when unset. An acquire naming a pool at
    /// zero is answered `503` with a Retry-After and brings it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::DURATION_MAX))]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub scale_to_zero_after: Option<String>,
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
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels of each Proxy: at most 32, keys at most 317 characters,
    /// values at most 63.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = limits::TEMPLATE_METADATA_MAX,
        "additionalProperties" = {"type": "string", "maxLength": limits::LABEL_VALUE_MAX}
    ))]
    #[x_kube(validation = Rule::new(format!("self.all(k, size(k) <= {})", limits::METADATA_KEY_MAX))
        .message(format!("label keys must be at most {} characters", limits::METADATA_KEY_MAX).as_str())
        .reason(Reason::FieldValueInvalid))]
    pub labels: BTreeMap<String, String>,
    /// Annotations of each Proxy: at most 32, keys at most 317
    /// characters, values at most 4,096.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = limits::TEMPLATE_METADATA_MAX,
        "additionalProperties" = {"type": "string", "maxLength": limits::ANNOTATION_VALUE_MAX}
    ))]
    #[x_kube(validation = Rule::new(format!("self.all(k, size(k) <= {})", limits::METADATA_KEY_MAX))
        .message(format!("annotation keys must be at most {} characters", limits::METADATA_KEY_MAX).as_str())
        .reason(Reason::FieldValueInvalid))]
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
    /// The autoscaler's latest change of `replicas`, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<ScaleRecord>,
    /// `Ready` (every Proxy the pool should keep is Ready and up to date),
    /// `Progressing` (scaling or rolling) and `ScalingLimited` (a provider
    /// cap, quota or the circuit breaker holds Proxies of the pool back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One change of a pool's size by its autoscaler.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleRecord {
    /// When.
    pub time: chrono::DateTime<chrono::Utc>,
    /// `replicas` before.
    pub from: i32,
    /// `replicas` after.
    pub to: i32,
    /// CamelCase: `Demand`, `Refusals`, `LowDemand`, `Idle`, `Wake` or
    /// `Bounds`.
    pub reason: String,
    /// Plain words: the figures behind the decision.
    pub message: String,
}
