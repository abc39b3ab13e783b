//! `test-apiserver --listen 127.0.0.1:PORT --kubeconfig-out PATH --crds DIR [--kubelet]`

use std::path::PathBuf;
use std::time::Duration;
use test_apiserver::{Options, TestApiServer};

fn usage() -> ! {
    eprintln!("usage: test-apiserver [--listen 127.0.0.1:PORT] [--kubeconfig-out PATH] [--crds DIR] [--kubelet]");
    std::process::exit(2)
}

fn parse_args() -> Options {
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .unwrap_or_else(|| usage())
        };
        match flag.as_str() {
            "--listen" => opts.listen = value().parse().unwrap_or_else(|_| usage()),
            "--kubeconfig-out" => opts.kubeconfig_out = Some(PathBuf::from(value())),
            "--crds" => opts.crds_dir = Some(PathBuf::from(value())),
            "--kubelet" => opts.kubelet = true,
            _ => usage(),
        }
    }
    opts
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = parse_args();
    let parent = std::os::unix::process::parent_id();
    let srv = match TestApiServer::start(opts).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("test-apiserver: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "test-apiserver: serving on {} (kubeconfig {})",
        srv.url(),
        srv.kubeconfig_path().display()
    );
    println!("ready");
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).unwrap_or_else(|e| {
        eprintln!("test-apiserver: SIGTERM handler: {e}");
        std::process::exit(1)
    });
    let mut int = signal(SignalKind::interrupt()).unwrap_or_else(|e| {
        eprintln!("test-apiserver: SIGINT handler: {e}");
        std::process::exit(1)
    });
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = tick.tick() => {
                // The parent died (we were re-parented): stop too.
                if std::os::unix::process::parent_id() != parent {
                    break;
                }
            }
        }
    }
    drop(srv);
}
