//! The API server frozen (SIGSTOP) for longer than the lease duration,
//! under two replicas with `--leader-elect`: the leader stops its
//! leader-only work within its renew deadline, by itself, while no request
//! can succeed; after SIGCONT exactly one replica leads; no two replicas
//! ever led or reconciled at once (by their log lines' times).

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use support::leader::{self, campaigning, holder, leads, reconciled, scraped, BECAME, STOPPED};
use support::{eventually, kube_proxy as proxy};

const LEASE_DURATION: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
/// Half of lease duration minus renew deadline: how long a step-down
/// gives leader-only work before abandoning it.
const STEP_DOWN_GRACE: Duration = Duration::from_secs(1);
const FROZEN_FOR: Duration = Duration::from_secs(12);

/// A process stopped with SIGSTOP, continued when dropped (also when the
/// test fails), so the cluster outlives a failed test.
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Frozen {
        signal("-STOP", pid);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal("-CONT", self.0);
    }
}

fn signal(sig: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

fn log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// The time at the start of a log line.
fn time_of(line: &str) -> Option<DateTime<Utc>> {
    let first = line.split_whitespace().next()?;
    Some(
        DateTime::parse_from_rfc3339(first)
            .ok()?
            .with_timezone(&Utc),
    )
}

/// A term of leadership: from its first to its last instant.
type Term = (DateTime<Utc>, DateTime<Utc>);

/// The replica's terms of leadership, from "Became the leader" to
/// "Stopped leader-only work" (open-ended while it still leads), and the
/// times of its reconcile log lines.
fn terms_and_reconciles(text: &str) -> (Vec<Term>, Vec<DateTime<Utc>>) {
    let mut terms = Vec::new();
    let mut reconciles = Vec::new();
    let mut open: Option<DateTime<Utc>> = None;
    for line in text.lines() {
        let Some(t) = time_of(line) else { continue };
        if line.contains(BECAME) {
            assert!(
                open.is_none(),
                "became the leader twice in one term: {line}"
            );
            open = Some(t);
        } else if line.contains(STOPPED) {
            let start = open
                .take()
                .expect("stopped leader-only work without a term");
            terms.push((start, t));
        } else if line.contains("Reconcile Proxy") {
            reconciles.push(t);
        }
    }
    if let Some(start) = open {
        terms.push((start, DateTime::<Utc>::MAX_UTC));
    }
    (terms, reconciles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_a_frozen_api_server_makes_the_leader_step_down_and_one_leads_after() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let ground = support::ground_without_pods("freeze").await;
    let apiserver = ground.cluster.pid("kube-apiserver").expect(
        "the fault suite freezes its own cluster's API server; it cannot run on E2E_KUBECONFIG",
    );
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let leases: Api<Lease> = ground.api();
    let proxies: Api<Proxy> = ground.proxies();
    let timing = ["6s", "4s"];

    let metrics: std::net::SocketAddr = support::loopback();
    let a = leader::replica(
        &ground,
        dir,
        "a",
        timing,
        &["--metrics-bind-address", &metrics.to_string()],
    );
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = leader::replica(&ground, dir, "b", timing, &[]);
    campaigning(&dir.join("b.log")).await;
    proxies
        .create(&PostParams::default(), &proxy("p1"))
        .await
        .unwrap();
    reconciled(&proxies, "p1").await;

    // Freeze the API server: every request hangs, none fails.
    let frozen = Frozen::new(apiserver);
    let frozen_at = Instant::now();
    eventually(
        "a to stop its leader-only work while the API server is frozen",
        RENEW_DEADLINE + STEP_DOWN_GRACE + Duration::from_secs(2),
        || async { log(dir, "a").contains(STOPPED).then_some(()) },
    )
    .await;
    let stepped_down = frozen_at.elapsed();
    let a_log = log(dir, "a");
    assert!(
        a_log.contains("Could not renew the leader lease in time"),
        "{a_log}"
    );
    assert!(
        !leads(&log(dir, "b")),
        "b cannot lead while nothing answers"
    );
    assert_eq!(scraped(metrics, "proxy_operator_leader").await, Some(0.0));
    let deadline_series = r#"proxy_operator_leader_step_downs_total{reason="deadline"}"#;
    assert_eq!(scraped(metrics, deadline_series).await, Some(1.0));
    // Stay frozen past the lease duration, so b counts the Lease expired.
    tokio::time::sleep(FROZEN_FOR.saturating_sub(frozen_at.elapsed())).await;
    drop(frozen);
    let thawed = Instant::now();

    let winner = eventually(
        "exactly one replica to lead after SIGCONT",
        Duration::from_secs(30),
        || async {
            let h = holder(&leases).await?;
            match (leads(&log(dir, "a")), leads(&log(dir, "b"))) {
                (true, false) if h.starts_with("a_") => Some("a"),
                (false, true) if h.starts_with("b_") => Some("b"),
                _ => None,
            }
        },
    )
    .await;
    let recovered = thawed.elapsed();
    proxies
        .create(&PostParams::default(), &proxy("p2"))
        .await
        .unwrap();
    reconciled(&proxies, "p2").await;
    let (a_log, b_log) = (log(dir, "a"), log(dir, "b"));
    // p2 was reconciled, so one led; on a loaded machine the lead may
    // have changed hands again since (short test leases), but never are
    // both leading at once.
    assert!(
        !(leads(&a_log) && leads(&b_log)),
        "both replicas lead after {winner} took over"
    );

    // No overlap: each replica reconciled only within its own terms, and
    // no term of one overlaps a term of the other.
    let (a_terms, a_reconciles) = terms_and_reconciles(&a_log);
    let (b_terms, b_reconciles) = terms_and_reconciles(&b_log);
    for (name, terms, reconciles) in [
        ("a", &a_terms, &a_reconciles),
        ("b", &b_terms, &b_reconciles),
    ] {
        for t in reconciles {
            assert!(
                terms.iter().any(|(s, e)| s <= t && t <= e),
                "{name} reconciled at {t} outside its terms {terms:?}"
            );
        }
    }
    let overlapping = a_terms
        .iter()
        .flat_map(|x| b_terms.iter().map(move |y| (x, y)))
        .filter(|(x, y)| x.0 < y.1 && y.0 < x.1)
        .count();
    assert_eq!(
        overlapping, 0,
        "terms overlap: a {a_terms:?}, b {b_terms:?}"
    );
    println!("| injected | measured |");
    println!("|---|---|");
    println!(
        "| API server frozen (SIGSTOP) {FROZEN_FOR:?}; lease {LEASE_DURATION:?}, renew deadline {RENEW_DEADLINE:?} | leader stopped leader-only work {stepped_down:.1?} after the freeze; after SIGCONT {winner} led within {recovered:.1?}; overlapping terms {overlapping}; reconciles outside a term 0 ({} by a, {} by b) |",
        a_reconciles.len(),
        b_reconciles.len()
    );
    drop((a, b));
}
