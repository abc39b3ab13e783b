//! Replace backoff: an instance that keeps dying (found stopped,
//! terminated or gone without the operator asking) or keeps failing its
//! probe until `spec.recycle.unhealthyFor` replaces it is replaced at once
//! the first time, then after 30 s, 1 min, 2 min, … up to 30 minutes between
//! re-creates, instead of on every poll. The count and the time of the last
//! replacement live in the Proxy's status, so a restart keeps the backoff;
//! an instance that runs for [`REPLACE_RESET_AFTER`] starts it over.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};

use super::managed::{ReplaceCause, Step};
use super::status;
use crate::api::condition::{self, ConditionStatus};
use crate::api::proxy::conditions::{
    HEALTHY, PROVISIONED, REASON_INSTANCE_RUNNING, REASON_REPLACE_BACKOFF,
};
use crate::api::ProxyStatus;

/// The wait before the second re-create in a row; each later one doubles.
pub const REPLACE_BACKOFF_FIRST: Duration = Duration::from_secs(30);
/// The longest wait between re-creates.
pub const REPLACE_BACKOFF_MAX: Duration = Duration::from_secs(30 * 60);
/// An instance running this long ends the row of replacements.
pub const REPLACE_RESET_AFTER: Duration = Duration::from_secs(10 * 60);

/// The wait before re-creating after the `n`-th replacement in a row: none
/// for the first (a single death is replaced at once), then
/// [`REPLACE_BACKOFF_FIRST`] doubling, at most [`REPLACE_BACKOFF_MAX`].
pub fn replace_delay(n: u32) -> Duration {
    if n < 2 {
        return Duration::ZERO;
    }
    let doublings = (n - 2).min(16);
    REPLACE_BACKOFF_FIRST
        .saturating_mul(1u32 << doublings)
        .min(REPLACE_BACKOFF_MAX)
}

/// When the next re-create may go, by the status's count and the time of
/// the last replacement; `None` when nothing holds it.
pub fn backoff_until(status: &ProxyStatus) -> Option<DateTime<Utc>> {
    let n = u32::try_from(status.replacements?).ok()?;
    let delay = replace_delay(n);
    if delay.is_zero() {
        return None;
    }
    Some(status.last_replaced_at? + TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX))
}

/// Whether `step`, taken with `status` as it stands, replaces an instance
/// that died on its own: a stopped or terminated one the operator is about
/// to delete for the first time, or one gone although no delete was asked.
/// A spec change, or a delete the operator asked for, is not a death.
pub fn died(step: &Step, status: &ProxyStatus) -> bool {
    let asked = status.delete_requested_at.is_some();
    match step {
        Step::Delete {
            why: ReplaceCause::Stopped(_) | ReplaceCause::StartupTimedOut { .. },
        } => !asked,
        Step::ClearAndCreate => !asked,
        _ => false,
    }
}

/// Whether the probe calls the instance unhealthy (`Healthy=False`): its
/// recycle is one more replacement in a row, as a death is.
pub fn unhealthy(status: &ProxyStatus) -> bool {
    condition::find(&status.conditions, HEALTHY).is_some_and(|c| c.status == ConditionStatus::False)
}

/// Counts one replacement, noticed at `now`.
pub fn note(status: &mut ProxyStatus, now: DateTime<Utc>) {
    status.replacements = Some(status.replacements.unwrap_or(0).saturating_add(1).max(1));
    status.last_replaced_at = Some(now);
}

/// After a pass that found the instance running: once it has been
/// `Provisioned=True` for [`REPLACE_RESET_AFTER`] and the probe does not
/// call it unhealthy, the row of replacements is over (an instance that
/// never passes its probe is not a fresh start, however long it runs).
pub fn settle_running(status: &mut ProxyStatus, now: DateTime<Utc>) {
    if status.replacements.is_none() && status.last_replaced_at.is_none() {
        return;
    }
    if unhealthy(status) {
        return;
    }
    let running_for = condition::find(&status.conditions, PROVISIONED)
        .filter(|c| c.status == ConditionStatus::True && c.reason == REASON_INSTANCE_RUNNING)
        .and_then(|c| {
            now.signed_duration_since(c.last_transition_time)
                .to_std()
                .ok()
        });
    if running_for.is_some_and(|d| d >= REPLACE_RESET_AFTER) {
        status.replacements = None;
        status.last_replaced_at = None;
    }
}

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The re-create waits until `until`: `Provisioned=False/ReplaceBackoff`
/// saying how many replacements, the last one, and the next try.
pub fn mark_replace_backoff(
    status: &mut ProxyStatus,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    let n = status.replacements.unwrap_or(0);
    let last = status.last_replaced_at.map(at).unwrap_or_default();
    let message = format!(
        "the instance was replaced {n} times in a row, stopped, vanished or unhealthy (the last at {last}): the next create is at {} (replacements back off from 30s, doubling up to 30m)",
        at(until)
    );
    status::mark_held(status, REASON_REPLACE_BACKOFF, &message, now, generation);
}

#[cfg(test)]
#[path = "replace_tests.rs"]
mod tests;
