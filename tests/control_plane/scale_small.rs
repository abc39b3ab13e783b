//! Issue 19's small scale run, the correctness half of the scale benchmark:
//! the real operator binary on the real test cluster (control plane only)
//! with 200 External Proxies on one real Squid on 127.0.0.1. The API
//! server's audit log (one event per request) shows what the operator
//! asked of it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
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
/// subsystem reads; the controller opens none of its own); and every
/// cluster-wide Proxy list of its orphan GC comes in pages of 500.
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
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        port,
        "scale200",
        "http_access allow me",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.operator(dir.path(), "providers: []\n");
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"])
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
            let spec = json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}});
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
}
