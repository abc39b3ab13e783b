//! System test of a fresh IP on request (issue 32): the real operator
//! binary with its discovery API, gcp Proxies through the real Google
//! client against the Compute stand-in (every instance served by one real
//! Squid on loopback), a crawler speaking HTTP to the API, and `kubectl
//! annotate` for the user's way.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::e2e_create_limits::providers;
use crate::gcp_standin::{StandIn, ZONE};
use crate::support::squid;
use crate::support::{self, api_call, eventually, phase, Operator};

const TOKEN: &str = "replace-gcp-token";

/// Three Proxies Ready. A crawler holding a lease asks
/// `POST /v1/leases/{id}/replace`: it gets a lease on another proxy in the
/// same answer; the old proxy drains and its instance is deleted and
/// inserted again exactly once (`ReplaceRequested` Event naming the
/// client), and it is Ready again. Then `kubectl annotate px …
/// crawl.example.com/replace=1` does the same for another Proxy, once:
/// the same value written again makes no further instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawler_and_kubectl_get_a_fresh_instance_on_request() {
    squid::require();
    let ground = support::ground_without_pods("replace-gcp").await;
    let standin = StandIn::serving_on_loopback(Duration::from_secs(400)).await;
    let target = support::http_target().await;
    let (port, _squid) = squid::on_loopback("replgcp").await;
    let api = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let cmd = ground.discovery_operator(dir.path(), &providers(&standin, ""), api, TOKEN);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    let mut instances = BTreeMap::new();
    for name in ["fresh-0", "fresh-1", "fresh-2"] {
        let spec = json!({
            "provider": "gcp-eu",
            "port": port,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200},
            "recycle": {"drainTimeout": "30s"},
        });
        let p = proxies
            .create(&PostParams::default(), &support::proxy(name, spec))
            .await
            .unwrap();
        instances.insert(
            name.to_string(),
            egress_proxies_operator::provider::naming::name_from_uid(&p.uid().unwrap()),
        );
    }
    let ready = |n: usize| {
        let proxies = proxies.clone();
        async move {
            let list = proxies.list(&Default::default()).await.ok()?.items;
            (list.iter().filter(|p| phase(p) == Some("Ready")).count() == n).then_some(())
        }
    };
    eventually("all 3 Ready", Duration::from_secs(120), || ready(3)).await;
    // Ready in the API server is listed by the API within its cache lag
    // (and the listing's refresh): the replace needs another to move to.
    eventually("all 3 listed", Duration::from_secs(10), || async {
        let (s, v) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
        (s == 200 && v["items"].as_array().map(Vec::len) == Some(3)).then_some(())
    })
    .await;
    let (st, lease) = eventually("a lease", Duration::from_secs(10), || async {
        let r = api_call(api, "POST", "/v1/leases", Some(TOKEN), b"{}".to_vec()).await;
        (r.0 == 201).then_some(r)
    })
    .await;
    assert_eq!(st, 201);
    let old = lease["proxy"]["name"].as_str().unwrap().to_string();
    let id = lease["id"].as_str().unwrap();

    let asked = Instant::now();
    let (st, new) = api_call(
        api,
        "POST",
        &format!("/v1/leases/{id}/replace"),
        Some(TOKEN),
        b"{}".to_vec(),
    )
    .await;
    println!("replace answered {st} in {:?}: {new}", asked.elapsed());
    assert_eq!(st, 201, "{new}");
    assert_ne!(new["proxy"]["name"].as_str().unwrap(), old, "another proxy");
    let (st, _) = api_call(api, "GET", &format!("/v1/leases/{id}"), Some(TOKEN), vec![]).await;
    assert_eq!(st, 404, "the old lease ended");

    let events: Api<Event> = ground.api();
    let note = eventually("a ReplaceRequested Event", Duration::from_secs(60), || {
        support::event_note(&events, &old, "ReplaceRequested")
    })
    .await;
    assert!(
        note.contains("api client default"),
        "names the client: {note}"
    );
    let inserted_again = |name: &str, n: usize| {
        let instance = instances[name].clone();
        let standin = &standin;
        async move { (standin.calls("insert", &instance).len() >= n).then_some(()) }
    };
    eventually(
        "the old proxy's new instance",
        Duration::from_secs(90),
        || inserted_again(&old, 2),
    )
    .await;
    println!("new instance inserted {:?} after the ask", asked.elapsed());
    eventually("all 3 Ready again", Duration::from_secs(90), || ready(3)).await;

    // kubectl: another Proxy, by annotation.
    let other = ["fresh-0", "fresh-1", "fresh-2"]
        .into_iter()
        .find(|n| *n != old)
        .unwrap();
    ground.kubectl(&["annotate", "px", other, "crawl.example.com/replace=1"]);
    eventually(
        "the annotated proxy's new instance",
        Duration::from_secs(90),
        || inserted_again(other, 2),
    )
    .await;
    eventually("all 3 Ready once more", Duration::from_secs(90), || {
        ready(3)
    })
    .await;
    let p = proxies.get(other).await.unwrap();
    assert_eq!(
        p.status.as_ref().unwrap().replace_handled.as_deref(),
        Some("1"),
        "the value acted on is recorded"
    );
    // The same value again asks nothing new.
    ground.kubectl(&[
        "annotate",
        "--overwrite",
        "px",
        other,
        "crawl.example.com/replace=1",
    ]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    for (name, instance) in &instances {
        let inserts = standin.calls("insert", instance).len();
        let deletes = standin.calls("delete", instance).len();
        let want = if name == &old || name == other { 2 } else { 1 };
        assert_eq!(
            (inserts, deletes),
            (want, want - 1),
            "{name}: inserts and deletes"
        );
    }
}
