//! libvirt lives in its own process (issue 34): the operator's binary does
//! not link libvirt's client library, its helper does, and an operator
//! whose helper is missing says so, naming the path, in the host check
//! and in Create's error (Unavailable: fixed by the install, not a retry).
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;

use std::process::Command;
use std::time::Duration;

use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::{ErrorClass, Provider};
use kvm_support::{init_logs, uid, Env};

/// The shared libraries a binary names (its dynamic section's NEEDED).
fn needed(bin: &str) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["--dynamic", "--wide", bin])
        .output()
        .expect("readelf runs (binutils)");
    assert!(out.status.success(), "readelf {bin}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next().map(String::from))
        .collect()
}

#[test]
fn only_the_helper_links_libvirt() {
    let operator = needed(env!("CARGO_BIN_EXE_egress-proxies-operator"));
    assert!(
        operator.iter().any(|l| l.starts_with("libc.so")),
        "the operator's NEEDED list was read: {operator:?}"
    );
    assert!(
        !operator.iter().any(|l| l.contains("libvirt")),
        "the operator links no libvirt: {operator:?}"
    );
    let helper = needed(env!("CARGO_BIN_EXE_egress-proxies-libvirt"));
    assert!(
        helper.iter().any(|l| l.starts_with("libvirt.so")),
        "the helper links libvirt: {helper:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_helper_is_named_in_the_check_and_in_create() {
    init_logs();
    let env = Env::start("hx");
    let missing = env.dir.path().join("not-installed/egress-proxies-libvirt");
    let mut cfg = env.config();
    // Never fetched: Create fails at the libvirt connection, before it.
    cfg.images.insert(
        "img".into(),
        kvm_support::bios_image("http://127.0.0.1:9/img.qcow2".into()),
    );
    let p = KvmProvider::new("kvm-nohelper", &cfg)
        .unwrap()
        .with_check_timeout(Duration::from_secs(20))
        .with_libvirt_helper(&missing);
    let verdicts = p.checker().unwrap().check().await;
    let v = &verdicts[0];
    assert_eq!(v.reason, "LibvirtConnectFailed", "{v:?}");
    assert!(!v.ready);
    assert!(
        v.message.contains(&missing.display().to_string()),
        "the message names the helper's path: {v:?}"
    );
    let mut req = kvm_support::request(&uid("hx"), "img", "inst");
    req.placement.zone = "h1".into();
    let e = p.create(&req).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
    assert!(e.to_string().contains("libvirt helper"), "{e}");

    // The same provider with its helper found serves the host.
    let found = KvmProvider::new("kvm-helper", &env.config())
        .unwrap()
        .with_check_timeout(Duration::from_secs(20));
    let v = &found.checker().unwrap().check().await[0];
    assert_eq!(v.reason, "Reachable", "{v:?}");
}
