//! `make bench-scale`, second part: the shipped topology. The operator as
//! the manifests and the chart deploy it, two manager replicas (one
//! leads, one follows in sync: every grant waits for it) and two gateway
//! processes keeping copies of the lease table, all on the real test API
//! server, with BENCH_N External Proxies (default 10,000) on the probe
//! targets of `scale_bench::responder` and BENCH_LEASES held leases
//! (default 100,000).
//!
//! Two columns from one run, the same loads on the same leader:
//!
//! - **shipped**, first: the follower and both gateways join and copy the
//!   table, and the loads run;
//! - **one process**, second: they stop and the leader alone runs the same
//!   loads, the figures every earlier benchmark gave.
//!
//! Between the two, a member away: the follower is stopped (SIGSTOP) for
//! BENCH_ABSENCE seconds (default 60) while the open loop runs, then
//! resumed; the time until it is named in sync again and whether the
//! leader had to send it a whole table (or the change log covered it).
//! Last, a new follower joins the leader holding the leases (a whole
//! table).
//!
//! Each column: each process's RSS and CPU while probing; the leases
//! filled; then, probes held, acquire+release closed loop on 64
//! connections against the leader's real and bare route (`/bench`, the
//! same process's lease-shaped route with no store), open loop at
//! BENCH_RATE pairs a second (default 2,000) timed from when each pair was
//! due; in the shipped column also the closed loop through the follower
//! (forwarded, as half of a Service's calls are) and the copies' lag from
//! their own histograms (`proxy_operator_lease_copy_lag_seconds`,
//! `..._behind_changes`). Last, each process's peak RSS (VmHWM).
//!
//! BENCH_HEAPTRACK_A=<fifo> (or _B, _C) starts that manager under
//! heaptrack's preload library writing to the named pipe, for
//! `heaptrack_interpret < fifo | zstd > a.zst` to read: the live heap by
//! call site at the peak (docs/performance.md, "The allocator").
//!
//! Prints one table, and with BENCH_WRITE_DOCS=1 writes it into
//! docs/performance.md. Asserts nothing about speed: it fails only if the
//! run itself breaks. Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is its failure report

mod lease_load;
mod scale_bench;
mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ListParams, PostParams};
use scale_bench::responder::Responder;
use scale_bench::{env_or, status_mib, write_docs};
use serde_json::json;
use support::{eventually, Ground, Operator};

const TOKEN: &str = "bench-topology-token";
const LEASE: &str = "egress-proxies-operator.crawl.example.com";

/// The closed loops' leases: 10 s, so that one client releasing some
/// 10,000 a second keeps about 100,000 released ids beside the 100,000
/// held, well under the table's 400,000 (`lease::MAX_LEASE_IDS`). With
/// 60 s leases such a loop fills the table within 30 s and is answered
/// `table_full`, which measures the cap, not the lease path. The open
/// loop keeps 60 s leases (120,000 released ids at 2,000 a second).
const CLOSED_TTL: &[u8] = b"{\"ttlSeconds\":10}";

/// The role this binary plays when started again (the probe targets).
#[test]
#[ignore = "a role of make bench-scale, started by it"]
fn bench_role() {
    let var = |k: &str| std::env::var(k).unwrap();
    match std::env::var("BENCH_ROLE").as_deref() {
        Ok("responder") => scale_bench::responder::run(
            var("BENCH_RESPONDER_IP").parse().unwrap(),
            var("BENCH_RESPONDER_N").parse().unwrap(),
        ),
        other => panic!("BENCH_ROLE={other:?}: this binary plays responder only"),
    }
}

/// One process of the topology.
struct Member {
    name: &'static str,
    op: Operator,
    metrics: SocketAddr,
}

impl Member {
    fn pid(&self) -> u32 {
        self.op.pid()
    }

    fn cpu(&self) -> f64 {
        scale_bench::cpu_secs(&format!("/proc/{}/stat", self.pid()))
    }

    async fn scrape(&self) -> String {
        let (status, body) = support::api_call(self.metrics, "GET", "/metrics", None, vec![]).await;
        assert_eq!(status, 200, "{} /metrics", self.name);
        body.as_str().map(str::to_string).unwrap_or_default()
    }
}

