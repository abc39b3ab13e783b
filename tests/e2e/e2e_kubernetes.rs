//! System tests: the real operator binary against the real test cluster,
//! whose node agent runs each Pod as a real Squid (Debian's
//! /usr/sbin/squid) in its own network namespace. A Proxy on the
//! kubernetes provider lives its whole life here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::{condition, eventually, phase, proxy, sample, scrape, Ground, Operator};

use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

/// A namespace of the cluster with the operator confined to it.
async fn setup(prefix: &str, providers: &str) -> (Ground, Operator, tempfile::TempDir) {
    let ground = support::ground(prefix).await;
    let dir = tempfile::tempdir().unwrap();
    let op = Operator::spawn(
        ground.operator(dir.path(), providers),
        &dir.path().join("operator.log"),
    );
    (ground, op, dir)
}

fn provisioned(p: &Proxy) -> Option<(String, String)> {
    condition(p, "Provisioned").map(|c| (c.reason.clone(), c.message.clone()))
}

const KUBE_ONLY: &str = "providers:\n  - name: kubernetes\n    type: kubernetes\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_lives_its_whole_life_on_the_kubernetes_provider() {
    support::require_squid_pods();
    let (ground, _op, dir) = setup("kube-life", KUBE_ONLY).await;
    let proxies: Api<Proxy> = ground.proxies();
    let pods: Api<Pod> = ground.api();
    proxies
        .create(
            &PostParams::default(),
            &proxy(
                "p1",
                json!({"provider": "kubernetes", "port": 3128, "attributes": {"geo": "home"}}),
            ),
        )
        .await
        .unwrap();

    // Running with the Pod's own IP on the cluster's bridge, the Pod
    // carrying the marks.
    let running = eventually("Running with an IP", Duration::from_secs(60), || async {
        let p = proxies.get("p1").await.ok()?;
        (phase(&p) == Some("Running") && p.status.as_ref()?.ip.is_some()).then_some(p)
    })
    .await;
    let ip = running.status.as_ref().unwrap().ip.clone().unwrap();
    assert!(ip.starts_with("10.216."), "{ip}");
    let pod_list = pods.list(&Default::default()).await.unwrap();
    assert_eq!(pod_list.items.len(), 1);
    let pod = &pod_list.items[0];
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels["proxy-operator-managed"], "true");
    assert_eq!(
        labels["proxy-operator-uid"],
        running.metadata.uid.clone().unwrap()
    );
    assert!(!labels["proxy-operator-installation"].is_empty());
    assert_eq!(
        pod.status.as_ref().unwrap().pod_ip.as_deref(),
        Some(ip.as_str())
    );
    assert!(running
        .metadata
        .finalizers
        .clone()
        .unwrap()
        .contains(&"crawl.example.com/finalizer".to_string()));
    assert!(
        running.metadata.annotations.clone().unwrap()["crawl.example.com/spec-hash"]
            .starts_with("v1:")
    );
    let pod_name = pod.metadata.name.clone().unwrap();
    let pod_uid = pod.metadata.uid.clone().unwrap();

    // `kubectl get px` shows it.
    let text = ground.kubectl(&["get", "px"]);
    assert!(
        text.contains("p1") && text.contains("Running") && text.contains(&ip),
        "{text}"
    );

    // Attributes change: no replacement, once a reconcile has seen it (its
    // conditions carry the new generation).
    let patched = proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"attributes": {"geo": "away"}}})),
        )
        .await
        .unwrap();
    let generation = patched.metadata.generation;
    eventually(
        "the attribute change reconciled",
        Duration::from_secs(30),
        || async {
            let p = proxies.get("p1").await.ok()?;
            let conditions = &p.status.as_ref()?.conditions;
            conditions
                .iter()
                .any(|c| c.observed_generation == generation)
                .then_some(())
        },
    )
    .await;
    let same = pods.get(&pod_name).await.unwrap();
    assert_eq!(
        same.metadata.uid.as_deref(),
        Some(pod_uid.as_str()),
        "attributes must not replace the Pod"
    );

    // Port change: replaced under the same name.
    proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    let replaced = eventually(
        "a new Pod under the same name",
        Duration::from_secs(90),
        || async {
            let p = pods.get(&pod_name).await.ok()?;
            (p.metadata.uid.as_deref() != Some(pod_uid.as_str())
                && p.status.as_ref()?.phase.as_deref() == Some("Running"))
            .then_some(p)
        },
    )
    .await;
    let port = replaced.spec.unwrap().containers[0].ports.clone().unwrap()[0].container_port;
    assert_eq!(port, 3129);
    eventually(
        "Running again after replacement",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("p1").await.ok()?;
            (phase(&p) == Some("Running")).then_some(())
        },
    )
    .await;

    // Deleting the Proxy deletes the Pod, then releases the finalizer.
    proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Proxy gone", Duration::from_secs(60), || async {
        proxies.get_opt("p1").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the Pod must be gone first"
    );
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsatisfiable_proxies_say_why_and_recover() {
    let (ground, _op, dir) = setup("kube-unsat", KUBE_ONLY).await;
    let proxies: Api<Proxy> = ground.proxies();
    let secrets: Api<Secret> = ground.api();

    // An unconfigured provider: Failed, PermanentError naming it.
    proxies
        .create(
            &PostParams::default(),
            &proxy("nocfg", json!({"provider": "gcp-eu", "port": 3128})),
        )
        .await
        .unwrap();
    let p = eventually("Failed", Duration::from_secs(30), || async {
        let p = proxies.get("nocfg").await.ok()?;
        (phase(&p) == Some("Failed")).then_some(p)
    })
    .await;
    let (reason, message) = provisioned(&p).unwrap();
    assert_eq!(reason, "PermanentError");
    assert!(message.contains("\"gcp-eu\""), "{message}");

    // Cloud-init from an unlabelled Secret: CloudInitError; labelling recovers.
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ci"},
        "stringData": {"user-data": "#cloud-config\n"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    proxies
        .create(
            &PostParams::default(),
            &proxy("ci", json!({"provider": "kubernetes", "port": 3128, "cloudInit": {"secretRef": {"name": "ci"}}})),
        )
        .await
        .unwrap();
    let p = eventually("CloudInitError", Duration::from_secs(30), || async {
        let p = proxies.get("ci").await.ok()?;
        (provisioned(&p)?.0 == "CloudInitError").then_some(p)
    })
    .await;
    assert!(
        provisioned(&p)
            .unwrap()
            .1
            .contains("crawl.example.com/cloud-init"),
        "{:?}",
        provisioned(&p)
    );
    secrets
        .patch(
            "ci",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"crawl.example.com/cloud-init": "true"}}}),
            ),
        )
        .await
        .unwrap();
    // The labelled-Secret watch re-triggers the Proxy at once; the 30 s
    // retry alone could not meet this deadline.
    eventually(
        "created after labelling",
        Duration::from_secs(15),
        || async {
            let p = proxies.get("ci").await.ok()?;
            p.status.as_ref()?.provider_id.is_some().then_some(())
        },
    )
    .await;

    // skip-cleanup releases a Proxy whose provider is not configured.
    proxies
        .patch(
            "nocfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["crawl.example.com/finalizer"]}})),
        )
        .await
        .unwrap();
    proxies
        .patch_status(
            "nocfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"providerID": "zones/z/instances/x"}})),
        )
        .await
        .unwrap();
    proxies
        .delete("nocfg", &DeleteParams::default())
        .await
        .unwrap();
    // Once the deletion has been reconciled (the operator says why it
    // cannot clean up), the finalizer still holds the Proxy.
    eventually(
        "the deletion refused for the missing provider",
        Duration::from_secs(30),
        || async {
            let log = std::fs::read_to_string(dir.path().join("operator.log")).ok()?;
            log.contains("cannot clean up instance zones/z/instances/x")
                .then_some(())
        },
    )
    .await;
    assert!(
        proxies.get_opt("nocfg").await.unwrap().is_some(),
        "held by the finalizer while the provider is missing"
    );
    proxies
        .patch(
            "nocfg",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}}),
            ),
        )
        .await
        .unwrap();
    eventually(
        "released by skip-cleanup",
        Duration::from_secs(30),
        || async { proxies.get_opt("nocfg").await.ok()?.is_none().then_some(()) },
    )
    .await;
}

