//! The gateway's front door under ordinary misfortune and one careless or
//! hostile client (docs/gateway.md, "Failures" and "Signing in"), on the
//! world of e2e_gateway: the real operator with its gateway on the real
//! test cluster, three real Squids as External Proxies, real curl.
//!
//! - A dead site is the site's fault: CONNECTs to a closed port get
//!   Squid's own `503` marked `x-gateway-failure: target`, and no upstream
//!   is passed over for it, so rotation and sessions go on as before.
//! - Failed sign-ins from one address cannot keep another address's
//!   signed-in client out.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::e2e_gateway::{curl_async, Seen, World};
use crate::support;

/// Whether curl's dump of the headers carries `name: value` (any case).
fn has_header(seen: &Seen, name: &str, value: &str) -> bool {
    let want = format!("{name}: {value}").to_ascii_lowercase();
    seen.headers
        .to_ascii_lowercase()
        .lines()
        .any(|l| l.trim_end().starts_with(&want))
}

/// 45 CONNECTs to a closed port (a third of them on a session, the rest
/// rotating), then 30 rotated requests to a live https site: each of the
/// 45 is Squid's `503` relayed with `x-gateway-failure: target` and its
/// `X-Squid-Error`; all 30 are `200` and leave through all three Squids;
/// the session that met the dead site still leaves through its Squid and
/// was never told it moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_site_is_relayed_as_the_targets_failure_and_takes_no_upstream_out() {
    let w = World::build("gwdead", 1, (&["--gateway-max-connections", "1000"], &[])).await;
    let gw = w.gw;
    let live = format!("https://localhost:{}/", w.https.port());
    // A port nothing listens on: Squid's connect to it is refused.
    let dead = format!("https://127.0.0.1:{}/", support::free_port());
    let session = "default-session-login7";

    let first = curl_async(gw, session, &live).await;
    assert_eq!(first.status, 200, "{first:?}");
    let home = w.upstream_of(&first.body);

    let mut relayed = 0;
    for n in 0..45 {
        let user = if n % 3 == 0 { session } else { "default" };
        let seen = curl_async(gw, user, &dead).await;
        assert_eq!(seen.status, 503, "CONNECT {n} to the dead site: {seen:?}");
        assert!(
            has_header(&seen, "x-gateway-failure", "target"),
            "CONNECT {n}: the crawler is told it is the target's: {seen:?}"
        );
        assert!(
            has_header(&seen, "x-squid-error", "err_connect_fail"),
            "CONNECT {n}: Squid's own answer is relayed: {seen:?}"
        );
        assert!(
            !has_header(&seen, "x-gateway-session-moved", "true"),
            "CONNECT {n}: {seen:?}"
        );
        relayed += 1;
    }

    let mut exits = BTreeSet::new();
    for n in 0..30 {
        let seen = curl_async(gw, "default", &live).await;
        assert_eq!(
            seen.status, 200,
            "live request {n} after the dead site: {seen:?}"
        );
        exits.insert(w.upstream_of(&seen.body));
    }
    let after = curl_async(gw, session, &live).await;
    assert_eq!(after.status, 200, "{after:?}");
    println!(
        "dead site: {relayed} CONNECTs relayed as the target's 503; then 30 of 30 live \
         requests 200 through upstreams {exits:?}; the session stayed on up-{home}"
    );
    assert_eq!(
        exits.len(),
        3,
        "rotation still reaches all three Squids: {exits:?}"
    );
    assert_eq!(
        w.upstream_of(&after.body),
        home,
        "the session keeps its Squid: {after:?}"
    );
    assert!(
        !has_header(&after, "x-gateway-session-moved", "true"),
        "{after:?}"
    );
    drop(w.ground);
}

/// Connections that fail to sign in, from 127.0.0.2.
const FLOOD: usize = 1000;
/// How often each flooding connection asks again once answered or closed.
const FLOOD_PAUSE: Duration = Duration::from_secs(1);

/// What the flood met.
#[derive(Default)]
struct Flood {
    /// `407` answers.
    refused: AtomicU64,
    /// Connections closed before any answer (or not accepted).
    closed: AtomicU64,
}

/// One flooding connection from `from`, asking without credentials
/// every [`FLOOD_PAUSE`] on the same connection while the gateway keeps
/// it open (as a client that holds its connections would), on a new one
/// once it is closed, until `stop`.
async fn flood_one(
    gw: SocketAddr,
    from: IpAddr,
    target: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Flood>,
) {
    let ask = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n");
    while !stop.load(Ordering::Relaxed) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_secs(5), socket.connect(gw)).await
        else {
            seen.closed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(FLOOD_PAUSE).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let answered = async {
                c.write_all(ask.as_bytes()).await.ok()?;
                // The 407 is small: one read takes it whole.
                let mut head = [0u8; 4096];
                let n = c.read(&mut head).await.ok()?;
                (n >= 12 && &head[9..12] == b"407").then_some(())
            };
            let got = tokio::time::timeout(Duration::from_secs(5), answered).await;
            if got.ok().flatten().is_none() {
                seen.closed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(FLOOD_PAUSE).await;
                break;
            }
            seen.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(FLOOD_PAUSE).await;
        }
    }
}

/// 1,000 connections from 127.0.0.2 keep asking without credentials
/// (each again a second after its answer, on the same connection while
/// it stays open: with `407`s kept alive they held every place of the
/// gateway's 1,000 and the client below got no answer); meanwhile a signed-in client
/// on 127.0.0.1 (curl, a new connection each time) gets its page within
/// 1 s, 20 times of 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_sign_ins_from_one_address_leave_a_signed_in_client_served() {
    let w = World::build("gwflood", 1, (&["--gateway-max-connections", "1000"], &[])).await;
    let (gw, http) = (w.gw, format!("http://{}/", w.http));
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Flood::default()));
    let attacker = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(tokio::spawn(flood_one(
            gw,
            attacker,
            w.http.to_string(),
            stop.clone(),
            seen.clone(),
        )));
    }
    // Every flooding connection has asked at least once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut took = Vec::new();
    for n in 0..20 {
        let started = Instant::now();
        let page = curl_async(gw, "default", &http).await;
        let t = started.elapsed();
        assert_eq!(page.status, 200, "request {n} during the flood: {page:?}");
        took.push(t);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        let _ = f.await;
    }
    let worst = took.iter().max().copied().unwrap_or_default();
    println!(
        "sign-in flood from 127.0.0.2: {FLOOD} connections, {} answered 407, {} closed \
         unanswered; the signed-in client on 127.0.0.1: 20 of 20 pages, slowest {worst:?}",
        seen.refused.load(Ordering::Relaxed),
        seen.closed.load(Ordering::Relaxed)
    );
    for (n, t) in took.iter().enumerate() {
        assert!(
            *t < Duration::from_secs(1),
            "request {n} took {t:?} during the flood: {took:?}"
        );
    }
    assert!(
        seen.refused.load(Ordering::Relaxed) > 0,
        "the flood reached the gateway (else the test proves nothing)"
    );
    drop(w.ground);
}
