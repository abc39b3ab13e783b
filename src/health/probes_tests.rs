use super::super::probe::ProbeError;
use super::super::threshold::Thresholds;
use super::*;
use crate::api::Proxy;
use serde_json::json;

pub(crate) fn defaults() -> Defaults {
    Defaults {
        url: Url::parse("https://www.gstatic.com/generate_204").unwrap(),
        expected_status: 204,
        external: std::sync::Arc::new(crate::tenancy::ExternalNamespaces::Any),
        deny: std::sync::Arc::new(deny_but_loopback()),
        credentials: std::sync::Arc::default(),
        full_every: 1,
    }
}

/// The default deny list less loopback: these tests' External Proxies
/// listen on 127.0.0.1.
pub(crate) fn deny_but_loopback() -> crate::tenancy::ProbeDenylist {
    let kept: Vec<&str> = crate::tenancy::DEFAULT_PROBE_DENY
        .split(',')
        .filter(|c| !c.starts_with("127.") && *c != "::1/128")
        .collect();
    crate::tenancy::ProbeDenylist::parse(&kept.join(",")).unwrap()
}

pub(crate) fn proxy(v: serde_json::Value) -> Proxy {
    serde_json::from_value(v).unwrap()
}

#[test]
fn probe_spec_table() {
    let base = |spec: serde_json::Value, status: serde_json::Value| {
        proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": spec, "status": status}),
        )
    };
    type Want<'a> = Option<(&'a str, u16, &'a str, u16, u64, u32, u32)>;
    let cases: Vec<(&str, Proxy, Want)> = vec![
        (
            "managed running",
            base(
                json!({"provider": "k", "port": 3128}),
                json!({"phase": "Running", "ip": "10.0.0.1"}),
            ),
            Some((
                "10.0.0.1",
                3128,
                "https://www.gstatic.com/generate_204",
                204,
                1,
                2,
                3,
            )),
        ),
        (
            "managed provisioning",
            base(
                json!({"provider": "k", "port": 3128}),
                json!({"phase": "Provisioning", "ip": "10.0.0.1"}),
            ),
            None,
        ),
        (
            "managed without ip",
            base(
                json!({"provider": "k", "port": 3128}),
                json!({"phase": "Running"}),
            ),
            None,
        ),
        (
            "external with overrides",
            base(
                json!({"mode": "External", "endpoint": {"host": "px.example", "port": 8080},
                    "healthCheck": {"url": "http://t.example/x", "expectedStatus": 200, "intervalSeconds": 7,
                        "timeoutSeconds": 2, "successThreshold": 1, "failureThreshold": 5}}),
                json!({}),
            ),
            Some(("px.example", 8080, "http://t.example/x", 200, 7, 1, 5)),
        ),
        (
            "bad url",
            base(
                json!({"mode": "External", "endpoint": {"host": "h", "port": 1}, "healthCheck": {"url": "ftp://x"}}),
                json!({}),
            ),
            None,
        ),
    ];
    for (name, p, want) in cases {
        let got = probe_spec(&p, &defaults()).map(|s| {
            (
                s.target.proxy_host.clone(),
                s.target.proxy_port,
                s.target.url.to_string(),
                s.target.expected_status,
                s.interval.as_secs(),
                s.thresholds.success,
                s.thresholds.failure,
            )
        });
        let want = want.map(|(h, p, u, e, i, s, f)| (h.to_string(), p, u.to_string(), e, i, s, f));
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn external_proxies_outside_the_allowlist_are_never_probed() {
    struct Case {
        name: &'static str,
        namespace: &'static str,
        spec: serde_json::Value,
        probed: bool,
        denylist_checked: bool,
    }
    let external = json!({"mode": "External", "endpoint": {"host": "10.9.9.9", "port": 3128}});
    let managed = json!({"provider": "k", "port": 3128});
    let cases = [
        Case {
            name: "External in an allowed namespace",
            namespace: "crawl",
            spec: external.clone(),
            probed: true,
            denylist_checked: true,
        },
        Case {
            name: "External in another namespace",
            namespace: "tenant-a",
            spec: external,
            probed: false,
            denylist_checked: false,
        },
        Case {
            name: "Managed anywhere: its address is the provider's",
            namespace: "tenant-a",
            spec: managed,
            probed: true,
            denylist_checked: false,
        },
    ];
    let d = Defaults {
        external: Arc::new(crate::tenancy::ExternalNamespaces::only(["crawl"])),
        ..defaults()
    };
    for c in cases {
        let p = proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": c.namespace, "uid": "u1"},
            "spec": c.spec, "status": {"phase": "Running", "ip": "10.0.0.1"}}),
        );
        let spec = probe_spec(&p, &d);
        assert_eq!(spec.is_some(), c.probed, "{}", c.name);
        if let Some(spec) = spec {
            assert_eq!(spec.target.deny.is_some(), c.denylist_checked, "{}", c.name);
        }
        let mut probes = Probes::new(d.clone());
        probes.sync([&p], 0);
        assert_eq!(
            probes.due(u64::MAX / 2, 10).len(),
            usize::from(c.probed),
            "{}: due",
            c.name
        );
    }
}

