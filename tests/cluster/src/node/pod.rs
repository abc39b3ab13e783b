//! The Pod worker: one task per Pod UID that creates the sandbox and the
//! volumes, runs init containers in order and then the containers (each in
//! its own supervisor task with probes and restarts), reports status, and
//! tears everything down when the Pod is deleted or the agent stops.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSecurityContext, PodSpec, Probe, SecurityContext,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::Api;
use tokio::sync::{watch, Notify};
use tracing::Instrument;

use super::cgroup::CgroupRoot;
use super::env::{self, FieldContext, ServiceEnv, Sources};
use super::exec::{program_hidden, ExecSpec, MountSpec, PROGRAM_DIR};
use super::net::PodNetwork;
use super::probe::{self, Action, Counter, Verdict};
use super::restart::{should_restart, Backoff};
use super::runtime::{self, Exit, Sandbox};
use super::status::{self, ContainerRecord, PodRecord, State, Transitions};
use super::volumes::PodVolumes;
use super::{image, quantity, ImageMapping};

/// What every Pod worker of a node shares.
pub struct Shared {
    pub client: kube::Client,
    pub node_name: String,
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub network: Arc<PodNetwork>,
    pub images: Vec<ImageMapping>,
    pub api_host: Ipv4Addr,
    pub api_port: u16,
    pub cgroups: CgroupRoot,
    pub shutting_down: AtomicBool,
}

/// Why a Pod's containers stop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stop {
    /// How long the processes get between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Whether to delete the API object afterwards (it got a
    /// deletionTimestamp), as opposed to it being gone already or the
    /// agent shutting down.
    pub delete: bool,
}

/// The agent's handle on a Pod worker.
pub struct Worker {
    pub pod: watch::Sender<Pod>,
    pub stop: watch::Sender<Option<Stop>>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the worker of a Pod.
pub fn spawn(shared: Arc<Shared>, pod: Pod) -> Worker {
    let (pod_tx, pod_rx) = watch::channel(pod.clone());
    let (stop_tx, stop_rx) = watch::channel(None);
    let span = tracing::info_span!(
        "pod",
        ns = pod.metadata.namespace.as_deref().unwrap_or_default(),
        name = pod.metadata.name.as_deref().unwrap_or_default(),
    );
    let task = tokio::spawn(run(shared, pod, pod_rx, stop_rx).instrument(span));
    Worker {
        pod: pod_tx,
        stop: stop_tx,
        task,
    }
}

/// One Pod's context, shared by its worker, container supervisors and
/// status writer.
struct PodCtx {
    shared: Arc<Shared>,
    pod: watch::Receiver<Pod>,
    spec: PodSpec,
    uid: String,
    name: String,
    namespace: String,
    rec: Mutex<PodRecord>,
    notify: Notify,
    stop: watch::Receiver<Option<Stop>>,
    sandbox_pid: Mutex<i32>,
    volumes: PodVolumes,
    pod_dir: PathBuf,
    log_dir: PathBuf,
}

impl PodCtx {
    fn update(&self, f: impl FnOnce(&mut PodRecord)) {
        {
            let mut rec = self.rec.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut rec);
        }
        self.notify.notify_one();
    }

    fn record(&self) -> PodRecord {
        self.rec.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn container(&self, which: Which, f: impl FnOnce(&mut ContainerRecord)) {
        self.update(|r| {
            let list = match which {
                Which::Init(_) => &mut r.init,
                Which::Main(_) => &mut r.containers,
            };
            if let Some(c) = list.get_mut(which.index()) {
                f(c);
            }
        });
    }

    fn stopping(&self) -> Option<Stop> {
        *self.stop.borrow()
    }

    /// Waits until the Pod is stopped (returns at once if it is).
    async fn stopped(&self) -> Stop {
        let mut rx = self.stop.clone();
        loop {
            if let Some(s) = *rx.borrow_and_update() {
                return s;
            }
            if rx.changed().await.is_err() {
                return Stop {
                    grace: Duration::ZERO,
                    delete: false,
                };
            }
        }
    }

    /// Sleeps `d` unless the Pod stops first; true when it stopped.
    async fn sleep_or_stop(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => self.stopping().is_some(),
            _ = self.stopped() => true,
        }
    }

