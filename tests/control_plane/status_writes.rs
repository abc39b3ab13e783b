//! Status is written only on change, counted on the real API server's
//! audit log: two External Proxies on a real Squid, Ready, then a minute of
//! steady probing (every second) with no status write at all; then the
//! probe target answers 400 ms slower, a material latency change, and each
//! Proxy's status is written for it (its `latencyMillis` shows the new
//! figure), and again nothing while the new latency holds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::PostParams;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::support::{self, eventually, phase, squid, Operator};

const PROXIES: [&str; 2] = ["steady-a", "steady-b"];

/// An HTTP target on 127.0.0.1 that answers 200 after `delay` ms.
async fn slow_target(delay: Arc<AtomicU64>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let delay = delay.clone();
            tokio::spawn(async move {
                support::read_head(&mut c).await;
                tokio::time::sleep(Duration::from_millis(delay.load(Ordering::Relaxed))).await;
                let _ = c
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    addr
}

/// The operator's status writes on Proxies of `ns` received after `since`,
/// per Proxy (one per request: the audit log has an event per stage).
fn status_writes(ns: &str, since: DateTime<Utc>) -> BTreeMap<String, usize> {
    let mut ids: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for e in support::control_plane().audit_events() {
        let o = &e["objectRef"];
        let write = matches!(e["verb"].as_str(), Some("patch" | "update"));
        let received: Option<DateTime<Utc>> = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok());
        if write
            && o["resource"] == "proxies"
            && o["subresource"] == "status"
            && o["namespace"] == ns
            && received.is_some_and(|t| t >= since)
        {
            let (Some(name), Some(id)) = (o["name"].as_str(), e["auditID"].as_str()) else {
                continue;
            };
            ids.entry(name.to_string())
                .or_default()
                .insert(id.to_string());
        }
    }
    ids.into_iter().map(|(n, s)| (n, s.len())).collect()
}

fn latency(p: &Value) -> Option<i64> {
    p["status"]["latencyMillis"].as_i64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_written_only_when_it_changes() {
    squid::require();
    let ground = support::ground_without_pods("steady").await;
    let delay = Arc::new(AtomicU64::new(0));
    let target = slow_target(delay.clone()).await;
    let (port, _squid) = squid::on_loopback("steady").await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.operator(dir.path(), "providers: []\n");
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    for name in PROXIES {
        let p = support::proxy(
            name,
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually("both Proxies Ready", Duration::from_secs(60), || async {
        for name in PROXIES {
            let p = proxies.get(name).await.ok()?;
            (phase(&p) == Some("Ready")).then_some(())?;
        }
        Some(())
    })
    .await;
    // Past the first verdicts' writes.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let steady_from = Utc::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let steady = status_writes(&ground.ns, steady_from);
    println!("status writes over 60 s of a steady fleet: {steady:?}");
    assert!(
        steady.is_empty(),
        "a steady fleet's status is not rewritten: {steady:?}"
    );

    let before: Vec<i64> = {
        let mut v = Vec::new();
        for name in PROXIES {
            let p = serde_json::to_value(proxies.get(name).await.unwrap()).unwrap();
            v.push(latency(&p).unwrap_or(0));
        }
        v
    };
    let change_from = Utc::now();
    delay.store(400, Ordering::Relaxed);
    eventually(
        "the new latency in both statuses",
        Duration::from_secs(60),
        || async {
            for name in PROXIES {
                let p = serde_json::to_value(proxies.get(name).await.ok()?).unwrap();
                (latency(&p)? >= 400).then_some(())?;
            }
            Some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let changed = status_writes(&ground.ns, change_from);
    println!("latency {before:?} ms → 400+ ms: status writes in the next 30+ s: {changed:?}");
    for name in PROXIES {
        let n = changed.get(name).copied().unwrap_or(0);
        assert_eq!(
            n, 1,
            "{name}: one write for the latency change, then none: {changed:?}"
        );
    }
}
