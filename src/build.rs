//! Records the commit the binary is built from as `EPO_COMMIT`: the
//! `EPO_COMMIT` environment variable when set (an image build without the
//! repository), else `git rev-parse --short=12 HEAD`, else `unknown`. It
//! is printed by `--version`, on the startup line and as the trace
//! resource's `service.version`. Also `EPO_RUSTC`, the compiler's version,
//! for the startup line's runtime version.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=EPO_COMMIT");
    println!("cargo:rerun-if-changed=src/build.rs");
    let commit = std::env::var("EPO_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    // Built again when HEAD moves: a commit, a checkout, a fetch that
    // packs the refs.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(r);
    }
    for w in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &w]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=EPO_COMMIT={commit}");
    // The runtime version of the startup line: the compiler's.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=EPO_RUSTC={version}");
}
