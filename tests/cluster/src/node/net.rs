//! The Pod network: one host-only Linux bridge per cluster, with no
//! uplink, and one address per Pod.

use std::net::Ipv4Addr;

/// The bridge and its address pool.
pub struct PodNetwork {
    _private: (),
}

impl PodNetwork {
    /// Creates a bridge with an unused name and a /24 of 10.216.0.0/16 that
    /// no other interface on the host uses.
    pub fn create() -> anyhow::Result<PodNetwork> {
        anyhow::bail!("the pod network is not built yet")
    }

    /// The bridge's own address: the Pods' default gateway, and where the
    /// host serves what Pods must reach (the API server's forwarder, test
    /// HTTP targets).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::UNSPECIFIED
    }

    /// Removes the bridge.
    pub fn remove(&self) {}
}
