//! The `kubernetes` block's destination rules: which addresses the
//! generated Squid refuses to reach on a tenant's behalf.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

/// Ranges a Squid Pod never connects to unless `allow` names them: link-local
/// (the cloud metadata server at 169.254.169.254 among them), loopback (the
/// Pod itself, or the node when the Pod shares its network), and the
/// private ranges a cluster's Pods, Services and nodes live in (RFC 1918,
/// the 100.64.0.0/10 shared range, IPv6 unique-local fc00::/7), so a tenant
/// cannot crawl the cluster from inside it.
pub const DEFAULT_DENIED: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
];

/// Destinations no generated Squid reaches, whatever `deny` and `allow`
/// say: "this network" and the unspecified address (a connection to them
/// lands on the proxy's own host), link-local (the cloud metadata servers
/// at 169.254.169.254 and fe80::/10 among them), AWS's IPv6 and Alibaba's
/// metadata addresses. None is a crawl target, so an `allow` as wide as
/// `0.0.0.0/0` cannot open them. Loopback is refused by Squid's
/// `to_localhost`, which an `allow` entry may still open.
pub const NEVER_REACHED: &[&str] = &[
    "0.0.0.0/8",
    "::/128",
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
];

/// `kubernetes.destinations`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destinations {
    /// Addresses or CIDRs never reached through the proxy.
    #[serde(default = "default_denied")]
    pub deny: Vec<String>,
    /// Addresses or CIDRs reached even inside a denied range.
    #[serde(default)]
    pub allow: Vec<String>,
}

fn default_denied() -> Vec<String> {
    DEFAULT_DENIED.iter().map(|s| s.to_string()).collect()
}

impl Default for Destinations {
    fn default() -> Self {
        Destinations {
            deny: default_denied(),
            allow: Vec::new(),
        }
    }
}

/// The parsed rules, in the form Squid is given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DestinationRules {
    /// Reached even inside a denied range.
    pub allow: Vec<IpNet>,
    /// Never reached.
    pub deny: Vec<IpNet>,
}

impl DestinationRules {
    /// The rules of `d`; a list the load-time check would refuse (a config
    /// built in code) falls back to the default denials, never to none.
    pub fn of(d: &Destinations) -> Self {
        d.rules().unwrap_or_else(|_| DestinationRules {
            allow: Vec::new(),
            deny: DEFAULT_DENIED.iter().filter_map(|s| net(s)).collect(),
        })
    }
}

impl Destinations {
    /// Parses every entry; an error names the key, the index and the value.
    pub fn rules(&self) -> Result<DestinationRules, String> {
        self.rules_of("kubernetes")
    }

    /// [`Self::rules`] of the `block` (`gcp`, `kvm`) the list is in, which
    /// the refusal names.
    pub fn rules_of(&self, block: &str) -> Result<DestinationRules, String> {
        let parse = |key: &str, list: &[String]| -> Result<Vec<IpNet>, String> {
            list.iter()
                .enumerate()
                .map(|(i, s)| {
                    net(s).ok_or_else(|| {
                        format!(
                            "{block}.destinations.{key}[{i}]: {s:?} is not an IP address or CIDR (e.g. 10.0.0.0/8)"
                        )
                    })
                })
                .collect()
        };
        Ok(DestinationRules {
            allow: parse("allow", &self.allow)?,
            deny: parse("deny", &self.deny)?,
        })
    }
}

/// An address (a host route) or a CIDR.
fn net(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_or_name_the_key_and_value() {
        struct Case {
            name: &'static str,
            deny: &'static [&'static str],
            allow: &'static [&'static str],
            want: Result<(&'static [&'static str], &'static [&'static str]), &'static str>,
        }
        let cases = [
            Case {
                name: "addresses become host routes",
                deny: &["169.254.169.254", "::1"],
                allow: &["10.0.0.7"],
                want: Ok((&["169.254.169.254/32", "::1/128"], &["10.0.0.7/32"])),
            },
            Case {
                name: "CIDRs stay as given",
                deny: &["10.0.0.0/8", "fc00::/7"],
                allow: &[],
                want: Ok((&["10.0.0.0/8", "fc00::/7"], &[])),
            },
            Case {
                name: "a prefix too long",
                deny: &["10.0.0.0/33"],
                allow: &[],
                want: Err("kubernetes.destinations.deny[0]: \"10.0.0.0/33\""),
            },
            Case {
                name: "a line of Squid config is not an address",
                deny: &[],
                allow: &["all\nhttp_access allow all"],
                want: Err("kubernetes.destinations.allow[0]"),
            },
        ];
        for c in cases {
            let d = Destinations {
                deny: c.deny.iter().map(|s| s.to_string()).collect(),
                allow: c.allow.iter().map(|s| s.to_string()).collect(),
            };
            match (d.rules(), c.want) {
                (Ok(r), Ok((deny, allow))) => {
                    let shown = |v: &[IpNet]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
                    assert_eq!(shown(&r.deny), deny, "{}", c.name);
                    assert_eq!(shown(&r.allow), allow, "{}", c.name);
                }
                (Err(e), Err(want)) => assert!(e.contains(want), "{}: {e}", c.name),
                (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
            }
        }
    }

    #[test]
    fn the_default_denies_metadata_loopback_and_private_ranges() {
        struct Case {
            name: &'static str,
            addr: &'static str,
            denied: bool,
        }
        let cases = [
            Case {
                name: "cloud metadata",
                addr: "169.254.169.254",
                denied: true,
            },
            Case {
                name: "loopback",
                addr: "127.0.0.1",
                denied: true,
            },
            Case {
                name: "IPv6 loopback",
                addr: "::1",
                denied: true,
            },
            Case {
                name: "IPv6 link-local",
                addr: "fe80::1",
                denied: true,
            },
            Case {
                name: "a Pod in 10/8",
                addr: "10.244.1.7",
                denied: true,
            },
            Case {
                name: "a Service in 172.16/12",
                addr: "172.20.0.10",
                denied: true,
            },
            Case {
                name: "a node in 192.168/16",
                addr: "192.168.1.20",
                denied: true,
            },
            Case {
                name: "shared address space (GKE, CGNAT)",
                addr: "100.64.3.4",
                denied: true,
            },
            Case {
                name: "IPv6 unique-local",
                addr: "fd12:3456::1",
                denied: true,
            },
            Case {
                name: "just outside 172.16/12",
                addr: "172.32.0.1",
                denied: false,
            },
            Case {
                name: "a public address",
                addr: "93.184.216.34",
                denied: false,
            },
            Case {
                name: "a public IPv6 address",
                addr: "2606:4700::1111",
                denied: false,
            },
        ];
        let r = Destinations::default().rules().unwrap();
        for c in cases {
            let a: IpAddr = c.addr.parse().unwrap();
            assert_eq!(
                r.deny.iter().any(|n| n.contains(&a)),
                c.denied,
                "{}",
                c.name
            );
        }
        assert!(r.allow.is_empty());
        let broken = Destinations {
            deny: vec!["nonsense".into()],
            allow: vec!["10.0.0.1".into()],
        };
        assert_eq!(
            DestinationRules::of(&broken),
            r,
            "falls back to the defaults"
        );
    }
}
