//! System test of a ProxyPool's autoscaler (issue 35) on a gcp provider:
//! the real operator binary on the real test cluster, the real Google
//! client against the Compute stand-in, every instance's address a real
//! Squid on loopback, and the crawler kit (`docs/examples/crawler.py`,
//! Python `requests`) as 40 crawler threads leasing from the pool.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{ProxyPool, ProxyPoolStatus};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

use crate::e2e_pool_gcp::PoolWorld;
use crate::gcp_standin::ZONE;
use crate::support::{self, crawler, eventually, squid};

const TOKEN: &str = "pool-autoscale-token";

fn pool_spec(
    port: u16,
    target: std::net::SocketAddr,
    provider: &str,
    autoscale: serde_json::Value,
) -> serde_json::Value {
    json!({
        "replicas": 1,
        "autoscale": autoscale,
        "template": {"spec": {
            "provider": provider,
            "port": port,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200, "failureThreshold": 20},
        }},
    })
}

fn pool(name: &str, spec: serde_json::Value) -> ProxyPool {
    serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn condition<'a>(s: &'a ProxyPoolStatus, t: &str) -> Option<(&'a str, &'a str, &'a str)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

/// With `autoscale` min 1 max 6, 40 crawler threads leasing from the pool
/// (one lease a proxy) grow it to 6 and no further, every thread getting
/// its pages; when they stop, it shrinks back to 1 once the stabilization
/// window has passed; with `scaleToZeroAfter` it then goes to 0, and the
/// next acquire is answered `503 pool_scaling_up` with a Retry-After and
/// brings it back. Each change is in `status.lastScale` and an Event. A
/// pool on a provider that is not configured, and one whose autoscale
/// cannot be acted on, say which field and value in their status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_crawlers_grow_a_pool_to_its_max_it_shrinks_after_the_window_sleeps_and_wakes() {
    squid::require();
    crawler::require_python_requests();
    // Leases of 10 s: at its max, a refused crawler waits until a lease
    // ends, well inside the 20 s window.
    let w = PoolWorld::start("pool-auto", TOKEN, "10s").await;
    let (ground, standin, target, port, api) = (&w.ground, &w.standin, w.target, w.port, w.api);
    let log = || w.log();
    let pools: Api<ProxyPool> = ground.api();
    let autoscale = json!({"minReplicas": 1, "maxReplicas": 6, "scaleDownStabilization": "20s"});
    pools
        .create(
            &PostParams::default(),
            &pool("auto", pool_spec(port, target, "gcp-eu", autoscale)),
        )
        .await
        .unwrap();
    // Bad input the API server cannot judge: shown on the status.
    let unknown = pool_spec(port, target, "nope", json!({"maxReplicas": 2}));
    // Kept at its replicas as written (0: no instance to count below).
    let mut too_long = pool_spec(
        port,
        target,
        "gcp-eu",
        json!({"maxReplicas": 2, "scaleToZeroAfter": "2d"}),
    );
    too_long["replicas"] = json!(0);
    for (name, spec) in [("unknown", unknown), ("too-long", too_long)] {
        pools
            .create(&PostParams::default(), &pool(name, spec))
            .await
            .unwrap();
    }
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/auto",
        "--timeout=120s",
    ]);

    // Watch the size while the crawlers run: never above 6.
    let peak = Arc::new(AtomicI32::new(0));
    let sampling = {
        let (pools, peak) = (pools.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(p) = pools.get("auto").await {
                    peak.fetch_max(p.spec.replicas, Ordering::SeqCst);
                    peak.fetch_max(p.status.map(|s| s.replicas).unwrap_or(0), Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let started = Instant::now();
    let url = format!("http://{target}/");
    // The crawler kit on pool `auto` with 10 s leases, then `more`.
    let kit = |more: &'static [&'static str]| {
        let mut args = vec!["--url", url.as_str(), "--pool", "auto", "--ttl", "10"];
        args.extend_from_slice(more);
        args
    };
    let mut crawlers = crawler::command(
        api,
        TOKEN,
        &kit(&[
            "--threads",
            "40",
            "--pages",
            "6",
            "--interval",
            "1",
            "--deadline",
            "300",
        ]),
    );
    crawlers.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || crawlers.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let crawled = started.elapsed();
    assert!(
        out.status.success(),
        "every crawler thread gets its pages:\n{}\n{}\n{}",
        stdout.lines().rev().take(30).collect::<Vec<_>>().join("\n"),
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    assert!(
        stdout.contains("threads: 40 of 40 fetched every page"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no lease now (409 no_capacity)"),
        "demand outran the pool at first: {stdout}"
    );
    sampling.abort();
    let p = pools.get("auto").await.unwrap();
    let status = p.status.clone().unwrap();
    println!(
        "40 crawlers done after {crawled:?}; pool peak {}, now {:?}",
        peak.load(Ordering::SeqCst),
        status.last_scale
    );
    assert_eq!(
        peak.load(Ordering::SeqCst),
        6,
        "grown to max and no further: {status:?}\n{}",
        log()
    );
    assert_eq!(
        standin.calls_of("insert"),
        6,
        "six instances, none past max"
    );

    // Crawlers gone: back to min once the 20 s window has passed.
    let stopped = Instant::now();
    let shrunk = eventually("the pool back at 1", Duration::from_secs(120), || async {
        let p = pools.get("auto").await.ok()?;
        let s = p.status?;
        (p.spec.replicas == 1 && s.replicas == 1 && s.ready_replicas == 1).then_some(s)
    })
    .await;
    // Down in one step, or through a size the last crawlers still wanted.
    let last = shrunk.last_scale.clone().unwrap();
    assert_eq!(
        (last.to, last.reason.as_str()),
        (1, "LowDemand"),
        "{last:?}"
    );
    assert!(
        stopped.elapsed() >= Duration::from_secs(10),
        "not before the window: shrunk {:?} after the crawlers stopped",
        stopped.elapsed()
    );
    println!(
        "shrunk to 1 {:?} after the crawlers stopped: {}",
        stopped.elapsed(),
        last.message
    );

    // Idle for 10 s: zero.
    let idle = json!({"spec": {"autoscale": {"scaleToZeroAfter": "10s"}}});
    pools
        .patch("auto", &PatchParams::default(), &Patch::Merge(&idle))
        .await
        .unwrap();
    // At zero, and the last Proxy gone (its finalizer deletes its
    // instance first).
    let proxies = ground.proxies();
    let asleep = eventually(
        "the pool at 0, no Proxy left",
        Duration::from_secs(90),
        || async {
            let p = pools.get("auto").await.ok()?;
            let s = p.status?;
            let left = proxies
                .list(&ListParams::default().labels("crawl.example.com/pool=auto"))
                .await
                .ok()?;
            (p.spec.replicas == 0 && s.replicas == 0 && left.items.is_empty()).then_some(s)
        },
    )
    .await;
    assert_eq!(
        asleep.last_scale.as_ref().map(|l| l.reason.as_str()),
        Some("Idle")
    );

    // The next acquire: 503 with a Retry-After, and the pool comes back.
    let (code, retry, body) = support::api_call_retry_after(
        api,
        "POST",
        "/v1/leases",
        Some(TOKEN),
        json!({"filters": {"pool": "auto"}}).to_string().into(),
    )
    .await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (503, Some("pool_scaling_up")),
        "{body}"
    );
    assert!(
        retry.is_some_and(|s| (1..=60).contains(&s)),
        "Retry-After {retry:?}"
    );
    let (ok, lines) = crawler::run(
        api,
        TOKEN,
        &kit(&["--pages", "2", "--interval", "0.5", "--deadline", "120"]),
    )
    .await;
    assert!(
        ok,
        "the crawler gets its pages once the pool is back:\n{}",
        log()
    );
    let woke = pools.get("auto").await.unwrap();
    assert!(woke.spec.replicas >= 1);
    assert!(lines.iter().any(|l| l.contains("leased")), "{lines:?}");
    let events: Api<Event> = ground.api();
    let events: Vec<String> = support::events_regarding(&events, "auto")
        .await
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect();
    let events = events.join("\n");
    for (reason, words) in [
        ("Scaled", "scaled from 1 to 2"),
        ("Scaled", "scaled from 6 to"),
        ("Scaled", "scaled from 1 to 0"),
        ("Scaled", "scaled from 0 to 1"),
    ] {
        assert!(
            events
                .lines()
                .any(|l| l.starts_with(reason) && l.contains(words)),
            "no {reason} Event saying {words:?}:\n{events}"
        );
    }

    // The two bad pools say why, naming field and value; neither made a Proxy.
    for (name, reason, words) in [
        (
            "unknown",
            "InvalidSpec",
            "spec.template.spec.provider \"nope\" is not configured",
        ),
        (
            "too-long",
            "InvalidSpec",
            "spec.autoscale.scaleToZeroAfter \"2d\" is longer than 24h",
        ),
    ] {
        let s = pools.get(name).await.unwrap().status.unwrap_or_default();
        let ready = condition(&s, "Ready");
        assert!(
            ready.is_some_and(|(st, r, m)| st == "False" && r == reason && m.contains(words)),
            "{name}: {s:?}"
        );
    }
    let unknown = pools.get("unknown").await.unwrap().status.unwrap();
    assert_eq!(
        condition(&unknown, "ScalingLimited").map(|c| c.1),
        Some("UnknownProvider")
    );
    let made = proxies
        .list(&ListParams::default().labels("crawl.example.com/pool=unknown"))
        .await
        .unwrap();
    assert!(
        made.items.is_empty(),
        "no Proxy for a provider that is not configured"
    );
}

/// A refusal is demand only when a new Proxy of the pool could serve it:
/// 1,000 acquires naming an autoscaled pool (min 1, max 4) with a zone its
/// template does not place in are refused and the pool stays at 1 (no
/// instance made); then one acquire the template could serve, refused
/// while the pool's only Proxy is leased, grows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_asked_1000_times_for_what_it_cannot_make_does_not_grow() {
    squid::require();
    let w = PoolWorld::start("pool-impossible", TOKEN, "60s").await;
    let (ground, standin, target, port, api) = (&w.ground, &w.standin, w.target, w.port, w.api);
    let pools: Api<ProxyPool> = ground.api();
    let autoscale = json!({"minReplicas": 1, "maxReplicas": 4});
    pools
        .create(
            &PostParams::default(),
            &pool("imp", pool_spec(port, target, "gcp-eu", autoscale)),
        )
        .await
        .unwrap();
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/imp",
        "--timeout=120s",
    ]);
    let ask = |filters: serde_json::Value| async move {
        let body = json!({"ttlSeconds": 60, "filters": filters}).to_string();
        support::api_call(api, "POST", "/v1/leases", Some(TOKEN), body.into_bytes()).await
    };
    let started = Instant::now();
    for _ in 0..1_000 {
        let (s, v) = ask(json!({"pool": "imp", "zone": "us-nowhere1-a"})).await;
        assert_eq!(s, 409, "nothing matches: {v}");
    }
    let asked = started.elapsed();
    // Three looks of the controller (every 3 s) and then some.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let p = pools.get("imp").await.unwrap();
    println!(
        "1,000 impossible acquires in {asked:?}, every one 409; 12 s later replicas {}, last scale {:?}, instances made {}",
        p.spec.replicas,
        p.status.as_ref().and_then(|s| s.last_scale.clone()),
        standin.calls_of("insert")
    );
    assert_eq!(p.spec.replicas, 1, "stayed at min: {}", w.log());
    assert!(
        p.status
            .as_ref()
            .and_then(|s| s.last_scale.as_ref())
            .is_none(),
        "never scaled: {p:?}"
    );
    assert_eq!(standin.calls_of("insert"), 1, "one instance, min's");

    // The control: the pool's only Proxy leased, one acquire it could
    // serve is refused and grows it.
    let (s, v) = ask(json!({"pool": "imp", "zone": ZONE})).await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = ask(json!({"pool": "imp", "zone": ZONE})).await;
    assert_eq!(s, 409, "{v}");
    let grown = eventually(
        "the pool grown for a possible ask",
        Duration::from_secs(30),
        || async {
            let p = pools.get("imp").await.ok()?;
            (p.spec.replicas > 1).then_some(p.spec.replicas)
        },
    )
    .await;
    println!("one possible refused acquire: replicas 1 -> {grown}");
}