/// A ResourceQuota that admits no Pod: the real API server's 403 is
/// QuotaExceeded, retried, never Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_quota_refusal_is_quota_exceeded_not_failed() {
    let (ground, _op, _dir) = setup("kube-quota", KUBE_ONLY).await;
    let quotas: Api<ResourceQuota> = ground.api();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}}
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // Admission counts against the quota once its controller has.
    eventually("the quota counted", Duration::from_secs(30), || async {
        let q = quotas.get("no-pods").await.ok()?;
        q.status?.hard?.contains_key("pods").then_some(())
    })
    .await;

    let proxies: Api<Proxy> = ground.proxies();
    proxies
        .create(
            &PostParams::default(),
            &proxy("q", json!({"provider": "kubernetes", "port": 3128})),
        )
        .await
        .unwrap();
    let p = eventually("QuotaExceeded", Duration::from_secs(30), || async {
        let p = proxies.get("q").await.ok()?;
        (provisioned(&p)?.0 == "QuotaExceeded").then_some(p)
    })
    .await;
    let (_, message) = provisioned(&p).unwrap();
    assert!(message.contains("exceeded quota"), "{message}");
    assert!(!message.contains("Status {"), "{message}");
    assert_ne!(phase(&p), Some("Failed"));
}

/// Passes of the Running Proxy counted by the held-fleet test below.
const HELD_PASSES: usize = 5;

