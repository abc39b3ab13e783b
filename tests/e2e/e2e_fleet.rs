//! System tests of fleet policy (issue 18) on the kubernetes provider: the
//! real operator binary against the real test cluster, whose node agent
//! runs each Proxy's Pod as a real Squid; probes go through it to a target
//! on the bridge, and crawlers lease through the real discovery API.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;

use crate::support::recycle::{assert_no_lease_cut, Crawler};
use crate::support::{self, api_call, condition, eventually, phase, Ground, Operator};

const TOKEN: &str = "fleet-test-token";

/// What the test saw of one Pod.
#[derive(Clone, Debug, Default)]
struct PodSeen {
    /// The Proxy that owns it.
    proxy: String,
    /// Its creation time (to the second).
    created: Option<DateTime<Utc>>,
    /// When the operator asked for its deletion: the deletion timestamp
    /// less the grace period (to the second, rounded down by the API).
    delete_asked: Option<DateTime<Utc>>,
}

/// Every Pod of the namespace by UID, kept up to date by a watch.
type Pods = Arc<Mutex<BTreeMap<String, PodSeen>>>;

fn watch_pods(ground: &Ground) -> (Pods, tokio::task::JoinHandle<()>) {
    let seen: Pods = Arc::default();
    let record = seen.clone();
    let api = ground.api::<Pod>();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                continue;
            };
            let owner = p
                .owner_references()
                .first()
                .map(|o| o.name.clone())
                .unwrap_or_default();
            let asked = p.metadata.deletion_timestamp.as_ref().map(|t| {
                let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
                DateTime::<Utc>::from_timestamp(t.0.as_second() - grace, 0).unwrap()
            });
            let mut all = record.lock().unwrap();
            let entry = all.entry(p.uid().unwrap_or_default()).or_default();
            entry.proxy = owner;
            entry.created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0));
            if entry.delete_asked.is_none() {
                entry.delete_asked = asked;
            }
        }
    });
    (seen, task)
}

/// The operator with the kubernetes provider (`extra_yaml` added to its
/// entry), probing `target`, serving the discovery API on `api`.
fn fleet_operator(
    ground: &Ground,
    dir: &std::path::Path,
    extra_yaml: &str,
    target: SocketAddr,
    api: SocketAddr,
    flags: &[&str],
) -> Operator {
    let providers = support::kubernetes_reaching("kubernetes", extra_yaml, target.ip());
    let mut cmd = ground.operator(dir, &providers);
    cmd.args(["--discovery-bind-address", &api.to_string()])
        .args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"])
        .args(flags)
        .env("DISCOVERY_TOKEN", TOKEN);
    Operator::spawn(cmd, &dir.join("operator.log"))
}

fn operator_log_tail(dir: &std::path::Path) -> String {
    let log = std::fs::read_to_string(dir.join("operator.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    tail.join("\n")
}

/// `maxAge` on 10 Proxies with `maxUnavailable: 2`: every Proxy gets a new
/// Pod, sampling never finds more than 2 unavailable (not Ready, or
/// draining) once all were Ready, each recycle makes exactly one new Pod,
/// no Pod whose lease a crawler held (and renewed until refused) is deleted
/// before that lease's end or the drain timeout, and a draining proxy is
/// never leased. Short timings: a 45 s `maxAge`, 15 s longest lease (so a
/// drain lasts 15 s), a drain timeout of 1 minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_recycles_every_proxy_within_the_budget_without_cutting_a_lease() {
    roll_ten("fleet-age", "age", Some("45s"), None, false).await;
}

/// A `spec.port` change of 10 running Proxies with `maxUnavailable: 2`
/// (issue 32) rolls the same way: never more than 2 unavailable, one new
/// Pod each, listening on the new port, no held lease cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_change_rolls_through_the_budget_without_cutting_a_lease() {
    roll_ten("fleet-port", "port", None, Some(3129), false).await;
}

/// The same `spec.port` change with `maxSurge: 2`: each Proxy's new Pod
/// is created and passes its probe before the old one stops taking
/// leases, so every sample finds all ten Proxies Ready; one new Pod each,
/// on the new port; the old Pod deleted no sooner than the end of the
/// lease held on it or the drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_surge_a_port_change_rolls_without_lowering_the_ready_count() {
    roll_ten("surge-port", "surge", None, Some(3129), true).await;
}

