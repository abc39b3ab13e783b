//! System test of the Events a Proxy's transitions record (issue 21): the
//! real operator binary on the real test cluster, a kubernetes Proxy
//! served by a real Squid Pod and replaced after a port change, read back
//! with the pinned kubectl and from the API.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::{eventually, phase, proxy};

use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

/// In every cloud-init here; no Event may carry it.
const SENTINEL: &str = "SENTINEL-cloud-init-7f3a9c";

fn cloud_init_secret(name: &str, labelled: bool) -> Secret {
    let labels = if labelled {
        json!({"crawl.example.com/cloud-init": "true"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "labels": labels},
        "stringData": {"user-data": format!("#cloud-config\n# {SENTINEL}\n")}
    }))
    .unwrap()
}

/// The Events regarding the Proxy `name`, oldest first, as (reason, note).
async fn events_of(events: &Api<Event>, name: &str) -> Vec<(String, String)> {
    let mut list = support::events_regarding(events, name).await;
    list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    list.into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The Events regarding `name` as (reason, note, times seen): a repeat
/// recorded as a series counts on the first one.
async fn series_of(events: &Api<Event>, name: &str) -> Vec<(String, String, i32)> {
    support::events_regarding(events, name)
        .await
        .into_iter()
        .map(|e| {
            let n = e.series.as_ref().map_or(1, |s| s.count);
            (e.reason.unwrap_or_default(), e.note.unwrap_or_default(), n)
        })
        .collect()
}

fn reasons(events: &[(String, String)]) -> Vec<&str> {
    events.iter().map(|(r, _)| r.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_transitions_show_in_kubectl_describe_and_never_carry_cloud_init() {
    support::require_squid_pods();
    let ground = support::ground("events").await;
    let target = support::http_target_on(ground.host_ip()).await;
    let dir = tempfile::tempdir().unwrap();
    let _op = ground.probing_operator(dir.path(), target);
    let proxies: Api<Proxy> = ground.proxies();
    let secrets: Api<Secret> = ground.api();
    let events: Api<Event> = ground.api();
    let pp = PostParams::default();
    secrets
        .create(&pp, &cloud_init_secret("ci-ok", true))
        .await
        .unwrap();
    secrets
        .create(&pp, &cloud_init_secret("ci-unlabelled", false))
        .await
        .unwrap();
    let spec = |secret: &str| json!({"provider": "kubernetes", "port": 3128, "cloudInit": {"secretRef": {"name": secret}}});
    proxies
        .create(&pp, &proxy("px", spec("ci-ok")))
        .await
        .unwrap();
    proxies
        .create(&pp, &proxy("bad", spec("ci-unlabelled")))
        .await
        .unwrap();

    // Creating → Running → Ready, each once, in that order.
    let started = std::time::Instant::now();
    eventually("px Ready", Duration::from_secs(120), || async {
        let p = proxies.get("px").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    println!("px Ready after {:?}", started.elapsed());
    let seen = eventually("px's Ready Event", Duration::from_secs(30), || async {
        let seen = events_of(&events, "px").await;
        reasons(&seen).contains(&"Ready").then_some(seen)
    })
    .await;
    // A first probe may fail while Squid starts (an Unhealthy between);
    // the lifecycle Events are each recorded once, in order.
    let lifecycle: Vec<&str> = reasons(&seen)
        .into_iter()
        .filter(|r| ["Creating", "Running", "Ready"].contains(r))
        .collect();
    assert_eq!(
        lifecycle,
        ["Creating", "Running", "Ready"],
        "the Events of px: {seen:?}"
    );
    let described = ground.kubectl(&["describe", "px", "px"]);
    let table = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events in kubectl describe: {described}"));
    let at = |reason: &str| {
        table
            .find(&format!("  {reason}  "))
            .unwrap_or_else(|| panic!("{reason} not in kubectl describe's Events: {table}"))
    };
    assert!(
        at("Creating") < at("Running") && at("Running") < at("Ready"),
        "kubectl describe lists them out of order: {table}"
    );

    // An unlabelled cloud-init Secret: a CloudInitError Warning naming it.
    let bad = eventually(
        "bad's CloudInitError Event",
        Duration::from_secs(60),
        || async {
            let seen = events_of(&events, "bad").await;
            reasons(&seen).contains(&"CloudInitError").then_some(seen)
        },
    )
    .await;
    let (_, note) = bad.iter().find(|(r, _)| r == "CloudInitError").unwrap();
    assert!(note.contains("ci-unlabelled"), "{note}");
    let described = ground.kubectl(&["describe", "px", "bad"]);
    assert!(
        described.contains("Warning  CloudInitError"),
        "kubectl describe px bad: {described}"
    );

    // A Proxy that never got an instance counts against the provider's
    // budget (maxUnavailable 1) like any proxy not Ready: out of the way,
    // so the port change below rolls at once.
    proxies
        .delete("bad", &DeleteParams::default())
        .await
        .unwrap();
    eventually("bad gone", Duration::from_secs(60), || async {
        matches!(proxies.get_opt("bad").await, Ok(None)).then_some(())
    })
    .await;

    // A port change replaces the instance (after a drain, as the budget
    // admits it): Replacing with the cause, then the replacement's
    // Creating and Running.
    proxies
        .patch(
            "px",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    // The replacement runs under the same Pod name: its Creating repeats
    // the first one word for word, so the recorder counts it on that
    // Event's series. Its Running names the new Pod's address: a series of
    // the first when the address is the same, else an Event of its own
    // (a series keeps its first note, which would show a stale address).
    let total = |list: &[(String, String, i32)], reason: &str| -> i32 {
        list.iter()
            .filter(|(r, ..)| r == reason)
            .map(|(_, _, n)| *n)
            .sum()
    };
    let seen = eventually(
        "the replacement's Running recorded",
        Duration::from_secs(120),
        || async {
            let list = series_of(&events, "px").await;
            (total(&list, "Running") == 2).then_some(list)
        },
    )
    .await;
    let events_of_reason = |reason: &str| seen.iter().filter(|(r, ..)| r == reason).count();
    // (Ready may come round again by now: the replacement is probed too.)
    assert_eq!(
        (
            total(&seen, "Replacing"),
            total(&seen, "Creating"),
            events_of_reason("Creating")
        ),
        (1, 2, 1),
        "{seen:?}"
    );
    let ip = eventually(
        "the replacement's address",
        Duration::from_secs(30),
        || async { proxies.get("px").await.ok()?.status?.ip },
    )
    .await;
    assert!(
        seen.iter()
            .any(|(r, note, _)| r == "Running" && note.ends_with(&format!("at {ip}"))),
        "no Running Event names the replacement's address {ip}: {seen:?}"
    );
    let (_, why, _) = seen.iter().find(|(r, ..)| r == "Replacing").unwrap();
    assert!(why.contains("spec changed"), "{why}");

    // Deleted: the Proxy goes, its instance with it, and the Event stays.
    proxies
        .delete("px", &DeleteParams::default())
        .await
        .unwrap();
    eventually("px gone", Duration::from_secs(90), || async {
        matches!(proxies.get_opt("px").await, Ok(None)).then_some(())
    })
    .await;
    let seen = eventually("px's Deleted Event", Duration::from_secs(30), || async {
        let seen = events_of(&events, "px").await;
        reasons(&seen).contains(&"Deleted").then_some(seen)
    })
    .await;
    assert_eq!(reasons(&seen).last(), Some(&"Deleted"), "{seen:?}");

    let all = events.list(&ListParams::default()).await.unwrap().items;
    assert!(!all.is_empty());
    for e in &all {
        let text = serde_json::to_string(e).unwrap();
        assert!(
            !text.contains(SENTINEL),
            "an Event carries cloud-init: {text}"
        );
    }
}
