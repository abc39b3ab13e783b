//! `make bench-gateway`: the gateway's three goals (issue 36), each beside
//! the same work done straight through the upstream Squid in the same run:
//!
//! 1. one large download (BENCH_DOWNLOAD_MIB, default 1024) through a
//!    CONNECT tunnel: throughput through the gateway ÷ straight through
//!    Squid (goal ≥ 90%), best of three each, alternating;
//! 2. CONNECT setup at BENCH_RATE new connections a second (default 500)
//!    for BENCH_SECS seconds (default 10), open loop: p99 through the
//!    gateway − p99 straight through Squid (goal ≤ 1 ms);
//! 3. BENCH_TUNNELS idle tunnels open at once (default 9,900: a process
//!    may hold 20,000 descriptors here and a tunnel takes two in the
//!    gateway): the gateway process's RSS (goal ≤ 64 MiB at 10,000).
//!
//! BENCH_FLEET=N (default 0: the two Squids alone) gives the gateway the
//! operator's own fleet source instead: a discovery listing of N Ready
//! Proxies spread over the two Squids, steady (the listing rebuilt only
//! every 5 s), or with BENCH_FLEET_CHURN=1 changing all the time (rebuilt
//! every 250 ms). BENCH_USER sets the username (default `default`; e.g.
//! `default-label-tier=gold` to filter).
//!
//! The gateway runs in a process of its own (this binary again, its
//! `gateway_server` role), from the library as the operator runs it, with
//! a fixed fleet of two real Squids on 127.0.0.1; the targets run in
//! another process of their own (`targets` role), so the gateway's RSS
//! is its own. Every process stops by itself. Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is its failure report

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies_operator::discovery::Filter;
use egress_proxies_operator::gateway::{self, Candidates, Fleet, Gateway, Upstream};
use egress_proxies_operator::lease::ProxyKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "support/squid.rs"]
#[allow(dead_code)] // the other tests' helpers
mod squid;

const TOKEN: &str = "bench-token";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fixed fleet: the Squids on the ports of `BENCH_GW_UPSTREAMS`.
struct Fixed(Vec<Upstream>);

impl Fleet for Fixed {
    fn client_of(&self, token: &str) -> Option<Arc<str>> {
        (token == TOKEN).then(|| Arc::from("default"))
    }
    fn upstreams(&self, _: &Filter) -> Candidates {
        Candidates::of(self.0.clone())
    }
    fn shared(&self, _: &str, _: &ProxyKey, _: Option<&str>) -> bool {
        true
    }
    fn cool_down(&self, _: &Arc<str>, _: &ProxyKey, _: Option<&str>) {}
}

/// The gateway's process: serves on `BENCH_GW_ADDR` for `BENCH_GW_SECS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn gateway_server() {
    let Ok(addr) = std::env::var("BENCH_GW_ADDR") else {
        return; // run by the bench below only
    };
    let upstreams = std::env::var("BENCH_GW_UPSTREAMS").unwrap();
    let fleet: Vec<Upstream> = upstreams
        .split(',')
        .enumerate()
        .map(|(i, port)| {
            let key = ProxyKey {
                namespace: "bench".into(),
                name: format!("squid-{i}"),
            };
            Upstream {
                hash: (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                key,
                host: "127.0.0.1".into(),
                port: port.parse().unwrap(),
                authorization: None,
                pin: Default::default(),
            }
        })
        .collect();
    let settings = gateway::Settings {
        max_connections: 30_000,
        // Every benchmark connection comes from 127.0.0.1: held only to
        // half the total.
        max_per_address: 0,
        max_per_client: 30_000,
        max_per_upstream: 30_000,
        ..gateway::Settings::default()
    };
    let mut registry = egress_proxies_operator::metrics::Registrar::new();
    let metrics = gateway::metrics::GatewayMetrics::register(&mut registry);
    let size = env_u64("BENCH_FLEET", 0);
    let secs = env_u64("BENCH_GW_SECS", 600);
    let fleet: Arc<dyn Fleet> = if size == 0 {
        Arc::new(Fixed(fleet))
    } else {
        // The operator's own fleet: a discovery listing of `size` Ready
        // Proxies (each on one of the Squids), made into upstreams, kept
        // fresh off the connections' path as the operator keeps them (the
        // listing's refresher, the upstreams' warmer). A steady fleet, as
        // the Proxy store reports one (its version unmoved); with
        // BENCH_FLEET_CHURN=1 one whose Proxies change all the time (no
        // version: the listing is rebuilt at its every age, 250 ms).
        let ports: Vec<u16> = fleet.iter().map(|u| u.port).collect();
        let state = listing(size, &ports);
        let api_fleet = Arc::new(gateway::ApiFleet::new(state.gateway_parts()));
        let stop = || tokio::time::sleep(Duration::from_secs(secs));
        tokio::spawn(state.refresh_listing(stop()));
        tokio::spawn(gateway::warm_upstreams(api_fleet.clone(), stop()));
        api_fleet
    };
    let gw = Arc::new(Gateway::new(fleet, settings, metrics));
    let listener = TcpListener::bind(&addr).await.unwrap();
    gateway::serve(listener, gw, tokio::time::sleep(Duration::from_secs(secs)))
        .await
        .unwrap();
}

