use super::*;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

fn old(key: &str, created: i64) -> Candidate {
    Candidate {
        key: key.into(),
        reason: RecycleReason::MaxAge,
        created_at: Some(at(created)),
        serving: true,
    }
}

fn changed(key: &str, created: i64, serving: bool) -> Candidate {
    Candidate {
        key: key.into(),
        reason: RecycleReason::SpecChanged,
        created_at: Some(at(created)),
        serving,
    }
}

fn sick(key: &str) -> Candidate {
    Candidate {
        key: key.into(),
        reason: RecycleReason::Unhealthy,
        created_at: Some(at(0)),
        serving: false,
    }
}

fn counts(size: usize, ready: usize, recycling: usize) -> FleetCounts {
    FleetCounts {
        size,
        ready,
        recycling,
    }
}

#[test]
fn admit_table() {
    struct Case {
        name: &'static str,
        budget: MaxUnavailable,
        counts: FleetCounts,
        breaker_open: bool,
        candidates: Vec<Candidate>,
        want: Vec<&'static str>,
    }
    let cases = [
        Case {
            name: "default budget: one at a time, the oldest first",
            budget: MaxUnavailable::default(),
            counts: counts(10, 10, 0),
            breaker_open: false,
            candidates: vec![old("b", 20), old("a", 30), old("c", 10)],
            want: vec!["c"],
        },
        Case {
            name: "budget 2 of 10 all due: two start",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 10, 0),
            breaker_open: false,
            candidates: (0..10)
                .map(|i| {
                    old(
                        ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"][i],
                        i as i64,
                    )
                })
                .collect(),
            want: vec!["p0", "p1"],
        },
        Case {
            name: "budget used up by one already recycling: only one more",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 9, 1),
            breaker_open: false,
            candidates: vec![old("a", 1), old("b", 2)],
            want: vec!["a"],
        },
        Case {
            name: "budget full: none start",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 8, 2),
            breaker_open: false,
            candidates: vec![old("a", 1)],
            want: vec![],
        },
        Case {
            name: "age recycling waits while proxies are not Ready for other reasons",
            budget: MaxUnavailable::Count(1),
            counts: counts(10, 9, 0),
            breaker_open: false,
            candidates: vec![old("a", 1)],
            want: vec![],
        },
        Case {
            name: "an unhealthy proxy is recycled even when others are not Ready",
            budget: MaxUnavailable::Count(1),
            counts: counts(10, 7, 0),
            breaker_open: false,
            candidates: vec![sick("s"), old("a", 1)],
            want: vec!["s"],
        },
        Case {
            name: "unhealthy go before old ones",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 9, 0),
            breaker_open: false,
            candidates: vec![old("a", 1), sick("z")],
            // z is not Ready already (9 of 10); a would make 2 unavailable.
            want: vec!["z", "a"],
        },
        Case {
            name: "an unhealthy one does not exceed the recycling count either",
            budget: MaxUnavailable::Count(1),
            counts: counts(10, 8, 1),
            breaker_open: false,
            candidates: vec![sick("s")],
            want: vec![],
        },
        Case {
            name: "percent rounds up: 25% of 10 is 3",
            budget: MaxUnavailable::Percent(25),
            counts: counts(10, 10, 0),
            breaker_open: false,
            candidates: vec![old("a", 1), old("b", 2), old("c", 3), old("d", 4)],
            want: vec!["a", "b", "c"],
        },
        Case {
            name: "percent of a small fleet is still one",
            budget: MaxUnavailable::Percent(10),
            counts: counts(3, 3, 0),
            breaker_open: false,
            candidates: vec![old("a", 1), old("b", 2)],
            want: vec!["a"],
        },
        Case {
            name: "0 disables recycling",
            budget: MaxUnavailable::Count(0),
            counts: counts(10, 10, 0),
            breaker_open: false,
            candidates: vec![sick("s"), old("a", 1)],
            want: vec![],
        },
        Case {
            name: "an open breaker blocks all recycling",
            budget: MaxUnavailable::Count(5),
            counts: counts(10, 10, 0),
            breaker_open: true,
            candidates: vec![sick("s"), old("a", 1)],
            want: vec![],
        },
        Case {
            name: "unknown creation time goes last, then by name",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 10, 0),
            breaker_open: false,
            candidates: vec![
                Candidate {
                    key: "n".into(),
                    reason: RecycleReason::MaxAge,
                    created_at: None,
                    serving: true,
                },
                old("y", 5),
                old("x", 5),
            ],
            want: vec!["x", "y"],
        },
        Case {
            name: "a changed spec rolls serving proxies within the budget, oldest first",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 10, 0),
            breaker_open: false,
            candidates: vec![changed("c", 30, true), changed("a", 10, true), changed("b", 20, true)],
            want: vec!["a", "b"],
        },
        Case {
            name: "a changed spec waits while replaced proxies are not Ready yet",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 8, 0),
            breaker_open: false,
            candidates: vec![changed("c", 30, true)],
            want: vec![],
        },
        Case {
            name: "a changed spec on proxies that serve nothing (the fix may be in it) takes recycling slots only",
            budget: MaxUnavailable::Count(2),
            counts: counts(10, 5, 0),
            breaker_open: false,
            candidates: vec![changed("c", 30, false), changed("d", 31, false), changed("e", 32, false)],
            want: vec!["c", "d"],
        },
        Case {
            name: "unhealthy before a changed spec before age",
            budget: MaxUnavailable::Count(1),
            counts: counts(10, 9, 0),
            breaker_open: false,
            candidates: vec![old("o", 1), changed("c", 2, false), sick("s")],
            want: vec!["s"],
        },
        Case {
            name: "a changed spec waits for an open breaker",
            budget: MaxUnavailable::Count(3),
            counts: counts(10, 10, 0),
            breaker_open: true,
            candidates: vec![changed("c", 30, true)],
            want: vec![],
        },
    ];
    for c in cases {
        let got = admit(c.budget, c.counts, c.breaker_open, c.candidates);
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn max_unavailable_parse_table() {
    struct Case {
        name: &'static str,
        text: &'static str,
        want: Result<MaxUnavailable, &'static str>,
    }
    let cases = [
        Case {
            name: "a count",
            text: "2",
            want: Ok(MaxUnavailable::Count(2)),
        },
        Case {
            name: "a percent",
            text: "25%",
            want: Ok(MaxUnavailable::Percent(25)),
        },
        Case {
            name: "zero is allowed (recycling off)",
            text: "0",
            want: Ok(MaxUnavailable::Count(0)),
        },
        Case {
            name: "over 100%",
            text: "150%",
            want: Err("\"150%\" is more than 100%"),
        },
        Case {
            name: "negative",
            text: "-1",
            want: Err("\"-1\" must be a count such as 2 or a percent such as 25%"),
        },
        Case {
            name: "words",
            text: "two",
            want: Err("\"two\" must be a count such as 2 or a percent such as 25%"),
        },
    ];
    for c in cases {
        assert_eq!(
            MaxUnavailable::parse(c.text),
            c.want.map_err(String::from),
            "{}",
            c.name
        );
    }
}

#[test]
fn namespaces_take_turns_at_the_budget() {
    struct Case {
        name: &'static str,
        budget: u32,
        busy: &'static [(&'static str, usize)],
        recycling: usize,
        candidates: Vec<Candidate>,
        want: Vec<&'static str>,
    }
    let sick_at = |key: &str, created: i64| Candidate {
        created_at: Some(at(created)),
        ..sick(key)
    };
    let cases = [
        Case {
            name: "one slot: the older of two tenants' unhealthy proxies",
            budget: 1,
            busy: &[],
            recycling: 0,
            candidates: vec![sick_at("a/x", 50), sick_at("b/y", 10)],
            want: vec!["b/y"],
        },
        Case {
            name: "two slots: a tenant with three sick proxies gets one, the other tenant one",
            budget: 2,
            busy: &[],
            recycling: 0,
            candidates: vec![
                sick_at("a/1", 1),
                sick_at("a/2", 2),
                sick_at("a/3", 3),
                sick_at("b/1", 9),
            ],
            want: vec!["a/1", "b/1"],
        },
        Case {
            name:
                "a tenant already recycling yields the free slot to another, however old its proxy",
            budget: 2,
            busy: &[("a", 1)],
            recycling: 1,
            candidates: vec![sick_at("a/2", 1), sick_at("b/1", 9)],
            want: vec!["b/1"],
        },
        Case {
            name: "alone, a tenant takes every free slot",
            budget: 3,
            busy: &[("a", 1)],
            recycling: 1,
            candidates: vec![sick_at("a/2", 1), sick_at("a/3", 2)],
            want: vec!["a/2", "a/3"],
        },
        Case {
            name: "unhealthy still goes before age, whoever's",
            budget: 1,
            busy: &[],
            recycling: 0,
            candidates: vec![old("a/old", 0), sick_at("a/sick", 5), old("b/old", 1)],
            want: vec!["a/sick"],
        },
    ];
    for c in cases {
        let busy = c.busy.iter().map(|(ns, n)| (ns.to_string(), *n)).collect();
        let got = admit_fair(
            MaxUnavailable::Count(c.budget),
            counts(10, 10 - c.recycling, c.recycling),
            false,
            c.candidates,
            &busy,
        );
        assert_eq!(got, c.want, "{}", c.name);
    }
}
