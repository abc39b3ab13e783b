//! The API server killed (SIGKILL) and started again by the test
//! cluster's launcher while the operator reconciles: Proxies were just
//! created, given a new port and deleted when it dies, and more change as
//! soon as it is back. Every transition lands after it returns: each new
//! Proxy has its Pod, each changed Proxy's Pod the new port, each deleted
//! Proxy and its Pod are gone. The recovery time is printed.

use crate::support;
use crate::watch_cut::{carried_out, create_all, Want};

use std::time::Instant;

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;
use support::Operator;

const PROXIES: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_api_server_killed_and_restarted_loses_no_transition() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let ground = support::ground_without_pods("apiserver-kill").await;
    let dir = tempfile::tempdir().unwrap();
    let mut op = Operator::spawn(
        ground.operator(
            dir.path(),
            "providers:\n  - name: kubernetes\n    type: kubernetes\n",
        ),
        &dir.path().join("operator.log"),
    );
    let proxies: Api<Proxy> = ground.proxies();
    let pods: Api<Pod> = ground.api();
    let mut want = Want::new();
    create_all(&proxies, "a", PROXIES, &mut want).await;
    carried_out("every Pod made", &proxies, &pods, &want).await;

    // Changes the operator is busy with when the API server dies.
    create_all(&proxies, "b", 2, &mut want).await;
    proxies
        .patch(
            "a0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    want.insert("a0".into(), Some(3129));
    proxies
        .delete("a3", &DeleteParams::default())
        .await
        .unwrap();
    want.insert("a3".into(), None);
    let killed = Instant::now();
    ground.cluster.restart_apiserver().await;
    let down = killed.elapsed();

    // And more once it is back.
    create_all(&proxies, "c", 1, &mut want).await;
    proxies
        .patch(
            "a1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    want.insert("a1".into(), Some(3129));
    let back = Instant::now();
    carried_out("every transition carried out", &proxies, &pods, &want).await;
    let recovered = back.elapsed();
    assert!(
        op.0.try_wait().unwrap().is_none(),
        "the operator rides out the API server's restart without exiting"
    );
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap();
    println!(
        "| kube-apiserver killed with SIGKILL and restarted by the launcher (same flags, etcd kept) right after 4 changes (2 creates, a port change, a delete); 2 more changes once it answered | lost transitions 0 of 6; the API server passed /readyz again {down:.1?} after the kill; all carried out {recovered:.1?} after it was back; the operator kept running ({} failed reconciles logged meanwhile) |",
        log.matches("Reconcile failed").count(),
    );
}
