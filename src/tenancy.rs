//! Who may point the operator at an outside address (issue 17). An External
//! Proxy makes the operator dial an endpoint a namespace chose and offer it
//! to every crawler, so only the namespaces in [`ExternalNamespaces`] may
//! have one; and the health engine never dials an External endpoint that
//! is, or resolves to, an address in [`ProbeDenylist`] (cloud metadata and
//! the like), so the probe's errors cannot be used to map what lies there.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

/// `--external-proxy-namespaces`' wildcard: every namespace.
pub const ANY_NAMESPACE: &str = "*";

/// Destinations the health engine never dials for an External Proxy (and
/// the gateway never pins) unless `--probe-deny-cidrs` says otherwise or
/// `--probe-allow-cidrs` opens them: loopback (the operator's own servers,
/// and a node's), link-local (the cloud metadata servers at
/// 169.254.169.254 and fe80::/10 among them), AWS's IPv6 metadata address,
/// Alibaba's metadata address, "this network", multicast, broadcast, the
/// unspecified address, and the private ranges a cluster's Pods, Services
/// and nodes live in (RFC 1918, the 100.64.0.0/10 shared range, IPv6
/// unique-local fc00::/7): a tenant's endpoint must not make the operator
/// or the gateway reach into the cluster.
pub const DEFAULT_PROBE_DENY: &str = "127.0.0.0/8,::1/128,169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32,0.0.0.0/8,224.0.0.0/4,255.255.255.255/32,::/128,ff00::/8,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7";

/// The namespaces whose External Proxies the operator serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExternalNamespaces {
    /// Every namespace (`*`).
    Any,
    /// These only.
    Only(BTreeSet<String>),
}

impl ExternalNamespaces {
    /// The allowlist of the flag's value; no value: the operator's own
    /// namespace only (an administrator's namespace, where creating a
    /// Proxy already means being trusted with the operator).
    pub fn parse(flag: Option<&str>, operator_namespace: &str) -> Result<Self, String> {
        let Some(flag) = flag else {
            return Ok(Self::only([operator_namespace]));
        };
        let mut names = BTreeSet::new();
        for (i, raw) in flag.split(',').enumerate() {
            let name = raw.trim();
            if name == ANY_NAMESPACE {
                return Ok(ExternalNamespaces::Any);
            }
            if name.is_empty() {
                continue;
            }
            if !is_namespace_name(name) {
                return Err(format!(
                    "--external-proxy-namespaces: entry {i} {name:?} is not a namespace name (lowercase letters, digits and '-', at most 63) nor \"*\""
                ));
            }
            names.insert(name.to_string());
        }
        Ok(ExternalNamespaces::Only(names))
    }

    /// Exactly these namespaces.
    pub fn only<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        ExternalNamespaces::Only(names.into_iter().map(str::to_string).collect())
    }

    /// Whether an External Proxy in `namespace` is served.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            ExternalNamespaces::Any => true,
            ExternalNamespaces::Only(names) => names.contains(namespace),
        }
    }

    /// The status message of an External Proxy in `namespace` that this
    /// list refuses: the field, why, and the fix.
    pub fn refusal(&self, namespace: &str) -> String {
        let listed = match self {
            ExternalNamespaces::Any => String::from("*"),
            ExternalNamespaces::Only(n) if n.is_empty() => String::from("none"),
            ExternalNamespaces::Only(n) => n.iter().cloned().collect::<Vec<_>>().join(", "),
        };
        format!(
            "spec.mode: External Proxies are not allowed in namespace {namespace:?} (the operator's --external-proxy-namespaces allows: {listed}); the endpoint is not probed and discovery does not offer it"
        )
    }
}

/// An RFC 1123 label, as Kubernetes names namespaces.
fn is_namespace_name(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Addresses the health engine never dials for an External Proxy: those
/// in a denied range and not in an allowed one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeDenylist {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
}

/// The addresses and CIDRs of `flag`'s comma-separated `value` (empty:
/// none). An error names the flag, the entry and the reason.
pub fn parse_cidrs(flag: &str, value: &str) -> Result<Vec<IpNet>, String> {
    let mut nets = Vec::new();
    for (i, raw) in value.split(',').enumerate() {
        let s = raw.trim();
        if s.is_empty() {
            continue;
        }
        let net = s
            .parse::<IpNet>()
            .ok()
            .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
            .ok_or_else(|| {
                format!("{flag}: entry {i} {s:?} is not an IP address or CIDR (e.g. 10.20.0.0/16)")
            })?;
        nets.push(net);
    }
    Ok(nets)
}

