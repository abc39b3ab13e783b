//! Which Kubernetes Events a pass records on its Proxy: one per transition
//! a user cares about, found by comparing the status the pass started from
//! with the one it wrote, so a pass that changes nothing records nothing.
//! Notes carry names, the instance's address and the condition messages
//! (plain upstream words); never cloud-init, whose errors name only the
//! Secret and key.

use super::delete::ReleaseReason;
use super::status::CREATING_MESSAGE;
use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::constants::REPLACE_ANNOTATION;
use crate::api::proxy::conditions::*;
use crate::api::{ProxyPhase, ProxyStatus};
use crate::events::{Note, Severity};

/// A create was issued; the instance is booting.
pub const CREATING: &str = "Creating";
/// The instance runs (the first one, or a replacement).
pub const RUNNING: &str = "Running";
/// The Ready decision turned true.
pub const READY: &str = "Ready";
/// Probes through the proxy started failing.
pub const UNHEALTHY: &str = "Unhealthy";
/// The instance is being replaced; the note says why.
pub const REPLACING: &str = "Replacing";
/// The provider refused a create for quota or a rate limit.
pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
/// The cloud-init Secret or key cannot be read.
pub const CLOUD_INIT_ERROR: &str = "CloudInitError";
/// A permanent error or a spec that cannot be acted on: waits for an edit.
pub const FAILED: &str = "Failed";
/// The provider does not answer, or refuses the operator's credentials.
pub const PROVIDER_UNAVAILABLE: &str = "ProviderUnavailable";
/// The Proxy was deleted and its instance with it.
pub const DELETED: &str = "Deleted";
/// The Proxy was deleted with skip-cleanup: its instance was left.
pub const CLEANUP_SKIPPED: &str = "CleanupSkipped";
/// The instance was not running by its startup timeout: replaced.
pub const STARTUP_TIMED_OUT: &str = "StartupTimedOut";
/// A new instance was asked for (`crawl.example.com/replace`, or a
/// crawler through the lease API): the note names the request.
pub const REPLACE_REQUESTED: &str = "ReplaceRequested";
/// A deleted Proxy's instance cannot be deleted: the note says why.
pub const CLEANUP_FAILED: &str = "CleanupFailed";
/// A replacement is being created while the instance serves (`maxSurge`).
pub const SURGING: &str = "Surging";
/// The surge replacement took over; the old instance retires.
pub const REPLACED: &str = "Replaced";

fn note(severity: Severity, reason: &'static str, action: &'static str, text: String) -> Note {
    Note {
        severity,
        reason,
        action,
        text,
    }
}

fn same(a: Option<&Condition>, b: Option<&Condition>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            (a.status, &a.reason, &a.message) == (b.status, &b.reason, &b.message)
        }
        (None, None) => true,
        _ => false,
    }
}

