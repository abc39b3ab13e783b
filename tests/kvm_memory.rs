//! Peak memory of a 256 MiB base-image upload (its own test binary, so
//! the process's VmHWM is not inflated by other tests).
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod kvm_support;

use std::time::{Duration, Instant};

use egress_proxies_operator::config::KvmImage;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::Provider;
use kvm_support::{init_logs, run, uid, vm_hwm_kib, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_upload_of_256_mib_stays_bounded() {
    init_logs();
    let env = Env::start("mem");
    let file = env.dir.path().join("big.raw");
    // 256 MiB, mostly sparse, with some data so it is not all zeros.
    let (ok, out) = run("truncate", &["-s", "256M", file.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = run(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", file.display()),
            "bs=1M",
            "count=16",
            "conv=notrunc",
            "status=none",
        ],
    );
    assert!(ok, "{out}");
    let url = env.http.add("/big.raw", &file);
    let mut cfg = env.config();
    cfg.images.insert(
        "big".into(),
        KvmImage {
            url,
            sha256: None,
            format: Some("raw".into()),
            firmware: Some("bios".into()),
        },
    );
    let p = KvmProvider::new("kvm-mem", &cfg)
        .unwrap()
        // These tests check what create itself returns.
        .with_create_wait(Duration::from_secs(600));
    // Warm up: SSH session, libvirt connection, HTTP client.
    let verdicts = p.checker().unwrap().check().await;
    assert!(verdicts[0].ready, "{verdicts:?}");
    let idle = vm_hwm_kib();
    let u = uid("mem");
    let req = kvm_support::request(&u, "big", "inst");
    env.track(&req.name);
    let t = Instant::now();
    let id = p.create(&req).await.unwrap();
    let took = t.elapsed();
    let peak = vm_hwm_kib();
    let delta_mib = peak.saturating_sub(idle) as f64 / 1024.0;
    eprintln!(
        "256 MiB image: create took {took:?}; VmHWM idle {:.1} MiB, peak {:.1} MiB, delta {delta_mib:.1} MiB",
        idle as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    assert!(
        delta_mib < 64.0,
        "upload raised the peak by {delta_mib:.1} MiB"
    );
    // Bases are named by content (or, without a declared sha256, by the
    // URL's digest): the one base volume in the pool is the upload.
    let bases: Vec<std::path::PathBuf> = std::fs::read_dir(&env.pool_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("base-") && name.ends_with(".raw")
        })
        .collect();
    assert_eq!(bases.len(), 1, "one base volume: {bases:?}");
    let size = std::fs::metadata(&bases[0]).unwrap().len();
    assert_eq!(size, 256 << 20);
    p.delete(&id).await.unwrap();
}
