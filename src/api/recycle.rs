//! `spec.recycle` of a Proxy: when its instance is replaced on purpose.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When the operator replaces a Managed Proxy's instance on its own. Every
/// key is off when unset. A recycle is drained first (no new leases; held
/// leases run to expiry or `drainTimeout`), respects the provider's
/// `maxUnavailable` and waits while the provider's circuit breaker is open.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecycleSpec {
    /// Replace the instance after the Proxy has been unhealthy this long,
    /// e.g. `15m`; at least `30s` (a shorter value counts as `30s`). Off
    /// when unset. Recycles for health back off like replacements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::limits::DURATION_MAX))]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub unhealthy_for: Option<String>,
    /// Replace an instance older than this, e.g. `24h` (a new instance,
    /// so a new egress IP). Off when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::limits::DURATION_MAX))]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub max_age: Option<String>,
    /// How long a drain waits for held leases to expire before the
    /// instance is replaced anyway. Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::limits::DURATION_MAX))]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub drain_timeout: Option<String>,
    /// Replace an instance that is not running with an address this long
    /// after its create, e.g. `10m`; at least `30s`. Default: the
    /// provider's `startupTimeout` (15m unless configured). Repeats back
    /// off like replacements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::limits::DURATION_MAX))]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h|d))+$"))]
    pub startup_timeout: Option<String>,
}
