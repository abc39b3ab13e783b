//! A leader paused past its lease (issue 52): two replicas on the real
//! test cluster, three External Proxies on a real Squid, two leases each.
//! Eight crawler loops acquire, renew and release through either replica,
//! and an independent ledger (`support::ledger`, as in `leader_leases`)
//! records every answer. The leader `a` is SIGSTOPped; `b` takes the Lease
//! over, and the test fills every slot at `b`: one lease of 60 s (`P`) and
//! the rest of 4 s, renewed every second. Meanwhile the crawlers' calls
//! that picked `a` wait in its socket, as do the test's own acquire and
//! renewal of `P`. When `a` resumes (SIGCONT) its tasks still believe it
//! leads until its campaign runs again, and its table never heard of `b`'s
//! grants; its fence closed at its renew deadline, so it grants nothing and
//! renews nothing itself. The ledger then shows no proxy held past its
//! capacity and no lease renewed in time lost; the acquire is refused (503,
//! or `b`'s 409 once `a` forwards), and a renewal of `P` it answers is
//! `b`'s, with `b`'s expiry.
//!
//! Two things each keep the resumed leader from answering as one: its
//! fence (closed at the renew deadline by the monotonic clock), and its
//! campaign, whose overdue timer fires on the first poll after the resume
//! and steps down, naming nobody as leader, before the queued requests
//! are parsed. Checked by hand (issue 52 note): with either taken out this
//! test passes; with both, the resumed `a` answers the queued acquire
//! itself and the test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use crate::support::leader::{self, holder};
use crate::support::ledger::{Acquired, Live, Renewed, Shared, TTL};
use crate::support::{self, eventually, phase, squid};

const CAPACITY: usize = 2;
const PROXIES: usize = 3;
const LOOPS: usize = 8;
/// `P`'s TTL: long enough to wait out the pause in `a`'s socket.
const LONG_TTL: u64 = 60;

/// The fill's stop flag, and how many leases it holds now.
type Filling = (Arc<AtomicBool>, Arc<AtomicUsize>);

