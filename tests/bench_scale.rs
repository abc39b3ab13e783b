//! `make bench-scale N=10000`: the operator binary at fleet scale on the
//! real test ground (control plane, no node agent), measured apart from
//! what it probes and what loads it:
//!
//! - the probe targets are one process of their own (`scale_bench::
//!   responder`: a minimal proxy answering as the proxy and the target,
//!   pinned to the last CPU when the machine has two or more), which also
//!   measures each Proxy's newest probe's age where the probes land;
//! - the operator runs with `--bench-routes`: `/bench/leases` is the same
//!   process's lease-shaped route with no store (the lease baseline), and
//!   `PUT /bench/probes` holds its probes;
//! - each phase lasts BENCH_PHASE seconds (default 30) and repeats
//!   BENCH_REPEAT times (default 3): operator probing (its CPU, perf
//!   counters, probes, ages, RSS), the bare probe loop in a process of its
//!   own doing the same probes while the operator is stopped (SIGSTOP), the
//!   operator inside a cgroup with the shipped Pod's limits (500m CPU,
//!   128Mi), then with BENCH_LEASES live leases (default min(100000, 10 x
//!   N)), lease load with probes running and held: closed loop on 64
//!   connections against the real and the bare route, and open loop at
//!   BENCH_RATE pairs a second (default 2000) with each pair's latency from
//!   when it was due.
//!
//! Each figure is the median of its repeats (with their range) and names
//! what limited it, from who used the CPU in that phase. It prints one
//! table, and with BENCH_WRITE_DOCS=1 (the make target) writes it into
//! docs/performance.md. Nothing here is asserted about speed; it fails
//! only if the run itself breaks. Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is its failure report

mod lease_load;
mod scale_bench;
mod support;
#[path = "scale_bench/table.rs"]
mod table;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use futures::{StreamExt, TryStreamExt};
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use scale_bench::{bare, cgroup, perf, responder::Responder, CpuShare, CpuWindow};
use scale_bench::{env_or, status_mib, write_docs};
use serde_json::json;
use support::{eventually, phase, Operator};
use table::Table;

const TOKEN: &str = "bench-scale-token";

/// The shipped Pod's limits (config/manager, the Helm chart).
const POD_CPU: f64 = 0.5;
const POD_MEMORY: u64 = 128 * 1024 * 1024;

/// What the Proxies are: External endpoints on the shared Squid (the
/// default), or, with `PROVIDER=kubernetes`, kubernetes-provider Proxies
/// whose Squid Pods the node agent runs as real processes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    External,
    Kubernetes,
}

impl Mode {
    fn from_env() -> Mode {
        match std::env::var("PROVIDER").as_deref() {
            Ok("kubernetes") => Mode::Kubernetes,
            Ok("") | Ok("external") | Err(_) => Mode::External,
            Ok(other) => {
                panic!("PROVIDER={other}: the benchmark knows kubernetes (or nothing: External)")
            }
        }
    }

    /// Proxies by default: one Squid process per Pod bounds the kubernetes
    /// fleet by this machine's memory.
    fn default_n(self) -> u64 {
        match self {
            Mode::External => 1000,
            Mode::Kubernetes => 50,
        }
    }

    /// The doc markers the table goes between.
    fn marker(self) -> &'static str {
        match self {
            Mode::External => "bench-scale",
            Mode::Kubernetes => "bench-scale-kubernetes",
        }
    }

    /// Proxy `name`'s spec: External on the responder, or a Squid Pod
    /// probing the responder as its target.
    fn spec(self, name: &str, target: SocketAddr) -> serde_json::Value {
        let health = json!({"url": format!("http://{target}/p/{name}"), "expectedStatus": 200});
        match self {
            Mode::External => json!({
                "mode": "External",
                "endpoint": {"host": target.ip().to_string(), "port": target.port()},
                "healthCheck": health,
            }),
            Mode::Kubernetes => {
                json!({"provider": "kubernetes", "port": 3128, "healthCheck": health})
            }
        }
    }
}

