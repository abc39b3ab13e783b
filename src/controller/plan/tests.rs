//! Fixtures shared by the plan's tests, and the tests of `mod.rs`.

use chrono::TimeZone;

use super::*;
use crate::api::ProxyStatus;
use crate::provider::{InstanceState, Op};

/// Every gate open: the breaker lets replaces go, the fleet says serve,
/// the create may go.
pub(super) fn open_gates() -> super::Gates {
    super::Gates {
        replace: Some(true),
        recycle: Some(crate::fleet::RecycleStep::Serve),
        create: Some(crate::controller::throttle::limiter::CreateGate::Go),
    }
}

/// `s` seconds after a fixed instant.
pub(super) fn t(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
}

pub(super) fn inst(state: InstanceState, ip: &str) -> Instance {
    Instance {
        ip: ip.into(),
        ..Instance::new("default/proxy-x", state)
    }
}

pub(super) fn status_with_id() -> ProxyStatus {
    ProxyStatus {
        provider_id: Some("default/proxy-x".into()),
        ..Default::default()
    }
}

/// Permanently failed at `generation`.
pub(super) fn latched(generation: i64) -> ProxyStatus {
    let mut s = ProxyStatus::default();
    status::mark_permanent(
        &mut s,
        "placement.zone \"x\" is unknown",
        t(0),
        Some(generation),
    );
    s
}

#[test]
fn path_table() {
    struct Case {
        name: &'static str,
        deleting: bool,
        mode: ProxyMode,
        want: Path,
    }
    let cases = [
        Case {
            name: "managed",
            deleting: false,
            mode: ProxyMode::Managed,
            want: Path::Managed,
        },
        Case {
            name: "external",
            deleting: false,
            mode: ProxyMode::External,
            want: Path::External,
        },
        Case {
            name: "a managed Proxy being deleted",
            deleting: true,
            mode: ProxyMode::Managed,
            want: Path::Delete,
        },
        Case {
            name: "an External Proxy being deleted",
            deleting: true,
            mode: ProxyMode::External,
            want: Path::Delete,
        },
    ];
    for c in cases {
        assert_eq!(path(c.deleting, c.mode), c.want, "{}", c.name);
    }
}

#[test]
fn get_outcome_table() {
    struct Case {
        name: &'static str,
        res: Result<Instance, ProviderError>,
        want: GetOutcome,
    }
    let err = |class| Err(ProviderError::new(class, Op::Get, "p", "id", "it broke"));
    let cases = [
        Case {
            name: "found",
            res: Ok(inst(InstanceState::Running, "10.0.0.1")),
            want: GetOutcome::Found(inst(InstanceState::Running, "10.0.0.1")),
        },
        Case {
            name: "not found is an answer",
            res: err(ErrorClass::NotFound),
            want: GetOutcome::NotFound,
        },
        Case {
            name: "transient keeps its class and plain message",
            res: err(ErrorClass::Transient),
            want: GetOutcome::Failed(ErrorClass::Transient, "it broke".into()),
        },
        Case {
            name: "permanent",
            res: err(ErrorClass::Permanent),
            want: GetOutcome::Failed(ErrorClass::Permanent, "it broke".into()),
        },
        Case {
            name: "an asynchronous create's failure, reported by get, is the create's",
            res: Err(ProviderError::new(
                ErrorClass::Permanent,
                Op::Create,
                "p",
                "id",
                "it broke",
            )),
            want: GetOutcome::CreateFailed(ErrorClass::Permanent, "it broke".into()),
        },
    ];
    for c in cases {
        let got = GetOutcome::of(c.res);
        match (&got, &c.want) {
            (GetOutcome::Failed(gc, gm), GetOutcome::Failed(wc, wm))
            | (GetOutcome::CreateFailed(gc, gm), GetOutcome::CreateFailed(wc, wm)) => {
                assert_eq!(gc, wc, "{}", c.name);
                assert!(gm.contains(wm.as_str()), "{}: {gm}", c.name);
            }
            _ => assert_eq!(got, c.want, "{}", c.name),
        }
    }
}

#[test]
fn an_observation_answers_only_for_the_incarnation_it_can_have_seen() {
    let running = inst(InstanceState::Running, "10.0.0.1");
    let listed = |at| Observation::Listed {
        instance: running.clone(),
        listed_at: t(at),
    };
    let provisioned = |s, at| {
        Some(crate::api::Condition::new(
            PROVISIONED,
            s,
            "Reason",
            "",
            t(at),
        ))
    };
    let found = Some(GetOutcome::Found(running.clone()));
    let cases = [
        (
            "a watch's instance: no get",
            Observation::Current(running.clone()),
            None,
            found.clone(),
        ),
        ("unknown: ask get", Observation::Unknown, None, None),
        (
            "listed after the instance turned Running",
            listed(10),
            provisioned(ConditionStatus::True, 5),
            found.clone(),
        ),
        (
            "listed before it turned Running: maybe the old incarnation",
            listed(5),
            provisioned(ConditionStatus::True, 5),
            None,
        ),
        (
            "not running (provisioning, replacing): ask get",
            listed(10),
            provisioned(ConditionStatus::False, 5),
            None,
        ),
        ("never provisioned", listed(10), None, None),
    ];
    for (name, observed, condition, want) in cases {
        let status = ProxyStatus {
            conditions: condition.into_iter().collect(),
            ..Default::default()
        };
        assert_eq!(GetOutcome::observed(observed, &status), want, "{name}");
    }
    // A delete this Proxy requested: only a listing started after it.
    for (name, requested, want) in [
        ("delete requested after the listing", 12, None),
        ("delete requested before the listing", 8, found.clone()),
    ] {
        let status = ProxyStatus {
            conditions: provisioned(ConditionStatus::True, 5).into_iter().collect(),
            delete_requested_at: Some(t(requested)),
            ..Default::default()
        };
        assert_eq!(GetOutcome::observed(listed(10), &status), want, "{name}");
    }
}

#[test]
fn resubmission_window_table() {
    use crate::provider::InstanceState::{Provisioning, Running, Stopped, Terminated};
    // (case, requested at (s, now is 0), the instance's state, wait)
    let cases = [
        ("never requested", None, Running, false),
        ("just now", Some(0), Running, true),
        ("59s ago", Some(-59), Running, true),
        (
            "60s ago, still running: resubmit",
            Some(-60),
            Running,
            false,
        ),
        (
            "60s ago, still provisioning: resubmit",
            Some(-60),
            Provisioning,
            false,
        ),
        (
            "60s ago, stopping: the delete goes on",
            Some(-60),
            Stopped,
            true,
        ),
        (
            "14 min ago, terminated: the delete goes on",
            Some(-14 * 60),
            Terminated,
            true,
        ),
        (
            "15 min ago, still going: resubmit, it may be lost",
            Some(-15 * 60),
            Stopped,
            false,
        ),
        (
            "in the future (clock skew) counts as recent",
            Some(30),
            Running,
            true,
        ),
    ];
    for (name, at, state, want) in cases {
        assert_eq!(delete_pending(at.map(t), state, t(0)), want, "{name}");
    }
}