impl ProbeDenylist {
    /// The list of `--probe-deny-cidrs`' value, allowing nothing back.
    pub fn parse(flag: &str) -> Result<Self, String> {
        Ok(ProbeDenylist {
            deny: parse_cidrs("--probe-deny-cidrs", flag)?,
            allow: Vec::new(),
        })
    }

    /// The list with `allow` (`--probe-allow-cidrs`, or a kvm provider's
    /// `allowedAddresses`) dialled even inside a denied range: an office
    /// proxy on 10.20.0.0/16 without the rest of 10.0.0.0/8.
    pub fn allowing(mut self, allow: Vec<IpNet>) -> Self {
        self.allow = allow;
        self
    }

    /// [`DEFAULT_PROBE_DENY`].
    pub fn default_list() -> Self {
        // The constant is checked by a unit test; a broken one denies
        // nothing more than it says, never less than link-local.
        Self::parse(DEFAULT_PROBE_DENY).unwrap_or_else(|_| {
            let link_local = ipnet::Ipv4Net::new([169, 254, 0, 0].into(), 16).map(IpNet::V4);
            ProbeDenylist {
                deny: link_local.into_iter().collect(),
                allow: Vec::new(),
            }
        })
    }

    /// Whether `addr` is denied. An IPv4-mapped IPv6 address is judged as
    /// the IPv4 address it carries, so `::ffff:169.254.169.254` is no way
    /// around the list.
    pub fn denies(&self, addr: IpAddr) -> bool {
        let addr = match addr {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        self.deny.iter().any(|n| n.contains(&addr)) && !self.allow.iter().any(|n| n.contains(&addr))
    }

    /// Whether nothing is denied.
    pub fn is_empty(&self) -> bool {
        self.deny.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_allowlists() {
        struct Case {
            name: &'static str,
            flag: Option<&'static str>,
            allowed: &'static [&'static str],
            refused: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "no flag: the operator's namespace only",
                flag: None,
                allowed: &["op-system"],
                refused: &["tenant-a", "default"],
            },
            Case {
                name: "a list",
                flag: Some("crawl, office"),
                allowed: &["crawl", "office"],
                refused: &["op-system", "tenant-a"],
            },
            Case {
                name: "the wildcard",
                flag: Some("crawl,*"),
                allowed: &["crawl", "tenant-a", "op-system"],
                refused: &[],
            },
            Case {
                name: "empty: none",
                flag: Some(""),
                allowed: &[],
                refused: &["op-system", "crawl"],
            },
        ];
        for c in cases {
            let list = ExternalNamespaces::parse(c.flag, "op-system").unwrap();
            for ns in c.allowed {
                assert!(list.allows(ns), "{}: {ns} allowed", c.name);
            }
            for ns in c.refused {
                assert!(!list.allows(ns), "{}: {ns} refused", c.name);
            }
        }
    }

    #[test]
    fn a_bad_namespace_entry_is_named() {
        let e = ExternalNamespaces::parse(Some("crawl,Bad_NS"), "op").unwrap_err();
        assert!(e.contains("--external-proxy-namespaces"), "{e}");
        assert!(e.contains("entry 1 \"Bad_NS\""), "{e}");
    }

    #[test]
    fn the_refusal_names_the_field_the_namespace_and_the_flag() {
        let m = ExternalNamespaces::only(["crawl"]).refusal("tenant-a");
        assert!(m.starts_with("spec.mode: "), "{m}");
        assert!(m.contains("\"tenant-a\""), "{m}");
        assert!(
            m.contains("--external-proxy-namespaces allows: crawl"),
            "{m}"
        );
    }

