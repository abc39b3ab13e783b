//! System test of the startup timeout (issue 32): the real operator binary
//! on the real test cluster, the real Google client against the Compute
//! stand-in, whose instances turn RUNNING but never get an address.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::{Duration, Instant};

use egress_proxies_operator::provider::naming::name_from_uid;
use k8s_openapi::api::events::v1::Event;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

use crate::e2e_create_limits::{gcp_proxy, providers, reason};
use crate::gcp_standin::StandIn;
use crate::support::{self, eventually, Operator};

/// An instance with no address is deleted once the provider's
/// `startupTimeout` (30 s) has passed since its insert, and replaced at
/// once (`status.replacements: 1`), with a Warning Event `StartupTimedOut`
/// and `Provisioned=False/StartupTimedOut` naming the timeout; its
/// replacement, stuck the same way, is replaced only after the back-off
/// (`ReplaceBackoff`, 2 replacements): the third insert comes at least
/// 30 s after the second timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_gets_an_address_is_replaced_after_its_startup_timeout() {
    let ground = support::ground_without_pods("startup").await;
    let standin = StandIn::start_for(Duration::from_secs(400)).await;
    standin.with(|st| {
        st.no_ip = true;
        st.running_after_gets = 1;
        st.delete_gets = 0;
    });
    let dir = tempfile::tempdir().unwrap();
    let cmd = ground.operator(
        dir.path(),
        &providers(&standin, "    startupTimeout: 30s\n"),
    );
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    let started = Instant::now();
    let p = proxies
        .create(&PostParams::default(), &gcp_proxy("stuck"))
        .await
        .unwrap();
    let instance = name_from_uid(&p.uid().unwrap());

    let events: Api<Event> = ground.api();
    let note = eventually("a StartupTimedOut Event", Duration::from_secs(90), || {
        support::event_note(&events, "stuck", "StartupTimedOut")
    })
    .await;
    println!("StartupTimedOut after {:?}: {note}", started.elapsed());
    assert!(note.contains("30s after its create"), "{note}");
    let described = ground.kubectl(&["describe", "px", "stuck"]);
    assert!(
        described.contains("StartupTimedOut"),
        "kubectl describe px stuck: {described}"
    );

    let held = eventually("ReplaceBackoff", Duration::from_secs(120), || async {
        let p = proxies.get("stuck").await.ok()?;
        (reason(&p).as_deref() == Some("ReplaceBackoff")).then_some(p)
    })
    .await;
    let status = held.status.clone().unwrap();
    assert_eq!(status.replacements, Some(2), "{status:?}");
    println!("ReplaceBackoff after {:?}", started.elapsed());
    eventually("a third insert", Duration::from_secs(90), || async {
        (standin.calls("insert", &instance).len() >= 3).then_some(())
    })
    .await;

    let inserts: Vec<Instant> = standin
        .calls("insert", &instance)
        .iter()
        .map(|c| c.at)
        .collect();
    let deletes: Vec<Instant> = standin
        .calls("delete", &instance)
        .iter()
        .map(|c| c.at)
        .collect();
    let secs = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64();
    println!(
        "inserts at {:?} s, deletes at {:?} s after the first insert",
        inserts
            .iter()
            .map(|t| secs(inserts[0], *t))
            .collect::<Vec<_>>(),
        deletes
            .iter()
            .map(|t| secs(inserts[0], *t))
            .collect::<Vec<_>>()
    );
    assert_eq!(inserts.len(), 3, "one insert per attempt");
    assert_eq!(deletes.len(), 2, "one delete per timed-out instance");
    for i in 0..2 {
        assert!(
            secs(inserts[i], deletes[i]) >= 29.0,
            "instance {} was deleted {:.1} s after its insert, before its 30 s startup timeout",
            i + 1,
            secs(inserts[i], deletes[i])
        );
    }
    assert!(
        secs(deletes[0], inserts[1]) < 10.0,
        "the first timeout is replaced at once"
    );
    assert!(
        secs(deletes[1], inserts[2]) >= 29.0,
        "the second timeout's replacement came {:.1} s after it, inside the 30 s back-off",
        secs(deletes[1], inserts[2])
    );
    let p = proxies.get("stuck").await.unwrap();
    assert_ne!(support::phase(&p), Some("Ready"), "never Ready: no address");
}
