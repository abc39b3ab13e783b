//! The per-host link (kvm.md §4.2): one SSH session per host, dialled
//! lazily under a one-slot lock and redialled when it dies or the material
//! files change; every operation gets its **own** libvirt connection
//! through its own `direct-streamlocal` channel, forwarded from a private
//! unix socket under the scratch directory. Cancelling (dropping) an
//! operation closes only its channel, which makes its blocked libvirt call
//! return; other operations on the host are untouched. Blocking libvirt
//! calls run on the blocking pool, at most [`BLOCKING_PER_HOST`] per host,
//! and image transfers on their own [`TRANSFERS_PER_HOST`] slots; a wait for
//! a slot is bounded by the call timeout (permits.rs).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinHandle;
use tracing::{debug, info_span, Instrument};

use super::helper::{Helper, WireError};
use super::protocol::{helper_path, LibvirtError, Request};

use super::permits::{SlotKind, Slots};
pub use super::permits::{BLOCKING_PER_HOST, TRANSFERS_PER_HOST};
use super::ssh::{self, DialError, Session, SshSettings, Stage, Stamp};
use crate::config::KvmHost;
use crate::provider::ErrorClass;

struct Live {
    session: Arc<Session>,
    stamp: Stamp,
}

/// One configured host and its SSH session.
pub struct HostLink {
    /// The host's config (defaults applied).
    pub host: KvmHost,
    ssh: Arc<SshSettings>,
    slot: Mutex<Option<Live>>,
    slots: Slots,
    scratch: PathBuf,
    seq: AtomicU64,
    /// The libvirt helper's binary.
    helper: std::sync::Mutex<PathBuf>,
    call_timeout_ms: AtomicU64,
}

/// Default bound of one blocking libvirt conversation (uploads excepted).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Why an operation failed before or while talking to libvirt.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Dial failure, tagged with the stage.
    #[error("connecting to host {host} ({address}): {source}")]
    Dial {
        /// Host name.
        host: String,
        /// Host address.
        address: String,
        /// The staged error.
        #[source]
        source: DialError,
    },
    /// A libvirt call failed.
    #[error("{what}: {source}")]
    Libvirt {
        /// What was being done.
        what: String,
        /// libvirt's error.
        #[source]
        source: LibvirtError,
    },
    /// libvirt did not answer within the call timeout.
    #[error("{0}")]
    TimedOut(String),
    /// No slot of the host freed up within the bound.
    #[error("host {host} is busy: no {slot} slot free within {waited:?}")]
    Busy {
        /// Host name.
        host: String,
        /// Which slot ("libvirt call", "image transfer").
        slot: &'static str,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The helper died or fell out of step, or the connection was closed.
    #[error("libvirt call aborted: {0}")]
    Aborted(String),
}

impl LinkError {
    /// The dial stage, when this is a dial failure.
    pub fn stage(&self) -> Option<Stage> {
        match self {
            LinkError::Dial { source, .. } => Some(source.stage),
            _ => None,
        }
    }
}

/// One operation's libvirt connection: its own helper process
/// (protocol.rs) on its own channel. Dropping it kills the helper (ending
/// any call it is in) and closes the channel.
pub struct OpConn {
    helper: Mutex<Option<Helper>>,
    pump: JoinHandle<()>,
    path: PathBuf,
    slots: Slots,
    host: String,
    call_timeout: Duration,
}

