//! Surge replacements (the provider's `maxSurge`): the replacement of a
//! serving instance is created, and passes a probe, before the old one
//! stops taking leases; the old one then retires (serves the leases it
//! had until they end or the drain timeout) and is deleted. So a roll
//! never lowers the Ready count.
//!
//! The surge is recorded in `status.surge` with the serial of its name
//! before it is created (a restart re-creates the same name, which the
//! provider adopts), and the serial becomes the Proxy's only when the
//! replacement takes over. These are side steps of a managed pass: the
//! plan asks for them before the current instance's own steps.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::{delete_pending, GetOutcome};
use crate::api::condition::{self, Condition};
use crate::api::proxy::conditions::{REASON_RETIRING, REASON_SURGING, RECYCLING};
use crate::api::{ConditionStatus, ProxyStatus, RetiringStatus, SurgeStatus};
use crate::controller::throttle::limiter::CreateGate;
use crate::fleet::DrainStep;
use crate::provider::InstanceState;

/// How often a Proxy with a surge or a retiring instance looks again.
pub const SIDE_POLL: Duration = Duration::from_secs(5);

/// What the shell observed of the side instances this pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SideObs {
    /// The create gate's answer for the surge's create.
    pub create: Option<CreateGate>,
    /// `get` of the surge instance.
    pub surge: Option<GetOutcome>,
    /// Whether a probe through the surge instance passed.
    pub probe: Option<bool>,
    /// The drain of the retiring instance.
    pub drain: Option<DrainStep>,
    /// `get` of the retiring instance.
    pub retiring: Option<GetOutcome>,
    /// A side call failed: nothing more on the side this pass.
    pub failed: bool,
}

/// Why a surge instance is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// Not running with an address, or not passing its probe, by the
    /// startup timeout.
    StartupTimedOut,
    /// Stopped, terminated, or its create failed.
    Failed,
    /// The spec changed again while it was being created.
    Outdated,
    /// Its delete was asked for and is still to be seen through.
    Deleting,
}

/// The next side step of a managed pass.
#[derive(Clone, Debug, PartialEq)]
pub enum SideStep {
    /// Ask the create gate (the surge counts the current instance too).
    AskCreate,
    /// Create the surge instance of `serial` on `port`.
    Create {
        /// Its serial (its name's suffix).
        serial: u32,
        /// Its port.
        port: u16,
    },
    /// Ask the provider for the surge instance.
    Get,
    /// Probe through the surge instance at `ip`.
    Probe {
        /// Its address.
        ip: String,
    },
    /// The surge instance passed: it takes over.
    TakeOver {
        /// Its address.
        ip: String,
    },
    /// Delete the surge instance.
    GiveUp {
        /// Why.
        why: GiveUp,
    },
    /// The surge instance is gone: forget it.
    Forget,
    /// Ask how the retiring instance's drain stands.
    AskDrain,
    /// Ask the provider for the retiring instance.
    GetRetiring,
    /// Delete the retiring instance.
    DeleteRetiring,
    /// The retiring instance is gone: forget it.
    Retired,
}

/// What the side steps decide with.
#[derive(Clone, Copy, Debug)]
pub struct SideInput<'a> {
    /// The status so far.
    pub status: &'a ProxyStatus,
    /// The current spec hash.
    pub spec_hash: &'a str,
    /// `spec.port`, if usable.
    pub port: Option<u16>,
    /// The startup timeout.
    pub startup_timeout: Duration,
    /// What was observed.
    pub obs: &'a SideObs,
    /// The clock.
    pub now: DateTime<Utc>,
}

/// The next side step, or `None` when nothing is to be done this pass
/// (nothing in progress, or waiting).
pub fn next_side_step(input: &SideInput<'_>) -> Option<SideStep> {
    if input.obs.failed {
        return None;
    }
    retiring_step(input).or_else(|| surge_step(input))
}

