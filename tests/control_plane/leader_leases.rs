//! One capacity view across replicas: three operator processes with
//! --leader-elect on the real test cluster (control plane only), eight
//! External Proxies on one real Squid, two leases per proxy. Fifty crawler
//! loops acquire, renew and release through randomly chosen replicas for
//! three minutes while the leader is SIGKILLed, every replica is stopped
//! (SIGTERM) and started again in turn, and then leaders are SIGKILLed at
//! random, 8 to 20 s apart (issue 31). An independent ledger in the test records every
//! grant, renewal, release and loss, and checks afterwards that no proxy
//! was ever held more than twice at once, across leaders (a lease lives on
//! at the next leader: its signed id is taken in when presented); that no
//! lease renewed in time (before the expiry its last answer gave) was ever
//! lost; that leases granted before a leader stop renewed after it; and
//! that every 503 was `leader_unavailable` (no leader reachable) or, on
//! acquire, `recovering` (a new leader's window), with `Retry-After`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use serde_json::json;

use crate::support::leader::{self, holder};
use crate::support::ledger::{Rng, Shared};
use crate::support::{self, eventually, phase, squid, Operator};

const CAPACITY: usize = 2;
const PROXIES: usize = 8;
const LOOPS: usize = 50;
/// How long the crawlers run.
const CRAWL_SECS: u64 = 180;

/// The replica index of a Lease holder ("r1g0_1234": 1).
fn leader_index(holder: &str) -> usize {
    holder[1..]
        .split('g')
        .next()
        .unwrap()
        .parse::<usize>()
        .unwrap()
}

