//! The `Proxy` custom resource: one forward proxy that crawlers lease.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::Condition;
use super::instances::{RetiringStatus, SurgeStatus};
use super::limits;

/// Desired state of a forward proxy. Managed Proxies are provisioned by the
/// named provider; External Proxies already exist at `endpoint` and are only
/// health-checked and advertised.
// clippy reads the repeated `type_ = ".."` of the printcolumns as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "Proxy",
    doc = "A forward proxy with its own egress IP, provisioned by a provider (Managed) or already running elsewhere (External), health-checked and leased to crawlers by the operator.",
    plural = "proxies",
    singular = "proxy",
    shortname = "px",
    namespaced,
    status = "ProxyStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "IP", type_ = "string", json_path = ".status.ip"),
    printcolumn(
        name = "Healthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Healthy\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Provisioned\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    // `-o wide` only (priority 1): where it runs, which instance, how fast
    // and why it is not Ready.
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".spec.placement.zone",
        priority = 1
    ),
    printcolumn(
        name = "Provider ID",
        type_ = "string",
        json_path = ".status.providerID",
        priority = 1
    ),
    printcolumn(
        name = "Latency",
        type_ = "integer",
        description = "Probe latency in milliseconds",
        json_path = ".status.latencyMillis",
        priority = 1
    ),
    printcolumn(
        name = "Ready Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    ),
    category = "egress-proxies"
)]
#[x_kube(
    validation = Rule::new("self.mode != 'External' || has(self.endpoint)")
        .message("spec.endpoint is required when spec.mode is External")
        .reason(Reason::FieldValueRequired)
        .field_path(".endpoint"),
    validation = Rule::new("self.mode != 'Managed' || (has(self.provider) && size(self.provider) > 0)")
        .message("spec.provider is required when spec.mode is Managed")
        .reason(Reason::FieldValueRequired)
        .field_path(".provider"),
    validation = Rule::new("self.mode != 'Managed' || has(self.port)")
        .message("spec.port is required when spec.mode is Managed")
        .reason(Reason::FieldValueRequired)
        .field_path(".port")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// Managed: the operator provisions an instance through `provider`.
    /// External: the proxy already runs at `endpoint`; the operator only
    /// checks and advertises it. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.mode is immutable"))]
    pub mode: ProxyMode,

    /// Name of an entry in the operator's providers config (its `name`,
    /// never its `type`), e.g. `kubernetes` or `gcp-eu`. Required for
    /// Managed Proxies. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.provider is immutable"))]
    pub provider: Option<String>,

    /// Provider-agnostic placement hints. Each provider rejects what it
    /// cannot satisfy, naming the field and value in the Proxy's status.
    /// Changing any of them replaces the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,

    /// TCP port the proxy listens on. Clients and health probes connect to
    /// `http://<status.ip>:<port>`. Required for Managed Proxies; changing it
    /// replaces the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,

    /// User-data handed to the instance (cloud-config, script, MIME, ...).
    /// Exactly one of `inline` or `secretRef`. The resolved text is part of
    /// the spec hash: changing it, or the referenced Secret's content,
    /// replaces the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInit>,

    /// Free-form key/values advertised by the discovery API and usable as
    /// lease filters (e.g. `geo: home`): at most 32, each key and value at
    /// most 256 characters. Changing them never replaces the instance.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = limits::ATTRIBUTES_MAX,
        "additionalProperties" = {"type": "string", "maxLength": limits::ATTRIBUTE_MAX}
    ))]
    #[x_kube(validation = Rule::new(format!("self.all(k, size(k) <= {})", limits::ATTRIBUTE_MAX))
        .message(format!("attribute keys must be at most {} characters", limits::ATTRIBUTE_MAX).as_str())
        .reason(Reason::FieldValueInvalid))]
    pub attributes: BTreeMap<String, String>,

    /// Who may use the proxy: credentials (the default) or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<super::ProxyAuth>,

    /// Where an External proxy listens. Required when `mode` is External.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,

    /// Per-proxy probe settings; unset fields take the operator's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,

    /// When the instance is replaced on purpose (unhealthy too long, too
    /// old); off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recycle: Option<super::RecycleSpec>,
}

