//! The node agent: plays kubelet for one Node of the test cluster.
//!
//! It registers the Node (capacity, a Ready condition, a heartbeat Lease in
//! `kube-node-lease`) and runs the containers of every Pod bound to it as
//! real host processes: each Pod in its own network namespace on the
//! cluster's bridge (its own address), its own mount namespace (an overlay
//! of the host root, read-only where asked, volumes materialized and bound
//! at their mount paths), a cgroup v1 memory group with the container's
//! limit, and the securityContext's user and group.
//!
//! Container logs are in `<dir>/pods/<namespace>_<name>_<uid>/<container>.log`
//! (there is no kubelet API: `kubectl logs` and `kubectl exec` do not work).

pub mod cgroup;
pub mod env;
pub mod exec;
pub mod image;
pub mod net;
pub mod pod;
pub mod probe;
pub mod pull;
pub mod quantity;
pub mod restart;
pub mod runtime;
pub mod status;
pub mod volumes;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Node as NodeObject, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Pod,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;

/// One image the agent can "pull": a container whose image's repository
/// (the reference without tag or digest) is `image` runs `entrypoint` on the
/// host when the Pod gives no `command`. An image not in the list keeps its
/// Pod Pending with a reason that names it.
#[derive(Debug, Clone)]
pub struct ImageMapping {
    pub image: String,
    pub entrypoint: Vec<String>,
    /// A pulled image's root filesystem (`pull`): the container's root is
    /// an overlay of it instead of the host's `/`.
    pub rootfs: Option<PathBuf>,
    /// A pulled image's environment, under the container's own.
    pub env: Vec<String>,
}

/// What a node needs to run.
pub struct NodeConfig {
    /// The Node's name.
    pub name: String,
    /// A client with this node's own credentials (`system:node:<name>`,
    /// group `system:nodes`).
    pub client: kube::Client,
    /// Where a Pod reaches the API server: `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT` (an address on the bridge).
    pub api_host: Ipv4Addr,
    pub api_port: u16,
    /// The cluster's Pod network, shared by all its nodes.
    pub network: Arc<net::PodNetwork>,
    pub images: Vec<ImageMapping>,
    /// This node's state directory (volumes, logs).
    pub dir: PathBuf,
    /// The launcher binary, re-run for its hidden helper commands.
    pub exe: PathBuf,
}

/// How often the Lease is renewed.
const LEASE_RENEW: Duration = Duration::from_secs(10);
const LEASE_DURATION_SECONDS: i32 = 40;
/// How often the Ready condition's heartbeat is re-posted.
const STATUS_HEARTBEAT: Duration = Duration::from_secs(20);
/// How long shutdown waits for Pod workers to tear down.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(20);

type Workers = Arc<Mutex<HashMap<String, pod::Worker>>>;