/// Issue 19: a Running kubernetes Proxy is checked from the provider's Pod
/// watch, so holding it through reconcile passes costs no Pod GET; a
/// killed Pod still reaches its Proxy through that watch and is replaced.
/// Each pass is started by a spec change (the Proxy watch brings it at
/// once) rather than the minute of a periodic resync; both run the same
/// managed path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_kubernetes_proxy_costs_no_pod_get_and_a_killed_pod_is_replaced() {
    support::require_squid_pods();
    let ground = support::ground("kube-watch").await;
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", support::free_port());
    let mut cmd = ground.operator(dir.path(), KUBE_ONLY);
    cmd.args(["--metrics-bind-address", &addr]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    let pods: Api<Pod> = ground.api();
    proxies
        .create(
            &PostParams::default(),
            &proxy("w1", json!({"provider": "kubernetes", "port": 3128})),
        )
        .await
        .unwrap();
    let ip = eventually("Running with an IP", Duration::from_secs(60), || async {
        let p = proxies.get("w1").await.ok()?;
        (phase(&p) == Some("Running")).then_some(p.status?.ip?)
    })
    .await;

    const GETS: &str = "proxy_operator_provider_requests_total{provider=\"kubernetes\",op=\"get\",";
    const PASSES: &str = "proxy_operator_reconcile_total{controller=\"proxy\",result=\"success\"}";
    let counts = || async {
        let body = scrape(&addr).await?;
        let gets: f64 = body
            .lines()
            .filter(|l| l.starts_with(GETS))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Some((gets, sample(&body, PASSES)?))
    };
    let (gets_before, passes_before) =
        eventually("a scrape", Duration::from_secs(20), &counts).await;
    for n in 0..HELD_PASSES {
        let patched = proxies
            .patch(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"attributes": {"pass": n.to_string()}}})),
            )
            .await
            .unwrap();
        let generation = patched.metadata.generation;
        eventually("the pass reconciled", Duration::from_secs(30), || async {
            let p = proxies.get("w1").await.ok()?;
            let status = p.status.as_ref()?;
            (status
                .conditions
                .iter()
                .all(|c| c.observed_generation == generation)
                && phase(&p) == Some("Running"))
            .then_some(())
        })
        .await;
    }
    let (gets_after, passes_after) = eventually("a scrape", Duration::from_secs(20), &counts).await;
    let passes = passes_after - passes_before;
    println!(
        "held Running: {passes} reconcile passes, {} provider gets (Pod GETs)",
        gets_after - gets_before
    );
    assert!(
        passes >= HELD_PASSES as f64,
        "{passes} passes, want at least {HELD_PASSES}"
    );
    assert_eq!(
        gets_after, gets_before,
        "a Running Proxy's passes must be answered by the Pod watch"
    );

    // Killed: the Pod's deletion reaches the Proxy through the watch (no
    // periodic resync is due for a minute), and a new Pod runs.
    let old = pods.list(&Default::default()).await.unwrap().items;
    assert_eq!(old.len(), 1);
    let old_uid = old[0].metadata.uid.clone();
    let killed = std::time::Instant::now();
    pods.delete(
        &old[0].metadata.name.clone().unwrap(),
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    // Within the shortest periodic resync (60 s less its 20% jitter): only
    // the watch can have started the replacement.
    let new_ip = eventually("a new Pod running", Duration::from_secs(45), || async {
        let pod = pods.list(&Default::default()).await.ok()?.items.pop()?;
        let status = pod.status.as_ref()?;
        (pod.metadata.uid != old_uid && status.phase.as_deref() == Some("Running"))
            .then_some(status.pod_ip.clone()?)
    })
    .await;
    eventually(
        "Running on the new Pod",
        Duration::from_secs(45),
        || async {
            let p = proxies.get("w1").await.ok()?;
            (phase(&p) == Some("Running") && p.status.as_ref()?.ip.as_ref() == Some(&new_ip))
                .then_some(())
        },
    )
    .await;
    println!(
        "killed Pod replaced, Proxy Running at {new_ip} (was {ip}) after {:.1} s",
        killed.elapsed().as_secs_f64()
    );
    drop(dir);
}