    fn pod_ip(&self) -> Option<Ipv4Addr> {
        self.record().pod_ip
    }

    fn host_ip(&self) -> Ipv4Addr {
        self.shared.network.gateway()
    }
}

#[derive(Debug, Clone, Copy)]
enum Which {
    Init(usize),
    Main(usize),
}

impl Which {
    fn index(self) -> usize {
        match self {
            Which::Init(i) | Which::Main(i) => i,
        }
    }
}

/// The user, group and supplementary groups a container runs as
/// (container securityContext over the Pod's; root by default).
pub fn identity(
    pod: Option<&PodSecurityContext>,
    container: Option<&SecurityContext>,
) -> (u32, u32, Vec<u32>) {
    let pick = |c: Option<i64>, p: Option<i64>| c.or(p).and_then(|v| u32::try_from(v).ok());
    let uid = pick(
        container.and_then(|c| c.run_as_user),
        pod.and_then(|p| p.run_as_user),
    )
    .unwrap_or(0);
    let gid = pick(
        container.and_then(|c| c.run_as_group),
        pod.and_then(|p| p.run_as_group),
    )
    .unwrap_or(0);
    let mut groups: Vec<u32> = pod
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|g| u32::try_from(g).ok())
        .collect();
    if let Some(fs) = pod
        .and_then(|p| p.fs_group)
        .and_then(|g| u32::try_from(g).ok())
    {
        groups.push(fs);
    }
    groups.sort_unstable();
    groups.dedup();
    (uid, gid, groups)
}

/// The memory limit of a container in bytes, if it has one.
fn memory_limit(c: &Container) -> Result<Option<u64>, String> {
    let q = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"));
    match q {
        Some(q) => quantity::bytes(&q.0).map(Some).map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

/// The volume types kubelet always mounts read-only.
fn always_read_only(v: &k8s_openapi::api::core::v1::Volume) -> bool {
    v.config_map.is_some()
        || v.secret.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

async fn run(
    shared: Arc<Shared>,
    pod: Pod,
    pod_rx: watch::Receiver<Pod>,
    stop_rx: watch::Receiver<Option<Stop>>,
) {
    let Some(spec) = pod.spec.clone() else {
        return;
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let pod_dir = shared.dir.join("pods").join(&uid);
    let log_dir = shared
        .dir
        .join("pods")
        .join(format!("{namespace}_{name}_{uid}"));
    let all_containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let uids: Vec<u32> = all_containers
        .map(|c| identity(spec.security_context.as_ref(), c.security_context.as_ref()).0)
        .collect();
    let file_owner = match uids.first() {
        Some(first) if uids.iter().all(|u| u == first) => *first,
        _ => 0,
    };
    let fs_group = spec
        .security_context
        .as_ref()
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok());
    let record = PodRecord {
        init: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| ContainerRecord {
                sidecar: c.restart_policy.as_deref() == Some("Always"),
                state: State::waiting("PodInitializing", None),
                ..ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or_default())
            })
            .collect(),
        containers: spec
            .containers
            .iter()
            .map(|c| {
                let reason = if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
                    "PodInitializing"
                } else {
                    "ContainerCreating"
                };
                ContainerRecord {
                    state: State::waiting(reason, None),
                    ..ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or_default())
                }
            })
            .collect(),
        pod_ip: None,
        host_ip: shared.network.gateway(),
        start_time: Timestamp::now(),
        sandbox_ready: false,
        init_failed: false,
    };
    let ctx = Arc::new(PodCtx {
        volumes: PodVolumes::new(pod_dir.join("volumes"), file_owner, fs_group),
        shared,
        pod: pod_rx,
        spec,
        uid,
        name,
        namespace,
        rec: Mutex::new(record),
        notify: Notify::new(),
        stop: stop_rx,
        sandbox_pid: Mutex::new(0),
        pod_dir,
        log_dir,
    });
    let done = Arc::new(AtomicBool::new(false));
    let writer =
        tokio::spawn(status_loop(ctx.clone(), done.clone()).instrument(tracing::Span::current()));
    let already_terminal = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let mut sandbox = None;
    if already_terminal {
        // Finished before this agent saw it (an agent restart): nothing runs.
        done.store(true, Ordering::SeqCst);
    } else {
        tracing::info!("starting pod");
        sandbox = run_pod(&ctx).await;
    }
    let stop = ctx.stopped().await;
    tracing::info!(grace = ?stop.grace, "tearing down pod");
    if let Some(mut s) = sandbox {
        s.stop().await;
    }
    if let Err(e) = tokio::fs::remove_dir_all(&ctx.pod_dir).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("removing {}: {e}", ctx.pod_dir.display());
        }
    }
    ctx.update(|r| r.sandbox_ready = false);
    done.store(true, Ordering::SeqCst);
    ctx.notify.notify_one();
    let _ = writer.await;
    if stop.delete && !ctx.shared.shutting_down.load(Ordering::SeqCst) {
        let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(ctx.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&ctx.name, &dp).await {
            Ok(_) => tracing::info!("pod deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => tracing::warn!("deleting the pod: {e}"),
        }
    }
}

