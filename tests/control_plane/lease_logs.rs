//! A lease belongs to its client, and its id reaches no log (issue 31): the
//! real binary, logging at TRACE and exporting its spans, with two named
//! clients. Bob's get, renew, report and release of the default client's
//! lease, of a malformed id and of an id signed with another key all
//! answer `404 unknown_lease`, and the lease is still held; its holder then
//! gets, renews, reports and releases it. Neither the log nor any exported
//! span holds the id or a token; the request lines name the lease by a
//! short digest.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::PostParams;
use serde_json::json;

use crate::support::{self, api_call, eventually, phase, squid, Operator};

const TOKEN: &str = "lease-logs-token";
const BOB: &str = "bob-lease-logs-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_calls_meet_404_and_no_lease_id_or_token_reaches_the_log() {
    squid::require();
    let ground = support::ground_without_pods("lease-logs").await;
    let target = support::http_target().await;
    let (port, _squid) = squid::on_loopback("leaselogs").await;
    let exported: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = exported.clone();
    let otlp = support::otlp_receiver(move |body| sink.lock().unwrap().push(body.to_vec())).await;
    let api = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("operator.log");
    let tokens = dir.path().join("tokens");
    std::fs::create_dir(&tokens).unwrap();
    std::fs::write(tokens.join("bob"), BOB).unwrap();
    let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
    cmd.args(["--discovery-tokens-dir", tokens.to_str().unwrap()])
        .args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"])
        .env("LOG_LEVEL", "trace")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    let op = Operator::spawn(cmd, &log);
    let proxies = ground.proxies();
    let p = support::proxy(
        "logged",
        json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
    );
    proxies.create(&PostParams::default(), &p).await.unwrap();
    eventually("the Proxy Ready", Duration::from_secs(60), || async {
        let p = proxies.get("logged").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    let lease = eventually("a lease", Duration::from_secs(30), || async {
        let (s, v) = api_call(
            api,
            "POST",
            "/v1/leases",
            Some(TOKEN),
            br#"{"ttlSeconds": 60}"#.to_vec(),
        )
        .await;
        (s == 201).then_some(v)
    })
    .await;
    let id = lease["id"].as_str().unwrap().to_string();
    let path = format!("/v1/leases/{id}");
    // Bob holds the id, a malformed one, and one whose tag another key
    // made (the id with its last character changed): the same 404 for
    // each call, and nothing is released.
    let last = id.chars().last().unwrap();
    let forged = format!(
        "{}{}",
        &id[..id.len() - 1],
        if last == 'A' { 'B' } else { 'A' }
    );
    for (who, token, lease_id) in [
        ("bob", BOB, id.as_str()),
        ("bob", BOB, "v1.not-an-id"),
        ("the holder", TOKEN, forged.as_str()),
    ] {
        let p = format!("/v1/leases/{lease_id}");
        for (method, p, body) in [
            ("GET", p.clone(), Vec::new()),
            (
                "POST",
                format!("{p}/renew"),
                br#"{"ttlSeconds": 60}"#.to_vec(),
            ),
            (
                "POST",
                format!("{p}/report"),
                br#"{"result": "failed"}"#.to_vec(),
            ),
            ("DELETE", p.clone(), Vec::new()),
        ] {
            let (s, v) = api_call(api, method, &p, Some(token), body).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (404, Some("unknown_lease")),
                "{who}: {method} {p}: {v}"
            );
        }
    }
    for (method, path, body, want) in [
        ("GET", path.clone(), Vec::new(), 200),
        (
            "POST",
            format!("{path}/renew"),
            br#"{"ttlSeconds": 60}"#.to_vec(),
            200,
        ),
        (
            "POST",
            format!("{path}/report"),
            br#"{"result": "ok"}"#.to_vec(),
            204,
        ),
        ("DELETE", path.clone(), Vec::new(), 204),
    ] {
        let (s, v) = api_call(api, method, &path, Some(TOKEN), body).await;
        assert_eq!(s, want, "{method} {path}: {v}");
    }
    // The request lines are written and the spans exported.
    let text = eventually(
        "the release's request line",
        Duration::from_secs(10),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .any(|l| l.contains("request") && l.contains("DELETE") && l.contains("/v1/leases/"))
                .then_some(text)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(op);
    let text = std::fs::read_to_string(&log).unwrap_or(text);
    // The id, and each of its long parts (a nonce or a tag alone is
    // nearly as telling).
    let mut secrets = vec![id.clone(), forged.clone(), TOKEN.into(), BOB.into()];
    secrets.extend(id.split('.').filter(|p| p.len() >= 16).map(String::from));
    let lines = text.lines().count();
    for s in &secrets {
        assert!(
            !text.contains(s.as_str()),
            "the TRACE log holds a lease id, a part of one, or a token ({s})"
        );
    }
    let bodies = exported.lock().unwrap().clone();
    assert!(!bodies.is_empty(), "no span was exported");
    for b in &bodies {
        for s in &secrets {
            assert!(
                !b.windows(s.len()).any(|w| w == s.as_bytes()),
                "an exported span holds a lease id, a part of one, or a token ({s})"
            );
        }
    }
    let digests = text
        .lines()
        .filter(|l| l.contains("/v1/leases/id:"))
        .count();
    assert!(
        digests >= 16,
        "the request lines name the lease by its digest"
    );
    println!(
        "{lines} TRACE log lines and {} span exports hold no part of the lease id; {digests} request lines name it by digest",
        bodies.len()
    );
}