fn pct<T: Copy + Default + Ord>(sorted: &[T], p: f64) -> T {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// The roles this binary plays when the benchmark starts it again.
#[test]
#[ignore = "a role of make bench-scale, started by it"]
fn bench_role() {
    let var = |k: &str| std::env::var(k).unwrap();
    match std::env::var("BENCH_ROLE").as_deref() {
        Ok("responder") => scale_bench::responder::run(
            var("BENCH_RESPONDER_IP").parse().unwrap(),
            var("BENCH_RESPONDER_N").parse().unwrap(),
        ),
        Ok("bare") => bare::run(
            var("BENCH_PROXY_ADDR").parse().unwrap(),
            var("BENCH_N").parse().unwrap(),
            var("BENCH_SECS").parse().unwrap(),
        ),
        Ok(other) => panic!("BENCH_ROLE={other}: the roles are responder and bare"),
        Err(_) => panic!(
            "bench_role is a process bench_scale starts with BENCH_ROLE set; run `make bench-scale`"
        ),
    }
}

/// The median of some repeats, and their range.
fn spread(mut v: Vec<f64>, show: impl Fn(f64) -> String) -> String {
    v.sort_by(f64::total_cmp);
    match v.as_slice() {
        [] => "not measured".into(),
        [one] => show(*one),
        _ => format!(
            "{} ({}–{})",
            show(v[v.len() / 2]),
            show(v[0]),
            show(v[v.len() - 1])
        ),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One phase of the operator probing.
struct ProbePhase {
    probes_per_sec: f64,
    ages: scale_bench::responder::Ages,
    cpu: CpuShare,
    perf: perf::Counters,
    rss: f64,
    anon: f64,
    requests: BTreeMap<String, u64>,
    provider_calls: f64,
    secs: f64,
    cgroup: Option<cgroup::Stats>,
}

impl ProbePhase {
    fn cpu_per_probe(&self) -> f64 {
        self.cpu.measured / self.probes_per_sec.max(1e-9)
    }
}

/// The operator probing for `secs`, measured.
async fn probe_phase(
    ctx: &Ctx<'_>,
    responder: &mut Responder,
    secs: u64,
    limited: Option<&cgroup::Groups>,
) -> ProbePhase {
    let pid = ctx.pid;
    let (m0, _) = scrape(ctx.metrics).await;
    let scraped = Instant::now();
    let throttle0 = limited.map(|l| l.stats());
    let from = chrono::Utc::now();
    let window = CpuWindow::start(Some(pid), responder.pid());
    let counting = perf::Counters::during(pid, Duration::from_secs(secs));
    responder.open();
    let (mut rss, mut anon) = (Vec::new(), Vec::new());
    for _ in 0..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(status_mib(pid, "VmRSS:"));
        anon.push(status_mib(pid, "RssAnon:"));
    }
    let ages = responder.close();
    let cpu = window.end();
    let to = chrono::Utc::now();
    let perf = counting.wait();
    let (m1, _) = scrape(ctx.metrics).await;
    // Between the two scrapes, a little longer than the window.
    let between = scraped.elapsed().as_secs_f64();
    let probes = sum_of(&m1, "proxy_operator_healthcheck_duration_seconds_count")
        - sum_of(&m0, "proxy_operator_healthcheck_duration_seconds_count");
    let cgroup = limited.map(|l| {
        let (a, b) = (throttle0.unwrap_or_default(), l.stats());
        cgroup::Stats {
            periods: b.periods - a.periods,
            throttled_periods: b.throttled_periods - a.throttled_periods,
            throttled_secs: b.throttled_secs - a.throttled_secs,
            ..b
        }
    });
    ProbePhase {
        probes_per_sec: probes / between,
        ages,
        cpu,
        perf,
        rss: median(rss),
        anon: median(anon),
        requests: api_requests(ctx.ground, from, to),
        provider_calls: (sum_of(&m1, "proxy_operator_provider_requests_total")
            - sum_of(&m0, "proxy_operator_provider_requests_total"))
            / between,
        secs: secs as f64,
        cgroup,
    }
}

/// One bare phase: the operator stopped, the bare loop probing.
struct BarePhase {
    run: bare::Bare,
    ages: scale_bench::responder::Ages,
    cpu: CpuShare,
    secs: f64,
}

/// One round of lease loads, each with who used the CPU during it.
struct LeasePhase {
    real: (lease_load::Figures, CpuShare),
    bare: (lease_load::Figures, CpuShare),
    open: (lease_load::Figures, CpuShare),
}

/// What every phase needs.
struct Ctx<'a> {
    ground: &'a support::Ground,
    pid: u32,
    metrics: SocketAddr,
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
}

/// `perf record` of `pid` for `secs` into `file`.
fn record(pid: u32, file: &str, secs: u64) -> std::process::Child {
    std::process::Command::new("perf")
        .args(["record", "-F", "499", "-g", "-o", file])
        .args(["-p", &pid.to_string(), "--", "sleep", &secs.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("BENCH_PERF needs perf (apt-get install linux-perf): {e}"))
}

async fn switch_probes(api: SocketAddr, paused: bool) {
    let body = serde_json::to_vec(&json!({ "paused": paused })).unwrap();
    let (status, answer) = support::api_call(api, "PUT", "/bench/probes", Some(TOKEN), body).await;
    assert_eq!(status, 204, "PUT /bench/probes: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with make bench-scale N=..."]
async fn bench_scale() {
    let mode = Mode::from_env();
    let n = env_or("BENCH_N", mode.default_n()).clamp(1, 100_000) as usize;
    let secs = env_or("BENCH_PHASE", 30).clamp(3, 600);
    let repeats = env_or("BENCH_REPEAT", 3).clamp(1, 10) as usize;
    let live_leases = env_or("BENCH_LEASES", (10 * n).min(100_000) as u64) as usize;
    let rate = env_or("BENCH_RATE", 2000).clamp(1, 100_000) as f64;
    // Room for the filled leases and every connection of the load at once,
    // so the load measures grants, not refusals of a full small fleet.
    let per_proxy = (live_leases + lease_load::OPEN_CONNECTIONS).div_ceil(n) + 1;
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let responder_cpu = (cores >= 2).then(|| cores - 1);
    let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();

    // Squid Pods reach the host on the cluster's bridge, never loopback.
    let (ground, target_ip, providers) = match mode {
        Mode::External => (
            support::ground_without_pods("scale").await,
            std::net::IpAddr::from([127, 0, 0, 1]),
            "providers: []\n".to_string(),
        ),
        Mode::Kubernetes => {
            support::require_squid_pods();
            let ground = support::ground("scale").await;
            let ip = ground.host_ip();
            (
                ground,
                ip,
                support::kubernetes_reaching("kubernetes", "", ip),
            )
        }
    };
    let mut responder = Responder::spawn(target_ip, n, responder_cpu);
    let target = responder.addr;

    // The operator, idle, then the fleet applied.
    let api = support::loopback();
    let metrics = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.discovery_operator(dir.path(), &providers, api, TOKEN);
    cmd.args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--max-leases-per-proxy", &per_proxy.to_string()])
        .args(["--max-lease-ttl", "2h", "--bench-routes"]);
    // Started inside cgroups of its own (no limits until asked), so all
    // it allocates is charged there as in a Pod.
    let groups = cgroup::Groups::create();
    if let Ok(g) = &groups {
        cmd = g.wrap(&cmd);
    }
    let op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let pid = op.pid();
    eventually(
        "the operator serves /metrics",
        Duration::from_secs(60),
        || async { tokio::net::TcpStream::connect(metrics).await.ok().map(drop) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_rss = status_mib(pid, "VmRSS:");
    let idle_anon = status_mib(pid, "RssAnon:");

    let proxies = ground.proxies();
    let ready: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let (proxies, ready) = (proxies.clone(), ready.clone());
        tokio::spawn(async move {
            let mut events = watcher(proxies, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Ok(Some(p)) = events.try_next().await {
                let p: Proxy = p;
                if phase(&p) == Some("Ready") {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    ready
                        .lock()
                        .unwrap()
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    let applied_at = Instant::now();
    let created: HashMap<String, Instant> = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let proxies = proxies.clone();
            async move {
                let spec = mode.spec(&name, target);
                proxies
                    .create(&PostParams::default(), &support::proxy(&name, spec))
                    .await
                    .unwrap();
                (name, Instant::now())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let applied_in = applied_at.elapsed();
    // Bounded: a fleet that cannot all turn Ready (the machine cannot
    // carry its probes) is a figure of the table, not a hung benchmark.
    let deadline = Instant::now()
        + match mode {
            Mode::External => Duration::from_secs(60 + n as u64 / 40),
            Mode::Kubernetes => Duration::from_secs(120 + n as u64),
        };
    while ready.lock().unwrap().len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_ready = applied_at.elapsed();
    let ready_count = ready.lock().unwrap().len();
    eprintln!(
        "{ready_count} of {n} Proxies Ready {:.1} s after the first create",
        all_ready.as_secs_f64()
    );
    watch.abort();
    let mut per_proxy_ready: Vec<Duration> = {
        let ready = ready.lock().unwrap();
        names
            .iter()
            .filter_map(|name| Some(ready.get(name)?.saturating_duration_since(created[name])))
            .collect()
    };
    per_proxy_ready.sort();
    let peak_after_apply = status_mib(pid, "VmHWM:");
    let ctx = Ctx {
        ground: &ground,
        pid,
        metrics,
    };

    // Probing: the operator, then the bare loop with the operator stopped.
    // The bare loop probes through the responder as the External Proxies
    // do; Squid Pods ask for credentials it does not have.
    let mut ops = Vec::new();
    let mut bares = Vec::new();
    for round in 0..repeats {
        tokio::time::sleep(Duration::from_secs(5)).await;
        ops.push(probe_phase(&ctx, &mut responder, secs, None).await);
        eprintln!("probe phase {} of {repeats} done", round + 1);
        if mode == Mode::External {
            support::signal(pid, "-STOP");
            let window = CpuWindow::start(None, responder.pid());
            responder.open();
            let run = tokio::task::spawn_blocking(move || bare::phase(target, n, secs, None))
                .await
                .unwrap();
            let ages = responder.close();
            let mut cpu = window.end();
            support::signal(pid, "-CONT");
            cpu.measured = run.cpu / secs as f64;
            bares.push(BarePhase {
                run,
                ages,
                cpu,
                secs: secs as f64,
            });
        }
    }

    // Inside the Pod's limits.
    let mut limited_phases = Vec::new();
    let limits = groups
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|g| g.limit(POD_CPU, POD_MEMORY).map(|()| g));
    let limit_refused = match limits {
        Ok(g) => {
            for _ in 0..repeats {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if !alive(pid) {
                    break;
                }
                limited_phases.push(probe_phase(&ctx, &mut responder, secs, Some(g)).await);
            }
            g.unlimit();
            None
        }
        Err(e) => Some(e),
    };
    let survived = alive(pid);

    // /metrics.
    let (text, scrape_took) = if survived {
        scrape(metrics).await
    } else {
        (String::new(), Duration::ZERO)
    };

    // One more kubernetes Proxy at a time, the fleet Ready: apply to Ready.
    let mut solo = Vec::new();
    if mode == Mode::Kubernetes && survived {
        for i in 0..3 {
            let name = format!("solo{i}");
            let t = Instant::now();
            proxies
                .create(
                    &PostParams::default(),
                    &support::proxy(&name, mode.spec(&name, target)),
                )
                .await
                .unwrap();
            eventually("the lone Proxy Ready", Duration::from_secs(60), || async {
                let p = proxies.get(&name).await.ok()?;
                (phase(&p) == Some("Ready")).then_some(())
            })
            .await;
            solo.push(t.elapsed());
        }
    }

    // Leases: the real and the bare route of the same process, closed
    // loop, then the real one open loop; probes running, then held.
    let mut filled = 0;
    let (mut before_fill, mut after_fill, mut rss_filled) = (0.0, 0.0, 0.0);
    let mut leases: Vec<(bool, LeasePhase)> = Vec::new();
    if survived {
        before_fill = status_mib(pid, "RssAnon:");
        filled = lease_load::fill(api, TOKEN, live_leases).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        after_fill = status_mib(pid, "RssAnon:");
        rss_filled = status_mib(pid, "VmRSS:");
        let run = Duration::from_secs(secs);
        for paused in [false, true] {
            switch_probes(api, paused).await;
            for round in 0..repeats {
                // BENCH_PERF=FILE: a CPU profile (perf record, call
                // graphs) of the operator during the first real load.
                let profile = std::env::var("BENCH_PERF")
                    .ok()
                    .filter(|_| round == 0 && !paused)
                    .map(|file| record(pid, &file, secs));
                let window = CpuWindow::start(Some(pid), responder.pid());
                let real = lease_load::load_at(api, TOKEN, run, "/v1").await;
                let real = (real, window.end());
                if let Some(mut p) = profile {
                    let _ = p.wait();
                }
                let window = CpuWindow::start(Some(pid), responder.pid());
                let bare = lease_load::load_at(api, TOKEN, run, "/bench").await;
                let bare = (bare, window.end());
                let window = CpuWindow::start(Some(pid), responder.pid());
                let open = lease_load::open_loop(api, TOKEN, rate, run, "/v1").await;
                let open = (open, window.end());
                leases.push((paused, LeasePhase { real, bare, open }));
            }
        }
        switch_probes(api, false).await;
    }
    let peak = if survived {
        status_mib(pid, "VmHWM:")
    } else {
        0.0
    };
    drop(op);
    drop(groups);
    drop(responder);

    let table = Table {
        mode,
        n,
        cores,
        secs,
        repeats,
        responder_cpu,
        applied_in,
        all_ready,
        ready_count,
        per_proxy_ready,
        idle_rss,
        idle_anon,
        peak_after_apply,
        ops,
        bares,
        limited_phases,
        limit_refused,
        survived,
        metrics_size: text.len(),
        scrape_took,
        solo,
        filled,
        lease_bytes: (after_fill - before_fill) * 1024.0 * 1024.0,
        rss_filled,
        leases,
        rate,
        peak,
    }
    .render();
    println!("{table}");
    if std::env::var("BENCH_WRITE_DOCS").is_ok_and(|v| v == "1") {
        write_docs(mode.marker(), &table);
    }
}

/// Sum of every sample of `family` (any labels) in a Prometheus text.
fn sum_of(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn scrape(addr: SocketAddr) -> (String, Duration) {
    let t = Instant::now();
    let (status, body) = support::api_call(addr, "GET", "/metrics", None, vec![]).await;
    let took = t.elapsed();
    assert_eq!(status, 200);
    let text = match body {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    };
    (text, took)
}

/// The operator's requests to the API server between `from` and `to`, by
/// verb and resource (the audit log; the benchmark itself sends none in
/// that window, and the other control-plane components are left out by
/// their user names).
fn api_requests(
    ground: &support::Ground,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    for e in ground.cluster.audit_events() {
        let user = e["user"]["username"].as_str().unwrap_or("");
        if user.starts_with("system:") {
            continue;
        }
        let Some(at) = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        else {
            continue;
        };
        let at = at.with_timezone(&chrono::Utc);
        if at < from || at >= to {
            continue;
        }
        let verb = e["verb"].as_str().unwrap_or("?");
        let resource = e["objectRef"]["resource"].as_str().unwrap_or("-");
        *by.entry(format!("{verb} {resource}")).or_default() += 1;
    }
    by
}
