//! The status a running Proxy's recycle writes, and how its pass ends:
//! the drain mark, the `UpToDate` mark of an outdated instance, the
//! circuit breaker's hold, and a replace asked for by annotation. The
//! fleet's decisions themselves are [`crate::fleet`]'s; the shell asks
//! them (`fleet::shared`) and hands the answers in.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::end::{End, RUNNING_RESYNC};
use crate::api::condition::{self, Condition};
use crate::api::proxy::conditions::{
    PROVISIONED, REASON_CIRCUIT_OPEN, REASON_DRAINING, REASON_SPEC_CHANGED, RECYCLING, UP_TO_DATE,
};
use crate::api::{ConditionStatus, ProxyPhase, ProxyStatus};
use crate::fleet::RecycleStep;

/// When a Proxy held by the open breaker looks again.
pub const CIRCUIT_RETRY: Duration = Duration::from_secs(30);
/// When a Proxy whose spec changed, or that was asked to be replaced,
/// asks the budget again.
const OUTDATED_RETRY: Duration = Duration::from_secs(3);

/// Records that the drain began at `now`: no new leases from here on.
pub fn mark_draining(status: &mut ProxyStatus, now: DateTime<Utc>) {
    status.draining_since.get_or_insert(now);
    condition::set(
        &mut status.conditions,
        Condition::new(
            RECYCLING,
            ConditionStatus::True,
            REASON_DRAINING,
            "recycling: draining, no new leases; held leases run to their expiry or the drain timeout, then the instance is replaced",
            now,
        ),
    );
}

/// Records that the replace asked for with `asked` (the value of
/// `crawl.example.com/replace` not acted on yet) is being acted on: its
/// drain started, or its instance goes anyway.
pub fn handle_replace(asked: Option<&str>, status: &mut ProxyStatus) {
    if let Some(v) = asked {
        status.replace_handled = Some(v.to_string());
    }
}

/// The instance is gone or stopped but the provider's breaker is open:
/// it is not replaced until the breaker closes.
pub fn mark_circuit_open(status: &mut ProxyStatus, now: DateTime<Utc>, generation: Option<i64>) {
    status.phase = Some(ProxyPhase::Provisioning);
    condition::set(
        &mut status.conditions,
        Condition::new(
            PROVISIONED,
            ConditionStatus::False,
            REASON_CIRCUIT_OPEN,
            "the provider's circuit breaker is open (too many of its proxies failed at once): not replacing the instance until it closes",
            now,
        )
        .at_generation(generation),
    );
}

/// The recycle is over (the old instance is gone): forget the drain, and
/// that the instance was older than the spec.
pub fn clear_drain(status: &mut ProxyStatus) {
    status.draining_since = None;
    condition::remove(&mut status.conditions, RECYCLING);
    condition::remove(&mut status.conditions, UP_TO_DATE);
}

/// Records whether the running instance is older than the spec (whose
/// port is `spec_port`): the fleet view reads it (`fleet::summarize`) to
/// roll the change through the provider's budget. An up-to-date instance
/// of an older version, which did not record its port, serves on the
/// spec's.
pub fn mark_outdated(
    status: &mut ProxyStatus,
    (outdated, spec_port): (bool, Option<i32>),
    now: DateTime<Utc>,
) {
    if !outdated {
        condition::remove(&mut status.conditions, UP_TO_DATE);
        if status.port.is_none() {
            status.port = spec_port;
        }
        return;
    }
    condition::set(
        &mut status.conditions,
        Condition::new(
            UP_TO_DATE,
            ConditionStatus::False,
            REASON_SPEC_CHANGED,
            "the spec or cloud-init changed: the instance keeps serving until the provider's budget (maxUnavailable, or maxSurge) lets it be replaced",
            now,
        ),
    );
}

/// What a running pass learned of its recycle, for the ending to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recycle {
    /// The fleet's step for the instance.
    pub step: RecycleStep,
    /// The instance is older than the spec.
    pub outdated: bool,
    /// `spec.port`.
    pub spec_port: Option<i32>,
    /// The `crawl.example.com/replace` value not acted on yet, if any.
    pub asked: Option<String>,
}

/// How a running pass ends once its recycle is known: a drain that starts
/// is recorded (with the replace it answers, if one was asked) and looked
/// at again soon; a drain in progress comes back when it can end; a Proxy
/// that waits for the budget (outdated, or a replace asked) asks again
/// soon.
pub fn after_running(r: Recycle, status: &mut ProxyStatus, end: End, now: DateTime<Utc>) -> End {
    let soon = |d: Duration| match end {
        End::RequeueAfter(e) | End::NotBefore(e) => End::RequeueAfter(e.min(d)),
        End::AwaitChange => End::RequeueAfter(d),
    };
    mark_outdated(status, (r.outdated, r.spec_port), now);
    match r.step {
        // Waiting for the budget: ask it again soon.
        RecycleStep::Serve if r.outdated || r.asked.is_some() => soon(OUTDATED_RETRY),
        RecycleStep::Serve | RecycleStep::Replace(_) => end,
        RecycleStep::StartDrain => {
            handle_replace(r.asked.as_deref(), status);
            mark_draining(status, now);
            soon(Duration::from_secs(5))
        }
        RecycleStep::Drain { until } => {
            let d = until
                .signed_duration_since(now)
                .to_std()
                .unwrap_or_default();
            soon(d.clamp(Duration::from_secs(1), RUNNING_RESYNC))
        }
        RecycleStep::StartSurge => {
            super::surge::start(status, now);
            soon(Duration::from_secs(1))
        }
        RecycleStep::HoldCircuitOpen => soon(CIRCUIT_RETRY),
    }
}

#[cfg(test)]
#[path = "recycle_tests.rs"]
mod tests;
