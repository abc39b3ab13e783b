//! Crawler loops and an independent ledger of every answer they get
//! (issues 31 and 52): the loops acquire, renew and release through
//! randomly chosen replicas; the ledger knows, from the answers alone, when
//! each lease was surely live, and so how many leases one proxy surely had
//! at once, which renewals in time were answered "gone", and which 503s
//! said neither `leader_unavailable` nor `recovering` with `Retry-After`.
//! `leader_leases` (kills and a rollout) and `leader_pause` (a SIGSTOPped
//! leader) check capacity and loss with it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};

use super::leader::TOKEN;

/// The TTL every crawler asks for (seconds).
pub const TTL: u64 = 4;

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// One answer: status, `Retry-After`, JSON body; `None` when the replica
/// could not be reached (killed, or paused past the call's timeout).
pub type Answer = Option<(u16, Option<u64>, Value)>;

/// What the test knows of one lease: surely live from the moment its
/// grant was received until the earliest of (the latest renewal's send
/// time + TTL, when its release was sent, when the server said it is gone).
struct Held {
    proxy: String,
    from: Instant,
    until: Instant,
}

#[derive(Default)]
pub struct Ledger {
    leases: HashMap<String, Held>,
    pub grants: u64,
    pub renewals: u64,
    pub releases: u64,
    pub refused: u64,
    pub unavailable: u64,
    pub unreachable: u64,
    /// 503 recovering on acquire (a new leader's window).
    pub recovering: u64,
    /// Renewals that passed at a later leader than the one that granted.
    pub survived: u64,
    /// 404 on a renew sent after the lease's expiry: the crawler was late.
    pub late: u64,
    /// 404 on a renew sent in time: a lease lost.
    pub lost: Vec<String>,
    pub bad_unavailable: Vec<String>,
}

impl Ledger {
    /// What every answer must have kept: no proxy surely held past
    /// `capacity`, every 503 `leader_unavailable` (or `recovering` on
    /// acquire) with `Retry-After`, no lease renewed in time lost.
    pub fn assert_sound(&self, capacity: usize) {
        let (worst, on) = self.worst();
        assert!(
            worst <= capacity,
            "{on} was held {worst} times at once (capacity {capacity})"
        );
        assert!(
            self.bad_unavailable.is_empty(),
            "503 without leader_unavailable and Retry-After: {:?}",
            self.bad_unavailable
        );
        assert!(
            self.lost.is_empty(),
            "leases renewed in time and lost: {:?}",
            self.lost
        );
    }

