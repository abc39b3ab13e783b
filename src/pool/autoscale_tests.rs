use super::*;

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-05T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn policy(min: i32, max: i32) -> Policy {
    Policy {
        min,
        max,
        target: 80,
        stabilization: Duration::from_secs(60),
        to_zero_after: None,
    }
}

/// One pass `secs` after t0.
fn seen(secs: i64, replicas: i32, ready: i32, leased: i32, asked: u64, refused: u64) -> Seen {
    Seen {
        now: t0() + TimeDelta::seconds(secs),
        replicas,
        ready,
        leased,
        asked: Asked { asked, refused },
        max_step: 10,
    }
}

fn to(d: Option<Decision>) -> Option<(i32, &'static str)> {
    d.map(|d| (d.replicas, d.reason))
}

#[test]
fn the_policy_names_the_field_and_value_it_refuses() {
    let a = |min: Option<i32>, max: i32| Autoscale {
        min_replicas: min,
        max_replicas: max,
        ..Autoscale::default()
    };
    let p = Policy::of(&a(None, 6)).unwrap();
    assert_eq!((p.min, p.max, p.target), (1, 6, 80));
    assert_eq!(p.stabilization, DEFAULT_STABILIZATION);
    assert_eq!(p.to_zero_after, None);
    let cases = [
        (a(Some(7), 6), "spec.autoscale.minReplicas 7 exceeds maxReplicas 6"),
        (a(Some(-1), 6), "spec.autoscale.minReplicas -1 is not within 0..=1000"),
        (a(None, 0), "spec.autoscale.maxReplicas 0 is not within 1..=1000"),
        (
            Autoscale {
                target_utilization: Some(0),
                ..a(None, 6)
            },
            "spec.autoscale.targetUtilization 0 is not within 1..=100",
        ),
        (
            Autoscale {
                scale_down_stabilization: Some("soon".into()),
                ..a(None, 6)
            },
            "spec.autoscale.scaleDownStabilization \"soon\" is not a duration such as 30s, 5m or 1h",
        ),
        (
            Autoscale {
                scale_to_zero_after: Some("2d".into()),
                ..a(None, 6)
            },
            "spec.autoscale.scaleToZeroAfter \"2d\" is longer than 24h",
        ),
    ];
    for (spec, want) in cases {
        assert_eq!(Policy::of(&spec).unwrap_err(), want);
    }
}

#[test]
fn demand_grows_the_pool_by_bounded_steps_up_to_max_and_no_further() {
    let p = policy(1, 6);
    let mut h = History::default();
    // (seen, decision) in order; refusals are cumulative counts.
    let passes = [
        // One Proxy, leased, 39 crawlers refused: twice the Ready count.
        (seen(0, 1, 1, 1, 40, 39), Some((2, "Refusals"))),
        // The second one is not Ready yet: refusals go on, the Ready
        // supply is what doubles, so nothing more is asked for.
        (seen(2, 2, 1, 1, 80, 78), None),
        (seen(4, 2, 2, 2, 120, 116), Some((4, "Refusals"))),
        (seen(6, 4, 4, 4, 160, 152), Some((6, "Refusals"))),
        // At max: no further, however many are refused.
        (seen(8, 6, 6, 6, 200, 186), None),
        (seen(10, 6, 6, 6, 240, 220), None),
    ];
    for (i, (s, want)) in passes.into_iter().enumerate() {
        assert_eq!(to(decide(&p, &s, &mut h)), want, "pass {i}");
    }
}

#[test]
fn utilization_alone_grows_it_and_a_step_is_bounded_by_the_create_burst() {
    let p = policy(1, 100);
    let mut h = History::default();
    // 4 of 4 leased at 80%: 5 wanted.
    assert_eq!(
        to(decide(&p, &seen(0, 4, 4, 4, 0, 0), &mut h)),
        Some((5, "Demand"))
    );
    // 3 of 4 leased is under 80% of 4... 3 × 100 / 80 = 3.75: 4, kept.
    let mut h = History::default();
    assert_eq!(to(decide(&p, &seen(0, 4, 4, 3, 0, 0), &mut h)), None);
    // 40 of 40 leased wants 50; the burst is 10.
    let mut h = History::default();
    let d = decide(&p, &seen(0, 40, 40, 40, 0, 0), &mut h).unwrap();
    assert_eq!((d.replicas, d.reason), (50, "Demand"));
    assert_eq!(d.message, "40 of 40 Ready Proxies leased (target 80%)");
    let mut s = seen(0, 40, 40, 40, 0, 0);
    s.max_step = 3;
    let mut h = History::default();
    assert_eq!(to(decide(&p, &s, &mut h)), Some((43, "Demand")));
}