/// SIGKILLs the leader among `replicas` and waits until another leads;
/// its index, and when it was killed.
async fn kill_the_leader(
    leases: &Api<Lease>,
    replicas: &[Operator],
    shared: &Shared,
) -> (usize, Instant) {
    let old = holder(leases).await.unwrap();
    let idx = leader_index(&old);
    let killed = shared.leader_stopped();
    std::process::Command::new("kill")
        .args(["-KILL", &replicas[idx].pid().to_string()])
        .status()
        .unwrap();
    let new = eventually(
        "another replica to lead",
        Duration::from_secs(30),
        || async { holder(leases).await.filter(|h| *h != old) },
    )
    .await;
    println!(
        "leader {old} SIGKILLed; {new} leads after {:?}",
        killed.elapsed()
    );
    (idx, killed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_crawlers_on_three_replicas_never_exceed_capacity_across_leader_kills_and_a_rollout()
{
    squid::require();
    let ground = support::ground_without_pods("lease-fwd").await;
    let target = support::http_target().await;
    let squid_port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        squid_port,
        "leasefwd",
        "http_access allow me",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let leases: Api<Lease> = ground.api();
    let apis: Vec<SocketAddr> = (0..3)
        .map(|_| {
            format!("127.0.0.1:{}", support::free_port())
                .parse()
                .unwrap()
        })
        .collect();
    let capacity = CAPACITY.to_string();
    // Replica i, generation g, is named like "r1g0" (its Lease identity
    // starts with it); the same port across restarts.
    let start = |i: usize, g: usize| {
        // A new leader's window is the longest TTL in use.
        let flags = [
            "--max-leases-per-proxy",
            &capacity,
            "--default-lease-ttl",
            "4s",
        ];
        let name = format!("r{i}g{g}");
        leader::serving_replica(&ground, dir.path(), &name, (apis[i], target), &flags, &[])
    };
    let mut replicas: Vec<Operator> = (0..3).map(|i| start(i, 0)).collect();
    let proxies = ground.proxies();
    for i in 0..PROXIES {
        let p = support::proxy(
            &format!("squid-{i}"),
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": squid_port}}),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually("every Proxy Ready", Duration::from_secs(90), || async {
        let list = proxies.list(&Default::default()).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|p| phase(p) == Some("Ready"))
            .count();
        (ready == PROXIES).then_some(())
    })
    .await;
    let shared = Shared::new(apis.clone(), Duration::from_secs(10));
    // Every replica serves lease calls once the followers know the leader.
    for api in &apis {
        eventually(
            "a lease through every replica",
            // Three replicas start, elect and sync while the suite's other
            // tests load the machine: a readiness wait, not a figure.
            Duration::from_secs(90),
            || async {
                let (s, _, v) = shared
                    .call(*api, "POST", "/v1/leases", json!({"ttlSeconds": 1}))
                    .await?;
                (s == 201).then_some(v)
            },
        )
        .await;
    }
    // The leader publishes where it serves on its election Lease.
    let lease = leases.get(leader::LEASE).await.unwrap();
    let leading = leader_index(
        lease
            .spec
            .as_ref()
            .unwrap()
            .holder_identity
            .as_deref()
            .unwrap(),
    );
    assert_eq!(
        lease.metadata.annotations.unwrap()["crawl.example.com/discovery-url"],
        format!("http://{}", apis[leading])
    );
    // Those probe leases run out before the loops start.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let crawling = Instant::now();
    let loops = shared.spawn(LOOPS, Duration::from_secs(CRAWL_SECS + 30));

    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = shared.ledger.lock().unwrap().grants;
    let (idx, _) = kill_the_leader(&leases, &replicas, &shared).await;
    let unavailable_at_kill = shared.ledger.lock().unwrap().unavailable;
    replicas[idx] = start(idx, 1);

    // A rollout: each replica in turn stopped (SIGTERM) and started again.
    let mut generation = [1usize; 3];
    for i in 0..3 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let leads = holder(&leases).await.is_some_and(|h| leader_index(&h) == i);
        let stopped = Instant::now();
        std::process::Command::new("kill")
            .args(["-TERM", &replicas[i].pid().to_string()])
            .status()
            .unwrap();
        let status = tokio::task::block_in_place(|| replicas[i].0.wait().unwrap());
        assert!(
            status.success(),
            "replica {i} exits cleanly on SIGTERM: {status:?}"
        );
        if leads {
            // Its table is gone from the moment it stopped serving.
            shared.leader_stopped();
            let next = eventually("a new leader", Duration::from_secs(30), || async {
                holder(&leases).await.filter(|h| leader_index(h) != i)
            })
            .await;
            println!(
                "leader r{i} stopped by SIGTERM; {next} leads after {:?}",
                stopped.elapsed()
            );
        }
        generation[i] += 1;
        replicas[i] = start(i, generation[i]);
    }
    // Then leaders killed at random, 8 to 20 s apart, until three minutes
    // of crawling have passed.
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut kills = 1;
    loop {
        let pause = Duration::from_millis(8_000 + 1_000 * rng.below(13) as u64);
        if crawling.elapsed() + pause + Duration::from_secs(10) > Duration::from_secs(CRAWL_SECS) {
            break;
        }
        tokio::time::sleep(pause).await;
        let (idx, killed) = kill_the_leader(&leases, &replicas, &shared).await;
        kills += 1;
        println!(
            "kill {kills} at {:.0} s of crawling",
            (killed - crawling).as_secs_f64()
        );
        generation[idx] += 1;
        replicas[idx] = start(idx, generation[idx]);
    }
    while crawling.elapsed() < Duration::from_secs(CRAWL_SECS) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    shared.finish(loops).await;
    let l = shared.ledger.lock().unwrap();
    let (worst, on) = l.worst();
    println!(
        "grants {}, renewals {} ({} at a later leader than the granting one), releases {}, refused (409) {}, 503 leader_unavailable {} ({unavailable_at_kill} by the end of the SIGKILL takeover), 503 recovering {}, unreachable (stopped replica) {}, renewed too late (404) {}, lost {}; before the kill {before} grants; at most {worst} leases at once on {on}",
        l.grants, l.renewals, l.survived, l.releases, l.refused, l.unavailable, l.recovering, l.unreachable, l.late, l.lost.len()
    );
    println!(
        "{kills} leader kills and a rollout in {:.0} s of crawling",
        crawling.elapsed().as_secs_f64()
    );
    l.assert_sound(CAPACITY);
    assert!(
        l.survived > 0,
        "leases granted before a leader stop renewed after it"
    );
    assert!(
        unavailable_at_kill > 0,
        "the crawlers saw 503 leader_unavailable while no replica led"
    );
    assert!(
        before > 20 && l.grants > before,
        "leases were granted before and after the kill: {before} then {}",
        l.grants
    );
    assert!(l.renewals > 0 && l.releases > 0);
    // Capacity was the bound: more crawlers than slots were refused.
    assert!(l.refused > 0);
}
