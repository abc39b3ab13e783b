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

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use crate::support::leader::{self, holder, TOKEN};
use crate::support::{self, eventually, phase, squid, Operator};

const CAPACITY: usize = 2;
const PROXIES: usize = 8;
const LOOPS: usize = 50;
const TTL: u64 = 4;
/// How long the crawlers run.
const CRAWL_SECS: u64 = 180;

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// One answer: status, `Retry-After`, JSON body; `None` when the replica
/// could not be reached (killed).
async fn call(
    http: &Http,
    api: SocketAddr,
    method: &str,
    path: &str,
    body: Value,
) -> Option<(u16, Option<u64>, Value)> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{api}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), http.request(req))
        .await
        .ok()?
        .ok()?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Some((status, retry_after, v))
}

/// What the test knows of one lease: surely live from the moment its
/// grant was received until the earliest of (the latest renewal's send
/// time + TTL, when its release was sent, when the server said it is gone).
struct Held {
    proxy: String,
    from: Instant,
    until: Instant,
}

#[derive(Default)]
struct Ledger {
    leases: HashMap<String, Held>,
    grants: u64,
    renewals: u64,
    releases: u64,
    refused: u64,
    unavailable: u64,
    unreachable: u64,
    /// 503 recovering on acquire (a new leader's window).
    recovering: u64,
    /// Renewals that passed at a later leader than the one that granted.
    survived: u64,
    /// 404 on a renew sent after the lease's expiry: the crawler was late.
    late: u64,
    /// 404 on a renew sent in time: a lease lost.
    lost: Vec<String>,
    bad_unavailable: Vec<String>,
}

impl Ledger {
    /// The most leases surely live at once on one proxy, and where.
    fn worst(&self) -> (usize, String) {
        let mut by_proxy: HashMap<&str, Vec<&Held>> = HashMap::new();
        for h in self.leases.values() {
            by_proxy.entry(&h.proxy).or_default().push(h);
        }
        let mut worst = (0, String::new());
        for (proxy, held) in by_proxy {
            // The count is highest at some lease's start.
            for at in held.iter().map(|h| h.from) {
                let n = held.iter().filter(|h| h.from <= at && at < h.until).count();
                if n > worst.0 {
                    worst = (n, proxy.to_string());
                }
            }
        }
        worst
    }
}

/// A small deterministic generator per loop (no dependency needed).
impl Ledger {
    /// A call `what` on lease `key`, sent at `sent`, answered 404: the
    /// lease ended then at the latest, and rightly only when its expiry
    /// (`expires`, as its answers gave it) had passed.
    fn ended(&mut self, key: &str, (sent, expires): (Instant, Instant), what: &str, v: &Value) {
        let h = self.leases.get_mut(key).unwrap();
        h.until = h.until.min(sent);
        if sent < expires {
            self.lost.push(format!(
                "{key}: {what} {:?} before its expiry, answered 404: {v}",
                expires - sent
            ));
        } else {
            self.late += 1;
        }
    }
}

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

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

struct Shared {
    http: Http,
    apis: Vec<SocketAddr>,
    ledger: Mutex<Ledger>,
    /// When a leader was stopped (SIGKILL or SIGTERM): its table is gone.
    leader_stops: Mutex<Vec<Instant>>,
    done: std::sync::atomic::AtomicBool,
    stop_at: Instant,
}

impl Shared {
    /// The first leader stop after `asked`: a lease asked for before it
    /// may have lived in the stopped leader's table.
    fn stop_after(&self, asked: Instant) -> Option<Instant> {
        self.leader_stops
            .lock()
            .unwrap()
            .iter()
            .copied()
            .find(|k| *k > asked)
    }

    /// The leader is stopped now. Its leases live on: the next leader
    /// takes them in when they are presented.
    fn leader_stopped(&self) -> Instant {
        let now = Instant::now();
        self.leader_stops.lock().unwrap().push(now);
        now
    }

    fn pick(&self, rng: &mut Rng) -> SocketAddr {
        self.apis[rng.below(self.apis.len())]
    }

    /// Notes a 503 (leader_unavailable, or recovering on acquire; with
    /// Retry-After) and waits as told.
    async fn unavailable(&self, what: &str, retry_after: Option<u64>, body: &Value) {
        let code = body["error"]["code"].as_str().unwrap_or("");
        let recovering = what == "acquire" && code == "recovering";
        let ok =
            (code == "leader_unavailable" || recovering) && retry_after.is_some_and(|s| s >= 1);
        {
            let mut l = self.ledger.lock().unwrap();
            if recovering {
                l.recovering += 1;
            } else {
                l.unavailable += 1;
            }
            if !ok {
                l.bad_unavailable
                    .push(format!("{what}: {retry_after:?} {body}"));
            }
        }
        tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1).min(2))).await;
    }
}

/// The TTL an answer surely granted. A new leader may clamp it to its
/// horizon; the answer rounds the seconds left up, so a clamped one may be
/// up to a second shorter than it says.
fn granted_ttl(lease: &Value) -> Duration {
    match lease["ttlSeconds"].as_u64().unwrap_or(TTL) {
        full if full >= TTL => Duration::from_secs(TTL),
        clamped => Duration::from_secs(clamped.saturating_sub(1)),
    }
}

