use chrono::TimeZone;

use super::*;

fn k(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap()
}

fn at(s: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::seconds(s)
}

const SMALL: Caps = Caps {
    total: 3,
    per_proxy: 2,
};

/// One step on a map: an insert (key or site, proxy, end in seconds) and
/// what it must answer.
struct Put {
    key: &'static str,
    proxy: &'static str,
    until: i64,
    want: Result<(), Full>,
}

struct Case {
    name: &'static str,
    puts: &'static [Put],
    /// Swept at this second (after the puts), if at all.
    sweep_at: Option<i64>,
    /// Then held: entries in total.
    held: usize,
}

const fn put(key: &'static str, proxy: &'static str, until: i64, want: Result<(), Full>) -> Put {
    Put {
        key,
        proxy,
        until,
        want,
    }
}

const CASES: &[Case] = &[
    Case {
        name: "within the caps everything is kept",
        puts: &[put("a", "p", 10, Ok(())), put("b", "q", 10, Ok(()))],
        sweep_at: None,
        held: 2,
    },
    Case {
        name: "one proxy holds at most per_proxy",
        puts: &[
            put("a", "p", 10, Ok(())),
            put("b", "p", 10, Ok(())),
            put("c", "p", 10, Err(Full::PerProxy)),
            put("c", "q", 10, Ok(())),
        ],
        sweep_at: None,
        held: 3,
    },
    Case {
        name: "the map holds at most total",
        puts: &[
            put("a", "p", 10, Ok(())),
            put("b", "q", 10, Ok(())),
            put("c", "r", 10, Ok(())),
            put("d", "s", 10, Err(Full::Total)),
        ],
        sweep_at: None,
        held: 3,
    },
    Case {
        name: "the same entry again is an update, not a new one",
        puts: &[
            put("a", "p", 10, Ok(())),
            put("b", "p", 10, Ok(())),
            put("a", "p", 20, Ok(())),
        ],
        sweep_at: None,
        held: 2,
    },
    Case {
        name: "the sweep frees room: ended entries go, live ones stay",
        puts: &[
            put("a", "p", 5, Ok(())),
            put("b", "p", 10, Ok(())),
            put("c", "q", 10, Ok(())),
        ],
        sweep_at: Some(5),
        held: 2,
    },
    Case {
        name: "a later end is kept over an earlier one",
        puts: &[put("a", "p", 20, Ok(())), put("a", "p", 5, Ok(()))],
        sweep_at: Some(10),
        held: 1,
    },
];

#[test]
fn sticky_keys_are_bounded_and_swept() {
    for c in CASES {
        let mut m = StickyMap::new(SMALL);
        for (i, p) in c.puts.iter().enumerate() {
            assert_eq!(
                m.remember(p.key, &k(p.proxy), at(p.until)),
                p.want,
                "{}: put {i}",
                c.name
            );
        }
        if let Some(s) = c.sweep_at {
            m.sweep(at(s));
        }
        assert_eq!(m.len(), c.held, "{}", c.name);
    }
}

#[test]
fn site_cooldowns_are_bounded_and_swept() {
    for c in CASES {
        let mut m = Cooldowns::new(SMALL, 100, 2);
        let me: Arc<str> = Arc::from("c");
        for (i, p) in c.puts.iter().enumerate() {
            assert_eq!(
                m.put_site(&k(p.proxy), p.key, &me, at(p.until)),
                p.want,
                "{}: put {i}",
                c.name
            );
        }
        if let Some(s) = c.sweep_at {
            m.sweep(at(s));
        }
        assert_eq!(m.sites(), c.held, "{}", c.name);
    }
}

#[test]
fn a_sticky_key_moving_to_another_proxy_frees_its_old_slot() {
    let mut m = StickyMap::new(SMALL);
    m.remember("a", &k("p"), at(10)).unwrap();
    m.remember("b", &k("p"), at(10)).unwrap();
    m.remember("a", &k("q"), at(10)).unwrap();
    assert_eq!(m.get("a", t0()), Some(&k("q")));
    m.remember("c", &k("p"), at(10)).unwrap();
    assert_eq!(m.len(), 3);
    assert_eq!(m.remember("d", &k("r"), at(10)), Err(Full::Total));
    // c moves to q (its slot on p is freed first), filling q.
    m.remember("c", &k("q"), at(10)).unwrap();
    // Moving to a full proxy forgets the key.
    assert_eq!(m.remember("b", &k("q"), at(10)), Err(Full::PerProxy));
    assert_eq!(m.get("b", t0()), None);
    assert_eq!(m.len(), 2);
}

