use super::*;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

#[test]
fn drain_table() {
    struct Case {
        name: &'static str,
        since: Option<i64>,
        leases: usize,
        last_expiry: Option<i64>,
        timeout: u64,
        now: i64,
        want: DrainStep,
    }
    let cases = [
        Case {
            name: "not draining yet: start (no replace before a drain)",
            since: None,
            leases: 0,
            last_expiry: None,
            timeout: 600,
            now: 0,
            want: DrainStep::Start,
        },
        Case {
            name: "no lease held: replace at once",
            since: Some(0),
            leases: 0,
            last_expiry: None,
            timeout: 600,
            now: 1,
            want: DrainStep::Replace(DrainDone::NoLeases),
        },
        Case {
            name: "a lease held: wait for its expiry",
            since: Some(0),
            leases: 1,
            last_expiry: Some(120),
            timeout: 600,
            now: 10,
            want: DrainStep::Wait { until: at(120) },
        },
        Case {
            name: "a lease outliving the timeout: wait for the timeout only",
            since: Some(0),
            leases: 2,
            last_expiry: Some(5000),
            timeout: 600,
            now: 10,
            want: DrainStep::Wait { until: at(600) },
        },
        Case {
            name: "timeout reached with leases still held: replace",
            since: Some(0),
            leases: 1,
            last_expiry: Some(5000),
            timeout: 600,
            now: 600,
            want: DrainStep::Replace(DrainDone::TimedOut),
        },
        Case {
            name: "a lease past its expiry but not yet swept: wait until now, not before",
            since: Some(0),
            leases: 1,
            last_expiry: Some(50),
            timeout: 600,
            now: 60,
            want: DrainStep::Wait { until: at(60) },
        },
    ];
    for c in cases {
        let input = DrainInput {
            draining_since: c.since.map(at),
            active_leases: c.leases,
            last_expiry: c.last_expiry.map(at),
            timeout: Duration::from_secs(c.timeout),
            now: at(c.now),
        };
        assert_eq!(next_drain_step(&input), c.want, "{}", c.name);
    }
}