/// The bench's Proxies: steady (one version) or churning (none).
struct Source {
    proxies: Vec<Arc<egress_proxies_operator::api::Proxy>>,
    churn: bool,
}

impl egress_proxies_operator::discovery::ProxySource for Source {
    fn proxies(&self) -> Vec<Arc<egress_proxies_operator::api::Proxy>> {
        self.proxies.clone()
    }

    fn version(&self) -> Option<u64> {
        (!self.churn).then_some(1)
    }
}

/// A discovery API state listing `size` Ready, Healthy Proxies spread
/// over the Squids on `ports`, the client `default` signing in with the
/// bench's token.
fn listing(size: u64, ports: &[u16]) -> egress_proxies_operator::discovery::ApiState {
    use egress_proxies_operator::api::Proxy;
    use egress_proxies_operator::lease::{LeaseConfig, LeaseStore};
    let proxies: Vec<Arc<Proxy>> = (0..size)
        .map(|i| {
            let port = ports[(i as usize) % ports.len()];
            Arc::new(
                serde_json::from_value(serde_json::json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                    "metadata": {"name": format!("p{i}"), "namespace": "bench", "labels": {"tier": "gold"}},
                    "spec": {"provider": "kubernetes", "port": port},
                    "status": {"phase": "Ready", "ip": "127.0.0.1",
                        "conditions": [{"type": "Healthy", "status": "True", "reason": "ProbeSucceeded",
                        "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}))
                .unwrap(),
            )
        })
        .collect();
    let leases = Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    }));
    let mut registry = egress_proxies_operator::metrics::Registrar::new();
    let metrics =
        egress_proxies_operator::discovery::metrics::DiscoveryMetrics::register(&mut registry);
    let churn = std::env::var("BENCH_FLEET_CHURN").is_ok_and(|v| v == "1");
    egress_proxies_operator::discovery::ApiState::new(
        Arc::new(Source { proxies, churn }),
        leases,
        Some(TOKEN),
        &metrics,
    )
}

/// The targets' process: on `BENCH_TARGET_BULK` every connection gets
/// `BENCH_DOWNLOAD_MIB` MiB then an end; on `BENCH_TARGET_IDLE` a
/// connection is held until its client ends it. Stops after
/// `BENCH_GW_SECS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore]
async fn targets() {
    let Ok(bulk) = std::env::var("BENCH_TARGET_BULK") else {
        return;
    };
    let idle = std::env::var("BENCH_TARGET_IDLE").unwrap();
    let mib = env_u64("BENCH_DOWNLOAD_MIB", 1024);
    let bulk = TcpListener::bind(&bulk).await.unwrap();
    let idle = TcpListener::bind(&idle).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = bulk.accept().await {
            tokio::spawn(async move {
                let chunk = vec![7u8; 256 * 1024];
                for _ in 0..mib * 4 {
                    if c.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                let _ = c.shutdown().await;
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((mut c, _)) = idle.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    tokio::time::sleep(Duration::from_secs(env_u64("BENCH_GW_SECS", 600))).await;
}

/// This binary again in `role`, with `envs`; killed when dropped.
struct Role(Child);

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn role(name: &str, envs: &[(&str, String)]) -> Role {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        name,
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Role(cmd.spawn().unwrap())
}

async fn listening(addr: SocketAddr) {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing listens on {addr}");
}

/// A tunnel to `target` through the proxy at `via` (signed in when
/// `auth`), and how many bytes of the target's came with the answer.
async fn tunnel(
    via: SocketAddr,
    target: SocketAddr,
    auth: bool,
) -> std::io::Result<(TcpStream, usize)> {
    let mut c = TcpStream::connect(via).await?;
    c.set_nodelay(true)?;
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if auth {
        let user = std::env::var("BENCH_USER").unwrap_or_else(|_| "default".into());
        let basic = data_encoding::BASE64.encode(format!("{user}:{TOKEN}").as_bytes());
        head.push_str(&format!("Proxy-Authorization: Basic {basic}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes()).await?;
    let mut got = Vec::new();
    let mut b = [0u8; 512];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.read(&mut b).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&b[..n]);
    }
    if !got.starts_with(b"HTTP/1.1 200") && !got.starts_with(b"HTTP/1.0 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&got).into_owned(),
        ));
    }
    let head = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
    Ok((c, got.len() - head))
}

/// Seconds to download everything `target` sends through `via`.
async fn download(via: SocketAddr, target: SocketAddr, auth: bool) -> (u64, Duration) {
    let started = Instant::now();
    let (mut c, early) = tunnel(via, target, auth).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = early as u64;
    loop {
        let n = c.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    (total, started.elapsed())
}

/// CONNECT setup latencies at `rate` a second for `secs`, open loop.
async fn setups(
    via: SocketAddr,
    target: SocketAddr,
    auth: bool,
    rate: u64,
    secs: u64,
) -> Vec<Duration> {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..rate * secs {
        tick.tick().await;
        tasks.spawn(async move {
            let started = Instant::now();
            let c = tunnel(via, target, auth).await;
            let took = started.elapsed();
            c.expect("a CONNECT within the bench's load");
            took
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.unwrap());
    }
    out.sort();
    out
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_gateway() {
    if std::env::var("BENCH_GW_ADDR").is_ok() || std::env::var("BENCH_TARGET_BULK").is_ok() {
        return; // a role process
    }
    let mib = env_u64("BENCH_DOWNLOAD_MIB", 1024);
    let rate = env_u64("BENCH_RATE", 500);
    let secs = env_u64("BENCH_SECS", 10);
    let tunnels = env_u64("BENCH_TUNNELS", 9_900);
    let life = (secs * 4 + 300).to_string();
    squid::require();
    let (s1, s2) = (free_port(), free_port());
    let lo = std::net::Ipv4Addr::LOCALHOST;
    let _squids = (
        squid::start(lo, s1, "bga", "http_access allow me").await,
        squid::start(lo, s2, "bgb", "http_access allow me").await,
    );
    let (bulk, idle, gw): (SocketAddr, SocketAddr, SocketAddr) = (
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
    );
    let _targets = role(
        "targets",
        &[
            ("BENCH_TARGET_BULK", bulk.to_string()),
            ("BENCH_TARGET_IDLE", idle.to_string()),
            ("BENCH_DOWNLOAD_MIB", mib.to_string()),
            ("BENCH_GW_SECS", life.clone()),
        ],
    );
    let server = role(
        "gateway_server",
        &[
            ("BENCH_GW_ADDR", gw.to_string()),
            ("BENCH_GW_UPSTREAMS", format!("{s1},{s2}")),
            ("BENCH_FLEET", env_u64("BENCH_FLEET", 0).to_string()),
            ("BENCH_GW_SECS", life),
        ],
    );
    let squid1: SocketAddr = format!("127.0.0.1:{s1}").parse().unwrap();
    for a in [
        squid1,
        format!("127.0.0.1:{s2}").parse().unwrap(),
        bulk,
        idle,
        gw,
    ] {
        listening(a).await;
    }
    let (rss0, _) = rss_kib(server.0.id());
    println!("gateway bench: gateway process started, RSS {} KiB", rss0);

    // 1. One large download, alternating, best of three.
    let (mut direct, mut through) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        let (n, d) = download(squid1, bulk, false).await;
        assert_eq!(n, mib << 20);
        direct = direct.min(d);
        let (n, g) = download(gw, bulk, true).await;
        assert_eq!(n, mib << 20);
        through = through.min(g);
    }
    let mbps = |d: Duration| (mib as f64) / d.as_secs_f64();
    println!(
        "1. download {mib} MiB: straight through Squid {:.0} MiB/s, through the gateway {:.0} MiB/s: {:.1}% (goal >= 90%)",
        mbps(direct),
        mbps(through),
        100.0 * direct.as_secs_f64() / through.as_secs_f64()
    );

    // 2. CONNECT setup at `rate`/s: direct, gateway, direct again.
    let d1 = setups(squid1, idle, false, rate, secs).await;
    let g = setups(gw, idle, true, rate, secs).await;
    let d2 = setups(squid1, idle, false, rate, secs).await;
    let p = |v: &[Duration], q| quantile(v, q).as_secs_f64() * 1000.0;
    let direct99 = (p(&d1, 0.99) + p(&d2, 0.99)) / 2.0;
    println!(
        "2. CONNECT setup at {rate}/s for {secs} s ({} each): straight through Squid p50 {:.2} ms p99 {:.2} ms (runs before and after: {:.2}, {:.2}); through the gateway p50 {:.2} ms p99 {:.2} ms; added p99 {:.2} ms (goal <= 1 ms)",
        g.len(),
        (p(&d1, 0.5) + p(&d2, 0.5)) / 2.0,
        direct99,
        p(&d1, 0.99),
        p(&d2, 0.99),
        p(&g, 0.5),
        p(&g, 0.99),
        p(&g, 0.99) - direct99
    );

    // 3. Idle tunnels held open at once.
    let (rss_before, _) = rss_kib(server.0.id());
    let mut open = Vec::with_capacity(tunnels as usize);
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..tunnels {
        pending.spawn(async move { tunnel(gw, idle, true).await });
        if pending.len() >= 200 || i + 1 == tunnels {
            while let Some(r) = pending.join_next().await {
                open.push(r.unwrap().unwrap().0);
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, hwm) = rss_kib(server.0.id());
    let per = (rss.saturating_sub(rss_before) as f64) / tunnels as f64;
    println!(
        "3. {} idle tunnels open: gateway RSS {:.1} MiB (peak {:.1} MiB; {:.1} MiB before them, {:.2} KiB per tunnel; at 10,000: {:.1} MiB) (goal <= 64 MiB at 10,000)",
        open.len(),
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        rss_before as f64 / 1024.0,
        per,
        (rss_before as f64 + per * 10_000.0) / 1024.0
    );
    drop(open);
}
