use super::*;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, WatchParams};

#[test]
fn streams_table() {
    struct Case {
        name: &'static str,
        uri: &'static str,
        stream: bool,
    }
    let cases = [
        Case {
            name: "a get",
            uri: "/api/v1/namespaces/a/configmaps/b",
            stream: false,
        },
        Case {
            name: "a list",
            uri: "/api/v1/configmaps?limit=500&labelSelector=watch%3Dtrue",
            stream: false,
        },
        Case {
            name: "a watch",
            uri: "/api/v1/configmaps?watch=true&timeoutSeconds=290&allowWatchBookmarks=true",
            stream: true,
        },
        Case {
            name: "a watch spelled 1",
            uri: "/apis/crawl.example.com/v1alpha1/proxies?resourceVersion=5&watch=1",
            stream: true,
        },
        Case {
            name: "a followed log",
            uri: "/api/v1/namespaces/a/pods/b/log?follow=true",
            stream: true,
        },
        Case {
            name: "watch=false",
            uri: "/api/v1/configmaps?watch=false",
            stream: false,
        },
    ];
    for c in cases {
        let uri: Uri = c.uri.parse().unwrap();
        assert_eq!(is_stream(&uri), c.stream, "{}", c.name);
    }
}

/// An API server that accepts connections and never answers, like one
/// stopped with SIGSTOP (the kernel still completes the handshake).
async fn frozen_server() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    (l, url)
}

fn client(url: &str, request: Duration) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::new(url.parse().unwrap());
    build_with(config, Duration::from_secs(1), request).unwrap()
}

#[tokio::test]
async fn a_request_to_a_frozen_api_server_fails_within_its_deadline() {
    let (_server, url) = frozen_server().await;
    let api: Api<ConfigMap> = Api::namespaced(client(&url, Duration::from_millis(300)), "a");
    // Without the deadline the get waits forever; the outer bound only
    // turns that into a failure report.
    let res = tokio::time::timeout(Duration::from_secs(20), api.get("b"))
        .await
        .expect("the get ends by itself");
    let err = res.expect_err("nothing answered");
    let text = crate::provider::error::plain_message(&err);
    assert!(
        text.contains("did not answer within 0.3 s"),
        "says why: {text}"
    );
}

#[tokio::test]
async fn a_watch_is_not_cut_by_the_request_deadline() {
    let (_server, url) = frozen_server().await;
    let api: Api<ConfigMap> = Api::namespaced(client(&url, Duration::from_millis(100)), "a");
    let params = WatchParams::default();
    let watch = api.watch(&params, "0");
    // A quiet watch stays open far beyond the request deadline.
    let res = tokio::time::timeout(Duration::from_secs(1), watch).await;
    assert!(res.is_err(), "the watch must still be waiting");
}
