//! System test of the Events a user reads with `kubectl describe px` for
//! the transitions the kubernetes test (tests/e2e/e2e_events.rs) cannot
//! produce on demand: the real operator binary on the real test cluster,
//! the real Google client against the Compute stand-in answering a 400, a
//! quota 429, a 401 and a TERMINATED instance, and probes through an
//! instance address where nothing listens.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::Duration;

use egress_proxies_operator::provider::naming::name_from_uid;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::e2e_create_limits::providers;
use crate::gcp_standin::{StandIn, ZONE};
use crate::support::{self, eventually, Ground, Operator};

/// In the cloud-init of every Proxy here; no Event may carry it.
const SENTINEL: &str = "SENTINEL-gcp-events-5d1e";

/// Applies the Proxy `name` (on `gcp-eu`, probing `port` on its instance)
/// and returns its instance name.
async fn apply(ground: &Ground, name: &str, port: u16) -> String {
    let p = support::proxy(
        name,
        json!({
            "provider": "gcp-eu",
            "port": port,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "cloudInit": {"secretRef": {"name": "ci"}},
        }),
    );
    let p = ground
        .proxies()
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    name_from_uid(&p.uid().unwrap())
}

/// Waits for the Event, then checks `kubectl describe px` lists it with
/// its type; returns its note.
async fn shown(ground: &Ground, name: &str, type_: &str, reason: &str) -> String {
    let events: Api<Event> = ground.api();
    let note = eventually(
        &format!("{name}'s {reason} Event"),
        Duration::from_secs(90),
        || support::event_note(&events, name, reason),
    )
    .await;
    let described = ground.kubectl(&["describe", "px", name]);
    let table = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events in kubectl describe px {name}: {described}"));
    // Columns are padded to the widest entry: compare by field.
    let listed = table.lines().any(|l| {
        let mut fields = l.split_whitespace();
        fields.next() == Some(type_) && fields.next() == Some(reason)
    });
    assert!(
        listed,
        "kubectl describe px {name} does not list {type_} {reason}: {table}"
    );
    println!("{name}: {type_} {reason}: {note}");
    note
}

/// A permanent create error (400) latches `Failed`; a quota refusal (429)
/// shows `QuotaExceeded`, a refused credential (401) `ProviderUnavailable`,
/// each with the API's words; a running instance whose proxy port answers
/// nothing turns `Unhealthy` with the probe's error, and once the stand-in
/// reports it TERMINATED, `Replacing` names that cause; a deleted Proxy
/// whose delete keeps being refused shows `CleanupFailed` with the API's
/// words (Event and `Deleting` condition) and goes once it is accepted.
/// Every one is in `kubectl describe px`, and no Event carries the
/// cloud-init.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_a_user_must_act_on_show_in_kubectl_describe() {
    let ground = support::ground_without_pods("events-gcp").await;
    let standin = StandIn::start_for(Duration::from_secs(600)).await;
    let dir = tempfile::tempdir().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ci", "labels": {"crawl.example.com/cloud-init": "true"}},
        "stringData": {"user-data": format!("#cloud-config\n# {SENTINEL}\n")}
    }))
    .unwrap();
    let secrets: Api<Secret> = ground.api();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    // Probes go to the instance's address at the Proxy's port: a port
    // nothing on this host listens on (other tests run Squids on 3128).
    let dead_port = support::free_port();
    let mut cmd = ground.operator(dir.path(), &providers(&standin, ""));
    cmd.args(["--default-probe-url", "http://example.invalid/"])
        .args(["--provider-check-interval", "0"])
        .env("LOG_LEVEL", "info");
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));

    // A 400 on the insert: Permanent, latched at this generation.
    standin.inject("insert", 400, "invalid");
    apply(&ground, "failed", dead_port).await;
    let note = shown(&ground, "failed", "Warning", "Failed").await;
    assert!(note.contains("injected 400"), "the API's words: {note}");

    // Every call refused for quota while "quota" is applied.
    standin.outage(429, "rateLimitExceeded");
    apply(&ground, "quota", dead_port).await;
    let note = shown(&ground, "quota", "Warning", "QuotaExceeded").await;
    assert!(
        note.contains("injected outage 429"),
        "the API's words: {note}"
    );
    standin.heal();

    // Every call refused as unauthorized while "unavail" is applied.
    standin.outage(401, "unauthorized");
    apply(&ground, "unavail", dead_port).await;
    let note = shown(&ground, "unavail", "Warning", "ProviderUnavailable").await;
    assert!(
        note.contains("injected outage 401"),
        "the API's words: {note}"
    );
    standin.heal();

    // A running instance whose proxy answers nothing, then TERMINATED.
    let instance = apply(&ground, "px", dead_port).await;
    shown(&ground, "px", "Normal", "Running").await;
    let note = shown(&ground, "px", "Warning", "Unhealthy").await;
    assert!(
        note.contains("refused") || note.contains("connect"),
        "the probe's error: {note}"
    );
    standin.with(|st| {
        st.status_override
            .insert(instance.clone(), "TERMINATED".into())
    });
    let note = shown(&ground, "px", "Normal", "Replacing").await;
    assert!(note.contains("Terminated"), "the cause: {note}");

    // A deleted Proxy whose instance the provider refuses to delete, again
    // and again (issue 32): CleanupFailed with the API's words, in the
    // status and in kubectl describe; the finalizer holds until it can.
    apply(&ground, "stuck", dead_port).await;
    shown(&ground, "stuck", "Normal", "Running").await;
    for _ in 0..12 {
        standin.inject("delete", 400, "resourceInUseByAnotherResource");
    }
    let proxies = ground.proxies();
    proxies
        .delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    let note = shown(&ground, "stuck", "Warning", "CleanupFailed").await;
    assert!(note.contains("injected 400"), "the API's words: {note}");
    assert!(note.contains("skip-cleanup"), "what to do: {note}");
    let p = proxies.get("stuck").await.expect("held by its finalizer");
    let c = support::condition(&p, "Deleting").expect("a Deleting condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "CleanupFailed")
    );
    let described = ground.kubectl(&["describe", "px", "stuck"]);
    assert!(described.contains("CleanupFailed"), "{described}");
    // The provider gives way: the instance goes, and the Proxy with it.
    standin.with(|st| st.inject.clear());
    eventually("stuck gone", Duration::from_secs(90), || async {
        matches!(proxies.get_opt("stuck").await, Ok(None)).then_some(())
    })
    .await;

    let events: Api<Event> = ground.api();
    let all = events.list(&ListParams::default()).await.unwrap().items;
    for e in &all {
        let text = serde_json::to_string(e).unwrap();
        assert!(
            !text.contains(SENTINEL),
            "an Event carries cloud-init: {text}"
        );
    }
}
