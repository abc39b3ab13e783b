//! What a test binary uses: start the launcher (or use `E2E_KUBECONFIG`'s
//! cluster), wait for `ready`, and hand out clients, kubectl commands and
//! fresh namespaces. The launcher stops by itself when the test process is
//! gone, so a cluster kept in a `static` needs no destructor.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::launch::Info;

/// The directory of the built cluster programs:
/// `$TEST_CLUSTER_BIN`, else `<target>/test-cluster/bin` where `<target>`
/// is `$CARGO_TARGET_DIR` or the workspace's `target`.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TEST_CLUSTER_BIN") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("test-cluster/bin")
}

/// The path of a cluster program (`kubectl`, `helm`, `kube-apiserver`...);
/// panics with the fix when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `make test-cluster` (it builds the test cluster from tests/cluster/go)",
        p.display()
    );
    p
}

/// How to start a cluster.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Nodes the agent registers (0 means 1).
    pub nodes: usize,
    /// No node agent: Pods are scheduled nowhere.
    pub no_pods: bool,
    /// `NAME` or `NAME=PROGRAM`: the images the node agent can run.
    pub images: Vec<String>,
}

/// A cluster for tests.
pub struct TestCluster {
    kubeconfig: PathBuf,
    info: Option<Info>,
    child: Mutex<Option<Child>>,
    _dir: Option<tempfile_dir::TempDir>,
}

mod tempfile_dir {
    /// A directory removed when dropped (the launcher's state).
    pub struct TempDir(pub std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl TestCluster {
    /// Starts a cluster with the launcher, or, when `E2E_KUBECONFIG` is
    /// set, uses that cluster instead.
    pub fn start(opts: &Options) -> anyhow::Result<TestCluster> {
        if let Some(kc) = std::env::var_os("E2E_KUBECONFIG") {
            return Ok(TestCluster {
                kubeconfig: PathBuf::from(kc),
                info: None,
                child: Mutex::new(None),
                _dir: None,
            });
        }
        // The launcher picks free ports and the components bind them a
        // moment later; on a busy machine another process can take one in
        // between. That is worth a fresh start, nothing else is.
        let mut attempt = 1;
        loop {
            match Self::start_local(opts) {
                Err(e) if attempt < 3 && e.to_string().contains("address already in use") => {
                    eprintln!("test-cluster: a port was taken while starting (attempt {attempt}); starting again");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_local(opts: &Options) -> anyhow::Result<TestCluster> {
        let base = std::env::var_os("TEST_CLUSTER_STATE")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "test-cluster-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir)?;
        let guard = tempfile_dir::TempDir(dir.clone());
        let mut cmd = Command::new(bin("test-cluster"));
        cmd.arg("--dir")
            .arg(&dir)
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--nodes")
            .arg(opts.nodes.max(1).to_string())
            .arg("--remove-dir");
        if opts.no_pods {
            cmd.args(["--pods", "none"]);
        }
        for i in &opts.images {
            cmd.arg("--image").arg(i);
        }
        let log = std::fs::File::create(dir.join("launcher.log"))?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting test-cluster")?;
        let stdout = child.stdout.take().context("the launcher's stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.join("launcher.log")).unwrap_or_default();
            anyhow::bail!("the test cluster did not start:\n{log}");
        }
        let info: Info = serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json"))?)?;
        Ok(TestCluster {
            kubeconfig: info.kubeconfig.clone(),
            info: Some(info),
            child: Mutex::new(Some(child)),
            _dir: Some(guard),
        })
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// What the launcher reported (None for an `E2E_KUBECONFIG` cluster).
    pub fn info(&self) -> Option<&Info> {
        self.info.as_ref()
    }

    /// Whether this is a cluster the launcher started (not `E2E_KUBECONFIG`).
    pub fn is_local(&self) -> bool {
        self.info.is_some()
    }

    /// An admin client.
    pub async fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        crate::launch::client(&self.kubeconfig)
            .await
            .expect("the test cluster's kubeconfig loads")
    }

    /// `kubectl --kubeconfig <admin>`, the pinned kubectl.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(bin("kubectl"));
        c.arg("--kubeconfig").arg(&self.kubeconfig);
        c
    }

    /// Runs kubectl with `args`; panics with its output unless it succeeds;
    /// returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl().args(args).output().expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Where the host serves what Pods must reach (test HTTP targets):
    /// the Pods' gateway on the bridge; for an `E2E_KUBECONFIG` cluster,
    /// `E2E_HOST_IP` (an address of this machine its Pods can reach);
    /// else 127.0.0.1.
    pub fn host_ip(&self) -> IpAddr {
        if let Some(g) = self.info.as_ref().and_then(|i| i.gateway) {
            return IpAddr::V4(g);
        }
        std::env::var("E2E_HOST_IP")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// A new namespace named `<prefix>-<n>`, unique in this cluster.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> String {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let api: Api<Namespace> = Api::all(client.clone());
        loop {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("{prefix}-{}-{n}", std::process::id() % 100_000);
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => return name,
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => panic!("creating namespace {name}: {e}"),
            }
        }
    }

    /// The pid of a control-plane component (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`), for fault tests.
    pub fn pid(&self, component: &str) -> Option<u32> {
        // Read afresh: the launcher rewrites it when it restarts a part.
        let dir = self._dir.as_ref()?;
        let text = std::fs::read_to_string(dir.0.join("cluster.json")).ok()?;
        let info: Info = serde_json::from_str(&text).ok()?;
        info.pids.get(component).copied()
    }

    /// Kills kube-apiserver with SIGKILL and has the launcher start it
    /// again with the same flags, state and port (`SIGUSR1` to the
    /// launcher); returns once the new one passes `/readyz`. Panics on an
    /// `E2E_KUBECONFIG` cluster, or after 120 s.
    pub async fn restart_apiserver(&self) {
        let old = self
            .pid("kube-apiserver")
            .expect("only a cluster of the launcher's can restart its API server");
        let launcher = self
            .child
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(Child::id))
            .expect("the launcher runs");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(launcher as i32),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .expect("signal the launcher");
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while self.pid("kube-apiserver") == Some(old) {
            assert!(
                std::time::Instant::now() < deadline,
                "kube-apiserver was not restarted within 120 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The API server's audit events (one JSON object per request).
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let Some(info) = &self.info else {
            return Vec::new();
        };
        std::fs::read_to_string(&info.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Stops the cluster and waits until everything is gone.
    pub fn stop(&self) {
        let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
