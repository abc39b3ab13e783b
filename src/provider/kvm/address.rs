//! A running domain's address: a pure choice among the answers of
//! libvirt's address sources (the helper asks them in order).

use super::classify::state;

/// The first usable IPv4 address from one address source's answer.
pub fn pick_ipv4(ifaces: &[(String, Vec<(i64, String)>)]) -> Option<String> {
    for (_, addrs) in ifaces {
        for (kind, addr) in addrs {
            if *kind != state::IP_ADDR_IPV4 {
                continue;
            }
            let Ok(ip) = addr.parse::<std::net::Ipv4Addr>() else {
                continue;
            };
            if ip.is_loopback() || ip.is_link_local() || ip.is_unspecified() {
                continue;
            }
            return Some(ip.to_string());
        }
    }
    None
}

/// Whether an interface with `hwaddr` belongs to the domain's NICs `macs`.
pub fn own_nic(macs: &[String], hwaddr: Option<&str>) -> bool {
    match hwaddr {
        Some(h) if !macs.is_empty() => macs.iter().any(|m| m.eq_ignore_ascii_case(h)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_selection() {
        let v = vec![
            ("lo".to_string(), vec![(0, "127.0.0.1".to_string())]),
            (
                "eth0".to_string(),
                vec![
                    (1, "fe80::1".to_string()),
                    (0, "169.254.3.3".to_string()),
                    (0, "192.168.1.50".to_string()),
                ],
            ),
        ];
        assert_eq!(pick_ipv4(&v).as_deref(), Some("192.168.1.50"));
        assert_eq!(pick_ipv4(&[]), None);
    }

    #[test]
    fn only_the_domains_own_nics_count() {
        let macs = vec!["52:54:00:aa:bb:cc".to_string()];
        assert!(own_nic(&macs, Some("52:54:00:AA:BB:CC")));
        assert!(!own_nic(&macs, Some("02:42:ac:11:00:02")));
        assert!(own_nic(&macs, None));
        assert!(own_nic(&[], Some("02:42:ac:11:00:02")));
    }
}