/// How the proxy comes to exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProxyMode {
    /// The operator provisions and replaces an instance through a provider.
    #[default]
    Managed,
    /// The proxy exists outside the operator at `spec.endpoint`.
    External,
}

/// Provider-agnostic placement hints; each provider documents which it
/// uses. Each is at most 253 characters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Region, e.g. `europe-west1` (gcp ignores it; kvm ignores it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = limits::PLACEMENT_MAX))]
    pub region: String,
    /// Zone: a GCP zone such as `europe-west1-b`, or a kvm host name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = limits::PLACEMENT_MAX))]
    pub zone: String,
    /// Machine type: a GCE machine type, or a key of the kvm provider's
    /// `machineTypes` catalogue.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = limits::PLACEMENT_MAX))]
    pub machine_type: String,
    /// Image: a GCE image path, or a key of the kvm provider's `images`
    /// catalogue (or an http(s) URL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = limits::PLACEMENT_MAX))]
    pub image: String,
}

/// Cloud-init user-data: exactly one of `inline` or `secretRef`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[x_kube(
    validation = Rule::new("(has(self.inline) ? 1 : 0) + (has(self.secretRef) ? 1 : 0) + (has(self.builtin) ? 1 : 0) == 1")
        .message("exactly one of cloudInit.inline, cloudInit.secretRef or cloudInit.builtin must be set")
)]
#[serde(rename_all = "camelCase")]
pub struct CloudInit {
    /// The user-data document itself, at most 65,536 characters (64 KiB);
    /// a larger one goes in a Secret (`secretRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = limits::CLOUD_INIT_INLINE_MAX))]
    pub inline: Option<String>,
    /// A Secret in the Proxy's namespace holding the user-data. The Secret
    /// must carry the label `crawl.example.com/cloud-init: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
    /// A setup the operator writes itself: `squid` installs Squid from the
    /// image's packages with the kubernetes provider's destination rules,
    /// the Proxy's credentials and no client headers (docs/credentials.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<super::auth::Builtin>,
}

/// A key of a Secret in the Proxy's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret's data; defaults to `user-data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = limits::SECRET_KEY_MAX))]
    pub key: Option<String>,
}

impl SecretKeyRef {
    /// Key used when `key` is unset.
    pub const DEFAULT_KEY: &'static str = "user-data";

    /// The key to read, with the default applied.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or(Self::DEFAULT_KEY)
    }
}

/// Address of an External proxy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Host name or IP address the proxy listens on.
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// TCP port the proxy listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Per-proxy probe settings. Every field is optional; an unset field takes
/// the operator-wide default (see docs/api-reference.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckSpec {
    /// URL fetched through the proxy: `https://` is reached with a CONNECT
    /// tunnel and TLS, `http://` with a forward request. Default:
    /// `--default-probe-url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[schemars(regex(pattern = r"^[hH][tT][tT][pP][sS]?://"))]
    pub url: Option<String>,
    /// HTTP status the target must answer with. Default: the operator's
    /// expected status (204 for the default URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 599))]
    pub expected_status: Option<i32>,
    /// Seconds between probes. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub interval_seconds: Option<i32>,
    /// Seconds one probe may take. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60))]
    pub timeout_seconds: Option<i32>,
    /// Consecutive successes needed to turn healthy. Default 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub success_threshold: Option<i32>,
    /// Consecutive failures needed to turn unhealthy. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: Option<i32>,
}

