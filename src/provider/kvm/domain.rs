//! What the provider makes of a domain libvirt reported: its state as the
//! provider's, and the instance a Get or ListByTag returns. The libvirt
//! sequences themselves run in the helper (src/bin/egress-proxies-libvirt).

use super::classify::state;
pub use super::protocol::Observed;
use crate::provider::{Instance, InstanceState};

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
/// dials (the default `--probe-deny-cidrs`: loopback, link-local and the
/// metadata servers, "this network", multicast, broadcast): a guest runs
/// what its cloud-init says, and its guest agent can report anything.
/// Such a guest has no address: Provisioning, then replaced after its
/// startup timeout. Private ranges are the guests' own networks.
pub fn usable_address(ip: String) -> String {
    // Parsed once: this runs for every domain of every listing.
    static DENY: std::sync::LazyLock<crate::tenancy::ProbeDenylist> =
        std::sync::LazyLock::new(crate::tenancy::ProbeDenylist::default_list);
    let denied = ip.parse::<std::net::IpAddr>().is_ok_and(|a| DENY.denies(a));
    match denied {
        true => String::new(),
        false => ip,
    }
}

/// The instance `id` as observed.
pub fn to_instance(id: String, obs: Observed) -> Instance {
    let mark = obs.mark.unwrap_or_default();
    let ip = usable_address(obs.ip);
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
        for (reported, kept) in [
            ("10.0.0.5", "10.0.0.5"),
            ("192.168.122.40", "192.168.122.40"),
            ("127.0.0.1", ""),
            ("169.254.169.254", ""),
            ("100.100.100.200", ""),
            ("0.0.0.7", ""),
            ("224.0.0.1", ""),
            ("255.255.255.255", ""),
            ("", ""),
        ] {
            assert_eq!(usable_address(reported.to_string()), kept, "{reported}");
        }
        let obs = Observed {
            mark: None,
            state: state::DOMAIN_RUNNING,
            ip: "169.254.169.254".into(),
            macs: Vec::new(),
        };
        let i = to_instance("h/d".into(), obs);
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
