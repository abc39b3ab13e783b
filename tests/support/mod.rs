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
