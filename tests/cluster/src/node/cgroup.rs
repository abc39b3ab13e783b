//! cgroup v1 memory groups: one per container run, below this process's own
//! memory cgroup, in a directory per node agent.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

const MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// The path of the group under `controller` in a `/proc/<pid>/cgroup`
/// text (cgroup v1), e.g. `/process_api/abc` for `memory`.
pub fn group_of(proc_cgroup: &str, controller: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

fn own_memory_cgroup(proc_self_cgroup: &str) -> Option<String> {
    group_of(proc_self_cgroup, "memory")
}

/// The agent's directory of memory groups.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    dir: PathBuf,
}

impl CgroupRoot {
    /// Creates `<own memory cgroup>/testcluster-<node>-<pid>`.
    pub fn create(node: &str) -> anyhow::Result<CgroupRoot> {
        let own = fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
        let own = own_memory_cgroup(&own).context("no memory cgroup in /proc/self/cgroup")?;
        let parent = Path::new(MEMORY_ROOT).join(own.trim_start_matches('/'));
        remove_stale(&parent);
        let dir = parent.join(format!("testcluster-{node}-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(CgroupRoot { dir })
    }

    /// A new group `name` with the given memory limit (none: unlimited).
    pub fn group(&self, name: &str, limit: Option<u64>) -> anyhow::Result<Cgroup> {
        let dir = self.dir.join(name);
        if dir.exists() {
            // A leftover of an earlier run of the same container.
            Cgroup { dir: dir.clone() }.remove_now();
        }
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cg = Cgroup { dir };
        if let Some(limit) = limit {
            cg.write("memory.limit_in_bytes", &limit.to_string())?;
            if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
                cg.write("memory.memsw.limit_in_bytes", &limit.to_string())?;
            }
        }
        Ok(cg)
    }

    /// Kills every process in every group and removes them all.
    pub async fn remove_all(&self) {
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    Cgroup { dir: e.path() }.remove().await;
                }
            }
        }
        if let Err(e) = fs::remove_dir(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// The pid of the agent that made a `testcluster-<node>-<pid>` directory.
fn owner_pid(dir_name: &str) -> Option<u32> {
    dir_name
        .strip_prefix("testcluster-")?
        .rsplit('-')
        .next()?
        .parse()
        .ok()
}

/// Removes the groups of agents that died without cleaning up (SIGKILL).
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        tracing::info!("removing the stale cgroup {}", e.path().display());
        if let Ok(children) = fs::read_dir(e.path()) {
            for c in children.flatten() {
                if c.path().is_dir() {
                    Cgroup { dir: c.path() }.remove_now();
                }
            }
        }
        Cgroup { dir: e.path() }.remove_now();
    }
}

/// One memory group.
#[derive(Debug, Clone)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let p = self.dir.join(file);
        fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
    }

    /// The processes in the group.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sends `sig` to every process in the group.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    }

    /// Whether the kernel's OOM killer killed a process of this group.
    pub fn oom_killed(&self) -> bool {
        let oom = fs::read_to_string(self.dir.join("memory.oom_control")).unwrap_or_default();
        oom_kill_count(&oom) > 0
    }

    /// SIGKILLs everything in the group until it is empty, then removes it.
    pub async fn remove(&self) {
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            self.signal(nix::sys::signal::Signal::SIGKILL);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.rmdir();
    }

    /// Like `remove`, without waiting (for synchronous cleanup).
    pub fn remove_now(&self) {
        for _ in 0..100 {
            if self.pids().is_empty() {
                break;
            }
            self.signal(nix::sys::signal::Signal::SIGKILL);
            std::thread::sleep(Duration::from_millis(10));
        }
        self.rmdir();
    }

    fn rmdir(&self) {
        // rmdir can fail for a moment while the last task is being reaped.
        for _ in 0..50 {
            match fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        tracing::warn!("could not remove cgroup {}", self.dir.display());
    }
}

/// The `oom_kill` counter of a `memory.oom_control` file.
fn oom_kill_count(oom_control: &str) -> u64 {
    oom_control
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_memory_cgroup() {
        let f = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n";
        assert_eq!(own_memory_cgroup(f).as_deref(), Some("/process_api/abc"));
        let f = "5:cpu,memory:/x\n";
        assert_eq!(own_memory_cgroup(f).as_deref(), Some("/x"));
        assert_eq!(own_memory_cgroup("0::/\n"), None);
    }

    #[test]
    fn owner_pids() {
        assert_eq!(owner_pid("testcluster-node-1-1105"), Some(1105));
        assert_eq!(owner_pid("testcluster-n-x"), None);
        assert_eq!(owner_pid("other-1"), None);
    }

    #[test]
    fn reads_oom_kill_count() {
        assert_eq!(
            oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
            2
        );
        assert_eq!(oom_kill_count("oom_kill_disable 0\nunder_oom 0\n"), 0);
    }
}
