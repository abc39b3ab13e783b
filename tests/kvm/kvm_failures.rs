//! Health-check reasons and Create error classes for broken hosts, against
//! a real sshd and libvirtd: SSH refused, wrong host key, missing pool,
//! stopped pool, missing libvirt socket, missing (then appearing) SSH key.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use egress_proxies_operator::config::KvmImage;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::{CreateRequest, ErrorClass, Provider};
use kvm_support::{init_logs, uid, Env};

fn request(zone: &str) -> CreateRequest {
    let mut r = kvm_support::request(&uid(zone), "img", "inst");
    r.placement.zone = zone.into();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reasons_and_create_classes() {
    init_logs();
    let env = Env::start("fl");
    let started = Instant::now();
    let (url, _) = env.serve_qcow2("img.qcow2", "16M");

    // known_hosts: the real entry plus a different key for localhost.
    let other = env.dir.path().join("other_host_key");
    kvm_support::new_ed25519_key(&other);
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let mut kh = std::fs::read_to_string(&env.known_hosts).unwrap();
    let mut parts = other_pub.split_whitespace();
    kh.push_str(&format!(
        "[localhost]:{} {} {}\n",
        env.ssh_port,
        parts.next().unwrap(),
        parts.next().unwrap()
    ));
    let kh_file = env.dir.path().join("known_hosts_mixed");
    std::fs::write(&kh_file, kh).unwrap();

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // dropped: nothing listens there now
    let stopped = env.stopped_pool(&format!("{}-stopped", env.pool));

    let mut cfg = env.config();
    cfg.known_hosts_file = kh_file.display().to_string();
    cfg.images
        .insert("img".into(), kvm_support::bios_image(url));
    let mut hosts = vec![env.host("ok")];
    let mut h = env.host("refused");
    h.address = format!("127.0.0.1:{closed}");
    hosts.push(h);
    let mut h = env.host("wrongkey");
    h.address = format!("localhost:{}", env.ssh_port);
    hosts.push(h);
    let mut h = env.host("nopool");
    h.pool = "does-not-exist".into();
    hosts.push(h);
    let mut h = env.host("stoppedpool");
    h.pool = stopped.clone();
    hosts.push(h);
    let mut h = env.host("nosocket");
    h.socket = "/nonexistent/libvirt-sock".into();
    hosts.push(h);
    cfg.hosts = hosts;

    let p = KvmProvider::new("kvm-fail", &cfg)
        .unwrap()
        .with_check_timeout(Duration::from_secs(20));
    let t = Instant::now();
    let verdicts = p.checker().unwrap().check().await;
    eprintln!("check of {} hosts took {:?}", verdicts.len(), t.elapsed());
    let names: Vec<_> = verdicts.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "ok",
            "refused",
            "wrongkey",
            "nopool",
            "stoppedpool",
            "nosocket"
        ]
    );
    let by: HashMap<_, _> = verdicts.iter().map(|v| (v.name.as_str(), v)).collect();
    for (host, reason) in [
        ("ok", "Reachable"),
        ("refused", "Unreachable"),
        ("wrongkey", "SSHHandshakeFailed"),
        ("nopool", "PoolNotFound"),
        ("stoppedpool", "PoolNotActive"),
        ("nosocket", "LibvirtConnectFailed"),
    ] {
        let v = by[host];
        assert_eq!(v.reason, reason, "{host}: {v:?}");
        assert_eq!(v.ready, reason == "Reachable", "{host}");
        assert_eq!(
            v.details["pool"],
            cfg.hosts.iter().find(|h| h.name == host).unwrap().pool
        );
    }
    let ok = by["ok"];
    for k in [
        "hostname",
        "libvirtVersion",
        "poolState",
        "poolAvailable",
        "poolCapacity",
    ] {
        assert!(
            !ok.details.get(k).map(String::is_empty).unwrap_or(true),
            "{k}: {ok:?}"
        );
    }
    assert!(
        by["stoppedpool"].message.contains("inactive"),
        "{:?}",
        by["stoppedpool"]
    );

    for (zone, class) in [
        ("refused", ErrorClass::Transient),
        ("wrongkey", ErrorClass::Unavailable),
        ("nopool", ErrorClass::Permanent),
        ("stoppedpool", ErrorClass::Transient),
        ("nosocket", ErrorClass::Transient),
        ("unknown-host", ErrorClass::Permanent),
    ] {
        let e = p.create(&request(zone)).await.unwrap_err();
        assert_eq!(e.class(), class, "{zone}: {e}");
    }
    // One unreadable host fails the whole listing.
    let e = p.list_by_tag().await.unwrap_err();
    assert!(
        e.to_string().contains("refused") || e.to_string().contains("host"),
        "{e}"
    );

    // A host that accepts TCP but never speaks SSH: the check answers
    // Timeout at its own deadline.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg3 = env.config();
    cfg3.hosts[0].address = silent.local_addr().unwrap().to_string();
    let p3 = KvmProvider::new("kvm-silent", &cfg3)
        .unwrap()
        .with_check_timeout(Duration::from_millis(700));
    let t = Instant::now();
    let v = p3.checker().unwrap().check().await;
    assert_eq!(v[0].reason, "Timeout", "{v:?}");
    println!(
        "silent host: Timeout after {:?} (check timeout 700 ms)",
        t.elapsed()
    );

    // Placement errors name the field.
    let mut r = request("ok");
    r.placement.machine_type = "huge".into();
    let e = p.create(&r).await.unwrap_err();
    assert!(
        e.is(ErrorClass::Permanent) && e.to_string().contains("placement.machineType"),
        "{e}"
    );
    let mut r = request("ok");
    r.placement.image = "nope".into();
    let e = p.create(&r).await.unwrap_err();
    assert!(
        e.is(ErrorClass::Permanent) && e.to_string().contains("placement.image"),
        "{e}"
    );

    // Key material missing at first: Transient, SSHMaterialUnavailable;
    // the provider heals when the file appears, without a restart.
    let late_key = env.dir.path().join("late_key");
    let kh_copy = env.dir.path().join("known_hosts_copy");
    std::fs::copy(&env.known_hosts, &kh_copy).unwrap();
    let mut cfg2 = env.config();
    cfg2.ssh_key_file = late_key.display().to_string();
    cfg2.known_hosts_file = kh_copy.display().to_string();
    let p2 = KvmProvider::new("kvm-late", &cfg2).unwrap();
    let v = p2.checker().unwrap().check().await;
    assert_eq!(v[0].reason, "SSHMaterialUnavailable", "{v:?}");
    let e = p2.get("hosts/h1/domains/proxy-x").await.unwrap_err();
    assert!(e.is(ErrorClass::Transient), "{e}");
    std::fs::write(&late_key, "not a key").unwrap();
    let e = p2.get("hosts/h1/domains/proxy-x").await.unwrap_err();
    assert!(e.is(ErrorClass::Unavailable), "unparseable key: {e}");
    std::fs::copy(&env.key_file, &late_key).unwrap();
    let v = p2.checker().unwrap().check().await;
    assert_eq!(v[0].reason, "Reachable", "{v:?}");
    let e = p2.get("hosts/h1/domains/proxy-x").await.unwrap_err();
    assert!(e.is(ErrorClass::NotFound), "{e}");

    // A host re-key (known_hosts rotated) is picked up without a restart:
    // the live session is redialled with the new material.
    let good_kh = std::fs::read_to_string(&kh_copy).unwrap();
    let mut parts = other_pub.split_whitespace();
    std::fs::write(
        &kh_copy,
        format!(
            "[127.0.0.1]:{} {} {}\n",
            env.ssh_port,
            parts.next().unwrap(),
            parts.next().unwrap()
        ),
    )
    .unwrap();
    let e = p2.get("hosts/h1/domains/proxy-x").await.unwrap_err();
    assert!(e.is(ErrorClass::Unavailable), "changed host key: {e}");
    let v = p2.checker().unwrap().check().await;
    assert_eq!(v[0].reason, "SSHHandshakeFailed", "{v:?}");
    std::fs::write(&kh_copy, good_kh).unwrap();
    let v = p2.checker().unwrap().check().await;
    assert_eq!(v[0].reason, "Reachable", "{v:?}");

    // A pool too small for the image: QuotaExceeded before any upload.
    {
        let tiny = env.tiny_pool(&format!("{}-tiny", env.pool), "8m");
        let big = env.dir.path().join("big16.raw");
        std::fs::write(&big, vec![1u8; 16 << 20]).unwrap();
        let mut cfg6 = env.config();
        cfg6.hosts[0].pool = tiny;
        cfg6.images.insert(
            "img".into(),
            KvmImage {
                format: Some("raw".into()),
                ..kvm_support::bios_image(env.http.add("/big16.raw", &big))
            },
        );
        let p6 = KvmProvider::new("kvm-tiny", &cfg6).unwrap();
        let mut r = request("");
        r.placement.zone = String::new();
        let e = p6.create(&r).await.unwrap_err();
        assert!(e.is(ErrorClass::QuotaExceeded), "{e}");
        assert_eq!(env.http.hits("/big16.raw"), 1, "asked once, never uploaded");
    }

    // insecureIgnoreHostKey: any host key, known_hosts never read.
    let mut cfg5 = env.config();
    cfg5.insecure_ignore_host_key = true;
    cfg5.known_hosts_file = "/nonexistent/known_hosts".into();
    let p5 = KvmProvider::new("kvm-insecure", &cfg5).unwrap();
    let v = p5.checker().unwrap().check().await;
    assert_eq!(v[0].reason, "Reachable", "{v:?}");

    // A hung daemon (SIGSTOP): calls fail Transient at the call timeout
    // instead of hanging, the check says so within its deadline, and all
    // is well again once the daemon answers.
    if let Some(pid) = env.own_libvirtd_pid() {
        let p4 = KvmProvider::new("kvm-hung", &env.config())
            .unwrap()
            .with_call_timeout(Duration::from_secs(1))
            .with_check_timeout(Duration::from_secs(5));
        assert!(p4
            .get("hosts/h1/domains/proxy-x")
            .await
            .unwrap_err()
            .is(ErrorClass::NotFound));
        {
            let _frozen = kvm_support::Frozen::new(&pid);
            let t = Instant::now();
            let e = p4.get("hosts/h1/domains/proxy-x").await.unwrap_err();
            assert!(e.is(ErrorClass::Transient), "{e}");
            println!(
                "frozen libvirtd: Transient after {:?} (call timeout 1 s)",
                t.elapsed()
            );
            let v = p4.checker().unwrap().check().await;
            assert!(!v[0].ready && v[0].message.contains("no answer"), "{v:?}");
        }
        let e = p4.get("hosts/h1/domains/proxy-x").await.unwrap_err();
        assert!(e.is(ErrorClass::NotFound), "after the daemon resumed: {e}");

        // The SSH link freezes silently (sshd stopped): the channel request
        // is bounded, the session forgotten, and the next call redials.
        {
            let _frozen = kvm_support::Frozen::all(env.sshd_pids());
            let t = Instant::now();
            let e = p4.get("hosts/h1/domains/proxy-x").await.unwrap_err();
            assert!(e.is(ErrorClass::Transient), "{e}");
            println!(
                "frozen sshd: Transient after {:?} (call timeout 1 s)",
                t.elapsed()
            );
        }
        let e = p4.get("hosts/h1/domains/proxy-x").await.unwrap_err();
        assert!(e.is(ErrorClass::NotFound), "after sshd resumed: {e}");
    }
    drop(p2);
    drop(p);
    eprintln!("failure test took {:?}", started.elapsed());
}
