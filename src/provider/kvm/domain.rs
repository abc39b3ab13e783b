//! What the provider makes of a domain libvirt reported: its state as the
//! provider's, and the instance a Get or ListByTag returns. The libvirt
//! sequences themselves run in the helper (src/bin/egress-proxies-libvirt).

use super::classify::state;
pub use super::protocol::Observed;
use crate::provider::{Instance, InstanceState};
use crate::tenancy::ProbeDenylist;

/// Maps a libvirt state and address to the provider state (kvm.md §6).
pub fn map_state(state: u32, ip: &str) -> InstanceState {
    match state {
        state::DOMAIN_NOSTATE => InstanceState::Provisioning,
        state::DOMAIN_RUNNING | state::DOMAIN_BLOCKED if !ip.is_empty() => InstanceState::Running,
        state::DOMAIN_RUNNING | state::DOMAIN_BLOCKED => InstanceState::Provisioning,
        _ => InstanceState::Stopped,
    }
}

/// Whether a domain in `state` runs (its address is worth asking for).
pub fn is_active(state: u32) -> bool {
    state == state::DOMAIN_RUNNING || state == state::DOMAIN_BLOCKED
}

/// The address a guest reported, unless it is one the operator never
/// dials: in the default `--probe-deny-cidrs` (loopback, link-local and
/// the metadata servers, "this network", multicast, broadcast, private
/// ranges) and not in the provider's `kvm.allowedAddresses` (`guests`,
/// see [`crate::config::KvmConfig::guest_addresses`]): a guest runs what
/// its cloud-init says, and its guest agent can report anything. Such a
/// guest has no address: Provisioning, then replaced after its startup
/// timeout.
pub fn usable_address(ip: String, guests: &ProbeDenylist) -> String {
    let denied = ip
        .parse::<std::net::IpAddr>()
        .is_ok_and(|a| guests.denies(a));
    match denied {
        true => String::new(),
        false => ip,
    }
}

/// The instance `id` as observed, its address judged by `guests`.
pub fn to_instance(id: String, obs: Observed, guests: &ProbeDenylist) -> Instance {
    let mark = obs.mark.unwrap_or_default();
    let ip = usable_address(obs.ip, guests);
    Instance {
        id,
        state: map_state(obs.state, &ip),
        ip,
        uid: mark.uid,
        installation_id: mark.installation,
        created_at: mark.created_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_the_operator_never_dials_is_no_address() {
        let guests = crate::config::KvmConfig {
            allowed_addresses: vec!["192.168.122.0/24".into(), "10.0.0.5".into()],
            ..Default::default()
        }
        .guest_addresses()
        .unwrap();
        for (reported, kept) in [
            ("10.0.0.5", "10.0.0.5"),
            ("192.168.122.40", "192.168.122.40"),
            ("203.0.113.9", "203.0.113.9"),
            // Private, but not the guests' network: a Service, a Pod.
            ("10.96.0.1", ""),
            ("192.168.123.40", ""),
            ("172.17.0.2", ""),
            ("fd00::5", ""),
            ("127.0.0.1", ""),
            ("169.254.169.254", ""),
            ("100.100.100.200", ""),
            ("0.0.0.7", ""),
            ("224.0.0.1", ""),
            ("255.255.255.255", ""),
            ("", ""),
        ] {
            assert_eq!(
                usable_address(reported.to_string(), &guests),
                kept,
                "{reported}"
            );
        }
        let obs = Observed {
            mark: None,
            state: state::DOMAIN_RUNNING,
            ip: "169.254.169.254".into(),
            macs: Vec::new(),
        };
        let i = to_instance("h/d".into(), obs, &guests);
        assert_eq!((i.state, i.ip.as_str()), (InstanceState::Provisioning, ""));
    }

    #[test]
    fn state_table() {
        assert_eq!(map_state(0, ""), InstanceState::Provisioning);
        assert_eq!(map_state(1, "10.0.0.5"), InstanceState::Running);
        assert_eq!(map_state(2, "10.0.0.5"), InstanceState::Running);
        assert_eq!(map_state(1, ""), InstanceState::Provisioning);
        for s in 3..=9 {
            assert_eq!(map_state(s, "10.0.0.5"), InstanceState::Stopped, "{s}");
        }
    }
}
