//! System tests of the create limits and the replace backoff: the real
//! operator binary on the real test cluster (control plane only), a gcp
//! provider through the real Google client against the Compute stand-in,
//! which records every insert with its time.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::provider::naming::name_from_uid;
use futures::StreamExt;
use kube::api::PostParams;
use kube::ResourceExt;
use serde_json::json;

use crate::gcp_standin::{StandIn, ZONE};
use crate::support::{self, eventually, Operator};

/// The providers file of one gcp entry, `gcp-eu`, on the stand-in, with
/// `limits` (lines of the entry) added.
pub(crate) fn providers(standin: &StandIn, limits: &str) -> String {
    providers_named("gcp-eu", standin, limits)
}

/// [`providers`] with the entry called `name` (ProviderHealth objects are
/// cluster-scoped and named after the provider: a test asserting on one
/// names its provider after itself).
pub(crate) fn providers_named(name: &str, standin: &StandIn, limits: &str) -> String {
    format!(
        "providers:\n  - name: {name}\n    type: gcp\n{limits}    gcp:\n      project: my-project\n      endpoint: {}\n      anonymous: true\n      allowedPorts: [\"1-65535\"]\n",
        standin.url
    )
}

/// A Proxy on `gcp-eu` in the stand-in's zone.
pub(crate) fn gcp_proxy(name: &str) -> Proxy {
    support::proxy(
        name,
        json!({
            "provider": "gcp-eu",
            "port": 3128,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
        }),
    )
}

/// The reason of the Proxy's `Provisioned` condition.
pub(crate) fn reason(p: &Proxy) -> Option<String> {
    support::condition(p, "Provisioned").map(|c| c.reason.clone())
}

