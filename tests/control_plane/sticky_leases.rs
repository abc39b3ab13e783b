//! Sticky leases over HTTP through the real binary: a lease asked for with
//! a `stickyKey` goes to the key's proxy again while that proxy is healthy
//! (even when fairness alone would pick the other), and to another proxy
//! once it leaves the healthy set.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::Duration;

use kube::api::PostParams;
use serde_json::{json, Value};

use crate::support::{self, api_call, eventually, phase, squid, Operator};

const TOKEN: &str = "sticky-token";

async fn acquire(api: std::net::SocketAddr, body: Value) -> Value {
    let (s, v) = api_call(
        api,
        "POST",
        "/v1/leases",
        Some(TOKEN),
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v
}

async fn release(api: std::net::SocketAddr, lease: &Value) {
    let id = lease["id"].as_str().unwrap();
    let (s, v) = api_call(
        api,
        "DELETE",
        &format!("/v1/leases/{id}"),
        Some(TOKEN),
        Vec::new(),
    )
    .await;
    assert_eq!(s, 204, "{v}");
}

fn proxy_of(lease: &Value) -> String {
    lease["proxy"]["name"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_key_keeps_its_proxy_while_healthy_and_moves_when_it_leaves() {
    squid::require();
    let ground = support::ground_without_pods("sticky").await;
    let target = support::http_target().await;
    let (port_a, squid_a) = squid::on_loopback("stickya").await;
    let (port_b, squid_b) = squid::on_loopback("stickyb").await;
    let api = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    for (name, port) in [("sq-a", port_a), ("sq-b", port_b)] {
        let p = support::proxy(
            name,
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually("both Proxies Ready", Duration::from_secs(60), || async {
        for name in ["sq-a", "sq-b"] {
            let p = proxies.get(name).await.ok()?;
            (phase(&p) == Some("Ready")).then_some(())?;
        }
        Some(())
    })
    .await;
    // Both listed as leasable before the first acquire.
    eventually("both listed", Duration::from_secs(30), || async {
        let (s, v) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), Vec::new()).await;
        (s == 200 && v["items"].as_array()?.len() == 2).then_some(())
    })
    .await;

    let sticky = json!({"ttlSeconds": 60, "stickyKey": "crawler-session-1"});
    let first = acquire(api, sticky.clone()).await;
    let home = proxy_of(&first);
    release(api, &first).await;
    // Fairness alone now picks the other proxy (the key's was granted
    // last): an unkeyed acquire shows it.
    let unkeyed = acquire(api, json!({"ttlSeconds": 60})).await;
    assert_ne!(
        proxy_of(&unkeyed),
        home,
        "fairness picks the least recently granted"
    );
    release(api, &unkeyed).await;
    for round in 0..3 {
        let again = acquire(api, sticky.clone()).await;
        assert_eq!(
            proxy_of(&again),
            home,
            "round {round}: same key, same proxy"
        );
        release(api, &again).await;
    }

    // The key's proxy leaves: its Squid stops, its probes fail, it is no
    // longer listed; the key then gets the other proxy.
    let (gone, other) = if home == "sq-a" {
        ("sq-a", "sq-b")
    } else {
        ("sq-b", "sq-a")
    };
    let mut squids = [("sq-a", Some(squid_a)), ("sq-b", Some(squid_b))];
    for (name, s) in &mut squids {
        if *name == gone {
            drop(s.take());
        }
    }
    eventually(
        &format!("{gone} unlisted"),
        Duration::from_secs(60),
        || async {
            let (s, v) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), Vec::new()).await;
            let names: Vec<&str> = v["items"]
                .as_array()?
                .iter()
                .filter_map(|p| p["name"].as_str())
                .collect();
            (s == 200 && !names.contains(&gone)).then_some(())
        },
    )
    .await;
    let moved = acquire(api, sticky).await;
    assert_eq!(proxy_of(&moved), other, "the key's proxy left: another one");
    println!(
        "sticky key on {home} four times; on {} once {gone} left",
        proxy_of(&moved)
    );
}