#[test]
fn it_shrinks_only_after_the_window_to_the_most_wanted_within_it() {
    let p = policy(1, 6);
    let mut h = History::default();
    let passes = [
        (seen(0, 6, 6, 6, 0, 0), None),
        // Crawlers stop: 0 leased wants 1, but 6 was wanted 10 s ago and
        // the window (60 s) has not passed since the first pass.
        (seen(10, 6, 6, 0, 0, 0), None),
        (seen(40, 6, 6, 0, 0, 0), None),
        // 3 leased again at 50 s: 4 wanted.
        (seen(50, 6, 6, 3, 0, 0), None),
        // At 65 s the window covers 5..65: the 6 at 0 s is out, 4 at 50 s
        // is the most wanted.
        (seen(65, 6, 6, 0, 0, 0), Some((4, "LowDemand"))),
        // At 111 s the 4 is out too: down to min.
        (seen(111, 4, 4, 0, 0, 0), Some((1, "LowDemand"))),
        (seen(120, 1, 1, 0, 0, 0), None),
    ];
    for (i, (s, want)) in passes.into_iter().enumerate() {
        assert_eq!(to(decide(&p, &s, &mut h)), want, "pass {i}");
    }
}

#[test]
fn a_new_leader_shrinks_nothing_before_a_whole_window_under_it() {
    let p = policy(1, 6);
    let mut h = History::default();
    assert_eq!(to(decide(&p, &seen(0, 6, 6, 0, 0, 0), &mut h)), None);
    assert_eq!(to(decide(&p, &seen(59, 6, 6, 0, 0, 0), &mut h)), None);
    assert_eq!(
        to(decide(&p, &seen(60, 6, 6, 0, 0, 0), &mut h)),
        Some((1, "LowDemand"))
    );
}

#[test]
fn an_idle_pool_goes_to_zero_and_an_acquire_brings_it_back() {
    let p = Policy {
        to_zero_after: Some(Duration::from_secs(30)),
        ..policy(2, 6)
    };
    let mut h = History::default();
    let passes = [
        (seen(0, 2, 2, 1, 5, 0), None),
        // No lease from 10 s on: idle counts from the last pass that saw
        // one (0 s).
        (seen(10, 2, 2, 0, 5, 0), None),
        (seen(29, 2, 2, 0, 5, 0), None),
        (seen(30, 2, 2, 0, 5, 0), Some((0, "Idle"))),
        // At zero, nothing asked: it stays there (minReplicas is for use).
        (seen(40, 0, 0, 0, 5, 0), None),
        (seen(90, 0, 0, 0, 5, 0), None),
        // An acquire named it: back to minReplicas.
        (seen(95, 0, 0, 0, 6, 1), Some((2, "Wake"))),
        // Coming up: the crawler retries, which is activity, not idling.
        (seen(100, 2, 0, 0, 9, 4), None),
        (seen(120, 2, 1, 1, 10, 4), None),
        (seen(131, 2, 2, 1, 10, 4), None),
    ];
    for (i, (s, want)) in passes.into_iter().enumerate() {
        assert_eq!(to(decide(&p, &s, &mut h)), want, "pass {i}");
    }
}

#[test]
fn sizes_outside_the_bounds_are_brought_inside() {
    let p = policy(2, 6);
    assert_eq!(
        to(decide(&p, &seen(0, 9, 9, 0, 0, 0), &mut History::default())),
        Some((6, "Bounds"))
    );
    assert_eq!(
        to(decide(&p, &seen(0, 1, 1, 0, 0, 0), &mut History::default())),
        Some((2, "Bounds"))
    );
    // Zero without scale-to-zero is below min too.
    assert_eq!(
        to(decide(&p, &seen(0, 0, 0, 0, 0, 0), &mut History::default())),
        Some((2, "Bounds"))
    );
    // minReplicas 0 without scale-to-zero: zero is a size like another.
    assert_eq!(
        to(decide(
            &policy(0, 6),
            &seen(0, 0, 0, 0, 0, 0),
            &mut History::default()
        )),
        None
    );
}

#[test]
fn counts_that_restart_count_as_nothing_new() {
    let p = policy(1, 6);
    let mut h = History::default();
    assert_eq!(
        to(decide(&p, &seen(0, 2, 2, 0, 100, 50), &mut h)),
        Some((4, "Refusals"))
    );
    // The registration restarted (counts from zero): no refusal is new.
    assert_eq!(to(decide(&p, &seen(2, 4, 4, 0, 1, 0), &mut h)), None);
    assert_eq!(
        to(decide(&p, &seen(4, 4, 4, 1, 3, 2), &mut h)),
        Some((6, "Refusals"))
    );
}

#[test]
fn a_pool_still_coming_up_is_not_idle() {
    let p = Policy {
        to_zero_after: Some(Duration::from_secs(30)),
        ..policy(1, 6)
    };
    let mut h = History::default();
    let passes = [
        (seen(0, 0, 0, 0, 1, 1), Some((1, "Wake"))),
        // Its first Proxy takes 60 s to become Ready: nobody could use it.
        (seen(30, 1, 0, 0, 1, 1), None),
        (seen(60, 1, 0, 0, 1, 1), None),
        (seen(70, 1, 1, 0, 1, 1), None),
        // Ready and unused for 30 s since the last pass without a Ready one.
        (seen(89, 1, 1, 0, 1, 1), None),
        (seen(90, 1, 1, 0, 1, 1), Some((0, "Idle"))),
    ];
    for (i, (s, want)) in passes.into_iter().enumerate() {
        assert_eq!(to(decide(&p, &s, &mut h)), want, "pass {i}");
    }
}
