//! The status builders: every change a pass makes to a Proxy's status,
//! the phase always through [`phase`].

use chrono::{DateTime, Utc};

use super::managed::ReplaceCause;
use super::phase::{phase, ready, Stage};
use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::health::HealthReport;
use crate::api::proxy::conditions::*;
use crate::api::{ProxyPhase, ProxyStatus};

/// Healthy=True: probes pass through the proxy.
pub const REASON_PROBE_SUCCEEDED: &str = "ProbeSucceeded";
/// Healthy=False: probes through the proxy fail.
pub const REASON_PROBE_FAILED: &str = "ProbeFailed";
/// Healthy=Unknown: no instance to probe (being created or replaced).
pub const REASON_AWAITING_PROBE: &str = "AwaitingProbe";
/// The `Provisioned=False/Creating` message of a create, as opposed to a
/// replacement's (which names its cause).
pub const CREATING_MESSAGE: &str = "instance is being created";

/// The longest condition message the CRD accepts, in characters (the
/// `maxLength` of metav1.Condition's message): a longer one would make the
/// whole status write fail.
pub const MESSAGE_MAX_CHARS: usize = 32768;
/// What ends a message cut to [`MESSAGE_MAX_CHARS`].
const CUT_MARK: &str = " [truncated]";

/// `message`, cut to [`MESSAGE_MAX_CHARS`] characters (marked as cut) when
/// longer.
pub fn truncate_message(message: &str) -> String {
    if message.chars().count() <= MESSAGE_MAX_CHARS {
        return message.to_string();
    }
    let keep = MESSAGE_MAX_CHARS - CUT_MARK.chars().count();
    let mut out: String = message.chars().take(keep).collect();
    out.push_str(CUT_MARK);
    out
}

/// What the health engine says about a Proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Its last status-affecting result.
    Report(HealthReport),
    /// A verdict without a report (a source that only gives verdicts).
    Verdict(bool),
    /// Nothing: no verdict yet, no engine, or another replica probes.
    Unknown,
}

impl Health {
    /// What a source's `report` and `verdict` come to: a report wins, a
    /// bare verdict is used only without one.
    pub fn of(report: Option<HealthReport>, verdict: Option<bool>) -> Self {
        match (report, verdict) {
            (Some(r), _) => Health::Report(r),
            (None, Some(v)) => Health::Verdict(v),
            (None, None) => Health::Unknown,
        }
    }

    /// What a source's answers come to for a Proxy served at `host`: a
    /// result probed through another host is of the instance this one
    /// replaced (the engine keeps it until it sees the new address), so it
    /// counts as none. Otherwise a new instance would be Ready, leased and
    /// counted back by the circuit breaker before any probe went through it.
    pub fn at(
        report: Option<HealthReport>,
        verdict: Option<bool>,
        probed: Option<&str>,
        host: Option<&str>,
    ) -> Self {
        match (probed, host) {
            (Some(p), Some(h)) if p != h => Health::Unknown,
            _ => Health::of(report, verdict),
        }
    }
}

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
        Condition::new(PROVISIONED, s, reason, truncate_message(msg), now)
            .at_generation(generation),
    );
}

fn set_phase(status: &mut ProxyStatus, stage: Stage) {
    status.phase = phase(stage, status.phase);
}

/// A create was submitted (or an instance is booting).
pub fn mark_creating(status: &mut ProxyStatus, now: DateTime<Utc>, generation: Option<i64>) {
    set_phase(status, Stage::Provisioning);
    provisioned(
        status,
        ConditionStatus::False,
        REASON_CREATING,
        CREATING_MESSAGE,
        now,
        generation,
    );
}

/// The instance runs at `ip`; its health is folded in and the phase
/// follows the Ready decision.
pub fn mark_running(
    status: &mut ProxyStatus,
    ip: &str,
    health: &Health,
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
    apply_health(status, health, now);
}

/// An External Proxy at `host`: its health is folded in and the phase
/// follows the Ready decision.
pub fn mark_external(status: &mut ProxyStatus, host: &str, health: &Health, now: DateTime<Utc>) {
    // An External Proxy has no Provisioned condition; one left from a
    // refusal (the allowlist has since changed) goes.
    if condition::find(&status.conditions, PROVISIONED).is_some_and(|c| {
        c.reason == REASON_EXTERNAL_NOT_ALLOWED || c.reason == REASON_CREDENTIALS_UNAVAILABLE
    }) {
        condition::remove(&mut status.conditions, PROVISIONED);
    }
    status.ip = Some(host.to_string());
    apply_health(status, health, now);
}

