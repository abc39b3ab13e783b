//! The upstream programs the launcher runs: each in its own process group
//! (so a terminal's Ctrl-C reaches only the launcher, which stops them in
//! order), killed by the kernel if the launcher dies, with its output in a
//! log file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// One running program.
pub struct Component {
    pub name: String,
    pub log: PathBuf,
    child: tokio::process::Child,
    /// What it was started with, to start it again ([`Component::respawn`]).
    program: PathBuf,
    args: Vec<String>,
}

impl Component {
    /// Starts `program` with `args`, stdout and stderr appended to
    /// `logs/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], logs: &Path) -> anyhow::Result<Self> {
        let log = logs.join(format!("{name}.log"));
        let child = Self::start(program, args, &log)?;
        Ok(Component {
            name: name.to_string(),
            log,
            child,
            program: program.to_path_buf(),
            args: args.to_vec(),
        })
    }

    /// SIGKILL (a crash: no shutdown of its own), then the same program
    /// with the same arguments again, its output appended to the same log.
    pub async fn respawn(&mut self) -> anyhow::Result<()> {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.child = Self::start(&self.program, &self.args, &self.log)?;
        Ok(())
    }

    fn start(program: &Path, args: &[String], log: &Path) -> anyhow::Result<tokio::process::Child> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; it runs in the child between fork and exec. The launcher
        // spawns from tokio worker threads, which live as long as it does,
        // so the parent-death signal fires only when the launcher is gone.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn()
            .with_context(|| format!("starting {}", program.display()))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Fails with the end of its log when the program has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}); the end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit.
    pub async fn stop(mut self, grace: Duration) {
        let Some(pid) = self.child.id() else {
            return;
        };
        // A stopped (SIGSTOPped by a fault test) process must run to see SIGTERM.
        let pid = Pid::from_raw(pid as i32);
        let _ = kill(pid, Signal::SIGCONT);
        let _ = kill(pid, Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a program
/// that binds it itself.
///
/// The port is drawn below the kernel's ephemeral range. A port from
/// `bind(:0)` lies inside that range, and between our close and the
/// program's bind, any outgoing connection on the machine may be given
/// it as its local port (CI once lost kube-controller-manager that way).
/// Below the range, only another caller of this function can take it,
/// and the bind check below catches ports already held.
pub fn free_port() -> anyhow::Result<u16> {
    let (low, _) = ephemeral_range();
    let floor: u16 = 10_000;
    let span = u32::from(low.saturating_sub(floor).max(1));
    let seed = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    };
    for i in 0..span.min(4096) {
        // Knuth's multiplicative step spreads tries over the span.
        let off = (seed as u32).wrapping_add(i.wrapping_mul(2_654_435_761)) % span;
        let port = floor + off as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The kernel's ephemeral port range (Linux's default when unreadable).
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|w| w.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999))
}
