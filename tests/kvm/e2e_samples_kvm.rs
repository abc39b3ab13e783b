//! System test: `config/samples/proxy_kvm.yaml`, applied as written, reaches
//! phase Running on the real operator binary on the real test cluster
//! (control plane only, applied with its pinned kubectl in the test's
//! namespace),
//! with a kvm provider whose host `beelink` is a local sshd in front of a
//! real libvirtd (tests/kvm_support), and a guest that really takes an
//! address.
//!
//! The image `debian-13` is a stand-in built at test time: a FAT disk whose
//! UEFI boot (OVMF, TCG) runs iPXE from Debian's `ipxe` package. iPXE asks
//! for a DHCP lease and fetches a boot script by TFTP from `dnsmasq` on the
//! test bridge, so the host learns the guest's MAC and address in its ARP
//! table (the lease source covers only libvirt networks, and iPXE runs no
//! guest agent). The host is made busy first, 150 other neighbours on the
//! bridge, as a hypervisor with many guests is: libvirt 9.0's ARP source
//! reads only the first netlink batch of the table and mostly misses the
//! guest, and the provider finds it in `/proc/net/arp` over SSH. The test
//! checks that the address is the one dnsmasq leased to the domain's NIC,
//! in the host's neighbour table, and unknown to the lease and agent
//! sources; it prints whether libvirt's ARP source saw it.
//!
//! Unlike our other test servers, dnsmasq cannot bind loopback: DHCP runs
//! on the VM's own segment. It serves only the harness's bridge, a private
//! host-only /24 (10.213.N.0/24) with no uplink and no forwarding, handing
//! out neither a router nor a DNS server, with DNS off; it is killed, and
//! the bridge deleted, when the test ends.
//!
//! Without libvirt, QEMU, OVMF, dnsmasq, iPXE or mtools it fails under
//! `CI=true` and is skipped elsewhere; `.ci/run` installs them.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;
use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{Proxy, ProxyPhase};
use egress_proxies_operator::provider::naming::name_from_uid;
use kube::api::DeleteParams;
use kube::Api;
use kvm_support::{guest_tools_missing, run, virsh, Env, GuestNet};
use support::Operator;

const NAME: &str = "proxy-kvm-sample";

fn sample_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/proxy_kvm.yaml")
}

/// Applies the sample file as written, with the cluster's kubectl, in the
/// ground's namespace.
fn apply_sample(ground: &support::Ground) {
    let file = sample_path();
    let out = ground.kubectl(&["apply", "-f", file.to_str().unwrap()]);
    println!("$ kubectl apply -f {}\n{out}", file.display());
}

/// The names the test's providers config defines must be the sample's, and
/// its user-data the built-in Squid setup.
fn check_sample() {
    let doc: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(sample_path()).unwrap()).unwrap();
    let spec = &doc["spec"];
    assert_eq!(doc["metadata"]["name"], NAME);
    assert_eq!(spec["provider"], "kvm-home");
    assert_eq!(spec["placement"]["zone"], "beelink", "the sample's host");
    assert_eq!(spec["placement"]["machineType"], "small");
    assert_eq!(spec["placement"]["image"], "debian-13");
    assert_eq!(spec["port"], 3128);
    assert_eq!(
        spec["cloudInit"]["builtin"], "squid",
        "the operator writes the sample's Squid setup"
    );
}

