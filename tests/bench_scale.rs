//! `make bench-scale N=10000`: the operator binary at fleet scale on the
//! real test ground (control plane, no node agent). One real Squid on
//! 127.0.0.1 serves N External Proxies; each Proxy's health check fetches
//! its own path of one local target, so the target sees when each proxy
//! was last probed. The run:
//!
//! 1. a bare tokio loop (no operator) probes the N proxies once a second
//!    with the operator's own probe function, on one thread whose CPU time
//!    is read: the floor;
//! 2. starts the operator, reads its idle RSS, applies the N Proxies and
//!    times each until Ready (a watch);
//! 3. holds BENCH_HOLD seconds (default 30) touching nothing, and reads the
//!    operator's RSS, CPU, probes, the age of each proxy's newest probe,
//!    and its requests to the API server (the audit log) by verb;
//! 4. scrapes `/metrics` (size, time);
//! 5. fills BENCH_LEASES live leases (default min(100000, 10 x N)) and
//!    runs the lease load next to a bare axum handler.
//!
//! With BENCH_PERF=FILE, `perf record` profiles the operator during its
//! lease load into FILE.
//!
//! It prints one table, and with BENCH_WRITE_DOCS=1 (the make target)
//! writes it into docs/performance.md. Nothing here is asserted about
//! speed; it fails only if the run itself breaks. Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is its failure report

mod lease_load;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::health::probe::{probe, tls_config, ProbeTarget};
use futures::{StreamExt, TryStreamExt};
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;
use support::{eventually, phase, squid, Operator};