/// Observed state of a Proxy, written only by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// The `metadata.generation` of the spec the operator last acted on;
    /// when it equals `metadata.generation`, the conditions describe the
    /// current spec (kstatus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// Lifecycle phase: Provisioning, Running (instance up, not yet proven
    /// healthy), Ready (probes pass through it) or Failed (needs a spec edit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ProxyPhase>,
    /// Opaque instance ID returned by the provider; empty until an instance
    /// was recorded as created.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Address clients connect to, set only from a Running instance (or the
    /// External endpoint's host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Port the current instance serves on: `spec.port` when it was
    /// created. Probes and leases use it, so an instance keeps serving on
    /// its own port until a changed `spec.port` has rolled it (Managed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Probe latency of the last status-affecting result, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub latency_millis: Option<i64>,
    /// When the last status-affecting probe result was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<DateTime<Utc>>,
    /// When the operator last asked the provider to delete the instance;
    /// used to avoid resubmitting a delete on every poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_requested_at: Option<DateTime<Utc>>,
    /// When the operator created the current instance; its startup
    /// timeout counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// Replacements in a row: instances found stopped, terminated or gone
    /// without the operator asking, not running by their startup timeout,
    /// or recycled for failing their probe. From the second on, each
    /// re-create waits longer (reason `ReplaceBackoff`); the count resets
    /// once an instance has run for 10 minutes without failing its probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replacements: Option<i32>,
    /// When the last of those replacements was noticed; the next re-create
    /// waits from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_replaced_at: Option<DateTime<Utc>>,
    /// The last `crawl.example.com/replace` value acted on: the instance
    /// was, or is being, replaced for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_handled: Option<String>,
    /// When the Proxy began draining for a recycle (no new leases); unset
    /// when not draining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining_since: Option<DateTime<Utc>>,
    /// The serial of the current instance: its name is the Proxy's
    /// instance name, followed by `-<serial>` from 1 on (absent: 0, the
    /// bare name). Each surge replacement takes the next serial, so the old
    /// and the new instance can exist at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub instance_serial: Option<i32>,
    /// The Secret (in the Proxy's namespace) holding the current
    /// instance's credentials (keys `username`, `password`); absent when
    /// it takes none (`spec.auth.mode: None`, or created before
    /// credentials existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// The replacement being created before the current instance goes
    /// (the provider's `maxSurge`): recorded before it is created, so a
    /// restart finds it by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surge: Option<SurgeStatus>,
    /// The previous instance after a surge replacement took over: it
    /// serves the leases granted on it until they end or the drain
    /// timeout, then it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retiring: Option<RetiringStatus>,
    /// Conditions: `Ready` (the summary: True exactly when the phase is
    /// Ready), `Provisioned` (instance exists and runs), `Healthy` (probes
    /// pass through the proxy) and `Recycling`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Lifecycle phase of a Proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProxyPhase {
    /// The instance is being created or replaced.
    Provisioning,
    /// The instance runs with an IP; no healthy probe verdict yet.
    Running,
    /// Probes pass through the proxy; it is advertised and leased.
    Ready,
    /// A permanent error; the Proxy waits for a spec edit.
    Failed,
}

impl ProxyPhase {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyPhase::Provisioning => "Provisioning",
            ProxyPhase::Running => "Running",
            ProxyPhase::Ready => "Ready",
            ProxyPhase::Failed => "Failed",
        }
    }
}

/// Condition types and reasons on a Proxy.
pub mod conditions {
    /// The summary condition (kstatus, `kubectl wait --for=condition=Ready`):
    /// True exactly when the phase is Ready.
    pub const READY: &str = "Ready";
    /// Ready=True: probes pass through the proxy; it is advertised.
    pub const REASON_PROXY_READY: &str = "ProxyReady";
    /// Ready=False: the instance runs (or the External endpoint is set)
    /// and no probe verdict has come yet.
    pub const REASON_AWAITING_VERDICT: &str = "AwaitingVerdict";
    /// Ready=False: no pass has decided anything yet.
    pub const REASON_PENDING: &str = "Pending";
    /// The instance exists and runs.
    pub const PROVISIONED: &str = "Provisioned";
    /// Probes pass through the proxy.
    pub const HEALTHY: &str = "Healthy";

