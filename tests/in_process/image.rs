//! The Dockerfile cannot be built here: no Docker engine runs on these
//! machines (`make image` builds the same image from Debian's packages and
//! `kvm/e2e_image.rs` runs it). What can be checked of the Dockerfile is
//! checked: the runtime stage is a shell-less base running as 65532 with
//! the release binary as entrypoint, and the library set `make
//! runtime-libs` copies into it is complete: the binary runs with nothing
//! else on its library path.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::process::Command;
use support::repo;

#[test]
fn the_runtime_stage_is_minimal_and_non_root() {
    let mut df = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    // The base images are build arguments (for mirrors): their defaults
    // are what a plain `docker build` uses.
    let defaults: Vec<(String, String)> = df
        .lines()
        .take_while(|l| !l.starts_with("FROM "))
        .filter_map(|l| l.strip_prefix("ARG ")?.split_once('='))
        .map(|(k, v)| (format!("${{{k}}}"), v.to_string()))
        .collect();
    assert_eq!(
        defaults.len(),
        2,
        "BUILD_IMAGE and RUNTIME_IMAGE: {defaults:?}"
    );
    for (arg, value) in defaults {
        df = df.replace(&arg, &value);
    }
    let stages: Vec<&str> = df.split("\nFROM ").collect();
    let last = stages.last().unwrap();
    assert!(last.starts_with("gcr.io/distroless/cc-debian12"), "{last}");
    let build = stages[stages.len() - 2];
    assert!(build.contains("cargo build --release --locked --bin egress-proxies-operator"));
    assert!(build
        .contains("make runtime-libs BIN=target/release/egress-proxies-operator DEST=/runtime"));
    // Same Debian release in both stages, so the copied glibc matches.
    assert!(build.contains("bookworm") && last.contains("debian12"));
    assert!(last.contains("USER 65532:65532"));
    assert!(last.contains("ENTRYPOINT [\"/usr/local/bin/egress-proxies-operator\"]"));
    assert!(
        !last.contains("RUN "),
        "nothing runs in the runtime stage (it has no shell)"
    );
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l == "target/"));
    // The Rust version of the build stage is the one this repository builds with.
    let rustc = Command::new("rustc").arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&rustc.stdout);
    let minor = version
        .split_whitespace()
        .nth(1)
        .unwrap()
        .rsplit_once('.')
        .unwrap()
        .0
        .to_string();
    assert!(
        build.contains(&format!("rust:{minor}-bookworm")),
        "build stage should use rust:{minor}"
    );
}

#[test]
fn the_copied_libraries_are_all_the_binary_needs() {
    let bin = env!("CARGO_BIN_EXE_egress-proxies-operator");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    // The image's set: the operator's libraries and, with kvm, its libvirt
    // helper's (config/image/build-image.sh).
    let mut bins = vec![bin];
    if cfg!(feature = "kvm") {
        bins.push(env!("CARGO_BIN_EXE_egress-proxies-libvirt"));
    }
    for b in &bins {
        let out = Command::new("make")
            .arg("-s")
            .arg("runtime-libs")
            .arg(format!("BIN={b}"))
            .arg(format!("DEST={}", root.display()))
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    if cfg!(feature = "kvm") {
        assert!(names.iter().any(|n| n == "libvirt.so.0"), "{names:?}");
    }
    let bytes: u64 = files.iter().map(|p| p.metadata().unwrap().len()).sum();
    println!(
        "{} libraries, {:.1} MiB",
        files.len(),
        bytes as f64 / 1048576.0
    );
    let loader = files
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ld-linux")
        })
        .expect("the dynamic loader is copied");
    let lib_dirs: Vec<String> = files
        .iter()
        .filter(|p| p != &loader)
        .map(|p| p.parent().unwrap().display().to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
    )
    .unwrap();
    // Only the copied set: no ld.so.cache, and LD_DEBUG shows where each
    // library came from (the loader would fall back to /lib silently).
    let root = root.display().to_string();
    let run = |b: &str, args: &[&std::ffi::OsStr]| {
        let out = Command::new(loader)
            .args(["--inhibit-cache", "--library-path", &lib_dirs.join(":")])
            .arg(b)
            .args(args)
            .env_clear()
            .env("LD_DEBUG", "libs")
            .output()
            .unwrap();
        let debug = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{b}: {}{debug}",
            String::from_utf8_lossy(&out.stdout)
        );
        let loaded: Vec<String> = debug
            .lines()
            .filter_map(|l| l.split("calling init: ").nth(1))
            .map(String::from)
            .collect();
        assert!(loaded.len() > 3, "{debug}");
        let outside: Vec<&String> = loaded.iter().filter(|p| !p.starts_with(&root)).collect();
        assert!(
            outside.is_empty(),
            "{b} loaded from outside the copied set: {outside:?}"
        );
        loaded
    };
    let operator = run(
        bin,
        &[
            "--providers-config".as_ref(),
            providers.as_os_str(),
            "--check-config".as_ref(),
        ],
    );
    assert!(
        !operator.iter().any(|l| l.contains("libvirt")),
        "the operator loads no libvirt: {operator:?}"
    );
    if cfg!(feature = "kvm") {
        let helper = run(
            env!("CARGO_BIN_EXE_egress-proxies-libvirt"),
            &["--version".as_ref()],
        );
        assert!(
            helper.iter().any(|l| l.contains("libvirt.so")),
            "the helper loads libvirt from the copied set: {helper:?}"
        );
    }
}
