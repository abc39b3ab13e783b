//! Two replicas with --leader-elect on the real test cluster (control plane
//! only: the kubernetes provider's Pods stay Pending, which is enough for a
//! providerID), confined to the test's namespace, which holds the Lease: only the
//! leader reconciles, and when it is killed the other takes over within the
//! lease duration; a leader stopped by SIGTERM hands the Lease over at once;
//! a deposed leader stops reconciling but keeps serving the discovery API
//! (lease calls only through the leader), and leads again later with its
//! leases.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use support::leader::{self, campaigning, holder, reconciled, scraped, LEASE, TOKEN};
use support::{eventually, kube_proxy as proxy, Ground, Operator};

const LEASE_DURATION: Duration = Duration::from_secs(4);

fn replica(ground: &Ground, dir: &std::path::Path, name: &str) -> Operator {
    replica_with(ground, dir, name, ["4s", "3s"])
}

fn replica_with(ground: &Ground, dir: &std::path::Path, name: &str, timing: [&str; 2]) -> Operator {
    leader::replica(ground, dir, name, timing, &[])
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
    let took = leader::kill_until_held_by(a, &leases, "b").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_keeps_serving_and_leads_again() {
    let ground = support::ground_without_pods("leader-deposed").await;
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = ground.api();
    let proxies: Api<Proxy> = ground.proxies();
    // The probe target answers every request, so as an External Proxy's
    // endpoint it is a healthy forward proxy: Ready, and leasable.
    let target = support::http_target().await;
    let api: std::net::SocketAddr = support::loopback();
    let metrics: std::net::SocketAddr = support::loopback();
    let log = dir.path().join("a.log");
    let mut a = leader::replica(
        &ground,
        dir.path(),
        "a",
        ["4s", "3s"],
        &[
            "--discovery-bind-address",
            &api.to_string(),
            "--default-probe-url",
            &format!("http://{target}/"),
            "--default-probe-expected-status",
            "200",
            "--metrics-bind-address",
            &metrics.to_string(),
        ],
    );
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let external = support::proxy(
        "ext",
        serde_json::json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": target.port()}}),
    );
    proxies
        .create(&PostParams::default(), &external)
        .await
        .unwrap();
    let lease = eventually("a lease on ext", Duration::from_secs(60), || async {
        let body = br#"{"ttlSeconds": 600}"#.to_vec();
        let (s, v) = support::api_call(api, "POST", "/v1/leases", Some(TOKEN), body).await;
        (s == 201).then_some(v)
    })
    .await;
    assert_eq!(lease["proxy"]["name"], "ext", "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();

    // Another replica takes the Lease (as one whose renewals a never saw
    // fail would): a finds another holder at its next renewal.
    // a renews every second or so, so a replace may race a renewal (409):
    // read again and retry, as a real contender would.
    eventually(
        "the usurper to take the Lease",
        Duration::from_secs(10),
        || async {
            let mut l = leases.get(LEASE).await.ok()?;
            let spec = l.spec.as_mut()?;
            spec.holder_identity = Some("usurper".into());
            spec.lease_duration_seconds = Some(3600);
            leases.replace(LEASE, &PostParams::default(), &l).await.ok()
        },
    )
    .await;
    eventually(
        "a to stop its leader-only work",
        Duration::from_secs(10),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.contains("Stopped leader-only work").then_some(())
        },
    )
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("Lost the leader lease to another replica"),
        "{text}"
    );
    assert!(a.0.try_wait().unwrap().is_none(), "a keeps running: {text}");
    assert_eq!(scraped(metrics, "proxy_operator_leader").await, Some(0.0));
    let lost = r#"proxy_operator_leader_step_downs_total{reason="lost"}"#;
    assert_eq!(scraped(metrics, lost).await, Some(1.0));

    // Every-replica work goes on: the discovery API answers from the
    // cache. Lease calls go to the leader only: the usurper's Lease still
    // names a's URL and seal (it kept the annotations), but that seal was
    // made for a's term (issue 52), so a sends nothing and refuses rather
    // than loop or grant.
    let (s, v) = support::api_call(api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["items"][0]["name"], "ext", "{v}");
    let renew = format!("/v1/leases/{id}/renew");
    let (s, v) = support::api_call(api, "POST", &renew, Some(TOKEN), vec![]).await;
    assert_eq!(s, 503, "a follower serves no lease call itself: {v}");
    assert_eq!(v["error"]["code"], "leader_unavailable", "{v}");
    let unverified = r#"proxy_operator_discovery_forwarded_total{outcome="unverified"}"#;
    assert_eq!(scraped(metrics, unverified).await, Some(1.0));

    // Leader-only work has stopped: a new Proxy is not reconciled while
    // the usurper holds the Lease.
    proxies
        .create(&PostParams::default(), &proxy("p2"))
        .await
        .unwrap();
    for _ in 0..15 {
        let p = proxies.get("p2").await.unwrap();
        assert!(p.status.is_none(), "a deposed replica reconciled p2: {p:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The usurper lets go: a campaigns again, leads and reconciles.
    let mut l = leases.get(LEASE).await.unwrap();
    let spec = l.spec.as_mut().unwrap();
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    leases
        .replace(LEASE, &PostParams::default(), &l)
        .await
        .unwrap();
    eventually("a to lead again", Duration::from_secs(30), || async {
        holder(&leases).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    reconciled(&proxies, "p2").await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("Became the leader").count(), 2, "{text}");
    assert_eq!(scraped(metrics, "proxy_operator_leader").await, Some(1.0));
    let lease_path = format!("/v1/leases/{id}");
    let (s, v) = support::api_call(api, "GET", &lease_path, Some(TOKEN), vec![]).await;
    assert_eq!(s, 200, "the lease is still held: {v}");
    drop(a);
}
