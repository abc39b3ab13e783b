use super::super::end::{end, Ending};
use super::super::managed::{next_managed_step, ManagedInput};
use super::super::status::Health;
use super::super::tests::t;
use super::*;
use crate::api::ProxyPhase;
use crate::provider::InstanceState;

#[test]
fn replace_delay_table() {
    struct Case {
        name: &'static str,
        n: u32,
        want: Duration,
    }
    let s = Duration::from_secs;
    let cases = [
        Case {
            name: "no replacement",
            n: 0,
            want: s(0),
        },
        Case {
            name: "the first is replaced at once",
            n: 1,
            want: s(0),
        },
        Case {
            name: "the second waits 30 s",
            n: 2,
            want: s(30),
        },
        Case {
            name: "then it doubles",
            n: 3,
            want: s(60),
        },
        Case {
            name: "and doubles",
            n: 4,
            want: s(120),
        },
        Case {
            name: "the last below the cap",
            n: 7,
            want: s(960),
        },
        Case {
            name: "capped at 30 minutes",
            n: 8,
            want: s(1800),
        },
        Case {
            name: "a huge count stays capped",
            n: u32::MAX,
            want: s(1800),
        },
    ];
    for c in cases {
        assert_eq!(replace_delay(c.n), c.want, "{}", c.name);
    }
}

fn replaced(n: Option<i32>, last: Option<i64>) -> ProxyStatus {
    ProxyStatus {
        replacements: n,
        last_replaced_at: last.map(t),
        ..Default::default()
    }
}

#[test]
fn backoff_until_table() {
    struct Case {
        name: &'static str,
        status: ProxyStatus,
        want: Option<DateTime<Utc>>,
    }
    let cases = [
        Case {
            name: "never replaced",
            status: replaced(None, None),
            want: None,
        },
        Case {
            name: "one replacement holds nothing",
            status: replaced(Some(1), Some(0)),
            want: None,
        },
        Case {
            name: "the second waits 30 s from the last",
            status: replaced(Some(2), Some(100)),
            want: Some(t(130)),
        },
        Case {
            name: "the fifth waits 4 minutes",
            status: replaced(Some(5), Some(0)),
            want: Some(t(240)),
        },
        Case {
            name: "a count without a time holds nothing",
            status: replaced(Some(4), None),
            want: None,
        },
        Case {
            name: "a negative count (an edited status) holds nothing",
            status: replaced(Some(-3), Some(0)),
            want: None,
        },
    ];
    for c in cases {
        assert_eq!(backoff_until(&c.status), c.want, "{}", c.name);
    }
}

#[test]
fn died_table() {
    struct Case {
        name: &'static str,
        step: Step,
        delete_requested: bool,
        want: bool,
    }
    let stopped = |s| Step::Delete {
        why: ReplaceCause::Stopped(s),
    };
    let cases = [
        Case {
            name: "found terminated: its first delete counts",
            step: stopped(InstanceState::Terminated),
            delete_requested: false,
            want: true,
        },
        Case {
            name: "found stopped: counts",
            step: stopped(InstanceState::Stopped),
            delete_requested: false,
            want: true,
        },
        Case {
            name: "a delete resubmitted for the same death does not count again",
            step: stopped(InstanceState::Terminated),
            delete_requested: true,
            want: false,
        },
        Case {
            name: "a spec change is not a death",
            step: Step::Delete {
                why: ReplaceCause::SpecChanged,
            },
            delete_requested: false,
            want: false,
        },
        Case {
            name: "gone without a delete: it vanished",
            step: Step::ClearAndCreate,
            delete_requested: false,
            want: true,
        },
        Case {
            name: "gone after the operator's delete: already counted, or a spec change",
            step: Step::ClearAndCreate,
            delete_requested: true,
            want: false,
        },
        Case {
            name: "other steps",
            step: Step::Get,
            delete_requested: false,
            want: false,
        },
    ];
    for c in cases {
        let status = ProxyStatus {
            delete_requested_at: c.delete_requested.then(|| t(0)),
            ..Default::default()
        };
        assert_eq!(died(&c.step, &status), c.want, "{}", c.name);
    }
}

#[test]
fn note_counts_from_one() {
    let mut s = ProxyStatus::default();
    note(&mut s, t(5));
    assert_eq!((s.replacements, s.last_replaced_at), (Some(1), Some(t(5))));
    note(&mut s, t(9));
    assert_eq!((s.replacements, s.last_replaced_at), (Some(2), Some(t(9))));
    let mut odd = replaced(Some(-4), None);
    note(&mut odd, t(1));
    assert_eq!(odd.replacements, Some(1), "a bad count starts over at 1");
}

