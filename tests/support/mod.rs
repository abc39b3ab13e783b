//! Shared by the tests that run the real operator binary.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// The operator binary with `providers` written to `dir/providers.yaml`,
/// talking to the cluster in `kubeconfig` (never an in-cluster one), with
/// its probe and discovery servers off so parallel tests share no port.
pub fn operator(dir: &Path, providers: &str, kubeconfig: &Path) -> Command {
    let path = dir.join("providers.yaml");
    std::fs::write(&path, providers).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
    cmd.arg("--providers-config")
        .arg(&path)
        .args([
            "--health-probe-bind-address",
            "0",
            "--discovery-bind-address",
            "0",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST");
    cmd
}

/// A running operator process, killed when dropped so no test leaves it
/// running.
pub struct Operator(pub std::process::Child);

impl Operator {
    /// Starts `cmd` with its log (stderr) in `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Operator {
        let file = std::fs::File::create(log).unwrap();
        Operator(
            cmd.stdout(std::process::Stdio::null())
                .stderr(file)
                .spawn()
                .unwrap(),
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` every 200 ms until it yields a value; panics naming `what`
/// after `timeout`.
pub async fn eventually<F, Fut, T>(what: &str, timeout: std::time::Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The test API server on loopback with the generated CRDs, optionally with
/// its Squid-running kubelet. (It installs the process's TLS provider.)
pub async fn api_server(kubelet: bool) -> test_apiserver::TestApiServer {
    test_apiserver::TestApiServer::start(test_apiserver::Options {
        crds_dir: Some(test_apiserver::workspace_crds_dir()),
        kubelet,
        ..Default::default()
    })
    .await
    .expect("test API server starts")
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
