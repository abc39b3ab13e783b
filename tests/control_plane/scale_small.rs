//! Issue 19's small scale run, the correctness half of the scale benchmark
//! (issue 34 keeps it in `make test`): the real operator binary on the real
//! test cluster (control plane only) with 200 External Proxies on one real
//! Squid on 127.0.0.1. The API server's audit log (one event per request)
//! shows what the operator asked of it; each Proxy's health check fetches
//! its own path of one target, so the target sees when each was probed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::api::PostParams;
use serde_json::{json, Value};

use crate::support::{self, condition, phase, squid, Operator};

/// When the API server received the request of audit event `e`.
fn received(e: &Value) -> Option<DateTime<Utc>> {
    e["requestReceivedTimestamp"].as_str()?.parse().ok()
}

/// The audit events of requests on Proxies with `verb`, received after
/// `since`, in namespace `ns` (`None`: cluster-wide requests).
fn proxy_requests(verb: &str, ns: Option<&str>, since: DateTime<Utc>) -> Vec<Value> {
    support::control_plane()
        .audit_events()
        .into_iter()
        .filter(|e| e["verb"] == verb && e["objectRef"]["resource"] == "proxies")
        .filter(|e| e["objectRef"]["namespace"].as_str() == ns)
        .filter(|e| received(e).is_some_and(|t| t >= since))
        .collect()
}

/// The distinct requests among `events` (a request logs one event per
/// stage).
fn distinct(events: &[Value]) -> BTreeSet<String> {
    events
        .iter()
        .filter_map(|e| e["auditID"].as_str().map(String::from))
        .collect()
}

/// When each path was fetched.
type Fetches = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

/// An HTTP target on 127.0.0.1 recording when each path is fetched; it
/// answers 500 on the paths in the returned set, 200 on the others.
async fn cadence_target() -> (SocketAddr, Fetches, Arc<Mutex<HashSet<String>>>) {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let fetches: Fetches = Arc::default();
    let failing: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (f, bad) = (fetches.clone(), failing.clone());
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let (f, bad) = (f.clone(), bad.clone());
            tokio::spawn(async move {
                let head = support::read_head(&mut c).await;
                let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                f.lock()
                    .unwrap()
                    .entry(path.clone())
                    .or_default()
                    .push(Instant::now());
                let status = if bad.lock().unwrap().contains(&path) {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = c.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, fetches, failing)
}

/// The operator's resident set size in KiB, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The operator command of `cmd` run from `SCALE_OPERATOR_BIN` when set
/// (another build, for the before/after figures of docs/performance.md).
fn with_binary(cmd: std::process::Command) -> std::process::Command {
    let Ok(bin) = std::env::var("SCALE_OPERATOR_BIN") else {
        return cmd;
    };
    let mut other = std::process::Command::new(bin);
    other.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => other.env(k, v),
            None => other.env_remove(k),
        };
    }
    other
}