fn retiring_step(input: &SideInput<'_>) -> Option<SideStep> {
    let r = input.status.retiring.as_ref()?;
    if r.delete_requested_at.is_none() {
        return match input.obs.drain {
            None => Some(SideStep::AskDrain),
            Some(DrainStep::Wait { .. }) => None,
            Some(DrainStep::Start | DrainStep::Replace(_)) => Some(SideStep::DeleteRetiring),
        };
    }
    match &input.obs.retiring {
        None => Some(SideStep::GetRetiring),
        Some(GetOutcome::NotFound) => Some(SideStep::Retired),
        Some(GetOutcome::Found(i))
            if !delete_pending(r.delete_requested_at, i.state, input.now) =>
        {
            Some(SideStep::DeleteRetiring)
        }
        Some(_) => None,
    }
}

fn surge_step(input: &SideInput<'_>) -> Option<SideStep> {
    let s = input.status.surge.as_ref()?;
    let Some(_) = s.provider_id.as_deref().filter(|id| !id.is_empty()) else {
        let port = input.port?;
        return match input.obs.create {
            None => Some(SideStep::AskCreate),
            Some(CreateGate::Go) => Some(SideStep::Create {
                serial: u32::try_from(s.serial).unwrap_or(1),
                port,
            }),
            Some(CreateGate::Held(_)) => None,
        };
    };
    let Some(get) = &input.obs.surge else {
        return Some(SideStep::Get);
    };
    let give_up = |why| Some(SideStep::GiveUp { why });
    if s.delete_requested_at.is_some() {
        return match get {
            GetOutcome::NotFound => Some(SideStep::Forget),
            GetOutcome::Found(i) if !delete_pending(s.delete_requested_at, i.state, input.now) => {
                give_up(GiveUp::Deleting)
            }
            _ => None,
        };
    }
    let inst = match get {
        GetOutcome::NotFound => return Some(SideStep::Forget),
        GetOutcome::Failed(..) => return None,
        GetOutcome::CreateFailed(..) => return give_up(GiveUp::Failed),
        GetOutcome::Found(i) => i,
    };
    if s.spec_hash.as_deref() != Some(input.spec_hash) {
        return give_up(GiveUp::Outdated);
    }
    let timed_out = s.created_at.is_some_and(|c| {
        let timeout = TimeDelta::from_std(input.startup_timeout).unwrap_or(TimeDelta::MAX);
        input.now.signed_duration_since(c) >= timeout
    });
    match inst.state {
        InstanceState::Stopped | InstanceState::Terminated => give_up(GiveUp::Failed),
        InstanceState::Running if !inst.ip.is_empty() => match input.obs.probe {
            None => Some(SideStep::Probe {
                ip: inst.ip.clone(),
            }),
            // The old instance's last drain must end first: one retiring
            // instance is recorded at a time.
            Some(true) if input.status.retiring.is_some() => None,
            Some(true) => Some(SideStep::TakeOver {
                ip: inst.ip.clone(),
            }),
            Some(false) if timed_out => give_up(GiveUp::StartupTimedOut),
            Some(false) => None,
        },
        _ if timed_out => give_up(GiveUp::StartupTimedOut),
        _ => None,
    }
}

/// The serial a surge of `status` takes: one past the current instance's.
pub fn next_serial(status: &ProxyStatus) -> i32 {
    status.instance_serial.unwrap_or(0).saturating_add(1)
}

/// Records that a surge replacement starts at `now`: its serial, and the
/// `Recycling=True/Surging` condition. It is created on the next pass.
pub fn start(status: &mut ProxyStatus, now: DateTime<Utc>) {
    if status.surge.is_some() {
        return;
    }
    status.surge = Some(SurgeStatus {
        serial: next_serial(status),
        started_at: now,
        ..SurgeStatus::default()
    });
    recycling(
        status,
        REASON_SURGING,
        "creating the replacement instance first: this one serves until the replacement passes its probe",
        now,
    );
}

