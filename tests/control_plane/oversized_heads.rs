//! Oversized request heads (issue "The crawler-facing edge holds"): the
//! real operator binary, its discovery API and gateway on loopback, runs
//! in a memory cgroup with the shipped manager Pod's limit. 300
//! connections to the API and 300 to the gateway each send 400 KB of one
//! header line and never end it: each is answered 431 or closed, and the
//! operator's RSS grows by at most 32 MiB. Then 2,000 such connections to
//! each, from 127.0.0.2 upwards (past the per-address and total caps): the
//! operator survives (no OOM kill, it still answers). Prints the figures of
//! docs/reliability.md's "Oversized request heads" row.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../scale_bench/cgroup.rs"]
#[allow(dead_code)] // shared with bench_scale, which reads more of it
mod cgroup;

use crate::support::{self, eventually, Operator};

const TOKEN: &str = "heads-token-of-the-tests";
/// Bytes of the one header line each attacker sends.
const HEADER: usize = 400 * 1000;
const MIB: u64 = 1024 * 1024;

/// How one attacking connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    TooLarge,
    Closed,
    /// Anything else: an answer the attack must never get.
    Other,
}

/// Connects (from `from`), sends a request line and [`HEADER`] bytes of
/// one header line never ended, then reads until the server closes.
async fn attack(to: SocketAddr, from: Ipv4Addr, gateway: bool, pad: Arc<Vec<u8>>) -> Ended {
    let Ok(sock) = tokio::net::TcpSocket::new_v4() else {
        return Ended::Other;
    };
    sock.bind((from, 0).into()).unwrap();
    // A refused connection (over a cap) is closed: that is an answer too.
    let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_secs(30), sock.connect(to)).await
    else {
        return Ended::Closed;
    };
    let line = match gateway {
        true => "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-Pad: ",
        false => "GET /v1/proxies HTTP/1.1\r\nHost: api\r\nX-Pad: ",
    };
    let mut sent = c.write_all(line.as_bytes()).await.is_ok();
    let mut left = HEADER;
    while sent && left > 0 {
        let n = left.min(pad.len());
        sent = c.write_all(&pad[..n]).await.is_ok();
        left -= n;
    }
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut got)).await;
    match read {
        // Reset while still sending: the 431 may be lost to it.
        Ok(Ok(_)) | Ok(Err(_)) if got.is_empty() => Ended::Closed,
        Ok(_) if got.starts_with(b"HTTP/1.1 431 ") => Ended::TooLarge,
        _ => Ended::Other,
    }
}

/// `n` attacks on each of `api` and `gw` at once, from 127.0.0.`first`
/// upwards, `per_address` from each; (431, closed, other) per server.
async fn wave(
    (api, gw): (SocketAddr, SocketAddr),
    n: usize,
    first: u8,
    per_address: usize,
) -> [(usize, usize, usize); 2] {
    let pad = Arc::new(vec![b'a'; 16 * 1024]);
    let mut tasks = Vec::new();
    for i in 0..2 * n {
        let gateway = i % 2 == 1;
        let from = Ipv4Addr::new(
            127,
            0,
            0,
            first + u8::try_from(i / 2 / per_address).unwrap(),
        );
        let to = if gateway { gw } else { api };
        tasks.push((
            gateway,
            tokio::spawn(attack(to, from, gateway, pad.clone())),
        ));
    }
    let mut out = [(0, 0, 0); 2];
    for (gateway, t) in tasks {
        let o = &mut out[usize::from(gateway)];
        match t.await.unwrap() {
            Ended::TooLarge => o.0 += 1,
            Ended::Closed => o.1 += 1,
            Ended::Other => o.2 += 1,
        }
    }
    out
}

pub(crate) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The manager container's `resources.limits.memory` in
/// config/manager/manager.yaml, in bytes.
fn shipped_manager_limit() -> u64 {
    let text = support::repo_file("config/manager/manager.yaml");
    let limits = &text[text.find("limits:").unwrap()..];
    let mi: u64 = limits
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory:"))
        .and_then(|v| v.trim().strip_suffix("Mi"))
        .unwrap()
        .parse()
        .unwrap();
    mi * MIB
}

