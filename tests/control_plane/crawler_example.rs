//! `docs/examples/crawler.py`, run as a crawler developer runs it, against
//! the real operator binary on the real test cluster (control plane only):
//! an External Proxy whose endpoint is a real Squid on 127.0.0.1, leased
//! through the real discovery API, pages fetched through the Squid.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::io::{BufRead, BufReader};

use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use kube::api::PostParams;
use serde_json::json;

use crate::support::{self, api_call, eventually, phase, Operator};
use crate::support::{crawler, squid};

const TOKEN: &str = "crawler-example-token";

/// With one lease slot per proxy, held by someone else for 8 s, the
/// crawler's first acquire gets `409 no_capacity` and waits the
/// `Retry-After` it carries; once leased, its lease is released behind its
/// back, so its next renewal gets 404 and it acquires again; its later
/// renewals (at half the 4 s TTL) pass. Every one of its 10 fetches goes
/// through the Squid and succeeds, and it releases its lease at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_crawler_example_waits_renews_recovers_and_fetches_through_squid() {
    squid::require();
    crawler::require_python_requests();
    let ground = support::ground_without_pods("crawler-py").await;
    let target = support::http_target().await;
    let (port, _squid) = squid::on_loopback("crawlerpy").await;
    let api = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"])
        .args(["--max-leases-per-proxy", "1"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies = ground.proxies();
    let external = support::proxy(
        "squid",
        json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
    );
    proxies
        .create(&PostParams::default(), &external)
        .await
        .unwrap();
    eventually("the Squid Proxy Ready", Duration::from_secs(60), || async {
        let p = proxies.get("squid").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    let held = eventually("the only slot held", Duration::from_secs(30), || async {
        let body = br#"{"ttlSeconds": 8}"#.to_vec();
        let (s, v) = api_call(api, "POST", "/v1/leases", Some(TOKEN), body).await;
        (s == 201).then_some(v)
    })
    .await;
    assert_eq!(held["proxy"]["name"], "squid", "{held}");

    let mut crawler = crawler::command(
        api,
        TOKEN,
        &[
            "--url",
            &format!("http://{target}/"),
            "--pages",
            "10",
            "--interval",
            "0.5",
            "--ttl",
            "4",
            "--deadline",
            "60",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = crawler.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("crawler: {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Its first lease, released behind its back.
    let mut out = Vec::new();
    let first = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the crawler leases within 30 s");
        out.push(line.clone());
        if let Some(rest) = line.strip_prefix("leased ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let (s, _) = api_call(
        api,
        "DELETE",
        &format!("/v1/leases/{first}"),
        Some(TOKEN),
        vec![],
    )
    .await;
    assert_eq!(s, 204);

    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(s) = crawler.try_wait().unwrap() {
                return s;
            }
            if std::time::Instant::now() > deadline {
                let _ = crawler.kill();
                panic!("the crawler did not end within 90 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    reader.join().unwrap();
    out.extend(rx.try_iter());
    let has = |words: &str| out.iter().any(|l| l.contains(words));
    assert!(status.success(), "the crawler failed: {out:#?}");
    assert!(
        has("(409 no_capacity): waiting"),
        "it waited out the 409: {out:#?}"
    );
    assert!(has(&format!("lease {first} gone (404)")), "{out:#?}");
    assert!(has("renewed "), "a renewal passed: {out:#?}");
    let fetched = out
        .iter()
        .filter(|l| l.starts_with(&format!("fetched http://{target}/ status 200")))
        .count();
    assert_eq!(fetched, 10, "{out:#?}");
    assert!(has("done: 10 of 10 pages fetched"), "{out:#?}");
    // Released at the end: the slot is free at once.
    let (s, v) = api_call(
        api,
        "POST",
        "/v1/leases",
        Some(TOKEN),
        br#"{"ttlSeconds": 5}"#.to_vec(),
    )
    .await;
    assert_eq!(s, 201, "the crawler released its lease: {v}");
}