pub(crate) fn external(name: &str, uid: &str, port: u16) -> Proxy {
    external_in("ns", name, uid, port, 1)
}

/// An External Proxy in `namespace` on 127.0.0.1:`port`, its probe timing
/// out after `timeout_s`.
pub(crate) fn external_in(
    namespace: &str,
    name: &str,
    uid: &str,
    port: u16,
    timeout_s: u32,
) -> Proxy {
    proxy(
        json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port},
            "healthCheck": {"url": "http://127.0.0.1:9/", "expectedStatus": 200, "timeoutSeconds": timeout_s}}}),
    )
}

#[test]
fn redaction_and_spread() {
    let u = Url::parse("https://user:pw@h.example/p?token=x#f").unwrap();
    assert_eq!(redact(&u), "https://h.example/p");
    assert!(spread("ns/a", 1000) < 1000);
    assert_eq!(spread("ns/a", 1000), spread("ns/a", 1000));
}

fn ok(ms: u64) -> ProbeResult {
    ProbeResult {
        ok: true,
        latency: Duration::from_millis(ms),
        error: None,
    }
}

fn failed(e: ProbeError) -> ProbeResult {
    ProbeResult {
        ok: false,
        latency: Duration::from_millis(7),
        error: Some(e),
    }
}

/// `external` with an interval and thresholds of its own.
fn tuned(name: &str, uid: &str, interval: u64, success: u32, failure: u32) -> Proxy {
    proxy(
        json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 1},
            "healthCheck": {"url": "http://u:pw@t.example/x?k=v", "expectedStatus": 200,
                "intervalSeconds": interval, "successThreshold": success, "failureThreshold": failure}}}),
    )
}

fn keys(due: &[(Arc<str>, Arc<ProbeSpec>, Depth)]) -> Vec<&str> {
    let mut k: Vec<&str> = due.iter().map(|(k, _, _)| &**k).collect();
    k.sort();
    k
}

