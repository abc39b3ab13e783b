//! Cancelling one operation must not cut off others on the same host: a
//! create stuck in a slow image download is dropped by a timeout while
//! gets, checks and another create on that host go on; the next create of
//! the same image recovers from the partial download.
#![cfg(feature = "kvm")]

mod kvm_support;

use std::time::{Duration, Instant};

use egress_proxies_operator::api::Placement;
use egress_proxies_operator::config::KvmImage;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::naming::name_from_uid;
use egress_proxies_operator::provider::{CreateRequest, ErrorClass, Provider, UserData};
use kvm_support::{init_logs, uid, Env};

fn request(tag: &str, image: &str) -> CreateRequest {
    let u = uid(tag);
    CreateRequest {
        name: name_from_uid(&u),
        uid: u,
        placement: Placement {
            image: image.into(),
            machine_type: "small".into(),
            ..Default::default()
        },
        cloud_init: UserData::new("#cloud-config\n"),
        installation_id: "inst".into(),
        ..Default::default()
    }
}

fn bios(url: String) -> KvmImage {
    KvmImage {
        url,
        sha256: None,
        format: None,
        firmware: Some("bios".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_one_create_leaves_the_host_usable() {
    init_logs();
    let Some(env) = Env::start("cx") else { return };
    let started = Instant::now();
    // qcow2 metadata only is small; make the slow image a 4 MiB raw file.
    let slow_file = env.dir.path().join("slow.raw");
    std::fs::write(&slow_file, vec![7u8; 4 << 20]).unwrap();
    let slow_url = env
        .http
        .add_slow("/slow.raw", &slow_file, Duration::from_millis(100));
    let (fast_url, _) = env.serve_qcow2("fast.qcow2", "16M");
    let mut cfg = env.config();
    let mut slow = bios(slow_url);
    slow.format = Some("raw".into());
    cfg.images.insert("slow".into(), slow);
    cfg.images.insert("fast".into(), bios(fast_url));
    let p = KvmProvider::new("kvm-cancel", &cfg).unwrap();

    let stuck = request("stuck", "slow");
    env.track(&stuck.name);
    let other = request("other", "fast");
    env.track(&other.name);
    let stuck_create = tokio::time::timeout(Duration::from_secs(2), p.create(&stuck));
    let others = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let id = p.create(&other).await.expect("create beside a stuck one");
        let inst = p.get(&id).await.expect("get beside a stuck one");
        let verdicts = p.checker().unwrap().check().await;
        (id, inst, verdicts)
    };
    let (cancelled, (id, inst, verdicts)) = tokio::join!(stuck_create, others);
    assert!(
        cancelled.is_err(),
        "the slow create should have been cut by the timeout"
    );
    assert_eq!(inst.uid, other.uid);
    assert!(verdicts[0].ready, "{verdicts:?}");

    // After the cancellation the host still answers, and nothing of the
    // cancelled domain exists.
    assert!(p.get(&id).await.is_ok());
    let stuck_id = format!("hosts/h1/domains/{}", stuck.name);
    assert!(p.get(&stuck_id).await.unwrap_err().is(ErrorClass::NotFound));
    assert!(!env.volumes().contains(&"base-slow.raw.sha256".to_string()));

    // The partial base is replaced by the next create (now unthrottled).
    env.http.add_slow("/slow.raw", &slow_file, Duration::ZERO);
    let id2 = p
        .create(&stuck)
        .await
        .expect("create after a cancelled download");
    assert_eq!(env.http.hits("/slow.raw"), 2);
    let vols = env.volumes();
    assert!(
        vols.contains(&"base-slow.raw.sha256".to_string()),
        "{vols:?}"
    );
    let size = std::fs::metadata(env.pool_dir.join("base-slow.raw"))
        .unwrap()
        .len();
    assert_eq!(size, 4 << 20);
    p.delete(&id).await.unwrap();
    p.delete(&id2).await.unwrap();
    eprintln!("cancel test took {:?}", started.elapsed());
}