/// 200 External Proxies applied at once all become Ready, each with a
/// Healthy=True verdict from a probe through the Squid (no verdict lost);
/// the operator follows them with one Proxy watch (the store every
/// subsystem reads; the controller opens none of its own); every
/// cluster-wide Proxy list of its orphan GC comes in pages of 500; each
/// Proxy is probed about once a second, never with a gap over the
/// engine's own bound (interval plus timeout); leases never go past
/// `--max-leases-per-proxy`; and when 20 targets start failing, those 20
/// and no others turn unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_external_proxies_are_ready_through_one_proxy_watch() {
    // `SCALE_N` runs it bigger for the memory figures (printed, not
    // asserted).
    let n: usize = std::env::var("SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    squid::require();
    let ground = support::ground_without_pods("scale").await;
    let (target, fetches, failing) = cadence_target().await;
    let port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        port,
        "scale200",
        "http_access allow me",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let api = support::loopback();
    let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"])
        .args(["--max-leases-per-proxy", &PER_PROXY.to_string()])
        .args(["--external-proxy-namespaces", &ground.ns])
        // GC sweeps (and lists every Proxy) within the test's time.
        .args(["--gc-interval", "3s"])
        .env("LOG_LEVEL", "info");
    let started_at = Utc::now();
    let log = dir.path().join("operator.log");
    let op = Operator::spawn(with_binary(cmd), &log);
    let proxies = ground.proxies();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("synced; ready") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the operator is not ready after 60 s; its log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let idle = rss_kib(op.pid());

    let started = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("ext-{i:04}")).collect();
    futures::stream::iter(names.iter())
        .map(|name| {
            let proxies = proxies.clone();
            let spec = json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port},
                "healthCheck": {"url": format!("http://{target}/p/{name}")}});
            async move {
                proxies
                    .create(&PostParams::default(), &support::proxy(name, spec))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    println!("applied {n} Proxies in {:?}", started.elapsed());

    let deadline = Instant::now() + Duration::from_secs(180);
    let mut peak = idle;
    let list = loop {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        peak = peak.max(rss_kib(op.pid()));
        let ready = list.iter().filter(|p| phase(p) == Some("Ready")).count();
        if ready == n {
            break list;
        }
        assert!(
            Instant::now() < deadline,
            "only {ready} of {n} Proxies Ready after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let ready_rss = rss_kib(op.pid());
    println!("{n} Proxies Ready {:?} after applying", started.elapsed());
    println!(
        "operator RSS: idle {idle} KiB, at all Ready {ready_rss} KiB (peak {peak} KiB): {:.1} KiB per Proxy",
        (ready_rss.saturating_sub(idle)) as f64 / n as f64
    );
    assert_eq!(list.len(), n);
    for p in &list {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let healthy = condition(p, "Healthy").map(|c| c.status.as_str());
        assert_eq!(healthy, Some("True"), "{name}: Healthy");
        let status = p.status.as_ref().unwrap();
        assert!(
            status.last_probe_time.is_some() && status.latency_millis.is_some(),
            "{name}: Ready without a recorded probe: {status:?}"
        );
    }

    // One watch on this namespace's Proxies since the operator started
    // (a watch is reopened only after about five minutes).
    let watches = distinct(&proxy_requests("watch", Some(&ground.ns), started_at));
    assert_eq!(watches.len(), 1, "Proxy watches opened: {watches:?}");

    // GC's cluster-wide Proxy list, paged.
    let lists = support::eventually(
        "a GC sweep lists the Proxies",
        Duration::from_secs(60),
        || async {
            let l = proxy_requests("list", None, started_at);
            (!l.is_empty()).then_some(l)
        },
    )
    .await;
    for e in &lists {
        let uri = e["requestURI"].as_str().unwrap_or_default();
        assert!(uri.contains("limit=500"), "an unpaged Proxy list: {uri}");
    }
    println!("{} paged GC lists of Proxies", distinct(&lists).len());

    probed_every_second(&names, &fetches).await;
    leases_within_capacity(api, n).await;
    failing_targets_turn_only_their_proxies_unhealthy(&proxies, &names, &failing).await;
}

const TOKEN: &str = "scale-small-token";
/// `--max-leases-per-proxy`.
const PER_PROXY: usize = 2;
/// The engine's own bound on the time between two probes of a Proxy: its
/// interval (1 s) plus its timeout (5 s).
const BOUND: Duration = Duration::from_secs(6);

/// Over a 12 s window, every Proxy's probes, and the window's edges, are
/// never further apart than [`BOUND`].
async fn probed_every_second(names: &[String], fetches: &Fetches) {
    const WINDOW: Duration = Duration::from_secs(12);
    let from = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let to = Instant::now();
    let seen = fetches.lock().unwrap().clone();
    let mut gaps = Vec::new();
    let mut counts = Vec::new();
    for name in names {
        let mut at: Vec<Instant> = seen
            .get(&format!("/p/{name}"))
            .into_iter()
            .flatten()
            .copied()
            .filter(|t| *t >= from && *t <= to)
            .collect();
        at.sort();
        counts.push(at.len());
        let mut edges = vec![from];
        edges.extend(at);
        edges.push(to);
        let gap = edges.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            gap <= BOUND,
            "{name}: {gap:?} without a probe (bound {BOUND:?})"
        );
        gaps.push(gap);
    }
    gaps.sort();
    counts.sort();
    println!(
        "probes of each Proxy in {WINDOW:?}: min {} / median {} / max {}; longest gap p50 {:?} / max {:?}",
        counts[0],
        counts[counts.len() / 2],
        counts[counts.len() - 1],
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1]
    );
}

/// 50 more acquires than the fleet holds, 32 at a time: exactly the
/// capacity is granted, no Proxy holds more than `PER_PROXY`, the rest
/// are told `409 no_capacity`.
async fn leases_within_capacity(api: SocketAddr, n: usize) {
    let capacity = n * PER_PROXY;
    let answers: Vec<(u16, Value)> = futures::stream::iter(0..capacity + 50)
        .map(|_| support::api_call(api, "POST", "/v1/leases", Some(TOKEN), b"{}".to_vec()))
        .buffer_unordered(32)
        .collect()
        .await;
    let mut per_proxy: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused = 0;
    for (status, v) in &answers {
        match status {
            201 => {
                let name = v["proxy"]["name"].as_str().unwrap().to_string();
                *per_proxy.entry(name).or_default() += 1;
            }
            409 => {
                assert_eq!(v["error"]["code"], "no_capacity", "{v}");
                refused += 1;
            }
            other => panic!("acquire answered {other}: {v}"),
        }
    }
    let granted: usize = per_proxy.values().sum();
    assert_eq!(granted, capacity, "every slot granted once");
    assert_eq!(refused, 50);
    assert!(
        per_proxy.values().all(|c| *c <= PER_PROXY),
        "a Proxy over --max-leases-per-proxy: {per_proxy:?}"
    );
    println!(
        "{granted} leases granted over {} Proxies, {refused} refused no_capacity",
        per_proxy.len()
    );
}

/// 20 targets answer 500: their Proxies, and only they, read
/// Healthy=False.
async fn failing_targets_turn_only_their_proxies_unhealthy(
    proxies: &kube::Api<egress_proxies_operator::api::Proxy>,
    names: &[String],
    failing: &Mutex<HashSet<String>>,
) {
    let bad: BTreeSet<&str> = names.iter().take(20).map(String::as_str).collect();
    failing
        .lock()
        .unwrap()
        .extend(bad.iter().map(|n| format!("/p/{n}")));
    let started = Instant::now();
    support::eventually(
        "the 20 failing Proxies, and only they, unhealthy",
        Duration::from_secs(60),
        || async {
            let list = proxies.list(&Default::default()).await.ok()?.items;
            let unhealthy: BTreeSet<&str> = list
                .iter()
                .filter(|p| condition(p, "Healthy").map(|c| c.status.as_str()) == Some("False"))
                .filter_map(|p| p.metadata.name.as_deref())
                .collect();
            assert!(
                unhealthy.is_subset(&bad),
                "a Proxy with a good target unhealthy: {:?}",
                unhealthy.difference(&bad).collect::<Vec<_>>()
            );
            (unhealthy == bad).then_some(())
        },
    )
    .await;
    println!(
        "20 failing targets: their Proxies unhealthy {:?} after",
        started.elapsed()
    );
}
