//! Spawning the helper processes: a Pod's sandbox (pause process) and its
//! containers. Every spawn happens on a tokio worker thread (never a
//! blocking-pool thread, which may retire and fire the children's
//! parent-death signal).

use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::cgroup::Cgroup;
use super::exec::{ExecSpec, EXEC, PAUSE};
use super::net::PodNetwork;

/// A Pod's namespaces, held by its pause process.
pub struct Sandbox {
    child: Child,
    pid: i32,
    pub ip: Ipv4Addr,
    network: Arc<PodNetwork>,
    owns_ip: bool,
}

impl Sandbox {
    /// Starts the pause process and wires its network namespace to the
    /// bridge (unless `host_network`, which shares the host's).
    pub async fn start(
        exe: &Path,
        hostname: &str,
        host_network: bool,
        network: Arc<PodNetwork>,
    ) -> anyhow::Result<Sandbox> {
        let mut child = Command::new(exe)
            .arg(PAUSE)
            .arg(std::process::id().to_string())
            .arg(hostname)
            .arg(if host_network { "1" } else { "0" })
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting the pause process")?;
        let pid = child
            .id()
            .context("the pause process exited at once")?
            .try_into()
            .context("pid out of range")?;
        let (Some(stdout), Some(mut stdin)) = (child.stdout.take(), child.stdin.take()) else {
            bail!("the pause process has no pipes");
        };
        let mut lines = BufReader::new(stdout).lines();
        let mut next_line = async || -> anyhow::Result<String> {
            match tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
                Ok(Ok(Some(l))) => Ok(l),
                Ok(Ok(None)) => bail!("the pause process exited"),
                Ok(Err(e)) => bail!("reading from the pause process: {e}"),
                Err(_) => bail!("the pause process did not answer"),
            }
        };
        let ready = next_line().await?;
        if ready != "ready" {
            bail!("the pause process said {ready:?}");
        }
        if host_network {
            return Ok(Sandbox {
                child,
                pid,
                ip: network.gateway(),
                network,
                owns_ip: false,
            });
        }
        let ip = network.allocate()?;
        let mut sandbox = Sandbox {
            child,
            pid,
            ip,
            network: network.clone(),
            owns_ip: true,
        };
        let wired = async {
            network.attach(pid, ip)?;
            let req = format!("net {ip} {}\n", network.gateway());
            stdin.write_all(req.as_bytes()).await?;
            stdin.flush().await?;
            let reply = next_line().await?;
            if reply != "ok" {
                bail!(
                    "configuring the pod network: {}",
                    reply.trim_start_matches("error ")
                );
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = wired {
            sandbox.stop().await;
            return Err(e);
        }
        Ok(sandbox)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Kills the pause process (its namespaces and the veth go with it)
    /// and frees the address.
    pub async fn stop(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        if self.owns_ip {
            let veth = self.network.veth_name(self.ip);
            // Normally gone with the namespace already.
            if std::path::Path::new("/sys/class/net").join(&veth).exists() {
                let _ = super::net::ip(&["link", "del", &veth]);
            }
            self.network.release(self.ip);
            self.owns_ip = false;
        }
    }
}

/// How a container process ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Exit {
    pub code: i32,
    pub reason: &'static str,
    pub message: Option<String>,
    pub signal: Option<i32>,
}

/// Classifies an exit: `StartError` when setup failed, `OOMKilled` when
/// killed with the OOM killer's mark, else `Completed` or `Error`.
pub fn classify(
    code: Option<i32>,
    signal: Option<i32>,
    oom: bool,
    start_error: Option<String>,
) -> Exit {
    if let Some(msg) = start_error.filter(|m| !m.is_empty()) {
        return Exit {
            code: 128,
            reason: "StartError",
            message: Some(msg),
            signal: None,
        };
    }
    let code = match (code, signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 255,
    };
    let reason = if oom && (signal == Some(libc::SIGKILL) || code == 137) {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    };
    Exit {
        code,
        reason,
        message: None,
        signal,
    }
}

/// A started container process.
pub struct Process {
    child: Child,
    pub pid: i32,
    pub cgroup: Cgroup,
    error_file: PathBuf,
    copies: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `__pod-exec` with the spec written to `spec_path`; stdout and
/// stderr are appended to `log`.
pub async fn spawn(
    exe: &Path,
    spec: &ExecSpec,
    spec_path: &Path,
    log: &Path,
    cgroup: Cgroup,
) -> anyhow::Result<Process> {
    let json = serde_json::to_vec(spec)?;
    tokio::fs::write(spec_path, json)
        .await
        .with_context(|| format!("writing {}", spec_path.display()))?;
    let _ = tokio::fs::remove_file(&spec.error_file).await;
    let mut child = Command::new(exe)
        .arg(EXEC)
        .arg(spec_path)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the container helper")?;
    let pid = child
        .id()
        .context("the container helper exited at once")?
        .try_into()
        .context("pid out of range")?;
    let mut copies = Vec::new();
    let out: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>> =
        child.stdout.take().map(|s| Box::new(s) as _);
    let err: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>> =
        child.stderr.take().map(|s| Box::new(s) as _);
    for mut stream in [out, err].into_iter().flatten() {
        let log = log.to_path_buf();
        copies.push(tokio::spawn(async move {
            let file = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .await;
            match file {
                Ok(mut f) => {
                    let _ = tokio::io::copy(&mut stream, &mut f).await;
                }
                Err(e) => tracing::warn!("opening {}: {e}", log.display()),
            }
        }));
    }
    Ok(Process {
        child,
        pid,
        cgroup,
        error_file: spec.error_file.clone(),
        copies,
    })
}

impl Process {
    /// Waits for the process to end, kills what it left in its cgroup, and
    /// says how it ended.
    pub async fn wait(&mut self) -> Exit {
        let status = self.child.wait().await;
        let oom = self.cgroup.oom_killed();
        self.cgroup.remove().await;
        for c in self.copies.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), c).await;
        }
        let start_error = tokio::fs::read_to_string(&self.error_file).await.ok();
        match status {
            Ok(s) => classify(s.code(), s.signal(), oom, start_error),
            Err(e) => Exit {
                code: 255,
                reason: "Error",
                message: Some(format!("waiting for the container: {e}")),
                signal: None,
            },
        }
    }

    /// Signals every process of the container.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig);
        self.cgroup.signal(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_exits() {
        let c = |code, sig, oom, err: Option<&str>| {
            let e = classify(code, sig, oom, err.map(str::to_string));
            (e.code, e.reason)
        };
        assert_eq!(c(Some(0), None, false, None), (0, "Completed"));
        assert_eq!(c(Some(1), None, false, None), (1, "Error"));
        assert_eq!(c(None, Some(9), false, None), (137, "Error"));
        assert_eq!(c(None, Some(9), true, None), (137, "OOMKilled"));
        assert_eq!(c(None, Some(15), true, None), (143, "Error"));
        assert_eq!(
            c(Some(128), None, false, Some("exec: no")),
            (128, "StartError")
        );
        assert_eq!(c(Some(0), None, false, Some("")), (0, "Completed"));
    }
}
