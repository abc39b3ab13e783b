//! The reconcile decisions, as pure functions of (Proxy, what was observed,
//! now). The effects in `reconcile.rs` gather observations, ask for the next
//! step, perform it, and ask again; nothing here does I/O.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::proxy::conditions::*;
use crate::api::{ProxyPhase, ProxyStatus};
use crate::provider::{ErrorClass, Instance, InstanceState};

/// Re-poll while an instance is Provisioning.
pub const PROVISIONING_POLL: Duration = Duration::from_secs(10);
/// Re-poll while an instance is being deleted.
pub const DELETION_POLL: Duration = Duration::from_secs(10);
/// A quick follow-up pass.
pub const REQUEUE_NOW: Duration = Duration::from_secs(1);
/// Retry after a quota or rate-limit error.
pub const QUOTA_RETRY: Duration = Duration::from_secs(300);
/// Retry while the cloud-init Secret cannot be read (its watch usually
/// triggers sooner).
pub const CLOUD_INIT_RETRY: Duration = Duration::from_secs(30);
/// A delete is not resubmitted within this long of the last one while the
/// instance still shows (providers may take minutes to finish a delete).
pub const DELETE_RESUBMIT_AFTER: Duration = Duration::from_secs(60);

/// The outcome of `Provider::get`, reduced to what the decisions need.
#[derive(Clone, Debug, PartialEq)]
pub enum GetOutcome {
    /// The instance exists.
    Found(Instance),
    /// The instance is gone.
    NotFound,
    /// The call failed with this class and message.
    Failed(ErrorClass, String),
}

/// What the managed path knows at a decision point.
#[derive(Clone, Debug)]
pub struct ManagedInput<'a> {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Whether our finalizer is on the object.
    pub has_finalizer: bool,
    /// The status as it stands in memory (after earlier steps of this pass).
    pub status: &'a ProxyStatus,
    /// Whether `spec.provider` names a configured provider.
    pub provider_configured: bool,
    /// The `spec-hash` annotation.
    pub recorded_hash: Option<&'a str>,
    /// The hash of the current spec; `None` until cloud-init is resolved.
    pub spec_hash: Option<&'a str>,
    /// The result of `get(providerID)` in this pass, once made.
    pub get: Option<&'a GetOutcome>,
    /// The clock.
    pub now: DateTime<Utc>,
}

/// The next step of the managed path.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add the finalizer (object update) and end the pass.
    AddFinalizer,
    /// Permanently failed at this generation: no provider call, no requeue.
    Latched,
    /// The provider is not configured: report it and stop (re-evaluated on
    /// the next pass, e.g. after a restart with a new config).
    ProviderNotConfigured,
    /// Resolve cloud-init and compute the spec hash.
    ResolveCloudInit,
    /// Nothing recorded yet: record the hash if needed, then create.
    Create,
    /// Record the current hash without replacing (adopted instance).
    RecordHash,
    /// Ask the provider for the instance.
    Get,
    /// Ask the provider to delete the instance, then poll again.
    Delete {
        /// Why: the spec changed, or the instance stopped.
        why: ReplaceCause,
    },
    /// The old instance is still going away; poll again later.
    WaitForDeletion {
        /// Why it is being deleted.
        why: ReplaceCause,
    },
    /// The old instance is gone: record the new hash, clear the ID and IP,
    /// then create.
    ClearAndCreate,
    /// The instance is still being built; poll again later.
    WaitProvisioning,
    /// The instance runs with this IP.
    Running {
        /// The address.
        ip: String,
    },
    /// The last call failed with this class.
    Failed {
        /// The class.
        class: ErrorClass,
        /// The message (names the field and value for Permanent).
        message: String,
    },
}

/// Why an instance is being replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplaceCause {
    /// Placement, cloud-init or port changed.
    SpecChanged,
    /// The instance is Stopped or Terminated.
    Stopped(InstanceState),
}

/// Whether `Provisioned=False/PermanentError` was set at this generation.
pub fn is_latched(status: &ProxyStatus, generation: Option<i64>) -> bool {
    condition::find(&status.conditions, PROVISIONED).is_some_and(|c| {
        c.status == ConditionStatus::False
            && c.reason == REASON_PERMANENT_ERROR
            && c.observed_generation == generation
    })
}