/// Runs the Pod until all its containers are done for good or it stops;
/// returns the sandbox (still up when the Pod is stopping, so the
/// containers' teardown can finish).
async fn run_pod(ctx: &Arc<PodCtx>) -> Option<Sandbox> {
    let host_network = ctx.spec.host_network == Some(true);
    let mut sandbox = loop {
        let hostname = ctx
            .spec
            .hostname
            .clone()
            .unwrap_or_else(|| ctx.name.clone());
        match Sandbox::start(
            &ctx.shared.exe,
            &hostname,
            host_network,
            ctx.shared.network.clone(),
        )
        .await
        {
            Ok(s) => break s,
            Err(e) => {
                let msg = format!("creating the pod sandbox: {e:#}");
                tracing::warn!("{msg}");
                ctx.update(|r| set_waiting_all(r, "ContainerCreating", &msg));
                if ctx.sleep_or_stop(Duration::from_secs(5)).await {
                    return None;
                }
            }
        }
    };
    *ctx.sandbox_pid.lock().unwrap_or_else(|p| p.into_inner()) = sandbox.pid();
    let ip = sandbox.ip;
    ctx.update(|r| {
        r.pod_ip = Some(ip);
        r.sandbox_ready = true;
    });
    tracing::info!(%ip, "sandbox ready");
    // Volumes, retried until they can be set up.
    loop {
        let pod = ctx.pod.borrow().clone();
        let fields = FieldContext {
            pod: &pod,
            pod_ip: Some(ip),
            host_ip: ctx.host_ip(),
        };
        match ctx.volumes.sync(&ctx.shared.client, &pod, &fields).await {
            Ok(()) => break,
            Err(msg) => {
                tracing::warn!("{msg}");
                ctx.update(|r| set_waiting_all(r, "ContainerCreating", &msg));
                if ctx.sleep_or_stop(Duration::from_secs(3)).await {
                    return Some(sandbox);
                }
            }
        }
    }
    let _ = tokio::fs::create_dir_all(&ctx.log_dir).await;
    let policy = ctx
        .spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let mut sidecars = Vec::new();
    for (i, c) in ctx.spec.init_containers.iter().flatten().enumerate() {
        if c.restart_policy.as_deref() == Some("Always") {
            let task_ctx = ctx.clone();
            sidecars.push(tokio::spawn(
                async move { supervise(task_ctx, Which::Init(i), "Always".into()).await }
                    .instrument(tracing::Span::current()),
            ));
            // The next init container starts once the sidecar has started.
            while !ctx.record().init.get(i).is_some_and(|c| c.started) {
                if ctx.sleep_or_stop(Duration::from_millis(200)).await {
                    return Some(sandbox);
                }
            }
            continue;
        }
        // Init containers restart on failure unless the Pod's policy is Never.
        let init_policy = if policy == "Never" {
            "Never"
        } else {
            "OnFailure"
        };
        match supervise(ctx.clone(), Which::Init(i), init_policy.into()).await {
            Outcome::Succeeded => {}
            Outcome::Failed => {
                ctx.update(|r| {
                    r.init_failed = true;
                    set_waiting_all(r, "PodInitializing", "");
                });
                tracing::info!(container = %c.name, "init container failed: pod failed");
                sandbox.stop().await;
                return None;
            }
            Outcome::Stopped => return Some(sandbox),
        }
    }
    let tasks: Vec<_> = (0..ctx.spec.containers.len())
        .map(|i| {
            let task_ctx = ctx.clone();
            let policy = policy.clone();
            tokio::spawn(
                async move { supervise(task_ctx, Which::Main(i), policy).await }
                    .instrument(tracing::Span::current()),
            )
        })
        .collect();
    let all = futures::future::join_all(tasks);
    tokio::pin!(all);
    loop {
        tokio::select! {
            _ = &mut all => break,
            _ = tokio::time::sleep(Duration::from_secs(10)) => {
                // Refresh ConfigMap, Secret, projected and downward-API volumes.
                let pod = ctx.pod.borrow().clone();
                let fields = FieldContext { pod: &pod, pod_ip: Some(ip), host_ip: ctx.host_ip() };
                if let Err(msg) = ctx.volumes.sync(&ctx.shared.client, &pod, &fields).await {
                    tracing::warn!("refreshing volumes: {msg}");
                }
            }
        }
    }
    if ctx.stopping().is_some() {
        // Sidecars stop with the Pod.
        futures::future::join_all(sidecars).await;
        return Some(sandbox);
    }
    // Every container is done for good: stop sidecars, free the sandbox.
    tracing::info!("pod finished");
    for s in &sidecars {
        s.abort();
    }
    sandbox.stop().await;
    None
}