/// A manager replica `name` with leader election, its discovery API on
/// `api` (advertised there) and `/metrics` on `metrics`.
fn manager(
    ground: &Ground,
    dir: &Path,
    name: &'static str,
    (api, metrics): (SocketAddr, SocketAddr),
    (per_proxy, target): (usize, SocketAddr),
) -> Member {
    let mut cmd = ground.discovery_operator(dir, "providers: []\n", api, TOKEN);
    cmd.args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--discovery-advertise-url", &format!("http://{api}")])
        .args(["--max-leases-per-proxy", &per_proxy.to_string()])
        .args(["--max-lease-ttl", "2h", "--bench-routes", "--leader-elect"])
        .args(["--default-probe-url", &format!("http://{target}/")])
        // Long enough that a loaded machine never fails the leader over:
        // the benchmark measures a topology at rest, not an election.
        .args(["--leader-election-lease-duration", "15s"])
        .args(["--leader-election-renew-deadline", "10s"])
        .args(["--leader-election-retry-period", "500ms"])
        .env("POD_NAME", name);
    // heaptrack's preload library, when asked (the module's header).
    if let Ok(fifo) = std::env::var(format!("BENCH_HEAPTRACK_{}", name.to_uppercase())) {
        cmd.env("LD_PRELOAD", "/usr/lib/heaptrack/libheaptrack_preload.so")
            .env("DUMP_HEAPTRACK_OUTPUT", fifo);
    }
    let op = Operator::spawn(cmd, &dir.join(format!("{name}.log")));
    Member { name, op, metrics }
}

/// `egress-proxies-operator gateway` named `name`, as the gateway
/// Deployment runs it: an observer of the leader's table.
fn gateway(ground: &Ground, dir: &Path, name: &'static str, per_proxy: usize) -> Member {
    let metrics = support::loopback();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
    cmd.arg("gateway")
        .args(["--health-probe-bind-address", "0", "--metrics-secure=false"])
        .args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--probe-deny-cidrs", &support::deny_but_loopback()])
        .args(["--discovery-bind-address", &support::loopback().to_string()])
        .args(["--gateway-bind-address", &support::loopback().to_string()])
        .args(["--proxy-namespace", &ground.ns])
        .args(["--operator-namespace", &ground.ns])
        .args(["--leader-election-lease-duration", "15s"])
        .args(["--leader-election-renew-deadline", "10s"])
        .args(["--leader-election-retry-period", "500ms"])
        .args(["--max-leases-per-proxy", &per_proxy.to_string()])
        .env("KUBECONFIG", ground.cluster.kubeconfig())
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", &ground.ns)
        .env("TMPDIR", dir)
        .env_remove("KUBERNETES_SERVICE_HOST");
    let op = Operator::spawn(cmd, &dir.join(format!("{name}.log")));
    Member { name, op, metrics }
}

/// CPU of each member over one window, in cores.
struct Window(Instant, Vec<f64>);

impl Window {
    fn start(members: &[&Member]) -> Window {
        Window(Instant::now(), members.iter().map(|m| m.cpu()).collect())
    }

    fn end(&self, members: &[&Member]) -> Vec<f64> {
        let secs = self.0.elapsed().as_secs_f64().max(1e-9);
        members
            .iter()
            .zip(&self.1)
            .map(|(m, c0)| (m.cpu() - c0) / secs)
            .collect()
    }
}

/// A histogram's buckets (`le`, cumulative count) in a Prometheus text.
fn buckets(text: &str, family: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{family}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix.as_str())?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of what a histogram counted between two scrapes, as
/// the upper bound of its bucket; and how many it counted.
fn quantile(before: &str, after: &str, family: &str, q: f64) -> (f64, f64) {
    let (b0, b1) = (buckets(before, family), buckets(after, family));
    let deltas: Vec<(f64, f64)> = b1
        .iter()
        .map(|&(le, c)| {
            let c0 = b0.iter().find(|(l, _)| *l == le).map_or(0.0, |p| p.1);
            (le, c - c0)
        })
        .collect();
    let total = deltas.last().map_or(0.0, |p| p.1);
    let at = deltas
        .iter()
        .find(|(_, c)| *c >= q * total && total > 0.0)
        .map_or(f64::NAN, |p| p.0);
    (at, total)
}

