//! System test (issue 22): a Proxy on the kvm provider becomes a real Linux
//! guest. The guest is built from Debian packages by
//! `tests/kvm_guest/build-guest.sh` (a Debian kernel and an initramfs with
//! busybox and Squid, as a unified kernel image on a FAT disk), booted by
//! the provider on the real libvirtd under QEMU emulation. Its init reads
//! the NoCloud seed the provider writes (hostname and Squid configuration
//! from the Proxy's cloud-init), takes a DHCP lease from dnsmasq on the
//! test bridge (a private host-only /24, see tests/kvm_support) and runs
//! Squid. The operator probes through that Squid with a real CONNECT to a
//! TLS target on the bridge; the crawler example (`docs/examples/
//! crawler.py`) leases the proxy through the discovery API and fetches a
//! page from a web server on the bridge through it, whose request shows
//! the guest's Squid (`Via`, with the hostname from user-data). The
//! create's spans, the SSH dial included, are one reconcile trace in a
//! real trace backend (Jaeger), found there by the trace id of the
//! "Instance created" line (provider checks and orphan sweeps are off, so
//! the creating reconcile is what dials the host). Switching to the operator's
//! built-in setup (`cloudInit.builtin: squid`, issue 33) replaces the VM;
//! the new guest's Squid answers 407 without credentials, lets the lease's
//! credentials through, refuses the cloud metadata address and adds no
//! Via; deleting the Proxy leaves no domain, overlay or seed.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;
use crate::support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{Proxy, ProxyPhase};
use egress_proxies_operator::provider::naming::name_from_uid;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use kvm_support::{guest_tools_missing, virsh, Env};
use serde_json::json;
use support::{crawler, curl_status, eventually, Operator};

const TOKEN: &str = "kvm-guest-token";
const NAME: &str = "guest";

/// The Proxy's cloud-init: the guest applies `hostname` and the Squid
/// configuration file (tests/kvm_guest/cloud-config.awk).
fn user_data(hostname: &str) -> String {
    format!(
        "#cloud-config\nhostname: {hostname}\nwrite_files:\n  - path: /etc/squid/conf.d/proxy-operator.conf\n    content: |\n      http_port 3128\n      http_access allow all\n      via on\n      forwarded_for delete\n"
    )
}

/// The crawler example (`docs/examples/crawler.py`) leases a proxy through
/// the discovery API, fetches `page` through it and releases the lease;
/// asserts it got the page whole.
async fn crawl(api: SocketAddr, page: &str) {
    let (ok, out) = crawler::run(
        api,
        TOKEN,
        &[
            "--url",
            page,
            "--pages",
            "1",
            "--ttl",
            "60",
            "--deadline",
            "60",
        ],
    )
    .await;
    let body = "hello from the test host";
    let fetched = format!("fetched {page} status 200 {} bytes", body.len());
    assert!(
        ok && out.iter().any(|l| l == &fetched) && out.iter().any(|l| l.starts_with("released ")),
        "the crawler example: {out:#?}"
    );
}

