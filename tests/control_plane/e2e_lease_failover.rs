//! Leases that survive a leader change, on the real test cluster: two
//! replicas with --leader-elect, two External Proxies on a real Squid, a
//! crawler's leases granted by the leader; the leader is SIGKILLed right
//! after its last grant. The follower was named in sync on the election
//! Lease, so its copy of the leader's table holds every lease the crawler
//! was told of: as the new leader it knows them all (each renews there at
//! once, on its proxy), refuses a grant past capacity, and grants a freed
//! slot at once, with no recovery window (issue 31).
//! The signing key Secret is created once and reused by a restarted
//! replica.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use crate::support::leader::{self, campaigning, holder, LEASE, TOKEN};
use crate::support::{self, api_call, api_call_retry_after, eventually, phase, squid, Ground};

const CAPACITY: usize = 2;
const TTL: u64 = 30;
const KEY_SECRET: &str = "egress-proxies-operator-lease-key";
const KEY_CREATED: &str = "Created the lease signing key";
const SYNCED: &str = "crawl.example.com/lease-synced-replicas";

fn addr() -> SocketAddr {
    format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap()
}

fn replica(
    ground: &Ground,
    dir: &std::path::Path,
    name: &str,
    api: SocketAddr,
    target: SocketAddr,
) -> support::Operator {
    let capacity = CAPACITY.to_string();
    // The TTL the crawler asks for: a horizon counts the default from the
    // start of a term.
    let flags = [
        "--max-leases-per-proxy",
        &capacity,
        "--default-lease-ttl",
        "30s",
    ];
    leader::serving_replica(ground, dir, name, (api, target), &flags, &[])
}

