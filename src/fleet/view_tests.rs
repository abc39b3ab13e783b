use std::time::Duration;

use super::*;
use crate::api::{Condition, ProxySpec, ProxyStatus, RecycleSpec};

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

fn s(i: usize, ready: bool, draining: bool, wants: Option<RecycleReason>) -> Summary {
    Summary {
        key: format!("ns/p{i}"),
        provider: "k".into(),
        ready,
        replacing: false,
        draining,
        surging: false,
        wants,
        created_at: Some(at(i as i64)),
    }
}

const AGE: Option<RecycleReason> = Some(RecycleReason::MaxAge);

#[test]
fn refresh_table() {
    struct Case {
        name: &'static str,
        budget: MaxUnavailable,
        /// Observed first (a healthy baseline), then `now`.
        before: Vec<Summary>,
        now: Vec<Summary>,
        want_admitted: Vec<usize>,
        want_open: bool,
    }
    let all_ready = |n| (0..n).map(|i| s(i, true, false, None)).collect::<Vec<_>>();
    let cases = [
        Case {
            name: "ten due for age, budget 2: the two oldest start",
            budget: MaxUnavailable::Count(2),
            before: all_ready(10),
            now: (0..10).map(|i| s(i, true, false, AGE)).collect(),
            want_admitted: vec![0, 1],
            want_open: false,
        },
        Case {
            name: "two already draining use the budget: none start",
            budget: MaxUnavailable::Count(2),
            before: all_ready(10),
            now: (0..10).map(|i| s(i, i >= 2, i < 2, AGE)).collect(),
            want_admitted: vec![],
            want_open: false,
        },
        Case {
            name: "recycled proxies going down do not trip the breaker",
            budget: MaxUnavailable::Percent(60),
            before: all_ready(5),
            now: (0..5).map(|i| s(i, i >= 3, i < 3, None)).collect(),
            want_admitted: vec![],
            want_open: false,
        },
        Case {
            name: "80% failing opens the breaker and blocks even unhealthy recycling",
            budget: MaxUnavailable::Count(5),
            before: all_ready(10),
            now: (0..10)
                .map(|i| {
                    if i < 8 {
                        s(i, false, false, Some(RecycleReason::Unhealthy))
                    } else {
                        s(i, true, false, None)
                    }
                })
                .collect(),
            want_admitted: vec![],
            want_open: true,
        },
        Case {
            name: "one unhealthy of ten is recycled under the default budget",
            budget: MaxUnavailable::default(),
            before: all_ready(10),
            now: (0..10)
                .map(|i| {
                    if i == 3 {
                        s(i, false, false, Some(RecycleReason::Unhealthy))
                    } else {
                        s(i, true, false, None)
                    }
                })
                .collect(),
            want_admitted: vec![3],
            want_open: false,
        },
    ];
    for c in cases {
        let mut f = FleetState::new(
            BreakerPolicy::default(),
            BTreeMap::from([("k".to_string(), c.budget)]),
        );
        f.refresh(at(0), &c.before);
        f.refresh(at(10), &c.now);
        let admitted: Vec<usize> = (0..c.now.len())
            .filter(|i| f.admitted("k", &format!("ns/p{i}")))
            .collect();
        assert_eq!(admitted, c.want_admitted, "{}", c.name);
        assert_eq!(f.breaker_open("k"), c.want_open, "{}: open", c.name);
    }
}