/// What to print when the wait fails: the short facts first (CI keeps
/// only part of a long failure), then the logs' tails.
fn diagnostics(op_log: &Path, net: &GuestNet, domain: &str, bridge: &str) -> String {
    let tail = |text: &str, n: usize| {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    format!(
        "domstate: {:?}\narp: {:?}\nneighbours on {bridge}: {}\nIPv4 neighbours on the host: {} (libvirt 9.0 reads about 45)\n\noperator log (tail):\n{}\n\ndnsmasq log (tail):\n{}\n",
        virsh(&["domstate", domain]),
        virsh(&["domifaddr", domain, "--source", "arp"]),
        run("ip", &["neigh", "show", "dev", bridge]).1.lines().count(),
        run("ip", &["-4", "neigh", "show"]).1.lines().count(),
        tail(&std::fs::read_to_string(op_log).unwrap_or_default(), 40),
        tail(&net.log_text(), 30),
    )
}

fn first_mac(domain: &str) -> String {
    let (ok, out) = virsh(&["domiflist", domain]);
    assert!(ok, "domiflist: {out}");
    out.split_whitespace()
        .find(|w| w.len() == 17 && w.matches(':').count() == 5)
        .unwrap_or_else(|| panic!("no MAC in domiflist: {out}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kvm_sample_reaches_running_with_an_address_from_the_hosts_neighbours() {
    check_sample();
    if let Some(why) = guest_tools_missing() {
        kvm_support::unavailable(&why);
    }
    let env = Env::start("smp");
    let started = Instant::now();
    let net = env.guest_network();
    // A busy host: 150 other neighbours, so libvirt's ARP source mostly
    // misses the guest and the host's own table must find it.
    kvm_support::crowd_neighbours(env.dir.path(), &env.bridge, &net, 150);
    let url = env.serve_ipxe_disk("debian-13.qcow2");
    let providers = env.providers_yaml("kvm-home", "beelink", "debian-13", &url);
    let ground = support::ground_without_pods("kvm-sample").await;
    let dir = tempfile::tempdir().unwrap();
    let op_log = dir.path().join("operator.log");
    let mut cmd = ground.operator(dir.path(), &providers);
    // The flag wins over the ground's INSTALLATION_ID.
    cmd.args(["--installation-id", "inst-sample"]);
    let _op = Operator::spawn(cmd, &op_log);

    let applied = Instant::now();
    apply_sample(&ground);
    let proxies: Api<Proxy> = ground.proxies();
    let uid = proxies.get(NAME).await.unwrap().metadata.uid.unwrap();
    let domain = name_from_uid(&uid);
    env.track(&domain);

    // TCG is slow and the machine is shared: be generous.
    let limit = Duration::from_secs(240);
    let mut recorded = None;
    let (phase_ip, status) = loop {
        let p = proxies.get(NAME).await.unwrap();
        let status = p.status.unwrap_or_default();
        if recorded.is_none() && status.provider_id.is_some() {
            recorded = Some(applied.elapsed());
        }
        assert_ne!(
            status.phase,
            Some(ProxyPhase::Failed),
            "the sample failed: {status:?}\n{}",
            diagnostics(&op_log, &net, &domain, &env.bridge)
        );
        if status.phase == Some(ProxyPhase::Running) {
            if let Some(ip) = status.ip.clone().filter(|ip| !ip.is_empty()) {
                break (ip, status);
            }
        }
        if applied.elapsed() > limit {
            panic!(
                "the sample is not Running after {limit:?}: {status:?}\n{}",
                diagnostics(&op_log, &net, &domain, &env.bridge)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let to_running = applied.elapsed();
    let ip = phase_ip;
    println!(
        "proxy-kvm-sample Running at {ip}: instance recorded after {:?}, Running after {to_running:?}",
        recorded.unwrap_or_default()
    );
    assert_eq!(
        status.provider_id.as_deref(),
        Some(format!("hosts/beelink/domains/{domain}").as_str())
    );

    // The address is the guest's own: in the DHCP range, leased by dnsmasq
    // to the domain's NIC, and in the host's neighbour table on the bridge.
    assert!(
        net.in_range(&ip),
        "{ip} is outside {}..{}",
        net.first,
        net.last
    );
    let mac = first_mac(&domain);
    // dnsmasq writes its lease file after the ACK, and the guest may answer
    // ARP (and so be Running) before that write lands (seen once in CI).
    let leased = std::time::Instant::now();
    while net.lease_mac(&ip).is_none() && leased.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        net.lease_mac(&ip).as_deref(),
        Some(mac.as_str()),
        "dnsmasq's lease for {ip}; its lease file: {:?}",
        std::fs::read_to_string(&net.leases).unwrap_or_default()
    );
    let (_, neigh) = run("ip", &["-4", "neigh", "show", &ip, "dev", &env.bridge]);
    assert!(neigh.contains(&mac), "no ARP entry for {ip}: {neigh}");
    // Neither the lease nor the agent source knows it: it came from the
    // host's neighbour table, through libvirt's ARP source when that saw
    // it, else through /proc/net/arp over SSH.
    let (_, by_lease) = virsh(&["domifaddr", &domain, "--source", "lease"]);
    assert!(!by_lease.contains(&ip), "lease source: {by_lease}");
    let (_, by_agent) = virsh(&["domifaddr", &domain, "--source", "agent"]);
    assert!(!by_agent.contains(&ip), "agent source: {by_agent}");
    let arp = std::fs::read_to_string("/proc/net/arp").unwrap();
    assert!(
        arp.lines()
            .any(|l| l.starts_with(&format!("{ip} ")) && l.contains(&mac)),
        "{ip} of {mac} in /proc/net/arp:\n{arp}"
    );
    let (_, by_arp) = virsh(&["domifaddr", &domain, "--source", "arp"]);
    let crowd = run("ip", &["-4", "neigh", "show"]).1.lines().count();
    println!(
        "address source: {} ({crowd} IPv4 neighbours on the host)",
        if by_arp.contains(&ip) {
            "libvirt's ARP source"
        } else {
            "/proc/net/arp (libvirt's ARP source did not see it)"
        }
    );

    let deleting = Instant::now();
    proxies
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("the Proxy released", Duration::from_secs(120), || async {
        proxies.get_opt(NAME).await.ok()?.is_none().then_some(())
    })
    .await;
    let to_gone = deleting.elapsed();
    assert!(!env.domain_exists(&domain), "the domain must be gone");
    let volumes = env.volumes();
    assert!(
        !volumes.iter().any(|v| v.starts_with(&domain)),
        "overlay and seed must be gone: {volumes:?}"
    );
    println!("deleted in {to_gone:?}; whole test {:?}", started.elapsed());
}
