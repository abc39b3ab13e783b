//! A leader paused past its lease (issue 52): two replicas on the real
//! test cluster, one External Proxy on a real Squid that takes one lease.
//! The leader is SIGSTOPped; the other replica takes the Lease over and
//! grants the proxy's only lease. Calls sent to the paused leader wait in
//! its socket; when it resumes (SIGCONT) its tasks still believe it leads
//! until its campaign runs again, and its table has never heard of the
//! new grant. Its fence has closed at its renew deadline, so it grants
//! nothing and renews nothing itself: an acquire is refused (503, or the
//! new leader's 409 once it forwards), and a renewal it answers is the new
//! leader's, with the new leader's expiry.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use crate::support::leader::{self, holder, TOKEN};
use crate::support::{self, api_call_retry_after, eventually, phase, squid};

async fn call(api: SocketAddr, method: &str, path: &str, body: Value) -> (u16, Option<u64>, Value) {
    api_call_retry_after(
        api,
        method,
        path,
        Some(TOKEN),
        body.to_string().into_bytes(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_grants_and_renews_nothing_when_it_resumes() {
    squid::require();
    let ground = support::ground_without_pods("pause").await;
    let dir = tempfile::tempdir().unwrap();
    let leases_api: Api<Lease> = ground.api();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(Ipv4Addr::LOCALHOST, port, "pause", "http_access allow me").await;
    let (api_a, api_b) = (support::loopback(), support::loopback());
    let flags = ["--max-leases-per-proxy", "1", "--default-lease-ttl", "60s"];
    let serving = |name: &str, api: SocketAddr| {
        leader::serving_replica(&ground, dir.path(), name, (api, target), &flags, &[])
    };
    let a = serving("a", api_a);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases_api).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = serving("b", api_b);
    let p = support::proxy(
        "only",
        json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
    );
    ground
        .proxies()
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    eventually("the Proxy Ready", Duration::from_secs(60), || async {
        let p = ground.proxies().get("only").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    // Both replicas list it (b forwards lease calls to a while a leads).
    eventually("b lists the proxy", Duration::from_secs(30), || async {
        let (s, _, v) = call(api_b, "GET", "/v1/proxies", Value::Null).await;
        (s == 200 && v["items"].as_array()?.len() == 1).then_some(())
    })
    .await;

    // Paused past its lease (4 s; renew deadline 3 s): b takes over.
    let paused = Instant::now();
    support::signal(a.pid(), "-STOP");
    eventually(
        "b to take the Lease over",
        Duration::from_secs(30),
        || async { holder(&leases_api).await.filter(|h| h.starts_with("b_")) },
    )
    .await;
    println!(
        "b leads {:.1} s after the pause",
        paused.elapsed().as_secs_f64()
    );
    // b grants the proxy's only lease (after its recovery window, if any).
    let lease = eventually("b grants the lease", Duration::from_secs(90), || async {
        let (s, _, v) = call(api_b, "POST", "/v1/leases", json!({})).await;
        let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
        assert!(
            s == 201 || ["recovering", "leader_unavailable"].contains(&code.as_str()),
            "{s} {v}"
        );
        (s == 201).then_some(v)
    })
    .await;
    let id = lease["id"].as_str().unwrap().to_string();

    // Calls to the paused leader wait in its socket until it resumes.
    let acquire = tokio::spawn(call(api_a, "POST", "/v1/leases", json!({})));
    let renew_path = format!("/v1/leases/{id}/renew");
    let renew =
        tokio::spawn(
            async move { call(api_a, "POST", &renew_path, json!({"ttlSeconds": 300})).await },
        );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !acquire.is_finished() && !renew.is_finished(),
        "a is paused"
    );
    support::signal(a.pid(), "-CONT");
    let (s, retry_after, v) = acquire.await.unwrap();
    println!("acquire at the resumed leader: {s} {v}");
    match s {
        503 => {
            assert_eq!(v["error"]["code"], "leader_unavailable", "{v}");
            assert!(retry_after.is_some(), "a 503 says when to ask again");
        }
        // Forwarded to b, which has no room: the proxy's one lease is out.
        409 => assert_eq!(v["error"]["code"], "no_capacity", "{v}"),
        _ => panic!("the resumed leader must not grant past the proxy's capacity: {s} {v}"),
    }
    let (s, _, v) = renew.await.unwrap();
    println!("renew at the resumed leader: {s} {v}");
    match s {
        503 => assert_eq!(v["error"]["code"], "leader_unavailable", "{v}"),
        200 => {
            // Forwarded: b renewed it, and b's table says the same.
            let renewed = v["id"].as_str().unwrap();
            let (s, _, at_b) =
                call(api_b, "GET", &format!("/v1/leases/{renewed}"), Value::Null).await;
            assert_eq!(s, 200, "{at_b}");
            assert_eq!(at_b["expiresAt"], v["expiresAt"], "the renewal is b's own");
        }
        _ => panic!("the renewal: {s} {v}"),
    }
    // And afterwards a follows b: the proxy stays at one lease.
    eventually("a follows b", Duration::from_secs(30), || async {
        let (s, _, v) = call(api_a, "POST", "/v1/leases", json!({})).await;
        assert_ne!(s, 201, "a grant past capacity: {v}");
        (s == 409).then_some(())
    })
    .await;
    let log = std::fs::read_to_string(dir.path().join("a.log")).unwrap_or_default();
    assert!(
        log.contains("Could not renew the leader lease in time; stepping down")
            || log.contains("Lost the leader lease to another replica; stepping down"),
        "a stepped down after the pause"
    );
    drop((a, b));
}
