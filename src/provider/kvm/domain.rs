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

/// The instance `id` as observed.
pub fn to_instance(id: String, obs: Observed) -> Instance {
    let mark = obs.mark.unwrap_or_default();
    Instance {
        id,
        state: map_state(obs.state, &obs.ip),
        ip: obs.ip,
        uid: mark.uid,
        installation_id: mark.installation,
        created_at: mark.created_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
