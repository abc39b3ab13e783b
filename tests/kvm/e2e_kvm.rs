//! System test: a Proxy on a kvm provider whose host is a local sshd in
//! front of a real libvirtd (tests/kvm_support), reconciled by the real
//! operator binary on the real test cluster (control plane only, the test's
//! namespace).
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;
use crate::support;

use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::provider::naming::name_from_uid;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use kvm_support::{virsh, Env};
use serde_json::json;
use support::{eventually, Operator};

/// Creates the Proxy `k1` on host h1 of the provider `kvm-test`.
async fn create_k1(proxies: &Api<Proxy>, cloud_init: &str) -> Proxy {
    let proxy = support::proxy(
        "k1",
        json!({
            "provider": "kvm-test", "port": 3128,
            "placement": {"zone": "h1", "machineType": "small", "image": "test-image"},
            "cloudInit": {"inline": cloud_init},
        }),
    );
    proxies
        .create(&PostParams::default(), &proxy)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm_proxy_gets_a_marked_domain_and_deleting_it_removes_everything() {
    let env = Env::start("e2e");
    let (url, _) = env.serve_qcow2("base.qcow2", "64M");
    let providers = env.providers_yaml("kvm-test", "h1", "test-image", &url);
    let ground = support::ground_without_pods("kvm").await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.operator(dir.path(), &providers);
    // The flag wins over the ground's INSTALLATION_ID.
    cmd.args(["--installation-id", "inst-e2e"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));

    let proxies: Api<Proxy> = ground.proxies();
    let created = create_k1(&proxies, "#cloud-config\npackages: [squid]\n").await;
    let uid = created.metadata.uid.clone().unwrap();
    let domain = name_from_uid(&uid);
    env.track(&domain);

    let id = eventually(
        "the instance recorded",
        Duration::from_secs(180),
        || async { proxies.get("k1").await.ok()?.status?.provider_id },
    )
    .await;
    assert_eq!(id, format!("hosts/h1/domains/{domain}"));
    let (ok, state) = virsh(&["domstate", &domain]);
    assert!(ok && state.trim() == "running", "domain state: {state}");
    let (_, xml) = virsh(&["dumpxml", &domain]);
    assert!(
        xml.contains("type='qemu'") || xml.contains("type=\"qemu\""),
        "{xml}"
    );
    for mark in [
        "<managed>true</managed>",
        &format!("<uid>{uid}</uid>"),
        "<installation>inst-e2e</installation>",
    ] {
        assert!(xml.contains(mark), "domain metadata lacks {mark}: {xml}");
    }
    let volumes = env.volumes();
    for v in [format!("{domain}.qcow2"), format!("{domain}-seed.iso")] {
        assert!(volumes.contains(&v), "pool lacks {v}: {volumes:?}");
    }

    proxies
        .delete("k1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Proxy released", Duration::from_secs(120), || async {
        proxies.get_opt("k1").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!env.domain_exists(&domain), "the domain must be gone");
    let volumes = env.volumes();
    assert!(
        !volumes.iter().any(|v| v.starts_with(&domain)),
        "overlay and seed must be gone: {volumes:?}"
    );
}

/// A reload that drops the host a Proxy's domain runs on: deleting the
/// Proxy then keeps its finalizer and shows `Deleting=False/CleanupFailed`
/// naming the host (the domain may still run there, so the operator never
/// calls it gone), and the domain is left alone; once the host is back in
/// the config the deletion completes and the domain is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm_proxy_whose_host_left_the_config_keeps_its_finalizer() {
    let env = Env::start("hostleft");
    let (url, _) = env.serve_qcow2("base.qcow2", "64M");
    let with_h1 = env.providers_yaml("kvm-test", "h1", "test-image", &url);
    let without_h1 = env.providers_yaml("kvm-test", "h2", "test-image", &url);
    let ground = support::ground_without_pods("kvm-hostleft").await;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.operator(dir.path(), &with_h1);
    cmd.args(["--providers-config-reload-interval", "1s"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let rewrite = |text: &str| {
        let tmp = dir.path().join("providers.yaml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.path().join("providers.yaml")).unwrap();
    };
    let reloads = || {
        std::fs::read_to_string(dir.path().join("operator.log"))
            .unwrap_or_default()
            .matches("providers config reloaded")
            .count()
    };

    let proxies: Api<Proxy> = ground.proxies();
    let created = create_k1(&proxies, "#cloud-config\n").await;
    let domain = name_from_uid(&created.metadata.uid.clone().unwrap());
    env.track(&domain);
    eventually("the domain defined", Duration::from_secs(180), || async {
        env.domain_exists(&domain).then_some(())
    })
    .await;
    // The create finished and was recorded: the domain runs on h1 when h1
    // leaves (a create still in flight is another case; under a loaded
    // CI its end came after the 60 s wait below).
    eventually(
        "the instance recorded",
        Duration::from_secs(180),
        || async { proxies.get("k1").await.ok()?.status?.provider_id },
    )
    .await;

    rewrite(&without_h1);
    eventually("the reload without h1", Duration::from_secs(30), || async {
        (reloads() >= 1).then_some(())
    })
    .await;
    proxies
        .delete("k1", &DeleteParams::default())
        .await
        .unwrap();
    let message = eventually("CleanupFailed", Duration::from_secs(60), || async {
        let p = proxies.get("k1").await.ok()?;
        let c = support::condition(&p, "Deleting")?;
        (c.reason == "CleanupFailed").then(|| c.message.clone())
    })
    .await;
    println!("{message}");
    assert!(
        message.contains("\"h1\" is no longer in kvm.hosts"),
        "{message}"
    );
    let described = ground.kubectl(&["describe", "px", "k1"]);
    assert!(described.contains("CleanupFailed"), "{described}");
    assert!(env.domain_exists(&domain), "the domain is left alone");
    assert!(
        proxies
            .get("k1")
            .await
            .unwrap()
            .metadata
            .finalizers
            .is_some(),
        "the finalizer is kept"
    );

    rewrite(&with_h1);
    eventually("the Proxy released", Duration::from_secs(120), || async {
        proxies.get_opt("k1").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!env.domain_exists(&domain), "the domain must be gone");
}
