use super::*;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

#[test]
fn hold_after_table() {
    struct Case {
        name: &'static str,
        op: Op,
        class: ErrorClass,
        end: End,
        want: Option<CreateHold>,
    }
    let retry = End::RequeueAfter(Duration::from_secs(270));
    let cases = [
        Case {
            name: "a create refused for quota holds creates until its requeue",
            op: Op::Create,
            class: ErrorClass::QuotaExceeded,
            end: retry,
            want: Some(CreateHold {
                generation: Some(3),
                until: at(270),
            }),
        },
        Case {
            name: "a get refused for quota holds no create",
            op: Op::Get,
            class: ErrorClass::QuotaExceeded,
            end: retry,
            want: None,
        },
        Case {
            name: "a create refused as unavailable (401, 403) holds until its slow retry",
            op: Op::Create,
            class: ErrorClass::Unavailable,
            end: retry,
            want: Some(CreateHold {
                generation: Some(3),
                until: at(270),
            }),
        },
        Case {
            name: "a delete refused as unavailable holds no create",
            op: Op::Delete,
            class: ErrorClass::Unavailable,
            end: retry,
            want: None,
        },
        Case {
            name: "a permanent create latches: nothing to hold",
            op: Op::Create,
            class: ErrorClass::Permanent,
            end: End::AwaitChange,
            want: None,
        },
        Case {
            name: "a vanished instance goes to the backoff, no hold",
            op: Op::Create,
            class: ErrorClass::NotFound,
            end: retry,
            want: None,
        },
        Case {
            name: "a transient failure goes to the backoff, no hold",
            op: Op::Create,
            class: ErrorClass::Transient,
            end: retry,
            want: None,
        },
        Case {
            name: "no requeue, nothing to hold for",
            op: Op::Create,
            class: ErrorClass::QuotaExceeded,
            end: End::AwaitChange,
            want: None,
        },
    ];
    for c in cases {
        let failure = Failure {
            op: c.op,
            class: c.class,
            message: "rate limit exceeded",
        };
        assert_eq!(
            hold_after(&failure, Some(3), c.end, at(0)),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn waiting_table() {
    struct Case {
        name: &'static str,
        hold: Option<CreateHold>,
        generation: Option<i64>,
        now: i64,
        want: Option<Duration>,
    }
    let hold = Some(CreateHold {
        generation: Some(2),
        until: at(300),
    });
    let cases = [
        Case {
            name: "no hold: the create goes",
            hold: None,
            generation: Some(2),
            now: 0,
            want: None,
        },
        Case {
            name: "a pass started by its own status write waits the rest",
            hold,
            generation: Some(2),
            now: 1,
            want: Some(Duration::from_secs(299)),
        },
        Case {
            name: "a second before the end: still waits",
            hold,
            generation: Some(2),
            now: 299,
            want: Some(Duration::from_secs(1)),
        },
        Case {
            name: "the hold is over: the create goes",
            hold,
            generation: Some(2),
            now: 300,
            want: None,
        },
        Case {
            name: "the spec changed: the create goes at once",
            hold,
            generation: Some(3),
            now: 1,
            want: None,
        },
    ];
    for c in cases {
        assert_eq!(
            waiting(c.hold, c.generation, at(c.now)),
            c.want,
            "{}",
            c.name
        );
    }
}
