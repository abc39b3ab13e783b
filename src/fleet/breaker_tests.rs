use std::time::Duration;

use super::*;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

/// `n` members named p0..pn, the first `bad` of them not Ready.
fn fleet(n: usize, bad: usize) -> Vec<Member> {
    (0..n)
        .map(|i| Member::new(format!("ns/p{i}"), i >= bad))
        .collect()
}

/// One observation: at second `t`, these members; then what is expected.
struct Step {
    t: i64,
    members: Vec<Member>,
    reset: bool,
    want: Option<Transition>,
    open: bool,
}

fn step(t: i64, members: Vec<Member>, want: Option<Transition>, open: bool) -> Step {
    Step {
        t,
        members,
        reset: false,
        want,
        open,
    }
}

#[test]
fn breaker_table() {
    struct Case {
        name: &'static str,
        policy: BreakerPolicy,
        steps: Vec<Step>,
    }
    let opened = |lost, seen| Some(Transition::Opened { lost, seen });
    let cases = [
        Case {
            name: "a healthy fleet stays closed",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 0), None, false),
            ],
        },
        Case {
            name: "80% of ten turning unhealthy at once opens it",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 8), opened(8, 10), true),
            ],
        },
        Case {
            name: "exactly the threshold (50%) does not open it: more than is needed",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 5), None, false),
            ],
        },
        Case {
            name: "6 of 10 opens it",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 6), opened(6, 10), true),
            ],
        },
        Case {
            name: "1 of 1 failing is below the minimum fleet: an ordinary replace",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(1, 0), None, false),
                step(10, fleet(1, 1), None, false),
            ],
        },
        Case {
            name: "2 of 2 failing is below the minimum fleet",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(2, 0), None, false),
                step(10, fleet(2, 2), None, false),
            ],
        },
        Case {
            name: "2 of 3 failing reaches the minimum fleet and opens it",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(3, 0), None, false),
                step(10, fleet(3, 2), opened(2, 3), true),
            ],
        },
        Case {
            name: "proxies never Ready do not count (a fleet still booting)",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 10), None, false),
                step(10, fleet(10, 10), None, false),
            ],
        },
        Case {
            name: "losses spread over more than the window never add up",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 4), None, false),
                // The first four losses are older than 300 s now: two more
                // of the six still Ready is a third, not an outage.
                step(400, fleet(10, 6), None, false),
            ],
        },
        Case {
            name: "losses within the window add up across observations",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 4), None, false),
                step(200, fleet(10, 7), opened(7, 10), true),
            ],
        },
        Case {
            name: "healing closes it on its own",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 8), opened(8, 10), true),
                step(20, fleet(10, 6), None, true),
                step(30, fleet(10, 5), Some(Transition::Closed), false),
            ],
        },
        Case {
            name: "a long outage does not close it by ageing out",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 8), opened(8, 10), true),
                step(10_000, fleet(10, 8), None, true),
            ],
        },
        Case {
            name: "an operator reset closes it and forgets the losses",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 8), opened(8, 10), true),
                Step {
                    t: 20,
                    members: fleet(10, 8),
                    reset: true,
                    want: Some(Transition::Reset),
                    open: false,
                },
                // Still unhealthy but lost before the reset: not counted.
                step(30, fleet(10, 8), None, false),
            ],
        },
        Case {
            name: "deleted Proxies are forgotten, not counted as lost",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(2, 0), None, false),
            ],
        },
        Case {
            name: "deleting the lost Proxies closes an open breaker",
            policy: BreakerPolicy::default(),
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 8), opened(8, 10), true),
                step(
                    20,
                    fleet(10, 8)[8..].to_vec(),
                    Some(Transition::Closed),
                    false,
                ),
            ],
        },
        Case {
            name: "a configured shorter window: losses a minute apart never add up",
            policy: BreakerPolicy {
                window: Duration::from_secs(30),
                ..BreakerPolicy::default()
            },
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 4), None, false),
                step(70, fleet(10, 7), None, false),
            ],
        },
        Case {
            name: "a configured minReadyProxies of 5: 3 of 4 failing is an ordinary replace",
            policy: BreakerPolicy {
                min_fleet: 5,
                ..BreakerPolicy::default()
            },
            steps: vec![
                step(0, fleet(4, 0), None, false),
                step(10, fleet(4, 3), None, false),
            ],
        },
        Case {
            name: "a configured 100% never opens, even with all lost",
            policy: BreakerPolicy {
                threshold_percent: 100,
                ..BreakerPolicy::default()
            },
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 10), None, false),
            ],
        },
        Case {
            name: "a lower threshold opens earlier",
            policy: BreakerPolicy {
                threshold_percent: 20,
                ..BreakerPolicy::default()
            },
            steps: vec![
                step(0, fleet(10, 0), None, false),
                step(10, fleet(10, 3), opened(3, 10), true),
            ],
        },
    ];
    for c in cases {
        let mut b = Breaker::new(c.policy);
        for (i, s) in c.steps.into_iter().enumerate() {
            let got = if s.reset {
                b.reset()
            } else {
                b.observe(at(s.t), &s.members)
            };
            assert_eq!(got, s.want, "{} (step {i})", c.name);
            assert_eq!(b.is_open(), s.open, "{} (step {i}): open", c.name);
        }
    }
}

#[test]
fn opened_at_is_the_observation_that_tripped_it() {
    let mut b = Breaker::new(BreakerPolicy::default());
    b.observe(at(0), &fleet(4, 0));
    b.observe(at(42), &fleet(4, 3));
    assert_eq!(b.opened_at(), Some(at(42)));
    b.observe(at(50), &fleet(4, 0));
    assert_eq!(b.opened_at(), None);
}
