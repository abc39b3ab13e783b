//! The provider's circuit breaker as the ProviderHealth shows it (pure):
//! the `Replacing` condition and the Events of its transitions. The
//! breaker itself lives in the leader's fleet view ([`crate::fleet`]).

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::constants::RESET_CIRCUIT_BREAKER_ANNOTATION;
use crate::api::provider_health::conditions as c;
use crate::events::{Note, Severity};
use crate::fleet::breaker::Report;
use crate::fleet::Transition;

/// Event action while the breaker holds replacing and recycling back.
pub const ACTION_HOLD: &str = "HoldReplacing";
/// Event action when replacing and recycling resume.
pub const ACTION_RESUME: &str = "ResumeReplacing";

fn window(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The `Replacing` condition for `report` at `now`: False `CircuitOpen`
/// while open (its transition time the opening), else True
/// `CircuitClosed`.
pub fn replacing_condition(report: &Report, now: DateTime<Utc>) -> Condition {
    let p = report.policy;
    let share = format!(
        "{} of the {} proxies Ready within the last {} were lost (unhealthy or gone)",
        report.lost,
        report.seen,
        window(p.window)
    );
    match report.open_since {
        Some(since) => Condition::new(
            c::REPLACING,
            ConditionStatus::False,
            c::REASON_CIRCUIT_OPEN,
            format!(
                "the circuit breaker is open since {}: {share}, more than {}%; not replacing or recycling this provider's proxies until the share falls back or the {RESET_CIRCUIT_BREAKER_ANNOTATION} annotation resets it",
                since.to_rfc3339_opts(SecondsFormat::Secs, true),
                p.threshold_percent
            ),
            since,
        ),
        None => Condition::new(
            c::REPLACING,
            ConditionStatus::True,
            c::REASON_CIRCUIT_CLOSED,
            format!(
                "the circuit breaker is closed: {share}; it opens above {}% with at least {} Ready",
                p.threshold_percent, p.min_fleet
            ),
            now,
        ),
    }
}

/// `conditions` with `Replacing` set from `report` (set-condition
/// semantics: the transition time moves only when the status flips).
pub fn with_replacing(
    mut conditions: Vec<Condition>,
    report: &Report,
    now: DateTime<Utc>,
) -> Vec<Condition> {
    condition::set(&mut conditions, replacing_condition(report, now));
    conditions
}

/// The Event of a transition of `provider`'s breaker.
pub fn transition_note(provider: &str, t: Transition, report: &Report) -> Note {
    let p = report.policy;
    match t {
        Transition::Opened { lost, seen } => Note {
            severity: Severity::Warning,
            reason: c::REASON_CIRCUIT_OPEN,
            action: ACTION_HOLD,
            text: format!(
                "{lost} of the {seen} proxies of provider {provider} Ready within the last {} were lost at once, more than {}%: the circuit breaker opened; not replacing or recycling them until it closes",
                window(p.window),
                p.threshold_percent
            ),
        },
        Transition::Closed => Note {
            severity: Severity::Normal,
            reason: c::REASON_CIRCUIT_CLOSED,
            action: ACTION_RESUME,
            text: format!(
                "the circuit breaker of provider {provider} closed: {} of {} proxies lost, {}% or less; replacing and recycling resume",
                report.lost, report.seen, p.threshold_percent
            ),
        },
        Transition::Reset => Note {
            severity: Severity::Normal,
            reason: c::REASON_CIRCUIT_RESET,
            action: ACTION_RESUME,
            text: format!(
                "the circuit breaker of provider {provider} was reset with the {RESET_CIRCUIT_BREAKER_ANNOTATION} annotation: losses before now no longer count; replacing and recycling resume"
            ),
        },
    }
}

#[cfg(test)]
#[path = "circuit_tests.rs"]
mod tests;
