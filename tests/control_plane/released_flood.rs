//! One client looping acquire(`ttlSeconds: 3600`) + release 200,000 times
//! through the leader, with a follower in sync, on the real test cluster
//! (issue 52): every released id is remembered until its signed end, yet
//! the leader stays within the Pod's memory limit (past the caps the
//! client is granted 60 s leases), the follower stays in sync on deltas,
//! and a SIGTERM afterwards still hands the table over, released ids
//! included, with no recovery window.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use egress_proxies_operator::lease::{CROWDED_TTL, MAX_RELEASED_PER_CLIENT};

use crate::lease_load;
use crate::support::leader::{self, campaigning, holder, scraped, LEASE, TOKEN};
use crate::support::{self, api_call, eventually, squid};

/// The manager container's memory limit as shipped
/// (`config/manager/manager.yaml`).
const POD_LIMIT: u64 = 128 * 1024 * 1024;

/// Pairs in the loop (`FLOOD_PAIRS` sets fewer for a quick look).
fn pairs() -> usize {
    std::env::var("FLOOD_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

/// Pairs a second at most: the loop shares the machine with the other
/// system tests, whose probes time out when it takes every core (about
/// 1,700 pairs a second on two cores of a debug build).
const RATE: f64 = 800.0;

const SYNCED: &str = "crawl.example.com/lease-synced-replicas";

fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    kb.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// The largest RSS of `pid` seen every 200 ms until `stop`.
fn watch_rss(pid: u32, stop: Arc<AtomicBool>) -> Arc<AtomicU64> {
    let peak = Arc::new(AtomicU64::new(0));
    let seen = peak.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            if let Some(r) = rss(pid) {
                seen.fetch_max(r, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    peak
}

async fn named_in_sync(leases: &Api<Lease>, who: &str) -> bool {
    let Ok(lease) = leases.get(LEASE).await else {
        return false;
    };
    lease
        .metadata
        .annotations
        .and_then(|a| a.get(SYNCED).cloned())
        .is_some_and(|named| {
            named.contains(&format!(" {who}_")) || named.contains(&format!(",{who}_"))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_releasing_200_000_hour_leases_keeps_the_leader_in_its_limit_and_in_sync() {
    squid::require();
    let ground = support::ground_without_pods("flood").await;
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = ground.api();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(Ipv4Addr::LOCALHOST, port, "flood", "http_access allow me").await;
    let apis = [support::loopback(), support::loopback()];
    let metrics = [support::loopback(), support::loopback()];
    let replica = |name: &str, i: usize| {
        let m = metrics[i].to_string();
        let flags = ["--max-leases-per-proxy", "64", "--metrics-bind-address", &m];
        leader::serving_replica(&ground, dir.path(), name, (apis[i], target), &flags, &[])
    };
    let a = replica("a", 0);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let _b = replica("b", 1);
    campaigning(&dir.path().join("b.log")).await;
    leader::ready_and_listed(&ground, "sq-1", port, apis[0]).await;
    eventually("b named in sync", Duration::from_secs(30), || async {
        named_in_sync(&leases, "b").await.then_some(())
    })
    .await;
    let whole_before = scraped(
        metrics[0],
        r#"proxy_operator_lease_feed_answers_total{kind="whole"}"#,
    )
    .await
    .unwrap_or(0.0);

    // The loop: one token, 8 connections, an hour asked every time.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = watch_rss(a.pid(), stop.clone());
    let total = pairs();
    let (figures, last) = lease_load::pairs(
        apis[0],
        (TOKEN, br#"{"ttlSeconds":3600}"#),
        total,
        (8, RATE),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let peak = peak.load(Ordering::SeqCst);
    lease_load::print("acquire(3600)+release through the leader", &figures);
    println!(
        "leader peak RSS {:.1} MiB (limit {} MiB)",
        peak as f64 / 1048576.0,
        POD_LIMIT / 1048576
    );
    assert_eq!(
        figures.pairs, total,
        "every pair done ({} refused or broken)",
        figures.errors
    );
    assert!(
        peak > 0 && peak <= POD_LIMIT,
        "leader RSS {peak} B past the limit"
    );

    // Past its cap of remembered releases the client is granted short
    // leases, so what it releases is remembered briefly.
    let last = last.unwrap();
    let ttl = last["ttlSeconds"].as_i64().unwrap();
    println!("last lease's TTL {ttl} s (asked 3600)");
    if total > MAX_RELEASED_PER_CLIENT {
        assert!(ttl <= CROWDED_TTL.as_secs() as i64, "{last}");
    }

    // The follower stayed in sync, on deltas.
    assert!(named_in_sync(&leases, "b").await, "b still named in sync");
    let whole = scraped(
        metrics[0],
        r#"proxy_operator_lease_feed_answers_total{kind="whole"}"#,
    )
    .await
    .unwrap_or(0.0);
    let delta = scraped(
        metrics[0],
        r#"proxy_operator_lease_feed_answers_total{kind="delta"}"#,
    )
    .await
    .unwrap_or(0.0);
    println!(
        "feed answers during the loop: {delta} deltas, {} whole",
        whole - whole_before
    );
    assert_eq!(whole, whole_before, "b never fell behind the change log");

    // A released id of the loop stays dead across the hand-over.
    let released = last["id"].as_str().unwrap().to_string();
    let stopped = Instant::now();
    support::signal(a.pid(), "-TERM");
    let mut a = a;
    assert!(a.0.wait().unwrap().success(), "a exits cleanly on SIGTERM");
    let log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    let wrote = log
        .lines()
        .find(|l| l.contains("Wrote the lease table for the next leader"));
    println!("{}", wrote.unwrap_or("no hand-over written"));
    assert!(wrote.is_some(), "{log}");
    let (s, v) = eventually("a grant at b", Duration::from_secs(60), || async {
        let (s, v) = api_call(apis[1], "POST", "/v1/leases", Some(TOKEN), b"{}".to_vec()).await;
        assert_ne!(v["error"]["code"], "recovering", "no recovery window: {v}");
        (s == 201).then_some((s, v))
    })
    .await;
    println!(
        "first grant at b {:.1} s after SIGTERM",
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(s, 201, "{v}");
    let renew = format!("/v1/leases/{released}/renew");
    let (s, v) = api_call(apis[1], "POST", &renew, Some(TOKEN), vec![]).await;
    assert_eq!(s, 404, "a released lease is not taken back in: {v}");
}