/// How far the copies ran behind during one load.
#[derive(Default, Clone)]
struct Lag {
    /// Per copy: (name, deltas, p50 ms, p99 ms, p99 changes).
    copies: Vec<(&'static str, f64, f64, f64, f64)>,
}

async fn lag_between(copies: &[&Member], before: &[String]) -> Lag {
    let mut lag = Lag::default();
    for (m, b) in copies.iter().zip(before) {
        let a = m.scrape().await;
        let family = "proxy_operator_lease_copy_lag_seconds";
        let (p50, n) = quantile(b, &a, family, 0.5);
        let (p99, _) = quantile(b, &a, family, 0.99);
        let (behind, _) = quantile(b, &a, "proxy_operator_lease_copy_behind_changes", 0.99);
        lag.copies
            .push((m.name, n, p50 * 1000.0, p99 * 1000.0, behind));
    }
    lag
}

/// One column's loads.
struct Loads {
    real: lease_load::Figures,
    bare: lease_load::Figures,
    open: lease_load::Figures,
    open_cpu: Vec<f64>,
    open_lag: Lag,
    forwarded: Option<lease_load::Figures>,
}

async fn loads(
    api: SocketAddr,
    follower_api: Option<SocketAddr>,
    members: &[&Member],
    (secs, rate): (u64, f64),
) -> Loads {
    let run = Duration::from_secs(secs);
    let copies: Vec<&Member> = members.iter().skip(1).copied().collect();
    let real = lease_load::load_with(api, TOKEN, run, ("/v1", CLOSED_TTL)).await;
    let bare = lease_load::load_with(api, TOKEN, run, ("/bench", CLOSED_TTL)).await;
    let mut before = Vec::new();
    for m in &copies {
        before.push(m.scrape().await);
    }
    let window = Window::start(members);
    let open = lease_load::open_loop(api, TOKEN, rate, run, "/v1").await;
    let open_cpu = window.end(members);
    let open_lag = lag_between(&copies, &before).await;
    let forwarded = match follower_api {
        Some(f) => Some(lease_load::load_with(f, TOKEN, run, ("/v1", CLOSED_TTL)).await),
        None => None,
    };
    Loads {
        real,
        bare,
        open,
        open_cpu,
        open_lag,
        forwarded,
    }
}

/// One column: the processes probing, then the loads.
struct Column {
    names: Vec<&'static str>,
    probing_rss: Vec<f64>,
    probing_cpu: Vec<f64>,
    loads: Loads,
    peak: Vec<f64>,
}

async fn column(
    members: &[&Member],
    (api, follower_api): (SocketAddr, Option<SocketAddr>),
    (secs, rate): (u64, f64),
) -> Column {
    let window = Window::start(members);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let probing_cpu = window.end(members);
    let probing_rss = members
        .iter()
        .map(|m| status_mib(m.pid(), "VmRSS:"))
        .collect();
    switch_probes(api, true).await;
    let loads = loads(api, follower_api, members, (secs, rate)).await;
    switch_probes(api, false).await;
    Column {
        names: members.iter().map(|m| m.name).collect(),
        probing_rss,
        probing_cpu,
        loads,
        peak: members
            .iter()
            .map(|m| status_mib(m.pid(), "VmHWM:"))
            .collect(),
    }
}

async fn switch_probes(api: SocketAddr, paused: bool) {
    let body = serde_json::to_vec(&json!({ "paused": paused })).unwrap();
    let (status, answer) = support::api_call(api, "PUT", "/bench/probes", Some(TOKEN), body).await;
    assert_eq!(status, 204, "PUT /bench/probes: {answer}");
}

/// The election Lease's annotation naming the followers in sync.
async fn in_sync(ground: &Ground) -> String {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = ground.api();
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.metadata.annotations)
        .and_then(|a| a.get("crawl.example.com/lease-synced-replicas").cloned())
        .unwrap_or_default()
}

/// Waits until the follower whose identity starts with `follower` is
/// named in sync and every gateway of `gateways` holds a copy.
async fn joined(ground: &Ground, follower: &str, gateways: &[&Member]) {
    eventually(
        "the follower named in sync",
        Duration::from_secs(120),
        || async { in_sync(ground).await.contains(follower).then_some(()) },
    )
    .await;
    for g in gateways {
        eventually(
            "a gateway's copy of the table",
            Duration::from_secs(120),
            || async {
                let text = g.scrape().await;
                let age = support::sample(&text, "proxy_operator_lease_copy_age_seconds")?;
                (age >= 0.0).then_some(())
            },
        )
        .await;
    }
}