impl Drop for OpConn {
    fn drop(&mut self) {
        self.pump.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl OpConn {
    /// Runs one request on the helper, holding one of the host's blocking
    /// slots, inside the caller's span; bounded by the call timeout. `what`
    /// prefixes a failure.
    pub async fn call<T: DeserializeOwned>(
        &self,
        what: &str,
        req: Request,
    ) -> Result<T, LinkError> {
        let _permit = self
            .slots
            .acquire(SlotKind::Call, self.call_timeout)
            .await?;
        let limit = self.call_timeout;
        let mut helper = self.helper.lock().await;
        let h = helper
            .as_mut()
            .ok_or_else(|| LinkError::Aborted(format!("{what}: the connection is closed")))?;
        let span = info_span!("libvirt", host = %self.host);
        match tokio::time::timeout(limit, h.call(&req).instrument(span)).await {
            Ok(r) => settle(&mut helper, what, r),
            Err(_) => {
                // Killing this operation's helper and closing its channel
                // ends the blocked call; other operations keep theirs.
                *helper = None;
                self.pump.abort();
                Err(LinkError::TimedOut(format!(
                    "{what}: libvirt did not answer within {limit:?}"
                )))
            }
        }
    }

    /// Runs an upload request on one of the host's transfer slots, with its
    /// `len` bytes from `rx`, and no time limit on the transfer itself (its
    /// pace is set by the download, which has its own stall, rate and
    /// overall limits). The wait for the slot is still bounded.
    pub async fn upload<T: DeserializeOwned>(
        &self,
        what: &str,
        req: Request,
        len: u64,
        mut rx: mpsc::Receiver<Option<Vec<u8>>>,
    ) -> Result<T, LinkError> {
        let _permit = self
            .slots
            .acquire(SlotKind::Transfer, self.call_timeout)
            .await?;
        let mut helper = self.helper.lock().await;
        let h = helper
            .as_mut()
            .ok_or_else(|| LinkError::Aborted(format!("{what}: the connection is closed")))?;
        let span = info_span!("libvirt", host = %self.host);
        let r = h.upload(&req, len, &mut rx).instrument(span).await;
        settle(&mut helper, what, r)
    }
}

/// A call's outcome; a helper that broke is dropped (killed).
fn settle<T>(
    helper: &mut Option<Helper>,
    what: &str,
    r: Result<T, WireError>,
) -> Result<T, LinkError> {
    match r {
        Ok(v) => Ok(v),
        Err(WireError::Libvirt(source)) => Err(LinkError::Libvirt {
            what: what.to_string(),
            source,
        }),
        Err(e) => {
            *helper = None;
            Err(LinkError::Aborted(format!("{what}: {e}")))
        }
    }
}

impl HostLink {
    /// A link that has not dialled yet.
    pub fn new(host: KvmHost, ssh: Arc<SshSettings>, scratch: PathBuf) -> Self {
        HostLink {
            slots: Slots::new(&host.name, BLOCKING_PER_HOST, TRANSFERS_PER_HOST),
            host,
            ssh,
            slot: Mutex::new(None),
            scratch,
            seq: AtomicU64::new(0),
            helper: std::sync::Mutex::new(helper_path()),
            call_timeout_ms: AtomicU64::new(DEFAULT_CALL_TIMEOUT.as_millis() as u64),
        }
    }

    /// Bounds each blocking libvirt conversation (and the libvirt connect).
    pub fn set_call_timeout(&self, d: Duration) {
        self.call_timeout_ms
            .store(d.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// Starts the libvirt helper from `path` (default: protocol::helper_path).
    pub fn set_helper(&self, path: PathBuf) {
        *self.helper.lock().unwrap_or_else(|p| p.into_inner()) = path;
    }

    fn helper(&self) -> PathBuf {
        self.helper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms.load(Ordering::Relaxed))
    }

    fn dial_error(&self, source: DialError) -> LinkError {
        LinkError::Dial {
            host: self.host.name.clone(),
            address: self.host.address.clone(),
            source,
        }
    }

    /// The live SSH session, dialling when there is none, it died, or the
    /// material files changed since it was dialled.
    pub async fn session(&self) -> Result<Arc<Session>, LinkError> {
        let mut slot = self.slot.lock().await;
        if let Some(live) = slot.as_ref() {
            if live.session.is_closed() {
                debug!(host = %self.host.name, "ssh session lost, redialing");
                *slot = None;
            } else if live.stamp != self.ssh.stamp() {
                debug!(host = %self.host.name, "ssh material changed, redialing");
                *slot = None;
            } else {
                return Ok(live.session.clone());
            }
        }
        let span = info_span!("ssh.dial", host = %self.host.name, address = %self.host.address);
        let started = Instant::now();
        let dialled = async {
            let r = ssh::dial(&self.ssh, &self.host.address, &self.host.user).await;
            match &r {
                Ok(_) => debug!(host = %self.host.name, duration_ms = started.elapsed().as_millis() as u64, "ssh host connected"),
                Err(e) => debug!(host = %self.host.name, stage = e.stage.as_str(), error = %e, "ssh dial failed"),
            }
            r
        }
        .instrument(span)
        .await;
        let (session, stamp) = dialled.map_err(|e| self.dial_error(e))?;
        let session = Arc::new(session);
        *slot = Some(Live {
            session: session.clone(),
            stamp,
        });
        Ok(session)
    }

    /// Forgets the session if it is still `session` (after a transport
    /// failure); a newer one is left alone.
    pub async fn forget(&self, session: &Arc<Session>) {
        let mut slot = self.slot.lock().await;
        if slot
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.session, session))
        {
            *slot = None;
        }
    }

    /// Opens this operation's libvirt connection: a fresh streamlocal
    /// channel to the host's libvirt socket, a private unix socket bridged
    /// to it, and `qemu+unix:///system?socket=<path>` opened on the
    /// blocking pool.
    pub async fn open(&self) -> Result<OpConn, LinkError> {
        let session = self.session().await?;
        // A link that died silently answers no channel request; bound the
        // wait and forget such a session so the next call redials.
        let limit = self.call_timeout().min(ssh::HANDSHAKE_TIMEOUT);
        // Its own span: the session may have been dialled under another
        // operation's trace, the channel is always this one's.
        let opened = tokio::time::timeout(
            limit,
            session
                .channel_open_direct_streamlocal(self.host.socket.clone())
                .instrument(info_span!("ssh.channel", host = %self.host.name)),
        )
        .await;
        let channel = match opened {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                if session.is_closed() {
                    self.forget(&session).await;
                }
                return Err(self.dial_error(DialError {
                    stage: Stage::LibvirtConnect,
                    class: ErrorClass::Transient,
                    message: format!("libvirt connect via {}: {e}", self.host.socket),
                }));
            }
            Err(_) => {
                self.forget(&session).await;
                return Err(self.dial_error(DialError {
                    stage: Stage::LibvirtConnect,
                    class: ErrorClass::Transient,
                    message: format!(
                        "libvirt connect via {}: the SSH session did not open a channel within {limit:?}",
                        self.host.socket
                    ),
                }));
            }
        };
        ensure_private_dir(&self.scratch).map_err(|e| {
            self.dial_error(DialError {
                stage: Stage::LibvirtConnect,
                class: ErrorClass::Transient,
                message: format!("creating {}: {e}", self.scratch.display()),
            })
        })?;
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let path = self
            .scratch
            .join(format!("{}-{n}.sock", short(&self.host.name)));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| {
            self.dial_error(DialError {
                stage: Stage::LibvirtConnect,
                class: ErrorClass::Transient,
                message: format!("binding the local libvirt bridge {}: {e}", path.display()),
            })
        })?;
        let pump = tokio::spawn(async move {
            // One connection only: libvirt's client opens exactly one.
            if let Ok((mut local, _)) = listener.accept().await {
                drop(listener);
                let mut remote = channel.into_stream();
                let _ = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
            }
        });
        let uri = format!("qemu+unix:///system?socket={}", path.display());
        let _permit = self
            .slots
            .acquire(SlotKind::Call, self.call_timeout())
            .await?;
        let limit = self.call_timeout();
        let helper = self.helper();
        let started = Helper::start(&helper, &uri, &self.host.name)
            .instrument(info_span!("libvirt.connect", host = %self.host.name));
        let (class, message) = match tokio::time::timeout(limit, started).await {
            Ok(Ok(h)) => {
                return Ok(OpConn {
                    helper: Mutex::new(Some(h)),
                    pump,
                    path,
                    slots: self.slots.clone(),
                    host: self.host.name.clone(),
                    call_timeout: limit,
                })
            }
            Ok(Err(WireError::Libvirt(e))) => (ErrorClass::Transient, e.message),
            // Not installed beside the operator: fixed by the install, not
            // by a retry soon or an edit of a Proxy.
            Ok(Err(e @ WireError::Spawn(_))) => (ErrorClass::Unavailable, e.to_string()),
            Ok(Err(e)) => (ErrorClass::Transient, e.to_string()),
            // The helper (killed with the dropped future) and the pump end.
            Err(_) => (ErrorClass::Transient, format!("no answer within {limit:?}")),
        };
        pump.abort();
        let _ = std::fs::remove_file(&path);
        Err(self.dial_error(DialError {
            stage: Stage::LibvirtConnect,
            class,
            message: format!("libvirt connect via {}: {message}", self.host.socket),
        }))
    }
}

/// Host names are identifiers, but keep socket paths short and safe.
fn short(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(24)
        .collect()
}

/// The private scratch directory for this provider's bridge sockets
/// (created on first use, mode 0700).
pub fn scratch_dir(base: &Path, provider: &str) -> PathBuf {
    base.join(format!(
        "epo-kvm-{}-{}-{}",
        short(provider),
        std::process::id(),
        SCRATCH_SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

static SCRATCH_SEQ: AtomicU64 = AtomicU64::new(0);
