//! The lease key falls back to one of this process only when the shared
//! Secret cannot be had at all, and then says so everywhere an operator
//! looks (issue 31): the log, `/metrics` and `/readyz`. A replica that can
//! have the Secret signs with it and says nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::Duration;

use crate::support::{self, eventually};

const TOKEN: &str = "fallback-token";

/// `/readyz`'s status and body, once the probe server listens.
async fn readyz(addr: std::net::SocketAddr) -> Option<(u16, String)> {
    support::raw_call(addr, None, ("GET", "/readyz"), None, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_this_process_only_is_visible_in_the_log_metrics_and_readyz() {
    let ground = support::ground_without_pods("keyfallback").await;
    let dir = tempfile::tempdir().unwrap();
    let providers = "providers:\n  - name: kubernetes\n    type: kubernetes\n";
    let start = |name: &str, operator_namespace: Option<&str>| {
        let (probes, metrics) = (support::loopback(), support::loopback());
        let mut cmd = ground.discovery_operator(dir.path(), providers, support::loopback(), TOKEN);
        cmd.args(["--health-probe-bind-address", &probes.to_string()])
            .args(["--metrics-bind-address", &metrics.to_string()]);
        if let Some(ns) = operator_namespace {
            // No such namespace: the Secret cannot be read or created (404).
            cmd.args(["--operator-namespace", ns]);
        }
        let log = dir.path().join(format!("{name}.log"));
        (support::Operator::spawn(cmd, &log), probes, metrics, log)
    };
    let absent = format!("{}-absent", ground.ns);
    let (_own, probes, metrics, log) = start("own", Some(&absent));
    let (_shared, shared_probes, shared_metrics, shared_log) = start("shared", None);

    let (s, body) = eventually("/readyz", Duration::from_secs(60), || async {
        readyz(probes).await.filter(|(s, _)| *s == 200)
    })
    .await;
    println!("/readyz: {s} {body}");
    assert!(body.starts_with("ok; "), "{body}");
    assert!(body.contains("key of this process only"), "{body}");
    let scraped = support::scrape(&metrics.to_string()).await.unwrap();
    assert_eq!(
        support::sample(&scraped, "proxy_operator_lease_key_shared"),
        Some(0.0),
        "{scraped}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("Signing lease ids with a key of this process only"),
        "{text}"
    );
    assert!(
        text.contains("not found") || text.contains("NotFound"),
        "the API server's words: {text}"
    );

    // The replica that has the Secret: a plain "ok", and 1.
    let (_, body) = eventually("/readyz", Duration::from_secs(60), || async {
        readyz(shared_probes).await.filter(|(s, _)| *s == 200)
    })
    .await;
    assert_eq!(body, "ok");
    let scraped = support::scrape(&shared_metrics.to_string()).await.unwrap();
    assert_eq!(
        support::sample(&scraped, "proxy_operator_lease_key_shared"),
        Some(1.0)
    );
    let text = std::fs::read_to_string(&shared_log).unwrap();
    assert!(!text.contains("key of this process only"), "{text}");
}