/// One crawler: acquire, renew a few times, release; through any replica.
async fn crawl(s: Arc<Shared>, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut rounds = 0;
    while Instant::now() < s.stop_at
        && !s.done.load(std::sync::atomic::Ordering::Relaxed)
        && rounds < 10_000
    {
        rounds += 1;
        let sent = Instant::now();
        let body = json!({"ttlSeconds": TTL});
        let Some((status, retry_after, v)) =
            call(&s.http, s.pick(&mut rng), "POST", "/v1/leases", body).await
        else {
            s.ledger.lock().unwrap().unreachable += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match status {
            201 => {}
            409 => {
                s.ledger.lock().unwrap().refused += 1;
                let wait = retry_after.unwrap_or(1).min(2);
                tokio::time::sleep(Duration::from_millis(200 + 300 * wait)).await;
                continue;
            }
            503 => {
                s.unavailable("acquire", retry_after, &v).await;
                continue;
            }
            other => panic!("acquire answered {other}: {v}"),
        }
        // The lease's name in the ledger: its first id (a renew answers
        // with a fresh id, and only the newest survives a failover).
        let key = v["id"].as_str().unwrap().to_string();
        let mut id = key.clone();
        let asked = sent;
        // Surely live until then: the server's clock started later.
        let mut expires = sent + granted_ttl(&v);
        {
            let mut l = s.ledger.lock().unwrap();
            l.grants += 1;
            l.leases.insert(
                key.clone(),
                Held {
                    proxy: v["proxy"]["name"].as_str().unwrap().to_string(),
                    from: Instant::now(),
                    until: expires,
                },
            );
        }
        let mut gone = false;
        for _ in 0..rng.below(3) + 1 {
            tokio::time::sleep(Duration::from_millis(800 + 200 * rng.below(3) as u64)).await;
            let sent = Instant::now();
            let renew = json!({"ttlSeconds": TTL});
            let Some((status, retry_after, v)) = call(
                &s.http,
                s.pick(&mut rng),
                "POST",
                &format!("/v1/leases/{id}/renew"),
                renew,
            )
            .await
            else {
                s.ledger.lock().unwrap().unreachable += 1;
                continue;
            };
            let mut l = s.ledger.lock().unwrap();
            match status {
                200 => {
                    l.renewals += 1;
                    if s.stop_after(asked).is_some_and(|stop| stop < sent) {
                        l.survived += 1;
                    }
                    id = v["id"].as_str().unwrap().to_string();
                    expires = expires.max(sent + granted_ttl(&v));
                    let h = l.leases.get_mut(&key).unwrap();
                    h.until = h.until.max(expires);
                }
                404 => {
                    l.ended(&key, (sent, expires), "renewed", &v);
                    gone = true;
                }
                503 => {
                    drop(l);
                    s.unavailable("renew", retry_after, &v).await;
                    continue;
                }
                other => panic!("renew answered {other}: {v}"),
            }
            if gone {
                break;
            }
        }
        if gone {
            continue;
        }
        let sent = Instant::now();
        let path = format!("/v1/leases/{id}");
        match call(&s.http, s.pick(&mut rng), "DELETE", &path, json!(null)).await {
            Some((204, _, _)) => {
                let mut l = s.ledger.lock().unwrap();
                l.releases += 1;
                let h = l.leases.get_mut(&key).unwrap();
                h.until = h.until.min(sent);
            }
            // Ended already: only right once its TTL surely ran out.
            Some((404, _, v)) => {
                let mut l = s.ledger.lock().unwrap();
                l.ended(&key, (sent, expires), "released", &v);
            }
            // Not released: it runs out after its TTL, as the ledger has it.
            Some((503, retry_after, v)) => s.unavailable("release", retry_after, &v).await,
            Some((other, _, v)) => panic!("release answered {other}: {v}"),
            None => s.ledger.lock().unwrap().unreachable += 1,
        }
    }
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
    let http: Http =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    // Every replica serves lease calls once the followers know the leader.
    for api in &apis {
        eventually(
            "a lease through every replica",
            // Three replicas start, elect and sync while the suite's other
            // tests load the machine: a readiness wait, not a figure.
            Duration::from_secs(90),
            || async {
                let (s, _, v) =
                    call(&http, *api, "POST", "/v1/leases", json!({"ttlSeconds": 1})).await?;
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

    let shared = Arc::new(Shared {
        http: http.clone(),
        apis: apis.clone(),
        ledger: Mutex::new(Ledger::default()),
        leader_stops: Mutex::new(Vec::new()),
        done: Default::default(),
        stop_at: Instant::now() + Duration::from_secs(CRAWL_SECS + 30),
    });
    let crawling = Instant::now();
    let loops: Vec<_> = (0..LOOPS)
        .map(|i| tokio::spawn(crawl(shared.clone(), i as u64 + 1)))
        .collect();

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
    shared
        .done
        .store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loops {
        l.await.unwrap();
    }
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
    assert!(
        worst <= CAPACITY,
        "{on} was held {worst} times at once (capacity {CAPACITY})"
    );
    assert!(
        l.bad_unavailable.is_empty(),
        "503 without leader_unavailable and Retry-After: {:?}",
        l.bad_unavailable
    );
    assert!(
        l.lost.is_empty(),
        "leases renewed in time and lost: {:?}",
        l.lost
    );
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
