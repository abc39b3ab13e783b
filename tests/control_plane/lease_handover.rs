//! The lease table across a restart of the only replica, on the real test
//! cluster (issue 31): stopped with SIGTERM, the leader hands its leases,
//! released ids, cooldowns and sticky keys over through the API server,
//! and the next process grants at once with all of them in force; killed
//! with SIGKILL, the next process waits no longer than the longest TTL
//! actually granted, however long a TTL was asked for and refused.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use crate::support::leader::{self, holder, LEASE, TOKEN};
use crate::support::{self, api_call, api_call_retry_after, eventually, phase, squid, Ground};

/// What a take-over without the hand-over would make crawlers wait for.
const DEFAULT_TTL: u64 = 60;

fn replica(
    ground: &Ground,
    dir: &Path,
    name: &str,
    api: SocketAddr,
    target: SocketAddr,
    extra: &[&str],
) -> support::Operator {
    leader::serving_replica(ground, dir, name, (api, target), extra, &[])
}

async fn post(api: SocketAddr, path: &str, body: Value) -> (u16, Option<u64>, Value) {
    api_call_retry_after(
        api,
        "POST",
        path,
        Some(TOKEN),
        body.to_string().into_bytes(),
    )
    .await
}

fn name_of(lease: &Value) -> String {
    lease["proxy"]["name"].as_str().unwrap().to_string()
}