/// A Proxy whose instance has run since `since` (seconds), replaced `n` times.
fn running_since(since: i64, n: i32) -> ProxyStatus {
    let mut s = replaced(Some(n), Some(since - 5));
    s.provider_id = Some("i".into());
    end(
        Ending::Running {
            ip: "10.0.0.1".into(),
            health: Health::Unknown,
            recycle: None,
        },
        &mut s,
        t(since),
        Some(1),
    );
    s
}

/// `status` with the probe calling it unhealthy.
fn failing(mut status: ProxyStatus) -> ProxyStatus {
    condition::set(
        &mut status.conditions,
        crate::api::condition::Condition::new(
            HEALTHY,
            ConditionStatus::False,
            "ProbeFailed",
            "",
            t(0),
        ),
    );
    status
}

#[test]
fn only_a_failing_probe_makes_a_recycle_count_as_a_replacement() {
    assert!(unhealthy(&failing(ProxyStatus::default())));
    assert!(!unhealthy(&ProxyStatus::default()), "never probed");
    let mut healthy = failing(ProxyStatus::default());
    healthy.conditions[0].status = ConditionStatus::True;
    assert!(!unhealthy(&healthy));
}

#[test]
fn settle_running_table() {
    struct Case {
        name: &'static str,
        status: ProxyStatus,
        now: i64,
        want: Option<i32>,
    }
    let cases = [
        Case {
            name: "running 10 minutes ends the row",
            status: running_since(0, 3),
            now: 600,
            want: None,
        },
        Case {
            name: "running 9 minutes keeps it",
            status: running_since(0, 3),
            now: 540,
            want: Some(3),
        },
        Case {
            name: "running 10 minutes but failing its probe keeps it: no fresh start",
            status: failing(running_since(0, 3)),
            now: 10_000,
            want: Some(3),
        },
        Case {
            name: "not running keeps it",
            status: replaced(Some(2), Some(0)),
            now: 10_000,
            want: Some(2),
        },
    ];
    for c in cases {
        let mut s = c.status;
        settle_running(&mut s, t(c.now));
        assert_eq!(s.replacements, c.want, "{}", c.name);
        assert_eq!(s.last_replaced_at.is_some(), c.want.is_some(), "{}", c.name);
    }
}

#[test]
fn a_running_pass_resets_the_row_once_it_has_run_long_enough() {
    let mut s = running_since(0, 4);
    assert_eq!(
        s.replacements,
        Some(4),
        "the first running pass keeps the count"
    );
    end(
        Ending::Running {
            ip: "10.0.0.1".into(),
            health: Health::Unknown,
            recycle: None,
        },
        &mut s,
        t(601),
        Some(1),
    );
    assert_eq!((s.replacements, s.last_replaced_at), (None, None));
}

#[test]
fn the_managed_path_holds_a_re_create_until_the_backoff_ends() {
    struct Case {
        name: &'static str,
        status: ProxyStatus,
        now: i64,
        want: Step,
    }
    let cases = [
        Case {
            name: "a first create is never held",
            status: ProxyStatus::default(),
            now: 0,
            want: Step::Create { port: 3128 },
        },
        Case {
            name: "the first replacement is re-created at once",
            status: replaced(Some(1), Some(0)),
            now: 0,
            want: Step::Create { port: 3128 },
        },
        Case {
            name: "the third waits a minute",
            status: replaced(Some(3), Some(0)),
            now: 30,
            want: Step::Held(crate::controller::throttle::limiter::Held::ReplaceBackoff {
                until: t(60),
            }),
        },
        Case {
            name: "and goes when it is over",
            status: replaced(Some(3), Some(0)),
            now: 60,
            want: Step::Create { port: 3128 },
        },
    ];
    for c in cases {
        let input = ManagedInput {
            generation: Some(1),
            has_finalizer: true,
            status: &c.status,
            provider_configured: true,
            recorded_hash: Some("h"),
            spec_hash: Some("h"),
            get: None,
            now: t(c.now),
            startup_timeout: std::time::Duration::from_secs(900),
            port: Some(3128),
            gates: super::super::tests::open_gates(),
            side: &Default::default(),
        };
        assert_eq!(next_managed_step(&input), c.want, "{}", c.name);
    }
}

#[test]
fn the_backoff_status_says_how_often_and_when_next() {
    let mut s = replaced(Some(3), Some(0));
    s.phase = Some(ProxyPhase::Ready);
    mark_replace_backoff(&mut s, t(60), t(10), Some(2));
    assert_eq!(s.phase, Some(ProxyPhase::Provisioning));
    let c = condition::find(&s.conditions, PROVISIONED).unwrap();
    assert_eq!(
        (c.status, c.reason.as_str(), c.observed_generation),
        (ConditionStatus::False, "ReplaceBackoff", Some(2))
    );
    assert!(c.message.contains("3 times in a row"), "{}", c.message);
    assert!(c.message.contains(&at(t(0))), "{}", c.message);
    assert!(
        c.message
            .contains(&format!("next create is at {}", at(t(60)))),
        "{}",
        c.message
    );
}
