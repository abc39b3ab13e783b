//! The status of a Proxy's instances besides its current one: a surge
//! replacement being created, and a replaced instance retiring (the
//! provider's `maxSurge`, issue 32).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A surge replacement in progress (see `ProxyStatus::surge`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SurgeStatus {
    /// Its serial (see `ProxyStatus::instanceSerial`).
    #[schemars(range(min = 1))]
    pub serial: i32,
    /// When the surge was decided.
    pub started_at: DateTime<Utc>,
    /// Its provider ID, once created.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// When it was created; its startup timeout counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    /// The port it serves on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// The spec hash it was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_hash: Option<String>,
    /// When the operator asked the provider to delete it (a surge that
    /// did not come up is given up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_requested_at: Option<DateTime<Utc>>,
    /// The Secret holding its credentials (see
    /// `ProxyStatus::credentialsSecret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
}

/// A replaced instance being drained (see `ProxyStatus::retiring`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetiringStatus {
    /// Its provider ID.
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// Its address, for the leases still on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// When its replacement took over: its drain counts from here.
    pub since: DateTime<Utc>,
    /// When the operator asked the provider to delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_requested_at: Option<DateTime<Utc>>,
    /// The Secret holding its credentials, deleted once it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
}