#[test]
fn sync_table() {
    let mut p = Probes::new(defaults());
    assert!(p.sync_due(0));
    let a = tuned("a", "u1", 1, 2, 3);
    let b = tuned("b", "u1", 1, 2, 3);
    let a2 = tuned("a", "u2", 1, 2, 3);
    let a2_tuned = tuned("a", "u2", 1, 1, 1);
    let pending = proxy(
        json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"provider": "k", "port": 3128}, "status": {"phase": "Provisioning"}}),
    );
    // (step, proxies, now, dropped)
    type Step<'a> = (&'a str, Vec<&'a Proxy>, u64, Vec<(&'a str, bool)>);
    let steps: Vec<Step> = vec![
        (
            "seed; nothing to probe for c",
            vec![&a, &b, &pending],
            0,
            vec![],
        ),
        ("unchanged", vec![&a, &b, &pending], 1000, vec![]),
        (
            "a recreated: starts over",
            vec![&a2, &b],
            2000,
            vec![("ns/a", false)],
        ),
        (
            "a's thresholds change: kept",
            vec![&a2_tuned, &b],
            3000,
            vec![],
        ),
        (
            "b deleted: gone",
            vec![&a2_tuned],
            4000,
            vec![("ns/b", true)],
        ),
    ];
    for (step, proxies, now, want) in steps {
        p.ask_walk();
        assert!(p.sync_due(now), "{step}");
        let got = p.sync(proxies, now);
        let got: Vec<(&str, bool)> = got.iter().map(|d| (d.key.as_str(), d.gone)).collect();
        assert_eq!(got, want, "{step}");
        assert!(!p.sync_due(now + 999), "{step}");
    }
    assert_eq!(p.len(), 1);
    let due = p.due(10_000, 10);
    assert_eq!(keys(&due), ["ns/a"]);
    assert_eq!(due[0].1.uid, "u2");
    assert_eq!(
        due[0].1.thresholds,
        Thresholds {
            success: 1,
            failure: 1
        }
    );
}

/// The watch's events, one Proxy at a time, keep the targets as a walk
/// of the same Proxies would: new ones seeded, an unchanged one left as
/// it is, a recreated one started over, one with nothing to probe and a
/// deleted one dropped as gone, the rate and the namespaces counted alike.
#[test]
fn events_one_proxy_at_a_time_keep_the_targets_as_a_walk_would() {
    let mut p = Probes::new(defaults());
    p.sync(std::iter::empty::<&Proxy>(), 0);
    let a = tuned("a", "u1", 1, 2, 3);
    let a2 = tuned("a", "u2", 1, 2, 3);
    let a2_slower = tuned("a", "u2", 4, 2, 3);
    let b = tuned("b", "u1", 2, 2, 3);
    let other = external_in("other", "x", "u1", 1, 1);
    let pending = proxy(
        json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "b", "namespace": "ns", "uid": "u9"},
        "spec": {"provider": "k", "port": 3128}, "status": {"phase": "Provisioning"}}),
    );
    // (step, namespace/name, the store's object now, dropped, the store after)
    type Step<'a> = (
        &'a str,
        (&'a str, &'a str),
        Option<&'a Proxy>,
        Option<(&'a str, bool)>,
        Vec<&'a Proxy>,
    );
    let steps: Vec<Step> = vec![
        ("a appears", ("ns", "a"), Some(&a), None, vec![&a]),
        ("b appears", ("ns", "b"), Some(&b), None, vec![&a, &b]),
        (
            "x in another namespace",
            ("other", "x"),
            Some(&other),
            None,
            vec![&a, &b, &other],
        ),
        (
            "a unchanged",
            ("ns", "a"),
            Some(&a),
            None,
            vec![&a, &b, &other],
        ),
        (
            "a recreated: starts over",
            ("ns", "a"),
            Some(&a2),
            Some(("ns/a", false)),
            vec![&a2, &b, &other],
        ),
        (
            "a probed less often: kept",
            ("ns", "a"),
            Some(&a2_slower),
            None,
            vec![&a2_slower, &b, &other],
        ),
        (
            "b recreated with nothing to probe: gone",
            ("ns", "b"),
            Some(&pending),
            Some(("ns/b", true)),
            vec![&a2_slower, &other],
        ),
        (
            "x deleted: gone",
            ("other", "x"),
            None,
            Some(("other/x", true)),
            vec![&a2_slower],
        ),
        (
            "x deleted again",
            ("other", "x"),
            None,
            None,
            vec![&a2_slower],
        ),
    ];
    for (step, at, object, want, store) in steps {
        let got = p.sync_one(at, object, 1000);
        let got = got.as_ref().map(|d| (d.key.as_str(), d.gone));
        assert_eq!(got, want, "{step}");
        let mut walked = Probes::new(defaults());
        walked.sync(store, 0);
        assert_eq!(p.len(), walked.len(), "{step}");
        assert!((p.rate() - walked.rate()).abs() < 1e-9, "{step}");
        assert_eq!(p.namespaces, walked.namespaces, "{step}");
    }
    assert_eq!(p.walks(), 1, "only the first walk");
    let due = p.due(10_000, 10);
    assert_eq!(keys(&due), ["ns/a"]);
    assert_eq!(due[0].1.uid, "u2");
}