/// The Events of a pass that turned `before` into `after`, in the order
/// they happened: the instance's transition first, then its health.
pub fn pass_notes(before: &ProxyStatus, after: &ProxyStatus) -> Vec<Note> {
    let mut notes = Vec::new();
    let was = condition::find(&before.conditions, PROVISIONED);
    let now = condition::find(&after.conditions, PROVISIONED);
    notes.extend(vanished_note(was, before, after));
    if let Some(c) = now.filter(|_| !same(was, now)) {
        notes.extend(provisioned_note(c, after));
    }
    if let Some(v) = after
        .replace_handled
        .as_deref()
        .filter(|v| before.replace_handled.as_deref() != Some(*v))
    {
        notes.push(note(
            Severity::Normal,
            REPLACE_REQUESTED,
            "Replace",
            format!("a new instance was asked for ({REPLACE_ANNOTATION}={v}): the proxy takes no new leases until it has one"),
        ));
    }
    notes.extend(surge_notes(before, after));
    let deleting = condition::find(&after.conditions, DELETING);
    if let Some(c) =
        deleting.filter(|c| !same(condition::find(&before.conditions, DELETING), Some(c)))
    {
        notes.push(note(
            Severity::Warning,
            CLEANUP_FAILED,
            "Delete",
            c.message.clone(),
        ));
    }
    let healthy = |s: &ProxyStatus| condition::find(&s.conditions, HEALTHY).map(|c| c.status);
    if after.phase == Some(ProxyPhase::Ready) && before.phase != Some(ProxyPhase::Ready) {
        let at = after.ip.as_deref().unwrap_or("its endpoint");
        notes.push(note(
            Severity::Normal,
            READY,
            "Probe",
            format!("probes through the proxy at {at} succeed: Ready"),
        ));
    }
    if healthy(after) == Some(ConditionStatus::False)
        && healthy(before) != Some(ConditionStatus::False)
    {
        let why = condition::find(&after.conditions, HEALTHY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        notes.push(note(
            Severity::Warning,
            UNHEALTHY,
            "Probe",
            format!("probes through the proxy fail: {why}"),
        ));
    }
    notes
}

/// The Events of a surge replacement: decided, and taking over.
fn surge_notes(before: &ProxyStatus, after: &ProxyStatus) -> Vec<Note> {
    let mut notes = Vec::new();
    if before.surge.is_none() && after.surge.is_some() {
        let serving = before.provider_id.as_deref().unwrap_or("");
        notes.push(note(
            Severity::Normal,
            SURGING,
            "Replace",
            format!("creating a replacement first (the provider's maxSurge): instance {serving} serves until it passes its probe"),
        ));
    }
    let took_over = after
        .retiring
        .as_ref()
        .filter(|r| before.provider_id.as_deref() == Some(r.provider_id.as_str()));
    if let Some(r) = took_over.filter(|_| before.retiring.is_none()) {
        let new = after.provider_id.as_deref().unwrap_or("");
        let at = after.ip.as_deref().unwrap_or("an unknown address");
        notes.push(note(
            Severity::Normal,
            REPLACED,
            "Replace",
            format!("instance {new} at {at} took over from {}, which serves the leases it had until they end or the drain timeout, then is deleted", r.provider_id),
        ));
    }
    notes
}

/// The Replacing Event of an instance that went without being asked to:
/// the pass found it gone and forgot it (a replacement the operator
/// started has said so already, in the status `was`).
fn vanished_note(
    was: Option<&Condition>,
    before: &ProxyStatus,
    after: &ProxyStatus,
) -> Option<Note> {
    let old = before.provider_id.as_deref().filter(|id| !id.is_empty())?;
    let replacing = was.is_some_and(|c| {
        (c.reason == REASON_CREATING && c.message != CREATING_MESSAGE)
            || c.reason == REASON_STARTUP_TIMED_OUT
    });
    // A surge replacement took over: the old one retires, it did not go.
    let retiring = after.retiring.as_ref().map(|r| r.provider_id.as_str());
    if replacing || after.provider_id.as_deref() == Some(old) || retiring == Some(old) {
        return None;
    }
    Some(note(
        Severity::Normal,
        REPLACING,
        "Replace",
        format!("instance {old} vanished: replacing it"),
    ))
}

/// The Event for a Provisioned condition that just became `c`.
fn provisioned_note(c: &Condition, after: &ProxyStatus) -> Option<Note> {
    let id = after.provider_id.as_deref().unwrap_or("");
    let msg = c.message.clone();
    let n = match c.reason.as_str() {
        REASON_INSTANCE_RUNNING => note(
            Severity::Normal,
            RUNNING,
            "Observe",
            format!(
                "instance {id} is running at {}",
                after.ip.as_deref().unwrap_or("an unknown address")
            ),
        ),
        REASON_CREATING if c.message == CREATING_MESSAGE => note(
            Severity::Normal,
            CREATING,
            "Create",
            format!("creating instance {id}"),
        ),
        REASON_CREATING => note(Severity::Normal, REPLACING, "Replace", msg),
        REASON_STARTUP_TIMED_OUT => note(Severity::Warning, STARTUP_TIMED_OUT, "Replace", msg),
        REASON_QUOTA_EXCEEDED => note(Severity::Warning, QUOTA_EXCEEDED, "Create", msg),
        REASON_CLOUD_INIT_ERROR => note(Severity::Warning, CLOUD_INIT_ERROR, "Create", msg),
        REASON_PERMANENT_ERROR | REASON_INVALID_SPEC => {
            note(Severity::Warning, FAILED, "Create", msg)
        }
        REASON_PROVIDER_UNAVAILABLE => note(Severity::Warning, PROVIDER_UNAVAILABLE, "Get", msg),
        _ => return None,
    };
    Some(n)
}

/// The Event of a deletion pass that released the finalizer for `why`;
/// `provider_id` is the instance the Proxy had.
pub fn released_note(why: ReleaseReason, provider_id: Option<&str>) -> Option<Note> {
    let id = provider_id.filter(|id| !id.is_empty())?;
    match why {
        ReleaseReason::NothingRecorded => None,
        ReleaseReason::InstanceGone => Some(note(
            Severity::Normal,
            DELETED,
            "Delete",
            format!("instance {id} deleted with its Proxy"),
        )),
        ReleaseReason::SkipCleanup => Some(note(
            Severity::Normal,
            CLEANUP_SKIPPED,
            "Release",
            format!("skip-cleanup is set: instance {id} was left in place"),
        )),
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
