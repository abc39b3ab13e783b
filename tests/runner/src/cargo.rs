//! The test binaries cargo built, read from `cargo test --no-run
//! --message-format=json`, so the runner runs exactly what `cargo test`
//! would have run, from the same directory.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One test executable of the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    /// What the runner calls it: a test target's own name (`control_plane`),
    /// or `PACKAGE (lib)` / `NAME (bin)` for unit tests.
    pub name: String,
    pub path: PathBuf,
    /// The package's root: cargo runs each test binary from there.
    pub cwd: PathBuf,
}

/// Builds every test target with `cargo test --no-run` and the extra
/// `cargo_args`, and returns the executables. Compiler output goes to
/// stderr as cargo renders it.
pub fn build(cargo: &str, cargo_args: &[String]) -> Result<Vec<Binary>, String> {
    let out = Command::new(cargo)
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(cargo_args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run {cargo}: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo test --no-run failed ({})", out.status));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// The executables among cargo's JSON messages, one per line; other
/// messages (build scripts, plain artifacts, diagnostics) are passed over.
pub fn parse(messages: &str) -> Result<Vec<Binary>, String> {
    let mut found = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let m: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("a cargo message is not JSON: {e}"))?;
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            continue;
        }
        let Some(path) = m["executable"].as_str() else {
            continue;
        };
        let target = m["target"]["name"].as_str().unwrap_or_default();
        let kind = m["target"]["kind"][0].as_str().unwrap_or_default();
        let package = package_name(m["package_id"].as_str().unwrap_or_default());
        let name = match kind {
            "test" => target.to_string(),
            "lib" => format!("{package} (lib)"),
            other => format!("{target} ({other})"),
        };
        let cwd = m["manifest_path"]
            .as_str()
            .map(PathBuf::from)
            .and_then(|p| p.parent().map(PathBuf::from))
            .ok_or_else(|| format!("cargo named no manifest for {name}"))?;
        found.push(Binary {
            name,
            path: PathBuf::from(path),
            cwd,
        });
    }
    if found.is_empty() {
        return Err("cargo built no test executable".to_string());
    }
    Ok(found)
}

/// The package's name in either form of cargo's package id:
/// `path+file:///w#name@0.1.0` (or `...#0.1.0` when the name is the last
/// path segment) and the older `name 0.1.0 (path+file:///w)`.
fn package_name(id: &str) -> String {
    if let Some((url, frag)) = id.rsplit_once('#') {
        return match frag.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => url.rsplit('/').next().unwrap_or(url).to_string(),
        };
    }
    id.split_whitespace().next().unwrap_or(id).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w#egress-proxies-operator@0.1.0","manifest_path":"/w/Cargo.toml","target":{"kind":["lib"],"name":"egress_proxies_operator"},"profile":{"test":true},"executable":"/t/deps/egress_proxies_operator-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w#egress-proxies-operator@0.1.0","manifest_path":"/w/Cargo.toml","target":{"kind":["lib"],"name":"egress_proxies_operator"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w#egress-proxies-operator@0.1.0","manifest_path":"/w/Cargo.toml","target":{"kind":["test"],"name":"control_plane"},"profile":{"test":true},"executable":"/t/deps/control_plane-2"}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests/cluster#test-cluster@0.1.0","manifest_path":"/w/tests/cluster/Cargo.toml","target":{"kind":["bin"],"name":"test-cluster"},"profile":{"test":true},"executable":"/t/deps/test_cluster-3"}
{"reason":"build-script-executed","package_id":"x"}
{"reason":"build-finished","success":true}"#;

    #[test]
    fn test_executables_are_named_by_target_and_run_from_their_package() {
        let found = parse(MESSAGES).unwrap();
        let names: Vec<&str> = found.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "egress-proxies-operator (lib)",
                "control_plane",
                "test-cluster (bin)"
            ]
        );
        assert_eq!(found[1].path, PathBuf::from("/t/deps/control_plane-2"));
        assert_eq!(found[2].cwd, PathBuf::from("/w/tests/cluster"));
    }

    #[test]
    fn no_executable_is_an_error_not_an_empty_run() {
        assert!(parse(r#"{"reason":"build-finished","success":true}"#).is_err());
        assert!(parse("{not json").is_err());
    }

    #[test]
    fn package_ids_of_both_forms() {
        assert_eq!(package_name("path+file:///w#epo@0.1.0"), "epo");
        assert_eq!(package_name("path+file:///w/runner#0.1.0"), "runner");
        assert_eq!(package_name("epo 0.1.0 (path+file:///w)"), "epo");
    }
}
