//! The operator under a Pod's limits: it starts inside cgroups of its own
//! (v1 `cpu` and `memory` controllers, as this machine mounts them, below
//! the benchmark's own groups), so everything it allocates is charged
//! there as in a Pod; the shipped Pod's CPU quota and memory limit are set
//! for the phases that ask for them and lifted after.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The two controllers, where they are mounted.
const CONTROLLERS: [(&str, &str); 2] = [
    ("cpu", "/sys/fs/cgroup/cpu"),
    ("memory", "/sys/fs/cgroup/memory"),
];

/// The benchmark's groups: (cpu, memory).
pub struct Groups {
    cpu: PathBuf,
    memory: PathBuf,
}

/// What the groups saw.
#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_secs: f64,
    pub memory_peak_mib: f64,
    /// Times the memory limit was hit.
    pub memory_failcnt: u64,
    pub oom_kills: u64,
}

/// The path of this process's group under `controller`.
fn own_group(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    test_cluster::node::cgroup::group_of(&text, controller)
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| format!("writing {value} to {}: {e}", dir.join(file).display()))
}

fn read_key(dir: &Path, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or(0)
}

fn read_value(dir: &Path, file: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

impl Groups {
    /// New groups below this process's own, without limits; an error
    /// says what refused.
    pub fn create() -> Result<Groups, String> {
        let mut dirs = Vec::new();
        for (controller, mount) in CONTROLLERS {
            let own = own_group(controller)
                .ok_or_else(|| format!("no {controller} cgroup (v1) in /proc/self/cgroup"))?;
            let dir = Path::new(mount)
                .join(own.trim_start_matches('/'))
                .join(format!("epo-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            dirs.push(dir);
        }
        let memory = dirs.pop().unwrap_or_default();
        let cpu = dirs.pop().unwrap_or_default();
        Ok(Groups { cpu, memory })
    }

    /// `cmd` started inside the groups: a shell moves itself in, then
    /// execs it (same process, so nothing it allocates escapes).
    pub fn wrap(&self, cmd: &Command) -> Command {
        let mut w = Command::new("sh");
        w.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && echo $$ > "$1/cgroup.procs" && shift && exec "$@""#)
            .arg(&self.cpu)
            .arg(&self.memory)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => w.env(k, v),
                None => w.env_remove(k),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            w.current_dir(dir);
        }
        w
    }

    /// Sets the limits: `cores` of CPU and `memory` bytes; resets the
    /// memory peak and the counters read by [`Groups::stats`].
    pub fn limit(&self, cores: f64, memory: u64) -> Result<(), String> {
        write(&self.cpu, "cpu.cfs_period_us", "100000")?;
        write(
            &self.cpu,
            "cpu.cfs_quota_us",
            &((cores * 100_000.0) as u64).to_string(),
        )?;
        write(&self.memory, "memory.limit_in_bytes", &memory.to_string())?;
        let _ = write(&self.memory, "memory.max_usage_in_bytes", "0");
        let _ = write(&self.memory, "memory.failcnt", "0");
        Ok(())
    }

    /// Lifts the limits.
    pub fn unlimit(&self) {
        let _ = write(&self.cpu, "cpu.cfs_quota_us", "-1");
        let _ = write(&self.memory, "memory.limit_in_bytes", "-1");
    }

    pub fn stats(&self) -> Stats {
        Stats {
            periods: read_key(&self.cpu, "cpu.stat", "nr_periods"),
            throttled_periods: read_key(&self.cpu, "cpu.stat", "nr_throttled"),
            throttled_secs: read_key(&self.cpu, "cpu.stat", "throttled_time") as f64 / 1e9,
            memory_peak_mib: read_value(&self.memory, "memory.max_usage_in_bytes") as f64
                / (1024.0 * 1024.0),
            memory_failcnt: read_value(&self.memory, "memory.failcnt"),
            oom_kills: read_key(&self.memory, "memory.oom_control", "oom_kill"),
        }
    }
}

impl Drop for Groups {
    /// Removed once their processes are gone (the caller stops them
    /// first).
    fn drop(&mut self) {
        for dir in [&self.cpu, &self.memory] {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            if dir.exists() {
                eprintln!("could not remove {}", dir.display());
            }
        }
    }
}