/// Holds every slot at `api` but the one `P` holds: acquires until there
/// are `want`, renews each every second, releases them all once `stop`.
async fn fill(s: Arc<Shared>, api: SocketAddr, want: usize, (stop, now): Filling) -> usize {
    let mut held: Vec<Live> = Vec::new();
    let mut most = 0;
    let mut renewed = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if held.len() < want {
            match s.acquire(api, TTL).await {
                Acquired::Granted(lease) => held.push(lease),
                Acquired::Refused(..) => tokio::time::sleep(Duration::from_millis(100)).await,
                Acquired::Unavailable => {}
            }
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        most = most.max(held.len());
        now.store(held.len(), Ordering::Relaxed);
        if renewed.elapsed() >= Duration::from_secs(1) {
            renewed = Instant::now();
            let mut kept = Vec::new();
            for mut lease in held {
                if !matches!(s.renew(api, &mut lease).await, Renewed::Gone) {
                    kept.push(lease);
                }
            }
            held = kept;
        }
    }
    for lease in &held {
        s.release(api, lease).await;
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_grants_and_renews_nothing_when_it_resumes() {
    squid::require();
    let ground = support::ground_without_pods("pause").await;
    let dir = tempfile::tempdir().unwrap();
    let leases_api: Api<Lease> = ground.api();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(Ipv4Addr::LOCALHOST, port, "pause", "http_access allow me").await;
    let (api_a, api_b) = (support::loopback(), support::loopback());
    let capacity = CAPACITY.to_string();
    let flags = [
        "--max-leases-per-proxy",
        &capacity,
        "--default-lease-ttl",
        "4s",
    ];
    let serving = |name: &str, api: SocketAddr| {
        leader::serving_replica(&ground, dir.path(), name, (api, target), &flags, &[])
    };
    let a = serving("a", api_a);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases_api).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = serving("b", api_b);
    for i in 0..PROXIES {
        let p = support::proxy(
            &format!("sq-{i}"),
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
        );
        ground
            .proxies()
            .create(&PostParams::default(), &p)
            .await
            .unwrap();
    }
    eventually("every Proxy Ready", Duration::from_secs(90), || async {
        let list = ground.proxies().list(&Default::default()).await.ok()?;
        let ready = list.items.iter().filter(|p| phase(p) == Some("Ready"));
        (ready.count() == PROXIES).then_some(())
    })
    .await;
    // Calls to the paused leader wait in its socket until it resumes: a
    // call may wait 30 s before it counts as unreachable.
    let shared = Shared::new(vec![api_a, api_b], Duration::from_secs(30));
    for api in [api_a, api_b] {
        eventually(
            "a lease through each replica",
            Duration::from_secs(60),
            || async {
                let (s, _, v) = shared
                    .call(api, "POST", "/v1/leases", json!({"ttlSeconds": 1}))
                    .await?;
                (s == 201).then_some(v)
            },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let loops = shared.spawn(LOOPS, Duration::from_secs(150));
    tokio::time::sleep(Duration::from_secs(8)).await;
    let before = shared.ledger.lock().unwrap().grants;

    // Paused past its lease (4 s; renew deadline 3 s): b takes over.
    let paused = shared.leader_stopped();
    support::signal(a.pid(), "-STOP");
    eventually(
        "b to take the Lease over",
        Duration::from_secs(30),
        || async { holder(&leases_api).await.filter(|h| h.starts_with("b_")) },
    )
    .await;
    println!(
        "b leads {:.1} s after the pause",
        paused.elapsed().as_secs_f64()
    );
    // P first (after b's recovery window), then every other slot.
    let mut p = eventually("b grants P", Duration::from_secs(90), || async {
        match shared.acquire(api_b, LONG_TTL).await {
            Acquired::Granted(lease) => Some(lease),
            _ => None,
        }
    })
    .await;
    let (stop, holding) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let want = CAPACITY * PROXIES - 1;
    let filling = tokio::spawn(fill(
        shared.clone(),
        api_b,
        want,
        (stop.clone(), holding.clone()),
    ));
    eventually("b's slots all held", Duration::from_secs(60), || async {
        (holding.load(Ordering::Relaxed) == want).then_some(())
    })
    .await;

    // The test's own calls wait in a's socket beside the crawlers'.
    let acquire = {
        let shared = shared.clone();
        tokio::spawn(async move { shared.call(api_a, "POST", "/v1/leases", json!({})).await })
    };
    let renew = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let outcome = shared.renew(api_a, &mut p).await;
            (outcome, p)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !acquire.is_finished() && !renew.is_finished(),
        "a is paused"
    );
    let resumed = Instant::now();
    support::signal(a.pid(), "-CONT");
    println!("a resumed after {:.1} s", (resumed - paused).as_secs_f64());
    let (s, retry_after, v) = acquire.await.unwrap().expect("the resumed leader answers");
    println!("acquire at the resumed leader: {s} {v}");
    match s {
        503 => {
            assert_eq!(v["error"]["code"], "leader_unavailable", "{v}");
            assert!(retry_after.is_some(), "a 503 says when to ask again");
        }
        // Forwarded to b, which has no room.
        409 => assert_eq!(v["error"]["code"], "no_capacity", "{v}"),
        _ => panic!("the resumed leader must not grant past capacity: {s} {v}"),
    }
    let (outcome, p) = renew.await.unwrap();
    if let Renewed::Yes = outcome {
        // Forwarded: b renewed it, and b's table says the same.
        let (s, _, at_b) = shared
            .call(api_b, "GET", &format!("/v1/leases/{}", p.id), Value::Null)
            .await
            .unwrap();
        assert_eq!(s, 200, "{at_b}");
        println!("P renewed through the resumed leader: {at_b}");
        assert_eq!(p.expires_at, at_b["expiresAt"], "the renewal is b's own");
    }
    // And afterwards a follows b: every slot is still held at b.
    eventually("a follows b", Duration::from_secs(30), || async {
        let (s, _, v) = shared.call(api_a, "POST", "/v1/leases", json!({})).await?;
        assert_ne!(s, 201, "a grant past capacity: {v}");
        (s == 409).then_some(())
    })
    .await;
    // The crawlers go on a while beside the full fleet, then everything is
    // released.
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    let most = filling.await.unwrap();
    shared.release(api_b, &p).await;
    shared.finish(loops).await;
    let l = shared.ledger.lock().unwrap();
    let (worst, on) = l.worst();
    println!(
        "grants {} ({before} before the pause), renewals {}, releases {}, refused (409) {}, 503 leader_unavailable {}, 503 recovering {}, unreachable {}, renewed too late (404) {}, lost {}; the fill held {most} of {want}; at most {worst} leases at once on {on}",
        l.grants, l.renewals, l.releases, l.refused, l.unavailable, l.recovering, l.unreachable, l.late, l.lost.len()
    );
    l.assert_sound(CAPACITY);
    assert_eq!(most, want, "the fill held every slot but P's");
    assert!(
        before > 0 && l.grants > before,
        "grants before and after the pause"
    );
    let log = std::fs::read_to_string(dir.path().join("a.log")).unwrap_or_default();
    assert!(
        log.contains("Could not renew the leader lease in time; stepping down")
            || log.contains("Lost the leader lease to another replica; stepping down"),
        "a stepped down after the pause"
    );
    drop((a, b));
}
