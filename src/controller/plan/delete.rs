//! The deletion path: what to do next for a Proxy being deleted, until its
//! instance is gone (or abandoned) and the finalizer can go.

use chrono::{DateTime, Utc};

use super::{delete_pending, GetOutcome};
use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::proxy::conditions::{DELETING, REASON_CLEANUP_FAILED};
use crate::api::ProxyStatus;
use crate::provider::ErrorClass;

/// What the deletion path knows.
#[derive(Clone, Debug)]
pub struct DeleteInput<'a> {
    /// Whether our finalizer is on the object.
    pub has_finalizer: bool,
    /// `status.providerID`.
    pub provider_id: Option<&'a str>,
    /// Whether `crawl.example.com/skip-cleanup` is exactly `"true"`.
    pub skip_cleanup: bool,
    /// Whether the provider is configured.
    pub provider_configured: bool,
    /// The get result, once made.
    pub get: Option<&'a GetOutcome>,
    /// When a delete was last requested.
    pub delete_requested_at: Option<DateTime<Utc>>,
    /// The clock.
    pub now: DateTime<Utc>,
}

/// The next step of the deletion path.
#[derive(Clone, Debug, PartialEq)]
pub enum DeleteStep {
    /// Not ours to hold: nothing to do.
    Nothing,
    /// Remove the finalizer.
    Release {
        /// Why, for the log.
        why: ReleaseReason,
    },
    /// The provider is not configured: an error until it is, or until an
    /// administrator sets skip-cleanup.
    ProviderNotConfigured,
    /// Ask the provider for the instance.
    Get,
    /// Ask the provider to delete it (again), then poll.
    Delete,
    /// Get failed permanently: try delete anyway; release if it succeeds.
    DeleteAfterPermanentGet {
        /// The get error.
        get_error: String,
    },
    /// A delete is in flight; poll again later.
    Wait,
    /// Get failed with this class.
    Failed {
        /// The class.
        class: ErrorClass,
        /// The message.
        message: String,
    },
}

/// Why the finalizer is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    /// No instance was ever recorded.
    NothingRecorded,
    /// The administrator asked to abandon the instance.
    SkipCleanup,
    /// The instance is gone.
    InstanceGone,
}

/// The next step of the deletion path.
pub fn next_delete_step(input: &DeleteInput<'_>) -> DeleteStep {
    if !input.has_finalizer {
        return DeleteStep::Nothing;
    }
    if input.provider_id.unwrap_or("").is_empty() {
        return DeleteStep::Release {
            why: ReleaseReason::NothingRecorded,
        };
    }
    if input.skip_cleanup {
        return DeleteStep::Release {
            why: ReleaseReason::SkipCleanup,
        };
    }
    if !input.provider_configured {
        return DeleteStep::ProviderNotConfigured;
    }
    match input.get {
        None => DeleteStep::Get,
        Some(GetOutcome::NotFound) => DeleteStep::Release {
            why: ReleaseReason::InstanceGone,
        },
        Some(
            GetOutcome::Failed(ErrorClass::Permanent, msg)
            | GetOutcome::CreateFailed(ErrorClass::Permanent, msg),
        ) => DeleteStep::DeleteAfterPermanentGet {
            get_error: msg.clone(),
        },
        Some(GetOutcome::Failed(class, message) | GetOutcome::CreateFailed(class, message)) => {
            DeleteStep::Failed {
                class: *class,
                message: message.clone(),
            }
        }
        Some(GetOutcome::Found(inst))
            if delete_pending(input.delete_requested_at, inst.state, input.now) =>
        {
            DeleteStep::Wait
        }
        Some(GetOutcome::Found(_)) => DeleteStep::Delete,
    }
}

/// Which of a deleted Proxy's instances the deletion path works on: a
/// retiring one, then a surge replacement, then the current one; each
/// is deleted and seen gone before the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `status.retiring`.
    Retiring,
    /// `status.surge` (once created).
    Surge,
    /// `status.providerID`.
    Current,
}

/// The instance the deletion path works on next: its kind, ID and when
/// its delete was last asked for.
pub fn deletion_target(status: &ProxyStatus) -> (Target, Option<&str>, Option<DateTime<Utc>>) {
    if let Some(r) = &status.retiring {
        return (
            Target::Retiring,
            Some(r.provider_id.as_str()),
            r.delete_requested_at,
        );
    }
    if let Some(s) = status.surge.as_ref().filter(|s| s.provider_id.is_some()) {
        return (
            Target::Surge,
            s.provider_id.as_deref(),
            s.delete_requested_at,
        );
    }
    (
        Target::Current,
        status.provider_id.as_deref(),
        status.delete_requested_at,
    )
}

/// `target` is gone (or nothing was recorded for it): forget it.
pub fn forget_target(status: &mut ProxyStatus, target: Target) {
    match target {
        Target::Retiring => super::surge::retired(status),
        Target::Surge => super::surge::forget(status),
        Target::Current => {}
    }
}

/// A delete of `target` was asked for at `now`.
pub fn target_delete_requested(status: &mut ProxyStatus, target: Target, now: DateTime<Utc>) {
    match target {
        Target::Retiring => super::surge::retire_requested(status, now),
        Target::Surge => super::surge::giving_up(status, now),
        Target::Current => status.delete_requested_at = Some(now),
    }
}

/// Failed cleanup attempts in a row after which a deleted Proxy says so
/// in its status and an Event: one failure is often a blip the next poll
/// clears.
pub const CLEANUP_FAILED_AFTER: u32 = 3;

/// Records the `failures`-th failed cleanup attempt in a row, failing
/// with the provider's `message`: from [`CLEANUP_FAILED_AFTER`] on, the
/// Proxy shows `Deleting=False/CleanupFailed` with it.
pub fn mark_cleanup_failed(
    status: &mut ProxyStatus,
    failures: u32,
    message: &str,
    now: DateTime<Utc>,
) {
    if failures < CLEANUP_FAILED_AFTER {
        return;
    }
    condition::set(
        &mut status.conditions,
        Condition::new(
            DELETING,
            ConditionStatus::False,
            REASON_CLEANUP_FAILED,
            format!("cannot delete the instance, retrying (to abandon it instead: annotate crawl.example.com/skip-cleanup=true): {message}"),
            now,
        ),
    );
}

#[cfg(test)]
#[path = "delete_tests.rs"]
mod tests;
