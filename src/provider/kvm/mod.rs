//! The `kvm` provider: proxy VMs on libvirt/KVM hypervisors reached over
//! SSH (kvm.md, docs/kvm-provider.md).
//!
//! Each host is reached through one SSH session ([`conn::HostLink`]); each
//! operation opens its own libvirt connection through its own forwarded
//! channel, so cancelling one operation never cuts off another. All libvirt
//! calls block and run on the blocking pool, bounded per host.

pub mod classify;
pub mod conn;
pub mod ids;
pub mod image;
pub mod iso;
pub mod seed;
pub mod ssh;
pub mod xml;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use tokio::sync::OnceCell;
use tracing::{debug, info, info_span, warn, Instrument};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_vol::StorageVol;
use virt::sys;

use self::classify::{code, code_of, domain_of};
use self::conn::{rpc, HostLink, LinkError, OpConn};
use self::ids::{overlay_volume, provider_id, seed_volume, DomainRef};
use self::image::{delete_if_exists, ensure_base, upload_small, ImageSource};
use self::ssh::{SshSettings, Stage};
use self::xml::{domain_xml, parse_mark, volume_xml, DomainSpec, Mark, METADATA_URI};
use crate::api::Placement;
use crate::config::{Firmware, ImageFormat, KvmConfig, MachineType};
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
    pending: Mutex<HashMap<String, Pending>>,
    /// How long `create` waits for its background work before it returns
    /// the ID with the work still going (kvm.md §11 gap 2).
    create_wait: Duration,
}

/// How a background create stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobState {
    Running,
    Done,
    Failed,
}

/// What a finished background create left to report.
enum Outcome {
    Running,
    Done,
    Failed(ProviderError),
}

/// A create that outlives its `create` call: the first download of an
/// image on a host can take minutes, which must not hold a reconcile
/// worker. `get` reports it as Provisioning and `delete` cancels it.
struct Pending {
    uid: String,
    installation: String,
    started: chrono::DateTime<Utc>,
    state: tokio::sync::watch::Receiver<JobState>,
    /// Set by the task before it reports `Failed`.
    error: Arc<Mutex<Option<ProviderError>>>,
    task: tokio::task::JoinHandle<()>,
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

/// What Get and ListByTag learn about a domain.
struct Observed {
    mark: Option<Mark>,
    state: u32,
    ip: String,
}

/// libvirt domain states (virDomainState).
mod dstate {
    use virt::sys;

    pub const NOSTATE: u32 = sys::VIR_DOMAIN_NOSTATE;
    pub const RUNNING: u32 = sys::VIR_DOMAIN_RUNNING;
    pub const BLOCKED: u32 = sys::VIR_DOMAIN_BLOCKED;
}

/// Maps a libvirt state and address to the provider state (kvm.md §6).
pub fn map_state(state: u32, ip: &str) -> InstanceState {
    match state {
        dstate::NOSTATE => InstanceState::Provisioning,
        dstate::RUNNING | dstate::BLOCKED if !ip.is_empty() => InstanceState::Running,
        dstate::RUNNING | dstate::BLOCKED => InstanceState::Provisioning,
        _ => InstanceState::Stopped,
    }
}

/// The first usable IPv4 address from one address source's answer.
pub fn pick_ipv4(ifaces: &[(String, Vec<(i64, String)>)]) -> Option<String> {
    for (_, addrs) in ifaces {
        for (kind, addr) in addrs {
            if *kind != sys::VIR_IP_ADDR_TYPE_IPV4 as i64 {
                continue;
            }
            let Ok(ip) = addr.parse::<std::net::Ipv4Addr>() else {
                continue;
            };
            if ip.is_loopback() || ip.is_link_local() || ip.is_unspecified() {
                continue;
            }
            return Some(ip.to_string());
        }
    }
    None
}

/// The domain's mark: `Ok(None)` when it has none (not ours),
/// `Ok(Some(Err(_)))` when it does not parse.
type MarkRead = Option<Result<Mark, String>>;

fn read_mark(d: &Domain) -> Result<MarkRead, virt::error::Error> {
    match rpc("virDomainGetMetadata", || {
        d.metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(METADATA_URI),
            0,
        )
    }) {
        Ok(x) => Ok(Some(parse_mark(&x))),
        Err(e) if code_of(&e) == code::NO_DOMAIN_METADATA => Ok(None),
        Err(e) => Err(e),
    }
}