/// A walk is due at once, then every minute, or a second after the last
/// once one is asked for.
#[test]
fn a_walk_is_due_at_start_once_asked_or_each_minute() {
    let mut p = Probes::new(defaults());
    assert!(p.sync_due(0));
    p.sync(std::iter::empty::<&Proxy>(), 0);
    assert!(!p.sync_due(30_000), "nothing asked");
    assert!(p.sync_due(WALK_EVERY.as_millis() as u64), "the safety net");
    p.ask_walk();
    assert!(!p.sync_due(999), "asked, within a second of the last");
    assert!(p.sync_due(1000), "asked");
    p.sync(std::iter::empty::<&Proxy>(), 1000);
    assert!(!p.sync_due(2000), "the ask was met");
}

#[test]
fn schedule_by_now() {
    let mut p = Probes::new(defaults());
    p.sync([&tuned("a", "u1", 2, 1, 1), &tuned("b", "u1", 2, 1, 1)], 0);
    // Both are seeded within their first interval.
    let first = p.due(1999, 10);
    assert_eq!(keys(&first), ["ns/a", "ns/b"]);
    // In flight: not due again, and nothing to wait for but the sync.
    assert!(p.due(100_000, 10).is_empty());
    assert_eq!(p.wait(2000, 4), SYNC_EVERY);
    assert_eq!(p.wait(2000, 0), SYNC_EVERY);
    let spec = first[0].1.clone();
    // Started at 2000, done at 2100: due one interval after the start.
    p.complete("ns/a", (&spec, Depth::Full), 2000, 2100, Utc::now(), &ok(5));
    assert_eq!(p.wait(3500, 4), Duration::from_millis(500));
    assert_eq!(p.wait(3500, 0), SYNC_EVERY);
    assert!(p.due(3999, 10).is_empty());
    assert_eq!(keys(&p.due(4000, 10)), ["ns/a"]);
    // A probe slower than its interval is due again at once.
    p.complete("ns/a", (&spec, Depth::Full), 4000, 9000, Utc::now(), &ok(5));
    assert_eq!(p.wait(9000, 1), Duration::ZERO);
    assert_eq!(keys(&p.due(9000, 1)), ["ns/a"]);
    // One that could not start is rescheduled as if it had run.
    p.requeue("ns/a", 9000);
    assert!(p.due(10_999, 1).is_empty());
    assert_eq!(keys(&p.due(11_000, 1)), ["ns/a"]);
    // A limit of zero pops nothing.
    p.complete(
        "ns/a",
        (&spec, Depth::Full),
        11_000,
        11_000,
        Utc::now(),
        &ok(5),
    );
    assert!(p.due(20_000, 0).is_empty());
}