/// Records the surge instance created as `id` (its credentials in the
/// Secret named, if any) from `spec_hash` on `port`.
pub fn created(
    status: &mut ProxyStatus,
    (id, credentials_secret): (String, Option<String>),
    spec_hash: &str,
    port: u16,
    now: DateTime<Utc>,
) {
    if let Some(s) = status.surge.as_mut() {
        s.provider_id = Some(id);
        s.credentials_secret = credentials_secret;
        s.created_at = Some(now);
        s.spec_hash = Some(spec_hash.to_string());
        s.port = Some(i32::from(port));
    }
}

/// The surge instance at `ip` takes over: it becomes the current one, and
/// the current one (if any) retires from `now`. The Proxy keeps its
/// Healthy condition: the surge instance has just passed its probe.
pub fn take_over(status: &mut ProxyStatus, ip: &str, now: DateTime<Utc>) {
    let Some(s) = status.surge.take() else {
        return;
    };
    let old = status.provider_id.take().filter(|id| !id.is_empty());
    status.retiring = old.map(|provider_id| RetiringStatus {
        provider_id,
        ip: status.ip.clone(),
        since: now,
        delete_requested_at: None,
        credentials_secret: status.credentials_secret.clone(),
    });
    status.provider_id = s.provider_id;
    status.ip = Some(ip.to_string());
    status.port = s.port.or(status.port);
    status.created_at = s.created_at;
    status.instance_serial = Some(s.serial);
    status.credentials_secret = s.credentials_secret;
    status.delete_requested_at = None;
    super::recycle::clear_drain(status);
    if status.retiring.is_some() {
        recycling(
            status,
            REASON_RETIRING,
            "the replacement took over: the replaced instance serves the leases it had until they end or the drain timeout, then it is deleted",
            now,
        );
    }
}

/// A step of the surge (`what`: "creating", "probing it at …") failed
/// with `why`: the Recycling condition says so; it is retried.
pub fn failed(status: &mut ProxyStatus, what: &str, why: &str, now: DateTime<Utc>) {
    if status.surge.is_none() {
        return;
    }
    let message = format!(
        "creating the replacement instance first (this one serves meanwhile): {what} failed, retrying: {why}"
    );
    recycling(
        status,
        REASON_SURGING,
        &super::status::truncate_message(&message),
        now,
    );
}

/// A delete of the surge instance was asked for at `now`.
pub fn giving_up(status: &mut ProxyStatus, now: DateTime<Utc>) {
    if let Some(s) = status.surge.as_mut() {
        s.delete_requested_at = Some(now);
    }
}

/// The surge instance is gone: forget it (the fleet admits a new one
/// when the Proxy still needs replacing).
pub fn forget(status: &mut ProxyStatus) {
    status.surge = None;
    if status.retiring.is_none() {
        condition::remove(&mut status.conditions, RECYCLING);
    }
}

/// A delete of the retiring instance was asked for at `now`.
pub fn retire_requested(status: &mut ProxyStatus, now: DateTime<Utc>) {
    if let Some(r) = status.retiring.as_mut() {
        r.delete_requested_at = Some(now);
    }
}

/// The retiring instance is gone.
pub fn retired(status: &mut ProxyStatus) {
    status.retiring = None;
    if status.surge.is_none() {
        condition::remove(&mut status.conditions, RECYCLING);
    }
}

/// `end`'s delay, shortened to [`SIDE_POLL`] while a side instance is in
/// progress (a `NotBefore` hold is kept as it is).
pub fn poll(status: &ProxyStatus, end: super::End) -> super::End {
    use super::End;
    if status.surge.is_none() && status.retiring.is_none() {
        return end;
    }
    match end {
        End::RequeueAfter(d) => End::RequeueAfter(d.min(SIDE_POLL)),
        // A spread hold means "never before": the side steps wait for it.
        End::NotBefore(d) => End::NotBefore(d),
        End::AwaitChange => End::RequeueAfter(SIDE_POLL),
    }
}

fn recycling(status: &mut ProxyStatus, reason: &str, message: &str, now: DateTime<Utc>) {
    condition::set(
        &mut status.conditions,
        Condition::new(RECYCLING, ConditionStatus::True, reason, message, now),
    );
}

#[cfg(test)]
#[path = "surge_tests.rs"]
mod tests;
