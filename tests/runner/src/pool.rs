//! Runs jobs, at most `width` at a time, each with its output in a log
//! file of its own, so that side-by-side binaries never interleave.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::plan::{Job, Program};

/// What the pool tells as it goes.
pub enum Event {
    Started {
        name: String,
        at: Duration,
    },
    Finished(Finished),
    /// Once a minute: which jobs still run.
    Running {
        at: Duration,
        names: Vec<String>,
    },
}

pub struct Finished {
    pub name: String,
    pub at: Duration,
    pub took: Duration,
    /// Ok for exit 0, else why not.
    pub result: Result<(), String>,
    pub log: PathBuf,
}

/// Runs every job and calls `tell` on the calling thread for each event.
pub fn run(
    jobs: Vec<Job>,
    width: usize,
    logs: &Path,
    timeout: Duration,
    mut tell: impl FnMut(Event),
) -> std::io::Result<()> {
    std::fs::create_dir_all(logs)?;
    let total = jobs.len();
    let queue = Arc::new(Mutex::new(VecDeque::from(jobs)));
    let running: Arc<Mutex<Vec<String>>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..width.max(1) {
        let (queue, running, tx, logs) = (
            queue.clone(),
            running.clone(),
            tx.clone(),
            logs.to_path_buf(),
        );
        workers.push(std::thread::spawn(move || loop {
            let Some(job) = lock(&queue).pop_front() else {
                break;
            };
            lock(&running).push(job.name.clone());
            let _ = tx.send(Event::Started {
                name: job.name.clone(),
                at: start.elapsed(),
            });
            let log = logs.join(format!("{}.log", file_name(&job.name)));
            let began = Instant::now();
            let result = run_one(&job, &log, timeout);
            lock(&running).retain(|n| n != &job.name);
            let _ = tx.send(Event::Finished(Finished {
                name: job.name,
                at: start.elapsed(),
                took: began.elapsed(),
                result,
                log,
            }));
        }));
    }
    drop(tx);
    let mut done = 0;
    let mut next_beat = Duration::from_secs(60);
    while done < total {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(e) => {
                if matches!(e, Event::Finished(_)) {
                    done += 1;
                }
                tell(e);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if start.elapsed() >= next_beat {
            next_beat += Duration::from_secs(60);
            tell(Event::Running {
                at: start.elapsed(),
                names: lock(&running).clone(),
            });
        }
    }
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A worker that panicked holding the lock left the data whole (pushes
    // and pops only).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `egress-proxies-operator (lib)` → `egress-proxies-operator_lib`.
fn file_name(job: &str) -> String {
    job.chars()
        .filter_map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => Some(c),
            ' ' => Some('_'),
            _ => None,
        })
        .collect()
}

fn run_one(job: &Job, log: &Path, timeout: Duration) -> Result<(), String> {
    let out = File::create(log).map_err(|e| format!("log {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = match &job.program {
        Program::Test { path, cwd } => {
            let mut c = Command::new(path);
            c.current_dir(cwd);
            if let Some(t) = job.threads {
                c.arg(format!("--test-threads={t}"));
            }
            // Each test's time in the output (libtest's --report-time,
            // which stable libtest takes with RUSTC_BOOTSTRAP set).
            c.args(["-Z", "unstable-options", "--report-time"])
                .env("RUSTC_BOOTSTRAP", "1");
            c
        }
        Program::Shell(script) => {
            let mut c = Command::new("sh");
            c.args(["-c", script]);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("could not start: {e}"))?;
    let began = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return judge(status),
            Ok(None) if began.elapsed() > timeout => {
                // Test harnesses stop their own servers and clusters when
                // their process is gone (parent-death signals, polls).
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {} s", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("wait: {e}")),
        }
    }
}

fn judge(status: ExitStatus) -> Result<(), String> {
    if status.success() {
        Ok(())
    } else {
        Err(format!("{status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(name: &str, cmd: &str) -> Job {
        Job {
            name: name.into(),
            program: Program::Shell(cmd.into()),
            threads: None,
            estimate: Duration::ZERO,
        }
    }

    #[test]
    fn jobs_run_side_by_side_with_their_own_logs_and_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = vec![
            shell("a one", "sleep 1; echo from-a"),
            shell("b", "echo from-b; exit 3"),
            shell("c", "sleep 1"),
        ];
        let mut finished = Vec::new();
        let mut started = Vec::new();
        run(jobs, 3, dir.path(), Duration::from_secs(30), |e| match e {
            Event::Finished(f) => finished.push(f),
            Event::Started { name, .. } => started.push((name, finished.len())),
            Event::Running { .. } => {}
        })
        .unwrap();
        assert_eq!(finished.len(), 3);
        // Side by side: every job started before the first sleeping one
        // ended.
        let first_sleeper_done = finished.iter().position(|f| f.name != "b").unwrap();
        for (name, done_before) in &started {
            assert!(
                *done_before <= first_sleeper_done,
                "{name} waited for a sleeper"
            );
        }
        let by = |n: &str| finished.iter().find(|f| f.name == n).unwrap();
        assert!(by("a one").result.is_ok());
        assert_eq!(
            std::fs::read_to_string(&by("a one").log).unwrap(),
            "from-a\n"
        );
        assert!(by("a one").log.ends_with("a_one.log"));
        assert!(by("b").result.as_ref().unwrap_err().contains('3'));
    }

    #[test]
    fn a_job_past_its_timeout_is_killed_and_failed() {
        let dir = tempfile::tempdir().unwrap();
        let mut result = None;
        run(
            vec![shell("hang", "exec sleep 60")],
            1,
            dir.path(),
            Duration::from_millis(300),
            |e| {
                if let Event::Finished(f) = e {
                    result = Some((f.result, f.took));
                }
            },
        )
        .unwrap();
        let (result, took) = result.unwrap();
        assert!(result.unwrap_err().contains("killed"));
        assert!(took < Duration::from_secs(10));
    }
}