#[test]
fn results_fold_into_verdicts() {
    let refused = || ProbeError::Refused("Connection refused (os error 111)".into());
    let status = || ProbeError::Status {
        who: "target",
        status: 503,
        expected: 200,
    };
    // (result, what it amounts to: None quiet, Some((healthy, change, message)))
    type Want<'a> = Option<(bool, Change, &'a str)>;
    let passed = "probe of http://t.example/x through the proxy passed";
    let cases: Vec<(&str, Vec<(ProbeResult, Want)>)> = vec![
        (
            "first ok, two failures quiet, the third flips",
            vec![
                (ok(10), Some((true, Change::First, passed))),
                (failed(refused()), None),
                (failed(status()), None),
                (
                    failed(status()),
                    Some((
                        false,
                        Change::Flip,
                        "target answered status 503, expected 200",
                    )),
                ),
                (ok(10), None),
                (ok(10), Some((true, Change::Flip, passed))),
                // Within a minute of the last write: not worth one.
                (ok(500), None),
            ],
        ),
        (
            "first failure is reported in plain words",
            vec![(
                failed(refused()),
                Some((
                    false,
                    Change::First,
                    "connecting to the proxy: Connection refused (os error 111)",
                )),
            )],
        ),
        (
            "a failure without an error",
            vec![(
                ProbeResult {
                    ok: false,
                    latency: Duration::ZERO,
                    error: None,
                },
                Some((false, Change::First, "probe failed")),
            )],
        ),
    ];
    for (name, seq) in cases {
        let mut p = Probes::new(defaults());
        p.sync([&tuned("a", "u1", 1, 2, 3)], 0);
        let spec = p.due(1000, 1).pop().unwrap().1;
        let at = Utc::now();
        for (i, (result, want)) in seq.into_iter().enumerate() {
            let got = p.complete("ns/a", (&spec, Depth::Full), 0, 0, at, &result);
            let want = match want {
                None => Folded::Quiet,
                Some((healthy, change, message)) => Folded::Publish(Verdict {
                    uid: "u1".into(),
                    change,
                    report: HealthReport {
                        healthy,
                        latency_ms: result.latency.as_millis() as u64,
                        probed_at: at,
                        message: message.into(),
                    },
                }),
            };
            assert_eq!(got, want, "{name}, step {i}");
        }
    }
}

/// A latency that moved is written once a minute at most per proxy; a
/// flip is written at once, whatever the budget.
#[test]
fn latency_only_writes_are_spaced() {
    use crate::health::latency_writes::MIN_INTERVAL_MS as MIN;
    let mut p = Probes::new(defaults());
    p.sync([&tuned("a", "u1", 1, 1, 1)], 0);
    let spec = p.due(1000, 1).pop().unwrap().1;
    let at = Utc::now();
    let mut at_time =
        |now: u64, r: ProbeResult| match p.complete("ns/a", (&spec, Depth::Full), now, now, at, &r)
        {
            Folded::Publish(v) => Some((v.change, v.report.latency_ms)),
            _ => None,
        };
    assert_eq!(at_time(0, ok(10)), Some((Change::First, 10)));
    assert_eq!(
        at_time(1_000, ok(500)),
        None,
        "a second after the last write"
    );
    assert_eq!(
        at_time(MIN, ok(900)),
        Some((Change::Latency, 900)),
        "a minute after: written"
    );
    assert_eq!(
        at_time(MIN + 1, failed(ProbeError::Timeout(Duration::from_secs(1)))),
        Some((Change::Flip, 7)),
        "a flip right after a write"
    );
}

#[test]
fn stale_and_pruned_results_are_not_folded() {
    let mut p = Probes::new(defaults());
    let old = probe_spec(&external("a", "u1", 1), &defaults()).unwrap();
    let moved = probe_spec(&external("a", "u2", 2), &defaults()).unwrap();
    p.sync([&external("a", "u2", 1)], 0);
    let at = Utc::now();
    assert_eq!(
        p.complete("ns/a", (&old, Depth::Full), 0, 0, at, &ok(1)),
        Folded::Stale
    );
    let mut other_target = moved.clone();
    other_target.uid = "u2".into();
    assert_eq!(
        p.complete("ns/a", (&other_target, Depth::Full), 0, 0, at, &ok(1)),
        Folded::Stale
    );
    assert_eq!(p.state("ns/a"), None);
    p.sync([], 1000);
    assert!(p.is_empty());
    assert_eq!(
        p.complete("ns/a", (&old, Depth::Full), 0, 0, at, &ok(1)),
        Folded::Gone
    );
    assert!(p.due(u64::MAX / 2, 10).is_empty());
}