/// The next step of the managed path.
pub fn next_managed_step(input: &ManagedInput<'_>) -> Step {
    if !input.has_finalizer {
        return Step::AddFinalizer;
    }
    if is_latched(input.status, input.generation) {
        return Step::Latched;
    }
    if !input.provider_configured {
        return Step::ProviderNotConfigured;
    }
    let Some(spec_hash) = input.spec_hash else {
        return Step::ResolveCloudInit;
    };
    let provider_id = input.status.provider_id.as_deref().unwrap_or("");
    if provider_id.is_empty() {
        return Step::Create;
    }
    let hash_matches = input.recorded_hash == Some(spec_hash);
    let Some(get) = input.get else {
        if input.recorded_hash.is_none() {
            return Step::RecordHash;
        }
        return Step::Get;
    };
    match get {
        GetOutcome::Failed(class, message) => Step::Failed {
            class: *class,
            message: message.clone(),
        },
        GetOutcome::NotFound => Step::ClearAndCreate,
        GetOutcome::Found(inst) if !hash_matches => {
            delete_or_wait(input, ReplaceCause::SpecChanged)
        }
        GetOutcome::Found(inst) => match inst.state {
            InstanceState::Provisioning => Step::WaitProvisioning,
            InstanceState::Running if !inst.ip.is_empty() => Step::Running {
                ip: inst.ip.clone(),
            },
            // A provider that breaks the contract (Running without an IP) is
            // treated as still provisioning rather than trusted.
            InstanceState::Running => Step::WaitProvisioning,
            s @ (InstanceState::Stopped | InstanceState::Terminated) => {
                delete_or_wait(input, ReplaceCause::Stopped(s))
            }
        },
    }
}

fn delete_or_wait(input: &ManagedInput<'_>, why: ReplaceCause) -> Step {
    if recently_requested(input.status.delete_requested_at, input.now) {
        Step::WaitForDeletion { why }
    } else {
        Step::Delete { why }
    }
}

fn recently_requested(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    at.is_some_and(|t| {
        now.signed_duration_since(t)
            .to_std()
            .map(|age| age < DELETE_RESUBMIT_AFTER)
            // A request time in the future (clock skew) counts as recent.
            .unwrap_or(true)
    })
}

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
        Some(GetOutcome::Failed(ErrorClass::Permanent, msg)) => {
            DeleteStep::DeleteAfterPermanentGet {
                get_error: msg.clone(),
            }
        }
        Some(GetOutcome::Failed(class, message)) => DeleteStep::Failed {
            class: *class,
            message: message.clone(),
        },
        Some(GetOutcome::Found(_)) if recently_requested(input.delete_requested_at, input.now) => {
            DeleteStep::Wait
        }
        Some(GetOutcome::Found(_)) => DeleteStep::Delete,
    }
}

// ---- status building ------------------------------------------------------

fn provisioned(
    status: &mut ProxyStatus,
    s: ConditionStatus,
    reason: &str,
    msg: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    condition::set(
        &mut status.conditions,
        Condition::new(PROVISIONED, s, reason, msg, now).at_generation(generation),
    );
}

/// A create was submitted (or an instance is booting).
pub fn mark_creating(status: &mut ProxyStatus, now: DateTime<Utc>, generation: Option<i64>) {
    status.phase = Some(ProxyPhase::Provisioning);
    provisioned(
        status,
        ConditionStatus::False,
        REASON_CREATING,
        "instance is being created",
        now,
        generation,
    );
}

/// The instance runs at `ip`; the phase follows the health verdict.
pub fn mark_running(
    status: &mut ProxyStatus,
    ip: &str,
    healthy: Option<bool>,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    status.ip = Some(ip.to_string());
    status.delete_requested_at = None;
    provisioned(
        status,
        ConditionStatus::True,
        REASON_INSTANCE_RUNNING,
        "instance is running",
        now,
        generation,
    );
    status.phase = Some(if healthy == Some(true) {
        ProxyPhase::Ready
    } else {
        ProxyPhase::Running
    });
}

/// A permanent failure: latched until the spec changes.
pub fn mark_permanent(
    status: &mut ProxyStatus,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    mark_failed(status, REASON_PERMANENT_ERROR, message, now, generation);
}

/// A quota or rate-limit error: retried after [`QUOTA_RETRY`].
pub fn mark_quota(
    status: &mut ProxyStatus,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    provisioned(
        status,
        ConditionStatus::False,
        REASON_QUOTA_EXCEEDED,
        message,
        now,
        generation,
    );
}

