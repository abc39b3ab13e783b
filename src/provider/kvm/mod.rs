//! The `kvm` provider: proxy VMs on libvirt/KVM hypervisors reached over
//! SSH (kvm.md, docs/kvm-provider.md).
//!
//! Each host is reached through one SSH session ([`conn::HostLink`]); each
//! operation opens its own libvirt connection through its own forwarded
//! channel and its own libvirt helper process, so cancelling one operation
//! never cuts off another. The operator's process never links libvirt: the
//! libvirt sequences run in the helper binary (src/bin/egress-proxies-libvirt),
//! spoken to through [`helper`] in the words of [`protocol`], bounded per
//! host.
//!
//! This file holds the provider and its trait impls; what a domain's state
//! means is in [`domain`], its address choice in [`address`] (with the
//! host's own neighbour table in [`neighbours`] as the last source), create
//! on one host in `create.rs`, background creates in [`pending`], the host
//! check in [`check`] and placement resolution in [`placement`].

pub mod address;
pub mod check;
pub mod classify;
pub mod conn;
mod create;
pub mod domain;
mod download;
pub mod helper;
pub mod ids;
pub mod image;
pub mod iso;
pub mod neighbours;
pub mod pending;
mod permits;
pub mod placement;
pub mod protocol;
pub mod seed;
pub mod ssh;
mod urls;
pub mod xml;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tracing::{debug, info, info_span, warn, Instrument};

pub use self::address::{own_nic, pick_ipv4};
use self::conn::HostLink;
pub use self::domain::map_state;
use self::domain::{to_instance, Observed};
use self::ids::{provider_id, DomainRef};
use self::pending::{JobState, Jobs, Outcome};
use self::protocol::Request;
use self::ssh::SshSettings;
use crate::config::KvmConfig;
use crate::provider::registry::ProviderType;
use crate::provider::{
    BoxError, Checker, CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider,
    ProviderError, Tagged, TargetStatus,
};

/// Default upper bound of one health check round.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `create` waits for its work before returning with it still
/// running in the background (see [`KvmProvider::with_create_wait`]).
pub const DEFAULT_CREATE_WAIT: Duration = Duration::from_secs(20);

/// One download at a time per (host, base volume).
type ImageLock = Arc<tokio::sync::Mutex<()>>;

struct Inner {
    name: String,
    cfg: KvmConfig,
    links: Vec<Arc<HostLink>>,
    image_locks: Mutex<HashMap<(String, String), ImageLock>>,
    http: OnceCell<reqwest::Client>,
    check_timeout: Duration,
    scratch: PathBuf,
    /// Creates still running in the background, by domain name.
    pending: Jobs,
    /// How long `create` waits for its background work before it returns
    /// the ID with the work still going (kvm.md §11 gap 2).
    create_wait: Duration,
    /// The addresses a guest may report (`kvm.allowedAddresses`).
    guests: crate::tenancy::ProbeDenylist,
    /// Refused addresses already logged (bounded): a listing runs every
    /// few seconds and would repeat the warning.
    warned: Mutex<std::collections::HashSet<String>>,
}

/// How many refused guest addresses are remembered as logged.
const WARNED_CAP: usize = 256;

impl Inner {
    /// The instance of `obs`, warning once per address the guest reported
    /// that `kvm.allowedAddresses` does not open.
    fn instance(&self, id: String, obs: Observed) -> Instance {
        let reported = obs.ip.clone();
        let inst = to_instance(id, obs, &self.guests);
        if inst.ip.is_empty() && !reported.is_empty() {
            let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            if warned.len() < WARNED_CAP && warned.insert(reported.clone()) {
                warn!(provider = %self.name, id = %inst.id, address = %reported,
                    "A guest reported an address the operator never dials (private, loopback, link-local or metadata) and kvm.allowedAddresses does not list: the guest has no address until it reports one listed");
            }
        }
        inst
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// The kvm provider. Cheap to clone; clones share the SSH sessions.
#[derive(Clone)]
pub struct KvmProvider {
    inner: Arc<Inner>,
}

impl KvmProvider {
    /// Builds the provider from a validated config block. Never dials and
    /// never reads the SSH material (a missing key only fails kvm calls).
    pub fn new(name: &str, cfg: &KvmConfig) -> Result<Self, String> {
        if cfg.hosts.is_empty() {
            return Err("kvm.hosts must list at least one host".into());
        }
        let ssh = Arc::new(SshSettings {
            key_file: cfg.ssh_key_file.clone(),
            known_hosts_file: cfg.known_hosts_file.clone(),
            insecure: cfg.insecure_ignore_host_key,
        });
        if cfg.insecure_ignore_host_key {
            warn!(
                provider = name,
                "kvm.insecureIgnoreHostKey is set: host keys are not verified"
            );
        }
        if let Err(e) = ssh.load() {
            info!(provider = name, error = %e, "WARNING: kvm ssh material is not usable; proxies on this provider will fail until it is");
        }
        let scratch = conn::scratch_dir(&std::env::temp_dir(), name);
        let links = cfg
            .hosts
            .iter()
            .map(|h| Arc::new(HostLink::new(h.clone(), ssh.clone(), scratch.clone())))
            .collect();
        Ok(KvmProvider {
            inner: Arc::new(Inner {
                name: name.to_string(),
                cfg: cfg.clone(),
                links,
                image_locks: Mutex::new(HashMap::new()),
                http: OnceCell::new(),
                check_timeout: DEFAULT_CHECK_TIMEOUT,
                scratch,
                pending: Jobs::default(),
                create_wait: DEFAULT_CREATE_WAIT,
                guests: cfg.guest_addresses()?,
                warned: Mutex::default(),
            }),
        })
    }

    /// The same provider with another health-check bound.
    pub fn with_check_timeout(self, d: Duration) -> Self {
        self.tuned(|i| i.check_timeout = d)
    }

    /// Applies `f` while this handle is the only one (builders run before
    /// any clone); a shared provider is returned unchanged.
    fn tuned(self, f: impl FnOnce(&mut Inner)) -> Self {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                f(&mut inner);
                KvmProvider {
                    inner: Arc::new(inner),
                }
            }
            Err(shared) => KvmProvider { inner: shared },
        }
    }

