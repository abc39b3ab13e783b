//! What the launcher does once the cluster is ready, for `make run-local`:
//! apply manifests server-side, then run one command against the cluster
//! and stop the cluster when it exits.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

/// `kubectl apply --server-side` of each path (a directory with a
/// kustomization as `-k`, anything else as `-f`), then waits for every CRD
/// to be Established.
pub async fn apply(kubectl: &Path, kubeconfig: &Path, paths: &[PathBuf]) -> anyhow::Result<()> {
    for p in paths {
        let how = if p.join("kustomization.yaml").exists() {
            "-k"
        } else {
            "-f"
        };
        run(
            kubectl,
            kubeconfig,
            &["apply", "--server-side", how, &p.display().to_string()],
        )
        .await?;
    }
    if !paths.is_empty() {
        run(
            kubectl,
            kubeconfig,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            ],
        )
        .await?;
    }
    Ok(())
}

async fn run(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await
        .with_context(|| format!("running {}", kubectl.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The command's arguments with `@GATEWAY@` replaced by the Pods' gateway
/// (where a server on this host is reachable from Pods).
pub fn substitute(args: &[String], gateway: Option<std::net::Ipv4Addr>) -> Vec<String> {
    let g = gateway.map_or_else(|| "127.0.0.1".to_string(), |g| g.to_string());
    args.iter().map(|a| a.replace("@GATEWAY@", &g)).collect()
}

/// Runs `cmd` with `KUBECONFIG` set until it exits (its exit code) or
/// `stop` resolves (then SIGTERM, and SIGKILL after 10 s).
pub async fn command(
    cmd: &[String],
    kubeconfig: &Path,
    stop: impl std::future::Future<Output = &'static str>,
) -> anyhow::Result<i32> {
    let (program, args) = cmd.split_first().context("no command given after --")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    tokio::select! {
        status = child.wait() => Ok(status?.code().unwrap_or(1)),
        why = stop => {
            tracing::info!("{why}: stopping {program}");
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
            match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                Ok(status) => Ok(status?.code().unwrap_or(1)),
                Err(_) => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    Ok(1)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_placeholder_is_replaced_everywhere() {
        let args = vec![
            "--default-probe-url".to_string(),
            "http://@GATEWAY@:80/".to_string(),
        ];
        assert_eq!(
            substitute(&args, Some(std::net::Ipv4Addr::new(10, 216, 3, 1))),
            ["--default-probe-url", "http://10.216.3.1:80/"]
        );
        assert_eq!(substitute(&args, None)[1], "http://127.0.0.1:80/");
    }
}