/// Waits for the Proxy to be Ready with its status written for generation
/// `generation` or later; returns (providerID, IP).
async fn ready(proxies: &Api<Proxy>, generation: i64, log: &Path) -> (String, String) {
    let limit = Duration::from_secs(420);
    let started = Instant::now();
    loop {
        let status = proxies.get(NAME).await.unwrap().status.unwrap_or_default();
        assert_ne!(status.phase, Some(ProxyPhase::Failed), "{status:?}");
        if status.phase == Some(ProxyPhase::Ready)
            && status.observed_generation.unwrap_or(0) >= generation
        {
            if let (Some(id), Some(ip)) = (status.provider_id.clone(), status.ip.clone()) {
                return (id, ip);
            }
        }
        if started.elapsed() > limit {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "not Ready after {limit:?}: {status:?}\noperator log (newest first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn domain_of(provider_id: &str) -> String {
    provider_id.rsplit('/').next().unwrap().to_string()
}

fn via_of(head: &str) -> Option<String> {
    head.lines()
        .find(|l| l.to_ascii_lowercase().starts_with("via:"))
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_guest_serves_squid_is_leased_replaced_on_new_cloud_init_and_deleted() {
    if let Some(why) = guest_tools_missing() {
        kvm_support::unavailable(&why);
    }
    crawler::require_python_requests();
    let image = kvm_support::test_guest_image();
    let env = Env::start("gst");
    let net = env.guest_network();
    let host_ip = IpAddr::V4(net.host_ip);
    let url = env.http.add("/epo-test-guest.qcow2", &image);
    // Squid and its libraries unpack into RAM: 256 MiB, not the harness's 128.
    // The built-in setup refuses private destinations unless allowed: the
    // test host's servers are on the bridge.
    let providers = env
        .providers_yaml("kvm-guest", "h1", "epo-guest", &url)
        .replace("memoryMiB: 128", "memoryMiB: 256")
        .replace(
            "    kvm:\n",
            &format!("    kvm:\n      destinations:\n        allow: [\"{host_ip}\"]\n"),
        );
    assert!(providers.contains("memoryMiB: 256"), "{providers}");

    // The probe target (https: the probe goes through a CONNECT tunnel) and
    // the crawler's web server, both on the bridge, where the guest is.
    let (tls, ca_pem) = support::tls_target_on(host_ip).await;
    let (web, heads) = support::recording_target(host_ip, 200, "hello from the test host").await;
    // The built-in setup's probe target: its Squid tunnels CONNECT to port
    // 443 only (as Squid's default config does), and the TLS target's port
    // is not, so its probe is a forward request to a 204.
    let (no_content, _) = support::recording_target(host_ip, 204, "").await;
    let api: SocketAddr = support::loopback();

    let ground = support::ground_without_pods("kvm-guest").await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let log = dir.path().join("operator.log");
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--discovery-bind-address", &api.to_string()])
        .args(["--default-probe-url", &format!("https://{tls}/")])
        .args(["--default-probe-expected-status", "204"])
        // Nothing but the reconciles talks to the host (no provider
        // checks, no orphan sweeps, no listing: a Running Proxy's pass then
        // makes a get), so the creating reconcile is the one that dials
        // its SSH session, and its trace holds the whole life.
        .args(["--provider-check-interval", "0", "--gc-interval", "0"])
        .args(["--provider-list-interval", "0"])
        .arg("--probe-ca-file")
        .arg(&ca)
        .env("DISCOVERY_TOKEN", TOKEN)
        .envs(support::otel_to_jaeger("http/protobuf", "epo-kvm-guest"))
        .env("LOG_LEVEL", "info");
    let _op = Operator::spawn(cmd, &log);

    let proxies: Api<Proxy> = ground.proxies();
    let spec = |hostname: &str| {
        json!({
            "provider": "kvm-guest", "port": 3128,
            "placement": {"zone": "h1", "machineType": "small", "image": "epo-guest"},
            "cloudInit": {"inline": user_data(hostname)},
        })
    };
    let applied = Instant::now();
    let created = proxies
        .create(
            &PostParams::default(),
            &support::proxy(NAME, spec("guest-one")),
        )
        .await
        .unwrap();
    env.track(&name_from_uid(created.metadata.uid.as_deref().unwrap()));
    let (id1, ip1) = ready(&proxies, 1, &log).await;
    let domain1 = domain_of(&id1);
    println!(
        "guest {domain1} Ready at {ip1} (probed through its Squid) {:?} after the Proxy was applied (image download, define, UEFI + kernel boot under TCG, DHCP, Squid)",
        applied.elapsed()
    );
    assert!(net.in_range(&ip1), "{ip1} is outside the DHCP range");
    let (ok, state) = virsh(&["domstate", &domain1]);
    assert!(ok && state.trim() == "running", "{state}");
    let (_, uuid1) = virsh(&["domuuid", &domain1]);

    // A crawler leases it and fetches a page from the test host through it.
    let page = format!("http://{web}/page");
    crawl(api, &page).await;
    let head = heads.lock().unwrap().last().cloned().unwrap_or_default();
    let via = via_of(&head)
        .unwrap_or_else(|| panic!("no Via: the request did not come through Squid: {head}"));
    assert!(via.contains("guest-one"), "{via}");
    println!("the crawler's page came through {via}");

    // The create is one trace: the SSH dial of the host's (shared)
    // session, the provider's image download, the SSH channel and libvirt
    // connection of each operation, and the libvirt calls, below the
    // reconcile span. Jaeger finds it by the trace id of the operator's
    // "Instance created" line.
    let wanted = [
        "ssh.dial",
        "kvm.create",
        "kvm.image_download",
        "ssh.channel",
        "libvirt.connect",
        "libvirt",
        "libvirt.rpc",
    ];
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("Instance created"))
        .unwrap_or_else(|| panic!("no Instance created line:\n{text}"));
    let trace_id = support::trace_id_of(line).unwrap_or_else(|| panic!("no traceID: {line}"));
    let below_root = |t: &support::Trace| -> Option<Vec<String>> {
        let root = t.named("Reconcile Proxy").find(|r| r.parent.is_none())?;
        Some(
            t.spans
                .iter()
                .filter(|s| t.is_below(s, root))
                .map(|s| s.name.clone())
                .collect(),
        )
    };
    let trace = support::jaeger()
        .wait_trace(&trace_id, Duration::from_secs(30), |t| {
            below_root(t).is_some_and(|n| wanted.iter().all(|w| n.iter().any(|s| s == w)))
        })
        .await;
    let root = trace
        .named("Reconcile Proxy")
        .find(|r| r.parent.is_none())
        .unwrap();
    assert_eq!(
        root.tag("k8s.object.name").as_deref(),
        Some(NAME),
        "{root:?}"
    );
    let names = below_root(&trace).unwrap_or_default();
    let dial = trace.ancestry(trace.named("ssh.dial").next().unwrap());
    let dialled_by = dial.last().cloned().unwrap_or_default();
    assert_eq!(dialled_by, "Reconcile Proxy", "ssh.dial under {dial:?}");
    println!("ssh.dial under {dialled_by}");
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &names {
        *counts.entry(n.as_str()).or_default() += 1;
    }
    println!("spans under the creating reconcile: {counts:?}");

    // The built-in setup instead (issue 33): a new VM (the domain keeps its
    // name, which comes from the Proxy's UID, and is defined anew) whose
    // Squid the operator configured: 407 without the credentials, 204 with
    // the lease's (the operator's probes, with them, made it Ready), the
    // crawler's page through it, the cloud metadata address refused, no
    // Via.
    let replacing = Instant::now();
    let patched = proxies
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "cloudInit": {"inline": null, "builtin": "squid"},
                "healthCheck": {"url": format!("http://{no_content}/generate_204"), "expectedStatus": 204},
            }})),
        )
        .await
        .unwrap();
    // The old VM serves until the provider's budget rolls it (drained
    // first, issue 32): wait for the new domain, then for it to be Ready.
    support::eventually("a new domain", Duration::from_secs(240), || async {
        let (ok, uuid) = virsh(&["domuuid", &domain1]);
        (ok && uuid.trim() != uuid1.trim()).then_some(())
    })
    .await;
    let (id2, ip2) = ready(&proxies, patched.metadata.generation.unwrap(), &log).await;
    assert_eq!(id2, id1, "the domain's name comes from the Proxy's UID");
    let (_, uuid2) = virsh(&["domuuid", &domain1]);
    assert_ne!(uuid1.trim(), uuid2.trim(), "the domain must be a new one");
    println!(
        "replaced by the built-in setup (domain UUID {} -> {}), Ready at {ip2} {:?} after the edit",
        uuid1.trim(),
        uuid2.trim(),
        replacing.elapsed()
    );
    let port = proxies
        .get(NAME)
        .await
        .unwrap()
        .status
        .unwrap()
        .port
        .unwrap();
    let bare = format!("http://{ip2}:{port}");
    assert_eq!(curl_status(&bare, &page), "407", "no credentials");
    assert_eq!(
        curl_status(&format!("http://{NAME}:wrong@{ip2}:{port}"), &page),
        "407",
        "a wrong password"
    );
    let (code, lease) = support::api_call(
        api,
        "POST",
        "/v1/leases",
        Some(TOKEN),
        br#"{"ttlSeconds": 60}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 201, "{lease}");
    let leased = lease["proxy"]["url"].as_str().unwrap().to_string();
    assert!(leased.contains('@'), "the lease carries the credentials");
    let generate_204 = format!("http://{no_content}/generate_204");
    assert_eq!(
        curl_status(&leased, &generate_204),
        "204",
        "the lease's credentials"
    );
    assert_eq!(curl_status(&leased, &page), "200");
    let head = heads.lock().unwrap().last().cloned().unwrap_or_default();
    assert_eq!(
        via_of(&head),
        None,
        "the built-in setup adds no Via: {head}"
    );
    assert!(
        !head.to_ascii_lowercase().contains("x-forwarded-for"),
        "{head}"
    );
    assert_eq!(
        curl_status(&leased, "http://169.254.169.254/computeMetadata/v1/"),
        "403",
        "the cloud metadata address is refused"
    );
    let id = lease["id"].as_str().unwrap();
    support::api_call(
        api,
        "DELETE",
        &format!("/v1/leases/{id}"),
        Some(TOKEN),
        Vec::new(),
    )
    .await;
    crawl(api, &page).await;

    proxies
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Proxy released", Duration::from_secs(120), || async {
        proxies.get_opt(NAME).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!env.domain_exists(&domain1), "the domain must be gone");
    let left: Vec<String> = env
        .volumes()
        .into_iter()
        .filter(|v| v.starts_with(domain1.as_str()))
        .collect();
    assert!(left.is_empty(), "overlay and seed must be gone: {left:?}");
    println!("whole test {:?}", applied.elapsed());
}
