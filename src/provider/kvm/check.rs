//! The health check of one host (docs/kvm-provider.md "Health check"): a
//! probe over its own libvirt connection, and a pure mapping from what the
//! probe observed to the check's reason.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::classify::{code, state};
use super::conn::{HostLink, LinkError};
use super::protocol::{HostFacts, Request};
use super::ssh::Stage;
use crate::provider::TargetStatus;

/// What a host check observed, as far as its reason depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The check deadline passed.
    Deadline,
    /// The dial failed at this stage.
    Dial(Stage),
    /// A libvirt call failed with this error code and error domain.
    Libvirt { code: i64, domain: i64 },
    /// A libvirt call exceeded the call timeout.
    CallTimedOut,
    /// The blocking task died.
    Aborted,
    /// Every call answered; the pool is in this state.
    Pool(u32),
}

impl Observation {
    /// What a failed probe observed.
    pub fn of(e: &LinkError) -> Self {
        match e {
            LinkError::Dial { source, .. } => Observation::Dial(source.stage),
            LinkError::Libvirt { source, .. } => Observation::Libvirt {
                code: source.code,
                domain: source.domain,
            },
            LinkError::TimedOut(_) | LinkError::Busy { .. } => Observation::CallTimedOut,
            LinkError::Aborted(_) => Observation::Aborted,
        }
    }
}

/// The check reason for an observation.
pub fn reason(o: Observation) -> &'static str {
    match o {
        Observation::Deadline | Observation::CallTimedOut => "Timeout",
        Observation::Dial(Stage::Material) => "SSHMaterialUnavailable",
        Observation::Dial(Stage::Tcp) => "Unreachable",
        Observation::Dial(Stage::Handshake) => "SSHHandshakeFailed",
        Observation::Dial(Stage::LibvirtConnect) => "LibvirtConnectFailed",
        Observation::Libvirt { code, .. } if code == code::NO_STORAGE_POOL => "PoolNotFound",
        Observation::Libvirt { domain, .. } if domain == code::FROM_RPC => "Unreachable",
        Observation::Libvirt { .. } => "LibvirtError",
        Observation::Aborted => "Unreachable",
        Observation::Pool(state::POOL_RUNNING) => "Reachable",
        Observation::Pool(_) => "PoolNotActive",
    }
}

/// A pool state as a word.
pub fn pool_state_word(s: u32) -> String {
    match s {
        state::POOL_INACTIVE => "inactive".into(),
        state::POOL_BUILDING => "building".into(),
        state::POOL_RUNNING => "running".into(),
        state::POOL_DEGRADED => "degraded".into(),
        state::POOL_INACCESSIBLE => "inaccessible".into(),
        n => format!("state {n}"),
    }
}

/// Bytes in GiB, one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1}GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// libvirt's packed version number as `major.minor.micro`.
fn version_string(version: u64) -> String {
    format!(
        "{}.{}.{}",
        version / 1_000_000,
        version / 1000 % 1000,
        version % 1000
    )
}