    /// The same provider with another bound on how long `create` waits for
    /// its background work (default 20 s) before returning the ID.
    pub fn with_create_wait(self, d: Duration) -> Self {
        self.tuned(|i| i.create_wait = d)
    }

    /// Bounds every blocking libvirt conversation except image uploads
    /// (default 120 s): a hung daemon fails the call Transient instead of
    /// holding it forever.
    pub fn with_call_timeout(self, d: Duration) -> Self {
        for l in &self.inner.links {
            l.set_call_timeout(d);
        }
        self
    }

    /// Starts the libvirt helper from `path` instead of the one beside the
    /// operator's binary (protocol::helper_path).
    pub fn with_libvirt_helper(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        for l in &self.inner.links {
            l.set_helper(path.clone());
        }
        self
    }

    fn link(&self, host: &str) -> Option<&Arc<HostLink>> {
        self.inner.links.iter().find(|l| l.host.name == host)
    }

    fn err(&self, op: Op, id: &str, cause: impl Into<BoxError>) -> ProviderError {
        let e = ProviderError::classify_with(op, &self.inner.name, id, cause, classify::classify);
        debug!(provider = %self.inner.name, op = op.as_str(), id, error = %e, "libvirt call failed");
        e
    }

    async fn observe_one(&self, link: &HostLink, name: &str) -> Result<Observed, BoxError> {
        let op = link.open().await?;
        let name = name.to_string();
        let obs: Result<Observed, String> = op
            .call("reading domain", Request::ReadDomain { name })
            .await?;
        let mut obs = obs.map_err(|why| -> BoxError {
            Box::new(Tagged::permanent(format!(
                "domain metadata does not parse: {why}"
            )))
        })?;
        // libvirt found no address for a running domain: the host's whole
        // neighbour table may know it (`neighbours.rs`).
        if obs.ip.is_empty() && !obs.macs.is_empty() {
            if let Some(ip) = neighbours::lookup(link, &obs.macs).await {
                obs.ip = ip;
            }
        }
        Ok(obs)
    }

    async fn delete_on(&self, link: &HostLink, name: &str) -> Result<(), BoxError> {
        let op = link.open().await?;
        let (name, pool) = (name.to_string(), link.host.pool.clone());
        op.call::<()>("deleting domain", Request::DeleteDomain { name, pool })
            .await?;
        Ok(())
    }

    async fn list_host(&self, link: &HostLink) -> Result<Vec<Instance>, BoxError> {
        let op = link.open().await?;
        let host = link.host.name.clone();
        let found: Vec<(String, Observed)> =
            op.call("listing domains", Request::ListManaged).await?;
        Ok(found
            .into_iter()
            .map(|(name, obs)| self.inner.instance(provider_id(&host, &name), obs))
            .collect())
    }
}

