//! The Pod network: one host-only Linux bridge per cluster, with no
//! uplink, and one address per Pod.
//!
//! The bridge gets `10.216.N.1/24`; Pods get `.2`..`.254` of the same /24,
//! handed out round-robin so a freed address is not reused at once. There is
//! no NAT and no forwarding: Pods reach each other over the bridge and the
//! host on the gateway address, nothing else.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context};

/// How many bridge names (`tcbr0`..) and /24s are tried.
const MAX_BRIDGES: u16 = 256;

/// The bridge and its address pool.
pub struct PodNetwork {
    bridge: String,
    index: u8,
    gateway: Ipv4Addr,
    pool: Mutex<Pool>,
}

/// Free addresses and where the round-robin stands.
#[derive(Debug, Default)]
struct Pool {
    used: BTreeSet<u8>,
    next: u8,
}

impl Pool {
    /// The next free host part in 2..=254 after the last one handed out.
    fn take(&mut self) -> Option<u8> {
        for step in 0..253u16 {
            let host = (u16::from(self.next.max(2)) - 2 + step) % 253 + 2;
            // host is in 2..=254, so it fits a u8.
            let host = host as u8;
            if self.used.insert(host) {
                self.next = if host == 254 { 2 } else { host + 1 };
                return Some(host);
            }
        }
        None
    }

    fn give_back(&mut self, host: u8) {
        self.used.remove(&host);
    }
}

/// Runs `ip` with `args`; its stderr becomes the error.
pub(crate) fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The /24 subnets (third octet of 10.216.x.0) already used by addresses on
/// this host, parsed from `ip -4 -o addr show` output.
fn used_subnets(ip_addr_output: &str) -> BTreeSet<u8> {
    let mut used = BTreeSet::new();
    for line in ip_addr_output.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == "inet" {
                if let Some(addr) = words.next() {
                    let addr = addr.split('/').next().unwrap_or_default();
                    if let Ok(a) = addr.parse::<Ipv4Addr>() {
                        let o = a.octets();
                        if o[0] == 10 && o[1] == 216 {
                            used.insert(o[2]);
                        }
                    }
                }
            }
        }
    }
    used
}

impl PodNetwork {
    /// Creates a bridge with an unused name and a /24 of 10.216.0.0/16 that
    /// no other interface on the host uses.
    pub fn create() -> anyhow::Result<PodNetwork> {
        let out = Command::new("ip")
            .args(["-4", "-o", "addr", "show"])
            .output()
            .context("running ip addr show")?;
        let used = used_subnets(&String::from_utf8_lossy(&out.stdout));
        for n in 0..MAX_BRIDGES {
            // n < 256.
            let index = n as u8;
            if used.contains(&index) {
                continue;
            }
            let bridge = format!("tcbr{n}");
            // `ip link add` fails when the name exists: the next one is tried.
            if ip(&["link", "add", &bridge, "type", "bridge"]).is_err() {
                continue;
            }
            let gateway = Ipv4Addr::new(10, 216, index, 1);
            let net = PodNetwork {
                bridge,
                index,
                gateway,
                pool: Mutex::new(Pool::default()),
            };
            let cidr = format!("{gateway}/24");
            let setup = ip(&["addr", "add", &cidr, "dev", &net.bridge])
                .and_then(|()| ip(&["link", "set", &net.bridge, "up"]));
            if let Err(e) = setup {
                net.remove();
                return Err(e);
            }
            tracing::info!(bridge = %net.bridge, %gateway, "pod network created");
            return Ok(net);
        }
        bail!("no free bridge name tcbr0..tcbr255 with an unused 10.216.N.0/24")
    }

    /// The bridge's own address: the Pods' default gateway, and where the
    /// host serves what Pods must reach (the API server's forwarder, test
    /// HTTP targets).
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The bridge's interface name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// Removes the bridge.
    pub fn remove(&self) {
        if let Err(e) = ip(&["link", "del", &self.bridge]) {
            tracing::warn!(bridge = %self.bridge, "removing the pod network: {e:#}");
        }
    }

    /// Hands out a Pod address.
    pub fn allocate(&self) -> anyhow::Result<Ipv4Addr> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        match pool.take() {
            Some(host) => Ok(Ipv4Addr::new(10, 216, self.index, host)),
            None => bail!("the pod network {} has no free address", self.bridge),
        }
    }

    /// Returns a Pod address to the pool.
    pub fn release(&self, addr: Ipv4Addr) {
        let o = addr.octets();
        if o[2] == self.index {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.give_back(o[3]);
        }
        // The host's neighbour entry for the address outlives the Pod (the
        // kernel collects none while the table holds under 128). libvirt 9.0
        // reads one netlink batch of the host's whole table, about 45 IPv4
        // entries, for a domain's ARP addresses: entries of Pods long gone
        // would hide the kvm tests' guests (tests/kvm/e2e_samples_kvm.rs).
        let to = addr.to_string();
        if let Err(e) = ip(&["neigh", "flush", "to", &to, "dev", &self.bridge]) {
            tracing::debug!(addr = %to, "flushing the Pod's neighbour entry: {e:#}");
        }
    }

    /// The host end's name of the veth for a Pod address (≤ 15 chars).
    pub fn veth_name(&self, addr: Ipv4Addr) -> String {
        format!("tcv{}p{}", self.index, addr.octets()[3])
    }

    /// Creates the veth pair for the network namespace of process `pid`:
    /// the host end on the bridge, the other end moved into the namespace
    /// as `eth0`. The namespace side is configured by the pause helper.
    pub fn attach(&self, pid: i32, addr: Ipv4Addr) -> anyhow::Result<String> {
        let veth = self.veth_name(addr);
        // A leftover of a Pod whose pause process died without cleanup.
        let _ = ip(&["link", "del", &veth]);
        let pid = pid.to_string();
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &pid,
        ])?;
        let up = ip(&["link", "set", &veth, "master", &self.bridge])
            .and_then(|()| ip(&["link", "set", &veth, "up"]));
        if let Err(e) = up {
            let _ = ip(&["link", "del", &veth]);
            return Err(e);
        }
        Ok(veth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_round_robin_and_reuse() {
        let mut p = Pool::default();
        assert_eq!(p.take(), Some(2));
        assert_eq!(p.take(), Some(3));
        p.give_back(2);
        assert_eq!(p.take(), Some(4));
        let mut n = 3;
        while p.take().is_some() {
            n += 1;
        }
        // 2..=254 is 253 addresses, and 2 was handed out twice.
        assert_eq!(n, 254);
        p.give_back(100);
        assert_eq!(p.take(), Some(100));
        assert_eq!(p.take(), None);
    }

    #[test]
    fn used_subnets_parses_ip_output() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   5: tcbr0    inet 10.216.0.1/24 scope global tcbr0\n\
                   6: x    inet 10.216.7.9/16 scope global x\n\
                   7: y    inet 10.1.2.3/24 scope global y\n";
        let used = used_subnets(out);
        assert_eq!(used.into_iter().collect::<Vec<_>>(), vec![0, 7]);
    }
}