/// Ten Proxies (`<names>-0`…), with `maxAge` when given, all Ready and
/// each leased; then `port` applied to every one when given; then the
/// checks above until each has a new Pod (with `maxSurge: 2` when `surge`).
async fn roll_ten(
    prefix: &str,
    names: &str,
    max_age: Option<&str>,
    port: Option<u16>,
    surge: bool,
) {
    const N: usize = 10;
    const BUDGET: usize = 2;
    const LEASE_TTL_S: i64 = 15;
    const DRAIN_TIMEOUT_S: i64 = 60;
    support::require_squid_pods();
    let ground = support::ground(prefix).await;
    let target = support::http_target_on(ground.host_ip()).await;
    let api: SocketAddr = support::loopback();
    let (pods, watch) = watch_pods(&ground);
    let dir = tempfile::tempdir().unwrap();
    let ttl = format!("{LEASE_TTL_S}s");
    let mut limits = format!("    maxUnavailable: {BUDGET}\n");
    if surge {
        limits.push_str("    maxSurge: 2\n");
    }
    let _op = fleet_operator(
        &ground,
        dir.path(),
        &limits,
        target,
        api,
        &["--max-lease-ttl", &ttl, "--default-lease-ttl", &ttl],
    );
    let proxies = ground.proxies();
    let names: Vec<String> = (0..N).map(|i| format!("{names}-{i}")).collect();
    let mut recycle = json!({"drainTimeout": format!("{DRAIN_TIMEOUT_S}s")});
    if let Some(age) = max_age {
        recycle["maxAge"] = json!(age);
    }
    for name in &names {
        let spec = json!({
            "provider": "kubernetes",
            "port": 3128,
            "attributes": {"slot": name},
            // Not Ready only when really down: the node's CPUs are shared.
            "healthCheck": {"failureThreshold": 20},
            "recycle": recycle,
        });
        proxies
            .create(&PostParams::default(), &support::proxy(name, spec))
            .await
            .unwrap();
    }
    let started = Instant::now();
    eventually("all 10 Ready", Duration::from_secs(150), || async {
        let list = proxies.list(&Default::default()).await.ok()?.items;
        (list.iter().filter(|p| phase(p) == Some("Ready")).count() == N).then_some(())
    })
    .await;
    println!("{N} Proxies Ready {:?} after applying", started.elapsed());
    // The first Pod of each Proxy.
    let first: BTreeMap<String, String> = pods
        .lock()
        .unwrap()
        .iter()
        .map(|(uid, p)| (p.proxy.clone(), uid.clone()))
        .collect();
    assert_eq!(first.len(), N, "one Pod per Proxy: {first:?}");

    // A crawler leases every proxy and renews each lease until refused.
    let crawler = Crawler {
        api,
        token: TOKEN,
        ttl_s: LEASE_TTL_S,
    };
    let mut held = crawler.lease_each(&names).await;
    if let Some(port) = port {
        let patch = json!({"spec": {"port": port}});
        for name in &names {
            proxies
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
    let old_gone = |name: &str| {
        let all_pods = pods.lock().unwrap();
        all_pods
            .get(&first[name])
            .is_some_and(|s| s.delete_asked.is_some())
    };
    let report = || {
        format!(
            "Pods: {}\noperator log (newest first):\n{}",
            ground.kubectl(&["get", "pods", "-o", "wide"]),
            operator_log_tail(dir.path())
        )
    };
    let sampled = crawler
        .until_recycled(
            &proxies,
            &mut held,
            N,
            Duration::from_secs(420),
            old_gone,
            report,
        )
        .await;
    watch.abort();
    if surge {
        sampled.assert_all_ready(N, started.elapsed());
    } else {
        sampled.assert_within(BUDGET, started.elapsed());
    }

    // One new Pod per recycle: never two for one drain.
    let all_pods = pods.lock().unwrap().clone();
    for name in &names {
        let made = all_pods.values().filter(|p| &p.proxy == name).count();
        let recycles = sampled.drains.get(name).map_or(0, BTreeSet::len);
        assert!(
            made >= 2 && made <= 1 + recycles,
            "{name}: {made} Pods for {recycles} recycles"
        );
        if surge {
            assert_eq!(made, 2, "{name}: exactly one new Pod");
        }
    }

    // No held lease was cut: a Pod is deleted no sooner than the end of the
    // lease held on it when its drain began, or the drain timeout.
    let deleted_at = |name: &str| all_pods[&first[name]].delete_asked.unwrap();
    let checked = assert_no_lease_cut(&held, &sampled.drains, deleted_at, DRAIN_TIMEOUT_S);
    assert!(
        checked > 0,
        "some lease was held when its proxy's drain began"
    );
    if let (Some(port), true) = (port, surge) {
        // The leases held through the surge: reading one gives the new
        // Pod's address, on the new port.
        for (name, h) in &held {
            let path = format!("/v1/leases/{}", h.id);
            let (code, lease) = api_call(api, "GET", &path, Some(TOKEN), "".into()).await;
            assert_eq!(code, 200, "{name}: {lease}");
            assert_eq!(lease["proxy"]["port"], json!(port), "{name}: {lease}");
        }
    }
    if let (Some(port), false) = (port, surge) {
        // The new Pods serve on the new port: a lease hands it out.
        let (code, lease) = api_call(
            api,
            "POST",
            "/v1/leases",
            Some(TOKEN),
            json!({"ttlSeconds": 5}).to_string().into(),
        )
        .await;
        assert_eq!(code, 201, "{lease}");
        assert_eq!(lease["proxy"]["port"], json!(port), "{lease}");
    }
    if port.is_some() {
        for p in proxies.list(&Default::default()).await.unwrap().items {
            assert!(
                condition(&p, "UpToDate").is_none(),
                "{} is up to date",
                p.name_any()
            );
        }
    }
}

/// One test's ground, a watch of its Pods, the operator serving the
/// discovery API, and one kubernetes Proxy applied.
struct OneProxy {
    ground: Ground,
    api: SocketAddr,
    pods: Pods,
    watch: tokio::task::JoinHandle<()>,
    /// Before the directory, so the operator is gone first.
    _op: Operator,
    _dir: tempfile::TempDir,
}

/// Waits up to `secs` for the Proxy `name` to show `Healthy=False`.
async fn until_unhealthy(
    proxies: &kube::Api<egress_proxies_operator::api::Proxy>,
    name: &str,
    what: &str,
    secs: u64,
) {
    eventually(what, Duration::from_secs(secs), || async {
        let p = proxies.get(name).await.ok()?;
        (condition(&p, "Healthy")?.status.as_str() == "False").then_some(())
    })
    .await;
}

async fn one_proxy(prefix: &str, name: &str) -> OneProxy {
    one_proxy_with(
        prefix,
        name,
        json!({"provider": "kubernetes", "port": 3128}),
    )
    .await
}

async fn one_proxy_with(prefix: &str, name: &str, spec: serde_json::Value) -> OneProxy {
    support::require_squid_pods();
    let ground = support::ground(prefix).await;
    let target = support::http_target_on(ground.host_ip()).await;
    let api: SocketAddr = support::loopback();
    let (pods, watch) = watch_pods(&ground);
    let dir = tempfile::tempdir().unwrap();
    let op = fleet_operator(&ground, dir.path(), "", target, api, &[]);
    ground
        .proxies()
        .create(&PostParams::default(), &support::proxy(name, spec))
        .await
        .unwrap();
    OneProxy {
        ground,
        api,
        pods,
        watch,
        _op: op,
        _dir: dir,
    }
}

/// The Squid processes of the Pod `uid` (the node agent puts each container
/// run in a memory cgroup named after the Pod UID).
fn squid_pids(pod_uid: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() == "squid" && cgroup.contains(pod_uid) {
            pids.push(pid);
        }
    }
    pids
}

fn kill_squid(pod_uid: &str) {
    let pids = squid_pids(pod_uid);
    assert!(!pids.is_empty(), "no Squid process of Pod {pod_uid}");
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// The restart count of the Pod's container and its last exit code.
fn restarts(pod: &Pod) -> (i32, Option<i32>) {
    let Some(c) = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
    else {
        return (0, None);
    };
    let code = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    (c.restart_count, code)
}

/// A Ready Proxy's Squid is killed (SIGKILL), twice, the second time right
/// after it came back: the node agent reports the dead container (exit 137,
/// restart count) and restarts it in the same Pod, the second time after
/// its crash-loop back-off. The Proxy leaves the pool while Squid is down
/// (`Healthy=False`, not leased) and is Ready again on the same Pod: the
/// operator adds no replacement of its own (one Pod in all, no
/// `status.replacements`), since a Pod that restarts its container
/// recovers by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_squid_is_restarted_in_its_pod_and_never_replaced_on_top() {
    let OneProxy {
        ground,
        api,
        pods,
        watch,
        _op,
        _dir,
    } = one_proxy("fleet-kill", "victim").await;
    let proxies = ground.proxies();
    let ready = |want_restarts: i32| {
        let proxies = proxies.clone();
        let pod_api = ground.api::<Pod>();
        async move {
            let p = proxies.get("victim").await.ok()?;
            let pod = pod_api
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .next()?;
            (phase(&p) == Some("Ready") && restarts(&pod).0 >= want_restarts).then_some(pod)
        }
    };
    let pod = eventually("victim Ready", Duration::from_secs(90), || ready(0)).await;
    let uid = pod.uid().unwrap();

    // First death: restarted at once.
    kill_squid(&uid);
    let pod = eventually(
        "Ready after the first restart",
        Duration::from_secs(90),
        || ready(1),
    )
    .await;
    assert_eq!(
        restarts(&pod).1,
        Some(137),
        "the node agent reports the killed container"
    );
    // It dies again right after boot: the node agent backs off (10 s), so
    // the probes find it down and the Proxy leaves the pool.
    eventually("Squid running again", Duration::from_secs(30), || async {
        (!squid_pids(&uid).is_empty()).then_some(())
    })
    .await;
    kill_squid(&uid);
    until_unhealthy(&proxies, "victim", "Healthy=False while Squid is down", 30).await;
    eventually(
        "the dead Squid no longer offered",
        Duration::from_secs(5),
        || async { listed(api).await.is_empty().then_some(()) },
    )
    .await;
    let pod = eventually("Ready after the back-off", Duration::from_secs(120), || {
        ready(2)
    })
    .await;
    watch.abort();

    assert_eq!(pod.uid().unwrap(), uid, "the same Pod");
    let seen = pods.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "no replacement Pod: {seen:?}");
    let p = proxies.get("victim").await.unwrap();
    let status = p.status.unwrap();
    assert_eq!(status.replacements, None, "{status:?}");
    eventually(
        "offered again once Squid is back",
        Duration::from_secs(5),
        || async { (listed(api).await == ["victim"]).then_some(()) },
    )
    .await;
}

