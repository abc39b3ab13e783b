//! A Proxy's phase, derived in one place from where the pass left it, and
//! the Ready decision.

use super::status::Health;
use crate::api::condition::ConditionStatus;
use crate::api::proxy::conditions::HEALTHY;
use crate::api::{ProxyPhase, ProxyStatus};

/// Where a pass left a Proxy, as far as its phase goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// An instance is being created, is booting, or is being replaced.
    Provisioning,
    /// An instance runs, or an External endpoint is set.
    Serving {
        /// The Ready decision ([`ready`]).
        ready: bool,
    },
    /// A permanent error, or a spec that cannot be acted on: it waits for
    /// an edit.
    Failed,
    /// Cloud-init cannot be read yet: the phase stays, and a Proxy that had
    /// none is Provisioning.
    AwaitingCloudInit,
    /// Retried later (a quota or rate limit): the phase stays as it was.
    Retrying,
}

/// The phase of a Proxy at `stage`, given the phase it had.
pub fn phase(stage: Stage, previous: Option<ProxyPhase>) -> Option<ProxyPhase> {
    match stage {
        Stage::Provisioning => Some(ProxyPhase::Provisioning),
        Stage::Serving { ready: true } => Some(ProxyPhase::Ready),
        Stage::Serving { ready: false } => Some(ProxyPhase::Running),
        Stage::Failed => Some(ProxyPhase::Failed),
        Stage::AwaitingCloudInit => previous.or(Some(ProxyPhase::Provisioning)),
        Stage::Retrying => previous,
    }
}

/// Whether a serving Proxy is Ready, given what the health engine says and
/// the status it had. A report decides; without one (no verdict yet, or
/// another replica probes) a Healthy=True condition already in the status
/// is kept, so a restart does not flap every Proxy out of the API; a
/// source that only gives verdicts can make it Ready too.
pub fn ready(health: &Health, status: &ProxyStatus) -> bool {
    let healthy_before = status
        .conditions
        .iter()
        .any(|c| c.type_ == HEALTHY && c.status == ConditionStatus::True);
    match health {
        Health::Report(r) => r.healthy,
        Health::Verdict(v) => *v || healthy_before,
        Health::Unknown => healthy_before,
    }
}

#[cfg(test)]
#[path = "phase_tests.rs"]
mod tests;
