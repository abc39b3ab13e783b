//! The accept loop against raw TCP clients on 127.0.0.1: what a slow,
//! idle or greedy client gets. Limits are short so the tests are quick;
//! every wait has a generous deadline, none asserts a duration.

use std::io::ErrorKind;
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

const SHORT: Limits = Limits {
    max_connections: 2,
    max_per_address: 0,
    reserved: 0,
    header_read_timeout: Duration::from_millis(300),
    body_read_timeout: Duration::from_millis(300),
    request_timeout: Some(Duration::from_millis(600)),
};

/// Long enough for any of the short limits to fire on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);

struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    async fn start(limits: Limits) -> Server {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    "late"
                }),
            )
            .route("/echo", post(|b: Bytes| async move { b }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, app, limits, async move {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

/// Reads until the server closes the connection (or `DEADLINE` passes:
/// then `None`); returns what it sent.
async fn until_closed(c: &mut TcpStream) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) => panic!("read: {e}"),
            }
        }
    };
    tokio::time::timeout(DEADLINE, read).await.ok()?;
    Some(String::from_utf8_lossy(&got).into_owned())
}

async fn get_ok(addr: std::net::SocketAddr, path: &str) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    until_closed(&mut c).await.expect("an answer")
}

#[tokio::test]
async fn a_client_sending_its_header_a_byte_at_a_time_is_dropped() {
    let s = Server::start(SHORT).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    // A header that never ends, one byte at a time, for longer than the
    // deadline: only the header timeout can end the connection.
    let writer = tokio::spawn(async move {
        let _ = c.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").await;
        for _ in 0..400 {
            if c.write_all(b"a").await.is_err() {
                return Some(c);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    });
    let mut c = writer
        .await
        .unwrap()
        .expect("the server closed the slow connection");
    assert!(until_closed(&mut c).await.is_some());
    // The server goes on answering.
    assert!(get_ok(s.addr, "/").await.starts_with("HTTP/1.1 200"));
    s.stop().await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_new_or_kept_alive() {
    let s = Server::start(SHORT).await;
    let mut fresh = TcpStream::connect(s.addr).await.unwrap();
    let mut kept = TcpStream::connect(s.addr).await.unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(until_closed(&mut fresh).await.is_some(), "a silent new one");
    let answer = until_closed(&mut kept).await.expect("a kept-alive one");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    s.stop().await;
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once_and_slots_come_back() {
    let s = Server::start(Limits {
        header_read_timeout: Duration::from_secs(3600),
        ..SHORT
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..SHORT.max_connections {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        // A request in flight proves the connection has its slot.
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
        held.push(c);
    }
    let mut extra = TcpStream::connect(s.addr).await.unwrap();
    let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(
        until_closed(&mut extra).await.as_deref(),
        Some(""),
        "over the cap: closed without an answer"
    );
    drop(held);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let answer = get_ok(s.addr, "/").await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no slot came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stop().await;
}

#[tokio::test]
async fn a_request_over_its_time_is_answered_408() {
    let s = Server::start(SHORT).await;
    let answer = get_ok(s.addr, "/slow").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    s.stop().await;
}

#[tokio::test]
async fn a_body_that_stops_arriving_fails_the_read() {
    let s = Server::start(Limits {
        request_timeout: Some(Duration::from_secs(3600)),
        ..SHORT
    })
    .await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let answer = until_closed(&mut c).await.expect("an answer");
    assert!(
        answer.starts_with("HTTP/1.1 4"),
        "a client error, not the echo: {answer}"
    );
    s.stop().await;
}

/// A connection from `ip` (a loopback address) to `addr`, with a request
/// answered on it: it holds a slot.
async fn held_from(ip: [u8; 4], addr: std::net::SocketAddr) -> Option<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind((std::net::Ipv4Addr::from(ip), 0).into()).unwrap();
    let mut c = sock.connect(addr).await.unwrap();
    let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut buf = [0u8; 12];
    match c.read_exact(&mut buf).await {
        Ok(_) if &buf == b"HTTP/1.1 200" => Some(c),
        _ => None,
    }
}

#[tokio::test]
async fn one_address_holds_at_most_its_share_and_others_still_get_in() {
    let s = Server::start(Limits {
        max_connections: 8,
        max_per_address: 2,
        header_read_timeout: Duration::from_secs(3600),
        ..SHORT
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            held_from([127, 0, 0, 2], s.addr)
                .await
                .expect("within its share"),
        );
    }
    assert!(
        held_from([127, 0, 0, 2], s.addr).await.is_none(),
        "a third from the same address is closed unanswered"
    );
    for ip in [[127, 0, 0, 1], [127, 0, 0, 3]] {
        held.push(
            held_from(ip, s.addr)
                .await
                .expect("another address gets in"),
        );
    }
    // Its share comes back as its connections close.
    held.remove(0);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while held_from([127, 0, 0, 2], s.addr).await.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no share came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stop().await;
}

#[test]
fn admission_by_address() {
    for (held, max, want) in [
        (0, 0, true),
        (10_000, 0, true),
        (1, 2, true),
        (2, 2, false),
        (3, 2, false),
    ] {
        assert_eq!(admits(held, max), want, "{held} held of {max}");
    }
}

#[tokio::test]
async fn connections_kept_for_replicas_admit_only_trusted_addresses() {
    let trusted = Trusted::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        max_connections: 3,
        max_per_address: 0,
        reserved: 1,
        header_read_timeout: Duration::from_secs(3600),
        ..SHORT
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let task = tokio::spawn(serve_trusting(
        listener,
        app,
        limits,
        trusted.clone(),
        async move {
            let _ = rx.await;
        },
    ));
    // Two general slots, taken by 127.0.0.2.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            held_from([127, 0, 0, 2], addr)
                .await
                .expect("a general slot"),
        );
    }
    assert!(
        held_from([127, 0, 0, 3], addr).await.is_none(),
        "the kept slot is not for an untrusted address"
    );
    trusted.trust([127, 0, 0, 3].into());
    held.push(
        held_from([127, 0, 0, 3], addr)
            .await
            .expect("a trusted replica gets the kept slot"),
    );
    assert!(
        held_from([127, 0, 0, 3], addr).await.is_none(),
        "one kept slot"
    );
    let _ = tx.send(());
    drop(held);
    task.await.unwrap().unwrap();
}

#[test]
fn trust_lasts_a_minute_per_address() {
    let t = Trusted::default();
    let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
    t.trust(a);
    assert!(t.is_trusted(a));
    assert!(!t.is_trusted(b));
    let mapped: IpAddr = std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x0a00, 1]).into();
    assert!(
        t.is_trusted(mapped),
        "an IPv4-mapped address is the same address"
    );
}

/// Sends a request line and `header` bytes of one header field that never
/// ends; returns what came back before the server closed (`None`: it kept
/// the connection past the deadline).
pub(crate) async fn unfinished_head(addr: std::net::SocketAddr, header: usize) -> Option<String> {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let line = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ";
    c.write_all(line).await.unwrap();
    let pad = vec![b'a'; 16 * 1024];
    let mut sent = 0;
    while sent < header {
        // The server may answer and close before all is sent.
        if c.write_all(&pad[..pad.len().min(header - sent)])
            .await
            .is_err()
        {
            break;
        }
        sent += pad.len();
    }
    until_closed(&mut c).await
}

/// Whether `answer` (what a client read) is a 431 or nothing at all (the
/// connection closed or reset before the answer got through).
pub(crate) fn refused_as_too_large(answer: &str) -> bool {
    answer.is_empty() || answer.starts_with("HTTP/1.1 431 ")
}

#[tokio::test]
async fn an_oversized_head_is_answered_431_and_closed_never_served() {
    let s = Server::start(SHORT).await;
    // All sent before the server answers: the 431 gets through (hyper's
    // default buffer would wait for the rest until the header timeout).
    let answer = unfinished_head(s.addr, MAX_HEAD + 1024).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
    // Still sending when the server closes: a reset may beat the 431.
    let answer = unfinished_head(s.addr, 400 * 1000)
        .await
        .expect("the server closes the connection");
    assert!(refused_as_too_large(&answer), "{answer:?}");
    // Too many header fields, each small: 431 as well.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let mut req = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
    for i in 0..=MAX_HEADERS {
        req.push_str(&format!("X-H{i}: v\r\n"));
    }
    req.push_str("\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let answer = until_closed(&mut c).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
    // A head just under the bound is served.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let pad = "a".repeat(MAX_HEAD - 200);
    let req = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Pad: {pad}\r\nConnection: close\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let answer = until_closed(&mut c).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    s.stop().await;
}

#[test]
fn the_read_buffer_bound_follows_hypers_growth() {
    for (max, bound) in [
        (8192, 8192),
        (16 * 1024, 16 * 1024),
        (24 * 1024, 48 * 1024),
        (408 * 1024, 816 * 1024),
    ] {
        assert_eq!(read_buffer_bound(max), bound, "{max}");
    }
}

/// The gateway's front, built by the same [`http1_server`]: an unfinished
/// 400 KB header line never reaches its sign-in (no 407, no relay).
#[tokio::test]
async fn the_gateway_answers_an_oversized_head_431_before_sign_in() {
    use crate::discovery::ApiState;
    use crate::gateway::{ApiFleet, Gateway, Settings};
    use crate::lease::{LeaseConfig, LeaseStore};
    let config = LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    };
    let mut registry = crate::metrics::Registrar::new();
    let metrics = crate::discovery::metrics::DiscoveryMetrics::register(&mut registry);
    let state = ApiState::new(
        Arc::new(Vec::new()),
        Arc::new(LeaseStore::new(config)),
        Some("t"),
        &metrics,
    );
    let gateway_metrics = crate::gateway::metrics::GatewayMetrics::register(&mut registry);
    let fleet = Arc::new(ApiFleet::new(state.gateway_parts()));
    let gw = Arc::new(Gateway::new(fleet, Settings::default(), gateway_metrics));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(crate::gateway::serve(listener, gw, async move {
        let _ = rx.await;
    }));
    let answer = unfinished_head(addr, MAX_HEAD + 1024).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
    let answer = unfinished_head(addr, 400 * 1000)
        .await
        .expect("the gateway closes the connection");
    assert!(refused_as_too_large(&answer), "{answer:?}");
    // A connection with a finished, small head gets the sign-in's 407.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(
        b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let answer = until_closed(&mut c).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 407 "), "{answer:?}");
    let _ = tx.send(());
    served.await.unwrap().unwrap();
}
