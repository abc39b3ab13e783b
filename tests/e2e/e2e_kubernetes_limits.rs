//! System test of the create limits on the kubernetes provider: the real
//! operator binary against the real test cluster, whose node agent runs
//! each Pod as a real Squid. Pod creates are counted by watching the
//! namespace's Pods: each create is a Pod with a new UID.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::ResourceExt;

use crate::support::{self, condition, phase, Operator};

/// 10 Proxies applied at once on a kubernetes provider with
/// `createsPerMinute: 12` (one every 5 s, a burst of 2) and
/// `maxCreatesInFlight: 4`: exactly 10 Pods are created, no window of the
/// creates holds more than the bucket allows, and every Proxy ends Ready
/// through its real Squid. 10, not the 300 of the gcp test: each Pod here
/// is a real Squid process on a 2-core machine that the binary's other
/// tests (e2e_crash runs 20 Pods, e2e_fleet 10) share; and 10 at this rate
/// take 40 s already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_applied_at_once_get_one_pod_each_at_the_configured_rate() {
    const N: usize = 10;
    const PER_MINUTE: i64 = 12;
    const BURST: usize = 2;
    support::require_squid_pods();
    let ground = support::ground("k8s-limits").await;
    // Squid in a Pod fetches the probe target: it listens on the bridge.
    let target = support::http_target_on(ground.host_ip()).await;

    // Every Pod UID of the namespace, with when it was first seen.
    let seen: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let pods = ground.api::<Pod>();
    let record = seen.clone();
    let watch = tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev {
                let uid = p.uid().unwrap_or_default();
                record
                    .lock()
                    .unwrap()
                    .entry(uid)
                    .or_insert_with(Instant::now);
            }
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let providers = support::kubernetes_reaching(
        "kubernetes",
        &format!("    createsPerMinute: {PER_MINUTE}\n    maxCreatesInFlight: 4\n"),
        target.ip(),
    );
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    for i in 0..N {
        proxies
            .create(
                &PostParams::default(),
                &support::kube_proxy(&format!("k-{i:02}")),
            )
            .await
            .unwrap();
    }
    let started = Instant::now();

    let mut throttled = false;
    let deadline = started + Duration::from_secs(180);
    loop {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        throttled |= list
            .iter()
            .any(|p| condition(p, "Provisioned").is_some_and(|c| c.reason == "CreateThrottled"));
        let ready = list.iter().filter(|p| phase(p) == Some("Ready")).count();
        if ready == N {
            break;
        }
        if Instant::now() >= deadline {
            let waiting: Vec<String> = list
                .iter()
                .filter(|p| phase(p) != Some("Ready"))
                .map(|p| format!("{}: {:?}", p.name_any(), p.status))
                .collect();
            let pods = ground.kubectl(&["get", "pods", "-o", "wide"]);
            let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            panic!(
                "only {ready} of {N} Proxies Ready after {:?}; not Ready: {waiting:#?}\nPods:\n{pods}\noperator log (last lines, newest first):\n{}",
                started.elapsed(),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("{N} Proxies Ready {:?} after applying", started.elapsed());
    watch.abort();
    assert!(
        throttled,
        "some Proxy showed CreateThrottled while it waited"
    );

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), N, "one Pod per Proxy: {seen:?}");
    let mut times: Vec<Instant> = seen.values().copied().collect();
    times.sort();
    let first = times[0];
    let ms: Vec<i64> = times
        .iter()
        .map(|t| i64::try_from((*t - first).as_millis()).unwrap())
        .collect();
    // With 2 s of slack for the way from the operator to the watch.
    support::assert_within_rate(&ms, BURST, 60_000 / PER_MINUTE, 2_000);
}
