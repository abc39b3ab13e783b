use super::*;

const D15: Duration = Duration::from_secs(15);

/// A wall-clock time `s` seconds from a fixed point: the holder's clock.
fn wall(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn held(who: &str, renewed: i64, duration: Option<u64>) -> Record {
    Record {
        holder: Some(who.into()),
        renew_time: Some(wall(renewed)),
        acquire_time: Some(wall(-1000)),
        duration: duration.map(Duration::from_secs),
        transitions: Some(3),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn decision_table() {
    struct Case {
        name: &'static str,
        /// What the Lease says now.
        record: Record,
        /// What was seen before, and how many seconds ago it was first seen.
        last: Option<(Record, u64)>,
        want: Decision,
        /// Seconds between the returned `Seen::at` and now.
        want_unchanged_for: u64,
    }
    let follow = |leader: &str| Decision::Follow {
        leader: leader.into(),
    };
    let cases = [
        Case {
            name: "no holder",
            record: Record::default(),
            last: None,
            want: Decision::Acquire,
            want_unchanged_for: 0,
        },
        Case {
            name: "empty holder (released)",
            record: Record {
                holder: Some(String::new()),
                duration: Some(secs(1)),
                ..Default::default()
            },
            last: None,
            want: Decision::Acquire,
            want_unchanged_for: 0,
        },
        Case {
            name: "ours, however old",
            record: held("me", -100_000, Some(15)),
            last: Some((held("me", -100_000, Some(15)), 1000)),
            want: Decision::Renew,
            want_unchanged_for: 1000,
        },
        Case {
            name: "another, first seen: a whole duration must pass",
            record: held("b", 0, Some(15)),
            last: None,
            want: follow("b"),
            want_unchanged_for: 0,
        },
        Case {
            name: "another, renewTime a day in the past (skew): first seen, live",
            record: held("b", -86_400, Some(15)),
            last: None,
            want: follow("b"),
            want_unchanged_for: 0,
        },
        Case {
            name: "another, renewTime a day in the past (skew), renewed since last seen",
            record: held("b", -86_399, Some(15)),
            last: Some((held("b", -86_400, Some(15)), 14)),
            want: follow("b"),
            want_unchanged_for: 0,
        },
        Case {
            name: "another, renewTime a day in the future (skew), unchanged a whole duration",
            record: held("b", 86_400, Some(15)),
            last: Some((held("b", 86_400, Some(15)), 15)),
            want: Decision::Acquire,
            want_unchanged_for: 15,
        },
        Case {
            name: "another, unchanged for less than its duration",
            record: held("b", -5, Some(15)),
            last: Some((held("b", -5, Some(15)), 14)),
            want: follow("b"),
            want_unchanged_for: 14,
        },
        Case {
            name: "another, unchanged for its duration",
            record: held("b", -5, Some(15)),
            last: Some((held("b", -5, Some(15)), 15)),
            want: Decision::Acquire,
            want_unchanged_for: 15,
        },
        Case {
            name: "another, their longer duration counts",
            record: held("b", -20, Some(30)),
            last: Some((held("b", -20, Some(30)), 20)),
            want: follow("b"),
            want_unchanged_for: 20,
        },
        Case {
            name: "another, no duration written: ours counts",
            record: held("b", -16, None),
            last: Some((held("b", -16, None), 16)),
            want: Decision::Acquire,
            want_unchanged_for: 16,
        },
        Case {
            name: "another took over from c: the clock starts again",
            record: held("b", 0, Some(15)),
            last: Some((held("c", 0, Some(15)), 100)),
            want: follow("b"),
            want_unchanged_for: 0,
        },
        Case {
            name: "another, only its duration changed: the clock starts again",
            record: held("b", 0, Some(30)),
            last: Some((held("b", 0, Some(15)), 100)),
            want: follow("b"),
            want_unchanged_for: 0,
        },
    ];
    let now = Instant::now() + secs(100_000);
    for c in cases {
        let last = c.last.map(|(record, ago)| Seen {
            record,
            at: now - secs(ago),
        });
        let (decision, seen) = decide(&c.record, last.as_ref(), "me", now, D15);
        assert_eq!(decision, c.want, "{}", c.name);
        assert_eq!(seen.record, c.record, "{}: remembers what it read", c.name);
        assert_eq!(
            now - seen.at,
            secs(c.want_unchanged_for),
            "{}: unchanged since",
            c.name
        );
    }
}

#[test]
fn leader_step_table() {
    const RENEW: Duration = Duration::from_secs(10);
    struct Case {
        name: &'static str,
        outcome: Outcome,
        /// Seconds after the previous renewal's start: when this attempt
        /// started and when it ended. The deadline is at 10.
        started: u64,
        ended: u64,
        want: Step,
    }
    let base = Instant::now();
    let at = |s: u64| base + secs(s);
    let lead = |s: u64| Step::Lead { deadline: at(s) };
    let cases = [
        Case {
            name: "renewed: the deadline counts from the attempt's start",
            outcome: Outcome::Held,
            started: 2,
            ended: 3,
            want: lead(12),
        },
        Case {
            name: "failed before the deadline: keep trying, same deadline",
            outcome: Outcome::Failed,
            started: 2,
            ended: 9,
            want: lead(10),
        },
        Case {
            name: "failed at the deadline (the bound ran out)",
            outcome: Outcome::Failed,
            started: 2,
            ended: 10,
            want: Step::StepDown(StepDown::DeadlinePassed),
        },
        Case {
            name: "renewed, but the answer came after the deadline",
            outcome: Outcome::Held,
            started: 9,
            ended: 11,
            want: Step::StepDown(StepDown::DeadlinePassed),
        },
        Case {
            name: "another holder: step down at once",
            outcome: Outcome::Lost,
            started: 1,
            ended: 1,
            want: Step::StepDown(StepDown::Lost),
        },
        Case {
            name: "another holder found after the deadline",
            outcome: Outcome::Lost,
            started: 9,
            ended: 12,
            want: Step::StepDown(StepDown::DeadlinePassed),
        },
    ];
    for c in cases {
        let step = after_attempt(c.outcome, at(c.started), at(c.ended), at(10), RENEW);
        assert_eq!(step, c.want, "{}", c.name);
    }
}

#[test]
fn attempt_bound_table() {
    struct Case {
        name: &'static str,
        deadline_in: Option<i64>,
        want: Duration,
    }
    let renew = secs(10);
    let cases = [
        Case {
            name: "a candidate waits at most the renew deadline",
            deadline_in: None,
            want: renew,
        },
        Case {
            name: "a leader waits at most what is left",
            deadline_in: Some(3),
            want: secs(3),
        },
        Case {
            name: "a leader past its deadline does not wait",
            deadline_in: Some(-2),
            want: Duration::ZERO,
        },
    ];
    let now = Instant::now() + secs(100);
    for c in cases {
        let deadline = c.deadline_in.map(|s| {
            if s >= 0 {
                now + secs(s.unsigned_abs())
            } else {
                now - secs(s.unsigned_abs())
            }
        });
        assert_eq!(attempt_bound(deadline, now, renew), c.want, "{}", c.name);
    }
}