/// Checks one host within `deadline`.
pub async fn check_host(link: Arc<HostLink>, deadline: Duration) -> TargetStatus {
    let started = Instant::now();
    let host = &link.host;
    let mut details = BTreeMap::new();
    details.insert("user".to_string(), host.user.clone());
    details.insert("pool".to_string(), host.pool.clone());
    let probe = async {
        let op = link.open().await?;
        let pool = host.pool.clone();
        op.call::<HostFacts>("checking host", Request::Check { pool })
            .await
    };
    let (observed, message) = match tokio::time::timeout(deadline, probe).await {
        Err(_) => (
            Observation::Deadline,
            format!("no answer within {deadline:?}"),
        ),
        Ok(Err(e)) => {
            let message = match &e {
                LinkError::Libvirt { source, .. } => source.message.clone(),
                other => other.to_string(),
            };
            (Observation::of(&e), message)
        }
        Ok(Ok(HostFacts {
            version,
            hostname,
            pool: info,
        })) => {
            details.insert("hostname".into(), hostname);
            details.insert("libvirtVersion".into(), version_string(version));
            details.insert("poolState".into(), pool_state_word(info.state));
            details.insert("poolCapacity".into(), gib(info.capacity));
            details.insert("poolAvailable".into(), gib(info.available));
            let message = if info.state == state::POOL_RUNNING {
                String::new()
            } else {
                format!(
                    "storage pool {:?} is {}",
                    host.pool,
                    pool_state_word(info.state)
                )
            };
            (Observation::Pool(info.state), message)
        }
    };
    let reason = reason(observed);
    TargetStatus {
        name: host.name.clone(),
        address: host.address.clone(),
        ready: reason == "Reachable",
        reason: reason.to_string(),
        message,
        latency: started.elapsed(),
        details,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_table() {
        struct Case {
            name: &'static str,
            observation: Observation,
            want: &'static str,
        }
        let lv = |code, domain| Observation::Libvirt { code, domain };
        let cases = [
            Case {
                name: "the check's deadline passed",
                observation: Observation::Deadline,
                want: "Timeout",
            },
            Case {
                name: "a libvirt call timed out",
                observation: Observation::CallTimedOut,
                want: "Timeout",
            },
            Case {
                name: "ssh key material unreadable",
                observation: Observation::Dial(Stage::Material),
                want: "SSHMaterialUnavailable",
            },
            Case {
                name: "tcp connect failed",
                observation: Observation::Dial(Stage::Tcp),
                want: "Unreachable",
            },
            Case {
                name: "ssh handshake failed",
                observation: Observation::Dial(Stage::Handshake),
                want: "SSHHandshakeFailed",
            },
            Case {
                name: "libvirt connect over ssh failed",
                observation: Observation::Dial(Stage::LibvirtConnect),
                want: "LibvirtConnectFailed",
            },
            Case {
                name: "no such pool",
                observation: lv(code::NO_STORAGE_POOL, 0),
                want: "PoolNotFound",
            },
            Case {
                name: "no such pool, reported over rpc",
                observation: lv(code::NO_STORAGE_POOL, code::FROM_RPC),
                want: "PoolNotFound",
            },
            Case {
                name: "rpc error",
                observation: lv(code::RPC, code::FROM_RPC),
                want: "Unreachable",
            },
            Case {
                name: "internal error from the rpc layer",
                observation: lv(code::INTERNAL_ERROR, code::FROM_RPC),
                want: "Unreachable",
            },
            Case {
                name: "local internal error",
                observation: lv(code::INTERNAL_ERROR, 0),
                want: "LibvirtError",
            },
            Case {
                name: "access denied",
                observation: lv(code::ACCESS_DENIED, 0),
                want: "LibvirtError",
            },
            Case {
                name: "the blocking task died",
                observation: Observation::Aborted,
                want: "Unreachable",
            },
            Case {
                name: "pool running",
                observation: Observation::Pool(state::POOL_RUNNING),
                want: "Reachable",
            },
            Case {
                name: "pool inactive",
                observation: Observation::Pool(state::POOL_INACTIVE),
                want: "PoolNotActive",
            },
            Case {
                name: "pool degraded",
                observation: Observation::Pool(state::POOL_DEGRADED),
                want: "PoolNotActive",
            },
            Case {
                name: "unknown pool state",
                observation: Observation::Pool(42),
                want: "PoolNotActive",
            },
        ];
        for c in cases {
            assert_eq!(reason(c.observation), c.want, "{}", c.name);
        }
    }

    #[test]
    fn words() {
        assert_eq!(pool_state_word(2), "running");
        assert_eq!(pool_state_word(7), "state 7");
        assert_eq!(gib(6 << 30), "6.0GiB");
        assert_eq!(version_string(9_000_000), "9.0.0");
        assert_eq!(version_string(10_010_003), "10.10.3");
    }
}