#[test]
fn only_a_new_verdict_is_news() {
    struct Case {
        name: &'static str,
        change: Change,
        want: bool,
    }
    let cases = [
        Case {
            name: "the first result",
            change: Change::First,
            want: true,
        },
        Case {
            name: "a flip",
            change: Change::Flip,
            want: true,
        },
        Case {
            name: "only the latency moved",
            change: Change::Latency,
            want: false,
        },
    ];
    for c in cases {
        let v = Verdict {
            uid: "u1".into(),
            change: c.change,
            report: HealthReport {
                healthy: true,
                latency_ms: 1,
                probed_at: Utc::now(),
                message: String::new(),
            },
        };
        assert_eq!(v.is_news(), c.want, "{}", c.name);
    }
}

#[test]
fn depth_table() {
    use Depth::{Connect, Full};
    // tunnel (https), probes since the last passing full one, every.
    let cases = [
        (true, None, 10, Full),
        (true, Some(0), 10, Connect),
        (true, Some(8), 10, Connect),
        (true, Some(9), 10, Full),
        (true, Some(0), 1, Full),
        (true, Some(0), 2, Connect),
        (true, Some(1), 2, Full),
        (false, Some(0), 10, Full),
        (true, Some(u32::MAX), 10, Full),
    ];
    for (tunnel, since, every, want) in cases {
        assert_eq!(
            Depth::next(tunnel, since, every),
            want,
            "{tunnel} {since:?} {every}"
        );
    }
}

/// An https URL with a full fetch every 3rd probe: full, light, light,
/// full...; a failed probe, light or full, makes the next one full.
#[test]
fn light_probes_between_full_ones_until_a_failure() {
    let d = Defaults {
        full_every: 3,
        ..defaults()
    };
    // The operator's default URL (https here, then http).
    let a = proxy(
        json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 1}}}),
    );
    let mut p = Probes::new(d.clone());
    p.sync([&a], 0);
    let mut now = 0;
    let mut run = |p: &mut Probes, result: ProbeResult| {
        now += 1000;
        let (key, spec, depth) = p.due(now, 1).pop().expect("due");
        p.complete(&key, (&spec, depth), now, now, Utc::now(), &result);
        depth
    };
    use Depth::{Connect, Full};
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(run(&mut p, ok(5)));
    }
    assert_eq!(got, [Full, Connect, Connect, Full, Connect, Connect]);
    let fail = ProbeResult {
        ok: false,
        latency: Duration::from_millis(5),
        error: Some(ProbeError::ProxyRefused(502)),
    };
    assert_eq!(run(&mut p, fail.clone()), Full);
    assert_eq!(
        run(&mut p, fail),
        Full,
        "a failure makes the next probe full"
    );
    assert_eq!(run(&mut p, ok(5)), Full);
    assert_eq!(run(&mut p, ok(5)), Connect);
    // An http URL is always fetched whole.
    let mut p = Probes::new(Defaults {
        url: Url::parse("http://example.com/").unwrap(),
        ..d
    });
    p.sync([&a], 0);
    for _ in 0..4 {
        assert_eq!(run(&mut p, ok(5)), Full);
    }
}

/// A Proxy whose resourceVersion did not move is not converted again at a
/// sync (the cache hands every Proxy over every second); one whose
/// version moved is.
#[test]
fn an_unchanged_resource_version_skips_the_conversion() {
    let at = |rv: &str, port: u16| {
        let mut p = external("a", "u1", port);
        p.metadata.resource_version = Some(rv.into());
        p
    };
    let mut p = Probes::new(defaults());
    assert!(p.sync([&at("1", 1)], 0).is_empty());
    let port = |p: &mut Probes| p.due(u64::MAX / 2, 1).pop().unwrap().1.target.proxy_port;
    // The same version with another port: taken for unchanged (an API
    // server never does this; it shows the conversion was skipped).
    assert!(p.sync([&at("1", 2)], 1000).is_empty());
    assert_eq!(port(&mut p), 1);
    // A new version: the new endpoint starts over.
    let mut p = Probes::new(defaults());
    p.sync([&at("1", 1)], 0);
    let dropped = p.sync([&at("2", 2)], 1000);
    assert_eq!(
        dropped,
        [Dropped {
            key: "ns/a".into(),
            gone: false
        }]
    );
    assert_eq!(port(&mut p), 2);
    // Gone, then back under the same version: converted again.
    p.sync([], 2000);
    assert!(p.is_empty());
    p.sync([&at("2", 2)], 3000);
    assert_eq!(p.len(), 1);
}