fn address_of(d: &Domain) -> String {
    // Only the domain's own NICs count (a bridge inside the guest must not
    // win); without the XML every interface counts.
    let macs = rpc("virDomainGetXMLDesc", || d.xml_desc(0))
        .map(|x| xml::interface_macs(&x))
        .unwrap_or_default();
    // Lease (libvirt networks), ARP, then the guest agent; errors mean "no
    // address yet", never a failure.
    for (source, name) in [
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
            "virDomainInterfaceAddresses(lease)",
        ),
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            "virDomainInterfaceAddresses(arp)",
        ),
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
            "virDomainInterfaceAddresses(agent)",
        ),
    ] {
        if let Ok(ifaces) = rpc(name, || d.interface_addresses(source, 0)) {
            let view: Vec<(String, Vec<(i64, String)>)> = ifaces
                .into_iter()
                .filter(|i| own_nic(&macs, i.hwaddr.as_deref()))
                .map(|i| {
                    (
                        i.name,
                        i.addrs.into_iter().map(|a| (a.typed, a.addr)).collect(),
                    )
                })
                .collect();
            if let Some(ip) = pick_ipv4(&view) {
                return ip;
            }
        }
    }
    String::new()
}

/// Whether an interface with `hwaddr` belongs to the domain's NICs `macs`.
pub fn own_nic(macs: &[String], hwaddr: Option<&str>) -> bool {
    match hwaddr {
        Some(h) if !macs.is_empty() => macs.iter().any(|m| m.eq_ignore_ascii_case(h)),
        _ => true,
    }
}

fn observe(d: &Domain, mark: Option<Mark>) -> Result<Observed, virt::error::Error> {
    let info = rpc("virDomainGetInfo", || d.info())?;
    let state = info.state.to_raw();
    let ip = if state == dstate::RUNNING || state == dstate::BLOCKED {
        address_of(d)
    } else {
        String::new()
    };
    Ok(Observed { mark, state, ip })
}