    /// The most leases surely live at once on one proxy, and where.
    pub fn worst(&self) -> (usize, String) {
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

/// A small deterministic generator per loop (no dependency needed).
pub struct Rng(pub u64);
impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One lease a crawler holds, as its answers gave it.
pub struct Live {
    /// Its name in the ledger: its first id (a renew answers with a fresh
    /// id, and only the newest survives a failover).
    pub key: String,
    /// The id to present next.
    pub id: String,
    /// When it was asked for.
    pub asked: Instant,
    /// Surely live until then: the server's clock started later.
    pub expires: Instant,
    /// The TTL asked for at each call (seconds).
    pub ttl: u64,
    /// The expiry the last answer gave (`expiresAt`).
    pub expires_at: Value,
}

/// What an acquire came to.
pub enum Acquired {
    Granted(Live),
    /// 409, with its `Retry-After` and error code.
    Refused(Option<u64>, String),
    /// 503 (noted and waited out) or no answer.
    Unavailable,
}

/// What a renewal came to.
pub enum Renewed {
    Yes,
    /// 404: the lease is over (rightly or not, as the ledger says).
    Gone,
    /// 503 (noted and waited out) or no answer: the lease is as it was.
    Unavailable,
}

/// The crawlers' shared client, the replicas they call, and the ledger.
pub struct Shared {
    http: Http,
    apis: Vec<SocketAddr>,
    pub ledger: Mutex<Ledger>,
    /// When a leader was stopped (SIGKILL or SIGTERM): its table is gone.
    leader_stops: Mutex<Vec<Instant>>,
    done: AtomicBool,
    stop_at: Mutex<Instant>,
    /// How long a call may wait for its answer.
    timeout: Duration,
}

impl Shared {
    /// Crawlers of `apis`; a call unanswered after `timeout` counts as
    /// unreachable.
    pub fn new(apis: Vec<SocketAddr>, timeout: Duration) -> Arc<Self> {
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        Arc::new(Shared {
            http,
            apis,
            ledger: Mutex::new(Ledger::default()),
            leader_stops: Mutex::new(Vec::new()),
            done: AtomicBool::new(false),
            stop_at: Mutex::new(Instant::now()),
            timeout,
        })
    }

    /// `loops` crawlers, each with its own seed, that stop when told or
    /// after `crawl_for` at the latest.
    pub fn spawn(
        self: &Arc<Self>,
        loops: usize,
        crawl_for: Duration,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        *self.stop_at.lock().unwrap() = Instant::now() + crawl_for;
        (0..loops)
            .map(|i| tokio::spawn(crawl(self.clone(), i as u64 + 1)))
            .collect()
    }

    /// Stops the crawlers `loops` after their current round, and waits
    /// for each.
    pub async fn finish(&self, loops: Vec<tokio::task::JoinHandle<()>>) {
        self.done.store(true, Ordering::Relaxed);
        for l in loops {
            l.await.unwrap();
        }
    }

    fn running(&self) -> bool {
        Instant::now() < *self.stop_at.lock().unwrap() && !self.done.load(Ordering::Relaxed)
    }

    /// A call to `api` with the replicas' token.
    pub async fn call(&self, api: SocketAddr, method: &str, path: &str, body: Value) -> Answer {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{api}{path}"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = tokio::time::timeout(self.timeout, self.http.request(req))
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

    /// The leader is stopped now (killed, terminated or paused). Its
    /// leases live on: the next leader takes them in when presented.
    pub fn leader_stopped(&self) -> Instant {
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

    /// An acquire of a lease of `ttl` seconds at `api`, in the ledger.
    pub async fn acquire(&self, api: SocketAddr, ttl: u64) -> Acquired {
        let sent = Instant::now();
        let body = json!({ "ttlSeconds": ttl });
        let Some((status, retry_after, v)) = self.call(api, "POST", "/v1/leases", body).await
        else {
            self.ledger.lock().unwrap().unreachable += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Acquired::Unavailable;
        };
        match status {
            201 => {}
            409 => {
                self.ledger.lock().unwrap().refused += 1;
                let code = v["error"]["code"].as_str().unwrap_or_default();
                return Acquired::Refused(retry_after, code.to_string());
            }
            503 => {
                self.unavailable("acquire", retry_after, &v).await;
                return Acquired::Unavailable;
            }
            other => panic!("acquire answered {other}: {v}"),
        }
        let key = v["id"].as_str().unwrap().to_string();
        let expires = sent + granted_ttl(&v, ttl);
        let mut l = self.ledger.lock().unwrap();
        l.grants += 1;
        l.leases.insert(
            key.clone(),
            Held {
                proxy: v["proxy"]["name"].as_str().unwrap().to_string(),
                from: Instant::now(),
                until: expires,
            },
        );
        Acquired::Granted(Live {
            id: key.clone(),
            key,
            asked: sent,
            expires,
            ttl,
            expires_at: v["expiresAt"].clone(),
        })
    }

    /// A renewal of `lease` for its TTL at `api`, in the ledger.
    pub async fn renew(&self, api: SocketAddr, lease: &mut Live) -> Renewed {
        let sent = Instant::now();
        let path = format!("/v1/leases/{}/renew", lease.id);
        let renew = json!({ "ttlSeconds": lease.ttl });
        let Some((status, retry_after, v)) = self.call(api, "POST", &path, renew).await else {
            self.ledger.lock().unwrap().unreachable += 1;
            return Renewed::Unavailable;
        };
        let mut l = self.ledger.lock().unwrap();
        match status {
            200 => {
                l.renewals += 1;
                if self.stop_after(lease.asked).is_some_and(|stop| stop < sent) {
                    l.survived += 1;
                }
                lease.id = v["id"].as_str().unwrap().to_string();
                lease.expires_at = v["expiresAt"].clone();
                lease.expires = lease.expires.max(sent + granted_ttl(&v, lease.ttl));
                let h = l.leases.get_mut(&lease.key).unwrap();
                h.until = h.until.max(lease.expires);
                Renewed::Yes
            }
            404 => {
                l.ended(&lease.key, (sent, lease.expires), "renewed", &v);
                Renewed::Gone
            }
            503 => {
                drop(l);
                self.unavailable("renew", retry_after, &v).await;
                Renewed::Unavailable
            }
            other => panic!("renew answered {other}: {v}"),
        }
    }

    /// A release of `lease` at `api`, in the ledger.
    pub async fn release(&self, api: SocketAddr, lease: &Live) {
        let sent = Instant::now();
        let path = format!("/v1/leases/{}", lease.id);
        match self.call(api, "DELETE", &path, json!(null)).await {
            Some((204, _, _)) => {
                let mut l = self.ledger.lock().unwrap();
                l.releases += 1;
                let h = l.leases.get_mut(&lease.key).unwrap();
                h.until = h.until.min(sent);
            }
            // Ended already: only right once its TTL surely ran out.
            Some((404, _, v)) => {
                let mut l = self.ledger.lock().unwrap();
                l.ended(&lease.key, (sent, lease.expires), "released", &v);
            }
            // Not released: it runs out after its TTL, as the ledger has it.
            Some((503, retry_after, v)) => self.unavailable("release", retry_after, &v).await,
            Some((other, _, v)) => panic!("release answered {other}: {v}"),
            None => self.ledger.lock().unwrap().unreachable += 1,
        }
    }
}

/// The TTL an answer surely granted. A new leader may clamp it to its
/// horizon; the answer rounds the seconds left up, so a clamped one may be
/// up to a second shorter than it says.
fn granted_ttl(lease: &Value, asked: u64) -> Duration {
    match lease["ttlSeconds"].as_u64().unwrap_or(asked) {
        full if full >= asked => Duration::from_secs(asked),
        clamped => Duration::from_secs(clamped.saturating_sub(1)),
    }
}

/// One crawler: acquire, renew a few times, release; through any replica.
async fn crawl(s: Arc<Shared>, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut rounds = 0;
    while s.running() && rounds < 10_000 {
        rounds += 1;
        let mut lease = match s.acquire(s.pick(&mut rng), TTL).await {
            Acquired::Granted(lease) => lease,
            Acquired::Refused(retry_after, _) => {
                let wait = retry_after.unwrap_or(1).min(2);
                tokio::time::sleep(Duration::from_millis(200 + 300 * wait)).await;
                continue;
            }
            Acquired::Unavailable => continue,
        };
        let mut gone = false;
        for _ in 0..rng.below(3) + 1 {
            tokio::time::sleep(Duration::from_millis(800 + 200 * rng.below(3) as u64)).await;
            if let Renewed::Gone = s.renew(s.pick(&mut rng), &mut lease).await {
                gone = true;
                break;
            }
        }
        if !gone {
            s.release(s.pick(&mut rng), &lease).await;
        }
    }
}