/// A follower away for a while during the open loop, and back.
struct Absence {
    away: Duration,
    /// The open loop at the leader while the follower was stopped.
    open: lease_load::Figures,
    /// Whether the leader stopped naming it in sync while it was away.
    dropped: bool,
    /// From its resume to being named in sync again.
    back_in: Duration,
    /// Whole tables the leader sent while it was away and coming back.
    wholes: f64,
    /// The changes its largest delta carried (a bucket bound).
    behind: f64,
}

/// Whole-table answers the leader has sent (`..._feed_answers_total`).
fn wholes(text: &str) -> f64 {
    support::sample(
        text,
        "proxy_operator_lease_feed_answers_total{kind=\"whole\"}",
    )
    .unwrap_or(0.0)
}

fn signal(m: &Member, sig: &str) {
    let done = Command::new("kill")
        .args([sig, &m.pid().to_string()])
        .status()
        .unwrap();
    assert!(done.success(), "kill {sig} {}", m.name);
}

/// Stops the follower `b` (SIGSTOP: a frozen node, a partition) for
/// `away` while the open loop runs at the leader `a`, resumes it, and
/// times its way back into sync.
async fn absence(
    ground: &Ground,
    (a, api, b): (&Member, SocketAddr, &Member),
    away: Duration,
    rate: f64,
) -> Absence {
    let (leader_before, b_before) = (a.scrape().await, b.scrape().await);
    signal(b, "-STOP");
    let open = lease_load::open_loop(api, TOKEN, rate, away, "/v1").await;
    let dropped = !in_sync(ground).await.contains("b_");
    let resumed = Instant::now();
    signal(b, "-CONT");
    joined(ground, "b_", &[]).await;
    let back_in = resumed.elapsed();
    let (leader_after, b_after) = (a.scrape().await, b.scrape().await);
    let family = "proxy_operator_lease_copy_behind_changes";
    Absence {
        away,
        open,
        dropped,
        back_in,
        wholes: wholes(&leader_after) - wholes(&leader_before),
        behind: quantile(&b_before, &b_after, family, 1.0).0,
    }
}

/// The Lease's holder.
async fn holder(ground: &Ground) -> Option<String> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = ground.api();
    leases.get_opt(LEASE).await.ok()??.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with make bench-scale"]
