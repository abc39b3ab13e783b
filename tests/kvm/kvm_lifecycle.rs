//! The kvm provider's lifecycle against a real sshd and libvirtd
//! (tests/kvm_support): create, create again, get, list, delete twice.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;

use std::time::{Duration, Instant};

use egress_proxies_operator::config::ImageFormat;
use egress_proxies_operator::config::KvmImage;
use egress_proxies_operator::provider::error::plain_message;
use egress_proxies_operator::provider::kvm::ids::base_volume_for_url;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::{
    CreateRequest, ErrorClass, InstanceState, Provider, UserData,
};
use kvm_support::{capture_logs, uid, virsh, Env};

fn request(uid: &str, image: &str) -> CreateRequest {
    CreateRequest {
        cloud_init: UserData::new("#cloud-config\n# SENTINEL-SECRET\n"),
        ..kvm_support::request(uid, image, "inst-test")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_get_list_delete() {
    let logs = capture_logs();
    let env = Env::start("lc");
    let _keep = env.dir.path().to_path_buf();
    let started = Instant::now();
    let (url, _) = env.serve_qcow2("base.qcow2", "64M");
    // Without a sha256 the base is named by its URL.
    let base = base_volume_for_url(&url, ImageFormat::Qcow2);
    let mut cfg = env.config();
    cfg.images.insert(
        "test-image".into(),
        KvmImage {
            url,
            sha256: None,
            format: None,
            firmware: None,
        },
    );
    let p = KvmProvider::new("kvm-test", &cfg)
        .unwrap()
        // These tests check what create itself returns.
        .with_create_wait(Duration::from_secs(600));
    let u = uid("lc");
    let req = request(&u, "test-image");
    env.track(&req.name);

    // A leftover overlay on the wrong (no) backing file is rebuilt.
    let ov = format!("{}.qcow2", req.name);
    let (ok, out) = virsh(&["vol-create-as", &env.pool, &ov, "1M", "--format", "qcow2"]);
    assert!(ok, "{out}");

    let t = Instant::now();
    let id = p.create(&req).await.unwrap();
    eprintln!("create (cold image) took {:?}", t.elapsed());
    assert_eq!(id, format!("hosts/h1/domains/{}", req.name));
    let t = Instant::now();
    assert_eq!(p.create(&req).await.unwrap(), id);
    eprintln!("create again took {:?}", t.elapsed());
    assert_eq!(env.http.hits("/base.qcow2"), 1);

    let (_, vx) = virsh(&["vol-dumpxml", "--pool", &env.pool, &ov]);
    assert!(vx.contains(&base), "overlay not rebuilt on the base: {vx}");

    // A defined but stopped domain is started by create.
    let (ok, out) = virsh(&["destroy", &req.name]);
    assert!(ok, "{out}");
    assert_eq!(p.get(&id).await.unwrap().state, InstanceState::Stopped);
    assert_eq!(p.create(&req).await.unwrap(), id);
    let (_, st) = virsh(&["domstate", &req.name]);
    assert!(st.contains("running"), "{st}");

    // The domain runs under TCG but nothing answers DHCP: Provisioning.
    let inst = p.get(&id).await.unwrap();
    assert_eq!(inst.state, InstanceState::Provisioning, "{inst:?}");
    assert!(inst.ip.is_empty());
    assert_eq!(inst.uid, u);
    assert_eq!(inst.installation_id, "inst-test");

    // An entry libvirt's ARP source does not report (it skips permanent
    // ones, and libvirt 9.0 reads one netlink batch of a crowded table) is
    // still found in the host's whole neighbour table, /proc/net/arp read
    // over SSH: the domain runs with that address.
    let (ok, ifaces) = virsh(&["domiflist", &req.name]);
    assert!(ok, "{ifaces}");
    let mac = ifaces
        .split_whitespace()
        .find(|w| w.len() == 17 && w.matches(':').count() == 5)
        .unwrap_or_else(|| panic!("no MAC in {ifaces}"))
        .to_string();
    let seen_at = "10.199.77.5";
    let neigh = |verb: &str| {
        let mut args = vec!["neigh", verb, seen_at, "dev", env.bridge.as_str()];
        if verb == "add" {
            args.extend(["lladdr", mac.as_str(), "nud", "permanent"]);
        }
        let (ok, out) = kvm_support::run("ip", &args);
        assert!(ok, "ip neigh {verb}: {out}");
    };
    neigh("add");
    let (_, by_arp) = virsh(&["domifaddr", &req.name, "--source", "arp"]);
    assert!(!by_arp.contains(seen_at), "libvirt's ARP source: {by_arp}");
    // A provider whose kvm.allowedAddresses leaves the guest's private
    // address out never offers it: the guest has no address.
    let unlisted = KvmProvider::new(
        "kvm-test",
        &egress_proxies_operator::config::KvmConfig {
            allowed_addresses: vec!["10.213.0.0/16".into()],
            ..cfg.clone()
        },
    )
    .unwrap();
    let refused = unlisted.get(&id).await.unwrap();
    assert_eq!(
        (refused.state, refused.ip.as_str()),
        (InstanceState::Provisioning, ""),
        "{refused:?}"
    );
    let found = p.get(&id).await.unwrap();
    neigh("del");
    assert_eq!(
        (found.state, found.ip.as_str()),
        (InstanceState::Running, seen_at),
        "{found:?}"
    );
    let age = chrono::Utc::now() - inst.created_at.expect("createdAt");
    assert!(age.num_seconds() < 300, "{age}");
    let (_, xml) = virsh(&["dumpxml", &req.name]);
    assert!(xml.contains("<acpi/>") && xml.contains("OVMF"), "{xml}");
    assert!(
        xml.contains("type='qemu'") || xml.contains("type=\"qemu\""),
        "{xml}"
    );
    assert!(
        !xml.contains("SENTINEL"),
        "cloud-init leaked into the domain XML"
    );

    // Foreign domains: one without a mark, one whose mark does not parse.
    let uri = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm";
    let foreign = [
        ("epo-foreign-plain", String::new()),
        (
            "epo-foreign-bad",
            format!("<metadata><other xmlns=\"{uri}\"><managed>true</managed></other></metadata>"),
        ),
    ];
    for (name, meta) in &foreign {
        env.track(name);
        let f = env.dir.path().join(format!("{name}.xml"));
        std::fs::write(
            &f,
            format!("<domain type=\"qemu\"><name>{name}</name>{meta}<memory unit=\"MiB\">64</memory><os><type arch=\"x86_64\">hvm</type></os></domain>"),
        )
        .unwrap();
        let (ok, out) = virsh(&["define", f.to_str().unwrap()]);
        assert!(ok, "{out}");
    }
    let plain = p.get("hosts/h1/domains/epo-foreign-plain").await.unwrap();
    assert_eq!(
        (plain.state, plain.uid.as_str()),
        (InstanceState::Stopped, "")
    );
    let e = p.get("hosts/h1/domains/epo-foreign-bad").await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");

    let listing = p.list_by_tag().await.unwrap();
    assert!(
        listing
            .instances
            .iter()
            .all(|i| !i.id.contains("epo-foreign")),
        "{listing:?}"
    );
    let mine = listing
        .instances
        .iter()
        .find(|i| i.id == id)
        .expect("listed");
    assert_eq!(mine.uid, u);
    assert_eq!(mine.installation_id, "inst-test");

    // Same name, another UID: Permanent.
    let mut other = req.clone();
    other.uid = "someone-else".into();
    let e = p.create(&other).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");

    let vols = env.volumes();
    for v in [
        format!("{}.qcow2", req.name),
        format!("{}-seed.iso", req.name),
        base.clone(),
        format!("{base}.sha256"),
    ] {
        assert!(vols.contains(&v), "{v} not in {vols:?}");
    }

    // The seed is a valid ISO 9660 image labelled cidata for other readers.
    let seed = env.pool_dir.join(format!("{}-seed.iso", req.name));
    let (ok, label) = kvm_support::run(
        "blkid",
        &["-o", "value", "-s", "LABEL", seed.to_str().unwrap()],
    );
    assert!(ok && label.trim() == "cidata", "blkid: {label}");
    let (_, kind) = kvm_support::run(
        "blkid",
        &["-o", "value", "-s", "TYPE", seed.to_str().unwrap()],
    );
    assert_eq!(kind.trim(), "iso9660");
    if std::path::Path::new("/usr/bin/isoinfo").exists() {
        let (ok, names) = kvm_support::run("isoinfo", &["-J", "-f", "-i", seed.to_str().unwrap()]);
        assert!(ok, "{names}");
        let names: Vec<&str> = names.lines().map(str::trim).collect();
        assert_eq!(
            names,
            ["/meta-data", "/user-data", "/vendor-data"],
            "isoinfo -J -f"
        );
        let (ok, ud) = kvm_support::run(
            "isoinfo",
            &["-J", "-x", "/user-data", "-i", seed.to_str().unwrap()],
        );
        assert!(ok);
        assert_eq!(ud, req.cloud_init.expose(), "user-data byte for byte");
    }

    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    let e = p.get(&id).await.unwrap_err();
    assert!(e.is(ErrorClass::NotFound), "{e}");
    assert!(!env.domain_exists(&req.name));
    let vols = env.volumes();
    assert!(!vols.iter().any(|v| v.starts_with(&req.name)), "{vols:?}");
    assert!(vols.contains(&base), "{vols:?}");
    let listing = p.list_by_tag().await.unwrap();
    assert!(listing.instances.iter().all(|i| i.id != id));

    // Malformed and unconfigured IDs.
    assert!(p
        .get("zones/a/instances/b")
        .await
        .unwrap_err()
        .is(ErrorClass::Permanent));
    assert!(p
        .get("hosts/nope/domains/x")
        .await
        .unwrap_err()
        .is(ErrorClass::Permanent));
    // A host not (or no longer) configured may still run the domain: the
    // delete is never reported done.
    let refused = p.delete("hosts/nope/domains/x").await.unwrap_err();
    assert!(refused.is(ErrorClass::Permanent));
    assert!(
        plain_message(&refused).contains("\"nope\" is no longer in kvm.hosts"),
        "{}",
        plain_message(&refused)
    );
    let text = logs.text();
    assert!(!text.contains("SENTINEL"), "cloud-init reached the logs");
    assert!(
        !text.contains("PRIVATE KEY"),
        "key material reached the logs"
    );
    for part in [
        "rpc=\"virDomainDefineXML\"",
        "rpc=\"virStorageVolUpload\"",
        "ssh.dial",
        "kvm.image_download",
        "cloud_init_bytes=",
    ] {
        assert!(text.contains(part), "{part} missing from the logs");
    }
    eprintln!("lifecycle test took {:?}", started.elapsed());
}
