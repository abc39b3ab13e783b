//! A create stuck in a slow first image download returns its ID and goes on
//! in the background (reported Provisioning) while gets, checks and another
//! create on that host go on; deleting it cancels the download, and the
//! next create of the same image recovers from the partial download. A
//! background create that fails is reported by the next get, once.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;

use std::time::{Duration, Instant};

use egress_proxies_operator::config::ImageFormat;
use egress_proxies_operator::provider::kvm::ids::base_volume_for_url;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::{CreateRequest, ErrorClass, InstanceState, Provider};
use kvm_support::{init_logs, uid, Env};

fn request(tag: &str, image: &str) -> CreateRequest {
    kvm_support::request(&uid(tag), image, "inst")
}

/// Polls `f` every 200 ms for up to `limit`.
async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_create_goes_on_in_the_background_and_delete_cancels_it() {
    init_logs();
    let env = Env::start("cx");
    let started = Instant::now();
    // qcow2 metadata only is small; make the slow image a 4 MiB raw file
    // (64 chunks of 64 KiB, 100 ms apart: about 6 s).
    let slow_file = env.dir.path().join("slow.raw");
    std::fs::write(&slow_file, vec![7u8; 4 << 20]).unwrap();
    let slow_url = env
        .http
        .add_slow("/slow.raw", &slow_file, Duration::from_millis(100));
    // Without a sha256 the base is named by its URL.
    let slow_base = base_volume_for_url(&slow_url, ImageFormat::Raw);
    let (fast_url, _) = env.serve_qcow2("fast.qcow2", "16M");
    // A second slow image (2 MiB, 32 chunks 150 ms apart: about 5 s), for a
    // create still downloading while another is cancelled.
    let slow2_file = env.dir.path().join("slow2.raw");
    std::fs::write(&slow2_file, vec![9u8; 2 << 20]).unwrap();
    let slow2_url = env
        .http
        .add_slow("/slow2.raw", &slow2_file, Duration::from_millis(150));
    let mut cfg = env.config();
    let mut slow = kvm_support::bios_image(slow_url.clone());
    slow.format = Some("raw".into());
    cfg.images.insert("slow".into(), slow);
    let mut slow2 = kvm_support::bios_image(slow2_url);
    slow2.format = Some("raw".into());
    cfg.images.insert("slow2".into(), slow2);
    cfg.images
        .insert("fast".into(), kvm_support::bios_image(fast_url));
    // The same slow bytes under a checksum they do not have.
    let mut bad = kvm_support::bios_image(slow_url);
    bad.format = Some("raw".into());
    bad.sha256 = Some("0".repeat(64));
    cfg.images.insert("badsum".into(), bad);
    let p = KvmProvider::new("kvm-cancel", &cfg)
        .unwrap()
        .with_create_wait(Duration::from_secs(1));

    let stuck = request("stuck", "slow");
    env.track(&stuck.name);
    let other = request("other", "fast");
    env.track(&other.name);
    let t0 = Instant::now();
    let stuck_id = p.create(&stuck).await.expect("create returns its ID");
    println!(
        "create returned its ID after {:?} (create wait 1 s)",
        t0.elapsed()
    );
    // Still Provisioning: the create did not wait for its download.
    let inst = p.get(&stuck_id).await.expect("get of a create in progress");
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert_eq!(
        (inst.uid.as_str(), inst.installation_id.as_str()),
        (stuck.uid.as_str(), "inst")
    );
    assert!(!env.domain_exists(&stuck.name));

    // Beside it, another create on the same host finishes.
    let id = p.create(&other).await.expect("create beside a stuck one");
    until("the other domain", Duration::from_secs(60), || {
        env.domain_exists(&other.name)
    })
    .await;
    let inst = p.get(&id).await.expect("get beside a stuck one");
    assert_eq!(inst.uid, other.uid);
    let verdicts = p.checker().unwrap().check().await;
    assert!(verdicts[0].ready, "{verdicts:?}");

    // Another create on the same host, still downloading its own image
    // while the stuck one is cancelled below.
    let beside = request("beside", "slow2");
    env.track(&beside.name);
    let beside_id = p.create(&beside).await.expect("create beside, downloading");
    let inst = p.get(&beside_id).await.expect("get of the create beside");
    assert_eq!(inst.state, InstanceState::Provisioning, "still downloading");

    // Deleting the stuck one cancels its download: nothing of it is left.
    p.delete(&stuck_id).await.unwrap();
    assert!(p.get(&stuck_id).await.unwrap_err().is(ErrorClass::NotFound));
    assert!(!env.volumes().contains(&format!("{slow_base}.sha256")));
    assert!(!env.domain_exists(&stuck.name));

    // The cancel was the stuck one's alone: the create beside it goes on,
    // its one download not restarted, and its domain is defined.
    until(
        "the create beside the cancel",
        Duration::from_secs(60),
        || env.domain_exists(&beside.name),
    )
    .await;
    let inst = p.get(&beside_id).await.expect("get of the create beside");
    assert_eq!(inst.uid, beside.uid);
    assert_eq!(env.http.hits("/slow2.raw"), 1, "its download ran once");
    p.delete(&beside_id).await.unwrap();

    // The partial base is replaced by the next create (now unthrottled).
    env.http.add_slow("/slow.raw", &slow_file, Duration::ZERO);
    let id2 = p
        .create(&stuck)
        .await
        .expect("create after a cancelled download");
    until("the recreated domain", Duration::from_secs(60), || {
        env.domain_exists(&stuck.name)
    })
    .await;
    assert_eq!(env.http.hits("/slow.raw"), 2);
    let vols = env.volumes();
    assert!(vols.contains(&format!("{slow_base}.sha256")), "{vols:?}");
    let size = std::fs::metadata(env.pool_dir.join(&slow_base))
        .unwrap()
        .len();
    assert_eq!(size, 4 << 20);
    p.delete(&id).await.unwrap();
    p.delete(&id2).await.unwrap();

    // A background create that fails (checksum) is reported by get, once,
    // with its class; then the host's view (nothing there) is NotFound.
    env.http
        .add_slow("/slow.raw", &slow_file, Duration::from_millis(40));
    let bad = request("bad", "badsum");
    env.track(&bad.name);
    let bad_id = p.create(&bad).await.expect("returns while downloading");
    let e = loop {
        match p.get(&bad_id).await {
            Ok(i) => {
                assert_eq!(i.state, InstanceState::Provisioning);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => break e,
        }
    };
    assert!(e.is(ErrorClass::Permanent), "{e}");
    assert!(e.to_string().contains("sha256"), "{e}");
    assert!(p.get(&bad_id).await.unwrap_err().is(ErrorClass::NotFound));
    eprintln!("background create test took {:?}", started.elapsed());
}
