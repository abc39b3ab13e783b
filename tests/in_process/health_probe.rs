//! Probes through a real Squid on 127.0.0.1 (a missing /usr/sbin/squid
//! fails the tests with the reason): an http target by forward request, an
//! https target through CONNECT + TLS with a test CA, and the ways a probe
//! must fail.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;
use support::squid::{self, Squid};

use egress_proxies_operator::health::probe::{probe, tls_config, ProbeTarget};
use tokio::net::TcpListener;
use url::Url;

async fn start_squid(tag: &str, access: &str) -> Squid {
    squid::start(Ipv4Addr::LOCALHOST, support::free_port(), tag, access).await
}

fn target(port: u16, url: &str, expected: u16) -> ProbeTarget {
    ProbeTarget {
        proxy_host: "127.0.0.1".into(),
        proxy_port: port,
        deny: None,
        url: Url::parse(url).unwrap(),
        expected_status: expected,
        timeout: Duration::from_secs(3),
        credentials: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_pass_through_squid_to_http_and_https_targets() {
    squid::require();
    let squid = start_squid("ok", "http_access allow me").await;
    let (http, seen) = support::recording_target(Ipv4Addr::LOCALHOST.into(), 204, "").await;
    let (https, ca_pem) = support::tls_target_on(Ipv4Addr::LOCALHOST.into()).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let tls = tls_config(Some(&ca)).unwrap();
    let plain_tls = tls_config(None).unwrap();

    // (what, url, expected, tls config, failure reason)
    let http_url = format!("http://{http}/generate_204?x=1");
    let https_url = format!("https://{https}/generate_204");
    let cases = [
        ("http through squid", http_url.clone(), 204, &tls, None),
        (
            "http wrong status",
            http_url.clone(),
            200,
            &tls,
            Some("status"),
        ),
        (
            "https through CONNECT with the test CA",
            https_url.clone(),
            204,
            &tls,
            None,
        ),
        (
            "https wrong status",
            https_url.clone(),
            200,
            &tls,
            Some("status"),
        ),
        (
            "https without the test CA",
            https_url.clone(),
            204,
            &plain_tls,
            Some("tls"),
        ),
    ];
    for (what, url, expected, cfg, failure) in cases {
        let r = probe(&target(squid.port, &url, expected), cfg).await;
        assert_eq!(r.ok, failure.is_none(), "{what}: {r:?}");
        assert_eq!(
            r.error.as_ref().map(|e| e.reason()),
            failure,
            "{what}: {r:?}"
        );
        println!("{what}: {:?}", r.latency);
    }
    let heads = seen.lock().unwrap().clone();
    assert!(!heads.is_empty());
    for h in &heads {
        let lower = h.to_ascii_lowercase();
        assert!(lower.starts_with("get /generate_204?x=1 http/1.1"), "{h}");
        assert!(
            !lower.contains("traceparent")
                && !lower.contains("tracestate")
                && !lower.contains("baggage"),
            "{h}"
        );
    }
    drop(squid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squid_that_denies_everything_is_unhealthy() {
    squid::require();
    let squid = start_squid("deny", "").await;
    let (http, _) = support::recording_target(Ipv4Addr::LOCALHOST.into(), 204, "").await;
    let (https, ca_pem) = support::tls_target_on(Ipv4Addr::LOCALHOST.into()).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let tls = tls_config(Some(&ca)).unwrap();
    let r = probe(&target(squid.port, &format!("http://{http}/"), 204), &tls).await;
    assert!(!r.ok, "{r:?}");
    let e = r.error.as_ref().unwrap();
    assert!(e.to_string().contains("403"), "{r:?}");
    assert_eq!(e.reason(), "status", "{r:?}");
    let r = probe(&target(squid.port, &format!("https://{https}/"), 204), &tls).await;
    assert!(!r.ok, "{r:?}");
    let e = r.error.as_ref().unwrap();
    assert!(
        e.to_string().contains("refused CONNECT with status 403"),
        "{r:?}"
    );
    assert_eq!(e.reason(), "proxy_refused", "{r:?}");
}

/// The kubernetes provider's destination rules, in a real Squid: by default
/// a tenant's crawl cannot reach loopback (nor link-local, where the cloud
/// metadata server is) through the proxy; `allow` lets a named address
/// through again, but even `allow: [0.0.0.0/0]` leaves "this network"
/// (0.0.0.0, the same host) refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_destination_rules_refuse_loopback_unless_allowed() {
    use egress_proxies_operator::config::Destinations;
    use egress_proxies_operator::provider::kubernetes::destination_access;
    squid::require();
    let (http, seen) = support::recording_target(Ipv4Addr::LOCALHOST.into(), 204, "").await;
    let tls = tls_config(None).unwrap();
    let url = format!("http://{http}/");

    let default = Destinations::default().rules().unwrap();
    let squid = start_squid(
        "dstdeny",
        &format!("{}http_access allow me", destination_access(&default)),
    )
    .await;
    let r = probe(&target(squid.port, &url, 204), &tls).await;
    assert!(!r.ok, "{r:?}");
    assert!(
        r.error.as_ref().unwrap().to_string().contains("403"),
        "{r:?}"
    );
    assert!(seen.lock().unwrap().is_empty(), "the target was reached");
    drop(squid);

    let allowing = Destinations {
        allow: vec!["127.0.0.1".into()],
        ..Destinations::default()
    }
    .rules()
    .unwrap();
    let squid = start_squid(
        "dstallow",
        &format!("{}http_access allow me", destination_access(&allowing)),
    )
    .await;
    let r = probe(&target(squid.port, &url, 204), &tls).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    drop(squid);

    // An allow as wide as the whole address space opens loopback, but not
    // "this network": 0.0.0.0 lands on the same listener, and is refused.
    let everything = Destinations {
        allow: vec!["0.0.0.0/0".into()],
        ..Destinations::default()
    }
    .rules()
    .unwrap();
    let squid = start_squid(
        "dstnever",
        &format!("{}http_access allow me", destination_access(&everything)),
    )
    .await;
    let r = probe(&target(squid.port, &url, 204), &tls).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(seen.lock().unwrap().len(), 2);
    let unspecified = format!("http://0.0.0.0:{}/", http.port());
    let r = probe(&target(squid.port, &unspecified, 204), &tls).await;
    assert!(!r.ok, "{r:?}");
    assert!(
        r.error.as_ref().unwrap().to_string().contains("403"),
        "{r:?}"
    );
    assert_eq!(seen.lock().unwrap().len(), 2, "the target was reached");
}

#[tokio::test]
async fn a_listener_that_never_proxies_or_nothing_listening_is_unhealthy() {
    // Accepts and holds connections without a byte in return.
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = sink.accept().await {
            held.push(c);
        }
    });
    let tls = tls_config(None).unwrap();
    let mut t = target(port, "http://127.0.0.1:9/", 204);
    t.timeout = Duration::from_millis(500);
    let r = probe(&t, &tls).await;
    assert!(!r.ok);
    let e = r.error.as_ref().unwrap();
    assert!(e.to_string().contains("timed out"), "{r:?}");
    assert_eq!(e.reason(), "timeout", "{r:?}");
    println!(
        "a proxy that never answers: timeout after {:?} (limit 500 ms)",
        r.latency
    );
    let mut t = target(port, "https://127.0.0.1:9/", 204);
    t.timeout = Duration::from_millis(500);
    assert!(!probe(&t, &tls).await.ok);
    // Nothing listening at all.
    let r = probe(
        &target(support::free_port(), "http://127.0.0.1:9/", 204),
        &tls,
    )
    .await;
    let e = r.error.as_ref().unwrap();
    assert!(e.to_string().contains("connecting to the proxy"), "{r:?}");
    assert_eq!(e.reason(), "refused", "{r:?}");
}

/// An External endpoint in `--probe-deny-cidrs` is never dialled, whether
/// something listens there or not, and the two answers read the same: the
/// probe is no port-scan oracle. The same real Squid is probed as usual
/// once the list no longer covers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_endpoint_is_never_dialled_and_says_nothing_of_the_port() {
    use egress_proxies_operator::tenancy::ProbeDenylist;
    squid::require();
    let squid = start_squid("denylist", "http_access allow me").await;
    let (http, seen) = support::recording_target(Ipv4Addr::LOCALHOST.into(), 204, "").await;
    let tls = tls_config(None).unwrap();
    let url = format!("http://{http}/");
    // Something listening that counts what reaches it.
    let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    open.set_nonblocking(true).unwrap();
    let open_port = open.local_addr().unwrap().port();
    let deny = Arc::new(ProbeDenylist::parse("169.254.0.0/16,127.0.0.0/8").unwrap());
    let mut messages = Vec::new();
    for port in [open_port, support::free_port(), squid.port] {
        let t = ProbeTarget {
            deny: Some(deny.clone()),
            ..target(port, &url, 204)
        };
        let r = probe(&t, &tls).await;
        assert!(!r.ok, "{r:?}");
        let e = r.error.unwrap();
        assert_eq!(e.reason(), "denied", "{e}");
        messages.push(e.to_string());
    }
    assert!(
        messages.windows(2).all(|w| w[0] == w[1]),
        "an open, a closed and a proxying port read the same: {messages:?}"
    );
    assert!(messages[0].contains("--probe-deny-cidrs"), "{messages:?}");
    assert_eq!(
        open.accept().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "the denied endpoint was dialled"
    );
    assert!(seen.lock().unwrap().is_empty(), "the target was reached");
    // A name that resolves into the list is refused too.
    let t = ProbeTarget {
        proxy_host: "localhost".into(),
        deny: Some(deny),
        ..target(squid.port, &url, 204)
    };
    assert_eq!(
        probe(&t, &tls).await.error.map(|e| e.reason()),
        Some("denied")
    );
    // By default the cluster's private ranges are denied too: an endpoint
    // on a Service address is refused before any packet is sent.
    let t = ProbeTarget {
        proxy_host: "10.96.0.1".into(),
        deny: Some(Arc::new(ProbeDenylist::default_list())),
        ..target(squid.port, &url, 204)
    };
    assert_eq!(
        probe(&t, &tls).await.error.map(|e| e.reason()),
        Some("denied")
    );
    // Outside the list (the default less loopback) the same Squid is
    // probed as usual.
    let t = ProbeTarget {
        deny: Some(Arc::new(
            ProbeDenylist::parse(&support::deny_but_loopback()).unwrap(),
        )),
        ..target(squid.port, &url, 204)
    };
    let r = probe(&t, &tls).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// The light probe of an https URL (`Depth::Connect`) asks the real Squid
/// only for the CONNECT: it passes where the full fetch fails on the
/// target's certificate, fails where Squid cannot reach the target, and a
/// proxy whose host is a name is reached through the caching resolver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_probe_checks_the_connect_and_a_full_one_the_fetch() {
    use egress_proxies_operator::health::probe::{probe_with, Depth, Resolver, Wire};
    squid::require();
    let squid = start_squid("light", "http_access allow me").await;
    let (https, _ca) = support::tls_target_on(Ipv4Addr::LOCALHOST.into()).await;
    // The webpki roots only: the test CA is not trusted.
    let tls = tls_config(None).unwrap();
    let dns = Resolver::caching(Duration::from_secs(30));
    let mut t = target(squid.port, &format!("https://{https}/generate_204"), 204);
    t.proxy_host = "localhost".into();
    let wire = Wire::of(&t);
    let light = probe_with(&t, &wire, Depth::Connect, &tls, &dns).await;
    assert!(light.ok, "the CONNECT is accepted: {light:?}");
    let full = probe_with(&t, &wire, Depth::Full, &tls, &dns).await;
    assert_eq!(
        full.error.as_ref().map(|e| e.reason()),
        Some("tls"),
        "{full:?}"
    );
    println!(
        "light probe {:?}, full probe {:?}",
        light.latency, full.latency
    );
    // Nothing listens at the target: Squid refuses the CONNECT.
    let gone = target(
        squid.port,
        &format!("https://127.0.0.1:{}/", support::free_port()),
        204,
    );
    let r = probe_with(&gone, &Wire::of(&gone), Depth::Connect, &tls, &dns).await;
    assert_eq!(
        r.error.as_ref().map(|e| e.reason()),
        Some("proxy_refused"),
        "{r:?}"
    );
    drop(squid);
}

/// A "proxy" that answers the CONNECT and at once sends bytes of its own:
/// the tunnel is not clean, the probe says so (no real proxy does this on
/// demand).
#[tokio::test]
async fn bytes_past_the_connect_answer_fail_the_probe() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf).await;
            let _ = c
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\nSURPRISE")
                .await;
        }
    });
    let tls = tls_config(None).unwrap();
    let r = probe(&target(port, "https://example.com/", 204), &tls).await;
    assert_eq!(
        r.error.as_ref().map(|e| e.reason()),
        Some("protocol"),
        "{r:?}"
    );
}