/// A running node agent.
pub struct Node {
    shared: Arc<pod::Shared>,
    workers: Workers,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The Node object this agent registers.
fn node_object(name: &str, ip: Ipv4Addr) -> NodeObject {
    NodeObject {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [
                    ("kubernetes.io/hostname", name),
                    ("kubernetes.io/os", "linux"),
                    ("kubernetes.io/arch", arch()),
                    ("beta.kubernetes.io/os", "linux"),
                    ("beta.kubernetes.io/arch", arch()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(node_status(name, ip, Timestamp::now(), Timestamp::now())),
    }
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The Node status: capacity, addresses, info and a Ready condition with
/// the given heartbeat.
fn node_status(
    name: &str,
    ip: Ipv4Addr,
    ready_since: Timestamp,
    heartbeat: Timestamp,
) -> NodeStatus {
    let resources: std::collections::BTreeMap<String, Quantity> = [
        ("cpu", env::NODE_CPU),
        ("memory", env::NODE_MEMORY),
        ("pods", "110"),
        ("ephemeral-storage", "100Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect();
    let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(Time(heartbeat)),
        last_transition_time: Some(Time(ready_since)),
    };
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.to_string(),
            },
        ]),
        conditions: Some(vec![
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "the test node agent is posting ready status",
            ),
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints::default()),
        node_info: Some(NodeSystemInfo {
            architecture: arch().into(),
            boot_id: String::new(),
            container_runtime_version: "testcluster://0.1.0".into(),
            kernel_version: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            kube_proxy_version: String::new(),
            kubelet_version: "v1.37.2".into(),
            machine_id: String::new(),
            operating_system: "linux".into(),
            os_image: "test-cluster node agent".into(),
            system_uuid: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates the Node, or takes over an existing one.
async fn register(client: &kube::Client, name: &str, ip: Ipv4Addr) -> anyhow::Result<NodeObject> {
    let api: Api<NodeObject> = Api::all(client.clone());
    let mut last_err = None;
    for _ in 0..30 {
        match api
            .create(&PostParams::default(), &node_object(name, ip))
            .await
        {
            Ok(n) => return Ok(n),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return api.get(name).await.context("reading the existing Node");
            }
            Err(e) => {
                tracing::debug!("registering the node: {e}");
                last_err = Some(e);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    Err(anyhow::anyhow!(
        "registering node {name}: {}",
        last_err.map(|e| e.to_string()).unwrap_or_default()
    ))
}

async fn post_status(
    client: &kube::Client,
    name: &str,
    ip: Ipv4Addr,
    since: Timestamp,
) -> anyhow::Result<()> {
    let api: Api<NodeObject> = Api::all(client.clone());
    let status = node_status(name, ip, since, Timestamp::now());
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("posting the node status")?;
    Ok(())
}

async fn renew_lease(client: &kube::Client, node: &NodeObject) -> anyhow::Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = MicroTime(Timestamp::now());
    let patch = serde_json::json!({
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": now,
        }
    });
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some("kube-node-lease".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: name.clone(),
                        uid: node.metadata.uid.clone().unwrap_or_default(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name),
                    lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease)
                .await
                .context("creating the node lease")?;
            Ok(())
        }
        Err(e) => Err(e).context("renewing the node lease"),
    }
}

/// Keeps the Node Ready: the Lease every 10 s, the status every 20 s.
async fn heartbeat(client: kube::Client, node: NodeObject, ip: Ipv4Addr, since: Timestamp) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut lease = tokio::time::interval(LEASE_RENEW);
    let mut status = tokio::time::interval(STATUS_HEARTBEAT);
    loop {
        tokio::select! {
            _ = lease.tick() => {
                if let Err(e) = renew_lease(&client, &node).await {
                    tracing::warn!(node = %name, "{e:#}");
                }
            }
            _ = status.tick() => {
                if let Err(e) = post_status(&client, &name, ip, since).await {
                    tracing::warn!(node = %name, "{e:#}");
                }
            }
        }
    }
}

/// Whether a Pod object asks for its containers to stop, and how.
fn stop_request(pod: &Pod) -> Option<pod::Stop> {
    pod.metadata.deletion_timestamp.as_ref()?;
    let grace = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0);
    Some(pod::Stop {
        grace: Duration::from_secs(grace as u64),
        delete: true,
    })
}

/// Routes watch events to Pod workers.
async fn watch_pods(shared: Arc<pod::Shared>, workers: Workers) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", shared.node_name));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listed: HashSet<String> = HashSet::new();
    let mut reap = tokio::time::interval(Duration::from_secs(2));
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = reap.tick() => {
                // Forget workers that finished their teardown.
                let mut w = workers.lock().unwrap_or_else(|p| p.into_inner());
                w.retain(|_, worker| !worker.task.is_finished());
                continue;
            }
        };
        let Some(event) = event else { break };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("watching pods: {e}");
                continue;
            }
        };
        match event {
            watcher::Event::Init => listed.clear(),
            watcher::Event::InitApply(pod) => {
                if let Some(uid) = pod.metadata.uid.clone() {
                    listed.insert(uid);
                }
                apply(&shared, &workers, pod);
            }
            watcher::Event::Apply(pod) => apply(&shared, &workers, pod),
            watcher::Event::InitDone => {
                let w = workers.lock().unwrap_or_else(|p| p.into_inner());
                for (uid, worker) in w.iter() {
                    if !listed.contains(uid) {
                        gone(worker);
                    }
                }
            }
            watcher::Event::Delete(pod) => {
                let w = workers.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(worker) = pod.metadata.uid.as_ref().and_then(|u| w.get(u)) {
                    gone(worker);
                }
            }
        }
    }
}

/// The Pod is gone from the API: stop at once.
fn gone(worker: &pod::Worker) {
    worker.stop.send_if_modified(|s| {
        let was = *s;
        *s = Some(pod::Stop {
            grace: Duration::ZERO,
            delete: false,
        });
        was != *s
    });
}