/// External Proxies `names` on the Squid at `port`, Ready.
/// External Proxies `names` on the Squid at `port`, Ready, and listed by
/// the leader at `api`: the leader writes a status before its own watch
/// brings it back, so an acquire made at Ready could still choose among
/// fewer proxies than there are.
async fn ready_proxies(ground: &Ground, names: &[&str], port: u16, api: SocketAddr) {
    let proxies = ground.proxies();
    for name in names {
        let p = support::proxy(
            name,
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually("every Proxy Ready", Duration::from_secs(60), || async {
        for name in names {
            let p = proxies.get(name).await.ok()?;
            (phase(&p) == Some("Ready")).then_some(())?;
        }
        Some(())
    })
    .await;
    eventually(
        "the leader to list them",
        Duration::from_secs(30),
        || async {
            let (s, v) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
            let items = v["items"].as_array()?;
            let listed = names.iter().all(|n| items.iter().any(|p| p["name"] == *n));
            (s == 200 && listed).then_some(())
        },
    )
    .await;
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// Polls acquire with `body` until a grant; every refusal on the way is
/// what a replica that does not lead yet answers, never `recovering`.
/// Returns the lease and when it was granted.
async fn first_grant(api: SocketAddr, body: Value, allowed: &[&str]) -> (Value, Instant) {
    eventually("a new grant", Duration::from_secs(90), || async {
        let (s, _, v) = post(api, "/v1/leases", body.clone()).await;
        if s == 201 {
            return Some((v, Instant::now()));
        }
        let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
        assert!(
            allowed.contains(&code.as_str()) || s == 0,
            "only {allowed:?} before the grant, got {s}: {v}"
        );
        None
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_with_sigterm_keeps_leases_cooldowns_and_sticky_keys_and_grants_at_once(
) {
    squid::require();
    let ground = support::ground_without_pods("handover").await;
    let dir = tempfile::tempdir().unwrap();
    let leases_api: Api<Lease> = ground.api();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        port,
        "handover",
        "http_access allow me",
    )
    .await;
    let api = support::loopback();
    let flags = ["--max-leases-per-proxy", "3", "--default-lease-ttl", "60s"];
    let a = replica(&ground, dir.path(), "a", api, target, &flags);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases_api).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    ready_proxies(&ground, &["sq-1", "sq-2", "sq-3"], port, api).await;

    // Two leases under one sticky key (its proxy, X, holds two), one
    // lease reported failed (its proxy, Y, cools down), one released.
    let sticky = json!({"stickyKey": "session-1"});
    let grant = |body: Value| async move {
        eventually("a grant at a", Duration::from_secs(30), || async {
            let (s, _, v) = post(api, "/v1/leases", body.clone()).await;
            (s == 201).then_some(v)
        })
        .await
    };
    let s1 = grant(sticky.clone()).await;
    let s2 = grant(sticky.clone()).await;
    let x = name_of(&s1);
    assert_eq!(name_of(&s2), x, "one sticky key, one proxy");
    let failed = grant(json!({})).await;
    let y = name_of(&failed);
    assert_ne!(y, x, "the fairest proxy is one without leases");
    let path = format!("/v1/leases/{}/report", failed["id"].as_str().unwrap());
    let (s, _, v) = post(api, &path, json!({"result": "failed"})).await;
    assert_eq!(s, 204, "{v}");
    let released = grant(json!({})).await;
    let freed = format!("/v1/leases/{}", released["id"].as_str().unwrap());
    assert_eq!(
        api_call(api, "DELETE", &freed, Some(TOKEN), vec![]).await.0,
        204
    );
    let z = ["sq-1", "sq-2", "sq-3"]
        .into_iter()
        .find(|n| *n != x && *n != y)
        .unwrap()
        .to_string();
    println!("sticky proxy {x}, cooling {y}, free {z}");

    // SIGTERM: the leader stops on purpose and hands the table over.
    let stopped = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &a.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut a = a;
    let exit = a.0.wait().unwrap();
    assert!(exit.success(), "a exits cleanly on SIGTERM: {exit:?}");
    println!("a stopped {:?} after SIGTERM", stopped.elapsed());
    let log = log_of(dir.path(), "a");
    assert!(
        log.contains("Wrote the lease table for the next leader"),
        "{log}"
    );
    let on_lease = leases_api.get(LEASE).await.unwrap();
    let annotations: BTreeMap<String, String> =
        on_lease.metadata.annotations.clone().unwrap_or_default();
    let pointer = &annotations["crawl.example.com/lease-handover"];
    assert!(
        !pointer.is_empty(),
        "the releasing write names the hand-over"
    );

    // The same Deployment's next process, on the same address.
    let started = Instant::now();
    let a2 = replica(&ground, dir.path(), "a2", api, target, &flags);
    let led = eventually("a2 to lead", Duration::from_secs(30), || async {
        holder(&leases_api)
            .await
            .filter(|h| h.starts_with("a2_"))
            .map(|_| Instant::now())
    })
    .await;
    // Not leading yet: `leader_unavailable`; leading: a grant, never the
    // `recovering` wait of a take-over without a hand-over.
    let (n1, granted) = first_grant(api, json!({}), &["leader_unavailable"]).await;
    let to_grant = granted.saturating_duration_since(led);
    println!(
        "first new grant {:.1} s after a2 took the Lease, {:.1} s after it started, {:.1} s after SIGTERM",
        to_grant.as_secs_f64(),
        granted.duration_since(started).as_secs_f64(),
        granted.duration_since(stopped).as_secs_f64()
    );
    assert!(
        to_grant < Duration::from_secs(DEFAULT_TTL / 2),
        "no recovery window ({DEFAULT_TTL} s) after a hand-over: {to_grant:?}"
    );
    let log2 = log_of(dir.path(), "a2");
    assert!(
        log2.contains("Took over the previous leader's leases"),
        "{log2}"
    );
    assert!(
        !log2.contains("Recovering the previous leader's leases"),
        "{log2}"
    );
    assert_eq!(name_of(&n1), z, "neither full X nor cooling Y");

    // Every lease held before renews, on its proxy; the released one stays
    // released.
    for held in [&s1, &s2, &failed] {
        let path = format!("/v1/leases/{}/renew", held["id"].as_str().unwrap());
        let (s, _, v) = post(api, &path, json!({})).await;
        assert_eq!(s, 200, "a lease held before renews after: {v}");
        assert_eq!(v["proxy"]["name"], held["proxy"]["name"], "{v}");
    }
    let (s, v) = api_call(api, "GET", &freed, Some(TOKEN), vec![]).await;
    assert_eq!(s, 404, "a released id stays released: {v}");

    // The sticky key still leads to X, though Z has fewer leases...
    let again = grant(sticky).await;
    assert_eq!(name_of(&again), x, "the sticky key survived: {again}");
    // ...and Y still cools down: with X full, Z is chosen over Y though
    // both hold one lease and Y was granted longer ago.
    let n2 = grant(json!({})).await;
    assert_eq!(name_of(&n2), z, "Y's cooldown survived: {n2}");
    let on_lease = leases_api.get(LEASE).await.unwrap();
    let annotations = on_lease.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("crawl.example.com/lease-handover")
            .map(String::as_str),
        Some(""),
        "the new leader marks the hand-over taken"
    );
    drop(a2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_new_grants_wait_for_the_longest_granted_ttl_not_one_refused() {
    squid::require();
    let ground = support::ground_without_pods("handover-kill").await;
    let dir = tempfile::tempdir().unwrap();
    let leases_api: Api<Lease> = ground.api();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(Ipv4Addr::LOCALHOST, port, "hokill", "http_access allow me").await;
    let api = support::loopback();
    let granted_ttl = 10;
    let flags = [
        "--max-leases-per-proxy",
        "1",
        "--default-lease-ttl",
        "10s",
        "--max-lease-ttl",
        "1h",
    ];
    let a = replica(&ground, dir.path(), "k", api, target, &flags);
    eventually("k to lead", Duration::from_secs(30), || async {
        holder(&leases_api).await.filter(|h| h.starts_with("k_"))
    })
    .await;
    ready_proxies(&ground, &["sq-1"], port, api).await;
    let held = eventually("a grant", Duration::from_secs(30), || async {
        let (s, _, v) = post(api, "/v1/leases", json!({})).await;
        (s == 201).then_some(v)
    })
    .await;
    // An hour asked for, refused: the only proxy is full.
    let (s, _, v) = post(api, "/v1/leases", json!({"ttlSeconds": 3600})).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("no_capacity")),
        "{v}"
    );
    // The leader writes its horizon at every renewal; let one pass.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let on_lease = leases_api.get(LEASE).await.unwrap();
    let ms: u64 = on_lease.metadata.annotations.unwrap()["crawl.example.com/lease-horizon-ms"]
        .parse()
        .unwrap();
    println!(
        "published horizon: {ms} ms after the write; the held lease on {}",
        held["proxy"]["name"]
    );
    assert!(
        ms <= (granted_ttl + 2) * 1000,
        "the horizon counts the granted TTL, not the refused hour: {ms} ms"
    );

    // SIGKILL: no hand-over; the next process starts at once.
    std::process::Command::new("kill")
        .args(["-KILL", &a.pid().to_string()])
        .status()
        .unwrap();
    let killed = Instant::now();
    drop(a);
    let _k2 = replica(&ground, dir.path(), "k2", api, target, &flags);
    eventually("k2 to listen", Duration::from_secs(30), || async {
        tokio::net::TcpStream::connect(api).await.ok().map(|_| ())
    })
    .await;
    let (_, granted) = first_grant(
        api,
        json!({}),
        &["leader_unavailable", "recovering", "no_capacity"],
    )
    .await;
    let waited = granted.duration_since(killed);
    println!(
        "first grant {:.1} s after the kill (longest granted TTL {granted_ttl} s)",
        waited.as_secs_f64()
    );
    // The margin: the election's lease duration (4 s, the take-over
    // itself), the horizon's margin (two 500 ms retry periods), and 10 s
    // for the process start and the polling.
    let bound = Duration::from_secs(granted_ttl + 4 + 1 + 10);
    assert!(waited <= bound, "waited {waited:?}, bound {bound:?}");
    let log = log_of(dir.path(), "k2");
    assert!(
        log.contains("Recovering the previous leader's leases"),
        "{log}"
    );
}