#[test]
fn ended_entries_answer_no_before_any_sweep() {
    let mut m = StickyMap::new(SMALL);
    m.remember("a", &k("p"), at(10)).unwrap();
    assert_eq!(m.get("a", at(9)), Some(&k("p")));
    assert_eq!(m.get("a", at(10)), None);
    let mut c = Cooldowns::new(SMALL, 100, 1);
    c.put_site(&k("p"), "site", &"a".into(), at(10)).unwrap();
    c.put_global(&k("q"), &"a".into(), at(10));
    let site = digest("site");
    assert!(c.blocks(&k("p"), Some(&site), "a", at(9)));
    assert!(!c.blocks(&k("p"), Some(&site), "a", at(10)));
    assert!(
        !c.blocks(&k("p"), None, "b", at(9)),
        "a site cooldown is not global"
    );
    assert!(c.blocks(&k("q"), Some(&site), "a", at(9)));
    assert!(!c.blocks(&k("q"), None, "b", at(10)));
}

#[test]
fn dates_saturate_instead_of_overflowing() {
    let huge = Duration::from_secs(u64::MAX);
    assert_eq!(later(t0(), huge), DateTime::<Utc>::MAX_UTC);
    assert_eq!(
        later(DateTime::<Utc>::MAX_UTC, Duration::from_secs(1)),
        DateTime::<Utc>::MAX_UTC
    );
    assert_eq!(later(t0(), Duration::from_secs(5)), at(5));
}

#[test]
fn digests_are_16_bytes_and_distinct() {
    let long = "x".repeat(256);
    assert_ne!(digest("a"), digest("b"));
    assert_ne!(digest(&long), digest("a"));
    assert_eq!(digest("a"), digest("a"));
}

#[test]
fn a_global_cooldown_for_everyone_needs_reports_from_enough_clients() {
    struct Case {
        name: &'static str,
        min_clients: usize,
        /// (client, until) reports on one proxy.
        reports: &'static [(&'static str, i64)],
        /// (client, at second, withheld?).
        checks: &'static [(&'static str, i64, bool)],
    }
    let cases = [
        Case {
            name: "one client withholds the proxy from itself only",
            min_clients: 2,
            reports: &[("a", 10)],
            checks: &[("a", 0, true), ("b", 0, false), ("a", 10, false)],
        },
        Case {
            name: "the same client twice is still one client",
            min_clients: 2,
            reports: &[("a", 10), ("a", 20)],
            checks: &[("a", 15, true), ("b", 0, false)],
        },
        Case {
            name: "two clients withhold it from everyone",
            min_clients: 2,
            reports: &[("a", 10), ("b", 20)],
            checks: &[
                ("c", 0, true),
                ("c", 10, false),
                ("a", 10, false),
                ("b", 10, true),
            ],
        },
        Case {
            name: "with a quorum of one, any report counts for everyone",
            min_clients: 1,
            reports: &[("a", 10)],
            checks: &[("b", 0, true), ("b", 10, false)],
        },
        Case {
            name: "a new client replaces the report ending first",
            min_clients: 2,
            reports: &[("a", 5), ("b", 20), ("c", 30)],
            checks: &[
                ("d", 0, true),
                ("a", 0, true),
                ("d", 20, false),
                ("c", 20, true),
            ],
        },
    ];
    for c in cases {
        let mut m = Cooldowns::new(SMALL, 100, c.min_clients);
        for (who, until) in c.reports {
            m.put_global(&k("p"), &Arc::from(*who), at(*until));
        }
        for (who, t, want) in c.checks {
            assert_eq!(
                m.blocks(&k("p"), None, who, at(*t)),
                *want,
                "{}: {who} at {t}",
                c.name
            );
        }
    }
}