/// 300 Proxies applied at once on a provider with `createsPerMinute: 300`
/// (5 a second, a burst of 50) and `maxCreatesInFlight: 20`: exactly 300
/// inserts reach the stand-in, no window of the inserts holds more than the
/// bucket allows, never more than 20 instances are still provisioning when
/// one is inserted, and every Proxy ends Running (Provisioned=True). The
/// issue's 300 fit: the limit makes the run about a minute. The gcp
/// stand-in runs no Squid, so Running (not Ready) is the end state here.
///
/// The stand-in keeps every instance PROVISIONING until a Proxy shows
/// `CreateThrottled`: the in-flight cap then binds however slowly a
/// loaded machine runs the operator (a rate the operator never outruns
/// would hold no create, and nothing would say why one waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_proxies_applied_at_once_are_created_once_each_within_the_limits() {
    const N: usize = 300;
    const PER_MINUTE: u32 = 300;
    const BURST: usize = 50;
    const IN_FLIGHT: usize = 20;
    let ground = support::ground_without_pods("limits").await;
    let standin = StandIn::start_for(Duration::from_secs(400)).await;
    // Nothing runs until the in-flight cap has held a create.
    standin.with(|st| st.running_after_gets = u32::MAX);
    let dir = tempfile::tempdir().unwrap();
    let limits =
        format!("    createsPerMinute: {PER_MINUTE}\n    maxCreatesInFlight: {IN_FLIGHT}\n");
    let mut cmd = ground.operator(dir.path(), &providers(&standin, &limits));
    cmd.args(["--max-concurrent-reconciles", "10"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();

    let started = Instant::now();
    let names: Vec<String> = (0..N).map(|i| format!("px-{i:03}")).collect();
    futures::stream::iter(names.iter())
        .map(|name| {
            let proxies = proxies.clone();
            async move {
                proxies
                    .create(&PostParams::default(), &gcp_proxy(name))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    println!("applied {N} Proxies in {:?}", started.elapsed());

    // With 20 instances provisioning the rest say why they wait, in the
    // Reason column too; then the instances run (at their next get).
    eventually(
        "a Proxy shows CreateThrottled",
        Duration::from_secs(120),
        || async {
            let table = ground.kubectl(&["get", "px", "--no-headers"]);
            table.contains("CreateThrottled").then_some(())
        },
    )
    .await;
    // The 20th insert may still be on its way when the 21st is held.
    eventually(
        "as many instances as maxCreatesInFlight",
        Duration::from_secs(30),
        || async { (standin.instance_count() == IN_FLIGHT).then_some(()) },
    )
    .await;
    standin.with(|st| st.running_after_gets = 1);

    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        let running = list
            .iter()
            .filter(|p| reason(p).as_deref() == Some("InstanceRunning"))
            .count();
        if running == N {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {running} of {N} Proxies Running after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("{N} Proxies Running {:?} after applying", started.elapsed());

    // Exactly one insert per Proxy.
    assert_eq!(standin.count("POST", "/instances"), N, "inserts");
    assert_eq!(standin.instance_count(), N, "instances");
    let inserts = standin.with(|s| s.inserts.clone());
    assert_eq!(inserts.len(), N);
    // Never more in flight than maxCreatesInFlight: an instance the
    // operator has not yet seen RUNNING is still PROVISIONING here.
    let most = inserts.iter().map(|(_, n)| *n).max().unwrap();
    assert_eq!(most, IN_FLIGHT, "most instances provisioning at once");
    // Never faster than the bucket: the inserts in any window are at most
    // its burst plus one per 200 ms, with 2 s of slack for the time
    // between the operator letting a create go and the insert arriving.
    let interval_ms = 60_000 / i64::from(PER_MINUTE);
    let mut times: Vec<i64> = inserts.iter().map(|(t, _)| t.timestamp_millis()).collect();
    times.sort_unstable();
    support::assert_within_rate(&times, BURST, interval_ms, 2_000);
    let first_to_last = times[N - 1] - times[0];
    println!("inserts spread over {first_to_last} ms, at most {most} provisioning at once");
}

/// An instance that dies right after boot (the stand-in reports every
/// instance of that name TERMINATED): the first death is replaced at once,
/// the second waits 30 s with `ReplaceBackoff` (also in `kubectl get px`),
/// the re-create never comes before that, and once the instance runs the
/// Proxy is Running with the replacements counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_dies_right_after_boot_backs_off() {
    let ground = support::ground_without_pods("backoff").await;
    let standin = StandIn::start_for(Duration::from_secs(300)).await;
    standin.with(|st| {
        st.running_after_gets = 1;
        // Gone at the first get after its delete.
        st.delete_gets = 0;
    });
    let dir = tempfile::tempdir().unwrap();
    let _op = Operator::spawn(
        ground.operator(dir.path(), &providers(&standin, "")),
        &dir.path().join("operator.log"),
    );
    let proxies = ground.proxies();
    let created = proxies
        .create(&PostParams::default(), &gcp_proxy("dies"))
        .await
        .unwrap();
    // The finalizer pass comes first, so this is in place before the
    // first insert.
    let instance = name_from_uid(&created.uid().unwrap());
    standin.with(|st| {
        st.status_override
            .insert(instance.clone(), "TERMINATED".into())
    });

    let held = eventually("ReplaceBackoff", Duration::from_secs(90), || async {
        let p = proxies.get("dies").await.ok()?;
        (reason(&p).as_deref() == Some("ReplaceBackoff")).then_some(p)
    })
    .await;
    let status = held.status.clone().unwrap();
    assert_eq!(status.replacements, Some(2), "{status:?}");
    let last = status.last_replaced_at.unwrap();
    let message = &support::condition(&held, "Provisioned").unwrap().message;
    assert!(message.contains("2 times in a row"), "{message}");
    assert!(
        message.contains("next create is at"),
        "the message gives the next try: {message}"
    );
    assert_eq!(support::phase(&held), Some("Provisioning"));
    // Two inserts: the first instance and its immediate replacement.
    assert_eq!(standin.count("POST", "/instances"), 2);
    let table = ground.kubectl(&["get", "px", "dies", "--no-headers"]);
    assert!(table.contains("ReplaceBackoff"), "{table}");

    // The next instance boots fine.
    standin.with(|st| st.status_override.clear());
    let running = eventually("Running again", Duration::from_secs(90), || async {
        let p = proxies.get("dies").await.ok()?;
        (reason(&p).as_deref() == Some("InstanceRunning")).then_some(p)
    })
    .await;
    let inserts = standin.with(|s| s.inserts.clone());
    assert_eq!(inserts.len(), 3, "one re-create after the backoff");
    let third = inserts[2].0;
    assert!(
        third >= last + chrono::TimeDelta::seconds(30),
        "the re-create at {third} came before the 30 s backoff from {last} ended"
    );
    let status = running.status.unwrap();
    assert_eq!(
        status.replacements,
        Some(2),
        "the row is kept until the instance has run 10 minutes"
    );
    assert_eq!(status.phase.map(|p| p.as_str()), Some("Running"));
}

/// `maxInstances: 3` with 5 Proxies (issue 32): exactly 3 inserts; the
/// other two show `InstanceLimit` naming the cap (in the Reason column
/// too); once one of the 3 is deleted and its instance is gone, a fourth
/// is created. The stand-in never holds more than 3 instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_instances_holds_creates_until_an_instance_goes() {
    const CAP: usize = 3;
    let ground = support::ground_without_pods("cap").await;
    let standin = StandIn::start_for(Duration::from_secs(300)).await;
    standin.with(|st| {
        st.running_after_gets = 1;
        st.delete_gets = 0;
    });
    let dir = tempfile::tempdir().unwrap();
    let limits = format!("    maxInstances: {CAP}\n");
    let cmd = ground.operator(dir.path(), &providers(&standin, &limits));
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    for i in 0..5 {
        proxies
            .create(&PostParams::default(), &gcp_proxy(&format!("cap-{i}")))
            .await
            .unwrap();
    }
    let by_reason = || async {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        let of = |want: &str| -> Vec<Proxy> {
            list.iter()
                .filter(|p| reason(p).as_deref() == Some(want))
                .cloned()
                .collect()
        };
        (of("InstanceRunning"), of("InstanceLimit"))
    };
    let (running, held) = eventually(
        "3 Running and 2 held by the cap",
        Duration::from_secs(90),
        || async {
            assert!(standin.instance_count() <= CAP, "over the cap");
            let (running, held) = by_reason().await;
            (running.len() == CAP && held.len() == 2).then_some((running, held))
        },
    )
    .await;
    assert_eq!(standin.calls("insert", "").len(), CAP, "exactly 3 inserts");
    let message = support::condition(&held[0], "Provisioned")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("holds 3 instances, its maxInstances is 3"),
        "{message}"
    );
    let table = ground.kubectl(&["get", "px", "--no-headers"]);
    assert_eq!(table.matches("InstanceLimit").count(), 2, "{table}");

    // One of the three goes: a held one gets its instance, and no more.
    proxies
        .delete(&running[0].name_any(), &Default::default())
        .await
        .unwrap();
    eventually("a fourth insert", Duration::from_secs(90), || async {
        assert!(standin.instance_count() <= CAP, "over the cap");
        (standin.calls("insert", "").len() == CAP + 1).then_some(())
    })
    .await;
    let (running, held) = eventually("3 Running again", Duration::from_secs(60), || async {
        let (running, held) = by_reason().await;
        (running.len() == CAP).then_some((running, held))
    })
    .await;
    assert_eq!((running.len(), held.len()), (CAP, 1));
    assert!(standin.instance_count() <= CAP);
    assert_eq!(standin.calls("insert", "").len(), CAP + 1);
}
