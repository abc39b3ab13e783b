use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;
use crate::api::condition::{self, ConditionStatus};
use crate::api::proxy::conditions::PROVISIONED;

/// `s` seconds after a fixed instant.
fn t(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a valid timestamp")
}

fn ms(n: i64) -> DateTime<Utc> {
    t(0) + TimeDelta::milliseconds(n)
}

fn limits(per_minute: u32, in_flight: u32) -> CreateLimits {
    CreateLimits {
        creates_per_minute: per_minute,
        max_creates_in_flight: in_flight,
        max_instances: None,
        ..CreateLimits::default()
    }
}

/// What the limiter is asked, or told, in a case, at a time in ms.
enum Ev {
    /// `admit(key)` at the time must answer this.
    Admit(&'static str, i64, Want),
    /// A pass of the key ended, still provisioning or not.
    Settle(&'static str, bool, i64),
    /// The key's create was refused.
    Failed(&'static str),
    /// The key is being deleted.
    Forget(&'static str),
    /// The gauges at the time.
    Gauges(i64, Gauges),
}

#[derive(Debug, PartialEq)]
enum Want {
    Go,
    /// Wait until this time (ms) for this.
    Wait(i64, Hold),
}

fn g(tokens: u32, in_flight: u32, waiting: u32) -> Gauges {
    Gauges {
        tokens,
        in_flight,
        waiting,
    }
}

struct Case {
    name: &'static str,
    limits: CreateLimits,
    events: Vec<Ev>,
}

/// `n` admits of distinct keys `k0`… at `at`, each wanting Go.
fn burst_of(n: usize, at: i64) -> Vec<Ev> {
    const KEYS: [&str; 10] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"];
    KEYS[..n]
        .iter()
        .map(|k| Ev::Admit(k, at, Want::Go))
        .collect()
}

fn with(mut head: Vec<Ev>, tail: Vec<Ev>) -> Vec<Ev> {
    head.extend(tail);
    head
}

#[test]
fn create_limiter_table() {
    use Ev::*;
    let cases = vec![
        Case {
            name: "a full bucket lets its burst go at once, the next waits a token",
            limits: limits(60, 100),
            events: with(
                vec![Gauges(0, g(10, 0, 0))],
                with(
                    burst_of(10, 0),
                    vec![
                        Gauges(0, g(0, 10, 0)),
                        Admit("late", 0, Want::Wait(1000, Hold::Rate)),
                        Gauges(0, g(0, 10, 1)),
                    ],
                ),
            ),
        },
        Case {
            name: "Proxies applied at once get a slot each, one interval apart",
            limits: limits(60, 100),
            events: with(
                burst_of(10, 0),
                vec![
                    Admit("a", 0, Want::Wait(1000, Hold::Rate)),
                    Admit("b", 0, Want::Wait(2000, Hold::Rate)),
                    Admit("c", 0, Want::Wait(3000, Hold::Rate)),
                    Gauges(0, g(0, 10, 3)),
                ],
            ),
        },
        Case {
            name: "a Proxy back early keeps its slot and books no other",
            limits: limits(60, 100),
            events: with(
                burst_of(10, 0),
                vec![
                    Admit("a", 0, Want::Wait(1000, Hold::Rate)),
                    Admit("a", 400, Want::Wait(1000, Hold::Rate)),
                    Admit("b", 400, Want::Wait(2000, Hold::Rate)),
                    Admit("a", 1000, Want::Go),
                    Gauges(1000, g(0, 11, 1)),
                ],
            ),
        },
        Case {
            name: "the bucket refills one token per interval",
            limits: limits(60, 100),
            events: with(
                burst_of(10, 0),
                vec![
                    Gauges(5000, g(5, 10, 0)),
                    Admit("a", 5000, Want::Go),
                    Admit("b", 5000, Want::Go),
                    Admit("c", 5000, Want::Go),
                    Admit("d", 5000, Want::Go),
                    Admit("e", 5000, Want::Go),
                    Admit("f", 5000, Want::Wait(6000, Hold::Rate)),
                    Gauges(60_000, g(10, 15, 1)),
                ],
            ),
        },
        Case {
            name: "a Proxy late for its slot pushes the next back: the creates keep the rate",
            // 6 a minute: a token every 10 s, a burst of 1.
            limits: limits(6, 100),
            events: vec![
                Admit("a", 0, Want::Go),
                Admit("b", 0, Want::Wait(10_000, Hold::Rate)),
                Admit("c", 0, Want::Wait(20_000, Hold::Rate)),
                Admit("b", 15_000, Want::Go),
                Admit("c", 20_000, Want::Wait(25_000, Hold::Rate)),
                Admit("c", 25_000, Want::Go),
            ],
        },
        Case {
            name: "the in-flight cap holds creates back without taking a slot",
            limits: limits(60, 2),
            events: vec![
                Admit("a", 0, Want::Go),
                Admit("b", 0, Want::Go),
                Admit("c", 0, Want::Wait(10_000, Hold::InFlight)),
                Gauges(0, g(8, 2, 0)),
                Settle("a", true, 1000),
                Admit("c", 1000, Want::Wait(11_000, Hold::InFlight)),
                Settle("a", false, 2000),
                Admit("c", 2000, Want::Go),
                Gauges(2000, g(9, 2, 0)),
            ],
        },
        Case {
            name: "an instance seen provisioning counts as in flight (a restarted operator)",
            limits: limits(60, 1),
            events: vec![
                Settle("old", true, 0),
                Admit("new", 0, Want::Wait(10_000, Hold::InFlight)),
                Settle("old", false, 5000),
                Admit("new", 5000, Want::Go),
            ],
        },
        Case {
            name: "a refused create is not in flight",
            limits: limits(60, 1),
            events: vec![
                Admit("a", 0, Want::Go),
                Failed("a"),
                Admit("b", 0, Want::Go),
                Gauges(0, g(8, 1, 0)),
            ],
        },
        Case {
            name: "creating again (the instance vanished at once) counts the Proxy once",
            limits: limits(60, 1),
            events: vec![
                Admit("a", 0, Want::Go),
                Admit("a", 100, Want::Go),
                Gauges(100, g(8, 1, 0)),
                Admit("b", 100, Want::Wait(10_100, Hold::InFlight)),
            ],
        },
        Case {
            name: "an in-flight create nobody settles stops counting after 30 minutes",
            limits: limits(60, 1),
            events: vec![
                Admit("a", 0, Want::Go),
                Admit(
                    "b",
                    30 * 60_000 - 1,
                    Want::Wait(30 * 60_000 + 9_999, Hold::InFlight),
                ),
                Admit("b", 30 * 60_000, Want::Go),
            ],
        },
        Case {
            name: "a deleted Proxy gives up its slot and its in-flight create",
            limits: limits(6, 1),
            events: vec![
                Admit("a", 0, Want::Go),
                Forget("a"),
                Admit("b", 0, Want::Wait(10_000, Hold::Rate)),
                Gauges(0, g(0, 0, 1)),
                Forget("b"),
                Gauges(0, g(0, 0, 0)),
                // Its slot stays spent: the next one is after it.
                Admit("c", 0, Want::Wait(20_000, Hold::Rate)),
            ],
        },
        Case {
            name: "a slot nobody came back for is dropped 10 minutes after it",
            limits: limits(6, 100),
            events: vec![
                Admit("a", 0, Want::Go),
                Admit("b", 0, Want::Wait(10_000, Hold::Rate)),
                Admit("c", 10_000 + 10 * 60_000 + 1, Want::Go),
                Gauges(10_000 + 10 * 60_000 + 1, g(0, 2, 0)),
            ],
        },
    ];
    for c in cases {
        let mut l = CreateLimiter::default();
        for (i, ev) in c.events.iter().enumerate() {
            match ev {
                Ev::Admit(key, at, want) => {
                    let got = match l.admit(&c.limits, key, ms(*at)) {
                        Admission::Go => Want::Go,
                        Admission::Wait { until, hold } => {
                            Want::Wait((until - t(0)).num_milliseconds(), hold)
                        }
                    };
                    assert_eq!(&got, want, "{}: event {i} (admit {key} at {at})", c.name);
                }
                Ev::Settle(key, provisioning, at) => l.settle(key, *provisioning, ms(*at)),
                Ev::Failed(key) => l.create_failed(key),
                Ev::Forget(key) => l.forget(key),
                Ev::Gauges(at, want) => {
                    assert_eq!(&l.gauges(&c.limits, ms(*at)), want, "{}: event {i}", c.name)
                }
            }
        }
    }
}

/// 300 Proxies applied at once, each coming back for its slot up to 3 s
/// late (the controller's queue, the requeue's spread): every one is
/// created exactly once, and no window holds more creates than the burst
/// plus a token per interval.
#[test]
fn three_hundred_proxies_late_or_not_keep_the_rate() {
    let lim = limits(600, 10_000);
    let step_ms = 100; // 600 a minute
    let burst = lim.burst() as usize;
    let mut l = CreateLimiter::default();
    let mut queue: BinaryHeap<Reverse<(i64, usize)>> = (0..300).map(|k| Reverse((0, k))).collect();
    let mut creates: Vec<(i64, usize)> = Vec::new();
    let mut seed: u64 = 7;
    let mut lateness = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        i64::try_from((seed >> 33) % 3000).unwrap()
    };
    let mut asks = 0;
    while let Some(Reverse((at, k))) = queue.pop() {
        asks += 1;
        match l.admit(&lim, &format!("p{k}"), ms(at)) {
            Admission::Go => creates.push((at, k)),
            Admission::Wait { until, .. } => {
                let back = (until - t(0)).num_milliseconds() + lateness();
                assert!(back > at, "a wait is never in the past");
                queue.push(Reverse((back, k)));
            }
        }
    }
    let mut who: Vec<usize> = creates.iter().map(|(_, k)| *k).collect();
    who.sort_unstable();
    assert_eq!(who, (0..300).collect::<Vec<_>>(), "one create per Proxy");
    for (i, (from, _)) in creates.iter().enumerate() {
        for (j, (to, _)) in creates.iter().enumerate().skip(i) {
            let allowed = burst + usize::try_from((to - from) / step_ms).unwrap();
            assert!(
                j - i < allowed,
                "{} creates in {} ms, at most {allowed} allowed",
                j - i + 1,
                to - from
            );
        }
    }
    // About one ask per Proxy and slot, not one per token.
    assert!(asks < 300 * 4, "{asks} asks");
}

#[test]
fn held_requeue_table() {
    struct Case {
        name: &'static str,
        wait_ms: i64,
        unit: f64,
        want: Duration,
    }
    let cases = [
        Case {
            name: "no spread: exactly the slot",
            wait_ms: 10_000,
            unit: 0.0,
            want: Duration::from_secs(10),
        },
        Case {
            name: "up to a fifth of the wait after it",
            wait_ms: 10_000,
            unit: 0.5,
            want: Duration::from_secs(11),
        },
        Case {
            name: "the spread is at most 5 s",
            wait_ms: 600_000,
            unit: 1.0,
            want: Duration::from_secs(605),
        },
        Case {
            name: "a slot already here: a millisecond, never zero",
            wait_ms: -50,
            unit: 0.9,
            want: Duration::from_millis(1),
        },
        Case {
            name: "a unit outside [0, 1] is clamped",
            wait_ms: 1000,
            unit: 7.0,
            want: Duration::from_millis(1200),
        },
        Case {
            name: "NaN counts as 0",
            wait_ms: 1000,
            unit: f64::NAN,
            want: Duration::from_secs(1),
        },
    ];
    for c in cases {
        assert_eq!(
            held_requeue(ms(c.wait_ms), ms(0), c.unit),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn hold_labels_are_bounded() {
    assert_eq!(Hold::Rate.metric_label(), "rate");
    assert_eq!(Hold::InFlight.metric_label(), "in_flight");
}

#[test]
fn the_throttled_status_names_the_limit_and_the_next_try() {
    use crate::api::ProxyPhase;
    struct Case {
        name: &'static str,
        hold: Hold,
        want: &'static str,
    }
    let cases = [
        Case {
            name: "rate",
            hold: Hold::Rate,
            want: "provider \"gcp-eu\" allows 30 creates a minute (createsPerMinute): this create waits its turn, next try at ",
        },
        Case {
            name: "in flight",
            hold: Hold::InFlight,
            want: "provider \"gcp-eu\" has 4 creates in flight, its maxCreatesInFlight: next try at ",
        },
    ];
    for c in cases {
        let mut s = ProxyStatus::default();
        mark_create_throttled(
            &mut s,
            "gcp-eu",
            &limits(30, 4),
            c.hold,
            ms(61_000),
            ms(0),
            Some(1),
        );
        assert_eq!(s.phase, Some(ProxyPhase::Provisioning), "{}", c.name);
        let cond = condition::find(&s.conditions, PROVISIONED).unwrap();
        assert_eq!(
            (cond.status, cond.reason.as_str(), cond.observed_generation),
            (ConditionStatus::False, "CreateThrottled", Some(1)),
            "{}",
            c.name
        );
        let next = ms(61_000).to_rfc3339_opts(SecondsFormat::Secs, true);
        assert_eq!(cond.message, format!("{}{next}", c.want), "{}", c.name);
    }
}

#[test]
fn an_instance_limit_names_the_cap_and_what_the_provider_holds() {
    let mut status = ProxyStatus::default();
    mark_instance_limit(&mut status, "gcp-eu", (3, 3), t(0), Some(2));
    let c = crate::api::condition::find(
        &status.conditions,
        crate::api::proxy::conditions::PROVISIONED,
    )
    .expect("Provisioned");
    assert_eq!(c.reason, REASON_INSTANCE_LIMIT);
    assert_eq!(
        c.message,
        "provider \"gcp-eu\" holds 3 instances, its maxInstances is 3: this create waits until one of them goes"
    );
    assert_eq!(status.phase, Some(crate::api::ProxyPhase::Provisioning));
}