/// The names the discovery API lists.
async fn listed(api: SocketAddr) -> Vec<String> {
    let (code, list) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), Vec::new()).await;
    assert_eq!(code, 200, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// A Ready Proxy's Pod deleted behind the operator's back (an instance
/// that vanished) is replaced at once by one new Pod (`status.replacements:
/// 1`). Deleted again as soon as that one runs (it dies right after boot),
/// the re-create waits: `ReplaceBackoff` with 2 replacements and no new
/// Pod meanwhile, then exactly one Pod, created no sooner than 30 s after
/// `status.lastReplacedAt`, and the Proxy is Ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_vanishes_twice_is_replaced_at_once_then_after_the_backoff() {
    let OneProxy {
        ground,
        api: _,
        pods,
        watch,
        _op,
        _dir,
    } = one_proxy("fleet-vanish", "vanish").await;
    let proxies = ground.proxies();
    let pod_api = ground.api::<Pod>();
    let running_pod = |skip: usize| {
        let pod_api = pod_api.clone();
        let pods = pods.clone();
        async move {
            let list = pod_api.list(&Default::default()).await.ok()?.items;
            let pod = list.into_iter().find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })?;
            (pods.lock().unwrap().len() > skip).then_some(pod)
        }
    };
    eventually("vanish Ready", Duration::from_secs(90), || async {
        let p = proxies.get("vanish").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let first = eventually("the first Pod", Duration::from_secs(10), || running_pod(0)).await;
    pod_api.delete(&first.name_any(), &now).await.unwrap();

    // Replaced at once; the new Pod is deleted as soon as it runs.
    let second = eventually("a second Pod running", Duration::from_secs(60), || {
        running_pod(1)
    })
    .await;
    assert_ne!(second.uid(), first.uid());
    let p = proxies.get("vanish").await.unwrap();
    assert_eq!(
        p.status.unwrap().replacements,
        Some(1),
        "one replacement so far"
    );
    pod_api.delete(&second.name_any(), &now).await.unwrap();

    let held = eventually("ReplaceBackoff", Duration::from_secs(60), || async {
        let p = proxies.get("vanish").await.ok()?;
        (condition(&p, "Provisioned")?.reason == "ReplaceBackoff").then_some(p)
    })
    .await;
    let status = held.status.clone().unwrap();
    assert_eq!(status.replacements, Some(2), "{status:?}");
    let last = status.last_replaced_at.unwrap();
    assert_eq!(
        pods.lock().unwrap().len(),
        2,
        "no Pod while the re-create backs off"
    );

    eventually("Ready on a third Pod", Duration::from_secs(120), || async {
        let p = proxies.get("vanish").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    watch.abort();
    third_pod_after_the_back_off(&pods, last);
}

/// Asserts the Pods seen are exactly three, the third created no sooner
/// than 30 s (the back-off of a second replacement in a row) after
/// `last` (`status.lastReplacedAt`).
fn third_pod_after_the_back_off(pods: &Pods, last: chrono::DateTime<chrono::Utc>) {
    let seen = pods.lock().unwrap().clone();
    let mut created: Vec<_> = seen.values().map(|p| p.created.unwrap()).collect();
    created.sort();
    println!("Pods created at {created:?}; the second replacement at {last}");
    assert_eq!(
        created.len(),
        3,
        "exactly one Pod after the back-off: {seen:?}"
    );
    // Creation times are known to the second, rounded down.
    assert!(
        created[2] + chrono::TimeDelta::seconds(1) >= last + chrono::TimeDelta::seconds(30),
        "the third Pod, created {}, came before the 30 s back-off from {last} ended",
        created[2]
    );
}

/// A Proxy whose probe never passes (it expects a status the target never
/// answers) with `spec.recycle.unhealthyFor` at its minimum, on real Pods:
/// recycled once at once, then the second recycle's create waits 30 s
/// (`ReplaceBackoff` with 2 replacements, no Pod meanwhile); the third Pod
/// comes no sooner than 30 s after `status.lastReplacedAt` (issue 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_never_passes_its_probe_is_recycled_with_back_off() {
    let spec = json!({
        "provider": "kubernetes",
        "port": 3128,
        "healthCheck": {"expectedStatus": 299},
        "recycle": {"unhealthyFor": "30s", "drainTimeout": "5s"},
    });
    let OneProxy {
        ground,
        api: _,
        pods,
        watch,
        _op,
        _dir,
    } = one_proxy_with("fleet-sick", "sick", spec).await;
    let proxies = ground.proxies();
    let started = std::time::Instant::now();
    let held = eventually("ReplaceBackoff", Duration::from_secs(240), || async {
        let p = proxies.get("sick").await.ok()?;
        (condition(&p, "Provisioned")?.reason == "ReplaceBackoff").then_some(p)
    })
    .await;
    println!("ReplaceBackoff after {:?}", started.elapsed());
    let status = held.status.clone().unwrap();
    assert_eq!(status.replacements, Some(2), "{status:?}");
    let message = &condition(&held, "Provisioned").unwrap().message;
    assert!(message.contains("unhealthy"), "{message}");
    let last = status.last_replaced_at.unwrap();
    assert_eq!(
        pods.lock().unwrap().len(),
        2,
        "two Pods, none while the create backs off"
    );
    eventually("a third Pod", Duration::from_secs(90), || async {
        (pods.lock().unwrap().len() >= 3).then_some(())
    })
    .await;
    watch.abort();
    third_pod_after_the_back_off(&pods, last);
    until_unhealthy(&proxies, "sick", "the third Pod fails its probe too", 60).await;
}
