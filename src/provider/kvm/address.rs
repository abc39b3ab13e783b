//! A running domain's address: libvirt's address sources in order, and a
//! pure choice among their answers.

use virt::domain::Domain;
use virt::sys;

use super::conn::{rpc, NO_FLAGS};
use super::xml;

/// The first usable IPv4 address from one address source's answer.
pub fn pick_ipv4(ifaces: &[(String, Vec<(i64, String)>)]) -> Option<String> {
    for (_, addrs) in ifaces {
        for (kind, addr) in addrs {
            if *kind != sys::VIR_IP_ADDR_TYPE_IPV4 as i64 {
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

/// The domain's address (empty when it has none yet) and its NICs' MACs
/// (for the host's neighbour table, `neighbours.rs`).
pub fn address_of(d: &Domain) -> (String, Vec<String>) {
    // Only the domain's own NICs count (a bridge inside the guest must not
    // win); without the XML every interface counts.
    let macs = rpc("virDomainGetXMLDesc", || d.xml_desc(NO_FLAGS))
        .map(|x| xml::interface_macs(&x))
        .unwrap_or_default();
    // Lease (libvirt networks), ARP, then the guest agent; errors mean "no
    // address yet", never a failure.
    for (source, name) in [
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
            "virDomainInterfaceAddresses(lease)",
        ),
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            "virDomainInterfaceAddresses(arp)",
        ),
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
            "virDomainInterfaceAddresses(agent)",
        ),
    ] {
        if let Ok(ifaces) = rpc(name, || d.interface_addresses(source, NO_FLAGS)) {
            let view: Vec<(String, Vec<(i64, String)>)> = ifaces
                .into_iter()
                .filter(|i| own_nic(&macs, i.hwaddr.as_deref()))
                .map(|i| {
                    (
                        i.name,
                        i.addrs.into_iter().map(|a| (a.typed, a.addr)).collect(),
                    )
                })
                .collect();
            if let Some(ip) = pick_ipv4(&view) {
                return (ip, macs);
            }
        }
    }
    (String::new(), macs)
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