fn ensure_running(d: &Domain) -> Result<(), virt::error::Error> {
    let info = rpc("virDomainGetInfo", || d.info())?;
    let state = info.state.to_raw();
    if state == dstate::RUNNING || state == dstate::BLOCKED {
        return Ok(());
    }
    match rpc("virDomainCreate", || d.create()) {
        Ok(()) => {
            debug!("domain started");
            Ok(())
        }
        Err(e) if code_of(&e) == code::OPERATION_INVALID => {
            debug!("domain already running, start treated as success");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn lookup_domain(c: &Connect, name: &str) -> Result<Option<Domain>, virt::error::Error> {
    match rpc("virDomainLookupByName", || c.lookup_domain_by_name(name)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if code_of(&e) == code::NO_DOMAIN => Ok(None),
        Err(e) => Err(e),
    }
}

/// Outcome of the first Create step.
enum Existing {
    /// The domain exists, carries the UID and runs.
    Done,
    /// The domain exists with another (or no) UID.
    Foreign(String),
    /// No domain; the pool is active.
    Build,
    /// The pool exists but is not running.
    PoolInactive(u32),
}

fn pool_state_word(s: u32) -> String {
    match s {
        sys::VIR_STORAGE_POOL_INACTIVE => "inactive".into(),
        sys::VIR_STORAGE_POOL_BUILDING => "building".into(),
        sys::VIR_STORAGE_POOL_RUNNING => "running".into(),
        sys::VIR_STORAGE_POOL_DEGRADED => "degraded".into(),
        sys::VIR_STORAGE_POOL_INACCESSIBLE => "inaccessible".into(),
        n => format!("state {n}"),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1}GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl KvmProvider {
    /// Builds the provider from a validated config block. Never dials and
    /// never reads the SSH material (a missing key only fails kvm calls).
    pub fn new(name: &str, cfg: &KvmConfig) -> Result<Self, String> {
        if cfg.hosts.is_empty() {
            return Err("kvm.hosts must list at least one host".into());
        }
        virt::error::clear_error_callback();
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
                pending: Mutex::new(HashMap::new()),
                create_wait: DEFAULT_CREATE_WAIT,
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

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        // A poisoned map only means a panic between two plain map calls.
        self.inner.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state of the background create of `name`, if any; a finished one
    /// is forgotten as it is reported.
    fn take_finished(&self, name: &str) -> Option<Outcome> {
        let mut m = self.pending();
        let state = *m.get(name)?.state.borrow();
        match state {
            JobState::Running => Some(Outcome::Running),
            JobState::Done => {
                m.remove(name);
                Some(Outcome::Done)
            }
            JobState::Failed => {
                let job = m.remove(name)?;
                let error = job.error.lock().unwrap_or_else(|p| p.into_inner()).take();
                Some(error.map_or(Outcome::Done, Outcome::Failed))
            }
        }
    }

    /// Starts `create_on` in the background unless it already runs for
    /// this name; returns a receiver of its state.
    fn start_create(
        &self,
        link: &Arc<HostLink>,
        mt: &MachineType,
        img: &ImageSource,
        req: &CreateRequest,
        id: &str,
    ) -> tokio::sync::watch::Receiver<JobState> {
        let mut m = self.pending();
        if let Some(p) = m.get(&req.name) {
            return p.state.clone();
        }
        let (tx, rx) = tokio::sync::watch::channel(JobState::Running);
        let error = Arc::new(Mutex::new(None));
        let slot = error.clone();
        let (this, link, mt, img, req2, id2) = (
            self.clone(),
            link.clone(),
            mt.clone(),
            img.clone(),
            req.clone(),
            id.to_string(),
        );
        let span = info_span!("kvm.create", host = %link.host.name, name = %req.name);
        let task = tokio::spawn(
            async move {
                let state = match this.create_on(&link, &mt, &img, &req2).await {
                    Ok(()) => JobState::Done,
                    Err(e) => {
                        let mut e = this.err(Op::Create, &id2, e);
                        // Something vanishing mid-create is worth a retry,
                        // not a "gone" verdict.
                        if e.is(ErrorClass::NotFound) {
                            e = ProviderError::wrap(
                                ErrorClass::Transient,
                                Op::Create,
                                &this.inner.name,
                                &id2,
                                Tagged::new(ErrorClass::Transient, e.to_string()),
                            );
                        }
                        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        JobState::Failed
                    }
                };
                let _ = tx.send(state);
            }
            .instrument(span),
        );
        m.insert(
            req.name.clone(),
            Pending {
                uid: req.uid.clone(),
                installation: req.installation_id.clone(),
                started: Utc::now(),
                state: rx.clone(),
                error,
                task,
            },
        );
        rx
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

    fn link(&self, host: &str) -> Option<&Arc<HostLink>> {
        self.inner.links.iter().find(|l| l.host.name == host)
    }

    fn err(&self, op: Op, id: &str, cause: impl Into<BoxError>) -> ProviderError {
        let e = ProviderError::classify_with(op, &self.inner.name, id, cause, classify::classify);
        debug!(provider = %self.inner.name, op = op.as_str(), id, error = %e, "libvirt call failed");
        e
    }

    /// Resolves host, machine type and image (kvm.md §2.4): Permanent
    /// errors naming the field, before any host is contacted.
    fn resolve(
        &self,
        p: &Placement,
    ) -> Result<(&Arc<HostLink>, &MachineType, ImageSource), String> {
        let links = &self.inner.links;
        let link = if p.zone.is_empty() {
            match links.len() {
                0 => return Err("kvm.hosts is empty".into()),
                1 => &links[0],
                _ => {
                    return Err(
                        "placement.zone is required when kvm.hosts lists more than one host".into(),
                    )
                }
            }
        } else {
            self.link(&p.zone)
                .ok_or_else(|| format!("host {:?} is not in kvm.hosts", p.zone))?
        };
        let mt = self
            .inner
            .cfg
            .machine_types
            .get(&p.machine_type)
            .ok_or_else(|| {
                format!(
                    "placement.machineType {:?} is not in kvm.machineTypes",
                    p.machine_type
                )
            })?;
        let img = if let Some(i) = self.inner.cfg.images.get(&p.image) {
            ImageSource {
                label: p.image.clone(),
                url: i.url.clone(),
                sha256: i.sha256.as_ref().map(|s| s.to_ascii_lowercase()),
                format: i.image_format(),
                firmware: i.image_firmware(),
                base_volume: ids::base_volume_for_key(&p.image, i.image_format()),
            }
        } else if crate::config::http_url(&p.image).is_ok() {
            ImageSource {
                label: p.image.clone(),
                url: p.image.clone(),
                sha256: None,
                format: ImageFormat::Qcow2,
                firmware: Firmware::Uefi,
                base_volume: ids::base_volume_for_url(&p.image, ImageFormat::Qcow2),
            }
        } else {
            return Err(format!(
                "placement.image {:?} is neither a key in kvm.images nor an http(s) URL",
                p.image
            ));
        };
        Ok((link, mt, img))
    }

    fn image_lock(&self, host: &str, base: &str) -> ImageLock {
        // A poisoned map only means a panic between get and insert of a
        // plain HashMap; the map is still consistent.
        let mut m = self
            .inner
            .image_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        m.entry((host.to_string(), base.to_string()))
            .or_default()
            .clone()
    }

    async fn http(&self) -> Result<&reqwest::Client, BoxError> {
        self.inner
            .http
            .get_or_try_init(|| async {
                // The process installs ring as the rustls provider; make sure
                // one is there when this runs first (tests, tools).
                let _ = rustls::crypto::ring::default_provider().install_default();
                reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| -> BoxError { format!("building the HTTP client: {e}").into() })
            })
            .await
    }

    async fn create_on(
        &self,
        link: &HostLink,
        mt: &MachineType,
        img: &ImageSource,
        req: &CreateRequest,
    ) -> Result<(), BoxError> {
        let host = &link.host;
        debug!(pool = %host.pool, bridge = %host.bridge, vcpus = mt.vcpus, memory_mib = mt.memory_mib, image = %img.base_volume, cloud_init_bytes = req.cloud_init.len(), "KVM create resolved");
        let op = link.open().await?;

        // 1. Existing domain? Else is the pool usable?
        let (name, uid, pool) = (req.name.clone(), req.uid.clone(), host.pool.clone());
        let first = op
            .call("looking up domain", move |c| {
                if let Some(d) = lookup_domain(c, &name)? {
                    let got = match read_mark(&d)? {
                        Some(Ok(m)) => m.uid,
                        _ => String::new(),
                    };
                    if got != uid {
                        return Ok(Existing::Foreign(got));
                    }
                    ensure_running(&d)?;
                    return Ok(Existing::Done);
                }
                let p = rpc("virStoragePoolLookupByName", || {
                    c.lookup_storage_pool_by_name(&pool)
                })?;
                let info = rpc("virStoragePoolGetInfo", || p.info())?;
                if info.state != sys::VIR_STORAGE_POOL_RUNNING {
                    return Ok(Existing::PoolInactive(info.state));
                }
                Ok(Existing::Build)
            })
            .await?;
        match first {
            Existing::Done => {
                debug!("domain already defined");
                return Ok(());
            }
            Existing::Foreign(got) => {
                return Err(Tagged::permanent(format!(
                    "domain {} on host {} carries UID {got:?}, not this Proxy's {:?}",
                    req.name, host.name, req.uid
                ))
                .into())
            }
            Existing::PoolInactive(s) => {
                return Err(Tagged::new(
                    ErrorClass::Transient,
                    format!("storage pool {:?} is {}", host.pool, pool_state_word(s)),
                )
                .into())
            }
            Existing::Build => {}
        }

        // 2. Base image, once per (host, volume).
        let lock = self.image_lock(&host.name, &img.base_volume);
        let base_path = {
            let _held = lock.lock().await;
            let http = self.http().await?;
            ensure_base(&op, http, &host.pool, img).await?
        };

        // 3. Overlay, seed, define, start.
        let user_data = req.cloud_init.expose().to_string();
        let vendor = seed::vendor_data(
            self.inner.cfg.installs_guest_agent(),
            &self.inner.cfg.vendor_data,
        );
        let iso = seed::seed_iso(&req.name, &user_data, &vendor, Utc::now())
            .map_err(|e| Tagged::permanent(format!("building the seed ISO: {e}")))?;
        drop(user_data);
        let capacity = (self.inner.cfg.disk_size_gb_or_default() as u64) << 30;
        let (name, uid, inst, pool, bridge) = (
            req.name.clone(),
            req.uid.clone(),
            req.installation_id.clone(),
            host.pool.clone(),
            host.bridge.clone(),
        );
        let (base_fmt, firmware, dtype, mem, vcpus) = (
            img.format,
            img.firmware,
            host.domain_type,
            mt.memory_mib,
            mt.vcpus,
        );
        op.call("building the domain", move |c| {
            let p = rpc("virStoragePoolLookupByName", || {
                c.lookup_storage_pool_by_name(&pool)
            })?;
            let ov_name = overlay_volume(&name);
            let ov_xml = volume_xml(
                &ov_name,
                capacity,
                ImageFormat::Qcow2,
                Some((&base_path, base_fmt)),
            );
            let overlay = match rpc("virStorageVolCreateXML", || {
                StorageVol::create_xml(&p, &ov_xml, 0)
            }) {
                Ok(v) => {
                    debug!(volume = %ov_name, "overlay volume created");
                    v
                }
                Err(e) if code_of(&e) == code::STORAGE_VOL_EXIST => {
                    debug!(volume = %ov_name, "overlay volume already exists");
                    let v = rpc("virStorageVolLookupByName", || {
                        p.lookup_storage_vol_by_name(&ov_name)
                    })?;
                    let vx = rpc("virStorageVolGetXMLDesc", || v.xml_desc(0))?;
                    if xml::backing_path(&vx).as_deref() == Some(base_path.as_str()) {
                        v
                    } else {
                        // No domain uses it yet: rebuild it on the right base.
                        debug!(volume = %ov_name, "overlay backed by another image, recreating");
                        rpc("virStorageVolDelete", || v.delete(0))?;
                        rpc("virStorageVolCreateXML", || {
                            StorageVol::create_xml(&p, &ov_xml, 0)
                        })?
                    }
                }
                Err(e) => return Err(e),
            };
            let seed_name = seed_volume(&name);
            delete_if_exists(&p, &seed_name)?;
            upload_small(c, &pool, &seed_name, &iso)?;
            debug!(volume = %seed_name, bytes = iso.len(), "seed volume uploaded");
            let seed = rpc("virStorageVolLookupByName", || {
                p.lookup_storage_vol_by_name(&seed_name)
            })?;
            let overlay_path = rpc("virStorageVolGetPath", || overlay.path())?;
            let seed_path = rpc("virStorageVolGetPath", || seed.path())?;
            let dx = domain_xml(&DomainSpec {
                name: &name,
                uid: &uid,
                installation: &inst,
                created_at: Utc::now(),
                memory_mib: mem,
                vcpus,
                firmware,
                domain_type: dtype,
                overlay_path: &overlay_path,
                seed_path: &seed_path,
                bridge: &bridge,
            });
            let d = rpc("virDomainDefineXML", || c.define_domain_xml(&dx))?;
            debug!(uid = %uid, "domain defined");
            ensure_running(&d)
        })
        .await?;
        Ok(())
    }

    async fn observe_one(&self, link: &HostLink, name: &str) -> Result<Observed, BoxError> {
        let op = link.open().await?;
        let name = name.to_string();
        let obs = op
            .call("reading domain", move |c| {
                let d = rpc("virDomainLookupByName", || c.lookup_domain_by_name(&name))?;
                match read_mark(&d)? {
                    Some(Err(why)) => Ok(Err(why)),
                    Some(Ok(mark)) => observe(&d, Some(mark)).map(Ok),
                    None => observe(&d, None).map(Ok),
                }
            })
            .await?;
        obs.map_err(|why| -> BoxError {
            Box::new(Tagged::permanent(format!(
                "domain metadata does not parse: {why}"
            )))
        })
    }

    async fn delete_on(&self, link: &HostLink, name: &str) -> Result<(), BoxError> {
        let op: OpConn = link.open().await?;
        let (name, pool) = (name.to_string(), link.host.pool.clone());
        op.call("deleting domain", move |c| {
            if let Some(d) = lookup_domain(c, &name)? {
                match rpc("virDomainDestroy", || d.destroy()) {
                    Ok(()) => debug!("domain destroyed"),
                    Err(e) if code_of(&e) == code::OPERATION_INVALID => {
                        debug!("domain not running, destroy skipped")
                    }
                    Err(e) if code_of(&e) == code::NO_DOMAIN => {}
                    Err(e) => return Err(e),
                }
                match rpc("virDomainUndefineFlags", || {
                    d.undefine_flags(
                        sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                            | sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                            | sys::VIR_DOMAIN_UNDEFINE_NVRAM,
                    )
                }) {
                    Ok(()) => {}
                    Err(e) if code_of(&e) == code::NO_DOMAIN => {}
                    Err(e) => return Err(e),
                }
            } else {
                debug!("domain already gone");
            }
            let p = match rpc("virStoragePoolLookupByName", || {
                c.lookup_storage_pool_by_name(&pool)
            }) {
                Ok(p) => p,
                Err(e) if code_of(&e) == code::NO_STORAGE_POOL => {
                    info!(pool = %pool, "pool not found, no volumes to delete");
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            delete_if_exists(&p, &overlay_volume(&name))?;
            delete_if_exists(&p, &seed_volume(&name))?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    async fn list_host(&self, link: &HostLink) -> Result<Vec<Instance>, BoxError> {
        let op = link.open().await?;
        let host = link.host.name.clone();
        let found = op
            .call("listing domains", move |c| {
                let doms = rpc("virConnectListAllDomains", || c.list_all_domains(0))?;
                let mut out = Vec::new();
                for d in doms {
                    let Ok(name) = d.name() else { continue };
                    let mark = match read_mark(&d) {
                        Ok(Some(Ok(m))) if m.managed => m,
                        Ok(Some(Err(why))) => {
                            debug!(domain = %name, error = %why, "skipping domain with unreadable metadata");
                            continue;
                        }
                        Ok(_) => continue,
                        Err(e) => {
                            debug!(domain = %name, error = %e.message(), "skipping domain with unreadable metadata");
                            continue;
                        }
                    };
                    let Ok(obs) = observe(&d, Some(mark)) else { continue };
                    out.push((name, obs));
                }
                Ok(out)
            })
            .await?;
        Ok(found
            .into_iter()
            .map(|(name, obs)| to_instance(provider_id(&host, &name), obs))
            .collect())
    }

    async fn check_host(&self, link: Arc<HostLink>) -> TargetStatus {
        let started = Instant::now();
        let host = &link.host;
        let mut details = BTreeMap::new();
        details.insert("user".to_string(), host.user.clone());
        details.insert("pool".to_string(), host.pool.clone());
        let probe = async {
            let op = link.open().await?;
            let pool = host.pool.clone();
            op.call("checking host", move |c| {
                let version = rpc("virConnectGetLibVersion", || c.lib_version())?;
                let hostname = rpc("virConnectGetHostname", || c.hostname())?;
                let p = rpc("virStoragePoolLookupByName", || {
                    c.lookup_storage_pool_by_name(&pool)
                })?;
                let info = rpc("virStoragePoolGetInfo", || p.info())?;
                Ok((version, hostname, info))
            })
            .await
        };
        let (ready, reason, message) =
            match tokio::time::timeout(self.inner.check_timeout, probe).await {
                Err(_) => (
                    false,
                    "Timeout",
                    format!("no answer within {:?}", self.inner.check_timeout),
                ),
                Ok(Err(e)) => {
                    let reason = match &e {
                        LinkError::Dial { source, .. } => match source.stage {
                            Stage::Material => "SSHMaterialUnavailable",
                            Stage::Tcp => "Unreachable",
                            Stage::Handshake => "SSHHandshakeFailed",
                            Stage::LibvirtConnect => "LibvirtConnectFailed",
                        },
                        LinkError::Libvirt { source, .. } => {
                            if code_of(source) == code::NO_STORAGE_POOL {
                                "PoolNotFound"
                            } else if domain_of(source) == code::FROM_RPC {
                                "Unreachable"
                            } else {
                                "LibvirtError"
                            }
                        }
                        LinkError::TimedOut(_) => "Timeout",
                        LinkError::Aborted(_) => "Unreachable",
                    };
                    let message = match &e {
                        LinkError::Libvirt { source, .. } => source.message().to_string(),
                        other => other.to_string(),
                    };
                    (false, reason, message)
                }
                Ok(Ok((version, hostname, info))) => {
                    details.insert("hostname".into(), hostname);
                    details.insert(
                        "libvirtVersion".into(),
                        format!(
                            "{}.{}.{}",
                            version / 1_000_000,
                            version / 1000 % 1000,
                            version % 1000
                        ),
                    );
                    details.insert("poolState".into(), pool_state_word(info.state));
                    details.insert("poolCapacity".into(), gib(info.capacity));
                    details.insert("poolAvailable".into(), gib(info.available));
                    if info.state == sys::VIR_STORAGE_POOL_RUNNING {
                        (true, "Reachable", String::new())
                    } else {
                        (
                            false,
                            "PoolNotActive",
                            format!(
                                "storage pool {:?} is {}",
                                host.pool,
                                pool_state_word(info.state)
                            ),
                        )
                    }
                }
            };
        TargetStatus {
            name: host.name.clone(),
            address: host.address.clone(),
            ready,
            reason: reason.to_string(),
            message,
            latency: started.elapsed(),
            details,
        }
    }
}

fn to_instance(id: String, obs: Observed) -> Instance {
    let mark = obs.mark.unwrap_or_default();
    Instance {
        id,
        state: map_state(obs.state, &obs.ip),
        ip: obs.ip,
        uid: mark.uid,
        installation_id: mark.installation,
        created_at: mark.created_at,
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
        let (link, mt, img) = self
            .resolve(&req.placement)
            .map_err(|m| self.err(Op::Create, "", Tagged::permanent(m)))?;
        let id = provider_id(&link.host.name, &req.name);
        let mut state = self.start_create(link, mt, &img, req, &id);
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
            Ok(Ok(_)) => match self.take_finished(&req.name) {
                Some(Outcome::Failed(e)) => Err(e),
                _ => {
                    debug!(id = %id, "KVM domain ensured running");
                    Ok(id)
                }
            },
            Ok(Err(_)) => {
                self.pending().remove(&req.name);
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
        match self.take_finished(&r.name) {
            Some(Outcome::Running) => {
                let m = self.pending();
                if let Some(p) = m.get(&r.name) {
                    return Ok(Instance {
                        uid: p.uid.clone(),
                        installation_id: p.installation.clone(),
                        created_at: Some(p.started),
                        ..Instance::new(r.id(), InstanceState::Provisioning)
                    });
                }
            }
            // Reported once; the next get sees what the host has.
            Some(Outcome::Failed(e)) => {
                return Err(ProviderError::wrap(
                    e.class(),
                    Op::Get,
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
        let inst = to_instance(r.id(), obs);
        debug!(id, state = ?inst.state, ip = %inst.ip, uid = %inst.uid, "KVM domain fetched");
        Ok(inst)
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let r = DomainRef::parse(id).map_err(|m| self.err(Op::Delete, id, Tagged::permanent(m)))?;
        let Some(link) = self.link(&r.host) else {
            info!(host = %r.host, id, "host is not configured; delete has nothing to clean up");
            return Ok(());
        };
        // A create still running is stopped first, so it cannot define the
        // domain after the delete removed it.
        let job = self.pending().remove(&r.name);
        if let Some(job) = job {
            job.task.abort();
            let _ = job.task.await;
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
        let checks = self.inner.links.iter().map(|l| self.check_host(l.clone()));
        futures::future::join_all(checks).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_table() {
        assert_eq!(map_state(0, ""), InstanceState::Provisioning);
        assert_eq!(map_state(1, "10.0.0.5"), InstanceState::Running);
        assert_eq!(map_state(2, "10.0.0.5"), InstanceState::Running);
        assert_eq!(map_state(1, ""), InstanceState::Provisioning);
        for s in 3..=9 {
            assert_eq!(map_state(s, "10.0.0.5"), InstanceState::Stopped, "{s}");
        }
    }

    #[test]
    fn address_selection() {
        let v = vec![
            ("lo".to_string(), vec![(0, "127.0.0.1".to_string())]),
            (
                "eth0".to_string(),
                vec![
                    (1, "fe80::1".to_string()),
                    (0, "169.254.3.3".to_string()),
                    (0, "192.168.1.50".to_string()),
                ],
            ),
        ];
        assert_eq!(pick_ipv4(&v).as_deref(), Some("192.168.1.50"));
        assert_eq!(pick_ipv4(&[]), None);
    }

    #[test]
    fn only_the_domains_own_nics_count() {
        let macs = vec!["52:54:00:aa:bb:cc".to_string()];
        assert!(own_nic(&macs, Some("52:54:00:AA:BB:CC")));
        assert!(!own_nic(&macs, Some("02:42:ac:11:00:02")));
        assert!(own_nic(&macs, None));
        assert!(own_nic(&[], Some("02:42:ac:11:00:02")));
    }

    #[test]
    fn words() {
        assert_eq!(pool_state_word(2), "running");
        assert_eq!(pool_state_word(7), "state 7");
        assert_eq!(gib(6 << 30), "6.0GiB");
    }
}
