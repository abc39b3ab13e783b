use super::*;

#[test]
fn jitter_bounds_table() {
    struct Case {
        name: &'static str,
        delay: Duration,
        unit: f64,
        want: Duration,
    }
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    let cases = [
        Case {
            name: "no spread at 0",
            delay: s(60),
            unit: 0.0,
            want: s(60),
        },
        Case {
            name: "half way",
            delay: s(60),
            unit: 0.5,
            want: s(54),
        },
        Case {
            name: "the whole share at 1",
            delay: s(60),
            unit: 1.0,
            want: s(48),
        },
        Case {
            name: "above 1 is clamped",
            delay: s(300),
            unit: 7.0,
            want: s(240),
        },
        Case {
            name: "below 0 is clamped",
            delay: s(300),
            unit: -1.0,
            want: s(300),
        },
        Case {
            name: "NaN counts as 0",
            delay: s(10),
            unit: f64::NAN,
            want: s(10),
        },
        Case {
            name: "milliseconds",
            delay: ms(5),
            unit: 1.0,
            want: ms(4),
        },
        Case {
            name: "zero stays zero",
            delay: Duration::ZERO,
            unit: 0.3,
            want: Duration::ZERO,
        },
    ];
    for c in cases {
        assert_eq!(jitter(c.delay, c.unit), c.want, "{}", c.name);
    }
}

#[test]
fn system_random_stays_in_range_and_varies() {
    let r = SystemRandom;
    let draws: Vec<f64> = (0..200).map(|_| r.unit()).collect();
    assert!(draws.iter().all(|u| (0.0..1.0).contains(u)), "{draws:?}");
    let first = draws[0];
    assert!(draws.iter().any(|u| *u != first), "no spread: {first}");
    for u in draws {
        let d = jitter(Duration::from_secs(100), u);
        assert!(
            d <= Duration::from_secs(100) && d >= Duration::from_secs(80),
            "{d:?}"
        );
    }
}

#[test]
fn only_requeues_are_jittered() {
    assert_eq!(jittered(End::AwaitChange, 1.0), End::AwaitChange);
    assert_eq!(
        jittered(End::RequeueAfter(Duration::from_secs(10)), 1.0),
        End::RequeueAfter(Duration::from_secs(8))
    );
    assert_eq!(Fixed(0.25).unit(), 0.25);
}
