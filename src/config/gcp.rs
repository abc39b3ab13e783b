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
    /// Ports (`spec.port`) a Proxy may serve on, each a port or a range
    /// `"A-B"`. Never empty: a tenant's port becomes a firewall rule (with
    /// `firewall`) and a listening socket on a public address, so it is
    /// the installation's choice, not the tenant's. Default
    /// [`DEFAULT_ALLOWED_PORTS`].
    #[serde(default = "default_allowed_ports")]
    pub allowed_ports: Vec<PortEntry>,
    /// `gcp.firewall`: when set, the provider keeps one firewall rule per
    /// port its instances serve on, admitting `allowedSourceRanges` to
    /// instances with `networkTag`, and deletes it once no instance of
    /// this installation serves on that port.
    #[serde(default)]
    pub firewall: Option<FirewallConfig>,
}

/// The ports a forward proxy is expected on: Squid's 3128 (the samples'),
/// its usual second port 3129, and the common HTTP proxy ports 8080 and
/// 8888.
pub const DEFAULT_ALLOWED_PORTS: [u16; 4] = [3128, 3129, 8080, 8888];

/// [`DEFAULT_ALLOWED_PORTS`] as `gcp.allowedPorts` entries.
pub fn default_allowed_ports() -> Vec<PortEntry> {
    DEFAULT_ALLOWED_PORTS
        .iter()
        .map(|p| PortEntry::Port(i64::from(*p)))
        .collect()
}

/// An entry of `gcp.allowedPorts`: `3128` or `"8000-8100"`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PortEntry {
    /// One port.
    Port(i64),
    /// A range `"A-B"` (both included), or one port written as a string.
    Range(String),
}

impl PortEntry {
    /// The ports the entry covers, or why it covers none.
    fn ports(&self) -> Result<std::ops::RangeInclusive<u16>, String> {
        let port = |v: i64| {
            u16::try_from(v)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{v} is not a port (1-65535)"))
        };
        let text = |t: &str| {
            t.trim()
                .parse::<i64>()
                .map_err(|_| format!("{t:?} is not a port or a range such as \"8000-8100\""))
                .and_then(port)
        };
        match self {
            PortEntry::Port(v) => port(*v).map(|p| p..=p),
            PortEntry::Range(r) => match r.split_once('-') {
                None => text(r).map(|p| p..=p),
                Some((a, b)) => {
                    let (a, b) = (text(a)?, text(b)?);
                    if a > b {
                        return Err(format!("{r:?} is a range whose start is past its end"));
                    }
                    Ok(a..=b)
                }
            },
        }
    }
}

/// `gcp.firewall`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FirewallConfig {
    /// Source ranges (CIDRs) the rule admits: the crawlers' egress
    /// addresses. Required, at least one.
    #[serde(default)]
    pub allowed_source_ranges: Vec<String>,
}

impl FirewallConfig {
    /// Whether the ranges admit every address (`0.0.0.0/0` or `::/0`).
    pub fn admits_everyone(&self) -> bool {
        self.allowed_source_ranges.iter().any(|r| {
            r.trim()
                .parse::<ipnet::IpNet>()
                .is_ok_and(|n| n.prefix_len() == 0)
        })
    }

