//! System test: a Proxy on a gcp provider whose endpoint is the local
//! Compute REST stand-in, reconciled by the real operator binary on the real
//! test cluster (control plane only, the test's namespace), through the real
//! google-cloud-compute-v1 client.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::gcp_standin;
use crate::support;

use support::{eventually, Operator};

use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use gcp_standin::{StandIn, ZONE};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

fn proxy(name: &str, placement: serde_json::Value, port: i32) -> Proxy {
    support::proxy(
        name,
        json!({
            "provider": "gcp-eu",
            "port": port,
            "placement": placement,
            "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
        }),
    )
}

fn placement() -> serde_json::Value {
    json!({"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"})
}

fn condition(p: &Proxy) -> Option<(String, String)> {
    support::condition(p, "Provisioned").map(|c| (c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcp_proxy_is_created_replaced_deleted_and_failures_reach_status() {
    let ground = support::ground_without_pods("gcp").await;
    let standin = StandIn::start().await;
    standin.with(|st| st.running_after_gets = 1);
    let dir = tempfile::tempdir().unwrap();
    let providers = standin.providers_yaml();
    let _op = Operator::spawn(
        ground.operator(dir.path(), &providers),
        &dir.path().join("operator.log"),
    );
    let proxies: Api<Proxy> = ground.proxies();

    // Created, then Running with the stand-in's external IP.
    proxies
        .create(&PostParams::default(), &proxy("g1", placement(), 3128))
        .await
        .unwrap();
    let running = eventually("Running", Duration::from_secs(60), || async {
        let p = proxies.get("g1").await.ok()?;
        let s = p.status.as_ref()?;
        (s.phase.map(|x| x.as_str()) == Some("Running")).then(|| p.clone())
    })
    .await;
    let status = running.status.clone().unwrap();
    let ip = status.ip.clone().unwrap();
    assert!(ip.starts_with("127.0.0."), "{ip}");
    let id = status.provider_id.clone().unwrap();
    assert!(
        id.starts_with(&format!("zones/{ZONE}/instances/proxy-")),
        "{id}"
    );
    // A repeated insert (a reconcile that read a stale cache) is absorbed by
    // create's idempotency: still one instance.
    assert_eq!(standin.instance_count(), 1);
    let inserts_before = standin.count("POST", "/instances");

    // A spec change replaces the instance: deleted, then inserted again.
    proxies
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    eventually("replaced and Running", Duration::from_secs(60), || async {
        let p = proxies.get("g1").await.ok()?;
        let deleted = standin.count("DELETE", "/instances/") >= 1;
        let reinserted = standin.count("POST", "/instances") > inserts_before;
        (deleted && reinserted && p.status.as_ref()?.phase.map(|x| x.as_str()) == Some("Running"))
            .then_some(())
    })
    .await;
    assert!(standin.count("DELETE", "/instances/") >= 1);
    assert_eq!(standin.instance_count(), 1);

    // A placement the provider refuses: Failed, naming the field.
    proxies
        .create(
            &PostParams::default(),
            &proxy(
                "nozone",
                json!({"machineType": "e2-micro", "image": "x"}),
                3128,
            ),
        )
        .await
        .unwrap();
    let p = eventually("Failed", Duration::from_secs(30), || async {
        let p = proxies.get("nozone").await.ok()?;
        (p.status.as_ref()?.phase.map(|x| x.as_str()) == Some("Failed")).then_some(p)
    })
    .await;
    let (reason, message) = condition(&p).unwrap();
    assert_eq!(reason, "PermanentError");
    assert!(message.contains("placement.zone"), "{message}");
    // Editing the spec lifts the latch: now it is created.
    proxies
        .patch(
            "nozone",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"placement": {"zone": ZONE}}})),
        )
        .await
        .unwrap();
    eventually(
        "created after the edit",
        Duration::from_secs(30),
        || async {
            let p = proxies.get("nozone").await.ok()?;
            p.status.as_ref()?.provider_id.is_some().then_some(())
        },
    )
    .await;

    // An insert the API accepts but fails later: its reason reaches status.
    standin.with(|st| {
        st.fail_next_insert_op = Some((
            "RESOURCE_NOT_FOUND".into(),
            "image family ubuntu-9999 not found".into(),
        ))
    });
    proxies
        .create(&PostParams::default(), &proxy("badimg", placement(), 3128))
        .await
        .unwrap();
    let p = eventually(
        "the async failure in status",
        Duration::from_secs(40),
        || async {
            let p = proxies.get("badimg").await.ok()?;
            let (reason, message) = condition(&p)?;
            (reason == "PermanentError").then_some(message)
        },
    )
    .await;
    assert!(p.contains("image family ubuntu-9999 not found"), "{p}");

    // Deleting the Proxy deletes its instance.
    for name in ["g1", "nozone", "badimg"] {
        proxies
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let gone = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let left = proxies
                .list(&Default::default())
                .await
                .map(|l| l.items.len());
            if left.is_ok_and(|n| n == 0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if gone.is_err() {
        let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "Proxies not gone after 60 s:\n{}\noperator log (newest first):\n{}",
            ground.kubectl(&["get", "px", "-o", "yaml"]),
            tail.join("\n")
        );
    }
    assert_eq!(
        standin.instance_count(),
        0,
        "every instance deleted with its Proxy"
    );
}

/// A delete the provider takes minutes over is asked for once: the stand-in
/// shows the deleted instance STOPPING (to gets and listings alike) for
/// 150 s, well past the 60 s after which an unanswered delete would be
/// resubmitted; the operator waits while the instance shows it is going,
/// with exactly one DELETE for it, then releases the Proxy once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_in_progress_is_not_resubmitted() {
    const TAKES: Duration = Duration::from_secs(150);
    let ground = support::ground_without_pods("gcp-slow-delete").await;
    let standin = StandIn::start_for(Duration::from_secs(600)).await;
    standin.with(|st| st.running_after_gets = 1);
    let dir = tempfile::tempdir().unwrap();
    let providers = standin.providers_yaml();
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--provider-list-interval", "5s"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    proxies
        .create(&PostParams::default(), &proxy("slow", placement(), 3128))
        .await
        .unwrap();
    let id = eventually("Running", Duration::from_secs(60), || async {
        let p = proxies.get("slow").await.ok()?;
        let s = p.status.as_ref()?;
        (s.phase.map(|x| x.as_str()) == Some("Running")).then(|| s.provider_id.clone())?
    })
    .await;
    let name = id.rsplit('/').next().unwrap().to_string();
    standin.with(|st| st.delete_takes = Some(TAKES));
    let asked = std::time::Instant::now();
    proxies
        .delete("slow", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Proxy released once its instance is gone",
        TAKES + Duration::from_secs(90),
        || async { proxies.get_opt("slow").await.ok()?.is_none().then_some(()) },
    )
    .await;
    let deletes = standin.calls("delete", &name).len();
    let looks = standin.calls("get", &name).len();
    println!(
        "a delete taking {TAKES:?}: released after {:?}; {deletes} DELETE, {looks} gets, {} listings meanwhile",
        asked.elapsed(),
        standin.calls("list", "").len()
    );
    assert_eq!(deletes, 1, "the delete in progress was resubmitted");
    assert_eq!(standin.instance_count(), 0);
}
