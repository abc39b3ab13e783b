//! One address cannot keep the discovery API to itself (issue 31): for
//! 60 s a client on 127.0.0.2 keeps reopening as many idle connections to
//! the leader as it can, refreshed every 9 s (inside the 10 s header
//! timeout); meanwhile another client on 127.0.0.3 lists proxies at the
//! leader and a crawler acquires through the follower, whose forwards go
//! to the leader from 127.0.0.1. A short run without the per-address cap shows what the
//! cap prevents.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::support::leader::{self, campaigning, holder, TOKEN};
use crate::support::{self, eventually, phase, squid, Ground};

const TOTAL: &str = "64";

/// One request on a fresh connection from 127.0.0.3 (not the replicas'
/// 127.0.0.1, whose signed calls earn it the connections kept for
/// replicas); its status, or `None` when the connection was refused,
/// closed or timed out.
async fn try_call(addr: SocketAddr, method: &str, path: &str) -> Option<u16> {
    let body = if method == "POST" {
        r#"{"ttlSeconds":1}"#
    } else {
        ""
    };
    let from = Some(Ipv4Addr::new(127, 0, 0, 3));
    support::raw_call(addr, from, (method, path), Some(TOKEN), body)
        .await
        .map(|(s, _)| s)
}

/// `n` loops that hold connections from 127.0.0.2 to `addr` until
/// `until`, each reopened every 9 s or as soon as the server closes it;
/// returns the most held at once.
fn flood(addr: SocketAddr, n: usize, until: Instant) -> tokio::task::JoinHandle<usize> {
    let open = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let loops: Vec<_> = (0..n)
        .map(|_| {
            let (open, most) = (open.clone(), most.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let sock = tokio::net::TcpSocket::new_v4().unwrap();
                    sock.bind((Ipv4Addr::new(127, 0, 0, 2), 0).into()).unwrap();
                    if let Ok(mut c) = sock.connect(addr).await {
                        let mut b = [0u8; 1];
                        // A connection the server closes at once was refused;
                        // one still open after a second is held.
                        let wait = Duration::from_secs(1);
                        if tokio::time::timeout(wait, c.read(&mut b)).await.is_err() {
                            let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            // Idle until the refresh, or until the server closes it.
                            let rest = Duration::from_secs(8);
                            let _ = tokio::time::timeout(rest, c.read(&mut b)).await;
                            open.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        })
        .collect();
    tokio::spawn(async move {
        for l in loops {
            l.await.unwrap();
        }
        most.load(Ordering::SeqCst)
    })
}

struct Run {
    listed: (usize, usize),
    forwarded: (usize, usize),
    most_held: usize,
}

/// `secs` of flooding the leader while a client lists there and a crawler
/// acquires through the follower.
async fn under_flood(apis: [SocketAddr; 2], secs: u64) -> Run {
    let until = Instant::now() + Duration::from_secs(secs);
    let flooding = flood(apis[0], 64, until);
    // Let the flood take what it can first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut listed, mut forwarded) = ((0, 0), (0, 0));
    let mut tick = 0u32;
    while Instant::now() < until {
        listed.1 += 1;
        if try_call(apis[0], "GET", "/v1/proxies").await == Some(200) {
            listed.0 += 1;
        }
        if tick.is_multiple_of(4) {
            forwarded.1 += 1;
            // 201, or 409 when the crawler holds all it may: the leader answered.
            if matches!(
                try_call(apis[1], "POST", "/v1/leases").await,
                Some(201 | 409)
            ) {
                forwarded.0 += 1;
            }
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Run {
        listed,
        forwarded,
        most_held: flooding.await.unwrap(),
    }
}

async fn start_replicas(
    ground: &Ground,
    dir: &std::path::Path,
    per_address: &str,
) -> ([SocketAddr; 2], [support::Operator; 2]) {
    let target = support::http_target().await;
    let apis = [support::loopback(), support::loopback()];
    let leases: Api<Lease> = ground.api();
    let start = |name: &str, api: SocketAddr| {
        let caps = [
            "--max-leases-per-proxy",
            "10000",
            "--discovery-max-connections",
            TOTAL,
            "--discovery-max-connections-per-address",
            per_address,
        ];
        leader::serving_replica(ground, dir, name, (api, target), &caps, &[])
    };
    let a = start(&format!("a{per_address}"), apis[0]);
    let prefix = format!("a{per_address}_");
    let deadline = Instant::now() + Duration::from_secs(30);
    while holder(&leases)
        .await
        .filter(|h| h.starts_with(&prefix))
        .is_none()
    {
        let log =
            std::fs::read_to_string(dir.join(format!("a{per_address}.log"))).unwrap_or_default();
        assert!(Instant::now() < deadline, "a to lead: {log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let name = format!("b{per_address}");
    let b = start(&name, apis[1]);
    campaigning(&dir.join(format!("{name}.log"))).await;
    eventually(
        "a grant through the follower",
        Duration::from_secs(30),
        || async { (try_call(apis[1], "POST", "/v1/leases").await == Some(201)).then_some(()) },
    )
    .await;
    (apis, [a, b])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_reopening_idle_connections_keeps_neither_clients_nor_forwards_out() {
    squid::require();
    let ground = support::ground_without_pods("fairness").await;
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        port,
        "fairness",
        "http_access allow me",
    )
    .await;
    let proxies = ground.proxies();
    let p = support::proxy(
        "sq-1",
        json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
    );
    proxies.create(&PostParams::default(), &p).await.unwrap();

    let (apis, replicas) = start_replicas(&ground, dir.path(), "16").await;
    eventually("the Proxy Ready", Duration::from_secs(60), || async {
        (phase(&proxies.get("sq-1").await.ok()?) == Some("Ready")).then_some(())
    })
    .await;
    let run = under_flood(apis, 60).await;
    let pct = |(ok, all): (usize, usize)| 100.0 * ok as f64 / all.max(1) as f64;
    println!(
        "with 16 per address of {TOTAL}: the flood held at most {} connections; listed {}/{} ({:.1}%), forwarded {}/{} ({:.1}%)",
        run.most_held, run.listed.0, run.listed.1, pct(run.listed), run.forwarded.0, run.forwarded.1, pct(run.forwarded)
    );
    assert!(
        run.most_held <= 16,
        "one address holds its share only: {}",
        run.most_held
    );
    assert!(pct(run.listed) >= 95.0, "the other client is served");
    assert!(pct(run.forwarded) >= 95.0, "forwards keep working");
    drop(replicas);

    // Without the cap, the same flood takes every connection.
    let lease = Api::<Lease>::namespaced(ground.client.clone(), &ground.ns);
    lease
        .delete(leader::LEASE, &Default::default())
        .await
        .unwrap();
    let (apis, replicas) = start_replicas(&ground, dir.path(), "0").await;
    let run = under_flood(apis, 12).await;
    println!(
        "without a per-address cap: the flood held at most {}; listed {}/{} ({:.1}%), forwarded {}/{}",
        run.most_held, run.listed.0, run.listed.1, pct(run.listed), run.forwarded.0, run.forwarded.1
    );
    assert!(
        pct(run.listed) < 50.0,
        "the contrast: the flood keeps the client out"
    );
    drop(replicas);
}