fn set_waiting_all(r: &mut PodRecord, reason: &str, msg: &str) {
    for c in r.init.iter_mut().chain(r.containers.iter_mut()) {
        if matches!(c.state, State::Waiting { .. }) {
            c.state = State::waiting(reason, (!msg.is_empty()).then(|| msg.to_string()));
        }
    }
}

/// How a container's supervisor ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Succeeded,
    Failed,
    Stopped,
}

/// Why a container could not be started (stays Waiting with this reason).
struct NotStarted {
    reason: &'static str,
    message: String,
}

/// Everything needed to run one container once.
struct Prepared {
    spec: ExecSpec,
    limit: Option<u64>,
}

async fn prepare(ctx: &PodCtx, c: &Container, run: i32) -> Result<Prepared, NotStarted> {
    let image = c.image.clone().unwrap_or_default();
    // Every image must be mapped, even when the container gives a command:
    // the mapping is what stands for having the image.
    let mapping = match image::find(&ctx.shared.images, &image) {
        Some(m) => m.clone(),
        None if super::pull::from_loopback_registry(&image) => {
            super::pull::pull(&ctx.shared.dir, &image)
                .await
                .map_err(|message| NotStarted {
                    reason: "ErrImagePull",
                    message,
                })?
        }
        None => {
            return Err(NotStarted {
                reason: "ErrImageNeverPull",
                message: image::not_mapped_message(&image),
            })
        }
    };
    let config_error = |message: String| NotStarted {
        reason: "CreateContainerConfigError",
        message,
    };
    let (uid, gid, groups) = identity(
        ctx.spec.security_context.as_ref(),
        c.security_context.as_ref(),
    );
    let passwd = tokio::fs::read_to_string("/etc/passwd")
        .await
        .unwrap_or_default();
    let home = env::home_of(&passwd, uid);
    let pod = ctx.pod.borrow().clone();
    let pod_ip = ctx.pod_ip();
    let fields = FieldContext {
        pod: &pod,
        pod_ip,
        host_ip: ctx.host_ip(),
    };
    let sources = Sources {
        client: &ctx.shared.client,
        namespace: &ctx.namespace,
    };
    let service = ServiceEnv {
        api_host: ctx.shared.api_host,
        api_port: ctx.shared.api_port,
    };
    let env = env::build(&sources, &fields, c, &service, &home)
        .await
        .map_err(config_error)?;
    let argv =
        env::command_line(c, Some(mapping.entrypoint.as_slice()), &env).map_err(config_error)?;
    let mut mounts = Vec::new();
    for vm in c.volume_mounts.iter().flatten() {
        let volume = ctx
            .spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == vm.name)
            .ok_or_else(|| config_error(format!("volume \"{}\" not found", vm.name)))?;
        let mut source = ctx.volumes.host_path(volume);
        let sub = match (&vm.sub_path, &vm.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => Some(s.clone()),
            (_, Some(e)) if !e.is_empty() => Some(env.expand(e)),
            _ => None,
        };
        if let Some(sub) = sub {
            if sub.starts_with('/') || sub.split('/').any(|p| p == "..") {
                return Err(config_error(format!("invalid subPath {sub:?}")));
            }
            source = source.join(&sub);
            if volume.empty_dir.is_some() && !source.exists() {
                let _ = std::fs::create_dir_all(&source);
                let _ = std::fs::set_permissions(
                    &source,
                    std::os::unix::fs::PermissionsExt::from_mode(0o777),
                );
            }
        }
        mounts.push(MountSpec {
            source,
            path: vm.mount_path.clone(),
            read_only: vm.read_only == Some(true) || always_read_only(volume),
        });
    }
    let mut argv = argv;
    if let Some(program) = argv.first_mut().filter(|_| mapping.rootfs.is_none()) {
        if program.starts_with('/') && program_hidden(program, &mounts) {
            let name = std::path::Path::new(program.as_str())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let path = format!("{PROGRAM_DIR}/{name}");
            mounts.push(MountSpec {
                source: PathBuf::from(program.as_str()),
                path: path.clone(),
                read_only: true,
            });
            *program = path;
        }
    }
    let hosts = pod_ip.filter(|_| ctx.spec.host_network != Some(true)).map(|ip| {
        let hostname = ctx.spec.hostname.clone().unwrap_or_else(|| ctx.name.clone());
        format!(
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{hostname}\n"
        )
    });
    let sc = c.security_context.as_ref();
    let limit = memory_limit(c).map_err(config_error)?;
    let base = ctx.pod_dir.join("containers");
    let _ = tokio::fs::create_dir_all(&base).await;
    let pid = *ctx.sandbox_pid.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Prepared {
        spec: ExecSpec {
            parent_pid: std::process::id() as i32,
            pause_pid: pid,
            cgroup: None,
            join_mount_of: None,
            scratch: base.join(format!("{}-{run}", c.name)),
            error_file: base.join(format!("{}.error", c.name)),
            mounts,
            read_only_root: sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
            hosts,
            working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
            uid,
            gid,
            groups,
            no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
            argv,
            env: with_image_env(&mapping.env, c, env.to_strings()),
            lower: mapping.rootfs.clone(),
        },
        limit,
    })
}