#[test]
fn surge_admission_table() {
    let spec = Some(RecycleReason::SpecChanged);
    let unhealthy = Some(RecycleReason::Unhealthy);
    let asked = Some(RecycleReason::Requested);
    struct Case {
        name: &'static str,
        surge: MaxUnavailable,
        now: Vec<Summary>,
        want_surge: Vec<usize>,
        want_drain: Vec<usize>,
    }
    let surging = |i| Summary {
        surging: true,
        ..s(i, true, false, spec)
    };
    let cases = [
        Case {
            name: "no maxSurge: the spec change drains, within maxUnavailable",
            surge: MaxUnavailable::Count(0),
            now: (0..10).map(|i| s(i, true, false, spec)).collect(),
            want_surge: vec![],
            want_drain: vec![0, 1],
        },
        Case {
            name: "maxSurge 2: the two oldest surge, none drains",
            surge: MaxUnavailable::Count(2),
            now: (0..10).map(|i| s(i, true, false, spec)).collect(),
            want_surge: vec![0, 1],
            want_drain: vec![],
        },
        Case {
            name: "two surging use maxSurge: the rest wait, none drains",
            surge: MaxUnavailable::Count(2),
            now: (0..10)
                .map(|i| {
                    if i < 2 {
                        surging(i)
                    } else {
                        s(i, true, false, spec)
                    }
                })
                .collect(),
            want_surge: vec![],
            want_drain: vec![],
        },
        Case {
            name: "a percent of the fleet, rounded up",
            surge: MaxUnavailable::Percent(25),
            now: (0..10).map(|i| s(i, true, false, AGE)).collect(),
            want_surge: vec![0, 1, 2],
            want_drain: vec![],
        },
        Case {
            name: "an unhealthy one and one asked to be replaced drain; the changed one surges",
            surge: MaxUnavailable::Count(2),
            now: vec![
                s(0, false, false, unhealthy),
                s(1, true, false, asked),
                s(2, true, false, spec),
            ],
            want_surge: vec![2],
            want_drain: vec![0, 1],
        },
        Case {
            name: "a changed one that serves nothing drains: a surge would not keep anything Ready",
            surge: MaxUnavailable::Count(2),
            now: vec![s(0, false, false, spec), s(1, true, false, spec)],
            want_surge: vec![1],
            want_drain: vec![0],
        },
    ];
    for c in cases {
        let mut f = FleetState::new(
            BreakerPolicy::default(),
            BTreeMap::from([("k".to_string(), MaxUnavailable::Count(2))]),
        )
        .with_surges(BTreeMap::from([("k".to_string(), c.surge)]));
        f.refresh(at(0), &c.now);
        let pick = |admitted: &dyn Fn(&str) -> bool| -> Vec<usize> {
            (0..c.now.len())
                .filter(|i| admitted(&format!("ns/p{i}")))
                .collect()
        };
        assert_eq!(
            pick(&|k| f.surge_admitted("k", k)),
            c.want_surge,
            "{}: surge",
            c.name
        );
        assert_eq!(
            pick(&|k| f.admitted("k", k)),
            c.want_drain,
            "{}: drain",
            c.name
        );
    }
}

#[test]
fn surge_step_table() {
    let drain = |since: Option<i64>| DrainInput {
        draining_since: since.map(at),
        leases_end: None,
        timeout: Duration::from_secs(600),
        now: at(10),
    };
    let step = recycle_step_with_surge;
    assert_eq!(
        step(false, true, false, &drain(None)),
        RecycleStep::StartSurge
    );
    assert_eq!(
        step(false, true, true, &drain(None)),
        RecycleStep::Serve,
        "breaker open"
    );
    assert_eq!(
        step(false, true, false, &drain(Some(0))),
        RecycleStep::Replace(DrainDone::NoLeases),
        "a drain already running goes on"
    );
    assert_eq!(
        step(true, false, false, &drain(None)),
        RecycleStep::StartDrain
    );
    assert_eq!(step(false, false, false, &drain(None)), RecycleStep::Serve);
}