#[test]
fn a_site_report_withholds_the_proxy_from_its_client_until_enough_clients_agree() {
    struct Case {
        name: &'static str,
        min_clients: usize,
        /// (client, proxy, site, until) reports.
        reports: &'static [(&'static str, &'static str, &'static str, i64)],
        /// (client, proxy, site, at second, withheld?).
        checks: &'static [(&'static str, &'static str, &'static str, i64, bool)],
    }
    let cases = [
        Case {
            name: "one client's report is that client's",
            min_clients: 2,
            reports: &[("a", "p", "s", 10)],
            checks: &[
                ("a", "p", "s", 0, true),
                ("b", "p", "s", 0, false),
                ("a", "p", "t", 0, false),
                ("a", "q", "s", 0, false),
                ("a", "p", "s", 10, false),
            ],
        },
        Case {
            name: "the same client twice is still one client",
            min_clients: 2,
            reports: &[("a", "p", "s", 10), ("a", "p", "s", 20)],
            checks: &[("a", "p", "s", 15, true), ("b", "p", "s", 0, false)],
        },
        Case {
            name: "two clients on the same proxy and site withhold it from everyone",
            min_clients: 2,
            reports: &[("a", "p", "s", 10), ("b", "p", "s", 20)],
            checks: &[
                ("c", "p", "s", 0, true),
                ("c", "p", "t", 0, false),
                ("c", "p", "s", 10, false),
                ("b", "p", "s", 10, true),
                ("a", "p", "s", 10, false),
            ],
        },
        Case {
            name: "two clients on different sites or proxies are no agreement",
            min_clients: 2,
            reports: &[
                ("a", "p", "s", 10),
                ("b", "p", "t", 10),
                ("c", "q", "s", 10),
            ],
            checks: &[("d", "p", "s", 0, false), ("d", "p", "t", 0, false)],
        },
        Case {
            name: "with a quorum of one, any report counts for everyone",
            min_clients: 1,
            reports: &[("a", "p", "s", 10)],
            checks: &[("b", "p", "s", 0, true), ("b", "p", "t", 0, false)],
        },
        Case {
            name: "a site report is no global report",
            min_clients: 2,
            reports: &[("a", "p", "s", 10), ("b", "p", "s", 10)],
            checks: &[("a", "p", "", 0, false)],
        },
    ];
    for c in cases {
        let mut m = Cooldowns::new(SMALL, 100, c.min_clients);
        for (who, p, site, until) in c.reports {
            m.put_site(&k(p), site, &Arc::from(*who), at(*until))
                .unwrap();
        }
        for (who, p, site, t, want) in c.checks {
            let d = (!site.is_empty()).then(|| digest(site));
            assert_eq!(
                m.blocks(&k(p), d.as_ref(), who, at(*t)),
                *want,
                "{}: {who} on {p} for {site:?} at {t}",
                c.name
            );
        }
    }
}

#[test]
fn one_client_keeps_at_most_its_cap_and_its_newest_reports_stay() {
    struct Case {
        name: &'static str,
        per_client: usize,
        /// (client, site, until) reports on proxy p.
        reports: &'static [(&'static str, &'static str, i64)],
        /// Then held: site entries, reports of a, reports of b.
        held: (usize, usize, usize),
        /// Sites a is still withheld from at second 0.
        a_withheld: &'static [&'static str],
    }
    let big = Caps {
        total: 100,
        per_proxy: 100,
    };
    let cases = [
        Case {
            name: "under the cap everything is kept",
            per_client: 3,
            reports: &[("a", "s1", 10), ("a", "s2", 11)],
            held: (2, 2, 0),
            a_withheld: &["s1", "s2"],
        },
        Case {
            name: "past the cap the report ending first makes room",
            per_client: 2,
            reports: &[("a", "s1", 10), ("a", "s2", 11), ("a", "s3", 12)],
            held: (2, 2, 0),
            a_withheld: &["s2", "s3"],
        },
        Case {
            name: "renewing a report takes no new room",
            per_client: 2,
            reports: &[("a", "s1", 10), ("a", "s2", 11), ("a", "s1", 30)],
            held: (2, 2, 0),
            a_withheld: &["s1", "s2"],
        },
        Case {
            name: "a renewed report ends last, so it is kept",
            per_client: 2,
            reports: &[
                ("a", "s1", 10),
                ("a", "s2", 11),
                ("a", "s1", 30),
                ("a", "s3", 12),
            ],
            held: (2, 2, 0),
            a_withheld: &["s1", "s3"],
        },
        Case {
            name: "one client's cap leaves another's reports alone",
            per_client: 2,
            reports: &[
                ("b", "s1", 10),
                ("a", "s1", 10),
                ("a", "s2", 11),
                ("a", "s3", 12),
            ],
            held: (3, 2, 1),
            a_withheld: &["s2", "s3"],
        },
    ];
    for c in cases {
        let mut m = Cooldowns::new(big, c.per_client, 2);
        for (who, site, until) in c.reports {
            m.put_site(&k("p"), site, &Arc::from(*who), at(*until))
                .unwrap();
        }
        let held = (m.sites(), m.site_reports_of("a"), m.site_reports_of("b"));
        assert_eq!(held, c.held, "{}", c.name);
        for site in ["s1", "s2", "s3"] {
            assert_eq!(
                m.blocks(&k("p"), Some(&digest(site)), "a", t0()),
                c.a_withheld.contains(&site),
                "{}: {site}",
                c.name
            );
        }
    }
}