/// Ids are interned and reused: a Proxy deleted while its probe runs
/// gives its id to the next new one, and the late result is dropped
/// instead of landing on the newcomer's schedule or thresholds.
#[test]
fn a_freed_id_taken_by_another_proxy_gets_none_of_the_old_results() {
    let mut p = Probes::new(defaults());
    let a = tuned("a", "u1", 1, 1, 1);
    p.sync([&a], 0);
    let (key, spec, depth) = p.due(1000, 1).pop().expect("a due");
    assert_eq!(&*key, "ns/a");
    // a goes while its probe is in flight; b comes and takes its id.
    let dropped = p.sync(std::iter::empty::<&Proxy>(), 1000);
    assert_eq!(
        dropped,
        vec![Dropped {
            key: "ns/a".into(),
            gone: true
        }]
    );
    p.sync([&tuned("b", "u2", 1, 1, 1)], 2000);
    assert_eq!(p.len(), 1);
    let at = Utc::now();
    assert_eq!(
        p.complete(&key, (&spec, depth), 1000, 2100, at, &ok(1)),
        Folded::Gone
    );
    assert_eq!(p.state("ns/b"), None, "b has no result yet");
    assert_eq!(p.state("ns/a"), None);
    // b is scheduled as a new Proxy: due within its first interval, and
    // its own result is folded.
    let (key, spec, depth) = p.due(3000, 1).pop().expect("b due");
    assert_eq!(&*key, "ns/b");
    assert!(matches!(
        p.complete(&key, (&spec, depth), 3000, 3001, at, &ok(1)),
        Folded::Publish(_)
    ));
    assert_eq!(p.state("ns/b").and_then(|s| s.healthy), Some(true));
    // a back under its old name is a new Proxy again.
    p.sync([&tuned("b", "u2", 1, 1, 1), &a], 4000);
    assert_eq!(p.len(), 2);
    assert_eq!(p.state("ns/a"), None);
}

/// The engine numbers its targets in the table it shares with the Proxy
/// store: a probed Proxy has the store's id, the engine's hold keeps it
/// while the store has let go (a delete seen first by the store), and the
/// slot is free again only when both let go.
#[test]
fn targets_use_the_ids_the_store_gave_and_hold_them_while_probed() {
    use crate::proxy_ids::{Holder, ProxyIds};
    let ids = ProxyIds::new();
    let (a_id, _) = ids.hold("ns/a", Holder::Store);
    let mut p = Probes::new(defaults()).sharing(ids.clone());
    let a = tuned("a", "u1", 1, 1, 1);
    p.sync([&a], 0);
    assert_eq!(ids.get("ns/a"), Some(a_id), "the store's id, not a new one");
    assert!(ids.held(a_id, Holder::Engine));
    assert_eq!(ids.len(), 1, "no second table of keys");
    // The store lets go first: the engine still probes a under its id.
    ids.release(a_id, Holder::Store);
    assert_eq!(ids.key(a_id).as_deref(), Some("ns/a"));
    let (key, _, _) = p.due(1000, 1).pop().expect("a due");
    assert_eq!(&*key, "ns/a");
    // The engine's event comes: the id is free.
    assert_eq!(
        p.sync_one(("ns", "a"), None, 1000).map(|d| d.gone),
        Some(true)
    );
    assert_eq!(ids.key(a_id), None);
    assert!(ids.is_empty());
    assert!(p.is_empty());
}
