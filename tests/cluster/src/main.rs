//! `test-cluster`: starts etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler on loopback, plus node agents that run Pods as real
//! processes; prints `ready` once the API server is ready and the nodes are
//! Ready; stops everything on SIGTERM, SIGINT, or when its parent goes away.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use test_cluster::launch::{Cluster, Options};
use test_cluster::node::ImageMapping;

#[derive(Parser)]
#[command(version, about = "A real Kubernetes cluster on loopback, for tests")]
struct Args {
    /// State directory: certificates, kubeconfigs (DIR/admin.kubeconfig),
    /// etcd data, logs, Pod volumes, cluster.json.
    #[arg(long)]
    dir: PathBuf,
    /// How many nodes the node agent registers.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// `real`: run Pods as processes; `none`: no nodes, Pods stay Pending.
    #[arg(long, default_value = "real", value_parser = ["real", "none"])]
    pods: String,
    /// An image the node agent can run: NAME (the reference without tag)
    /// or NAME=PROGRAM, PROGRAM being the entrypoint when a container gives
    /// no command. Repeatable.
    #[arg(long = "image")]
    images: Vec<String>,
    /// Where the upstream programs are (default: this binary's directory).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Remove DIR after stopping.
    #[arg(long)]
    remove_dir: bool,
    /// Once ready, `kubectl apply --server-side` this path (a kustomization
    /// directory or a manifest); repeatable. CRDs are waited for.
    #[arg(long = "apply", value_name = "PATH")]
    apply: Vec<PathBuf>,
    /// Once ready (and applied), run this command with KUBECONFIG set to the
    /// admin kubeconfig ("@GATEWAY@" in it becomes the Pods' gateway), and
    /// stop the cluster when it exits, with its exit code.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn image(spec: &str) -> ImageMapping {
    match spec.split_once('=') {
        Some((name, program)) => ImageMapping {
            image: name.to_string(),
            entrypoint: vec![program.to_string()],
            rootfs: None,
            env: Vec::new(),
        },
        None => ImageMapping {
            image: spec.to_string(),
            entrypoint: Vec::new(),
            rootfs: None,
            env: Vec::new(),
        },
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(code) = test_cluster::node::helper_main(&argv[1..]) {
        std::process::exit(code);
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client=off".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("test-cluster: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(runtime.block_on(run(args)));
}

async fn run(args: Args) -> i32 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("test-cluster"));
    // The directory it was started from (target/test-cluster/bin holds a
    // link to it), not the link's target.
    let invoked = std::env::args()
        .next()
        .map(PathBuf::from)
        .filter(|p| p.parent().is_some_and(|d| !d.as_os_str().is_empty()));
    let bin_dir = args
        .bin_dir
        .clone()
        .or_else(|| invoked.and_then(|p| p.parent().map(PathBuf::from)))
        .unwrap_or_else(|| {
            exe.parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."))
        });
    if let Err(e) = std::fs::create_dir_all(&args.dir) {
        eprintln!("test-cluster: creating {}: {e}", args.dir.display());
        return 1;
    }
    let dir = std::fs::canonicalize(&args.dir).unwrap_or(args.dir.clone());
    let parent = std::os::unix::process::parent_id();
    let opts = Options {
        dir,
        nodes: args.nodes,
        pods: args.pods == "real",
        images: args.images.iter().map(|s| image(s)).collect(),
        bin_dir,
        exe,
    };
    let start = tokio::select! {
        c = Cluster::start(opts) => c,
        why = stop_requested(parent) => {
            eprintln!("test-cluster: {why} while starting");
            return 1;
        }
    };
    let mut cluster = match start {
        Ok(c) => c,
        Err(e) => {
            eprintln!("test-cluster: {e:#}");
            return 1;
        }
    };
    // Caught from the moment a user may send it (`ready`), so an early
    // SIGUSR1 cannot end the launcher (its default action).
    let usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).ok();
    println!("ready");
    let code = match after_ready(&args, &cluster, parent).await {
        Ok(Some(code)) => code,
        Ok(None) => {
            let why = serve_restarts(&mut cluster, usr1, &args.dir, parent).await;
            tracing::info!("{why}: stopping the cluster");
            0
        }
        Err(e) => {
            eprintln!("test-cluster: {e:#}");
            1
        }
    };
    cluster.stop().await;
    if args.remove_dir {
        let _ = std::fs::remove_dir_all(&args.dir);
    }
    code
}

/// `--apply`, then the command if one was given (Some(its exit code)).
async fn after_ready(args: &Args, cluster: &Cluster, parent: u32) -> anyhow::Result<Option<i32>> {
    let kubectl = cluster.bin_dir.join("kubectl");
    test_cluster::after_ready::apply(&kubectl, &cluster.info.kubeconfig, &args.apply).await?;
    if args.command.is_empty() {
        return Ok(None);
    }
    let cmd = test_cluster::after_ready::substitute(&args.command, cluster.info.gateway);
    eprintln!(
        "test-cluster: Kubernetes {} on {}; export KUBECONFIG={}; Pods' gateway {}",
        cluster.info.version,
        cluster.info.server,
        cluster.info.kubeconfig.display(),
        cluster
            .info
            .gateway
            .map_or_else(|| "none".to_string(), |g| g.to_string())
    );
    let code =
        test_cluster::after_ready::command(&cmd, &cluster.info.kubeconfig, stop_requested(parent))
            .await?;
    Ok(Some(code))
}

/// Restarts kube-apiserver on each SIGUSR1 (a fault test kills it; see
/// `TestCluster::restart_apiserver`) until a stop is requested.
async fn serve_restarts(
    cluster: &mut Cluster,
    usr1: Option<tokio::signal::unix::Signal>,
    dir: &Path,
    parent: u32,
) -> &'static str {
    let Some(mut usr1) = usr1 else {
        return stop_requested(parent).await;
    };
    let stop = stop_requested(parent);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            why = &mut stop => return why,
            _ = usr1.recv() => {
                match cluster.restart_apiserver(dir).await {
                    Ok(()) => tracing::info!("kube-apiserver killed and restarted"),
                    Err(e) => eprintln!("test-cluster: restarting kube-apiserver: {e:#}"),
                }
            }
        }
    }
}

/// Resolves on SIGTERM, SIGINT, or when the parent process is gone (this
/// process is re-parented), whichever comes first.
async fn stop_requested(parent: u32) -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return "cannot watch signals";
    };
    let orphaned = async {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if std::os::unix::process::parent_id() != parent {
                return;
            }
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = orphaned => "the parent process is gone",
    }
}