#[test]
fn breaker_reports_open_then_closed_and_reset() {
    let mut f = FleetState::new(BreakerPolicy::default(), BTreeMap::new());
    let fleet = |bad: usize| {
        (0..5)
            .map(|i| s(i, i >= bad, false, None))
            .collect::<Vec<_>>()
    };
    assert_eq!(f.refresh(at(0), &fleet(0)), vec![]);
    assert_eq!(
        f.refresh(at(1), &fleet(4)),
        vec![("k".to_string(), Transition::Opened { lost: 4, seen: 5 })]
    );
    assert_eq!(f.open_since("k"), Some((at(1), 4, 5)));
    assert_eq!(f.open_providers(), vec!["k".to_string()]);
    assert_eq!(f.reset("k"), Some(Transition::Reset));
    assert!(!f.breaker_open("k"));
    assert_eq!(f.refresh(at(2), &fleet(4)), vec![], "lost before the reset");
    assert_eq!(f.reset("nowhere"), None);
}

#[test]
fn recycle_step_table() {
    struct Case {
        name: &'static str,
        admitted: bool,
        open: bool,
        since: Option<i64>,
        leases_end: Option<i64>,
        now: i64,
        want: RecycleStep,
    }
    let cases = [
        Case {
            name: "not chosen: serve",
            admitted: false,
            open: false,
            since: None,
            leases_end: None,
            now: 0,
            want: RecycleStep::Serve,
        },
        Case {
            name: "chosen: drain first, never replace at once",
            admitted: true,
            open: false,
            since: None,
            leases_end: None,
            now: 0,
            want: RecycleStep::StartDrain,
        },
        Case {
            name: "chosen but the breaker is open: serve",
            admitted: true,
            open: true,
            since: None,
            leases_end: None,
            now: 0,
            want: RecycleStep::Serve,
        },
        Case {
            name: "draining with a lease held: wait for it",
            admitted: false,
            open: false,
            since: Some(0),
            leases_end: Some(300),
            now: 10,
            want: RecycleStep::Drain { until: at(300) },
        },
        Case {
            name: "drained: replace",
            admitted: false,
            open: false,
            since: Some(0),
            leases_end: Some(300),
            now: 300,
            want: RecycleStep::Replace(DrainDone::LeasesExpired),
        },
        Case {
            name: "drained but the breaker opened meanwhile: hold",
            admitted: false,
            open: true,
            since: Some(0),
            leases_end: Some(300),
            now: 300,
            want: RecycleStep::HoldCircuitOpen,
        },
    ];
    for c in cases {
        let drain = DrainInput {
            draining_since: c.since.map(at),
            leases_end: c.leases_end.map(at),
            timeout: Duration::from_secs(600),
            now: at(c.now),
        };
        assert_eq!(
            recycle_step(c.admitted, c.open, &drain),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn summarize_reads_age_and_health_from_the_conditions() {
    let mut p = Proxy::new(
        "p",
        ProxySpec {
            provider: Some("k".into()),
            port: Some(3128),
            recycle: Some(RecycleSpec {
                max_age: Some("1h".into()),
                ..RecycleSpec::default()
            }),
            ..ProxySpec::default()
        },
    );
    p.metadata.namespace = Some("ns".into());
    p.status = Some(ProxyStatus {
        phase: Some(ProxyPhase::Ready),
        conditions: vec![
            Condition::new(
                PROVISIONED,
                ConditionStatus::True,
                "InstanceRunning",
                "",
                at(0),
            ),
            Condition::new(HEALTHY, ConditionStatus::True, "ProbeSucceeded", "", at(5)),
        ],
        ..ProxyStatus::default()
    });
    let young = summarize(&p, at(3599)).expect("a Managed Proxy");
    assert_eq!(young.wants, None);
    assert!(young.ready && !young.draining);
    assert_eq!(young.created_at, Some(at(0)));
    let old = summarize(&p, at(3600)).expect("a Managed Proxy");
    assert_eq!(old.wants, AGE);
    assert_eq!(old.key, "ns/p");

    // A changed spec the reconcile marked: replaced before age, after health.
    let st = p.status.as_mut().unwrap();
    st.conditions.push(Condition::new(
        UP_TO_DATE,
        ConditionStatus::False,
        "SpecChanged",
        "",
        at(10),
    ));
    let changed = summarize(&p, at(3600)).expect("a Managed Proxy");
    assert_eq!(changed.wants, Some(RecycleReason::SpecChanged));
    assert_eq!(
        summarize(&p, at(20)).unwrap().wants,
        Some(RecycleReason::SpecChanged),
        "young, and changed"
    );
    let st = p.status.as_mut().unwrap();
    st.conditions.retain(|c| c.type_ != HEALTHY);
    st.conditions.push(Condition::new(
        HEALTHY,
        ConditionStatus::False,
        "ProbeFailed",
        "",
        at(5),
    ));
    p.spec.recycle.as_mut().unwrap().unhealthy_for = Some("1m".into());
    assert_eq!(
        summarize(&p, at(3600)).unwrap().wants,
        Some(RecycleReason::Unhealthy)
    );

    p.spec.mode = ProxyMode::External;
    assert_eq!(
        summarize(&p, at(3600)),
        None,
        "External Proxies are not recycled"
    );
}

#[test]
fn each_provider_trips_by_its_own_policy_and_reports_it() {
    struct Case {
        name: &'static str,
        /// Of five Ready proxies, how many turn not Ready.
        lost: usize,
        policy: Option<BreakerPolicy>,
        want: super::super::breaker::Report,
    }
    let strict = BreakerPolicy {
        threshold_percent: 20,
        window: Duration::from_secs(60),
        min_fleet: 2,
    };
    let report = |open_since: Option<i64>, lost, policy| super::super::breaker::Report {
        open_since: open_since.map(at),
        lost,
        seen: 5,
        policy,
    };
    let cases = [
        Case {
            name: "the default: 2 of 5 is not more than 50%",
            lost: 2,
            policy: None,
            want: report(None, 2, BreakerPolicy::default()),
        },
        Case {
            name: "the provider's 20%: 2 of 5 opens it",
            lost: 2,
            policy: Some(strict),
            want: report(Some(10), 2, strict),
        },
        Case {
            name: "the provider's 20%: 1 of 5 is not more",
            lost: 1,
            policy: Some(strict),
            want: report(None, 1, strict),
        },
    ];
    for c in cases {
        let f = FleetState::new(BreakerPolicy::default(), BTreeMap::new());
        let mut f = match c.policy {
            Some(p) => f.with_breaker_policies(BTreeMap::from([("k".to_string(), p)])),
            None => f,
        };
        let fleet = |bad: usize| {
            (0..5)
                .map(|i| s(i, i >= bad, false, None))
                .collect::<Vec<_>>()
        };
        f.refresh(at(0), &fleet(0));
        f.refresh(at(10), &fleet(c.lost));
        assert_eq!(f.report("k"), c.want, "{}", c.name);
        assert_eq!(
            f.breaker_open("k"),
            c.want.open_since.is_some(),
            "{}",
            c.name
        );
    }
    // A provider not seen yet reports closed under its own policy.
    let f = FleetState::new(BreakerPolicy::default(), BTreeMap::new())
        .with_breaker_policies(BTreeMap::from([("k".to_string(), strict)]));
    assert_eq!(f.report("k"), super::super::breaker::Report::closed(strict));
}

#[test]
fn mark_replacing_table() {
    struct Case {
        name: &'static str,
        /// (index, ready in the cache)
        cache: Vec<(usize, bool)>,
        /// (index, marked this many seconds before now)
        marks: Vec<(usize, i64)>,
        want_ready: Vec<bool>,
        want_kept: Vec<usize>,
    }
    let cases = vec![
        Case {
            name: "no marks: the cache as it is",
            cache: vec![(0, true), (1, false)],
            marks: vec![],
            want_ready: vec![true, false],
            want_kept: vec![],
        },
        Case {
            name: "marked, the cache still Ready: not Ready, mark kept",
            cache: vec![(0, true), (1, true)],
            marks: vec![(1, 0)],
            want_ready: vec![true, false],
            want_kept: vec![1],
        },
        Case {
            name: "marked, the cache caught up: mark dropped",
            cache: vec![(0, true), (1, false)],
            marks: vec![(1, 5)],
            want_ready: vec![true, false],
            want_kept: vec![],
        },
        Case {
            name: "marked longer than the hold ago: the cache wins",
            cache: vec![(0, true), (1, true)],
            marks: vec![(1, 60)],
            want_ready: vec![true, true],
            want_kept: vec![],
        },
        Case {
            name: "a mark of a Proxy gone from the cache is dropped",
            cache: vec![(0, true)],
            marks: vec![(3, 0)],
            want_ready: vec![true],
            want_kept: vec![],
        },
    ];
    for c in cases {
        let mut summaries: Vec<Summary> = c
            .cache
            .iter()
            .map(|(i, r)| s(*i, *r, false, None))
            .collect();
        let mut marks: BTreeMap<String, DateTime<Utc>> = c
            .marks
            .iter()
            .map(|(i, ago)| (format!("ns/p{i}"), at(100 - ago)))
            .collect();
        mark_replacing(
            &mut summaries,
            &mut marks,
            at(100),
            chrono::Duration::seconds(60),
        );
        let ready: Vec<bool> = summaries.iter().map(Summary::serving).collect();
        assert_eq!(ready, c.want_ready, "{}", c.name);
        let kept: Vec<String> = c.want_kept.iter().map(|i| format!("ns/p{i}")).collect();
        assert_eq!(
            marks.keys().cloned().collect::<Vec<_>>(),
            kept,
            "{}",
            c.name
        );
    }
}

/// Four of five Proxies fail within one second, before the cache shows
/// any of them not Ready: each replace marked before the gate is counted,
/// so the first two (40%) may be replaced and the third opens the breaker
/// (threshold 50%).
#[test]
fn replaces_marked_before_the_cache_catches_up_open_the_breaker() {
    let mut state = FleetState::new(BreakerPolicy::default(), BTreeMap::new());
    let ready: Vec<Summary> = (0..5).map(|i| s(i, true, false, None)).collect();
    state.refresh(at(0), &ready);
    let allowed = replaces_allowed(&mut state, &[1, 2, 3, 4]);
    assert_eq!(allowed, vec![true, true, false, false]);
}

/// Asks, one after another within the same second, to replace the Proxies
/// `order` of five all shown Ready (none yet shown otherwise by the cache):
/// whether the breaker let each go.
fn replaces_allowed(state: &mut FleetState, order: &[usize]) -> Vec<bool> {
    let ready: Vec<Summary> = (0..5).map(|i| s(i, true, false, None)).collect();
    let mut marks = BTreeMap::new();
    let mut allowed = Vec::new();
    for i in order {
        marks.insert(format!("ns/p{i}"), at(1));
        let mut view = ready.clone();
        mark_replacing(&mut view, &mut marks, at(1), chrono::Duration::seconds(60));
        state.refresh(at(1), &view);
        allowed.push(!state.breaker_open("k"));
    }
    allowed
}

/// The fifth Proxy turned Ready within the second before the outage, so
/// no view has seen it Ready yet when its replace is asked for: it still
/// counts as seen and lost, and the share is of all five (the first two
/// may go, the third opens the breaker), not of the four seen before.
#[test]
fn a_replace_counts_a_proxy_no_view_has_seen_ready_yet() {
    let mut state = FleetState::new(BreakerPolicy::default(), BTreeMap::new());
    let before: Vec<Summary> = (0..5).map(|i| s(i, i != 4, false, None)).collect();
    state.refresh(at(0), &before);
    let allowed = replaces_allowed(&mut state, &[4, 3, 2, 1]);
    assert_eq!(allowed, vec![true, true, false, false]);
    assert_eq!(state.report("k").seen, 5);
}
