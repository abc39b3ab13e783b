//! The operator's side of the libvirt helper's wire (protocol.rs): start
//! it on an operation's URI, send a request, read its events up to the
//! answer (each libvirt call becomes a `libvirt.rpc` span and a debug
//! line, kvm.md §11), and stream an upload's bytes in frames.

use std::path::Path;
use std::time::Instant;

use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, warn};

use super::protocol::{frame_header, Event, LibvirtError, Request};

/// How a conversation with the helper failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// libvirt answered with an error.
    #[error(transparent)]
    Libvirt(LibvirtError),
    /// The helper could not be started (not installed beside the operator?).
    #[error("{0}")]
    Spawn(String),
    /// The helper died or said something out of step; it is not reused.
    #[error("{0}")]
    Broken(String),
}

/// One running helper: one libvirt connection.
pub struct Helper {
    // Held for `kill_on_drop`: dropping the helper kills it, which ends
    // its libvirt calls.
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// A request went out whose answer was never read (its caller was
    /// cancelled): what comes next belongs to it, so the wire is unusable.
    mid_request: bool,
}

fn broken(e: impl std::fmt::Display) -> WireError {
    WireError::Broken(format!("the libvirt helper's pipe: {e}"))
}

impl Helper {
    /// Starts `path URI` and waits for it to connect.
    pub async fn start(path: &Path, uri: &str, host: &str) -> Result<Helper, WireError> {
        let mut child = Command::new(path)
            .arg(uri)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                WireError::Spawn(format!(
                    "starting the libvirt helper {}: {e}",
                    path.display()
                ))
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(WireError::Spawn("the libvirt helper has no pipes".into()));
        };
        if let Some(stderr) = child.stderr.take() {
            // Only a crash writes here (libvirt's own printing is off).
            let host = host.to_string();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    warn!(host = %host, message = %l, "libvirt helper");
                }
            });
        }
        let mut h = Helper {
            _child: child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            mid_request: false,
        };
        match next_event(&mut h.stdout).await? {
            Event::Ready => Ok(h),
            Event::Failed(e) => Err(WireError::Libvirt(e)),
            _ => Err(WireError::Broken(
                "the libvirt helper answered before it connected".into(),
            )),
        }
    }

    async fn send(&mut self, req: &Request) -> Result<(), WireError> {
        if self.mid_request {
            return Err(WireError::Broken(
                "an earlier call on this connection was cancelled".into(),
            ));
        }
        let mut line = serde_json::to_vec(req).map_err(broken)?;
        line.push(b'\n');
        self.mid_request = true;
        self.stdin.write_all(&line).await.map_err(broken)?;
        self.stdin.flush().await.map_err(broken)
    }

    /// Sends `req` and reads its answer.
    pub async fn call<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, WireError> {
        self.send(req).await?;
        let v = read_answer(&mut self.stdout).await;
        self.mid_request = false;
        decode(v?)
    }

    /// Sends an upload request, then `len` bytes from `rx` in frames while
    /// reading its answer. `None` from `rx` (or its end) aborts the upload.
    pub async fn upload<T: DeserializeOwned>(
        &mut self,
        req: &Request,
        len: u64,
        rx: &mut mpsc::Receiver<Option<Vec<u8>>>,
    ) -> Result<T, WireError> {
        self.send(req).await?;
        let answered = Notify::new();
        let Helper { stdin, stdout, .. } = self;
        let (written, answer) = tokio::join!(write_frames(stdin, rx, len, &answered), async {
            let a = read_answer(stdout).await;
            answered.notify_one();
            a
        });
        // libvirt's refusal leaves the wire in step too: the helper read
        // the frames up to the zero the writer sent once it answered.
        if written.is_ok() && matches!(answer, Ok(_) | Err(WireError::Libvirt(_))) {
            self.mid_request = false;
        }
        let v = answer?;
        written?;
        decode(v)
    }
}

fn decode<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, WireError> {
    serde_json::from_value(v).map_err(|e| {
        WireError::Broken(format!(
            "the libvirt helper's answer does not read (another version?): {e}"
        ))
    })
}

async fn next_event(stdout: &mut Lines<BufReader<ChildStdout>>) -> Result<Event, WireError> {
    let line = stdout
        .next_line()
        .await
        .map_err(broken)?
        .ok_or_else(|| WireError::Broken("the libvirt helper exited".into()))?;
    serde_json::from_str(&line).map_err(|e| {
        WireError::Broken(format!(
            "the libvirt helper wrote a line that does not read: {e}"
        ))
    })
}

/// Reads events up to the answer. Each `Start`/`End` pair becomes a
/// `libvirt.rpc` span (a child of the caller's) and one debug line.
async fn read_answer(
    stdout: &mut Lines<BufReader<ChildStdout>>,
) -> Result<serde_json::Value, WireError> {
    let mut open: Option<(tracing::Span, String, Instant)> = None;
    loop {
        match next_event(stdout).await? {
            Event::Start { rpc } => {
                let span = tracing::info_span!(
                    "libvirt.rpc",
                    rpc = rpc.as_str(),
                    libvirt_code = tracing::field::Empty
                );
                open = Some((span, rpc, Instant::now()));
            }
            Event::End { error } => {
                let Some((span, rpc, started)) = open.take() else {
                    continue;
                };
                let duration_us = started.elapsed().as_micros() as u64;
                match error {
                    None => debug!(parent: &span, rpc = rpc.as_str(), duration_us, "libvirt call"),
                    Some(e) => {
                        span.record("libvirt_code", e.code);
                        debug!(parent: &span, rpc = rpc.as_str(), duration_us, libvirt_code = e.code, error = %e.message, "libvirt call");
                    }
                }
            }
            Event::Debug { message, subject } => {
                debug!(subject = subject.as_deref().unwrap_or(""), "{message}")
            }
            Event::Answer(v) => return Ok(v),
            Event::Failed(e) => return Err(WireError::Libvirt(e)),
            Event::Ready => {
                return Err(WireError::Broken(
                    "the libvirt helper connected twice".into(),
                ))
            }
        }
    }
}

/// Writes up to `len` bytes from `rx` as frames. Ends with a zero frame
/// when the source fails or the helper answered first (it failed and
/// reads frames only up to that zero).
async fn write_frames(
    stdin: &mut ChildStdin,
    rx: &mut mpsc::Receiver<Option<Vec<u8>>>,
    len: u64,
    answered: &Notify,
) -> Result<(), WireError> {
    let mut sent = 0u64;
    while sent < len {
        let next = tokio::select! {
            biased;
            _ = answered.notified() => None,
            m = rx.recv() => m.flatten(),
        };
        let Some(chunk) = next else { break };
        // A frame's length is a u32; the download's chunks are far smaller.
        for piece in chunk.chunks(u32::MAX as usize) {
            stdin
                .write_all(&frame_header(piece.len() as u32))
                .await
                .map_err(broken)?;
            stdin.write_all(piece).await.map_err(broken)?;
        }
        sent += chunk.len() as u64;
    }
    if sent < len {
        stdin.write_all(&frame_header(0)).await.map_err(broken)?;
    }
    stdin.flush().await.map_err(broken)
}
