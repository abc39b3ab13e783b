//! The `gcp` provider block.

use serde::Deserialize;

/// Settings of a `gcp` provider entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GcpConfig {
    /// Project every call goes to (required).
    #[serde(default)]
    pub project: String,
    /// VPC network of the instance's single NIC.
    #[serde(default = "default_network")]
    pub network: String,
    /// Network tag put on instances; the firewall rule for the proxy port
    /// targets it.
    #[serde(default)]
    pub network_tag: String,
    /// Boot disk size in GB (0 means the default, 10).
    #[serde(default)]
    pub disk_size_gb: i64,
    /// Compute API endpoint; default the public API. Lets users go through a
    /// private endpoint and tests reach a local stand-in.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Skip Application Default Credentials (only for local stand-ins).
    #[serde(default)]
    pub anonymous: bool,
}

/// Default boot disk size.
pub const DEFAULT_DISK_SIZE_GB: i64 = 10;

fn default_network() -> String {
    "default".to_string()
}

impl GcpConfig {
    /// Load-time checks, first error wins.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.project.trim().is_empty() {
            return Err("gcp.project is required".into());
        }
        if self.disk_size_gb < 0 {
            return Err(format!(
                "gcp.diskSizeGb must not be negative (got {})",
                self.disk_size_gb
            ));
        }
        if self.network.is_empty() {
            return Err("gcp.network must not be empty".into());
        }
        if let Some(ep) = &self.endpoint {
            super::validate::http_url(ep)
                .map_err(|why| format!("gcp.endpoint {why} (got {ep:?})"))?;
        }
        Ok(())
    }

    /// Boot disk size with the default applied.
    pub fn disk_size_gb_or_default(&self) -> i64 {
        if self.disk_size_gb == 0 {
            DEFAULT_DISK_SIZE_GB
        } else {
            self.disk_size_gb
        }
    }
}