#[test]
fn ten_thousand_reports_from_one_client_keep_its_cap() {
    let caps = Caps {
        total: MAX_COOLDOWN_SITES,
        per_proxy: MAX_COOLDOWN_SITES_PER_PROXY,
    };
    let mut m = Cooldowns::new(caps, MAX_SITE_REPORTS_PER_CLIENT, 2);
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    m.put_site(&k("p0"), "kept.example", &b, at(60)).unwrap();
    for i in 0..10_000 {
        let proxy = k(&format!("p{}", i % 20));
        let site = format!("site-{i}.example");
        // Past the per-proxy cap a report is not kept; the client's own
        // cap is what bounds it here.
        let _ = m.put_site(&proxy, &site, &a, at(60 + i));
        assert!(m.site_reports_of("a") <= MAX_SITE_REPORTS_PER_CLIENT);
    }
    assert_eq!(m.site_reports_of("a"), MAX_SITE_REPORTS_PER_CLIENT);
    assert_eq!(m.sites(), MAX_SITE_REPORTS_PER_CLIENT + 1);
    assert_eq!(m.site_reports(), MAX_SITE_REPORTS_PER_CLIENT + 1);
    assert!(
        m.blocks(&k("p0"), Some(&digest("kept.example")), "b", t0()),
        "another client's report stays"
    );
    assert!(m.blocks(&k("p19"), Some(&digest("site-9999.example")), "a", t0()));
    assert!(!m.blocks(&k("p0"), Some(&digest("site-0.example")), "a", t0()));
    m.sweep(at(100_000));
    assert_eq!((m.sites(), m.site_reports()), (0, 0));
    assert!(m.is_empty());
}

#[test]
fn the_hand_over_lists_reports_and_what_everyone_is_withheld_from() {
    let mut m = Cooldowns::new(SMALL, 100, 2);
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    m.put_site(&k("p"), "s", &a, at(10)).unwrap();
    m.put_site(&k("p"), "t", &a, at(10)).unwrap();
    m.put_site(&k("p"), "s", &b, at(20)).unwrap();
    m.put_site_everyone(&k("q"), digest("u"), at(30)).unwrap();
    let mut live: Vec<_> = m.live(t0()).collect();
    live.sort_by(|x, y| x.proxy.cmp(y.proxy));
    let p = &live[0];
    assert_eq!(
        p.sites,
        vec![(&digest("s"), at(10))],
        "agreed until the first ends"
    );
    assert_eq!(p.site_reports.len(), 3);
    let q = &live[1];
    assert_eq!(q.sites, vec![(&digest("u"), at(30))]);
    assert!(q.site_reports.is_empty());
    assert!(m.blocks(&k("q"), Some(&digest("u")), "anyone", at(29)));
    // Forgetting a proxy forgets its clients' reports too.
    m.forget_proxies(&HashSet::from([k("p")]));
    assert_eq!((m.sites(), m.site_reports()), (1, 0));
    m.retain_proxies(&HashSet::new());
    assert!(m.is_empty());
}