async fn renew(api: SocketAddr, id: &str) -> (u16, Value) {
    let body = format!(r#"{{"ttlSeconds": {TTL}}}"#).into_bytes();
    api_call(
        api,
        "POST",
        &format!("/v1/leases/{id}/renew"),
        Some(TOKEN),
        body,
    )
    .await
}

async fn acquire(api: SocketAddr) -> (u16, Option<u64>, Value) {
    let body = format!(r#"{{"ttlSeconds": {TTL}}}"#).into_bytes();
    api_call_retry_after(api, "POST", "/v1/leases", Some(TOKEN), body).await
}

fn per_proxy(leases: &[Value]) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for l in leases {
        *n.entry(l["proxy"]["name"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    n
}

fn log_of(dir: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_in_sync_knows_every_lease_after_a_killed_leader_and_grants_at_once() {
    squid::require();
    let ground = support::ground_without_pods("lease-failover").await;
    let dir = tempfile::tempdir().unwrap();
    let leases_api: Api<Lease> = ground.api();
    let secrets: Api<Secret> = ground.api();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        port,
        "failover",
        "http_access allow me",
    )
    .await;
    let (api_a, api_b) = (addr(), addr());

    let a = replica(&ground, dir.path(), "a", api_a, target);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases_api).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = replica(&ground, dir.path(), "b", api_b, target);
    campaigning(&dir.path().join("b.log")).await;
    let proxies = ground.proxies();
    for name in ["sq-1", "sq-2"] {
        let p = support::proxy(
            name,
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually("both Proxies Ready", Duration::from_secs(60), || async {
        for name in ["sq-1", "sq-2"] {
            let p = proxies.get(name).await.ok()?;
            (phase(&p) == Some("Ready")).then_some(())?;
        }
        Some(())
    })
    .await;
    let secret = secrets.get(KEY_SECRET).await.unwrap();
    let key = secret.data.clone().unwrap()["key"].clone();
    assert_eq!(key.0.len(), 32, "32 random bytes");

    // The follower copies the leader's table and is named in sync.
    eventually("b named in sync", Duration::from_secs(30), || async {
        let lease = leases_api.get(LEASE).await.ok()?;
        let named = lease.metadata.annotations?.get(SYNCED).cloned()?;
        named.contains(" b_").then_some(())
    })
    .await;

    // The crawler fills every slot at the leader.
    let mut held = Vec::new();
    for i in 0..2 * CAPACITY {
        let lease = eventually("a lease at a", Duration::from_secs(30), || async {
            let (s, _, v) = acquire(api_a).await;
            (s == 201).then_some(v)
        })
        .await;
        println!("lease {i} on {}", lease["proxy"]["name"]);
        held.push(lease);
    }
    assert!(
        per_proxy(&held).values().all(|n| *n == CAPACITY),
        "{held:?}"
    );
    let (s, _, v) = acquire(api_a).await;
    assert_eq!((s, v["error"]["code"].as_str()), (409, Some("no_capacity")));

    // SIGKILL at once: no hand-over, and no time for a periodic copy.
    let took = leader::kill_until_held_by(a, &leases_api, "b").await;
    let took_over = Instant::now();
    println!("takeover {took:?} after the kill");

    // Every held lease renews at the new leader, on its proxy.
    let mut renewed = Vec::new();
    for lease in &held {
        let (s, v) = renew(api_b, lease["id"].as_str().unwrap()).await;
        assert_eq!(s, 200, "renewing at the new leader: {v}");
        assert_eq!(v["proxy"]["name"], lease["proxy"]["name"], "{v}");
        assert_ne!(v["id"], lease["id"], "a renewal answers a fresh id");
        renewed.push(v);
    }
    assert!(
        per_proxy(&renewed).values().all(|n| *n == CAPACITY),
        "{renewed:?}"
    );
    // The new leader knew them all from its copy, the last one granted
    // too: none was taken in, and every slot is still taken.
    let b_log = log_of(dir.path(), "b");
    assert!(b_log.contains("known_leases=4"), "{b_log}");
    assert!(
        b_log.contains("granting at once"),
        "a warm take-over: {b_log}"
    );
    let (s, _, v) = acquire(api_b).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("no_capacity")),
        "never past capacity after the take-over: {v}"
    );

    // One lease released: its slot is granted again at once, with no
    // recovery window.
    let freed = renewed.pop().unwrap();
    let path = format!("/v1/leases/{}", freed["id"].as_str().unwrap());
    assert_eq!(
        api_call(api_b, "DELETE", &path, Some(TOKEN), vec![])
            .await
            .0,
        204
    );
    let (s, _, granted) = acquire(api_b).await;
    assert_eq!(s, 201, "granted at once, no window: {granted}");
    let to_grant = took_over.elapsed();
    println!(
        "first new grant {:.1} s after the take-over (the TTL, and so the window without a copy in sync, is {TTL} s)",
        to_grant.as_secs_f64()
    );
    assert_eq!(
        granted["proxy"]["name"], freed["proxy"]["name"],
        "{granted}"
    );
    renewed.push(granted);
    assert!(
        per_proxy(&renewed).values().all(|n| *n == CAPACITY),
        "{renewed:?}"
    );
    let (s, _, v) = acquire(api_b).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("no_capacity")),
        "never past capacity: {v}"
    );

    // A restarted replica reads the same key: it creates nothing, and an
    // id the new leader signed checks out there.
    let api_c = addr();
    let _c = replica(&ground, dir.path(), "a2", api_c, target);
    campaigning(&dir.path().join("a2.log")).await;
    let id = renewed[0]["id"].as_str().unwrap();
    let got = eventually("a2 to check b's id", Duration::from_secs(30), || async {
        let (s, v) = api_call(
            api_c,
            "GET",
            &format!("/v1/leases/{id}"),
            Some(TOKEN),
            vec![],
        )
        .await;
        (s == 200).then_some(v)
    })
    .await;
    assert_eq!(got["proxy"]["name"], renewed[0]["proxy"]["name"], "{got}");
    let again = secrets.get(KEY_SECRET).await.unwrap();
    assert_eq!(
        again.metadata.uid, secret.metadata.uid,
        "the Secret was not replaced"
    );
    assert_eq!(again.data.unwrap()["key"], key);
    let created: usize = ["a", "b", "a2"]
        .iter()
        .map(|n| log_of(dir.path(), n).matches(KEY_CREATED).count())
        .sum();
    assert_eq!(created, 1, "the key is created once");
    assert!(log_of(dir.path(), "a").contains(KEY_CREATED));
    let lease = leases_api.get(LEASE).await.unwrap();
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert!(
        annotations.contains_key("crawl.example.com/lease-horizon"),
        "{annotations:?}"
    );
    drop(b);
}