async fn bench_topology() {
    let n = env_or("BENCH_TOPOLOGY_N", 10_000).clamp(1, 100_000) as usize;
    let leases = env_or("BENCH_LEASES", 100_000) as usize;
    let secs = env_or("BENCH_PHASE", 30).clamp(3, 600);
    let rate = env_or("BENCH_RATE", 2000).clamp(1, 100_000) as f64;
    let per_proxy = (leases + 2 * lease_load::OPEN_CONNECTIONS).div_ceil(n) + 1;
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());

    let ground = support::ground_without_pods("topo").await;
    let responder = Responder::spawn(
        std::net::IpAddr::from([127, 0, 0, 1]),
        n,
        (cores >= 2).then(|| cores - 1),
    );
    let target = responder.addr;
    let dir = tempfile::tempdir().unwrap();
    let api_a = support::loopback();
    let a = manager(
        &ground,
        dir.path(),
        "a",
        (api_a, support::loopback()),
        (per_proxy, target),
    );
    eventually("a to lead", Duration::from_secs(60), || async {
        holder(&ground).await.filter(|h| h.starts_with("a_"))
    })
    .await;

    // The fleet, Ready and listed by the leader.
    let proxies = ground.proxies();
    let applied = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let proxies = proxies.clone();
            async move {
                let name = format!("s{i}");
                let spec = json!({
                    "mode": "External",
                    "endpoint": {"host": target.ip().to_string(), "port": target.port()},
                    "healthCheck": {"url": format!("http://{target}/p/{name}"), "expectedStatus": 200},
                });
                proxies
                    .create(&PostParams::default(), &support::proxy(&name, spec))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    eventually(
        "the leader to list every Proxy",
        Duration::from_secs(60 + n as u64 / 20),
        || async {
            let (s, v) = support::api_call(api_a, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
            (s == 200 && v["items"].as_array().map_or(0, Vec::len) >= n).then_some(())
        },
    )
    .await;
    let ready_in = applied.elapsed();
    let listed = proxies.list_metadata(&ListParams::default()).await.unwrap();
    eprintln!(
        "{} Proxies, all listed by the leader {:.1} s after the first create",
        listed.items.len(),
        ready_in.as_secs_f64()
    );

    // The shipped topology: the follower and the gateways join, then the
    // leases are filled through the leader, each grant waiting for the
    // follower's copy.
    let api_b = support::loopback();
    let b = manager(
        &ground,
        dir.path(),
        "b",
        (api_b, support::loopback()),
        (per_proxy, target),
    );
    let g1 = gateway(&ground, dir.path(), "g1", per_proxy);
    let g2 = gateway(&ground, dir.path(), "g2", per_proxy);
    joined(&ground, "b_", &[&g1, &g2]).await;
    let fill_started = Instant::now();
    let filled = lease_load::fill(api_a, TOKEN, leases).await;
    let fill_secs = fill_started.elapsed().as_secs_f64();
    eprintln!("{filled} leases held after {fill_secs:.1} s, the follower in sync");
    let members = [&a, &b, &g1, &g2];
    let shipped = column(&members, (api_a, Some(api_b)), (secs, rate)).await;
    assert_eq!(
        holder(&ground).await.map(|h| h.starts_with("a_")),
        Some(true),
        "the leader stayed the leader: the figures are one topology's"
    );
    eprintln!("shipped column done");
    let away = Duration::from_secs(env_or("BENCH_ABSENCE", 60).clamp(5, 600));
    let absence = absence(&ground, (&a, api_a, &b), away, rate).await;
    eprintln!("absence done");

    // One process: the others stop, and once the leader's Lease no longer
    // names the follower, the leader alone.
    drop((b, g1, g2));
    eventually(
        "the follower no longer named in sync",
        Duration::from_secs(60),
        || async { (!in_sync(&ground).await.contains("b_")).then_some(()) },
    )
    .await;
    let single = column(&[&a], (api_a, None), (secs, rate)).await;
    eprintln!("one-process column done");

    // A member joining a leader that holds the leases: the whole table.
    let started = Instant::now();
    let c = manager(
        &ground,
        dir.path(),
        "c",
        (support::loopback(), support::loopback()),
        (per_proxy, target),
    );
    joined(&ground, "c_", &[]).await;
    let late = (
        started.elapsed(),
        status_mib(c.pid(), "VmRSS:"),
        status_mib(c.pid(), "VmHWM:"),
    );
    drop(c);

    let table = render(&Report {
        n,
        cores,
        secs,
        rate,
        filled,
        fill_secs,
        ready_in,
        late,
        single,
        shipped,
        absence,
    });
    drop((a, responder));
    println!("{table}");
    if std::env::var("BENCH_WRITE_DOCS").is_ok_and(|v| v == "1") {
        write_docs("bench-topology", &table);
    }
}

struct Report {
    n: usize,
    cores: usize,
    secs: u64,
    rate: f64,
    filled: usize,
    fill_secs: f64,
    ready_in: Duration,
    /// A member joining the leader with the leases held: in sync after,
    /// its RSS then, its peak.
    late: (Duration, f64, f64),
    single: Column,
    shipped: Column,
    absence: Absence,
}

fn figures(f: &lease_load::Figures) -> String {
    format!(
        "{:.0} pairs/s, p50 {:.1} ms, p99 {:.1} ms{}",
        f.rate(),
        f.p50.as_secs_f64() * 1000.0,
        f.p99.as_secs_f64() * 1000.0,
        match f.errors {
            0 => String::new(),
            e => format!(", {e} not granted"),
        }
    )
}

fn per_process(names: &[&str], values: &[f64], unit: &str, digits: usize) -> String {
    names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n} {v:.digits$}{unit}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn render(r: &Report) -> String {
    let (s, t) = (&r.single, &r.shipped);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} External Proxies, {} CPUs, phases of {} s, release build unless BENCH_PROFILE says otherwise. \
         The fleet was listed by the leader {:.0} s after the first create. \
         `a` leads; `b` follows in sync (every grant waits for its copy); `g1` and `g2` are gateway processes. \
         The shipped topology ran first: {} leases filled through the leader in {:.1} s ({:.0} grants/s, 64 connections, the follower in sync), then its loads. \
         Then `b`, `g1` and `g2` stopped and the leader alone ran the same loads (its RSS and peak include what the first column left). \
         Last, a follower `c` joined the leader holding the leases: named in sync after {:.1} s (a whole table), RSS {:.1} MiB, peak {:.1} MiB. \
         The closed loops take 10 s leases (with 60 s ones a client releasing 10,000 a second fills the table's 400,000 ids in 30 s), the open loop 60 s ones.\n",
        r.n,
        r.cores,
        r.secs,
        r.ready_in.as_secs_f64(),
        r.filled,
        r.fill_secs,
        r.filled as f64 / r.fill_secs.max(1e-9),
        r.late.0.as_secs_f64(),
        r.late.1,
        r.late.2,
    );
    let _ = writeln!(out, "| | one process (the leader alone, second) | shipped (leader, follower, 2 gateways, first) |");
    let _ = writeln!(out, "|---|---|---|");
    let mut row = |name: &str, a: String, b: String| {
        let _ = writeln!(out, "| {name} | {a} | {b} |");
    };
    row(
        "RSS while probing, leases held",
        per_process(&s.names, &s.probing_rss, " MiB", 1),
        per_process(&t.names, &t.probing_rss, " MiB", 1),
    );
    row(
        "CPU while probing (cores)",
        per_process(&s.names, &s.probing_cpu, "", 2),
        per_process(&t.names, &t.probing_cpu, "", 2),
    );
    row(
        "acquire+release, closed loop, 64 connections, at the leader",
        figures(&s.loads.real),
        figures(&t.loads.real),
    );
    row(
        "the same process's bare route",
        figures(&s.loads.bare),
        figures(&t.loads.bare),
    );
    let ratio = |c: &Column| c.loads.real.rate() / c.loads.bare.rate().max(1e-9);
    row(
        "real ÷ bare (goal ≥ 50% with a follower in sync)",
        format!("{:.0}%", 100.0 * ratio(s)),
        format!("{:.0}%", 100.0 * ratio(t)),
    );
    row(
        &format!("open loop at {:.0} pairs/s, probes held", r.rate),
        figures(&s.loads.open),
        figures(&t.loads.open),
    );
    row(
        "CPU during the open loop (cores)",
        per_process(&s.names, &s.loads.open_cpu, "", 2),
        per_process(&t.names, &t.loads.open_cpu, "", 2),
    );
    let lag = t
        .loads
        .open_lag
        .copies
        .iter()
        .map(|(name, deltas, p50, p99, behind)| {
            format!("{name}: {deltas:.0} deltas, lag p50 ≤ {p50:.1} ms, p99 ≤ {p99:.1} ms, p99 ≤ {behind:.0} changes behind")
        })
        .collect::<Vec<_>>()
        .join("; ");
    row(
        "copies' lag during the open loop (bucket bounds; goal p99 ≤ 50 ms)",
        "nobody follows".into(),
        lag,
    );
    row(
        "closed loop through the follower (forwarded)",
        "—".into(),
        t.loads.forwarded.as_ref().map_or("—".into(), figures),
    );
    row(
        "peak RSS (VmHWM) at the column's end (goal ≤ 128 MiB each)",
        per_process(&s.names, &s.peak, " MiB", 1),
        per_process(&t.names, &t.peak, " MiB", 1),
    );
    let ab = &r.absence;
    let _ = writeln!(
        out,
        "\nA member away: after the shipped column, `b` was stopped (SIGSTOP) for {} s while the open loop ran at the leader at {:.0} pairs/s: {}; \
         the leader {} naming `b` in sync. Resumed (SIGCONT), `b` was named in sync again {:.1} s later; \
         the leader sent {:.0} whole tables meanwhile (0: `b` caught up from the change log), and `b`'s largest delta carried ≤ {:.0} changes (a bucket bound).",
        ab.away.as_secs(),
        r.rate,
        figures(&ab.open),
        if ab.dropped { "had stopped" } else { "had not stopped" },
        ab.back_in.as_secs_f64(),
        ab.wholes,
        ab.behind,
    );
    out
}