    #[test]
    fn probe_denylist_decisions() {
        struct Case {
            name: &'static str,
            flag: &'static str,
            addr: &'static str,
            denied: bool,
        }
        let cases = [
            Case {
                name: "cloud metadata",
                flag: DEFAULT_PROBE_DENY,
                addr: "169.254.169.254",
                denied: true,
            },
            Case {
                name: "metadata as an IPv4-mapped IPv6 address",
                flag: DEFAULT_PROBE_DENY,
                addr: "::ffff:169.254.169.254",
                denied: true,
            },
            Case {
                name: "IPv6 link-local",
                flag: DEFAULT_PROBE_DENY,
                addr: "fe80::1",
                denied: true,
            },
            Case {
                name: "AWS IPv6 metadata",
                flag: DEFAULT_PROBE_DENY,
                addr: "fd00:ec2::254",
                denied: true,
            },
            Case {
                name: "the unspecified address",
                flag: DEFAULT_PROBE_DENY,
                addr: "0.0.0.0",
                denied: true,
            },
            Case {
                name: "a public address",
                flag: DEFAULT_PROBE_DENY,
                addr: "203.0.113.7",
                denied: false,
            },
            Case {
                name: "loopback",
                flag: DEFAULT_PROBE_DENY,
                addr: "127.0.0.1",
                denied: true,
            },
            Case {
                name: "loopback anywhere in 127/8",
                flag: DEFAULT_PROBE_DENY,
                addr: "127.3.4.5",
                denied: true,
            },
            Case {
                name: "IPv6 loopback",
                flag: DEFAULT_PROBE_DENY,
                addr: "::1",
                denied: true,
            },
            Case {
                name: "IPv6 loopback mapped to IPv4 loopback",
                flag: DEFAULT_PROBE_DENY,
                addr: "::ffff:127.0.0.1",
                denied: true,
            },
            Case {
                name: "a cluster's Pod range",
                flag: DEFAULT_PROBE_DENY,
                addr: "10.244.1.7",
                denied: true,
            },
            Case {
                name: "a Service address in 172.16/12",
                flag: DEFAULT_PROBE_DENY,
                addr: "172.20.0.10",
                denied: true,
            },
            Case {
                name: "a node on 192.168/16",
                flag: DEFAULT_PROBE_DENY,
                addr: "192.168.1.20",
                denied: true,
            },
            Case {
                name: "the shared range",
                flag: DEFAULT_PROBE_DENY,
                addr: "100.72.0.1",
                denied: true,
            },
            Case {
                name: "IPv6 unique-local",
                flag: DEFAULT_PROBE_DENY,
                addr: "fd12:3456::1",
                denied: true,
            },
            Case {
                name: "a private range added",
                flag: "10.0.0.0/8, 192.0.2.9",
                addr: "10.1.2.3",
                denied: true,
            },
            Case {
                name: "a single address added",
                flag: "10.0.0.0/8, 192.0.2.9",
                addr: "192.0.2.9",
                denied: true,
            },
            Case {
                name: "an empty list denies nothing",
                flag: "",
                addr: "169.254.169.254",
                denied: false,
            },
        ];
        for c in cases {
            let list = ProbeDenylist::parse(c.flag).unwrap();
            let addr: IpAddr = c.addr.parse().unwrap();
            assert_eq!(list.denies(addr), c.denied, "{}", c.name);
        }
        // An allowed range opens only itself inside a denied one.
        let office = parse_cidrs("--probe-allow-cidrs", "10.20.0.0/16").unwrap();
        let list = ProbeDenylist::default_list().allowing(office);
        for (addr, denied) in [
            ("10.20.3.4", false),
            ("::ffff:10.20.3.4", false),
            ("10.21.0.1", true),
            ("169.254.169.254", true),
        ] {
            assert_eq!(list.denies(addr.parse().unwrap()), denied, "{addr}");
        }
        assert_eq!(
            ProbeDenylist::default_list(),
            ProbeDenylist::parse(DEFAULT_PROBE_DENY).unwrap()
        );
    }

    #[test]
    fn a_bad_cidr_is_named() {
        let e = ProbeDenylist::parse("169.254.0.0/16,10.0.0.0/33").unwrap_err();
        assert!(
            e.contains("--probe-deny-cidrs: entry 1 \"10.0.0.0/33\""),
            "{e}"
        );
        let e = parse_cidrs("--probe-allow-cidrs", "10.0.0.0/8,office").unwrap_err();
        assert!(e.contains("--probe-allow-cidrs: entry 1 \"office\""), "{e}");
    }
}
