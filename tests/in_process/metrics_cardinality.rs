//! `/metrics` does not grow with the fleet by default: the real health
//! engine probes N External Proxies through a real Squid and the operator's
//! registry is encoded once every Proxy has a verdict. By default no series
//! carries a `proxy` label and N=200 prints as many series as N=1; with
//! `--per-proxy-metrics` every proxy has its own. The size at N=1,000 is
//! printed (a figure for docs/performance.md, not asserted).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::health::HealthSource;
use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::health::{self, probe::tls_config, Defaults, Engine, Notifier};
use egress_proxies_operator::operator::Metrics;
use egress_proxies_operator::tenancy::{ExternalNamespaces, ProbeDenylist};
use support::squid;

/// Two namespaces, so the fleet-wide series have more than one label set.
const NAMESPACES: [&str; 2] = ["crawl-a", "crawl-b"];

fn external(i: usize, squid: u16) -> (String, String, Proxy) {
    let ns = NAMESPACES[i % NAMESPACES.len()];
    let name = format!("px-{i}");
    let p = serde_json::from_value(serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{i}")},
        "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": squid},
            "healthCheck": {"timeoutSeconds": 5}}
    }))
    .unwrap();
    (ns.to_string(), name, p)
}

/// The scrape of a registry after the engine gave every one of `n`
/// Proxies a verdict.
async fn exposition(n: usize, per_proxy: bool, squid: u16, target: SocketAddr) -> String {
    let metrics = Metrics::with_per_proxy(per_proxy);
    let defaults = Defaults {
        url: url::Url::parse(&format!("http://{target}/")).unwrap(),
        expected_status: 200,
        external: Arc::new(ExternalNamespaces::Any),
        deny: Arc::new(ProbeDenylist::parse(&support::deny_but_loopback()).unwrap()),
        credentials: Arc::default(),
        full_every: 1,
    };
    let engine = Arc::new(Engine::new(
        defaults,
        8,
        tls_config(None).unwrap(),
        false,
        metrics.health.clone(),
    ));
    let (store, mut fill) = egress_proxies_operator::proxy_store::ProxyStore::by_hand();
    let proxies: Vec<_> = (0..n).map(|i| external(i, squid)).collect();
    fill.list(proxies.iter().map(|(_, _, p)| p.clone()));
    let (notifier, mut rx) = Notifier::channel(health::NOTIFY_CAPACITY);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(engine.clone().run(store, notifier, async move {
        let _ = stop_rx.await;
    }));
    let started = Instant::now();
    support::eventually(
        &format!("{n} proxies with a verdict"),
        Duration::from_secs(120),
        || async {
            proxies
                .iter()
                .enumerate()
                .all(|(i, (ns, name, _))| {
                    engine.verdict(ns, name, &format!("uid-{i}")) == Some(true)
                })
                .then_some(())
        },
    )
    .await;
    println!(
        "N={n} per-proxy={per_proxy}: every proxy Ready-probed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let text = metrics.encode().unwrap();
    let _ = stop_tx.send(());
    task.await.unwrap();
    drain.abort();
    text
}

/// Sample lines (series) of `family` in `text`, and how many of them carry
/// a `proxy` label.
fn series(text: &str, family: &str) -> (usize, usize) {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(family))
        .collect();
    let with_proxy = lines.iter().filter(|l| l.contains("proxy=\"")).count();
    (lines.len(), with_proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_do_not_grow_per_proxy_unless_asked() {
    squid::require();
    let port = support::free_port();
    let _squid = squid::start(
        Ipv4Addr::LOCALHOST,
        port,
        "cardinality",
        "http_access allow me",
    )
    .await;
    let target = support::http_target().await;

    let one = exposition(1, false, port, target).await;
    let many = exposition(200, false, port, target).await;
    let (all_one, proxy_one) = series(&one, "proxy_operator_");
    let (all_many, proxy_many) = series(&many, "proxy_operator_");
    assert_eq!(proxy_one, 0, "{one}");
    assert_eq!(proxy_many, 0, "no per-proxy series by default: {many}");
    // One proxy sits in one namespace, 200 in both: one more label set of
    // the fleet-wide histogram (its buckets, sum and count) and nothing else.
    let (hist_one, _) = series(&one, "proxy_operator_healthcheck_duration_seconds");
    let (hist_many, _) = series(&many, "proxy_operator_healthcheck_duration_seconds");
    assert_eq!(hist_many, 2 * hist_one, "{many}");
    assert_eq!(all_many - all_one, hist_many - hist_one, "{many}");
    assert!(
        many.contains("proxy_operator_healthcheck_duration_seconds_count{provider=\"\",proxy_namespace=\"crawl-b\"}"),
        "{many}"
    );
    let count = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("proxy_operator_healthcheck_duration_seconds_count{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(count(&many) >= 200.0, "every probe counted: {many}");

    let opted = exposition(200, true, port, target).await;
    let per_proxy = |text: &str| {
        series(
            text,
            "proxy_operator_proxy_healthcheck_duration_seconds_count",
        )
        .1
    };
    assert_eq!(per_proxy(&opted), 200, "one histogram per proxy when asked");

    let mut figures = Vec::new();
    for per_proxy in [false, true] {
        let text = exposition(1000, per_proxy, port, target).await;
        let (n, with_proxy) = series(&text, "proxy_operator_");
        figures.push(format!(
            "N=1000 --per-proxy-metrics={per_proxy}: /metrics {} bytes, {n} series, {with_proxy} with a proxy label",
            text.len()
        ));
    }
    for f in figures {
        println!("{f}");
    }
}