const TOKEN: &str = "bench-scale-token";

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

    fn spec(self, name: &str, squid_port: u16, target: SocketAddr) -> serde_json::Value {
        let health = json!({"url": format!("http://{target}/p/{name}"), "expectedStatus": 200});
        match self {
            Mode::External => json!({
                "mode": "External",
                "endpoint": {"host": "127.0.0.1", "port": squid_port},
                "healthCheck": health,
            }),
            Mode::Kubernetes => {
                json!({"provider": "kubernetes", "port": 3128, "healthCheck": health})
            }
        }
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// When each path of the target was last fetched.
type Hits = Arc<Mutex<HashMap<String, Instant>>>;

/// The probe target: answers 200 to every request and records the time
/// of the newest request per path.
async fn recording_target(ip: std::net::IpAddr) -> (SocketAddr, Hits) {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let hits: Hits = Arc::default();
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            // Out of descriptors under a burst (EMFILE) is passing: the
            // target must outlive it, or every later probe fails.
            let mut c = match l.accept().await {
                Ok((c, _)) => c,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let h = h.clone();
            tokio::spawn(async move {
                let head = support::read_head(&mut c).await;
                if let Some(path) = head.split_whitespace().nth(1) {
                    h.lock().unwrap().insert(path.to_string(), Instant::now());
                }
                let _ = c
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    (addr, hits)
}

/// CPU seconds (user + system) from a `/proc/.../stat` line.
fn cpu_secs(stat_path: &str) -> f64 {
    let stat = std::fs::read_to_string(stat_path).unwrap();
    // Fields after the command name (which may hold spaces) start at ")".
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

fn pct<T: Copy + Default + Ord>(sorted: &[T], p: f64) -> T {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn probe_target(squid: u16, target: SocketAddr, name: &str) -> ProbeTarget {
    ProbeTarget {
        proxy_host: "127.0.0.1".into(),
        proxy_port: squid,
        deny: None,
        url: format!("http://{target}/p/{name}").parse().unwrap(),
        expected_status: 200,
        timeout: Duration::from_secs(5),
        credentials: None,
    }
}

/// The floor: the same probes from a bare loop on a thread of its own
/// (a current-thread runtime), each target once a second, spread over the
/// second. Returns (probes done, of them failed, CPU seconds of the thread).
fn bare_probe_loop(targets: Vec<ProbeTarget>, secs: u64) -> (u64, u64, f64) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let tls = tls_config(None).unwrap();
            let cpu0 = cpu_secs("/proc/thread-self/stat");
            let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let targets = Arc::new(targets);
            const SLOTS: usize = 100;
            let per_slot = targets.len().div_ceil(SLOTS);
            let start = tokio::time::Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for round in 0..secs {
                for slot in 0..SLOTS {
                    let at = start
                        + Duration::from_secs(round)
                        + Duration::from_millis(slot as u64 * 1000 / SLOTS as u64);
                    tokio::time::sleep_until(at).await;
                    for i in slot * per_slot..((slot + 1) * per_slot).min(targets.len()) {
                        let (t, tls) = (targets.clone(), tls.clone());
                        let (done, failed) = (done.clone(), failed.clone());
                        tasks.spawn(async move {
                            let r = probe(&t[i], &tls).await;
                            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if !r.ok {
                                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        });
                    }
                    while tasks.try_join_next().is_some() {}
                }
            }
            while tasks.join_next().await.is_some() {}
            let cpu = cpu_secs("/proc/thread-self/stat") - cpu0;
            (
                done.load(std::sync::atomic::Ordering::Relaxed),
                failed.load(std::sync::atomic::Ordering::Relaxed),
                cpu,
            )
        })
    })
    .join()
    .unwrap()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with make bench-scale N=..."]
async fn bench_scale() {
    squid::require();
    let mode = Mode::from_env();
    let n = env_or("BENCH_N", mode.default_n()).clamp(1, 100_000) as usize;
    let hold = env_or("BENCH_HOLD", 30).clamp(5, 600);
    let live_leases = env_or("BENCH_LEASES", (10 * n).min(100_000) as u64) as usize;
    let lease_secs = env_or("BENCH_SECS", 5).clamp(1, 60);
    // Room for the filled leases and every connection of the load at once,
    // so the load measures grants, not refusals of a full small fleet.
    let per_proxy = (live_leases + lease_load::CONNECTIONS).div_ceil(n) + 1;
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
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
    let (target, hits) = recording_target(target_ip).await;
    let (squid_port, _squid) = squid::on_loopback("benchscale").await;

    // 1. The floor.
    let targets = names
        .iter()
        .map(|name| probe_target(squid_port, target, name))
        .collect();
    let (bare_probes, bare_failed, bare_cpu) = bare_probe_loop(targets, hold.min(20));
    let bare_cpu_per_probe = bare_cpu / bare_probes.max(1) as f64;
    eprintln!("bare probe loop: {bare_probes} probes, {bare_failed} failed, {bare_cpu:.1} CPU s");

    // 2. The operator, idle, then the fleet applied.
    let api = support::loopback();
    let metrics = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.discovery_operator(dir.path(), &providers, api, TOKEN);
    cmd.args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--max-leases-per-proxy", &per_proxy.to_string()])
        .args(["--max-lease-ttl", "2h"]);
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
                let spec = mode.spec(&name, squid_port, target);
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

    // 3. Steady state: nothing sent by the benchmark to the API server.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (m0, _) = scrape(metrics).await;
    let (from, cpu0, t0) = (
        chrono::Utc::now(),
        cpu_secs(&format!("/proc/{pid}/stat")),
        Instant::now(),
    );
    let mut rss = Vec::new();
    let mut anon = Vec::new();
    let mut ages = Vec::new();
    for _ in 0..hold {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(status_mib(pid, "VmRSS:"));
        anon.push(status_mib(pid, "RssAnon:"));
        let now = Instant::now();
        let hits = hits.lock().unwrap();
        ages.extend(names.iter().map(|name| {
            hits.get(&format!("/p/{name}"))
                .map_or(Duration::from_secs(3600), |t| {
                    now.saturating_duration_since(*t)
                })
        }));
    }
    let (to, cpu1, window) = (
        chrono::Utc::now(),
        cpu_secs(&format!("/proc/{pid}/stat")),
        t0.elapsed(),
    );
    let (m1, _) = scrape(metrics).await;
    let probes = sum_of(&m1, "proxy_operator_healthcheck_duration_seconds_count")
        - sum_of(&m0, "proxy_operator_healthcheck_duration_seconds_count");
    let provider_calls = sum_of(&m1, "proxy_operator_provider_requests_total")
        - sum_of(&m0, "proxy_operator_provider_requests_total");
    let op_cpu = (cpu1 - cpu0) / window.as_secs_f64();
    let op_cpu_per_probe = (cpu1 - cpu0) / probes.max(1.0);
    ages.sort();
    rss.sort_by(f64::total_cmp);
    let steady_rss = rss[rss.len() / 2];
    anon.sort_by(f64::total_cmp);
    let steady_anon = anon[anon.len() / 2];
    let requests = api_requests(&ground, from, to);
    let total_requests: u64 = requests.values().sum();

    // 4. /metrics.
    let (text, scrape_took) = scrape(metrics).await;

    // One more kubernetes Proxy at a time, the fleet Ready: apply to Ready.
    let mut solo = Vec::new();
    if mode == Mode::Kubernetes {
        for i in 0..3 {
            let name = format!("solo{i}");
            let t = Instant::now();
            proxies
                .create(
                    &PostParams::default(),
                    &support::proxy(&name, mode.spec(&name, squid_port, target)),
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

    // 5. Leases.
    let filled = lease_load::fill(api, TOKEN, live_leases).await;
    let (stop_bare, rx) = tokio::sync::oneshot::channel::<()>();
    let bare = lease_load::bare_server(rx).await;
    let run = Duration::from_secs(lease_secs);
    let b = lease_load::load(bare, TOKEN, run).await;
    // BENCH_PERF=FILE: a CPU profile of the operator during its lease
    // load (perf record, call graphs), for finding where a request goes.
    let profile = std::env::var("BENCH_PERF").ok().map(|file| {
        std::process::Command::new("perf")
            .args(["record", "-F", "499", "-g", "-o", &file])
            .args([
                "-p",
                &pid.to_string(),
                "--",
                "sleep",
                &lease_secs.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("BENCH_PERF needs perf (apt-get install linux-perf): {e}"))
    });
    let a = lease_load::load(api, TOKEN, run).await;
    if let Some(mut p) = profile {
        let _ = p.wait();
    }
    let _ = stop_bare.send(());
    let peak = status_mib(pid, "VmHWM:");
    drop(op);

    let mib = |v: f64| format!("{v:.1} MiB");
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    let mut rows: Vec<(String, String)> = vec![
        (
            match mode {
                Mode::External => "Proxies (External, one shared Squid)".into(),
                Mode::Kubernetes => "Proxies (kubernetes provider, a Squid Pod each)".into(),
            },
            n.to_string(),
        ),
        ("cores".into(), cores.to_string()),
        (
            "create calls done".into(),
            format!("{:.1} s", applied_in.as_secs_f64()),
        ),
        (
            "apply to all Ready".into(),
            if ready_count == n {
                format!("{:.1} s", all_ready.as_secs_f64())
            } else {
                format!(
                    "not reached: {ready_count} of {n} Ready after {:.0} s",
                    all_ready.as_secs_f64()
                )
            },
        ),
        (
            "create to Ready per Proxy, p50 / p99".into(),
            format!(
                "{} / {}",
                ms(pct(&per_proxy_ready, 0.5)),
                ms(pct(&per_proxy_ready, 0.99))
            ),
        ),
        ("RSS idle (no Proxy)".into(), mib(idle_rss)),
        (
            "of it anonymous (heap, stacks), idle / steady".into(),
            format!("{} / {}", mib(idle_anon), mib(steady_anon)),
        ),
        (
            "RSS steady / peak".into(),
            format!("{} / {}", mib(steady_rss), mib(peak)),
        ),
        ("RSS peak after apply".into(), mib(peak_after_apply)),
        (
            "bytes per Proxy (steady - idle)".into(),
            format!(
                "{:.0} B",
                (steady_rss - idle_rss) * 1024.0 * 1024.0 / n as f64
            ),
        ),
        ("CPU steady".into(), format!("{op_cpu:.2} cores")),
        (
            "probes per second".into(),
            format!("{:.0}", probes / window.as_secs_f64()),
        ),
        (
            "newest probe's age per Proxy, p50 / p99".into(),
            format!("{} / {}", ms(pct(&ages, 0.5)), ms(pct(&ages, 0.99))),
        ),
        (
            "bare probe loop: probes/s, failed, CPU per probe".into(),
            format!(
                "{:.0}, {bare_failed}, {:.0} µs",
                bare_probes as f64 / hold.min(20) as f64,
                bare_cpu_per_probe * 1e6
            ),
        ),
        (
            "operator CPU per probe (ratio to bare)".into(),
            format!(
                "{:.0} µs ({:.1}x)",
                op_cpu_per_probe * 1e6,
                op_cpu_per_probe / bare_cpu_per_probe.max(1e-9)
            ),
        ),
        (
            "API server requests/s (steady)".into(),
            format!("{:.2}", total_requests as f64 / window.as_secs_f64()),
        ),
    ];
    for (verb, count) in &requests {
        rows.push((
            format!("  {verb}"),
            format!("{:.2}/s", *count as f64 / window.as_secs_f64()),
        ));
    }
    rows.extend([
        (
            "provider calls/s (steady)".into(),
            format!("{:.2}", provider_calls / window.as_secs_f64()),
        ),
        (
            "/metrics size, scrape time".into(),
            format!("{:.0} KiB, {}", text.len() as f64 / 1024.0, ms(scrape_took)),
        ),
        (
            "live leases held during the lease load".into(),
            filled.to_string(),
        ),
        (
            "lease acquire+release/s, p99 (bare axum)".into(),
            format!("{:.0}, {:.2} ms", b.rate(), b.p99.as_secs_f64() * 1e3),
        ),
        (
            "lease acquire+release/s, p99 (operator)".into(),
            format!(
                "{:.0}, {:.2} ms ({:.0}% of bare; {} errors)",
                a.rate(),
                a.p99.as_secs_f64() * 1e3,
                100.0 * a.rate() / b.rate().max(1e-9),
                a.errors
            ),
        ),
    ]);
    if !solo.is_empty() {
        solo.sort();
        rows.push((
            "one more kubernetes Proxy, apply to Ready (3 in turn: min / max)".into(),
            format!("{} / {}", ms(solo[0]), ms(solo[solo.len() - 1])),
        ));
    }
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let provider = match mode {
        Mode::External => "",
        Mode::Kubernetes => " PROVIDER=kubernetes",
    };
    let mut table = format!(
        "`make bench-scale N={n}{provider}` ({build} build, {cores} cores, hold {hold} s, {} UTC)\n\n| figure | value |\n|---|---|\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M")
    );
    for (k, v) in &rows {
        table.push_str(&format!("| {k} | {v} |\n"));
    }
    println!("{table}");
    if std::env::var("BENCH_WRITE_DOCS").is_ok_and(|v| v == "1") {
        write_docs(mode.marker(), &table);
    }
}

/// Replaces the table between the `<!-- marker:start/end -->` lines of
/// docs/performance.md.
fn write_docs(marker: &str, table: &str) {
    let (start, end) = (
        format!("<!-- {marker}:start -->"),
        format!("<!-- {marker}:end -->"),
    );
    let path = support::repo().join("docs/performance.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (a, b) = (doc.find(&start).unwrap(), doc.find(&end).unwrap());
    let new = format!("{}{start}\n{table}{}", &doc[..a], &doc[b..]);
    std::fs::write(&path, new).unwrap();
    println!("wrote the table into {}", path.display());
}