/// The named provider is not configured: reported as a PermanentError, but
/// deliberately without an observed generation, so it is not a latch: the
/// next pass (e.g. after a restart with the provider added) re-evaluates.
pub fn mark_not_configured(status: &mut ProxyStatus, provider: &str, now: DateTime<Utc>) {
    let msg =
        format!("spec.provider {provider:?} is not configured in the operator's providers config");
    mark_failed(status, REASON_PERMANENT_ERROR, &msg, now, None);
}

/// Phase Failed with `Provisioned=False/reason`.
fn mark_failed(
    status: &mut ProxyStatus,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    status.phase = Some(ProxyPhase::Failed);
    provisioned(
        status,
        ConditionStatus::False,
        reason,
        message,
        now,
        generation,
    );
}

/// The cloud-init Secret or key cannot be read.
pub fn mark_cloud_init_error(
    status: &mut ProxyStatus,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    if status.phase.is_none() {
        status.phase = Some(ProxyPhase::Provisioning);
    }
    provisioned(
        status,
        ConditionStatus::False,
        REASON_CLOUD_INIT_ERROR,
        message,
        now,
        generation,
    );
}

/// The spec cannot be acted on (validation was bypassed).
pub fn mark_invalid(
    status: &mut ProxyStatus,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    mark_failed(status, REASON_INVALID_SPEC, message, now, generation);
}

/// The old instance is going away for `why`.
pub fn mark_replacing(
    status: &mut ProxyStatus,
    why: ReplaceCause,
    requested: bool,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    status.phase = Some(ProxyPhase::Provisioning);
    if requested {
        status.delete_requested_at = Some(now);
    }
    let msg = match why {
        ReplaceCause::SpecChanged => "spec changed: replacing the instance".to_string(),
        ReplaceCause::Stopped(s) => format!("instance is {}: replacing it", s.as_str()),
    };
    provisioned(
        status,
        ConditionStatus::False,
        REASON_CREATING,
        &msg,
        now,
        generation,
    );
}

/// Forget the old instance before creating its replacement.
pub fn clear_instance(status: &mut ProxyStatus) {
    status.provider_id = None;
    status.ip = None;
    status.delete_requested_at = None;
}

/// Healthy=True: probes pass through the proxy.
pub const REASON_PROBE_SUCCEEDED: &str = "ProbeSucceeded";
/// Healthy=False: probes through the proxy fail.
pub const REASON_PROBE_FAILED: &str = "ProbeFailed";
/// Healthy=Unknown: no instance to probe (being created or replaced).
pub const REASON_AWAITING_PROBE: &str = "AwaitingProbe";

/// Folds the health engine's last status-affecting result into the status
/// of a running (or External) Proxy: the Healthy condition, latency, probe
/// time, and phase Ready while healthy, Running otherwise. Without a
/// result (no verdict yet, or another replica probes) the status is kept as
/// it is, so a restart does not flap every Proxy.
pub fn apply_health(
    status: &mut ProxyStatus,
    report: Option<&crate::api::health::HealthReport>,
    now: DateTime<Utc>,
) {
    let Some(r) = report else {
        let healthy = status
            .conditions
            .iter()
            .any(|c| c.type_ == HEALTHY && c.status == ConditionStatus::True);
        if healthy {
            status.phase = Some(ProxyPhase::Ready);
        }
        return;
    };
    let (s, reason) = if r.healthy {
        (ConditionStatus::True, REASON_PROBE_SUCCEEDED)
    } else {
        (ConditionStatus::False, REASON_PROBE_FAILED)
    };
    let message: String = r.message.chars().take(1024).collect();
    condition::set(
        &mut status.conditions,
        Condition::new(HEALTHY, s, reason, message, now),
    );
    status.latency_millis = Some(i64::try_from(r.latency_ms).unwrap_or(i64::MAX));
    status.last_probe_time = Some(r.probed_at);
    status.phase = Some(if r.healthy {
        ProxyPhase::Ready
    } else {
        ProxyPhase::Running
    });
}

/// The instance is being created or replaced: a Healthy condition left
/// from the previous instance becomes Unknown.
pub fn health_unknown(status: &mut ProxyStatus, now: DateTime<Utc>) {
    if status.conditions.iter().any(|c| c.type_ == HEALTHY) {
        condition::set(
            &mut status.conditions,
            Condition::new(
                HEALTHY,
                ConditionStatus::Unknown,
                REASON_AWAITING_PROBE,
                "no running instance to probe",
                now,
            ),
        );
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
