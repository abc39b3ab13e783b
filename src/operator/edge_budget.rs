//! The worst case of memory the operator's servers may hold for their
//! connections: every connection open at its cap, each at its costliest
//! moment. It must fit in [`CONNECTIONS_SHARE`] of the Pod's memory limit,
//! checked against the shipped manifests by a table test and against the
//! cgroup's limit at startup.

use crate::server::{read_buffer_bound, MAX_HEAD, PROBE_LIMITS};

/// Bytes in a KiB, a MiB.
const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The share of the Pod's memory limit its connections may take at
/// worst: half. The other half is the process's own: the manager idles at
/// about 20 MiB and holds about 80 MiB for a 10,000-Proxy fleet
/// (docs/performance.md); the gateway's copy of the fleet is 80-95 MiB at
/// 10,000 Proxies.
pub const CONNECTIONS_SHARE: (u64, u64) = (1, 2);

/// What one connection costs besides hyper's buffers: its tokio task,
/// hyper's connection state, the socket's registration and the service's
/// clones. Measured, not derived: 4,096 idle connections grew the
/// discovery API's RSS by 44,264 KiB in `tests/discovery_abuse.rs`
/// (10.8 KiB each, hyper's first 8 KiB write buffer counted in, though
/// mostly untouched), and an idle gateway tunnel (two sockets, two tasks)
/// costs about 5 KiB (docs/performance.md#gateway). Rounded up. Kernel
/// socket buffers are not counted: a refused head's connection is closed
/// at once, and a cgroup v1 memory limit does not charge them.
pub const CONNECTION_STATE: u64 = 12 * KIB;

/// One HTTP/1 connection of the operator's servers at worst, in bytes:
/// hyper's read buffer full of an unfinished head, its write buffer at
/// the size past which hyper stops buffering and flushes (`max_buf_size`
/// bounds both), and [`CONNECTION_STATE`].
pub const fn http_connection() -> u64 {
    read_buffer_bound(MAX_HEAD) as u64 + MAX_HEAD as u64 + CONNECTION_STATE
}

/// One gateway connection at worst: either its head (as any HTTP
/// connection) or, once it tunnels, a buffer each way while bytes move
/// (hyper's buffers are gone with the upgrade; the bytes read ahead are
/// dropped once relayed).
pub fn gateway_connection() -> u64 {
    let head = http_connection();
    let tunnel = 2 * crate::gateway::tunnel::BUF as u64 + CONNECTION_STATE;
    head.max(tunnel)
}

/// The servers one process runs, by their connection caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// The discovery API's cap (`--discovery-max-connections`), when on.
    pub discovery: Option<usize>,
    /// The probe server and the metrics server, when on (each
    /// [`PROBE_LIMITS`]).
    pub probes: bool,
    pub metrics: bool,
    /// The gateway's cap (`--gateway-max-connections`), when on.
    pub gateway: Option<usize>,
}

impl Edge {
    /// Bytes all the connections may hold at worst.
    pub fn worst_case(&self) -> u64 {
        let probe_servers = u64::from(self.probes) + u64::from(self.metrics);
        let http = self.discovery.unwrap_or(0) as u64
            + probe_servers * PROBE_LIMITS.max_connections as u64;
        http * http_connection() + self.gateway.unwrap_or(0) as u64 * gateway_connection()
    }

    /// Whether the worst case fits a memory limit of `limit` bytes.
    pub fn fits(&self, limit: u64) -> bool {
        self.worst_case() <= room(limit)
    }
}

/// What connections may take of a memory limit of `limit` bytes.
pub fn room(limit: u64) -> u64 {
    limit / CONNECTIONS_SHARE.1 * CONNECTIONS_SHARE.0
}

/// The edge of a process started with `settings`.
pub fn edge_of(settings: &crate::operator::Settings) -> Edge {
    Edge {
        discovery: settings
            .discovery_bind
            .map(|_| settings.discovery_limits.max_connections),
        probes: settings.probe_bind.is_some(),
        metrics: settings.metrics_bind.is_some(),
        gateway: settings
            .gateway_bind
            .map(|_| settings.gateway.max_connections),
    }
}

/// The memory limit of this process's cgroup, in bytes: cgroup v2's
/// `memory.max`, else v1's `memory.limit_in_bytes`; `None` when neither
/// is readable or none is set.
pub fn cgroup_memory_limit() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| parse_limit(&std::fs::read_to_string(p).ok()?))
}

