//! Two replicas with --leader-elect on the real test cluster (control plane
//! only: the kubernetes provider's Pods stay Pending, which is enough for a
//! providerID), confined to the test's namespace, which holds the Lease: only the
//! leader reconciles, and when it is killed the other takes over within the
//! lease duration; a leader stopped by SIGTERM hands the Lease over at once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use support::{eventually, kube_proxy as proxy, Ground, Operator};

const LEASE: &str = "egress-proxies-operator.crawl.example.com";
const LEASE_DURATION: Duration = Duration::from_secs(4);

fn replica(ground: &Ground, dir: &std::path::Path, name: &str) -> Operator {
    replica_with(ground, dir, name, ["4s", "3s"])
}

/// A replica with the given lease duration and renew deadline.
fn replica_with(
    ground: &Ground,
    dir: &std::path::Path,
    name: &str,
    [lease, renew]: [&str; 2],
) -> Operator {
    // The ground's operator keeps its Lease in the test's namespace.
    let mut cmd = ground.operator(
        dir,
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
    );
    cmd.args([
        "--leader-elect",
        "--leader-election-lease-duration",
        lease,
        "--leader-election-renew-deadline",
        renew,
        "--leader-election-retry-period",
        "500ms",
    ])
    .env("POD_NAME", name);
    Operator::spawn(cmd, &dir.join(format!("{name}.log")))
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt(LEASE).await.ok()??.spec?.holder_identity
}

async fn reconciled(proxies: &Api<Proxy>, name: &str) {
    eventually(
        &format!("{name} to get a providerID"),
        Duration::from_secs(60),
        || async {
            proxies
                .get(name)
                .await
                .ok()?
                .status?
                .provider_id
                .map(|_| ())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_the_other_takes_over() {
    let ground = support::ground_without_pods("leader").await;
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = ground.api();
    let proxies: Api<Proxy> = ground.proxies();

    let a = replica(&ground, dir.path(), "a");
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = replica(&ground, dir.path(), "b");
    // b campaigns but follows while a renews.
    campaigning(&dir.path().join("b.log")).await;
    proxies
        .create(&PostParams::default(), &proxy("p1"))
        .await
        .unwrap();
    reconciled(&proxies, "p1").await;
    assert!(holder(&leases).await.unwrap().starts_with("a_"));
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap();
    assert!(b_log.contains("Waiting to become the leader"), "{b_log}");
    assert!(
        !b_log.contains("Became the leader"),
        "b must not lead while a renews: {b_log}"
    );
    assert!(
        !b_log.contains("Reconcile Proxy"),
        "only the leader reconciles: {b_log}"
    );

    // Kill the leader without a chance to release the Lease.
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-KILL", &a.pid().to_string()])
        .status()
        .unwrap();
    drop(a);
    eventually("b to take over", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("b_"))
    })
    .await;
    let took = killed.elapsed();
    println!("takeover after the leader was killed: {took:?} (lease duration {LEASE_DURATION:?})");
    // The Lease runs out, then b's next attempt (every 500 ms) takes it.
    assert!(
        took <= LEASE_DURATION + Duration::from_secs(3),
        "takeover took {took:?}"
    );

    // The new leader reconciles.
    proxies
        .create(&PostParams::default(), &proxy("p2"))
        .await
        .unwrap();
    reconciled(&proxies, "p2").await;
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap();
    assert!(b_log.contains("Became the leader"), "{b_log}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_gracefully_releases_the_lease() {
    let ground = support::ground_without_pods("leader-term").await;
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = ground.api();
    // A 60 s lease: b can only lead within the wait below if a releases it.
    let a = replica_with(&ground, dir.path(), "a", ["60s", "40s"]);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = replica_with(&ground, dir.path(), "b", ["60s", "40s"]);
    campaigning(&dir.path().join("b.log")).await;
    assert!(holder(&leases).await.unwrap().starts_with("a_"));

    let stopped = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &a.pid().to_string()])
        .status()
        .unwrap();
    let mut a = a;
    let status = a.0.wait().unwrap();
    assert!(status.success(), "a exits cleanly on SIGTERM: {status:?}");
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    assert!(a_log.contains("Released the leader lease"), "{a_log}");
    eventually("b to take over", Duration::from_secs(20), || async {
        holder(&leases).await.filter(|h| h.starts_with("b_"))
    })
    .await;
    println!(
        "takeover after SIGTERM: {:?} (lease duration 60s)",
        stopped.elapsed()
    );
    let spec = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(
        spec.lease_duration_seconds,
        Some(60),
        "b writes its own duration"
    );
    assert_eq!(spec.lease_transitions, Some(1));
    drop(b);
}

/// Waits until the replica logging to `log` has started to campaign.
async fn campaigning(log: &std::path::Path) {
    eventually(
        "the replica to campaign",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(log)
                .ok()?
                .contains("Waiting to become the leader")
                .then_some(())
        },
    )
    .await;
}
