//! Pure status building (provider-health.md §6) and transition detection
//! (§7).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::CheckResult;
use crate::api::condition::{Condition, ConditionStatus};
use crate::api::provider_health::conditions as c;
use crate::api::{ProviderHealthStatus, ProviderTarget};

/// The API server's maxLength for target and condition messages.
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// Keeps at most 1024 characters (code points): a longer string becomes
/// its first 1023 followed by `…`.
pub fn truncate(s: &str) -> String {
    if s.chars().count() <= MAX_MESSAGE_CHARS {
        return s.to_string();
    }
    let mut out: String = s.chars().take(MAX_MESSAGE_CHARS - 1).collect();
    out.push('…');
    out
}

/// The Ready condition's status, reason and message for a result.
pub fn ready_condition(result: &CheckResult) -> (ConditionStatus, &'static str, String) {
    if !result.supported {
        return (
            ConditionStatus::Unknown,
            c::REASON_CHECKS_NOT_IMPLEMENTED,
            format!("{} providers have no health check", result.provider_type),
        );
    }
    if result.targets.is_empty() {
        return (
            ConditionStatus::Unknown,
            c::REASON_NO_TARGETS,
            "the provider has nothing to check".into(),
        );
    }
    let total = result.targets.len();
    let ready = result.targets.iter().filter(|t| t.ready).count();
    if ready == total {
        return (
            ConditionStatus::True,
            c::REASON_ALL_TARGETS_READY,
            format!("{ready} of {total} targets ready"),
        );
    }
    let failing: Vec<String> = result
        .targets
        .iter()
        .filter(|t| !t.ready)
        .map(|t| format!("{}: {}", t.name, t.reason))
        .collect();
    (
        ConditionStatus::False,
        c::REASON_TARGETS_NOT_READY,
        truncate(&failing.join("; ")),
    )
}

