//! The floor the operator's probes are compared with: the operator's own
//! probe function driven by a bare loop in a process of its own, each
//! Proxy once a second spread over the second (the operator's cadence),
//! one probe of a Proxy at a time, through the same probe targets, in a
//! phase of the same run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use egress_proxies_operator::health::probe::{probe, tls_config, ProbeTarget};

/// The probe of Proxy `i` through the responder at `proxy`.
pub fn target(proxy: SocketAddr, i: usize) -> ProbeTarget {
    ProbeTarget {
        proxy_host: proxy.ip().to_string(),
        proxy_port: proxy.port(),
        deny: None,
        url: format!("http://{proxy}/p/s{i}").parse().unwrap(),
        expected_status: 200,
        timeout: Duration::from_secs(5),
        credentials: None,
    }
}

/// The role: probes `n` Proxies through `proxy` for `secs` on one thread,
/// then prints `@@ bare DONE FAILED CPU_SECS`.
pub fn run(proxy: SocketAddr, n: usize, secs: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (done, failed, cpu) = rt.block_on(async move {
        let tls = tls_config(None).unwrap();
        let cpu0 = super::cpu_secs("/proc/self/stat");
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        // One task per Proxy, each probe waiting for the one before
        // (closed loop, as the engine never has two probes of one Proxy
        // in flight), due once a second, the Proxies spread over it.
        let start = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let (t, tls) = (target(proxy, i), tls.clone());
            let (done, failed) = (done.clone(), failed.clone());
            let offset = Duration::from_micros((i as u64 * 1_000_000) / n as u64);
            tasks.spawn(async move {
                for round in 0..secs {
                    let at = start + offset + Duration::from_secs(round);
                    if tokio::time::Instant::now() > at + Duration::from_secs(1) {
                        continue; // behind by a whole round: skip it
                    }
                    tokio::time::sleep_until(at).await;
                    let r = probe(&t, &tls).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    if !r.ok {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let cpu = super::cpu_secs("/proc/self/stat") - cpu0;
        (
            done.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            cpu,
        )
    });
    println!("{}bare {done} {failed} {cpu}", super::responder::PREFIX);
}

/// What a bare phase did.
pub struct Bare {
    pub probes: u64,
    pub failed: u64,
    /// CPU seconds of the whole process.
    pub cpu: f64,
    pub perf: super::perf::Counters,
}

/// Runs the bare loop for `secs` as a process of its own (pinned to
/// `cpu` when given), counted by perf over its whole life.
pub fn phase(proxy: SocketAddr, n: usize, secs: u64, cpu: Option<usize>) -> Bare {
    let counters = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = super::role_command("bare", cpu, Some(counters.path()));
    cmd.env("BENCH_PROXY_ADDR", proxy.to_string())
        .env("BENCH_N", n.to_string())
        .env("BENCH_SECS", secs.to_string())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    // Read to the end: a closed pipe would fail libtest's last lines.
    let lines: Vec<String> = std::io::BufRead::lines(std::io::BufReader::new(out))
        .map_while(Result::ok)
        .collect();
    let line = lines
        .iter()
        .find_map(|l| l.strip_prefix("@@ bare ").map(String::from))
        .expect("the bare loop printed no figures");
    let _ = child.wait();
    let v: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    Bare {
        probes: v[0] as u64,
        failed: v[1] as u64,
        cpu: v[2],
        perf: super::perf::Counters::read(counters.path()),
    }
}
