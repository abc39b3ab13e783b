use super::*;

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
}

fn k(n: u8) -> Key {
    [n; 16]
}

/// One step: an Event of `key` published at `at` (and, when it is to be
/// created, created), and what should be sent.
struct Step {
    at: i64,
    key: u8,
    want: Option<i32>,
}

fn run(name: &str, max: usize, steps: &[Step]) -> Series {
    let mut s = Series::new(max, Duration::from_secs(360));
    for (i, step) in steps.iter().enumerate() {
        let got = s.publish(k(step.key), t(step.at));
        let want = match step.want {
            None => Publish::Create,
            Some(count) => Publish::Repeat {
                name: format!("e{}", step.key),
                count,
            },
        };
        assert_eq!(got, want, "{name}: step {i}");
        if got == Publish::Create {
            s.created(k(step.key), format!("e{}", step.key), t(step.at));
        }
        assert!(s.len() <= max, "{name}: step {i}: {} over {max}", s.len());
    }
    s
}

#[test]
fn repeats_within_the_window_count_on_the_first_event() {
    let step = |at, key, want| Step { at, key, want };
    let cases: Vec<(&str, usize, Vec<Step>)> = vec![
        (
            "a repeat is the series' second sighting, then third",
            10,
            vec![step(0, 1, None), step(10, 1, Some(2)), step(20, 1, Some(3))],
        ),
        (
            "other keys are other Events",
            10,
            vec![
                step(0, 1, None),
                step(1, 2, None),
                step(2, 1, Some(2)),
                step(3, 2, Some(2)),
            ],
        ),
        (
            "six minutes after the last sighting the window has closed",
            10,
            vec![step(0, 1, None), step(360, 1, None), step(361, 1, Some(2))],
        ),
        (
            "each repeat extends the window",
            10,
            vec![
                step(0, 1, None),
                step(300, 1, Some(2)),
                step(600, 1, Some(3)),
                step(959, 1, Some(4)),
            ],
        ),
        (
            "past the cap the least recently seen is forgotten",
            2,
            vec![
                step(0, 1, None),
                step(1, 2, None),
                step(2, 1, Some(2)),
                step(3, 3, None),
                // 2 was the least recently seen: forgotten for 3.
                step(4, 2, None),
                step(5, 3, Some(2)),
            ],
        ),
    ];
    for (name, max, steps) in cases {
        run(name, max, &steps);
    }
}

#[test]
fn a_forgotten_event_is_created_again() {
    let mut s = Series::default();
    assert_eq!(s.publish(k(1), t(0)), Publish::Create);
    s.created(k(1), "e1".into(), t(0));
    s.forget(&k(1));
    assert_eq!(s.publish(k(1), t(1)), Publish::Create);
}

#[test]
fn memory_stays_bounded_by_the_cap_and_the_window() {
    // 50,000 distinct Events in a burst keep the cap; one Event repeated
    // 10,000 times keeps one entry and a short queue.
    let mut s = Series::new(100, Duration::from_secs(360));
    for i in 0..50_000u32 {
        let mut key = [0u8; 16];
        key[..4].copy_from_slice(&i.to_le_bytes());
        assert_eq!(s.publish(key, t(0)), Publish::Create);
        s.created(key, format!("e{i}"), t(0));
    }
    assert_eq!(s.len(), 100);
    assert!(s.order.len() <= 2 * 100 + 16, "{}", s.order.len());
    let mut s = Series::default();
    s.created(k(9), "e9".into(), t(0));
    for i in 1..10_000 {
        assert!(matches!(
            s.publish(k(9), t(i / 100)),
            Publish::Repeat { .. }
        ));
    }
    assert_eq!(s.len(), 1);
    assert!(s.order.len() <= 18, "{}", s.order.len());
    // All of it expires once the window has passed.
    assert_eq!(s.publish(k(7), t(10_000)), Publish::Create);
    assert!(s.is_empty());
}

#[test]
fn keys_differ_by_every_part_and_not_by_how_parts_split() {
    let base = key(
        ["v1", "Proxy", "ns", "px", "uid"],
        "Normal",
        "Ready",
        "Probe",
        "ok",
    );
    let others = [
        key(
            ["v1", "Proxy", "ns", "py", "uid"],
            "Normal",
            "Ready",
            "Probe",
            "ok",
        ),
        key(
            ["v1", "Proxy", "ns", "px", "uid2"],
            "Normal",
            "Ready",
            "Probe",
            "ok",
        ),
        key(
            ["v1", "Proxy", "ns", "px", "uid"],
            "Warning",
            "Ready",
            "Probe",
            "ok",
        ),
        key(
            ["v1", "Proxy", "ns", "px", "uid"],
            "Normal",
            "Unhealthy",
            "Probe",
            "ok",
        ),
        key(
            ["v1", "Proxy", "ns", "px", "uid"],
            "Normal",
            "Ready",
            "Probe",
            "ok too",
        ),
        key(
            ["v1", "Proxy", "nsp", "x", "uid"],
            "Normal",
            "Ready",
            "Probe",
            "ok",
        ),
    ];
    for (i, o) in others.iter().enumerate() {
        assert_ne!(&base, o, "variant {i}");
    }
    assert_eq!(
        base,
        key(
            ["v1", "Proxy", "ns", "px", "uid"],
            "Normal",
            "Ready",
            "Probe",
            "ok"
        )
    );
}