/// The new status from the previous one (not modified) and a result; all
/// times are the result's `checked_at`.
pub fn build_status(
    prev: Option<&ProviderHealthStatus>,
    result: &CheckResult,
) -> ProviderHealthStatus {
    let now = result.checked_at;
    let prev_target = |name: &str| {
        prev.and_then(|p| p.targets.iter().find(|t| t.name == name))
            .cloned()
    };
    let targets = result
        .targets
        .iter()
        .map(|t| {
            let since = match prev_target(&t.name) {
                Some(p) if p.ready == t.ready => p.last_transition_time,
                _ => now,
            };
            let ms = i64::try_from(t.latency.as_millis()).unwrap_or(i64::MAX);
            ProviderTarget {
                name: t.name.clone(),
                address: Some(t.address.clone()).filter(|s| !s.is_empty()),
                ready: t.ready,
                reason: Some(t.reason.clone()).filter(|s| !s.is_empty()),
                message: Some(truncate(&t.message)).filter(|s| !s.is_empty()),
                latency_millis: Some(ms).filter(|m| *m > 0),
                last_transition_time: since,
                details: t.details.clone(),
            }
        })
        .collect::<Vec<_>>();
    let targets_ready = result.supported.then(|| {
        format!(
            "{}/{}",
            result.targets.iter().filter(|t| t.ready).count(),
            result.targets.len()
        )
    });
    let (status, reason, message) = ready_condition(result);
    let old = prev.and_then(|p| p.conditions.iter().find(|c| c.type_ == c::READY));
    let transition = match old {
        Some(o) if o.status == status => o.last_transition_time,
        _ => now,
    };
    let mut conditions: Vec<Condition> = prev
        .map(|p| {
            p.conditions
                .iter()
                .filter(|c| c.type_ != c::READY)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    conditions.insert(
        0,
        Condition {
            type_: c::READY.into(),
            status,
            reason: reason.into(),
            message,
            last_transition_time: transition,
            observed_generation: None,
        },
    );
    ProviderHealthStatus {
        type_: Some(result.provider_type.clone()),
        conditions,
        targets,
        targets_ready,
        last_check_time: Some(now),
    }
}

/// A target's change worth a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Not ready: first seen, previously ready, or a new reason (Info,
    /// `WARNING:`).
    Down,
    /// Ready after being seen not ready (Info).
    Up,
    /// Ready, first time seen (debug).
    FirstUp,
}

/// The remembered verdicts, keyed `<provider>/<target>`: (ready, reason).
pub type Seen = HashMap<String, (bool, String)>;

/// The transition of one target, updating `seen`; `None` when unchanged.
pub fn transition(
    seen: &mut Seen,
    provider: &str,
    name: &str,
    ready: bool,
    reason: &str,
) -> Option<Transition> {
    let key = format!("{provider}/{name}");
    let prev = seen.insert(key, (ready, reason.to_string()));
    match (prev, ready) {
        (None, true) => Some(Transition::FirstUp),
        (Some((true, _)), true) => None,
        (Some((false, _)), true) => Some(Transition::Up),
        (Some((false, old)), false) if old == reason => None,
        (_, false) => Some(Transition::Down),
    }
}

/// Checked-at time helper for tests and callers.
pub fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::TargetStatus;
    use std::time::Duration;

    fn target(name: &str, ready: bool, reason: &str) -> TargetStatus {
        TargetStatus {
            name: name.into(),
            address: format!("{name}:22"),
            ready,
            reason: reason.into(),
            message: if ready { String::new() } else { "boom".into() },
            latency: Duration::from_millis(42),
            details: Default::default(),
        }
    }

    fn result(t: i64, supported: bool, targets: Vec<TargetStatus>) -> CheckResult {
        CheckResult {
            provider: "kvm-home".into(),
            provider_type: "kvm".into(),
            supported,
            targets,
            checked_at: at(t),
        }
    }

    fn ready(s: &ProviderHealthStatus) -> (&str, &str, &str) {
        let c = &s.conditions[0];
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn status_table() {
        let up2 = vec![
            target("nas1", true, "Reachable"),
            target("nas2", true, "Reachable"),
        ];
        let s = build_status(None, &result(100, true, up2.clone()));
        assert_eq!(
            ready(&s),
            ("True", "AllTargetsReady", "2 of 2 targets ready")
        );
        assert_eq!(s.targets_ready.as_deref(), Some("2/2"));
        assert!(s.targets.iter().all(|t| t.last_transition_time == at(100)));
        assert_eq!(s.type_.as_deref(), Some("kvm"));
        assert_eq!(s.last_check_time, Some(at(100)));
        assert_eq!(s.targets[0].latency_millis, Some(42));
        assert_eq!(s.targets[0].message, None, "empty message omitted");

        let one_down = vec![
            target("nas1", true, "Reachable"),
            target("nas2", false, "Unreachable"),
        ];
        let s1 = build_status(None, &result(100, true, one_down));
        assert_eq!(
            ready(&s1),
            ("False", "TargetsNotReady", "nas2: Unreachable")
        );
        assert_eq!(s1.targets_ready.as_deref(), Some("1/2"));

        // Only a flip moves a target's transition time.
        let flipped = vec![
            target("nas1", true, "Reachable"),
            target("nas2", false, "Timeout"),
        ];
        let before = s.clone();
        let s2 = build_status(Some(&s), &result(200, true, flipped));
        assert_eq!(s, before, "building never mutates the previous status");
        assert_eq!(s2.targets[0].last_transition_time, at(100));
        assert_eq!(s2.targets[1].last_transition_time, at(200));
        assert_eq!(ready(&s2).2, "nas2: Timeout");
        assert_eq!(s2.conditions[0].last_transition_time, at(200));

        // The condition keeps its transition time across an unchanged round.
        let s3 = build_status(Some(&s), &result(300, true, up2));
        assert_eq!(s3.conditions[0].last_transition_time, at(100));
        assert_eq!(s3.last_check_time, Some(at(300)));

        let none = build_status(None, &result(100, false, vec![]));
        assert_eq!(
            ready(&none),
            (
                "Unknown",
                "ChecksNotImplemented",
                "kvm providers have no health check"
            )
        );
        assert_eq!(none.targets_ready, None);

        let empty = build_status(None, &result(100, true, vec![]));
        assert_eq!(
            ready(&empty),
            ("Unknown", "NoTargets", "the provider has nothing to check")
        );
        assert_eq!(empty.targets_ready.as_deref(), Some("0/0"));
    }

    #[test]
    fn messages_are_truncated_in_characters() {
        let mut t = target("nas1", false, "Unreachable");
        t.message = "é".repeat(3000);
        let s = build_status(None, &result(1, true, vec![t]));
        let m = s.targets[0].message.as_deref().unwrap();
        assert_eq!(m.chars().count(), 1024);
        assert!(m.ends_with('…'));
        assert_eq!(truncate(&"x".repeat(1024)), "x".repeat(1024));
        let long: Vec<TargetStatus> = (0..200)
            .map(|i| target(&format!("host-{i:03}"), false, "Unreachable"))
            .collect();
        let s = build_status(None, &result(1, true, long));
        assert_eq!(s.conditions[0].message.chars().count(), 1024);
    }

    #[test]
    fn transitions_table() {
        let mut seen = Seen::new();
        struct Round {
            name: &'static str,
            ready: bool,
            reason: &'static str,
            want: Option<Transition>,
        }
        let rounds = [
            Round {
                name: "first seen up",
                ready: true,
                reason: "Reachable",
                want: Some(Transition::FirstUp),
            },
            Round {
                name: "still up",
                ready: true,
                reason: "Reachable",
                want: None,
            },
            Round {
                name: "goes down",
                ready: false,
                reason: "Unreachable",
                want: Some(Transition::Down),
            },
            Round {
                name: "still down for the same reason",
                ready: false,
                reason: "Unreachable",
                want: None,
            },
            Round {
                name: "down for a new reason",
                ready: false,
                reason: "Timeout",
                want: Some(Transition::Down),
            },
            Round {
                name: "comes back up",
                ready: true,
                reason: "Reachable",
                want: Some(Transition::Up),
            },
        ];
        for r in rounds {
            assert_eq!(
                transition(&mut seen, "p", "t", r.ready, r.reason),
                r.want,
                "{}",
                r.name
            );
        }
        assert_eq!(
            transition(&mut seen, "p", "new", false, "Timeout"),
            Some(Transition::Down),
            "first seen down"
        );
    }
}
