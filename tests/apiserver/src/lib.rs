//! Test API server (issue 3): a Kubernetes API server on loopback, in memory,
//! that kube-rs, the operator and kubectl can talk to, with an optional
//! kubelet that runs real Squid for Pods carrying `SQUID_CONF`.
//!
//! ```no_run
//! # async fn demo() {
//! let srv = test_apiserver::TestApiServer::start(test_apiserver::Options {
//!     crds_dir: Some("config/crd/bases".into()),
//!     ..Default::default()
//! })
//! .await
//! .expect("server starts");
//! let client = srv.client();
//! # }
//! ```

pub mod authz;
pub mod errors;
pub mod http;
pub mod kubelet;
pub mod pss;
pub mod resources;
pub mod selectors;
pub mod store;
pub mod table;
pub mod validation;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use store::Store;

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory of CRD YAML files to serve.
    pub crds_dir: Option<PathBuf>,
    /// Run Pods with SQUID_CONF as real squid processes.
    pub kubelet: bool,
    /// Listen address; port 0 picks a free port. Must be on 127.0.0.0/8.
    pub listen: SocketAddr,
    /// Where to write the kubeconfig; None = a temp file owned by the handle.
    pub kubeconfig_out: Option<PathBuf>,
    /// RBAC for one token; requests with any other token are admins.
    pub authz: Option<Arc<authz::Authz>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            crds_dir: None,
            kubelet: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kubeconfig_out: None,
            authz: None,
        }
    }
}

/// A running server; dropping it stops the server and every squid.
pub struct TestApiServer {
    addr: SocketAddr,
    store: Arc<Store>,
    kubeconfig: PathBuf,
    shutdown: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    kubelet: Option<kubelet::Kubelet>,
    _tmp: Option<tempfile::TempDir>,
}

/// The crate's own copy of the operator CRDs: `<workspace>/config/crd/bases`.
pub fn workspace_crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/crd/bases")
}

/// A kubeconfig for `http://addr` (plain http, a dummy token).
pub fn kubeconfig_yaml(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\ncurrent-context: test\nusers:\n- name: test\n  user:\n    token: test-token\npreferences: {{}}\n"
    )
}

/// Picks ring as the process-wide rustls provider. In the workspace build
/// the operator links aws-lc-rs as well, and rustls refuses to guess, even
/// for plain-http clients.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl TestApiServer {
    /// Start serving (call inside a tokio runtime).
    pub async fn start(opts: Options) -> Result<TestApiServer, String> {
        install_crypto_provider();
        if !opts.listen.ip().is_loopback() {
            return Err(format!(
                "refusing to listen on non-loopback {}",
                opts.listen
            ));
        }
        let mut defs = resources::builtins();
        if let Some(dir) = &opts.crds_dir {
            defs.extend(resources::load_crds(dir)?);
        }
        let store = Store::new(defs);
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|e| format!("binding {}: {e}", opts.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (tmp, kubeconfig) = match &opts.kubeconfig_out {
            Some(p) => (None, p.clone()),
            None => {
                let t = tempfile::tempdir().map_err(|e| e.to_string())?;
                let p = t.path().join("kubeconfig");
                (Some(t), p)
            }
        };
        std::fs::write(&kubeconfig, kubeconfig_yaml(addr))
            .map_err(|e| format!("writing {}: {e}", kubeconfig.display()))?;
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let app = Arc::new(http::App {
            store: store.clone(),
            addr,
            shutdown: shutdown_rx.clone(),
            authz: opts.authz.clone(),
        });
        let router = http::router(app);
        let mut rx = shutdown_rx;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await;
        });
        let kubelet = opts.kubelet.then(|| kubelet::Kubelet::start(store.clone()));
        Ok(TestApiServer {
            addr,
            store,
            kubeconfig,
            shutdown,
            server,
            kubelet,
            _tmp: tmp,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The store, for white-box checks.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// A kubeconfig for `token` (the RBAC-bound subject of [`Options::authz`]).
    pub fn kubeconfig_for(&self, token: &str) -> String {
        kubeconfig_yaml(self.addr).replace("token: test-token", &format!("token: {token}"))
    }

    /// A kube client for this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        // The URL is built from a SocketAddr, so it always parses.
        let uri: http_uri::Uri = self.url().parse().expect("a valid URL");
        install_crypto_provider();
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).expect("a plain-http client config is always valid")
    }

    /// Stop serving and wait for the server task.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(k) = self.kubelet.take() {
            k.stop_all();
        }
        let server = std::mem::replace(&mut self.server, tokio::spawn(async {}));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
    }
}

mod http_uri {
    pub use axum::http::Uri;
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.server.abort();
        if let Some(k) = self.kubelet.take() {
            k.stop_all();
        }
    }
}