    /// Provisioned=True: the instance runs with an IP.
    pub const REASON_INSTANCE_RUNNING: &str = "InstanceRunning";
    /// Provisioned=False: a create was submitted or the instance boots.
    pub const REASON_CREATING: &str = "Creating";
    /// `Provisioned=False`: the instance was not running with an address
    /// by its startup timeout and is being replaced.
    pub const REASON_STARTUP_TIMED_OUT: &str = "StartupTimedOut";
    /// Provisioned=False: a quota or rate limit; retried after 5 minutes.
    pub const REASON_QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// Provisioned=Unknown: the provider refuses the operator's credentials
    /// or permissions (or cannot be observed); retried in minutes, never
    /// latched, and a serving Proxy keeps serving by its health.
    pub const REASON_PROVIDER_UNAVAILABLE: &str = "ProviderUnavailable";
    /// Provisioned=False: the provider refused the request for good.
    pub const REASON_PERMANENT_ERROR: &str = "PermanentError";
    /// Provisioned=False: the cloud-init Secret or key cannot be read.
    pub const REASON_CLOUD_INIT_ERROR: &str = "CloudInitError";
    /// Provisioned=False: the spec cannot be acted on (bypassed validation).
    pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
    /// Provisioned=False: an External Proxy in a namespace the operator's
    /// `--external-proxy-namespaces` does not list; never probed nor
    /// offered.
    pub const REASON_EXTERNAL_NOT_ALLOWED: &str = "ExternalNotAllowed";
    /// Provisioned=False: an External Proxy's `spec.auth.secretRef` names
    /// no labelled Secret with usable credentials; not probed nor offered.
    pub const REASON_CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";
    /// Healthy=Unknown: the Proxy is not probed (see Provisioned).
    pub const REASON_NOT_PROBED: &str = "NotProbed";
    /// Provisioned=False: the provider's create limits (`createsPerMinute`,
    /// `maxCreatesInFlight`) hold this create back until a set time.
    pub const REASON_CREATE_THROTTLED: &str = "CreateThrottled";
    /// Provisioned=False: the provider holds its `maxInstances`; the create
    /// waits until one of its instances goes.
    pub const REASON_INSTANCE_LIMIT: &str = "InstanceLimit";
    /// Provisioned=False: the instance was replaced repeatedly; the next
    /// re-create waits (30 s doubling, up to 30 minutes).
    pub const REASON_REPLACE_BACKOFF: &str = "ReplaceBackoff";

    /// Recycling (True while a recycle runs): the Proxy gets no new leases
    /// while its held leases run out.
    pub const RECYCLING: &str = "Recycling";
    /// Recycling=True: draining before the instance is replaced.
    pub const REASON_DRAINING: &str = "Draining";
    /// Recycling=True: its replacement is being created while it serves
    /// (the provider's `maxSurge`).
    pub const REASON_SURGING: &str = "Surging";
    /// Recycling=True: the replacement took over; the replaced instance
    /// serves the leases it had until they end, then goes.
    pub const REASON_RETIRING: &str = "Retiring";
    /// Deleting (False while a deleted Proxy's instance cannot be deleted):
    /// the finalizer stays until it can, or until skip-cleanup.
    pub const DELETING: &str = "Deleting";
    /// Deleting=False: the provider refused or failed the delete (or the
    /// get before it) several times in a row; the message is its words.
    pub const REASON_CLEANUP_FAILED: &str = "CleanupFailed";
    /// UpToDate (False while the instance runs with an older spec or
    /// cloud-init than the Proxy's): it is replaced through the provider's
    /// budget, drained first; removed once the new instance is created.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// UpToDate=False: placement, port or cloud-init changed.
    pub const REASON_SPEC_CHANGED: &str = "SpecChanged";
    /// Provisioned=False: the instance is gone or stopped, but the
    /// provider's circuit breaker is open, so it is not replaced yet.
    pub const REASON_CIRCUIT_OPEN: &str = "CircuitOpen";
}
