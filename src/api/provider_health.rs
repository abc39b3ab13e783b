//! The `ProviderHealth` custom resource: one status-only, cluster-scoped
//! object per configured provider, written by the provider health monitor.
//!
//! It has no spec (the providers config file is the one place providers are
//! configured), so it is declared by hand instead of with
//! `#[derive(CustomResource)]`, which always generates a `spec`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;

/// Health of one configured provider's backend targets.
///
/// It always serializes with its `apiVersion` and `kind` (see the
/// `Serialize` impl): kube-apiserver refuses a create without them
/// (`Object 'Kind' is missing`), and the struct has no `TypeMeta` that could
/// be left empty.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ProviderHealth {
    /// Standard object metadata; the name is the provider's configured name.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The latest check of the provider's targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ProviderHealthStatus>,
}

impl ProviderHealth {
    /// An object for provider `name` with no status yet.
    pub fn new(name: &str) -> Self {
        ProviderHealth {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            status: None,
        }
    }
}

/// What goes on the wire: the object with its type, the way kube-derive
/// serializes a `#[derive(CustomResource)]` type.
impl Serialize for ProviderHealth {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use k8s_openapi::Resource;
        use serde::ser::SerializeStruct;
        let mut obj =
            ser.serialize_struct("ProviderHealth", if self.status.is_some() { 4 } else { 3 })?;
        obj.serialize_field("apiVersion", Self::API_VERSION)?;
        obj.serialize_field("kind", Self::KIND)?;
        obj.serialize_field("metadata", &self.metadata)?;
        if let Some(status) = &self.status {
            obj.serialize_field("status", status)?;
        }
        obj.end()
    }
}

impl k8s_openapi::Resource for ProviderHealth {
    const API_VERSION: &'static str = "crawl.example.com/v1alpha1";
    const GROUP: &'static str = "crawl.example.com";
    const KIND: &'static str = "ProviderHealth";
    const VERSION: &'static str = "v1alpha1";
    const URL_PATH_SEGMENT: &'static str = "providerhealths";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::ListableResource for ProviderHealth {
    const LIST_KIND: &'static str = "ProviderHealthList";
}

impl k8s_openapi::Metadata for ProviderHealth {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Schema of the whole object, for the generated CRD.
impl JsonSchema for ProviderHealth {
    fn schema_name() -> Cow<'static, str> {
        "ProviderHealth".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let status = generator.subschema_for::<ProviderHealthStatus>();
        schemars::json_schema!({
            "description": "Health of one configured provider's backend targets, written by the operator. The object is named after the provider.",
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                // kube-apiserver refuses anything but `type: object` here
                // (no description): metadata's schema is the server's own.
                "metadata": {"type": "object"},
                "status": status,
            }
        })
    }
}

/// The latest check of a provider's targets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHealthStatus {
    /// The provider's type from the config: kubernetes, gcp or kvm.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Holds `Ready` (True when every target passed the last check) and
    /// `Replacing` (False while the provider's circuit breaker is open).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// One entry per checked target, in the checker's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub targets: Vec<ProviderTarget>,
    /// `<ready>/<total>`, e.g. `1/2`; empty when the provider has no check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_ready: Option<String>,
    /// When the latest check finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_time: Option<DateTime<Utc>>,
}

/// The verdict for one target (an API server, a project, a hypervisor).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderTarget {
    /// Target name: a kvm host name, `apiserver`, or a GCP project.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Where the check connected, for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// True when the last check passed.
    pub ready: bool,
    /// CamelCase verdict, e.g. Reachable, Timeout, Unreachable, PoolNotFound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Detail of the verdict, usually the error text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Duration of the last check in whole milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_millis: Option<i64>,
    /// When `ready` last flipped.
    pub last_transition_time: DateTime<Utc>,
    /// Provider-specific facts, e.g. kvm's libvirtVersion and pool capacity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
}

/// Condition type and reasons on a ProviderHealth.
pub mod conditions {
    /// Every target passed the last check.
    pub const READY: &str = "Ready";
    /// Ready=True.
    pub const REASON_ALL_TARGETS_READY: &str = "AllTargetsReady";
    /// Ready=False: at least one target failed.
    pub const REASON_TARGETS_NOT_READY: &str = "TargetsNotReady";
    /// Ready=Unknown: the provider type has no health check.
    pub const REASON_CHECKS_NOT_IMPLEMENTED: &str = "ChecksNotImplemented";
    /// Ready=Unknown: the check found nothing to check.
    pub const REASON_NO_TARGETS: &str = "NoTargets";
    /// Whether the operator replaces and recycles the provider's proxies:
    /// False while its circuit breaker is open.
    pub const REPLACING: &str = "Replacing";
    /// Replacing=True: the breaker is closed; also the Event when it closes.
    pub const REASON_CIRCUIT_CLOSED: &str = "CircuitClosed";
    /// Replacing=False: the breaker is open; also the Event when it opens.
    pub const REASON_CIRCUIT_OPEN: &str = "CircuitOpen";
    /// The Event when an operator reset the breaker with the annotation.
    pub const REASON_CIRCUIT_RESET: &str = "CircuitReset";
}