/// A limit file's value: "max" (v2) or a figure near `i64::MAX` (v1's
/// "no limit", rounded down to a page) is none.
pub fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// At startup: says, naming the flags, when the connection caps could
/// take more than their share of the memory limit the process runs under.
pub fn warn_if_over(settings: &crate::operator::Settings) {
    let Some(limit) = cgroup_memory_limit() else {
        return;
    };
    let edge = edge_of(settings);
    if !edge.fits(limit) {
        tracing::warn!(
            worst_case_mib = edge.worst_case() / MIB,
            limit_mib = limit / MIB,
            room_mib = room(limit) / MIB,
            per_connection_kib = http_connection() / KIB,
            per_gateway_connection_kib = gateway_connection() / KIB,
            "The connection caps (--discovery-max-connections, --gateway-max-connections) \
             let connections hold more than half the memory limit at worst: lower them or \
             raise the limit"
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a panic is its failure report
    use super::*;
    use crate::server::DISCOVERY_LIMITS;

    /// `resources.limits.memory` of the container named `container` in a
    /// manifest of the repository, in bytes (`Mi` or `Gi`).
    fn shipped_limit(path: &str, needle: &str) -> u64 {
        let text =
            std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let after = &text[text
            .find(needle)
            .unwrap_or_else(|| panic!("{needle} in {path}"))..];
        let limits = &after[after.find("limits:").unwrap()..];
        let value = limits
            .lines()
            .find_map(|l| l.trim().strip_prefix("memory:"))
            .unwrap()
            .trim();
        if let Some(mi) = value.strip_suffix("Mi") {
            mi.parse::<u64>().unwrap() * MIB
        } else {
            value.strip_suffix("Gi").unwrap().parse::<u64>().unwrap() * 1024 * MIB
        }
    }

    #[test]
    fn the_shipped_caps_fit_the_shipped_memory_limits() {
        let gateway_default = crate::gateway::Settings::default().max_connections;
        let manager = Edge {
            discovery: Some(DISCOVERY_LIMITS.max_connections),
            probes: true,
            metrics: true,
            gateway: None,
        };
        // The gateway Deployment runs a discovery API (for its followers'
        // reads) next to the gateway.
        let gateway = Edge {
            gateway: Some(gateway_default),
            ..manager
        };
        let cases = [
            ("config/manager/manager.yaml", "resources:", manager),
            (
                "config/helm/egress-proxies-operator/values.yaml",
                "resources:",
                manager,
            ),
            (
                "config/components/gateway/deployment.yaml",
                "resources:",
                gateway,
            ),
            (
                "config/helm/egress-proxies-operator/values.yaml",
                "gateway:\n  enabled",
                gateway,
            ),
        ];
        for (path, needle, edge) in cases {
            let limit = shipped_limit(path, needle);
            println!(
                "{path}: limit {} MiB, connections at worst {} MiB of {} MiB",
                limit / MIB,
                edge.worst_case() / MIB,
                room(limit) / MIB
            );
            assert!(
                edge.fits(limit),
                "{path}: {edge:?} at worst {} MiB, room {} MiB",
                edge.worst_case() / MIB,
                room(limit) / MIB
            );
        }
    }

    #[test]
    fn the_check_refuses_what_does_not_fit() {
        let mib128 = 128 * MIB;
        let cases = [
            (Some(1024), true, None, mib128, true),
            // The caps before heads were bounded: 4,096 and 256 a server.
            (Some(4096), true, None, mib128, false),
            (None, false, Some(512), 256 * MIB, true),
            (None, false, Some(10_000), 256 * MIB, false),
            (Some(1), false, None, 1, false),
        ];
        for (discovery, probes, gateway, limit, fits) in cases {
            let edge = Edge {
                discovery,
                probes,
                metrics: probes,
                gateway,
            };
            assert_eq!(edge.fits(limit), fits, "{edge:?} in {limit}");
        }
    }

    #[test]
    fn limit_files_read_as_a_limit_or_none() {
        for (text, want) in [
            ("134217728\n", Some(134_217_728)),
            ("max\n", None),
            ("9223372036854771712\n", None),
            ("", None),
        ] {
            assert_eq!(parse_limit(text), want, "{text:?}");
        }
    }
}
