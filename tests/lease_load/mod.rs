//! The lease load of `make bench-lease` and `make bench-scale`: 64
//! keep-alive connections doing acquire + release against a discovery API,
//! and the bare axum handler on the same routes that is their baseline.
#![allow(dead_code)] // each benchmark binary uses its own part

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};

/// Concurrent keep-alive connections of a load.
pub const CONNECTIONS: usize = 64;

/// What one load achieved.
pub struct Figures {
    pub pairs: usize,
    pub errors: usize,
    /// Connections the server had closed (idle past its header timeout),
    /// opened again by an open-loop load as a crawler would.
    pub reconnects: usize,
    pub secs: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// One HTTP/1.1 keep-alive connection to `addr`: its sender and the task
/// driving it.
async fn keep_alive(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    (send, tokio::spawn(conn))
}

/// How one acquire + release went.
enum Pair {
    Done,
    /// Answered, but not a grant and its release.
    Refused,
    /// The connection broke.
    Broken,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One acquire and its release on `send`, under `prefix` (`/v1`, or the
/// operator's bench route `/bench`).
async fn pair(send: &mut Sender, token: &str, prefix: &str) -> Pair {
    pair_with(send, token, prefix, b"{\"ttlSeconds\":60}")
        .await
        .0
}

/// [`pair`] with the acquire's `body`; the lease granted, if any.
async fn pair_with(
    send: &mut Sender,
    token: &str,
    prefix: &str,
    body: &'static [u8],
) -> (Pair, Option<Value>) {
    let req = hyper::Request::post(format!("{prefix}/leases"))
        .header("host", "bench")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let Ok(resp) = send.send_request(req).await else {
        return (Pair::Broken, None);
    };
    let ok = resp.status() == 201;
    let Ok(body) = resp.into_body().collect().await else {
        return (Pair::Broken, None);
    };
    let lease = serde_json::from_slice::<Value>(&body.to_bytes()).ok();
    let id = lease
        .as_ref()
        .and_then(|v| v["id"].as_str().map(String::from));
    let (true, Some(id)) = (ok, id) else {
        return (Pair::Refused, lease);
    };
    let req = hyper::Request::delete(format!("{prefix}/leases/{id}"))
        .header("host", "bench")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let Ok(resp) = send.send_request(req).await else {
        return (Pair::Broken, lease);
    };
    let ok = resp.status() == 204;
    let _ = resp.into_body().collect().await;
    match ok {
        true => (Pair::Done, lease),
        false => (Pair::Refused, lease),
    }
}

/// Exactly `total` acquire (with `body`) + release pairs on
/// `connections` keep-alive connections, started no faster than `rate`
/// pairs a second (a test sharing the machine leaves the others CPU),
/// however long they take; a refused or broken pair is counted and
/// retried (a broken connection is opened again), at most `total` times
/// in all. Returns the figures and the last lease granted.
pub async fn pairs(
    addr: SocketAddr,
    (token, body): (&str, &'static [u8]),
    total: usize,
    (connections, rate): (usize, f64),
) -> (Figures, Option<Value>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let start = Instant::now();
    let (left, failures, started) = (
        Arc::new(AtomicUsize::new(total)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (token, left, failures) = (token.to_string(), left.clone(), failures.clone());
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            let (mut send, mut driver) = keep_alive(addr).await;
            let (mut lat, mut errors, mut last) = (Vec::new(), 0, None);
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let n = started.fetch_add(1, Ordering::SeqCst);
                let due = start + Duration::from_secs_f64(n as f64 / rate);
                tokio::time::sleep_until(due.into()).await;
                let t = Instant::now();
                let (outcome, lease) = pair_with(&mut send, &token, "/v1", body).await;
                match outcome {
                    Pair::Done => {
                        lat.push(t.elapsed());
                        last = lease;
                        continue;
                    }
                    Pair::Refused => {}
                    Pair::Broken => {
                        drop(send);
                        let _ = driver.await;
                        (send, driver) = keep_alive(addr).await;
                    }
                }
                errors += 1;
                // Retried, within the bound on failures.
                if failures.fetch_add(1, Ordering::SeqCst) < total {
                    left.fetch_add(1, Ordering::SeqCst);
                }
            }
            drop(send);
            let _ = driver.await;
            (lat, errors, last)
        }));
    }
    let (mut all, mut errors, mut last) = (Vec::new(), 0, None);
    for t in tasks {
        let (l, e, lease) = t.await.unwrap();
        all.extend(l);
        errors += e;
        last = lease.or(last);
    }
    (figures(all, errors, start.elapsed().as_secs_f64()), last)
}

/// Acquire + release pairs on `CONNECTIONS` connections for `run_for`,
/// with the bearer `token`.
pub async fn load(addr: SocketAddr, token: &str, run_for: Duration) -> Figures {
    load_at(addr, token, run_for, "/v1").await
}

/// As [`load`], on the routes under `prefix`.
pub async fn load_at(addr: SocketAddr, token: &str, run_for: Duration, prefix: &str) -> Figures {
    load_with(addr, token, run_for, (prefix, b"{\"ttlSeconds\":60}")).await
}

/// As [`load_at`], each acquire sending `body`.
pub async fn load_with(
    addr: SocketAddr,
    token: &str,
    run_for: Duration,
    (prefix, body): (&str, &'static [u8]),
) -> Figures {
    let deadline = Instant::now() + run_for;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (token, prefix) = (token.to_string(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            let (mut send, driver) = keep_alive(addr).await;
            let mut lat = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                match pair_with(&mut send, &token, &prefix, body).await.0 {
                    Pair::Done => lat.push(t.elapsed()),
                    Pair::Refused => errors += 1,
                    Pair::Broken => {
                        errors += 1;
                        break;
                    }
                }
            }
            drop(send);
            let _ = driver.await;
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    figures(all, errors, start.elapsed().as_secs_f64())
}

fn figures(mut all: Vec<Duration>, errors: usize, secs: f64) -> Figures {
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Figures {
        pairs: all.len(),
        errors,
        reconnects: 0,
        secs,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

/// Connections an open-loop load may use at once.
pub const OPEN_CONNECTIONS: usize = 128;

/// Open-loop load: a pair started every `1 / rate` seconds for `run_for`,
/// whether or not earlier ones have finished, on up to
/// `OPEN_CONNECTIONS` keep-alive connections. Each pair's latency counts
/// from the moment it was due, so a server falling behind shows in the
/// percentiles instead of slowing the load (no coordinated omission).
/// Pairs not done 10 s after the last was due count as errors.
pub async fn open_loop(
    addr: SocketAddr,
    token: &str,
    rate: f64,
    run_for: Duration,
    prefix: &str,
) -> Figures {
    // First in, first out: every connection is used every
    // OPEN_CONNECTIONS / rate seconds, so none idles into the server's
    // header timeout at the rates measured.
    let mut pool = std::collections::VecDeque::new();
    for _ in 0..OPEN_CONNECTIONS {
        pool.push_back(keep_alive(addr).await.0);
    }
    let pool = std::sync::Arc::new(std::sync::Mutex::new(pool));
    let free = std::sync::Arc::new(tokio::sync::Semaphore::new(OPEN_CONNECTIONS));
    let total = (rate * run_for.as_secs_f64()) as u64;
    let (mut all, mut errors, mut reconnects) = (Vec::new(), 0, 0);
    let mut count = |r: Result<(Pair, Duration, bool), tokio::task::JoinError>,
                     all: &mut Vec<Duration>,
                     errors: &mut usize| {
        match r {
            Ok((Pair::Done, took, again)) => {
                all.push(took);
                reconnects += usize::from(again);
            }
            Ok((_, _, again)) => {
                *errors += 1;
                reconnects += usize::from(again);
            }
            Err(_) => *errors += 1,
        }
    };
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        let (pool, free) = (pool.clone(), free.clone());
        let (token, prefix) = (token.to_string(), prefix.to_string());
        tasks.spawn(async move {
            let _permit = free.acquire_owned().await.unwrap();
            let pooled = pool.lock().unwrap().pop_front();
            let (mut send, mut again) = match pooled {
                Some(s) => (s, false),
                None => (keep_alive(addr).await.0, true),
            };
            let mut outcome = pair(&mut send, &token, &prefix).await;
            if matches!(outcome, Pair::Broken) && !again {
                send = keep_alive(addr).await.0;
                again = true;
                outcome = pair(&mut send, &token, &prefix).await;
            }
            let took = due.elapsed();
            if !matches!(outcome, Pair::Broken) {
                pool.lock().unwrap().push_back(send);
            }
            (outcome, took, again)
        });
        while let Some(r) = tasks.try_join_next() {
            count(r, &mut all, &mut errors);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let late = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Ok(Some(r)) = tokio::time::timeout_at(late, tasks.join_next()).await {
        count(r, &mut all, &mut errors);
    }
    errors += tasks.len();
    tasks.abort_all();
    // The drivers end with their connections.
    pool.lock().unwrap().clear();
    let mut f = figures(all, errors, secs);
    f.reconnects = reconnects;
    f
}

/// Fills `count` live leases (one-hour TTL) through the API at `addr` on
/// `CONNECTIONS` keep-alive connections; returns how many were granted.
pub async fn fill(addr: SocketAddr, token: &str, count: usize) -> usize {
    let per = count.div_ceil(CONNECTIONS);
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let n = per.min(count.saturating_sub(c * per));
        let token = token.to_string();
        tasks.push(tokio::spawn(async move {
            let (mut send, driver) = keep_alive(addr).await;
            let mut granted = 0;
            for _ in 0..n {
                let req = hyper::Request::post("/v1/leases")
                    .header("host", "bench")
                    .header("authorization", format!("Bearer {token}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(b"{\"ttlSeconds\":3600}")))
                    .unwrap();
                let Ok(resp) = send.send_request(req).await else {
                    break;
                };
                granted += usize::from(resp.status() == 201);
                let _ = resp.into_body().collect().await;
            }
            drop(send);
            let _ = driver.await;
            granted
        }));
    }
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    granted
}

/// One line of figures.
pub fn print(name: &str, f: &Figures) {
    println!(
        "{name:<22} {:>9.0} acquire+release/s  p50 {:>8.3} ms  p99 {:>8.3} ms  ({} pairs, {} errors, {:.1}s)",
        f.pairs as f64 / f.secs,
        f.p50.as_secs_f64() * 1e3,
        f.p99.as_secs_f64() * 1e3,
        f.pairs,
        f.errors,
        f.secs
    );
}

impl Figures {
    /// Pairs per second.
    pub fn rate(&self) -> f64 {
        self.pairs as f64 / self.secs.max(1e-9)
    }
}

/// A bare axum handler answering the two routes with fixed bodies, on a
/// free loopback port; stops when `stop` fires.
pub async fn bare_server(stop: tokio::sync::oneshot::Receiver<()>) -> SocketAddr {
    let bare = Router::new()
        .route(
            "/v1/leases",
            post(|| async {
                (
                    StatusCode::CREATED,
                    Json(json!({"id": "l-bare", "proxy": {"ip": "10.0.0.1", "port": 3128}})),
                )
            }),
        )
        .route(
            "/v1/leases/{id}",
            delete(|| async { StatusCode::NO_CONTENT }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, bare)
            .with_graceful_shutdown(async move {
                let _ = stop.await;
            })
            .await
    });
    addr
}
