//! Scenario tests of `controller::reconcile` in process: real Proxy objects
//! on the test cluster's API server (finalizer, annotations and status are
//! real writes), the in-memory fake provider behind the registry, and a
//! health source the test sets. Each pass is one call of `reconcile`, so a
//! scenario steps through a Proxy's life without polling a process.

use std::sync::Arc;
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::controller::plan;
use egress_proxies_operator::controller::reconcile::error_policy;
use egress_proxies_operator::controller::Error;
use egress_proxies_operator::provider::fake::FakeProvider;
use egress_proxies_operator::provider::{ErrorClass, Op};
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::json;

use crate::scenario::Scenario;
use crate::support::{condition, phase};

fn reason(p: &Proxy, type_: &str) -> Option<(String, String)> {
    condition(p, type_).map(|c| (c.status.as_str().to_string(), c.reason.clone()))
}

fn pair(status: &str, reason: &str) -> Option<(String, String)> {
    Some((status.to_string(), reason.to_string()))
}

fn provider_id(p: &Proxy) -> String {
    p.status.as_ref().unwrap().provider_id.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_create_running_ready() {
    let s = Scenario::new("sc-ready").await;
    s.create("p", json!({"provider": "fake", "port": 3128}))
        .await;

    // The finalizer comes first, before any provider call.
    assert_eq!(s.ok("p").await, Action::requeue(plan::REQUEUE_NOW));
    let p = s.get("p").await;
    assert!(p
        .finalizers()
        .iter()
        .any(|f| f == "crawl.example.com/finalizer"));
    assert_eq!(s.fake.calls(Op::Create), 0);

    // Created, then booting.
    assert_eq!(s.ok("p").await, Action::requeue(plan::REQUEUE_NOW));
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Provisioning"));
    assert_eq!(reason(&p, "Provisioned"), pair("False", "Creating"));
    assert_eq!(reason(&p, "Ready"), pair("False", "Creating"));
    assert_eq!(
        p.status.as_ref().unwrap().observed_generation,
        p.metadata.generation
    );
    assert!(p.annotations().contains_key("crawl.example.com/spec-hash"));
    assert_eq!(s.fake.calls(Op::Create), 1);
    assert_eq!(s.ok("p").await, Action::requeue(plan::PROVISIONING_POLL));

    // Running with the fake's address, not Ready without a verdict.
    assert_eq!(s.ok("p").await, Action::requeue(plan::RUNNING_RESYNC));
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Running"));
    assert_eq!(reason(&p, "Provisioned"), pair("True", "InstanceRunning"));
    assert_eq!(reason(&p, "Ready"), pair("False", "AwaitingVerdict"));
    let ip = p.status.as_ref().unwrap().ip.clone().unwrap();
    assert!(ip.starts_with("192.0.2."), "{ip}");

    // A healthy verdict makes it Ready; a failing one takes it back.
    s.health.set(&p, true, "probe passed");
    s.ok("p").await;
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Ready"));
    assert_eq!(reason(&p, "Healthy"), pair("True", "ProbeSucceeded"));
    assert_eq!(reason(&p, "Ready"), pair("True", "ProxyReady"));
    assert_eq!(p.status.as_ref().unwrap().latency_millis, Some(12));
    s.health.set(&p, false, "connecting to the proxy: refused");
    s.ok("p").await;
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Running"));
    assert_eq!(reason(&p, "Healthy"), pair("False", "ProbeFailed"));
    assert_eq!(
        condition(&p, "Healthy").unwrap().message,
        "connecting to the proxy: refused"
    );
    assert_eq!(reason(&p, "Ready"), pair("False", "ProbeFailed"));
    assert_eq!(
        condition(&p, "Ready").unwrap().message,
        "connecting to the proxy: refused"
    );
    assert_eq!(s.fake.calls(Op::Create), 1, "one instance all along");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_vanished_instance_is_replaced() {
    let s = Scenario::new("sc-vanish").await;
    let p = s.running("p").await;
    s.health.set(&p, true, "probe passed");
    s.ok("p").await;
    assert_eq!(phase(&s.get("p").await), Some("Ready"));

    assert!(s.fake.vanish(&provider_id(&p)));
    // The same pass sees it gone and creates the replacement; the old
    // verdict no longer counts.
    assert_eq!(s.ok("p").await, Action::requeue(plan::REQUEUE_NOW));
    let p = s.get("p").await;
    assert_eq!(s.fake.calls(Op::Create), 2);
    assert_eq!(phase(&p), Some("Provisioning"));
    assert_eq!(reason(&p, "Healthy"), pair("Unknown", "AwaitingProbe"));
    assert_eq!(s.fake.instances().len(), 1);
    s.health.clear(&p);
    s.until("p", 4, |p| phase(p) == Some("Running")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_spec_change_of_a_running_instance_waits_for_the_fleets_budget() {
    let s = Scenario::new("sc-spec").await;
    let p = s.running("p").await;
    let old_hash = p.annotations()["crawl.example.com/spec-hash"].clone();
    let running_phase = phase(&p).map(String::from);

    s.edit_spec("p", json!({"port": 3129})).await;
    // The running instance is not deleted at once: it keeps serving, on
    // the port it was created with, marked for the provider's budget
    // (here no fleet view admits it; the system tests roll it).
    let action = s.ok("p").await;
    assert_ne!(action, Action::await_change(), "it asks the budget again");
    let p = s.get("p").await;
    assert_eq!(s.fake.calls(Op::Delete), 0);
    assert_eq!(phase(&p).map(String::from), running_phase);
    let cond = condition(&p, "UpToDate").unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "SpecChanged")
    );
    let st = p.status.as_ref().unwrap();
    assert_eq!(st.port, Some(3128), "it still serves on its own port");
    assert_eq!(p.annotations()["crawl.example.com/spec-hash"], old_hash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_permanent_error_fails_and_latches() {
    let s = Scenario::new("sc-perm").await;
    s.fake.fail_next_with(
        Op::Create,
        1,
        ErrorClass::Permanent,
        "placement.zone \"mars-1\" is not offered",
    );
    s.create("p", json!({"provider": "fake", "port": 3128}))
        .await;
    let (p, action) = s.until("p", 3, |p| phase(p) == Some("Failed")).await;
    assert_eq!(action, Action::await_change());
    let cond = condition(&p, "Provisioned").unwrap();
    assert_eq!(cond.reason, "PermanentError");
    assert!(
        cond.message
            .contains("placement.zone \"mars-1\" is not offered"),
        "{}",
        cond.message
    );
    assert_eq!(cond.observed_generation, p.metadata.generation);
    assert_eq!(reason(&p, "Ready"), pair("False", "PermanentError"));
    assert_eq!(
        condition(&p, "Ready").unwrap().observed_generation,
        p.metadata.generation
    );

    // Latched: no further provider call at this generation.
    assert_eq!(s.ok("p").await, Action::await_change());
    assert_eq!(s.fake.calls(Op::Create), 1);

    // An edit lifts the latch.
    s.edit_spec("p", json!({"port": 3129})).await;
    s.until("p", 4, |p| phase(p) == Some("Running")).await;
    assert_eq!(s.fake.calls(Op::Create), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_transient_error_is_retried() {
    let s = Scenario::new("sc-transient").await;
    s.fake.fail_next(Op::Create, 1, ErrorClass::Transient);
    let proxy = s
        .create("p", json!({"provider": "fake", "port": 3128}))
        .await;
    s.ok("p").await; // the finalizer
    let err = match s.pass("p").await {
        Err(e) => e,
        Ok(a) => panic!("a transient create failure must be an error, got {a:?}"),
    };
    assert!(matches!(&err, Error::Provider(e) if e.class() == ErrorClass::Transient));
    // Retried with backoff; the status says nothing failed for good.
    assert_eq!(
        error_policy(Arc::new(proxy), &err, s.ctx.clone()),
        Action::requeue(Duration::from_millis(5))
    );
    let p = s.get("p").await;
    assert_ne!(phase(&p), Some("Failed"));
    assert!(p
        .status
        .as_ref()
        .and_then(|st| st.provider_id.clone())
        .is_none());

    // The retry creates it.
    s.until("p", 4, |p| phase(p) == Some("Running")).await;
    assert_eq!(s.fake.calls(Op::Create), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_deletion_deletes_the_instance_then_releases() {
    let s = Scenario::new("sc-delete").await;
    s.running("p").await;
    assert_eq!(s.fake.instances().len(), 1);
    s.proxies
        .delete("p", &DeleteParams::default())
        .await
        .unwrap();
    // Held by the finalizer while the instance is deleted.
    assert_eq!(s.ok("p").await, Action::requeue(plan::DELETION_POLL));
    let p = s.get("p").await;
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(s.fake.calls(Op::Delete), 1);
    assert!(s.fake.instances().is_empty());
    // Gone: the finalizer goes, and with it the Proxy.
    assert_eq!(s.ok("p").await, Action::await_change());
    assert!(s.proxies.get_opt("p").await.unwrap().is_none());
    assert_eq!(s.fake.calls(Op::Delete), 1, "no second delete");
}

/// What the Kubernetes API server says when RBAC refuses the operator.
const FORBIDDEN: &str = "pods \"proxy-x\" is forbidden: User \"system:serviceaccount:ops:controller\" cannot get resource \"pods\" in the namespace \"default\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_an_unavailable_provider_keeps_a_ready_proxy_serving() {
    let s = Scenario::new("sc-unavail").await;
    let p = s.running("p").await;
    s.health.set(&p, true, "probe passed");
    s.ok("p").await;
    assert_eq!(phase(&s.get("p").await), Some("Ready"));

    // The credentials are revoked: every get is refused.
    s.fake
        .fail_next_with(Op::Get, 2, ErrorClass::Unavailable, FORBIDDEN);
    assert_eq!(
        s.ok("p").await,
        Action::requeue(plan::UNAVAILABLE_RETRY_MIN),
        "not an error, not a latch: a slow retry"
    );
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Ready"), "still serving while probes pass");
    assert_eq!(reason(&p, "Healthy"), pair("True", "ProbeSucceeded"));
    assert_eq!(
        reason(&p, "Provisioned"),
        pair("Unknown", "ProviderUnavailable")
    );
    let message = condition(&p, "Provisioned").unwrap().message.clone();
    assert!(
        message.contains("cannot be observed") && message.contains(FORBIDDEN),
        "{message}"
    );
    assert!(!message.contains("Status {"), "{message}");

    // Still refused, and now the probes fail too: out of the pool, but
    // not Failed.
    s.health.set(&p, false, "connecting to the proxy: refused");
    s.ok("p").await;
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Running"));
    assert_eq!(
        reason(&p, "Provisioned"),
        pair("Unknown", "ProviderUnavailable")
    );

    // Credentials restored: the next pass recovers with no edit.
    s.health.set(&p, true, "probe passed");
    assert_eq!(s.ok("p").await, Action::requeue(plan::RUNNING_RESYNC));
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Ready"));
    assert_eq!(reason(&p, "Provisioned"), pair("True", "InstanceRunning"));
    assert_eq!(s.fake.calls(Op::Create), 1, "the instance was kept");
    assert_eq!(s.fake.calls(Op::Delete), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_permanent_get_never_latches() {
    let s = Scenario::new("sc-permget").await;
    s.running("p").await;
    s.fake.fail_next_with(
        Op::Get,
        1,
        ErrorClass::Permanent,
        "malformed providerID \"x\"",
    );
    s.ok("p").await;
    let p = s.get("p").await;
    assert_eq!(phase(&p), Some("Running"), "not Failed");
    assert_eq!(
        reason(&p, "Provisioned"),
        pair("Unknown", "ProviderUnavailable")
    );
    // The next pass asks again and finds it running.
    assert_eq!(s.ok("p").await, Action::requeue(plan::RUNNING_RESYNC));
    let p = s.get("p").await;
    assert_eq!(reason(&p, "Provisioned"), pair("True", "InstanceRunning"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_requeues_are_jittered() {
    let s = Scenario::jittered("sc-jitter", FakeProvider::new("fake"), 1.0).await;
    s.create("p", json!({"provider": "fake", "port": 3128}))
        .await;
    assert_eq!(
        s.ok("p").await,
        Action::requeue(plan::jitter(plan::REQUEUE_NOW, 1.0))
    );
    assert!(plan::jitter(plan::REQUEUE_NOW, 1.0) < plan::REQUEUE_NOW);
}

/// The delay of a requeue, read from its Debug form (`Action` keeps it
/// private): `Action { requeue_after: Some(59.9s) }`.
fn requeue_of(a: &Action) -> Option<Duration> {
    let text = format!("{a:?}");
    let secs = text.split("Some(").nth(1)?.split(')').next()?;
    let value: f64 = if let Some(ms) = secs.strip_suffix("ms") {
        ms.parse::<f64>().ok()? / 1000.0
    } else {
        secs.strip_suffix('s')?.parse().ok()?
    };
    Some(Duration::from_secs_f64(value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_create_waits_for_a_token_without_calling_the_provider() {
    // One create a minute, a burst of one.
    let s = Scenario::configured(
        "sc-throttle",
        FakeProvider::new("fake"),
        0.0,
        "    createsPerMinute: 1\n",
    )
    .await;
    s.running("a").await;
    assert_eq!(s.fake.calls(Op::Create), 1);

    s.create("b", json!({"provider": "fake", "port": 3128}))
        .await;
    s.ok("b").await; // the finalizer
    let action = s.ok("b").await;
    let wait = requeue_of(&action).unwrap();
    assert!(
        wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
        "back at its slot, about a minute after the first create: {wait:?}"
    );
    let p = s.get("b").await;
    assert_eq!(phase(&p), Some("Provisioning"));
    assert_eq!(reason(&p, "Provisioned"), pair("False", "CreateThrottled"));
    let message = &condition(&p, "Provisioned").unwrap().message;
    assert!(
        message.contains("provider \"fake\" allows 1 creates a minute (createsPerMinute)"),
        "{message}"
    );
    assert!(message.contains("next try at"), "{message}");
    // Asked again early (a watch event), it still waits and still calls
    // nothing.
    s.ok("b").await;
    assert_eq!(s.fake.calls(Op::Create), 1);
    assert!(p.status.unwrap().provider_id.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_an_instance_that_keeps_vanishing_backs_off() {
    let s = Scenario::new("sc-replace-backoff").await;
    let p = s.running("p").await;

    // The first death is replaced at once.
    assert!(s.fake.vanish(&provider_id(&p)));
    assert_eq!(s.ok("p").await, Action::requeue(plan::REQUEUE_NOW));
    assert_eq!(s.fake.calls(Op::Create), 2);
    let p = s.until("p", 4, |p| phase(p) == Some("Running")).await.0;
    let status = p.status.clone().unwrap();
    assert_eq!(status.replacements, Some(1));
    let first = status.last_replaced_at.unwrap();

    // The second waits 30 s, with no create meanwhile.
    assert!(s.fake.vanish(&provider_id(&p)));
    let wait = requeue_of(&s.ok("p").await).unwrap();
    assert!(
        wait > Duration::from_secs(29) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
    let p = s.get("p").await;
    assert_eq!(reason(&p, "Provisioned"), pair("False", "ReplaceBackoff"));
    assert_eq!(phase(&p), Some("Provisioning"));
    let status = p.status.clone().unwrap();
    assert_eq!(status.replacements, Some(2));
    assert!(status.last_replaced_at.unwrap() > first);
    assert!(status.provider_id.is_none());
    s.ok("p").await;
    assert_eq!(s.fake.calls(Op::Create), 2, "no create during the backoff");
}