    fn validate(&self, network_tag: &str) -> Result<(), String> {
        if self.allowed_source_ranges.is_empty() {
            return Err("gcp.firewall.allowedSourceRanges is required when gcp.firewall is set (the crawlers' egress CIDRs, e.g. [203.0.113.0/24])".into());
        }
        for (i, r) in self.allowed_source_ranges.iter().enumerate() {
            if r.trim().parse::<ipnet::IpNet>().is_err() {
                return Err(format!(
                    "gcp.firewall.allowedSourceRanges[{i}]: {r:?} is not a CIDR (e.g. 203.0.113.0/24)"
                ));
            }
        }
        if network_tag.trim().is_empty() {
            return Err("gcp.networkTag is required when gcp.firewall is set: the rule admits traffic to the instances carrying it".into());
        }
        Ok(())
    }
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
        if self.allowed_ports.is_empty() {
            return Err(format!(
                "gcp.allowedPorts must list at least one port or range (leave it out for the default, {DEFAULT_ALLOWED_PORTS:?})"
            ));
        }
        for (i, entry) in self.allowed_ports.iter().enumerate() {
            entry
                .ports()
                .map_err(|why| format!("gcp.allowedPorts[{i}]: {why}"))?;
        }
        if let Some(fw) = &self.firewall {
            fw.validate(&self.network_tag)?;
        }
        if let Some(ep) = &self.endpoint {
            super::validate::http_url(ep)
                .map_err(|why| format!("gcp.endpoint {why} (got {ep:?})"))?;
        }
        Ok(())
    }

    /// Whether a Proxy may serve on `port`. An entry the load-time check
    /// would refuse (a config built in code) allows nothing.
    pub fn port_allowed(&self, port: u16) -> bool {
        self.allowed_ports
            .iter()
            .any(|e| e.ports().is_ok_and(|r| r.contains(&port)))
    }

    /// `gcp.allowedPorts` as written, for messages: `3128, 8000-8100`.
    pub fn allowed_ports_shown(&self) -> String {
        self.allowed_ports
            .iter()
            .map(|e| match e {
                PortEntry::Port(p) => p.to_string(),
                PortEntry::Range(r) => r.trim().to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
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

    #[test]
    fn the_firewall_block_is_checked_naming_the_key() {
        let base = || GcpConfig {
            project: "p".into(),
            network: "default".into(),
            network_tag: "egress-proxy".into(),
            ..serde_json::from_value(serde_json::json!({})).unwrap()
        };
        let with = |ranges: &[&str], tag: &str| GcpConfig {
            network_tag: tag.into(),
            firewall: Some(FirewallConfig {
                allowed_source_ranges: ranges.iter().map(|r| r.to_string()).collect(),
            }),
            ..base()
        };
        let cases: [(&str, GcpConfig, Result<(), &str>); 5] = [
            ("no firewall block", base(), Ok(())),
            (
                "ranges and a tag",
                with(&["203.0.113.0/24", "2001:db8::/32"], "t"),
                Ok(()),
            ),
            (
                "no ranges",
                with(&[], "t"),
                Err("gcp.firewall.allowedSourceRanges is required"),
            ),
            (
                "not a CIDR",
                with(&["10.0.0.0/8", "everyone"], "t"),
                Err("gcp.firewall.allowedSourceRanges[1]: \"everyone\" is not a CIDR"),
            ),
            (
                "no tag",
                with(&["10.0.0.0/8"], ""),
                Err("gcp.networkTag is required when gcp.firewall is set"),
            ),
        ];
        for (name, cfg, want) in cases {
            match (cfg.validate(), want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.contains(w), "{name}: {e}"),
                (got, want) => panic!("{name}: {got:?} vs {want:?}"),
            }
        }
        assert!(with(&["0.0.0.0/0"], "t")
            .firewall
            .unwrap()
            .admits_everyone());
        assert!(with(&["::/0"], "t").firewall.unwrap().admits_everyone());
        assert!(!with(&["0.0.0.0/1"], "t")
            .firewall
            .unwrap()
            .admits_everyone());
    }

    #[test]
    fn allowed_ports_are_checked_naming_the_key_and_decide_the_port() {
        let cfg = |yaml: &str| -> Result<GcpConfig, String> {
            let c: GcpConfig = serde_norway::from_str(&format!("project: p\n{yaml}"))
                .map_err(|e| e.to_string())?;
            c.validate().map(|()| c)
        };
        // (what, yaml, the error's words, or the ports allowed and refused)
        type Want = Result<(&'static [u16], &'static [u16]), &'static str>;
        let cases: [(&str, &str, Want); 9] = [
            (
                "the default",
                "",
                Ok((&[3128, 3129, 8080, 8888], &[22, 80, 443, 3127, 65535])),
            ),
            (
                "ports and a range",
                "allowedPorts: [3128, \"8000-8100\", \"9000\"]",
                Ok((&[3128, 8000, 8050, 8100, 9000], &[3129, 7999, 8101, 22])),
            ),
            (
                "every port",
                "allowedPorts: [\"1-65535\"]",
                Ok((&[1, 22, 65535], &[])),
            ),
            (
                "an empty list",
                "allowedPorts: []",
                Err("gcp.allowedPorts must list at least one port or range"),
            ),
            (
                "port 0",
                "allowedPorts: [3128, 0]",
                Err("gcp.allowedPorts[1]: 0 is not a port (1-65535)"),
            ),
            (
                "past 65535",
                "allowedPorts: [70000]",
                Err("gcp.allowedPorts[0]: 70000 is not a port (1-65535)"),
            ),
            (
                "a range past 65535",
                "allowedPorts: [\"8000-70000\"]",
                Err("gcp.allowedPorts[0]: 70000 is not a port (1-65535)"),
            ),
            (
                "a reversed range",
                "allowedPorts: [\"9000-8000\"]",
                Err("gcp.allowedPorts[0]: \"9000-8000\" is a range whose start is past its end"),
            ),
            (
                "a word",
                "allowedPorts: [squid]",
                Err(
                    "gcp.allowedPorts[0]: \"squid\" is not a port or a range such as \"8000-8100\"",
                ),
            ),
        ];
        for (what, yaml, want) in cases {
            match (cfg(yaml), want) {
                (Ok(c), Ok((allowed, refused))) => {
                    for p in allowed {
                        assert!(c.port_allowed(*p), "{what}: {p} is allowed");
                    }
                    for p in refused {
                        assert!(!c.port_allowed(*p), "{what}: {p} is refused");
                    }
                }
                (Err(e), Err(words)) => assert!(e.contains(words), "{what}: {e}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }
}
