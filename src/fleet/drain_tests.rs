use super::*;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

#[test]
fn drain_table() {
    struct Case {
        name: &'static str,
        since: Option<i64>,
        leases_end: Option<i64>,
        timeout: u64,
        now: i64,
        want: DrainStep,
    }
    let cases = [
        Case {
            name: "not draining yet: start (never replace before a drain)",
            since: None,
            leases_end: None,
            timeout: 600,
            now: 0,
            want: DrainStep::Start,
        },
        Case {
            name: "no lease held: replace at once",
            since: Some(0),
            leases_end: None,
            timeout: 600,
            now: 1,
            want: DrainStep::Replace(DrainDone::NoLeases),
        },
        Case {
            name: "a lease held: wait for its expiry, not cut",
            since: Some(0),
            leases_end: Some(120),
            timeout: 600,
            now: 10,
            want: DrainStep::Wait { until: at(120) },
        },
        Case {
            name: "a second before the lease ends: still wait",
            since: Some(0),
            leases_end: Some(120),
            timeout: 600,
            now: 119,
            want: DrainStep::Wait { until: at(120) },
        },
        Case {
            name: "the lease ran out: replace",
            since: Some(0),
            leases_end: Some(120),
            timeout: 600,
            now: 120,
            want: DrainStep::Replace(DrainDone::LeasesExpired),
        },
        Case {
            name: "a lease outliving the timeout: wait for the timeout only",
            since: Some(0),
            leases_end: Some(5000),
            timeout: 600,
            now: 10,
            want: DrainStep::Wait { until: at(600) },
        },
        Case {
            name: "timeout reached with a lease still held: replace",
            since: Some(0),
            leases_end: Some(5000),
            timeout: 600,
            now: 600,
            want: DrainStep::Replace(DrainDone::TimedOut),
        },
    ];
    for c in cases {
        let input = DrainInput {
            draining_since: c.since.map(at),
            leases_end: c.leases_end.map(at),
            timeout: Duration::from_secs(c.timeout),
            now: at(c.now),
        };
        assert_eq!(next_drain_step(&input), c.want, "{}", c.name);
    }
}

#[test]
fn unseen_leases_end_table() {
    struct Case {
        name: &'static str,
        since: Option<i64>,
        longest_ttl: u64,
        want: Option<i64>,
    }
    let cases = [
        Case {
            name: "not draining: no bound",
            since: None,
            longest_ttl: 3600,
            want: None,
        },
        Case {
            name: "a lease renewed just before the replicas saw the drain runs the longest TTL from then",
            since: Some(0),
            longest_ttl: 3600,
            want: Some(3605),
        },
        Case {
            name: "short leases still get the notice time",
            since: Some(100),
            longest_ttl: 15,
            want: Some(120),
        },
    ];
    for c in cases {
        let got = unseen_leases_end(c.since.map(at), Duration::from_secs(c.longest_ttl));
        assert_eq!(got, c.want.map(at), "{}", c.name);
    }
    let far = unseen_leases_end(Some(at(0)), Duration::MAX);
    assert_eq!(far, Some(DateTime::<Utc>::MAX_UTC), "no overflow");
}

#[test]
fn leases_end_table() {
    use crate::lease::HeldUntil::{Known, Unknown};
    let ttl = Duration::from_secs(3600);
    let notice = DRAIN_NOTICE.as_secs() as i64;
    let cases = [
        (
            "the leader's table: no lease, past the notice: none",
            Known(None),
            notice,
            None,
        ),
        (
            "no lease yet, but a replica may not have seen the drain",
            Known(None),
            1,
            Some(notice),
        ),
        (
            "the last lease on it ends later: then",
            Known(Some(at(40))),
            notice,
            Some(40),
        ),
        (
            "a lease ending within the notice: the notice",
            Known(Some(at(2))),
            1,
            Some(notice),
        ),
        (
            "a recovery window runs: the longest TTL from the drain",
            Unknown,
            notice,
            Some(3600 + notice),
        ),
    ];
    for (name, held, now, want) in cases {
        let got = leases_end(Some(at(0)), held, ttl, at(now));
        assert_eq!(got, want.map(at), "{name}");
    }
    assert_eq!(
        leases_end(None, Known(None), ttl, at(0)),
        None,
        "not draining"
    );
}
