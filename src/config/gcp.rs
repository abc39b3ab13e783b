//! The `gcp` provider block.

use serde::Deserialize;

/// Settings of a `gcp` provider entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GcpConfig {
    /// Which addresses the built-in Squid setup (`cloudInit.builtin:
    /// squid`) refuses to reach (`gcp.destinations`, as the kubernetes
    /// provider's).
    #[serde(default)]
    pub destinations: crate::config::Destinations,
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
    /// Zones a Proxy may ask for; empty allows any. An entry ending in `*`
    /// allows every value it is a prefix of.
    #[serde(default)]
    pub allowed_zones: Vec<String>,
    /// Machine types a Proxy may ask for; empty allows any.
    #[serde(default)]
    pub allowed_machine_types: Vec<String>,
    /// Images a Proxy may ask for; empty allows any.
    #[serde(default)]
    pub allowed_images: Vec<String>,
}

/// Whether `value` is allowed by `list`: an empty list allows anything; an
/// entry matches exactly, or as a prefix when it ends in `*`.
pub fn allowed(list: &[String], value: &str) -> bool {
    list.is_empty()
        || list.iter().any(|entry| match entry.strip_suffix('*') {
            Some(prefix) => value.starts_with(prefix),
            None => entry == value,
        })
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
        for (key, list) in [
            ("allowedZones", &self.allowed_zones),
            ("allowedMachineTypes", &self.allowed_machine_types),
            ("allowedImages", &self.allowed_images),
        ] {
            for (i, entry) in list.iter().enumerate() {
                let body = entry.strip_suffix('*').unwrap_or(entry);
                if entry.trim().is_empty() || body.contains('*') {
                    return Err(format!(
                        "gcp.{key}[{i}]: {entry:?} must be a value, or a prefix ending in a single '*'"
                    ));
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlists_match_exactly_or_by_prefix() {
        struct Case {
            name: &'static str,
            list: &'static [&'static str],
            value: &'static str,
            want: bool,
        }
        let cases = [
            Case {
                name: "an empty list allows anything",
                list: &[],
                value: "n2-highmem-96",
                want: true,
            },
            Case {
                name: "an exact entry",
                list: &["e2-small", "e2-micro"],
                value: "e2-micro",
                want: true,
            },
            Case {
                name: "not listed",
                list: &["e2-small"],
                value: "n2-highmem-96",
                want: false,
            },
            Case {
                name: "an exact entry is not a prefix",
                list: &["e2-small"],
                value: "e2-small-2",
                want: false,
            },
            Case {
                name: "a prefix entry",
                list: &["projects/debian-cloud/*"],
                value: "projects/debian-cloud/global/images/family/debian-12",
                want: true,
            },
            Case {
                name: "a prefix entry of another project",
                list: &["projects/debian-cloud/*"],
                value: "projects/evil/global/images/miner",
                want: false,
            },
        ];
        for c in cases {
            let list: Vec<String> = c.list.iter().map(|s| s.to_string()).collect();
            assert_eq!(allowed(&list, c.value), c.want, "{}", c.name);
        }
    }
}
