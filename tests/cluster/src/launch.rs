//! Starts the control plane and the nodes, reports `ready`, and stops them
//! all in reverse order.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node as KubeNode, ServiceAccount};
use kube::api::ListParams;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};

use crate::node::{self, ImageMapping, NodeConfig};
use crate::pki::{self, Ca};
use crate::process::{free_port, Component};

/// The pinned Kubernetes version (tests/cluster/go/kubernetes/go.mod).
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The Service network; its first address is the `kubernetes` Service.
const SERVICE_CIDR: &str = "10.96.0.0/16";
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// What to start.
pub struct Options {
    pub dir: PathBuf,
    pub nodes: usize,
    pub pods: bool,
    pub images: Vec<ImageMapping>,
    /// Where etcd, kube-apiserver, kube-controller-manager and
    /// kube-scheduler are.
    pub bin_dir: PathBuf,
    /// This binary, re-run by the node agent for its helpers.
    pub exe: PathBuf,
}

/// What a running cluster tells its users, in `DIR/cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Info {
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    pub kubeconfig: PathBuf,
    /// The Pods' gateway on the bridge, where the host serves what Pods
    /// must reach; None with `--pods none`.
    pub gateway: Option<Ipv4Addr>,
    pub nodes: Vec<String>,
    /// Process ids by component, for fault tests (SIGSTOP/SIGCONT).
    pub pids: std::collections::BTreeMap<String, u32>,
    /// The API server's audit log (one JSON event per request).
    pub audit_log: PathBuf,
    /// Where the node agents keep each Pod's container logs.
    pub pods_dir: PathBuf,
    pub version: String,
}

/// A running cluster.
pub struct Cluster {
    components: Vec<Component>,
    nodes: Vec<node::Node>,
    network: Option<Arc<node::net::PodNetwork>>,
    forwarder: Option<tokio::task::JoinHandle<()>>,
    pub info: Info,
    /// Where the upstream programs are.
    pub bin_dir: PathBuf,
}

