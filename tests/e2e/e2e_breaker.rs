//! System test of the circuit breaker (issue 18): the real operator binary
//! on the real test cluster, whose node agent runs each kubernetes-provider
//! Pod as a real Squid. Four of five Proxies probe a target that the test
//! turns from 200 to 503 at once: their probes fail through Squid, so they
//! turn unhealthy together, as in an outage.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{breaker, condition, eventually, phase, Ground, Operator};
use tokio::io::AsyncWriteExt;

/// The provider's name: the ProviderHealth object and the Events are
/// named after it, cluster-wide.
const PROVIDER: &str = "breaker-kube";
const RESET: &str = "crawl.example.com/reset-circuit-breaker";

/// An HTTP server on `ip` answering 200 while `up`, else 503.
async fn switchable_target(ip: std::net::IpAddr, up: Arc<AtomicBool>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let up = up.clone();
            tokio::spawn(async move {
                support::read_head(&mut c).await;
                let head = if up.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let resp =
                    format!("HTTP/1.1 {head}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
                let _ = c.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

/// A Proxy probing `target` every second, recycled after 15 s unhealthy.
fn probed_proxy(name: &str, target: SocketAddr) -> Proxy {
    support::proxy(
        name,
        json!({
            "provider": PROVIDER,
            "port": 3128,
            "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200,
                "intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 1, "successThreshold": 1},
            "recycle": {"unhealthyFor": "30s", "drainTimeout": "2s"},
        }),
    )
}

async fn replacing(ph: &Api<ProviderHealth>) -> Option<(String, String, String)> {
    breaker::replacing(ph, PROVIDER).await
}

async fn until_replacing(
    ph: &Api<ProviderHealth>,
    status: &str,
    what: &str,
    secs: u64,
) -> (String, String, String) {
    breaker::until_replacing(ph, PROVIDER, status, what, secs).await
}

async fn until_event(client: &kube::Client, reason: &str) -> Vec<String> {
    breaker::until_event(client, PROVIDER, reason).await
}

async fn gauge(metrics: SocketAddr) -> Option<f64> {
    breaker::gauge(metrics, PROVIDER).await
}

/// Proxies being recycled (draining, or replaced after the drain).
async fn recycled(proxies: &Api<Proxy>) -> Vec<String> {
    let list = proxies.list(&ListParams::default()).await.unwrap().items;
    list.iter()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.draining_since.is_some())
                || condition(p, "Recycling").is_some()
        })
        .map(|p| p.name_any())
        .collect()
}

async fn pod_uids(pods: &Api<Pod>) -> BTreeSet<String> {
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    list.iter().filter_map(|p| p.uid()).collect()
}

/// Five Proxies Ready; the probe target of four of them fails at once: the
/// breaker opens (ProviderHealth `Replacing=False CircuitOpen` with the
/// counts, a Warning Event, the gauge at 1) and, although `spec.recycle`
/// wants those four replaced and `maxUnavailable: 4` would let all of them
/// go, nothing is recycled or replaced while it is open. The target heals:
/// it closes (`Replacing=True`, Event `CircuitClosed`, gauge 0). It fails
/// again: open again; the reset annotation closes it (removed by the
/// operator, Event `CircuitReset`) and recycling of the unhealthy ones
/// resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_when_most_proxies_fail_at_once_holds_replacing_and_closes() {
    support::require_squid_pods();
    let _shared = crate::e2e_gc_health::PH_LOCK.read().await;
    let ground: Ground = support::ground("breaker").await;
    let good = support::http_target_on(ground.host_ip()).await;
    let up = Arc::new(AtomicBool::new(true));
    let flaky = switchable_target(ground.host_ip(), up.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let metrics: SocketAddr = support::loopback();
    let providers = support::kubernetes_reaching(
        PROVIDER,
        "    maxUnavailable: 4\n    circuitBreaker: {threshold: 50%, window: 10m, minReadyProxies: 3}\n",
        ground.host_ip(),
    );
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--metrics-bind-address", &metrics.to_string()])
        .env("LOG_LEVEL", "info");
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    let pods: Api<Pod> = ground.api();
    let ph: Api<ProviderHealth> = Api::all(ground.client.clone());
    let names: Vec<String> = (0..5).map(|i| format!("px-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let target = if i == 0 { good } else { flaky };
        proxies
            .create(&PostParams::default(), &probed_proxy(name, target))
            .await
            .unwrap();
    }
    let started = Instant::now();
    eventually("all five Ready", Duration::from_secs(180), || async {
        let list = proxies.list(&ListParams::default()).await.ok()?.items;
        (list.len() == 5 && list.iter().all(|p| phase(p) == Some("Ready"))).then_some(())
    })
    .await;
    println!("five Proxies Ready after {:?}", started.elapsed());
    let closed = until_replacing(&ph, "True", "Replacing=True", 60).await;
    assert_eq!(closed.1, "CircuitClosed", "{closed:?}");
    assert_eq!(gauge(metrics).await, Some(0.0));
    let pods_before = pod_uids(&pods).await;
    assert_eq!(pods_before.len(), 5, "{pods_before:?}");

    // 80% fail at once.
    up.store(false, Ordering::SeqCst);
    let failed_at = Instant::now();
    let open = until_replacing(&ph, "False", "Replacing=False", 60).await;
    println!(
        "breaker open {:?} after the target failed",
        failed_at.elapsed()
    );
    assert_eq!(open.1, "CircuitOpen", "{open:?}");
    println!("{}", open.2);
    // The share is judged from the operator's view of the fleet; when it
    // is off, its log says which Proxies it saw change and when.
    let judged = std::panic::catch_unwind(|| support::breaker::assert_names_share(&open.2, 4, 5));
    if let Err(e) = judged {
        let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
        println!("operator log:\n{log}");
        std::panic::resume_unwind(e);
    }
    assert!(open.2.contains("open since"), "{}", open.2);
    let warned = until_event(&ground.client, "CircuitOpen").await;
    assert!(warned[0].contains(PROVIDER), "{warned:?}");
    assert_eq!(gauge(metrics).await, Some(1.0));

    // Held: past unhealthyFor (30 s, its minimum) and a drain, nothing is
    // recycled or replaced, though the budget would let all four go.
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(recycled(&proxies).await, Vec::<String>::new());
    assert_eq!(
        pod_uids(&pods).await,
        pods_before,
        "no Pod replaced while open"
    );
    let still = replacing(&ph).await.unwrap();
    assert_eq!(
        (still.0.as_str(), still.1.as_str()),
        ("False", "CircuitOpen")
    );
    let list = proxies.list(&ListParams::default()).await.unwrap().items;
    let unhealthy = list
        .iter()
        .filter(|p| condition(p, "Healthy").is_some_and(|c| c.status.as_str() == "False"))
        .count();
    assert_eq!(unhealthy, 4, "the four stay unhealthy and kept");

    // Healed: it closes on its own.
    up.store(true, Ordering::SeqCst);
    let healed_at = Instant::now();
    let closed = until_replacing(&ph, "True", "Replacing=True again", 90).await;
    println!(
        "breaker closed {:?} after the target healed",
        healed_at.elapsed()
    );
    assert_eq!(closed.1, "CircuitClosed", "{closed:?}");
    let notes = until_event(&ground.client, "CircuitClosed").await;
    assert!(notes[0].contains("closed"), "{notes:?}");
    assert_eq!(gauge(metrics).await, Some(0.0));
    // Closed, recycling resumes: one still unhealthy when it closed may be
    // recycled now (it was unhealthy for longer than unhealthyFor).
    eventually("all five Ready again", Duration::from_secs(90), || async {
        let list = proxies.list(&ListParams::default()).await.ok()?.items;
        let ready = list.iter().all(|p| phase(p) == Some("Ready"));
        (ready && recycled(&proxies).await.is_empty()).then_some(())
    })
    .await;
    let pods_before_reset = pod_uids(&pods).await;

    // Fails again, then an operator resets it with the annotation.
    up.store(false, Ordering::SeqCst);
    until_replacing(&ph, "False", "open again", 60).await;
    ph.patch(
        PROVIDER,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {RESET: "now"}}})),
    )
    .await
    .unwrap();
    let reset = until_replacing(&ph, "True", "reset: Replacing=True", 30).await;
    assert_eq!(reset.1, "CircuitClosed", "{reset:?}");
    eventually("annotation removed", Duration::from_secs(30), || async {
        let obj = ph.get(PROVIDER).await.ok()?;
        (!obj.annotations().contains_key(RESET)).then_some(())
    })
    .await;
    let notes = until_event(&ground.client, "CircuitReset").await;
    assert!(notes[0].contains(RESET), "{notes:?}");
    assert_eq!(gauge(metrics).await, Some(0.0));
    // The losses before the reset are forgotten: the unhealthy ones are
    // recycled now (a drain, or a new Pod already), and the breaker stays
    // closed.
    let going = eventually(
        "a recycle after the reset",
        Duration::from_secs(60),
        || async {
            let r = recycled(&proxies).await;
            let replaced = pod_uids(&pods).await != pods_before_reset;
            (!r.is_empty() || replaced).then_some(r)
        },
    )
    .await;
    assert!(!going.contains(&"px-0".to_string()), "{going:?}");
    assert_eq!(replacing(&ph).await.unwrap().0, "True");
}
