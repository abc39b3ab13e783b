//! The parts of `make bench-scale` that keep the operator's figures its
//! own: the probe targets and the bare probe loop run as processes of
//! their own (this test binary started again in a role, pinned to a CPU
//! where the machine has one to spare), the operator's limits come from a
//! cgroup as a Pod's do, and CPU is read per process and for the machine.
#![allow(dead_code)] // each benchmark binary uses its own part

pub mod bare;
pub mod cgroup;
pub mod perf;
pub mod responder;

use std::process::Command;

/// The test binary started again to play `role` (see `bench_role` in
/// tests/bench_scale.rs), pinned to `cpu` with taskset when given, and
/// counted by `perf stat` into `counters` when given.
pub fn role_command(role: &str, cpu: Option<usize>, counters: Option<&std::path::Path>) -> Command {
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if let Some(file) = counters {
        argv.extend(perf::stat_prefix(file));
    }
    if let Some(cpu) = cpu {
        argv.extend(["taskset".into(), "-c".into(), cpu.to_string().into()]);
    }
    argv.push(std::env::current_exe().unwrap().into());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .args([
            "--ignored",
            "--exact",
            "bench_role",
            "--nocapture",
            "--quiet",
        ])
        .env("BENCH_ROLE", role)
        .stderr(std::process::Stdio::inherit());
    cmd
}

/// CPU seconds (user + system) from a `/proc/.../stat` file.
pub fn cpu_secs(stat_path: &str) -> f64 {
    let stat = std::fs::read_to_string(stat_path).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ")".
    let Some(at) = stat.rfind(')') else {
        return 0.0;
    };
    let f: Vec<&str> = stat[at + 2..].split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / clock_ticks()
}

pub fn clock_ticks() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

/// The machine's busy and total CPU time so far (`/proc/stat`), in ticks.
pub fn machine_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = f.iter().take(8).sum();
    // idle + iowait
    let idle = f[3] + f.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

/// CPU use of the processes of one phase, in cores, each over the same
/// window.
#[derive(Clone, Copy, Default)]
pub struct CpuShare {
    /// The operator (or the bare loop in a bare phase).
    pub measured: f64,
    pub responder: f64,
    /// This process: the load generator.
    pub harness: f64,
    /// Every CPU of the machine busy, in cores.
    pub machine: f64,
}

/// CPU counters at the start of a window.
pub struct CpuWindow {
    pids: (Option<u32>, u32),
    at: std::time::Instant,
    measured: f64,
    responder: f64,
    harness: f64,
    machine: (f64, f64),
}

impl CpuWindow {
    /// Starts a window over `measured` (none: its CPU is read elsewhere)
    /// and the responder `responder`.
    pub fn start(measured: Option<u32>, responder: u32) -> CpuWindow {
        let stat = |p: Option<u32>| p.map_or(0.0, |p| cpu_secs(&format!("/proc/{p}/stat")));
        CpuWindow {
            pids: (measured, responder),
            at: std::time::Instant::now(),
            measured: stat(measured),
            responder: stat(Some(responder)),
            harness: cpu_secs("/proc/self/stat"),
            machine: machine_ticks(),
        }
    }

    /// The shares since the start.
    pub fn end(&self) -> CpuShare {
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        let stat = |p: Option<u32>| p.map_or(0.0, |p| cpu_secs(&format!("/proc/{p}/stat")));
        let (busy, total) = machine_ticks();
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        CpuShare {
            measured: (stat(self.pids.0) - self.measured) / secs,
            responder: (stat(Some(self.pids.1)) - self.responder) / secs,
            harness: (cpu_secs("/proc/self/stat") - self.harness) / secs,
            machine: cores * (busy - self.machine.0) / (total - self.machine.1).max(1.0),
        }
    }
}

impl CpuShare {
    /// What bounded a phase, from who used the CPU: the machine when its
    /// cores were nearly all busy (naming the biggest user), the responder
    /// when its one CPU was, else nothing of the machine's.
    pub fn limit(&self, quota: Option<f64>, throttled: bool) -> String {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        if let (Some(q), true) = (quota, throttled) {
            return format!("the cgroup's CPU quota ({q} cores)");
        }
        if self.responder > 0.9 {
            return "the probe targets' CPU".into();
        }
        if self.machine > 0.9 * cores {
            let who = [
                (self.measured, "the measured process"),
                (self.harness, "the load generator"),
                (self.responder, "the probe targets"),
                (
                    (self.machine - self.measured - self.harness - self.responder).max(0.0),
                    "the control plane and the rest",
                ),
            ]
            .into_iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map_or("", |w| w.1);
            return format!("the machine's {cores} cores (most used by {who})");
        }
        "none of the machine's (CPU left idle)".into()
    }
}

/// An unsigned number from the environment variable `name`, else `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A `/proc/PID/status` size field (`VmRSS:`, `VmHWM:`, ...) in MiB; 0
/// for a process gone.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Replaces the table between the `<!-- marker:start/end -->` lines of
/// docs/performance.md.
pub fn write_docs(marker: &str, table: &str) {
    let (start, end) = (
        format!("<!-- {marker}:start -->"),
        format!("<!-- {marker}:end -->"),
    );
    let path = crate::support::repo().join("docs/performance.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (a, b) = (doc.find(&start).unwrap(), doc.find(&end).unwrap());
    let new = format!("{}{start}\n{table}{}", &doc[..a], &doc[b..]);
    std::fs::write(&path, new).unwrap();
    println!("wrote the table into {}", path.display());
}