/// The container's environment over its image's, as a kubelet merges
/// them: the image's variables unless the container names them itself
/// (the agent's own defaults, such as HOME, give way to the image's).
fn with_image_env(image: &[String], c: &Container, built: Vec<String>) -> Vec<String> {
    let key = |kv: &str| kv.split_once('=').map_or(kv, |(k, _)| k).to_string();
    let named: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    let from_image: Vec<String> = image.iter().map(|kv| key(kv)).collect();
    let mut out: Vec<String> = image
        .iter()
        .filter(|kv| !named.contains(&key(kv).as_str()))
        .cloned()
        .collect();
    out.extend(
        built
            .into_iter()
            .filter(|kv| !from_image.contains(&key(kv)) || named.contains(&key(kv).as_str())),
    );
    out
}

/// Runs one container for as long as its restart policy says.
async fn supervise(ctx: Arc<PodCtx>, which: Which, policy: String) -> Outcome {
    let c = match which {
        Which::Init(i) => ctx.spec.init_containers.as_ref().and_then(|v| v.get(i)),
        Which::Main(i) => ctx.spec.containers.get(i),
    };
    let Some(c) = c.cloned() else {
        return Outcome::Succeeded;
    };
    let probes = matches!(which, Which::Main(_)) || c.restart_policy.as_deref() == Some("Always");
    let mut backoff = Backoff::default();
    let mut run = 0i32;
    loop {
        if ctx.stopping().is_some() {
            return Outcome::Stopped;
        }
        let prepared = match prepare(&ctx, &c, run).await {
            Ok(p) => p,
            Err(e) => {
                let state = State::waiting(e.reason, Some(e.message.clone()));
                let mut changed = false;
                ctx.container(which, |r| {
                    changed = r.state != state;
                    r.state = state;
                });
                if changed {
                    tracing::warn!(container = %c.name, "{}: {}", e.reason, e.message);
                }
                if ctx.sleep_or_stop(Duration::from_secs(5)).await {
                    return Outcome::Stopped;
                }
                continue;
            }
        };
        let group = format!("{}-{}-{run}", ctx.uid, c.name);
        let cgroup = match ctx.shared.cgroups.group(&group, prepared.limit) {
            Ok(g) => g,
            Err(e) => {
                let msg = format!("{e:#}");
                ctx.container(which, |r| {
                    r.state = State::waiting("CreateContainerError", Some(msg))
                });
                if ctx.sleep_or_stop(Duration::from_secs(5)).await {
                    return Outcome::Stopped;
                }
                continue;
            }
        };
        let mut spec = prepared.spec;
        spec.cgroup = Some(cgroup.dir().to_path_buf());
        let spec_path = ctx
            .pod_dir
            .join("containers")
            .join(format!("{}.json", c.name));
        let log = ctx.log_dir.join(format!("{}.log", c.name));
        let mut process =
            match runtime::spawn(&ctx.shared.exe, &spec, &spec_path, &log, cgroup.clone()).await {
                Ok(p) => p,
                Err(e) => {
                    cgroup.remove().await;
                    let msg = format!("{e:#}");
                    ctx.container(which, |r| {
                        r.state = State::waiting("CreateContainerError", Some(msg))
                    });
                    if ctx.sleep_or_stop(Duration::from_secs(5)).await {
                        return Outcome::Stopped;
                    }
                    continue;
                }
            };
        let started_at = Timestamp::now();
        let started = Instant::now();
        let has_startup = c.startup_probe.is_some() && probes;
        let has_readiness = c.readiness_probe.is_some() && probes;
        let id = format!(
            "testcluster://{}-{}-{run}",
            ctx.uid.chars().take(8).collect::<String>(),
            c.name
        );
        ctx.container(which, |r| {
            r.state = State::Running { started_at };
            r.container_id = Some(id);
            r.started = !has_startup;
            r.ready = !has_startup && !has_readiness;
            if matches!(which, Which::Init(_)) && !probes {
                r.ready = false;
            }
        });
        tracing::info!(container = %c.name, pid = process.pid, "container started");
        let pid = process.pid;
        let killer = (pid, process.cgroup.clone());
        let signal = |sig| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(killer.0), sig);
            killer.1.signal(sig);
        };
        let mut probe_failure = None;
        let mut stopped = None;
        let exit: Exit = {
            let wait = process.wait();
            tokio::pin!(wait);
            let probing = async {
                if probes {
                    run_probes(&ctx, which, &c, &spec, pid).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                exit = &mut wait => exit,
                msg = probing => {
                    tracing::info!(container = %c.name, "{msg}: restarting");
                    probe_failure = Some(msg);
                    let grace = termination_grace(&ctx.spec);
                    terminate(&ctx, &signal, &mut wait, grace).await
                }
                stop = ctx.stopped() => {
                    stopped = Some(stop);
                    terminate(&ctx, &signal, &mut wait, stop.grace).await
                }
            }
        };
        let finished_at = Timestamp::now();
        tracing::info!(container = %c.name, code = exit.code, reason = exit.reason, "container exited");
        let terminated = State::Terminated {
            exit_code: exit.code,
            reason: exit.reason.to_string(),
            message: exit.message.clone(),
            started_at,
            finished_at,
        };
        ctx.container(which, |r| {
            r.state = terminated.clone();
            r.ready = false;
            r.started = false;
        });
        if stopped.is_some() || ctx.stopping().is_some() {
            return Outcome::Stopped;
        }
        let restart = probe_failure.is_some() || should_restart(&policy, exit.code);
        if !restart {
            return if exit.code == 0 {
                if matches!(which, Which::Init(_)) {
                    ctx.container(which, |r| r.ready = true);
                }
                Outcome::Succeeded
            } else {
                Outcome::Failed
            };
        }
        let delay = backoff.next(started.elapsed());
        if !delay.is_zero() {
            let msg = format!(
                "back-off {}s restarting failed container={} pod={}_{}({})",
                delay.as_secs(),
                c.name,
                ctx.name,
                ctx.namespace,
                ctx.uid
            );
            ctx.container(which, |r| {
                r.last_state = Some(terminated.clone());
                r.state = State::waiting("CrashLoopBackOff", Some(msg));
            });
            if ctx.sleep_or_stop(delay).await {
                return Outcome::Stopped;
            }
        }
        run += 1;
        ctx.container(which, |r| {
            r.last_state = Some(terminated);
            r.restart_count += 1;
        });
    }
}

