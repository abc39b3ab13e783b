use super::*;
use crate::fleet::DrainDone;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

#[test]
fn after_running_table() {
    struct Case {
        name: &'static str,
        step: RecycleStep,
        want: End,
        draining: bool,
        outdated: bool,
    }
    let s = Duration::from_secs;
    let cases = [
        Case {
            name: "serving: the running resync, nothing recorded",
            step: RecycleStep::Serve,
            want: End::RequeueAfter(RUNNING_RESYNC),
            draining: false,
            outdated: false,
        },
        Case {
            name: "a drain starts: recorded, looked at again soon",
            step: RecycleStep::StartDrain,
            want: End::RequeueAfter(s(5)),
            draining: true,
            outdated: false,
        },
        Case {
            name: "draining: back when the leases can have run out",
            step: RecycleStep::Drain { until: at(40) },
            want: End::RequeueAfter(s(30)),
            draining: false,
            outdated: false,
        },
        Case {
            name: "draining long: at most the running resync",
            step: RecycleStep::Drain { until: at(4000) },
            want: End::RequeueAfter(RUNNING_RESYNC),
            draining: false,
            outdated: false,
        },
        Case {
            name: "a surge starts: recorded (not a drain), looked at again at once",
            step: RecycleStep::StartSurge,
            want: End::RequeueAfter(s(1)),
            draining: false,
            outdated: true,
        },
        Case {
            name: "drained but the breaker is open: back after the circuit retry",
            step: RecycleStep::HoldCircuitOpen,
            want: End::RequeueAfter(CIRCUIT_RETRY),
            draining: false,
            outdated: false,
        },
        Case {
            name: "replace is not decided here",
            step: RecycleStep::Replace(DrainDone::NoLeases),
            want: End::RequeueAfter(RUNNING_RESYNC),
            draining: false,
            outdated: false,
        },
        Case {
            name: "outdated, waiting for the budget: marked, asks again soon",
            step: RecycleStep::Serve,
            want: End::RequeueAfter(OUTDATED_RETRY),
            draining: false,
            outdated: true,
        },
        Case {
            name: "outdated, its drain starts: marked and recorded",
            step: RecycleStep::StartDrain,
            want: End::RequeueAfter(s(5)),
            draining: true,
            outdated: true,
        },
    ];
    for c in cases {
        let mut status = ProxyStatus::default();
        let recycle = Recycle {
            step: c.step,
            outdated: c.outdated,
            spec_port: Some(3128),
            asked: None,
        };
        let got = after_running(
            recycle,
            &mut status,
            End::RequeueAfter(RUNNING_RESYNC),
            at(10),
        );
        assert_eq!(got, c.want, "{}", c.name);
        assert_eq!(status.draining_since.is_some(), c.draining, "{}", c.name);
        let recycling = condition::find(&status.conditions, RECYCLING).map(|c| c.reason.clone());
        let want = match c.step {
            RecycleStep::StartSurge => Some(crate::api::proxy::conditions::REASON_SURGING),
            _ => c.draining.then_some(REASON_DRAINING),
        };
        assert_eq!(recycling.as_deref(), want, "{}", c.name);
        assert_eq!(
            status.surge.is_some(),
            c.step == RecycleStep::StartSurge,
            "{}",
            c.name
        );
        let up_to_date = condition::find(&status.conditions, UP_TO_DATE);
        assert_eq!(
            up_to_date.map(|c| (c.status, c.reason.as_str())),
            c.outdated
                .then_some((ConditionStatus::False, REASON_SPEC_CHANGED)),
            "{}",
            c.name
        );
    }
    // Up to date again (or replaced): the mark goes.
    let mut status = ProxyStatus::default();
    mark_outdated(&mut status, (true, Some(3129)), at(1));
    assert_eq!(
        status.port, None,
        "an outdated instance's port is not the spec's"
    );
    mark_outdated(&mut status, (false, Some(3128)), at(2));
    assert!(condition::find(&status.conditions, UP_TO_DATE).is_none());
    assert_eq!(
        status.port,
        Some(3128),
        "an older version's instance serves on the spec's port"
    );
    mark_outdated(&mut status, (false, Some(3129)), at(2));
    assert_eq!(status.port, Some(3128), "a recorded port is kept");
    mark_outdated(&mut status, (true, Some(3129)), at(3));
    clear_drain(&mut status);
    assert!(condition::find(&status.conditions, UP_TO_DATE).is_none());
}

#[test]
fn circuit_open_and_clear_drain() {
    let mut status = ProxyStatus {
        phase: Some(ProxyPhase::Ready),
        ..ProxyStatus::default()
    };
    mark_draining(&mut status, at(0));
    mark_draining(&mut status, at(50));
    assert_eq!(
        status.draining_since,
        Some(at(0)),
        "the drain start is kept"
    );
    mark_circuit_open(&mut status, at(60), Some(3));
    assert_eq!(status.phase, Some(ProxyPhase::Provisioning));
    let p = condition::find(&status.conditions, PROVISIONED).expect("Provisioned");
    assert_eq!(
        (p.status, p.reason.as_str()),
        (ConditionStatus::False, REASON_CIRCUIT_OPEN)
    );
    clear_drain(&mut status);
    assert_eq!(status.draining_since, None);
    assert!(condition::find(&status.conditions, RECYCLING).is_none());
}