fn apply(shared: &Arc<pod::Shared>, workers: &Workers, pod: Pod) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    let mut w = workers.lock().unwrap_or_else(|p| p.into_inner());
    let stop = stop_request(&pod);
    match w.get(&uid) {
        Some(worker) => {
            if let Some(stop) = stop {
                // A second delete may shorten the grace period.
                worker.stop.send_if_modified(|s| match s {
                    Some(old) if old.grace <= stop.grace => false,
                    _ => {
                        *s = Some(stop);
                        true
                    }
                });
            }
            worker.pod.send_replace(pod);
        }
        None => {
            if shared.shutting_down.load(Ordering::SeqCst) {
                return;
            }
            let worker = pod::spawn(shared.clone(), pod);
            if let Some(stop) = stop {
                worker.stop.send_replace(Some(stop));
            }
            w.insert(uid, worker);
        }
    }
}

impl Node {
    /// Registers the Node and starts running its Pods.
    pub async fn start(cfg: NodeConfig) -> anyhow::Result<Node> {
        let ip = cfg.network.gateway();
        std::fs::create_dir_all(cfg.dir.join("pods"))
            .with_context(|| format!("creating {}", cfg.dir.display()))?;
        let cgroups = cgroup::CgroupRoot::create(&cfg.name)?;
        let node = match register(&cfg.client, &cfg.name, ip).await {
            Ok(n) => n,
            Err(e) => {
                cgroups.remove_all().await;
                return Err(e);
            }
        };
        let since = Timestamp::now();
        if let Err(e) = post_status(&cfg.client, &cfg.name, ip, since).await {
            cgroups.remove_all().await;
            return Err(e);
        }
        if let Err(e) = renew_lease(&cfg.client, &node).await {
            tracing::warn!(node = %cfg.name, "{e:#}");
        }
        tracing::info!(node = %cfg.name, %ip, "node registered");
        let shared = Arc::new(pod::Shared {
            client: cfg.client.clone(),
            node_name: cfg.name.clone(),
            exe: cfg.exe,
            dir: cfg.dir,
            network: cfg.network,
            images: cfg.images,
            api_host: cfg.api_host,
            api_port: cfg.api_port,
            cgroups,
            shutting_down: Default::default(),
        });
        let workers: Workers = Default::default();
        let tasks = vec![
            tokio::spawn(heartbeat(cfg.client.clone(), node, ip, since)),
            tokio::spawn(watch_pods(shared.clone(), workers.clone())),
        ];
        Ok(Node {
            shared,
            workers,
            tasks,
        })
    }

    /// Stops every Pod's processes and removes what they used (network
    /// namespace, veth, cgroup, state).
    pub async fn shutdown(self) {
        tracing::info!(node = %self.shared.node_name, "node shutting down");
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        for t in &self.tasks {
            t.abort();
        }
        let workers: Vec<pod::Worker> = {
            let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
            w.drain().map(|(_, v)| v).collect()
        };
        for w in &workers {
            gone(w);
        }
        for w in workers {
            let abort = w.task.abort_handle();
            if tokio::time::timeout(SHUTDOWN_WAIT, w.task).await.is_err() {
                // Dropping the worker's futures kills its processes.
                abort.abort();
            }
        }
        self.shared.cgroups.remove_all().await;
        let pods = self.shared.dir.join("pods");
        if let Err(e) = tokio::fs::remove_dir_all(&pods).await {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("removing {}: {e}", pods.display());
            }
        }
    }
}

/// Entry point of the hidden helper commands the agent runs itself as
/// (`test-cluster __pod-<cmd> ...`). Returns None when `args` is not one.
///
/// Must run before any other thread exists (before a tokio runtime is
/// built): the helpers change namespaces, which needs a single thread.
pub fn helper_main(args: &[String]) -> Option<i32> {
    exec::helper_main(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_requests() {
        let mut pod = Pod::default();
        assert_eq!(stop_request(&pod), None);
        pod.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert_eq!(
            stop_request(&pod).map(|s| s.grace),
            Some(Duration::from_secs(30))
        );
        pod.metadata.deletion_grace_period_seconds = Some(5);
        let s = stop_request(&pod).unwrap();
        assert_eq!(s.grace, Duration::from_secs(5));
        assert!(s.delete);
    }

    #[test]
    fn node_status_is_ready() {
        let s = node_status(
            "n1",
            Ipv4Addr::new(10, 216, 0, 1),
            Timestamp::now(),
            Timestamp::now(),
        );
        let ready = s
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(s.capacity.unwrap()["memory"].0, "8Gi");
        assert_eq!(s.node_info.unwrap().kubelet_version, "v1.37.2");
        assert_eq!(s.addresses.unwrap()[0].address, "10.216.0.1");
    }
}