/// Samples `pid`'s RSS every 20 ms while `on`; the highest, in KiB.
fn sample_rss(pid: u32, on: Arc<AtomicBool>) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let peak = Arc::new(AtomicU64::new(0));
    let p = peak.clone();
    let task = tokio::spawn(async move {
        while on.load(Ordering::SeqCst) {
            p.fetch_max(status_kib(pid, "VmRSS:"), Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (peak, task)
}

async fn answers(api: SocketAddr) -> bool {
    support::raw_call(api, None, ("GET", "/v1/proxies"), Some(TOKEN), "")
        .await
        .is_some_and(|(s, _)| s == 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_are_refused_431_and_the_manager_survives_in_its_pod_limit() {
    let ground = support::ground_without_pods("heads").await;
    let dir = tempfile::tempdir().unwrap();
    let groups = cgroup::Groups::create()
        .unwrap_or_else(|e| panic!("the operator must run in a memory cgroup of its own: {e}"));
    let limit = shipped_manager_limit();
    // No CPU limit in the shipped Pod: two cores' quota is none here.
    groups.limit(2.0, limit).unwrap();
    let (api, gw) = (support::loopback(), support::loopback());
    let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
    cmd.args(["--gateway-bind-address", &gw.to_string()]);
    let op = Operator::spawn(groups.wrap(&cmd), &dir.path().join("operator.log"));
    let pid = op.pid();
    eventually("the API to answer", Duration::from_secs(60), || async {
        answers(api).await.then_some(())
    })
    .await;
    eventually(
        "the gateway to ask for a sign-in",
        Duration::from_secs(30),
        || async {
            let mut c = tokio::net::TcpStream::connect(gw).await.ok()?;
            c.write_all(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")
                .await
                .ok()?;
            support::read_head(&mut c)
                .await
                .starts_with("HTTP/1.1 407 ")
                .then_some(())
        },
    )
    .await;

    let before = status_kib(pid, "VmRSS:");
    let on = Arc::new(AtomicBool::new(true));
    let (peak, sampler) = sample_rss(pid, on.clone());
    let [api_300, gw_300] = wave((api, gw), 300, 1, 300).await;
    on.store(false, Ordering::SeqCst);
    sampler.await.unwrap();
    let peak = peak.load(Ordering::SeqCst);
    let after = status_kib(pid, "VmRSS:");
    println!(
        "300 + 300 heads of {HEADER} bytes: API 431 {} / closed {} / other {}; gateway 431 {} / closed {} / other {}; RSS {before} KiB before, peak {peak} KiB (+{} KiB), {after} KiB after",
        api_300.0, api_300.1, api_300.2, gw_300.0, gw_300.1, gw_300.2, peak.saturating_sub(before)
    );
    assert_eq!(
        (api_300.2, gw_300.2),
        (0, 0),
        "each is answered 431 or closed"
    );
    assert!(
        peak.saturating_sub(before) <= 32 * 1024,
        "RSS grew by {} KiB, over 32 MiB",
        peak.saturating_sub(before)
    );

    // 2,000 to each: 250 from each address, 127.0.0.2 upwards.
    let [api_2k, gw_2k] = wave((api, gw), 2000, 2, 250).await;
    let stats = groups.stats();
    let alive = op_alive(pid);
    println!(
        "2,000 + 2,000 heads in {} MiB: API 431 {} / closed {} / other {}; gateway 431 {} / closed {} / other {}; cgroup peak {:.1} MiB, limit hits {}, OOM kills {}; RSS {} KiB after",
        limit / MIB,
        api_2k.0, api_2k.1, api_2k.2, gw_2k.0, gw_2k.1, gw_2k.2,
        stats.memory_peak_mib, stats.memory_failcnt, stats.oom_kills, status_kib(pid, "VmRSS:")
    );
    assert!(
        alive,
        "the operator died: {}",
        std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default()
    );
    assert_eq!(stats.oom_kills, 0, "OOM kills in the Pod's limit");
    assert_eq!(
        (api_2k.2, gw_2k.2),
        (0, 0),
        "each is answered 431 or closed"
    );
    eventually(
        "the API to answer after",
        Duration::from_secs(30),
        || async { answers(api).await.then_some(()) },
    )
    .await;
    drop(op);
}

/// Whether `pid` still runs (not a zombie).
fn op_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}