fn termination_grace(spec: &PodSpec) -> Duration {
    Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64)
}

/// SIGTERM, up to `grace` for the process to end, then SIGKILL. A later
/// stop with a shorter grace period (a second delete, the agent shutting
/// down) shortens the wait.
async fn terminate(
    ctx: &PodCtx,
    signal: &(dyn Fn(nix::sys::signal::Signal) + Sync),
    wait: &mut std::pin::Pin<&mut impl std::future::Future<Output = Exit>>,
    grace: Duration,
) -> Exit {
    if !grace.is_zero() {
        signal(nix::sys::signal::Signal::SIGTERM);
        let mut deadline = tokio::time::Instant::now() + grace;
        let mut rx = ctx.stop.clone();
        rx.mark_unchanged();
        loop {
            tokio::select! {
                exit = wait.as_mut() => return exit,
                _ = tokio::time::sleep_until(deadline) => break,
                changed = rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let later = *rx.borrow_and_update();
                    if let Some(stop) = later {
                        deadline = deadline.min(tokio::time::Instant::now() + stop.grace);
                    }
                }
            }
        }
    }
    signal(nix::sys::signal::Signal::SIGKILL);
    wait.as_mut().await
}

/// Runs the container's probes; returns only when a startup or liveness
/// probe fails for good (with the reason).
async fn run_probes(
    ctx: &PodCtx,
    which: Which,
    c: &Container,
    spec: &ExecSpec,
    pid: i32,
) -> String {
    if let Some(p) = &c.startup_probe {
        if let Err(msg) = probe_until(ctx, c, spec, pid, p, "Startup", true).await {
            return msg;
        }
        ctx.container(which, |r| {
            r.started = true;
            if c.readiness_probe.is_none() {
                r.ready = true;
            }
        });
    }
    let liveness = async {
        match &c.liveness_probe {
            Some(p) => match probe_until(ctx, c, spec, pid, p, "Liveness", false).await {
                Err(msg) => msg,
                Ok(()) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    let readiness = async {
        let Some(p) = &c.readiness_probe else {
            return std::future::pending::<()>().await;
        };
        let t = probe::timing(p);
        tokio::time::sleep(t.initial_delay).await;
        let mut counter = Counter::default();
        loop {
            let result = probe_once(ctx, c, spec, pid, p, t.timeout).await;
            if let Err(e) = &result {
                tracing::debug!(container = %c.name, "Readiness probe failed: {e}");
            }
            match counter.record(result.is_ok(), &t) {
                Verdict::Success => ctx.container(which, |r| r.ready = true),
                Verdict::Failure => ctx.container(which, |r| r.ready = false),
                Verdict::Undecided => {}
            }
            tokio::time::sleep(t.period).await;
        }
    };
    tokio::select! {
        msg = liveness => msg,
        () = readiness => String::new(),
    }
}

/// Startup (`until_success`) or liveness: Ok once a startup probe
/// succeeds, Err when the failure threshold is reached.
async fn probe_until(
    ctx: &PodCtx,
    c: &Container,
    spec: &ExecSpec,
    pid: i32,
    p: &Probe,
    kind: &str,
    until_success: bool,
) -> Result<(), String> {
    let t = probe::timing(p);
    tokio::time::sleep(t.initial_delay).await;
    let mut counter = Counter::default();
    loop {
        let result = probe_once(ctx, c, spec, pid, p, t.timeout).await;
        if let Err(e) = &result {
            tracing::debug!(container = %c.name, "{kind} probe failed: {e}");
        }
        let last = result.err();
        match counter.record(last.is_none(), &t) {
            Verdict::Success if until_success => return Ok(()),
            Verdict::Failure => {
                return Err(format!("{kind} probe failed: {}", last.unwrap_or_default()))
            }
            _ => {}
        }
        tokio::time::sleep(t.period).await;
    }
}

async fn probe_once(
    ctx: &PodCtx,
    c: &Container,
    spec: &ExecSpec,
    pid: i32,
    p: &Probe,
    timeout: Duration,
) -> Result<(), String> {
    let Some(ip) = ctx.pod_ip() else {
        return Err("no pod IP".into());
    };
    let action = probe::action(p, c, ip)?;
    let attempt = async {
        match action {
            Action::Http {
                addr,
                path,
                host,
                headers,
            } => probe::http_get(addr, &path, host.as_deref(), &headers).await,
            Action::Tcp(addr) => probe::tcp(addr).await,
            Action::Exec(cmd) => exec_probe(ctx, spec, pid, cmd).await,
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {}s", timeout.as_secs())),
    }
}

/// Runs an exec probe's command in the container's namespaces.
async fn exec_probe(
    ctx: &PodCtx,
    spec: &ExecSpec,
    pid: i32,
    cmd: Vec<String>,
) -> Result<(), String> {
    let mut probe_spec = spec.clone();
    probe_spec.join_mount_of = Some(pid);
    probe_spec.argv = cmd;
    probe_spec.mounts.clear();
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let dir = ctx.pod_dir.join("containers");
    probe_spec.error_file = dir.join(format!("probe-{n}.error"));
    let spec_path = dir.join(format!("probe-{n}.json"));
    let result = async {
        let json = serde_json::to_vec(&probe_spec).map_err(|e| e.to_string())?;
        tokio::fs::write(&spec_path, json)
            .await
            .map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(&ctx.shared.exe)
            .arg(super::exec::EXEC)
            .arg(&spec_path)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            let err = tokio::fs::read_to_string(&probe_spec.error_file)
                .await
                .unwrap_or_default();
            if err.is_empty() {
                Err(format!("command exited with {status}"))
            } else {
                Err(err)
            }
        }
    }
    .await;
    let _ = tokio::fs::remove_file(&spec_path).await;
    let _ = tokio::fs::remove_file(&probe_spec.error_file).await;
    result
}

/// Writes the Pod's status whenever it changes.
async fn status_loop(ctx: Arc<PodCtx>, done: Arc<AtomicBool>) {
    let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
    let policy = ctx
        .spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let mut transitions = Transitions::new();
    let mut last: Option<serde_json::Value> = None;
    loop {
        let finishing = done.load(Ordering::SeqCst);
        if ctx.shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let rec = ctx.record();
        let scheduled = ctx
            .pod
            .borrow()
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled").cloned());
        let st = status::build(&rec, &policy, scheduled, &mut transitions, Timestamp::now());
        let json = serde_json::to_value(&st).unwrap_or_default();
        if last.as_ref() != Some(&json) {
            let patch = serde_json::json!({ "status": json });
            match api
                .patch_status(&ctx.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::debug!(
                        phase = st.phase.as_deref().unwrap_or_default(),
                        "status written"
                    );
                    last = Some(json);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => tracing::warn!("writing the pod status: {e}"),
            }
        }
        if finishing {
            return;
        }
        tokio::select! {
            _ = ctx.notify.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        // Let a burst of changes settle into one write.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        let pod = PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(1000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![3000, 2000]),
            ..Default::default()
        };
        let container = SecurityContext {
            run_as_user: Some(65532),
            ..Default::default()
        };
        assert_eq!(identity(None, None), (0, 0, vec![]));
        assert_eq!(identity(Some(&pod), None), (1000, 1000, vec![2000, 3000]));
        assert_eq!(
            identity(Some(&pod), Some(&container)),
            (65532, 1000, vec![2000, 3000])
        );
        assert_eq!(identity(None, Some(&container)), (65532, 0, vec![]));
    }

    #[test]
    fn memory_limits() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let c = |q: Option<&str>| Container {
            resources: q.map(|q| ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity(q.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(memory_limit(&c(None)), Ok(None));
        assert_eq!(memory_limit(&c(Some("64Mi"))), Ok(Some(64 << 20)));
        assert!(memory_limit(&c(Some("lots"))).is_err());
    }
}
