//! The base-image cache against a real libvirtd: downloaded once per host
//! and pool (also across provider instances and concurrent creates),
//! checksums enforced, HTTP errors classified.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;

use std::time::{Duration, Instant};

use egress_proxies_operator::config::KvmImage;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::{CreateRequest, ErrorClass, Provider};
use kvm_support::{init_logs, uid, virsh, Env};
use sha2::{Digest, Sha256};

fn request(uid: &str, image: &str) -> CreateRequest {
    kvm_support::request(uid, image, "inst-test")
}

fn image(url: &str, sha: Option<String>) -> KvmImage {
    KvmImage {
        url: url.to_string(),
        sha256: sha,
        format: None,
        firmware: Some("bios".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_image_cached_once_and_checksums_enforced() {
    init_logs();
    let env = Env::start("ic");
    let started = Instant::now();
    let (url, file) = env.serve_qcow2("good.qcow2", "32M");
    let sum: String = Sha256::digest(std::fs::read(&file).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (conc_url, _) = env.serve_qcow2("conc.qcow2", "32M");
    let (direct_url, _) = env.serve_qcow2("direct.qcow2", "32M");
    let mut cfg = env.config();
    cfg.allowed_image_urls = vec![format!("{}/direct", env.http.url)];
    cfg.images
        .insert("good".into(), image(&url, Some(sum.to_uppercase())));
    cfg.images.insert("conc".into(), image(&conc_url, None));
    cfg.images
        .insert("bad".into(), image(&url, Some("0".repeat(64))));
    cfg.images.insert(
        "missing".into(),
        image(&format!("{}/nope.qcow2", env.http.url), None),
    );

    let a = KvmProvider::new("kvm-a", &cfg)
        .unwrap()
        // These tests check what create itself returns.
        .with_create_wait(Duration::from_secs(600));
    let mut ids = Vec::new();
    for i in 0..2 {
        let r = request(&uid(&format!("ic{i}")), "good");
        env.track(&r.name);
        ids.push(a.create(&r).await.unwrap());
    }
    // Another provider instance on the same host and pool: the pool is the cache.
    let b = KvmProvider::new("kvm-b", &cfg)
        .unwrap()
        // These tests check what create itself returns.
        .with_create_wait(Duration::from_secs(600));
    let r = request(&uid("ic-b"), "good");
    env.track(&r.name);
    ids.push(b.create(&r).await.unwrap());
    assert_eq!(
        env.http.hits("/good.qcow2"),
        1,
        "downloaded once per host and pool"
    );

    // Concurrent creates of a new image: one download.
    let reqs: Vec<_> = (0..3)
        .map(|i| request(&uid(&format!("cc{i}")), "conc"))
        .collect();
    for r in &reqs {
        env.track(&r.name);
    }
    let results = futures::future::join_all(reqs.iter().map(|r| a.create(r))).await;
    for r in results {
        ids.push(r.unwrap());
    }
    assert_eq!(
        env.http.hits("/conc.qcow2"),
        1,
        "concurrent creates share one download"
    );

    // A direct URL is cached under base-<16 hex of its URL>.qcow2.
    let mut r = request(&uid("direct"), &direct_url);
    r.placement.image = direct_url.clone();
    env.track(&r.name);
    let e = a.create(&r).await;
    // Direct URLs boot UEFI; OVMF is installed, so this starts.
    ids.push(e.unwrap());
    assert!(env
        .volumes()
        .iter()
        .any(|v| v.starts_with("base-") && v.len() == "base-".len() + 16 + ".qcow2".len()));

    // Wrong checksum: Permanent, naming the image; nothing left behind.
    let r = request(&uid("bad"), "bad");
    let e = a.create(&r).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("image bad") && msg.contains("sha256"), "{msg}");
    let vols = env.volumes();
    let bad_base = format!("base-sha256-{}", "0".repeat(64));
    assert!(!vols.iter().any(|v| v.starts_with(&bad_base)), "{vols:?}");

    // 404: Permanent.
    let e = a.create(&request(&uid("nf"), "missing")).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
    assert!(e.to_string().contains("HTTP 404"), "{e}");

    for id in &ids {
        a.delete(id).await.unwrap();
    }
    let vols = env.volumes();
    assert!(!vols.iter().any(|v| v.starts_with("proxy-")), "{vols:?}");
    // Named by its content: the declared digest.
    let good_base = format!("base-sha256-{sum}.qcow2");
    assert!(vols.contains(&good_base), "{vols:?}");
    assert!(vols.contains(&format!("{good_base}.sha256")), "{vols:?}");
    eprintln!("image cache test took {:?}", started.elapsed());
}

fn sha256_hex(file: &std::path::Path) -> String {
    Sha256::digest(std::fs::read(file).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The host path of the base a domain's overlay is backed by.
fn backing_of(env: &Env, vm: &CreateRequest) -> std::path::PathBuf {
    let (ok, xml) = virsh(&[
        "vol-dumpxml",
        "--pool",
        &env.pool,
        &format!("{}.qcow2", vm.name),
    ]);
    assert!(ok, "{xml}");
    let backing = xml.split("<backingStore>").nth(1).unwrap_or_default();
    let path = backing
        .split("<path>")
        .nth(1)
        .and_then(|p| p.split("</path>").next())
        .unwrap_or_else(|| panic!("{} has no backing file: {xml}", vm.name));
    path.into()
}

/// Issue 17: editing a catalogue entry (the operator restarted with a new
/// image under the same key) never deletes or replaces the base a running
/// VM's overlay is backed by: the edited entry downloads into a base of its
/// own, the first VM's base keeps its content byte for byte, and the bases
/// are named by their content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_a_catalogue_entry_keeps_the_base_running_vms_use() {
    init_logs();
    let env = Env::start("ie");
    let (url_a, file_a) = env.serve_qcow2("v1.qcow2", "16M");
    let (url_b, file_b) = env.serve_qcow2("v2.qcow2", "24M");
    let (sum_a, sum_b) = (sha256_hex(&file_a), sha256_hex(&file_b));
    let mut cfg = env.config();
    cfg.images
        .insert("distro".into(), image(&url_a, Some(sum_a.clone())));
    let before = KvmProvider::new("kvm-e1", &cfg)
        .unwrap()
        .with_create_wait(Duration::from_secs(600));
    let first = request(&uid("ie1"), "distro");
    env.track(&first.name);
    let first_id = before.create(&first).await.unwrap();
    let base_a = backing_of(&env, &first);
    assert_eq!(sha256_hex(&base_a), sum_a);

    cfg.images
        .insert("distro".into(), image(&url_b, Some(sum_b.clone())));
    let after = KvmProvider::new("kvm-e2", &cfg)
        .unwrap()
        .with_create_wait(Duration::from_secs(600));
    let second = request(&uid("ie2"), "distro");
    env.track(&second.name);
    let second_id = after.create(&second).await.unwrap();

    assert_eq!(
        sha256_hex(&base_a),
        sum_a,
        "the base the first VM runs on was replaced"
    );
    let base_b = backing_of(&env, &second);
    assert_ne!(base_a, base_b);
    assert_eq!(sha256_hex(&base_b), sum_b);
    assert!(env.domain_exists(&first.name));
    assert_eq!(
        (env.http.hits("/v1.qcow2"), env.http.hits("/v2.qcow2")),
        (1, 1)
    );
    // Named by content, each with its digest marker.
    let vols = env.volumes();
    for sum in [&sum_a, &sum_b] {
        let base = format!("base-sha256-{sum}.qcow2");
        assert!(vols.contains(&base), "{base} not in {vols:?}");
        assert!(vols.contains(&format!("{base}.sha256")), "{vols:?}");
    }
    for id in [&first_id, &second_id] {
        after.delete(id).await.unwrap();
    }
}