fn program(opts: &Options, name: &str) -> anyhow::Result<PathBuf> {
    let p = opts.bin_dir.join(name);
    anyhow::ensure!(
        p.exists(),
        "{} is missing: run `make test-cluster` to build the control plane",
        p.display()
    );
    Ok(p)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

impl Cluster {
    /// Starts everything; on failure stops what had started.
    pub async fn start(opts: Options) -> anyhow::Result<Cluster> {
        let mut cluster = Cluster {
            components: Vec::new(),
            nodes: Vec::new(),
            network: None,
            forwarder: None,
            bin_dir: opts.bin_dir.clone(),
            info: Info {
                server: String::new(),
                kubeconfig: opts.dir.join("admin.kubeconfig"),
                gateway: None,
                nodes: Vec::new(),
                pids: Default::default(),
                audit_log: opts.dir.join("audit.log"),
                pods_dir: opts.dir.join("nodes"),
                version: KUBERNETES_VERSION.to_string(),
            },
        };
        match cluster.boot(&opts).await {
            Ok(()) => Ok(cluster),
            Err(e) => {
                cluster.stop().await;
                Err(e)
            }
        }
    }

    async fn boot(&mut self, opts: &Options) -> anyhow::Result<()> {
        let dir = &opts.dir;
        let pki_dir = dir.join("pki");
        let logs = dir.join("logs");
        for d in [&pki_dir, &logs, &self.info.pods_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        if opts.pods {
            let net = node::net::PodNetwork::create().context("creating the Pod network")?;
            self.info.gateway = Some(net.gateway());
            self.network = Some(Arc::new(net));
        }

        let ca = Ca::create(&pki_dir)?;
        let extra: Vec<IpAddr> = self.info.gateway.iter().map(|g| IpAddr::V4(*g)).collect();
        let serving = ca.serving(
            &pki_dir,
            "apiserver",
            &pki::apiserver_names(IpAddr::V4(SERVICE_IP), &extra),
        )?;
        let sa = pki::service_account_key(&pki_dir)?;

        // etcd, with fsync off: the data is thrown away with the cluster.
        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Component::spawn(
            "etcd",
            &program(opts, "etcd")?,
            &[
                format!("--data-dir={}", s(&dir.join("etcd"))),
                "--name=default".into(),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            &logs,
        )?;
        self.add(etcd);
        self.wait_tcp("etcd", SocketAddr::from(([127, 0, 0, 1], etcd_port)))
            .await?;

        let server = format!("https://127.0.0.1:{api_port}");
        self.info.server = server.clone();
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY)?;
        let apiserver = Component::spawn(
            "kube-apiserver",
            &program(opts, "kube-apiserver")?,
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                // A loopback advertise address needs this (else it exits).
                "--endpoint-reconciler-type=none".into(),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={}", s(&serving.cert)),
                format!("--tls-private-key-file={}", s(&serving.key)),
                format!("--client-ca-file={}", s(&ca.cert)),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", s(&sa.cert)),
                format!("--service-account-signing-key-file={}", s(&sa.key)),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                format!("--audit-policy-file={}", s(&audit_policy)),
                format!("--audit-log-path={}", s(&self.info.audit_log)),
                "--audit-log-maxbackup=0".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
            &logs,
        )?;
        self.add(apiserver);
        ca.kubeconfig(
            &pki_dir,
            &self.info.kubeconfig,
            &server,
            "test-cluster-admin",
            Some("system:masters"),
        )?;
        let admin = client(&self.info.kubeconfig).await?;
        self.wait_readyz(&admin).await?;

        let cm_kubeconfig = dir.join("controller-manager.kubeconfig");
        ca.kubeconfig(
            &pki_dir,
            &cm_kubeconfig,
            &server,
            "system:kube-controller-manager",
            None,
        )?;
        let cm = Component::spawn(
            "kube-controller-manager",
            &program(opts, "kube-controller-manager")?,
            &[
                format!("--kubeconfig={}", s(&cm_kubeconfig)),
                format!("--authentication-kubeconfig={}", s(&cm_kubeconfig)),
                format!("--authorization-kubeconfig={}", s(&cm_kubeconfig)),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
                "--leader-elect=false".into(),
                "--use-service-account-credentials".into(),
                format!("--service-account-private-key-file={}", s(&sa.key)),
                format!("--root-ca-file={}", s(&ca.cert)),
                format!("--cluster-signing-cert-file={}", s(&ca.cert)),
                format!("--cluster-signing-key-file={}", s(&pki_dir.join("ca.key"))),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--v=1".into(),
            ],
            &logs,
        )?;
        self.add(cm);

        let sched_kubeconfig = dir.join("scheduler.kubeconfig");
        ca.kubeconfig(
            &pki_dir,
            &sched_kubeconfig,
            &server,
            "system:kube-scheduler",
            None,
        )?;
        let scheduler = Component::spawn(
            "kube-scheduler",
            &program(opts, "kube-scheduler")?,
            &[
                format!("--kubeconfig={}", s(&sched_kubeconfig)),
                format!("--authentication-kubeconfig={}", s(&sched_kubeconfig)),
                format!("--authorization-kubeconfig={}", s(&sched_kubeconfig)),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
            &logs,
        )?;
        self.add(scheduler);

        if let (Some(net), Some(gateway)) = (self.network.clone(), self.info.gateway) {
            // Pods cannot reach the host's loopback: forward the API server
            // port from the gateway address to it.
            let listen = SocketAddr::from((gateway, api_port));
            let target = SocketAddr::from(([127, 0, 0, 1], api_port));
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding the API forwarder on {listen}"))?;
            self.forwarder = Some(tokio::spawn(forward(listener, target)));
            for i in 1..=opts.nodes {
                let name = format!("node-{i}");
                let kubeconfig = dir.join(format!("{name}.kubeconfig"));
                ca.kubeconfig(
                    &pki_dir,
                    &kubeconfig,
                    &server,
                    &format!("system:node:{name}"),
                    Some("system:nodes"),
                )?;
                let node_dir = self.info.pods_dir.join(&name);
                std::fs::create_dir_all(&node_dir)?;
                let node = node::Node::start(NodeConfig {
                    name: name.clone(),
                    client: client(&kubeconfig).await?,
                    api_host: gateway,
                    api_port,
                    network: net.clone(),
                    images: opts.images.clone(),
                    dir: node_dir,
                    exe: opts.exe.clone(),
                })
                .await
                .with_context(|| format!("starting the node agent of {name}"))?;
                self.nodes.push(node);
                self.info.nodes.push(name);
            }
        }
        self.wait_settled(&admin).await?;
        let json = serde_json::to_string_pretty(&self.info)?;
        std::fs::write(dir.join("cluster.json"), json)?;
        Ok(())
    }

    /// Kills kube-apiserver with SIGKILL and starts it again as it was
    /// (for fault tests: `SIGUSR1` to the launcher); returns once it
    /// passes `/readyz`, with its new pid in `cluster.json`.
    pub async fn restart_apiserver(&mut self, dir: &Path) -> anyhow::Result<()> {
        let c = self
            .components
            .iter_mut()
            .find(|c| c.name == "kube-apiserver")
            .context("no kube-apiserver")?;
        c.respawn().await?;
        if let Some(pid) = c.pid() {
            self.info.pids.insert(c.name.clone(), pid);
        }
        let admin = client(&self.info.kubeconfig).await?;
        self.wait_readyz(&admin).await?;
        std::fs::write(
            dir.join("cluster.json"),
            serde_json::to_string_pretty(&self.info)?,
        )?;
        Ok(())
    }

    fn add(&mut self, c: Component) {
        if let Some(pid) = c.pid() {
            self.info.pids.insert(c.name.clone(), pid);
        }
        self.components.push(c);
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        self.components.iter_mut().try_for_each(|c| c.check_alive())
    }

    async fn poll<F, Fut>(&mut self, what: &str, timeout: Duration, mut f: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match f().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            self.check_alive()?;
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("{what} within {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_tcp(&mut self, what: &str, addr: SocketAddr) -> anyhow::Result<()> {
        self.poll(
            &format!("{what} did not listen on {addr}"),
            Duration::from_secs(60),
            || async move {
                tokio::net::TcpStream::connect(addr)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await
    }

    async fn wait_readyz(&mut self, admin: &Client) -> anyhow::Result<()> {
        self.poll(
            "kube-apiserver did not pass /readyz",
            Duration::from_secs(120),
            || async {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match admin.request_text(req).await {
                    Ok(t) if t.trim() == "ok" => Ok(()),
                    Ok(t) => Err(t),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await
    }

    /// The controller-manager made the default ServiceAccount and every
    /// node is Ready.
    async fn wait_settled(&mut self, admin: &Client) -> anyhow::Result<()> {
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
        self.poll(
            "kube-controller-manager did not create the default ServiceAccount",
            Duration::from_secs(120),
            || {
                let sas = sas.clone();
                async move {
                    sas.get("default")
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
            },
        )
        .await?;
        let nodes: Api<KubeNode> = Api::all(admin.clone());
        let want = self.info.nodes.clone();
        self.poll(
            "the nodes did not become Ready",
            Duration::from_secs(60),
            || {
                let (nodes, want) = (nodes.clone(), want.clone());
                async move {
                    let list = nodes
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let ready: Vec<String> = list
                        .items
                        .iter()
                        .filter(|n| node_ready(n))
                        .filter_map(|n| n.metadata.name.clone())
                        .collect();
                    match want.iter().find(|w| !ready.contains(w)) {
                        None => Ok(()),
                        Some(w) => Err(format!("{w} is not Ready")),
                    }
                }
            },
        )
        .await
    }

    /// Stops the nodes (their Pods), the network, then the control plane
    /// in reverse start order.
    pub async fn stop(&mut self) {
        for n in self.nodes.drain(..) {
            n.shutdown().await;
        }
        if let Some(f) = self.forwarder.take() {
            f.abort();
        }
        if let Some(net) = self.network.take() {
            net.remove();
        }
        while let Some(c) = self.components.pop() {
            c.stop(Duration::from_secs(10)).await;
        }
    }
}

fn node_ready(n: &KubeNode) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A client from a kubeconfig file.
pub async fn client(path: &Path) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(Client::try_from(cfg)?)
}

/// Copies bytes both ways between every accepted connection and `target`.
async fn forward(listener: tokio::net::TcpListener, target: SocketAddr) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}