#[async_trait]
impl Provider for KvmProvider {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn provider_type(&self) -> ProviderType {
        ProviderType::Kvm
    }

    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        let r = placement::resolve(&self.inner.cfg, &req.placement)
            .map_err(|m| self.err(Op::Create, "", Tagged::permanent(m)))?;
        let link = &self.inner.links[r.host];
        let id = provider_id(&link.host.name, &req.name);
        // A background create of this name for another Proxy would be
        // joined below, adopting its domain without the UID check.
        if let Some(p) = self.inner.pending.provisioning(&req.name) {
            if p.uid != req.uid {
                let why = format!(
                    "domain {} on host {} is being created for UID {:?}, not this Proxy's {:?}",
                    req.name, link.host.name, p.uid, req.uid
                );
                return Err(self.err(Op::Create, &id, Tagged::permanent(why)));
            }
        }
        let mut state = self.start_create(link, r.machine_type, &r.image, req, &id);
        let finished = tokio::time::timeout(
            self.inner.create_wait,
            state.wait_for(|s| *s != JobState::Running),
        )
        .await
        .map(|r| r.map(|s| *s));
        match finished {
            Err(_) => {
                info!(id = %id, wait = ?self.inner.create_wait, "KVM create still running (first image download?); it goes on in the background");
                Ok(id)
            }
            Ok(Ok(_)) => match self.inner.pending.take_finished(&req.name) {
                Some(Outcome::Failed(e)) => Err(e),
                _ => {
                    debug!(id = %id, "KVM domain ensured running");
                    Ok(id)
                }
            },
            Ok(Err(_)) => {
                self.inner.pending.forget(&req.name);
                Err(ProviderError::new(
                    ErrorClass::Transient,
                    Op::Create,
                    &self.inner.name,
                    &id,
                    "the create was cancelled",
                ))
            }
        }
    }

    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        let r = DomainRef::parse(id).map_err(|m| self.err(Op::Get, id, Tagged::permanent(m)))?;
        let link = self.link(&r.host).ok_or_else(|| {
            self.err(
                Op::Get,
                id,
                Tagged::permanent(format!("host {:?} is not in kvm.hosts", r.host)),
            )
        })?;
        match self.inner.pending.take_finished(&r.name) {
            Some(Outcome::Running) => {
                if let Some(p) = self.inner.pending.provisioning(&r.name) {
                    return Ok(Instance {
                        uid: p.uid,
                        installation_id: p.installation,
                        created_at: Some(p.started),
                        ..Instance::new(r.id(), InstanceState::Provisioning)
                    });
                }
            }
            // Reported once; the next get sees what the host has. It is the
            // create's failure (it may latch), not the get's.
            Some(Outcome::Failed(e)) => {
                return Err(ProviderError::wrap(
                    e.class(),
                    Op::Create,
                    &self.inner.name,
                    id,
                    e,
                ))
            }
            Some(Outcome::Done) | None => {}
        }
        let span = info_span!("kvm.get", host = %r.host, name = %r.name);
        let obs = self
            .observe_one(link, &r.name)
            .instrument(span)
            .await
            .map_err(|e| self.err(Op::Get, id, e))?;
        let inst = self.inner.instance(r.id(), obs);
        debug!(id, state = ?inst.state, ip = %inst.ip, uid = %inst.uid, "KVM domain fetched");
        Ok(inst)
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let r = DomainRef::parse(id).map_err(|m| self.err(Op::Delete, id, Tagged::permanent(m)))?;
        // A host that left the config may still run the domain: never
        // report it deleted, so the Proxy keeps its finalizer and says why.
        let Some(link) = self.link(&r.host) else {
            let message = format!(
                "host {:?} is no longer in kvm.hosts, so its domain may still run there: put the host back in the providers config to delete it",
                r.host
            );
            return Err(self.err(Op::Delete, id, Tagged::permanent(message)));
        };
        // A create still running is stopped first, so it cannot define the
        // domain after the delete removed it.
        if self.inner.pending.cancel(&r.name).await {
            debug!(id, "background create cancelled");
        }
        let span = info_span!("kvm.delete", host = %r.host, name = %r.name);
        self.delete_on(link, &r.name)
            .instrument(span)
            .await
            .map_err(|e| self.err(Op::Delete, id, e))?;
        debug!(id, "KVM domain deleted");
        Ok(())
    }

    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        let mut listing = Listing::default();
        for link in &self.inner.links {
            let span = info_span!("kvm.list", host = %link.host.name);
            let found = self.list_host(link).instrument(span).await.map_err(|e| {
                self.err(
                    Op::List,
                    "",
                    HostFailed {
                        host: link.host.name.clone(),
                        source: e,
                    },
                )
            })?;
            listing.instances.extend(found);
        }
        debug!(
            hosts = self.inner.links.len(),
            managed = listing.instances.len(),
            "KVM domains listed"
        );
        Ok(listing)
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

/// A host that could not be listed fails the whole sweep.
#[derive(Debug, thiserror::Error)]
#[error("listing host {host}: {source}")]
struct HostFailed {
    host: String,
    #[source]
    source: BoxError,
}

#[async_trait]
impl Checker for KvmProvider {
    async fn check(&self) -> Vec<TargetStatus> {
        let timeout = self.inner.check_timeout;
        let checks = self
            .inner
            .links
            .iter()
            .map(|l| check::check_host(l.clone(), timeout));
        futures::future::join_all(checks).await
    }
}