/// An External Proxy in a namespace that may not have one: failed until
/// the operator's allowlist or the Proxy changes, with no address and no
/// verdict left from before (nothing is probed).
pub fn mark_external_refused(
    status: &mut ProxyStatus,
    (reason, message): (&str, &str),
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    status.ip = None;
    status.latency_millis = None;
    mark_failed(status, reason, message, now, generation);
    condition::set(
        &mut status.conditions,
        Condition::new(
            HEALTHY,
            ConditionStatus::Unknown,
            REASON_NOT_PROBED,
            "not probed: see the Provisioned condition",
            now,
        ),
    );
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

/// A quota or rate-limit error: retried later, the phase kept.
pub fn mark_quota(
    status: &mut ProxyStatus,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    set_phase(status, Stage::Retrying);
    provisioned(
        status,
        ConditionStatus::False,
        REASON_QUOTA_EXCEEDED,
        message,
        now,
        generation,
    );
}

/// The provider refused a call for the operator's credentials or
/// permissions (or cannot say what the instance is): not a latch, and
/// nothing is known about the instance, so `Provisioned=Unknown`. A Proxy
/// that was serving keeps serving by its health (it stays in the pool while
/// its probes pass); a Failed one waits as Provisioning; any other keeps
/// its phase.
pub fn mark_unavailable(
    status: &mut ProxyStatus,
    message: &str,
    health: &Health,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    provisioned(
        status,
        ConditionStatus::Unknown,
        REASON_PROVIDER_UNAVAILABLE,
        &format!("the provider cannot be observed: {message}"),
        now,
        generation,
    );
    match status.phase {
        Some(ProxyPhase::Ready | ProxyPhase::Running) if status.ip.is_some() => {
            apply_health(status, health, now);
        }
        // Failed before (the provider was not configured): nothing has
        // failed for good now, it waits for the provider.
        Some(ProxyPhase::Failed) => set_phase(status, Stage::Provisioning),
        _ => set_phase(status, Stage::Retrying),
    }
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
    not_provisioned(status, Stage::Failed, reason, message, now, generation);
}

/// The phase of `stage` with `Provisioned=False/reason`.
fn not_provisioned(
    status: &mut ProxyStatus,
    stage: Stage,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    set_phase(status, stage);
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
    set_phase(status, Stage::AwaitingCloudInit);
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
    set_phase(status, Stage::Provisioning);
    if requested {
        status.delete_requested_at = Some(now);
    }
    let (reason, msg) = match why {
        ReplaceCause::SpecChanged => (
            REASON_CREATING,
            "spec changed: replacing the instance".to_string(),
        ),
        ReplaceCause::Stopped(s) => (
            REASON_CREATING,
            format!("instance is {}: replacing it", s.as_str()),
        ),
        ReplaceCause::Recycled => (
            REASON_CREATING,
            "recycled: drained, replacing the instance".to_string(),
        ),
        ReplaceCause::StartupTimedOut { after } => (
            REASON_STARTUP_TIMED_OUT,
            format!(
                "the instance was not running with an address {} after its create (the startup timeout): replacing it",
                humantime::format_duration(after)
            ),
        ),
    };
    provisioned(
        status,
        ConditionStatus::False,
        reason,
        &msg,
        now,
        generation,
    );
}

/// A create is held back (the provider's create limits, or replace
/// backoff) for `reason`: Provisioning, `Provisioned=False` saying why and
/// until when.
pub fn mark_held(
    status: &mut ProxyStatus,
    reason: &str,
    message: &str,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    let stage = Stage::Provisioning;
    not_provisioned(status, stage, reason, message, now, generation);
}

/// Forget the old instance before creating its replacement.
pub fn clear_instance(status: &mut ProxyStatus) {
    status.provider_id = None;
    status.ip = None;
    status.port = None;
    status.created_at = None;
    status.delete_requested_at = None;
    status.credentials_secret = None;
}

/// Folds what the health engine says into the status of a serving (running
/// or External) Proxy: from a report, the Healthy condition, latency and
/// probe time; then the phase from the Ready decision. Without a report
/// the status is kept as it is, so a restart does not flap every Proxy.
pub fn apply_health(status: &mut ProxyStatus, health: &Health, now: DateTime<Utc>) {
    let ready = ready(health, status);
    if let Health::Report(r) = health {
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
    }
    set_phase(status, Stage::Serving { ready });
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
#[path = "status_tests.rs"]
mod tests;
