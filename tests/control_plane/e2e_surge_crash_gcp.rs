//! kill -9 in the middle of a surge replacement (issue 32): the operator
//! aborts right after the provider accepted the replacement's insert,
//! before the status records its ID. The next process asks for the same
//! instance name again, which the provider answers as existing and the
//! operator adopts, so the Proxy never gets a second replacement.
#![cfg(feature = "gcp")]

use std::time::Duration;

use egress_proxies_operator::crashpoint;
use egress_proxies_operator::provider::naming::{instance_name, name_from_uid};
use kube::api::{Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use crate::e2e_create_limits::providers;
use crate::gcp_standin::{StandIn, ZONE};
use crate::support::squid;
use crate::support::{self, eventually, phase, Operator};

/// One Ready Proxy on a provider with `maxSurge: 1`; its spec changes
/// while an operator armed at `after-surge-create` runs. That process
/// dies with the replacement inserted and the status showing only the
/// surge's serial; the next one adopts the same instance, it takes over,
/// and the old instance is deleted once. The stand-in never holds two
/// replacements: one insert of the old name, the replacement's name
/// asked for twice (the second answered as existing), nothing under a
/// third name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_surge_insert_adopts_the_same_replacement() {
    squid::require();
    let ground = support::ground_without_pods("surge-crash").await;
    let standin = StandIn::serving_on_loopback(Duration::from_secs(300)).await;
    let target = support::http_target().await;
    let (port, _squid) = squid::on_loopback("scrash").await;
    let dir = tempfile::tempdir().unwrap();
    let config = providers(&standin, "    maxSurge: 1\n");
    let log = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();

    let op1 = Operator::spawn(
        ground.operator(dir.path(), &config),
        &dir.path().join("op1.log"),
    );
    let proxies = ground.proxies();
    let spec = json!({
        "provider": "gcp-eu",
        "port": port,
        "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
        "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200},
    });
    let p = proxies
        .create(&PostParams::default(), &support::proxy("crash", spec))
        .await
        .unwrap();
    let uid = p.uid().unwrap();
    let (old, next) = (name_from_uid(&uid), instance_name(&uid, 1));
    eventually("crash Ready", Duration::from_secs(90), || async {
        let p = proxies.get("crash").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    drop(op1);

    let mut cmd = ground.operator(dir.path(), &config);
    cmd.env(crashpoint::ENV, crashpoint::AFTER_SURGE_CREATE);
    let mut op2 = Operator::spawn(cmd, &dir.path().join("op2.log"));
    let change = json!({"spec": {"placement": {"machineType": "e2-small"}}});
    proxies
        .patch("crash", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    op2.aborted_at(&dir.path().join("op2.log"), crashpoint::AFTER_SURGE_CREATE)
        .await;
    let st = proxies.get("crash").await.unwrap().status.unwrap();
    let surge = st
        .surge
        .clone()
        .expect("the surge was recorded before its insert");
    assert_eq!((surge.serial, surge.provider_id), (1, None));
    assert_eq!(standin.calls("insert", &next).len(), 1);

    let _op3 = Operator::spawn(
        ground.operator(dir.path(), &config),
        &dir.path().join("op3.log"),
    );
    eventually(
        "the replacement took over and the old one went",
        Duration::from_secs(120),
        || async {
            let p = proxies.get("crash").await.ok()?;
            let st = p.status.clone()?;
            let done = st.instance_serial == Some(1)
                && st.surge.is_none()
                && st.retiring.is_none()
                && phase(&p) == Some("Ready");
            done.then_some(())
        },
    )
    .await;
    let count = |kind, name: &str| standin.calls(kind, name).len();
    assert_eq!(count("insert", &old), 1, "the old name created once");
    assert_eq!(count("delete", &old), 1, "the old instance deleted once");
    assert_eq!(
        count("insert", &next),
        2,
        "the replacement asked for again, adopted"
    );
    assert_eq!(count("delete", &next), 0, "the replacement kept");
    let third = instance_name(&uid, 2);
    assert_eq!(count("insert", &third), 0, "no second replacement");
    assert!(
        log("op3.log").contains("Surge replacement took over"),
        "{}",
        log("op3.log")
    );
}
