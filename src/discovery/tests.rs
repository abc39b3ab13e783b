//! The API end to end on loopback, with a fixed Proxy list.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};

use super::*;
use crate::api::Proxy;
use crate::lease::{ClientLimits, LeaseConfig, LeaseKey, LeaseStore};

/// The key the replicas of a test share.
fn shared_key() -> LeaseKey {
    LeaseKey::from_bytes(&[9; crate::lease::signed::KEY_LEN]).unwrap()
}
use crate::metrics::{Exposition, Registrar};

fn proxy(name: &str, zone: &str, healthy: &str, attrs: Value) -> Arc<Proxy> {
    Arc::new(
        serde_json::from_value(json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns", "labels": {"zone-label": zone}},
            "spec": {"provider": "kubernetes", "port": 3128, "placement": {"zone": zone}, "attributes": attrs},
            "status": {"phase": if healthy == "True" { "Ready" } else { "Running" }, "ip": "127.0.0.5",
                "conditions": [{"type": "Healthy", "status": healthy, "reason": "R", "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}))
        .unwrap(),
    )
}

struct Api {
    addr: std::net::SocketAddr,
    /// What the server serves (shared with it).
    state: ApiState,
    leases: Arc<LeaseStore>,
    replicas: Arc<super::replicas::Replicas>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    metrics: Exposition,
    /// The `Retry-After` of the last answer, if it had one.
    retry_after: std::sync::Mutex<Option<String>>,
}

impl Api {
    async fn start(token: Option<&str>, max: u32) -> Api {
        let tokens: Vec<(&str, &str)> = token.map(|t| ("default", t)).into_iter().collect();
        Api::start_clients(&tokens, max, ClientLimits::default()).await
    }

    async fn start_clients(tokens: &[(&str, &str)], max: u32, limits: ClientLimits) -> Api {
        Api::start_within(tokens, max, limits, crate::server::DISCOVERY_LIMITS).await
    }

    async fn start_within(
        tokens: &[(&str, &str)],
        max: u32,
        limits: ClientLimits,
        server: crate::server::Limits,
    ) -> Api {
        Api::start_full(tokens, max, limits, server, Forwarder::alone()).await
    }

    /// With token `t0k`, `max` leases per proxy, lease calls routed by
    /// `leader`.
    async fn start_routed(max: u32, leader: Leader, timeout: Duration) -> Api {
        Api::start_keyed(max, (leader, timeout), (shared_key(), None)).await
    }

    /// [`Api::start_routed`] signing with `own`, taking gateway calls
    /// signed with `gateway`.
    async fn start_keyed(
        max: u32,
        (leader, timeout): (Leader, Duration),
        (own, gateway): (LeaseKey, Option<LeaseKey>),
    ) -> Api {
        let forwarder = Forwarder::new(
            Arc::new(move || leader.clone()),
            timeout,
            Duration::from_secs(3),
        )
        .with_key(own)
        .with_gateway_key(gateway);
        let limits = (ClientLimits::default(), crate::server::DISCOVERY_LIMITS);
        Api::start_full(&[("default", "t0k")], max, limits.0, limits.1, forwarder).await
    }

    async fn start_full(
        tokens: &[(&str, &str)],
        max: u32,
        limits: ClientLimits,
        server: crate::server::Limits,
        forwarder: Forwarder,
    ) -> Api {
        Api::start_replacing(tokens, max, (limits, server), forwarder, (None, None)).await
    }

    /// [`Api::start_full`] with `replacer` behind `POST .../replace`, and
    /// the bench routes switching `bench`.
    async fn start_replacing(
        tokens: &[(&str, &str)],
        max: u32,
        (limits, server): (ClientLimits, crate::server::Limits),
        forwarder: Forwarder,
        (replacer, bench): (Option<Arc<dyn Replacer>>, Option<crate::health::Pause>),
    ) -> Api {
        let source: Vec<Arc<Proxy>> = vec![
            proxy("a", "z1", "True", json!({"geo": "home"})),
            in_pool(proxy("b", "z2", "True", json!({"geo": "away"})), "eu"),
            proxy("sick", "z1", "False", json!({"geo": "home"})),
        ];
        let leases = Arc::new(
            LeaseStore::new(LeaseConfig {
                max_leases_per_proxy: max,
                default_ttl: Duration::from_secs(300),
                max_ttl: Duration::from_secs(3600),
                cooldown: Duration::from_secs(300),
            })
            .with_client_limits(limits),
        );
        let mut registry = Registrar::new();
        let discovery = metrics::DiscoveryMetrics::register(&mut registry);
        let metrics = registry.finish();
        let tokens: Vec<(String, String)> = tokens
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        static REPLICAS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = REPLICAS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let replicas = Arc::new(super::replicas::Replicas::new(
            leases.clone(),
            &format!("replica-{n}"),
        ));
        let mut state =
            ApiState::with_clients(Arc::new(source), leases.clone(), &tokens, &discovery)
                .with_forwarder(forwarder)
                .with_replicas(replicas.clone())
                .with_bench_routes(bench)
                .with_hints(crate::health::Hints::default());
        if let Some(r) = replacer {
            state = state.with_replacer(r);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_within(listener, state.clone(), server, async move {
            let _ = rx.await;
        }));
        Api {
            addr,
            state,
            leases,
            replicas,
            stop: Some(tx),
            task: Some(task),
            metrics,
            retry_after: std::sync::Mutex::default(),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (u16, Value) {
        self.call_with(method, path, token, &[], body).await
    }

    async fn call_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> (u16, Value) {
        let stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "test");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        *self.retry_after.lock().unwrap() = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, v)
    }

    fn last_retry_after(&self) -> String {
        self.retry_after
            .lock()
            .unwrap()
            .clone()
            .expect("the last answer had a Retry-After")
    }

    async fn json(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        self.call(
            method,
            path,
            Some("t0k"),
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

/// The names of a listing's items, in order.
fn names(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn auth_matrix() {
    let api = Api::start(Some("t0k"), 1).await;
    let cases: [(&str, &str, Option<&str>, u16); 7] = [
        ("GET", "/healthz", None, 200),
        ("GET", "/openapi.json", None, 200),
        ("GET", "/v1/proxies", None, 401),
        ("GET", "/v1/proxies", Some("wrong"), 401),
        ("GET", "/v1/proxies", Some(""), 401),
        ("GET", "/v1/proxies", Some("t0k"), 200),
        ("DELETE", "/v1/leases/x", None, 401),
    ];
    for (m, p, t, want) in cases {
        let (status, body) = api.call(m, p, t, None).await;
        assert_eq!(status, want, "{m} {p} {t:?}");
        if want == 401 {
            assert_eq!(code(&body), "unauthorized");
        }
    }
    api.stop().await;
    // Without a token the API is open.
    let open = Api::start(None, 1).await;
    assert_eq!(open.call("GET", "/v1/proxies", None, None).await.0, 200);
    open.stop().await;
}

#[tokio::test]
async fn listing_and_filters() {
    let api = Api::start(Some("t0k"), 1).await;
    let cases: [(&str, u16, &[&str]); 6] = [
        ("/v1/proxies", 200, &["a", "b"]),
        ("/v1/proxies?zone=z1", 200, &["a"]),
        ("/v1/proxies?attr=geo:away", 200, &["b"]),
        ("/v1/proxies?provider=kubernetes&attr=geo=home", 200, &["a"]),
        ("/v1/proxies?provider=gcp", 200, &[]),
        ("/v1/proxies?bogus=1", 400, &[]),
    ];
    for (path, want_status, want) in cases {
        let (status, body) = api.call("GET", path, Some("t0k"), None).await;
        assert_eq!(status, want_status, "{path}");
        if status == 200 {
            assert_eq!(names(&body), want.to_vec(), "{path}");
        } else {
            assert_eq!(code(&body), "invalid_query");
        }
    }
    let (_, body) = api
        .call("GET", "/v1/proxies?zone=z1", Some("t0k"), None)
        .await;
    let item = &body["items"][0];
    assert_eq!(item["ip"], "127.0.0.5");
    assert_eq!(item["port"], 3128);
    assert_eq!(item["url"], "http://127.0.0.5:3128");
    assert_eq!(item["zone"], "z1");
    assert_eq!(item["attributes"]["geo"], "home");
    api.stop().await;
}

#[tokio::test]
async fn bad_requests_are_json_errors() {
    let api = Api::start(Some("t0k"), 1).await;
    let big = vec![b' '; BODY_LIMIT + 1];
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        ("POST", "/v1/leases", b"{".to_vec(), 400, "malformed_json"),
        // Whitespace alone is not JSON (only a body of no bytes is none).
        (
            "POST",
            "/v1/leases/x/renew",
            b"\n".to_vec(),
            400,
            "malformed_json",
        ),
        ("POST", "/v1/leases", b"[1,2]".to_vec(), 422, "invalid_body"),
        (
            "POST",
            "/v1/leases",
            br#"{"filters":[null,null]}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/leases/x/report",
            b"null".to_vec(),
            422,
            "invalid_body",
        ),
        (
            "GET",
            "/v1/proxies?attr=",
            b"".to_vec(),
            400,
            "invalid_query",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttl":5}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":"5"}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":-1}"#.to_vec(),
            400,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":0}"#.to_vec(),
            400,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":3601}"#.to_vec(),
            400,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":1e300}"#.to_vec(),
            400,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":-1e300}"#.to_vec(),
            400,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":99999999999999999999}"#.to_vec(),
            400,
            "invalid_ttl",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"ttlSeconds":60.5}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"filters":{"color":"red"}}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/leases",
            br#"{"stickyKey":""}"#.to_vec(),
            422,
            "invalid_body",
        ),
        ("POST", "/v1/leases", big, 413, "payload_too_large"),
        (
            "POST",
            "/v1/leases/nope/report",
            br#"{"result":"ok"}"#.to_vec(),
            404,
            "unknown_lease",
        ),
        (
            "POST",
            "/v1/leases/nope/report",
            br#"{}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            "POST",
            "/v1/leases/nope/report",
            b"".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "POST",
            "/v1/leases/nope/renew",
            b"".to_vec(),
            404,
            "unknown_lease",
        ),
        ("GET", "/v1/leases/nope", b"".to_vec(), 404, "unknown_lease"),
        ("GET", "/v2/nothing", b"".to_vec(), 404, "not_found"),
        ("PUT", "/v1/leases", b"".to_vec(), 405, "method_not_allowed"),
    ];
    for (m, p, body, want, want_code) in cases {
        let (status, v) = api.call(m, p, Some("t0k"), Some(body)).await;
        assert_eq!((status, code(&v)), (want, want_code), "{m} {p}: {v}");
        assert!(
            !v["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{v}"
        );
    }
    // An optional body may be JSON null.
    let (status, v) = api
        .call("POST", "/v1/leases", Some("t0k"), Some(b"null".to_vec()))
        .await;
    assert_eq!(status, 201, "{v}");
    // A float with no fraction is a whole number of seconds.
    let (status, v) = api
        .call(
            "POST",
            "/v1/leases",
            Some("t0k"),
            Some(br#"{"ttlSeconds":60.0}"#.to_vec()),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    api.stop().await;
}

#[tokio::test]
async fn a_request_over_its_time_is_a_json_408_logged_and_counted() {
    let api = Api::start_within(
        &[("default", "t0k")],
        1,
        ClientLimits::default(),
        crate::server::Limits {
            request_timeout: Some(Duration::from_millis(300)),
            ..crate::server::DISCOVERY_LIMITS
        },
    )
    .await;
    // A body announced but never finished: the handler waits on it (the
    // body-read timeout is 10s) until the whole-request timeout answers.
    let mut c = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(
        b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0k\r\nContent-Length: 100\r\n\r\n{\"fil",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let answer = loop {
        let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
            .await
            .expect("an answer before the deadline")
            .unwrap();
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if n == 0 || text.ends_with('}') {
            break text;
        }
    };
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(code(&v), "request_timeout", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("0.3s"),
        "the message names the limit: {v}"
    );
    let text = api.metrics.encode().unwrap();
    assert!(
        text.contains("route=\"POST /v1/leases\",status=\"408\""),
        "the 408 is counted:\n{text}"
    );
    api.stop().await;
}

#[tokio::test]
async fn lease_lifecycle_capacity_cooldown() {
    let api = Api::start(Some("t0k"), 1).await;
    // Empty body: defaults.
    let (s, a) = api.call("POST", "/v1/leases", Some("t0k"), None).await;
    assert_eq!(s, 201, "{a}");
    assert_eq!(a["proxy"]["name"], "a");
    assert_eq!(a["ttlSeconds"].as_u64().unwrap() / 10, 30);
    assert!(a["expiresAt"].as_str().unwrap().ends_with('Z'));
    let id_a = a["id"].as_str().unwrap().to_string();
    let (s, b) = api
        .json("POST", "/v1/leases", json!({"ttlSeconds": 60}))
        .await;
    assert_eq!((s, b["proxy"]["name"].as_str()), (201, Some("b")));
    let id_b = b["id"].as_str().unwrap().to_string();
    let (s, full) = api.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s, code(&full)), (409, "no_capacity"));
    // Until the first lease on a matching proxy ends: b's, in 60 s.
    let wait: u64 = api.last_retry_after().parse().unwrap();
    assert!((59..=60).contains(&wait), "Retry-After {wait}");
    let (s, none) = api
        .json("POST", "/v1/leases", json!({"filters": {"zone": "z9"}}))
        .await;
    assert_eq!((s, code(&none)), (409, "no_proxy"));
    assert_eq!(api.last_retry_after(), "5", "no proxy: the default wait");
    // Renew, read.
    let (s, r) = api
        .json(
            "POST",
            &format!("/v1/leases/{id_b}/renew"),
            json!({"ttlSeconds": 600}),
        )
        .await;
    assert_eq!((s, r["ttlSeconds"].as_u64().unwrap() / 10), (200, 60));
    assert_eq!(
        api.call("GET", &format!("/v1/leases/{id_b}"), Some("t0k"), None)
            .await
            .0,
        200
    );
    // Report blocked for a site: kept; released a then site-scoped cooldown.
    let (s, _) = api
        .json(
            "POST",
            &format!("/v1/leases/{id_a}/report"),
            json!({"result": "blocked", "site": "x.com"}),
        )
        .await;
    assert_eq!(s, 204);
    let (s, bad) = api
        .json(
            "POST",
            &format!("/v1/leases/{id_a}/report"),
            json!({"result": "meh"}),
        )
        .await;
    assert_eq!((s, code(&bad)), (400, "invalid_result"));
    // Released once; again, it is an id of no live lease.
    for want in [204, 404] {
        assert_eq!(
            api.call("DELETE", &format!("/v1/leases/{id_a}"), Some("t0k"), None)
                .await
                .0,
            want
        );
    }
    let (s, v) = api
        .json(
            "POST",
            "/v1/leases",
            json!({"site": "x.com", "filters": {"attributes": {"geo": "home"}}}),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "no_capacity"), "{v}");
    let (s, v) = api
        .json(
            "POST",
            "/v1/leases",
            json!({"site": "y.com", "stickyKey": "c1"}),
        )
        .await;
    assert_eq!((s, v["proxy"]["name"].as_str()), (201, Some("a")));
    let text = api.metrics.encode().unwrap();
    assert!(text.contains("proxy_operator_leases_active 2"), "{text}");
    assert!(
        text.contains("proxy_operator_lease_events_total{event=\"granted\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("route=\"POST /v1/leases/{id}/report\""),
        "{text}"
    );
    api.stop().await;
}

/// The committed `docs/openapi.json` is what the operator serves with the
/// default flags, so crawler developers can generate clients from it.
#[test]
fn the_committed_openapi_document_is_the_served_one() {
    let committed = include_str!("../../docs/openapi.json");
    assert!(
        committed.trim_end() == super::served_openapi_json(),
        "docs/openapi.json is stale: run 'make openapi' and commit"
    );
}

#[test]
fn openapi_document_names_every_route() {
    let doc: Value = serde_json::from_str(&openapi_json(Duration::from_secs(3600))).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for p in [
        "/v1/proxies",
        "/v1/leases",
        "/v1/leases/{id}",
        "/v1/leases/{id}/renew",
        "/v1/leases/{id}/report",
        "/healthz",
    ] {
        assert!(doc["paths"].get(p).is_some(), "{p}");
    }
    assert!(doc["components"]["schemas"].get("LeaseResponse").is_some());
    // The label selector's syntax, as the parser holds it, on both filters.
    let pattern = super::selector::PATTERN;
    assert_eq!(
        doc["components"]["schemas"]["Filters"]["properties"]["labelSelector"]["pattern"],
        pattern
    );
    let param = doc["paths"]["/v1/proxies"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "labelSelector")
        .unwrap();
    assert_eq!(param["schema"]["pattern"], pattern);
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

#[test]
fn remote_parent_from_traceparent() {
    use opentelemetry::trace::{TraceContextExt, TraceFlags};
    struct Case {
        name: &'static str,
        traceparent: Option<&'static str>,
        /// Trace id, parent span id, sampled.
        want: Option<(&'static str, &'static str, bool)>,
    }
    let cases = [
        Case {
            name: "sampled",
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            want: Some(("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", true)),
        },
        Case {
            name: "not sampled",
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
            want: Some((
                "0af7651916cd43dd8448eb211c80319c",
                "b7ad6b7169203331",
                false,
            )),
        },
        Case {
            name: "zero trace id",
            traceparent: Some("00-00000000000000000000000000000000-b7ad6b7169203331-01"),
            want: None,
        },
        Case {
            name: "zero span id",
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"),
            want: None,
        },
        Case {
            name: "version ff",
            traceparent: Some("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            want: None,
        },
        Case {
            name: "version 00 with a fifth field",
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x"),
            want: None,
        },
        Case {
            name: "garbage",
            traceparent: Some("garbage"),
            want: None,
        },
        Case {
            name: "no header",
            traceparent: None,
            want: None,
        },
    ];
    for c in cases {
        let mut h = axum::http::HeaderMap::new();
        if let Some(v) = c.traceparent {
            h.insert("traceparent", v.parse().unwrap());
        }
        let got = remote_parent(&h).map(|cx| {
            let sc = cx.span().span_context().clone();
            assert!(sc.is_remote(), "{}: remote", c.name);
            (
                sc.trace_id().to_string(),
                sc.span_id().to_string(),
                sc.trace_flags() == TraceFlags::SAMPLED,
            )
        });
        let want = c
            .want
            .map(|(t, s, sampled)| (t.to_string(), s.to_string(), sampled));
        assert_eq!(got, want, "{}", c.name);
    }
}

#[tokio::test]
async fn route_labels_are_matched_patterns() {
    struct Case {
        name: &'static str,
        method: &'static str,
        path: &'static str,
        label: &'static str,
    }
    let cases = [
        Case {
            name: "a lease id",
            method: "GET",
            path: "/v1/leases/abc",
            label: "GET /v1/leases/{id}",
        },
        Case {
            name: "a lease id under report",
            method: "POST",
            path: "/v1/leases/abc/report",
            label: "POST /v1/leases/{id}/report",
        },
        Case {
            // The router matches an empty segment (the handler answers 404
            // unknown_lease); the label is still the pattern.
            name: "an empty id",
            method: "POST",
            path: "/v1/leases//renew",
            label: "POST /v1/leases/{id}/renew",
        },
        Case {
            name: "an unknown path",
            method: "GET",
            path: "/x",
            label: "GET unmatched",
        },
        Case {
            name: "a method the route does not serve",
            method: "PUT",
            path: "/v1/leases",
            label: "PUT /v1/leases",
        },
        Case {
            name: "an unknown method",
            method: "BREW",
            path: "/v1/proxies",
            label: "OTHER /v1/proxies",
        },
        Case {
            name: "liveness",
            method: "GET",
            path: "/healthz",
            label: "GET /healthz",
        },
    ];
    let api = Api::start(Some("t0k"), 1).await;
    for c in &cases {
        api.call(c.method, c.path, Some("t0k"), None).await;
        let text = api.metrics.encode().unwrap();
        let want = format!("route=\"{}\"", c.label);
        assert!(text.contains(&want), "{}: no {want} in\n{text}", c.name);
        assert!(!text.contains("abc"), "{}: an id became a label", c.name);
    }
    api.stop().await;
}

/// Finished spans, kept for the test to read.
#[derive(Clone, Debug, Default)]
struct Collected(Arc<std::sync::Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

impl opentelemetry_sdk::trace::SpanExporter for Collected {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

// Current-thread runtime: the server's tasks run on this thread, under the
// subscriber set as this thread's default.
#[tokio::test(flavor = "current_thread")]
async fn an_incoming_traceparent_parents_the_server_span() {
    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Collected::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);
    // While exactly one dispatcher exists, tracing-core caches a callsite's
    // interest from the default of whichever thread registers it first, so
    // another test's thread (no subscriber) could turn the server span off
    // for good. With a second one alive, interest is asked of all of them.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let api = Api::start(Some("t0k"), 1).await;
    let (status, _) = api
        .call_with(
            "GET",
            "/v1/leases/abc",
            Some("t0k"),
            &[(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )],
            None,
        )
        .await;
    assert_eq!(status, 404);
    api.stop().await;
    provider.force_flush().unwrap();
    let spans = spans.0.lock().unwrap().clone();
    let server = spans
        .iter()
        .find(|s| s.name == "GET /v1/leases/{id}")
        .unwrap_or_else(|| panic!("no server span in {spans:?}"));
    assert_eq!(server.span_kind, SpanKind::Server);
    assert_eq!(
        server.span_context.trace_id().to_string(),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert_eq!(server.parent_span_id.to_string(), "b7ad6b7169203331");
    assert!(server.parent_span_is_remote, "{server:?}");
}

#[tokio::test]
async fn each_token_is_a_client_with_its_own_lease_cap() {
    let api = Api::start_clients(
        &[("greedy", "tok-g"), ("polite", "tok-p")],
        10,
        ClientLimits {
            max_leases: 1,
            global_cooldown_min_clients: 2,
        },
    )
    .await;
    let acquire = |t: &'static str| {
        let api = &api;
        async move {
            api.call("POST", "/v1/leases", Some(t), Some(b"{}".to_vec()))
                .await
        }
    };
    let (s, first) = acquire("tok-g").await;
    assert_eq!(s, 201, "{first}");
    let (s, v) = acquire("tok-g").await;
    assert_eq!((s, code(&v)), (409, "client_limit"), "{v}");
    // Until its own lease ends (the default 300 s), capped at a minute.
    assert_eq!(api.last_retry_after(), "60");
    let (s, v) = acquire("tok-p").await;
    assert_eq!(s, 201, "another client is not held back: {v}");
    // Each client's requests are counted under its token's name.
    let text = api.metrics.encode().unwrap();
    for want in [
        r#"route="POST /v1/leases",status="201",client="greedy""#,
        r#"route="POST /v1/leases",status="409",client="greedy""#,
        r#"route="POST /v1/leases",status="201",client="polite""#,
    ] {
        assert!(text.contains(want), "no {want} in\n{text}");
    }
    assert!(!text.contains("tok-g"), "a token became a label");
    // One client's global report keeps the proxy from itself only.
    let id = first["id"].as_str().unwrap();
    let name = first["proxy"]["name"].as_str().unwrap().to_string();
    let (s, _) = api
        .call(
            "POST",
            &format!("/v1/leases/{id}/report"),
            Some("tok-g"),
            Some(br#"{"result":"failed"}"#.to_vec()),
        )
        .await;
    assert_eq!(s, 204);
    let (s, _) = api
        .call("DELETE", &format!("/v1/leases/{id}"), Some("tok-g"), None)
        .await;
    assert_eq!(s, 204);
    let (_, v) = acquire("tok-g").await;
    assert_ne!(v["proxy"]["name"].as_str(), Some(name.as_str()), "{v}");
    let (s, v) = api.call("GET", "/v1/proxies", Some("wrong"), None).await;
    assert_eq!((s, code(&v)), (401, "unauthorized"));
    api.stop().await;
}

/// `p`, a Proxy of the pool `pool`.
fn in_pool(p: Arc<Proxy>, pool: &str) -> Arc<Proxy> {
    let mut p = (*p).clone();
    p.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(crate::api::constants::POOL_LABEL.into(), pool.into());
    Arc::new(p)
}

/// The pool filter, on list and acquire; answers name the pool.
#[tokio::test]
async fn the_pool_filter_keeps_a_pools_proxies() {
    let api = Api::start(Some("t0k"), 1).await;
    let (s, v) = api
        .call("GET", "/v1/proxies?pool=eu", Some("t0k"), None)
        .await;
    assert_eq!((s, names(&v)), (200, vec!["b".to_string()]), "{v}");
    assert_eq!(v["items"][0]["pool"], "eu", "{v}");
    let (s, v) = api
        .call("GET", "/v1/proxies?pool=", Some("t0k"), None)
        .await;
    assert_eq!(
        (s, names(&v).len()),
        (200, 2),
        "an empty pool is no filter: {v}"
    );
    let (s, v) = api
        .json("POST", "/v1/leases", json!({"filters": {"pool": "us"}}))
        .await;
    assert_eq!((s, code(&v)), (409, "no_proxy"), "{v}");
    let (s, v) = api
        .json("POST", "/v1/leases", json!({"filters": {"pool": "eu"}}))
        .await;
    assert_eq!((s, v["proxy"]["name"].as_str()), (201, Some("b")), "{v}");
    assert_eq!(v["proxy"]["pool"], "eu", "the answer names the pool: {v}");
    let (s, v) = api.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s, v["proxy"]["name"].as_str()), (201, Some("a")), "{v}");
    assert!(v["proxy"].get("pool").is_none(), "no pool, no field: {v}");
    api.stop().await;
}

/// The namespace and label-selector filters, on list and acquire; a
/// malformed selector is a 400 naming the requirement.
#[tokio::test]
async fn namespace_and_label_selector_filters() {
    let api = Api::start(Some("t0k"), 1).await;
    let (s, v) = api
        .call(
            "GET",
            "/v1/proxies?labelSelector=zone-label+in+(z2,z3)",
            Some("t0k"),
            None,
        )
        .await;
    assert_eq!((s, names(&v)), (200, vec!["b".to_string()]), "{v}");
    assert_eq!(v["items"][0]["labels"]["zone-label"], "z2", "{v}");
    let (s, v) = api
        .call(
            "GET",
            "/v1/proxies?namespace=ns&labelSelector=!zone-label",
            Some("t0k"),
            None,
        )
        .await;
    assert_eq!((s, names(&v)), (200, vec![]), "{v}");
    let (s, v) = api
        .json(
            "POST",
            "/v1/leases",
            json!({"filters": {"namespace": "elsewhere"}}),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "no_proxy"), "{v}");
    let (s, v) = api
        .json(
            "POST",
            "/v1/leases",
            json!({"filters": {"labelSelector": "zone-label=z1"}}),
        )
        .await;
    assert_eq!((s, v["proxy"]["name"].as_str()), (201, Some("a")), "{v}");
    let (s, v) = api
        .json(
            "POST",
            "/v1/leases",
            json!({"filters": {"labelSelector": "zone-label in z1"}}),
        )
        .await;
    assert_eq!((s, code(&v)), (400, "invalid_filter"), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("zone-label in z1") && message.contains("not a set"),
        "{message}"
    );
    api.stop().await;
}

#[test]
fn forward_decision() {
    struct Case {
        name: &'static str,
        leader: Leader,
        forwarded: bool,
        want: Route,
    }
    let at = || Leader::At("http://10.0.0.7:8090".into());
    let cases = [
        Case {
            name: "the leader serves",
            leader: Leader::Me,
            forwarded: false,
            want: Route::Local,
        },
        Case {
            name: "the leader serves what a follower forwarded",
            leader: Leader::Me,
            forwarded: true,
            want: Route::Local,
        },
        Case {
            name: "a follower that knows the leader forwards",
            leader: at(),
            forwarded: false,
            want: Route::Forward("http://10.0.0.7:8090".into()),
        },
        Case {
            name: "a forwarded call at a replica that no longer leads stops here",
            leader: at(),
            forwarded: true,
            want: Route::Unavailable(Unavailable::NotLeader),
        },
        Case {
            name: "no leader known",
            leader: Leader::Unknown,
            forwarded: false,
            want: Route::Unavailable(Unavailable::NoLeader),
        },
        Case {
            name: "no leader known, forwarded",
            leader: Leader::Unknown,
            forwarded: true,
            want: Route::Unavailable(Unavailable::NoLeader),
        },
        Case {
            name: "a URL without a valid seal gets nothing",
            leader: Leader::Unverified,
            forwarded: false,
            want: Route::Unavailable(Unavailable::Unverified),
        },
    ];
    for c in cases {
        assert_eq!(route(&c.leader, c.forwarded), c.want, "{}", c.name);
    }
}

#[tokio::test]
async fn a_follower_relays_lease_calls_to_the_leader_s_one_table() {
    let leader = Api::start_routed(1, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(1, Leader::At(url), FORWARD_TIMEOUT).await;
    // Two healthy proxies, one lease each: two grants in all, wherever asked.
    let (s1, first) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s1, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let (s2, _) = leader.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s2, 201);
    let (s3, full) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s3, code(&full)), (409, "no_capacity"), "{full}");
    assert!(
        follower.last_retry_after().parse::<u64>().unwrap() >= 1,
        "the leader's Retry-After is relayed"
    );
    // The lease lives in the leader's table: read there, renewed, reported
    // and released through the follower.
    let path = format!("/v1/leases/{id}");
    assert_eq!(leader.call("GET", &path, Some("t0k"), None).await.0, 200);
    let (renewed, body) = follower
        .json("POST", &format!("{path}/renew"), json!({"ttlSeconds": 60}))
        .await;
    assert_eq!((renewed, body["ttlSeconds"].as_u64()), (200, Some(60)));
    let report = json!({"result": "ok"});
    assert_eq!(
        follower
            .json("POST", &format!("{path}/report"), report)
            .await
            .0,
        204
    );
    assert_eq!(
        follower.call("DELETE", &path, Some("t0k"), None).await.0,
        204
    );
    assert_eq!(leader.call("GET", &path, Some("t0k"), None).await.0, 404);
    // The follower checks the token itself, and the leader does again.
    assert_eq!(
        follower
            .call("POST", "/v1/leases", Some("bad"), None)
            .await
            .0,
        401
    );
    // An oversized body is the follower's own 413, not forwarded.
    let big = vec![b' '; BODY_LIMIT + 1];
    let (status, body) = follower
        .call("POST", "/v1/leases", Some("t0k"), Some(big))
        .await;
    assert_eq!((status, code(&body)), (413, "payload_too_large"), "{body}");
    let text = follower.metrics.encode().unwrap();
    assert!(
        text.contains(r#"proxy_operator_discovery_forwarded_total{outcome="relayed"} 5"#),
        "{text}"
    );
    follower.stop().await;
    leader.stop().await;
}

#[tokio::test]
async fn a_follower_without_a_reachable_leader_answers_503_with_retry_after() {
    // A port nobody listens on: bound, then closed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    // A leader that accepts connections and never answers.
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = format!("http://{}", mute.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((c, _)) = mute.accept().await {
            open.push(c);
        }
    });
    struct Case {
        name: &'static str,
        leader: Leader,
        signed: bool,
        outcome: &'static str,
    }
    let cases = [
        Case {
            name: "no leader known",
            leader: Leader::Unknown,
            signed: false,
            outcome: "no_leader",
        },
        Case {
            name: "the leader's port is closed",
            leader: Leader::At(gone),
            signed: false,
            outcome: "unreachable",
        },
        Case {
            name: "the leader does not answer",
            leader: Leader::At(silent),
            signed: false,
            outcome: "timeout",
        },
        Case {
            name: "forwarded here, but this replica does not lead",
            leader: Leader::At("http://127.0.0.1:9".into()),
            signed: true,
            outcome: "not_leader",
        },
        Case {
            name: "the Lease names a URL nobody sealed",
            leader: Leader::Unverified,
            signed: false,
            outcome: "unverified",
        },
    ];
    for c in cases {
        let api = Api::start_routed(1, c.leader, Duration::from_millis(300)).await;
        // A call another replica forwarded, signed with the shared key.
        let f = internal::Forward {
            method: "POST",
            path: "/v1/leases",
            client: "default",
            request_key: "",
            deadline_ms: "",
            body: b"",
        };
        let signed =
            internal::sign_forward(&shared_key(), &f, chrono::Utc::now().timestamp_millis());
        let headers = [
            (internal::FORWARD_HEADER, signed.as_str()),
            (internal::CLIENT_HEADER, "default"),
        ];
        let headers: &[(&str, &str)] = if c.signed { &headers } else { &[] };
        let (status, body) = api
            .call_with("POST", "/v1/leases", Some("t0k"), headers, None)
            .await;
        assert_eq!(
            (status, code(&body)),
            (503, "leader_unavailable"),
            "{}: {body}",
            c.name
        );
        assert_eq!(api.last_retry_after(), "3", "{}", c.name);
        assert!(
            !body["error"]["message"].as_str().unwrap().contains('{'),
            "{}: plain words: {body}",
            c.name
        );
        // The listing is this replica's own.
        assert_eq!(
            api.call("GET", "/v1/proxies", Some("t0k"), None).await.0,
            200
        );
        let text = api.metrics.encode().unwrap();
        let want = format!(
            r#"proxy_operator_discovery_forwarded_total{{outcome="{}"}} 1"#,
            c.outcome
        );
        assert!(text.contains(&want), "{}: {text}", c.name);
        api.stop().await;
    }
    held.abort();
}

#[tokio::test]
async fn a_lease_belongs_to_the_client_that_holds_it() {
    let api = Api::start_clients(
        &[("alice", "tok-a"), ("bob", "tok-b")],
        10,
        ClientLimits::default(),
    )
    .await;
    let (s, lease) = api
        .call("POST", "/v1/leases", Some("tok-a"), Some(b"{}".to_vec()))
        .await;
    assert_eq!(s, 201, "{lease}");
    let id = lease["id"].as_str().unwrap();
    let path = format!("/v1/leases/{id}");
    // Bob, holding the id, meets it as an unknown lease everywhere.
    for (method, p, body) in [
        ("GET", path.clone(), None),
        ("POST", format!("{path}/renew"), Some(b"{}".to_vec())),
        (
            "POST",
            format!("{path}/report"),
            Some(br#"{"result": "failed"}"#.to_vec()),
        ),
        ("DELETE", path.clone(), None),
    ] {
        let (s, v) = api.call(method, &p, Some("tok-b"), body).await;
        assert_eq!(
            (s, code(&v)),
            (404, "unknown_lease"),
            "bob's {method} {p}: {v}"
        );
    }
    // As for an id that never was: nothing tells bob it exists.
    let (s, v) = api
        .call("DELETE", "/v1/leases/v1.AAAA", Some("tok-b"), None)
        .await;
    assert_eq!((s, code(&v)), (404, "unknown_lease"), "{v}");
    // Alice still holds it, renews it and may end it.
    let (s, v) = api.call("GET", &path, Some("tok-a"), None).await;
    assert_eq!(s, 200, "alice still holds her lease: {v}");
    let (s, v) = api
        .call(
            "POST",
            &format!("{path}/renew"),
            Some("tok-a"),
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = api.call("DELETE", &path, Some("tok-a"), None).await;
    assert_eq!(s, 204);
    let (s, v) = api.call("GET", &path, Some("tok-a"), None).await;
    assert_eq!((s, code(&v)), (404, "unknown_lease"), "{v}");
}

/// A request head, read up to the blank line.
async fn read_head(c: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).await.unwrap() == 1 {
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The headers of a signed forward of `body` to `path` for `client`.
fn forward_headers(
    key: &LeaseKey,
    path: &'static str,
    client: &'static str,
    request_key: &'static str,
    deadline_ms: &'static str,
    body: &'static [u8],
) -> Vec<(&'static str, String)> {
    let f = internal::Forward {
        method: "POST",
        path,
        client,
        request_key,
        deadline_ms,
        body,
    };
    let now = chrono::Utc::now().timestamp_millis();
    vec![
        (
            internal::FORWARD_HEADER,
            internal::sign_forward(key, &f, now),
        ),
        (internal::CLIENT_HEADER, client.to_string()),
        (internal::REQUEST_KEY_HEADER, request_key.to_string()),
        (internal::DEADLINE_HEADER, deadline_ms.to_string()),
    ]
}

fn as_pairs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Issue 52: an answer at the leader's address without the leader's seal
/// for the call (a stand-in that learned the address) is not relayed to
/// the crawler: 503, counted `unsealed`.
#[tokio::test]
async fn an_unsealed_answer_from_the_leaders_address_is_not_relayed() {
    let stand_in = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", stand_in.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = stand_in.accept().await else {
                return;
            };
            let _ = read_head(&mut c).await;
            use tokio::io::AsyncWriteExt;
            let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
            let _ = c.write_all(answer.as_bytes()).await;
        }
    });
    let follower = Api::start_routed(1, Leader::At(url), FORWARD_TIMEOUT).await;
    let (s, v) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s, code(&v)), (503, "leader_unavailable"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("seal"),
        "{v}"
    );
    follower.stop().await;
}

#[tokio::test]
async fn a_forward_is_signed_for_the_client_and_never_carries_the_crawlers_token() {
    // A leader that records what it is sent.
    let recorder = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", recorder.local_addr().unwrap());
    let seen = tokio::spawn(async move {
        loop {
            let (mut c, _) = recorder.accept().await.unwrap();
            let head = read_head(&mut c).await;
            use tokio::io::AsyncWriteExt;
            // Sealed for the call, as the leader seals its answers.
            let ask = head
                .lines()
                .find_map(|l| l.strip_prefix("x-egress-forward: "))
                .unwrap_or_default();
            let seal = internal::seal_answer(&shared_key(), ask.trim(), 409, b"{}");
            let answer = format!("HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\n{}: {seal}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}", internal::ANSWER_HEADER);
            c.write_all(answer.as_bytes()).await.unwrap();
            // The follower's copy of the lease table asks too.
            if head.starts_with("POST") {
                return head;
            }
        }
    });
    let follower = Api::start_routed(1, Leader::At(url), FORWARD_TIMEOUT).await;
    let (s, _) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s, 409, "the leader's answer is relayed");
    let head = seen.await.unwrap().to_ascii_lowercase();
    assert!(
        !head.contains("t0k"),
        "the crawler's token stays here: {head}"
    );
    assert!(!head.contains("authorization"), "{head}");
    for h in [
        "x-egress-forward: v1.",
        "x-egress-client: default",
        "x-egress-request-key: ",
        "x-egress-deadline-ms: ",
    ] {
        assert!(head.contains(h), "{h} in {head}");
    }
    follower.stop().await;
}

#[tokio::test]
async fn a_forwarded_acquire_sent_again_gets_the_same_lease_and_a_late_one_gets_none() {
    let leader = Api::start_routed(5, Leader::Me, FORWARD_TIMEOUT).await;
    let active = || async {
        let text = leader.metrics.encode().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("proxy_operator_leases_active "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    let send = |h: Vec<(&'static str, String)>| {
        let leader = &leader;
        async move {
            leader
                .call_with(
                    "POST",
                    "/v1/leases",
                    None,
                    &as_pairs(&h),
                    Some(b"{}".to_vec()),
                )
                .await
        }
    };
    let key = shared_key();
    let rk1 = || forward_headers(&key, "/v1/leases", "default", "rk-1", "1500", b"{}");
    let (s1, first) = send(rk1()).await;
    assert_eq!(s1, 201, "a signed forward needs no token: {first}");
    // The answer was lost; the follower sends the same call again (signed
    // anew, with the same request key).
    let (s2, again) = send(rk1()).await;
    assert_eq!((s2, &again["id"]), (201, &first["id"]), "{again}");
    assert_eq!(active().await, 1.0, "one lease, not two");
    // Another client's call under the same key is its own.
    let (s3, other) = send(forward_headers(
        &key,
        "/v1/leases",
        "team-b",
        "rk-1",
        "1500",
        b"{}",
    ))
    .await;
    assert_eq!(s3, 201, "{other}");
    assert_ne!(other["id"], first["id"]);
    // Past its deadline (the follower answered 503 already): nothing.
    let (s4, late) = send(forward_headers(
        &key,
        "/v1/leases",
        "default",
        "rk-2",
        "0",
        b"{}",
    ))
    .await;
    assert_eq!((s4, code(&late)), (503, "leader_unavailable"), "{late}");
    assert_eq!(active().await, 2.0, "nothing granted that nobody holds");
    // Signed with another installation's key, or for another body: 401.
    let other_key = LeaseKey::from_bytes(&[3; crate::lease::signed::KEY_LEN]).unwrap();
    let (s5, v) = send(forward_headers(
        &other_key,
        "/v1/leases",
        "default",
        "rk-3",
        "1500",
        b"{}",
    ))
    .await;
    assert_eq!((s5, code(&v)), (401, "unauthorized"), "{v}");
    let (s6, v) = send(forward_headers(
        &key,
        "/v1/leases",
        "default",
        "rk-4",
        "1500",
        br#"{"ttlSeconds":5}"#,
    ))
    .await;
    assert_eq!((s6, code(&v)), (401, "unauthorized"), "{v}");
    assert_eq!(active().await, 2.0);
    leader.stop().await;
}

#[tokio::test]
async fn a_follower_keeps_a_copy_of_the_leaders_table_and_crawlers_cannot_read_it() {
    let leader = Api::start_routed(5, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(5, Leader::At(url), FORWARD_TIMEOUT).await;
    for _ in 0..2 {
        let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
        assert_eq!(s, 201, "{v}");
    }
    let active = |api: &Api| {
        let text = api.metrics.encode().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("proxy_operator_leases_active "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while active(&follower) != Some(2.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower's copy: {:?}",
            active(&follower)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A release at the leader reaches the copy too.
    let (_, v) = leader.json("POST", "/v1/leases", json!({})).await;
    let path = format!("/v1/leases/{}", v["id"].as_str().unwrap());
    assert_eq!(leader.call("DELETE", &path, Some("t0k"), None).await.0, 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while active(&follower) != Some(2.0) || active(&leader) != Some(2.0) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The table is for replicas: a crawler's token meets an unknown route.
    let (s, v) = leader.call("GET", feed::FEED_PATH, Some("t0k"), None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    follower.stop().await;
    leader.stop().await;
}

#[tokio::test]
async fn a_gateway_key_forwards_and_follows_but_is_never_a_replica_in_sync() {
    let gateway_key = LeaseKey::from_bytes(&[7; crate::lease::signed::KEY_LEN]).unwrap();
    let stranger_key = LeaseKey::from_bytes(&[5; crate::lease::signed::KEY_LEN]).unwrap();
    let leader = Api::start_keyed(
        5,
        (Leader::Me, FORWARD_TIMEOUT),
        (shared_key(), Some(gateway_key.clone())),
    )
    .await;
    let url = format!("http://{}", leader.addr);
    let gateway = Api::start_keyed(
        5,
        (Leader::At(url.clone()), FORWARD_TIMEOUT),
        (gateway_key, None),
    )
    .await;
    let stranger = Api::start_keyed(
        5,
        (Leader::At(url.clone()), FORWARD_TIMEOUT),
        (stranger_key, None),
    )
    .await;
    let manager = Api::start_keyed(
        5,
        (Leader::At(url.clone()), FORWARD_TIMEOUT),
        (shared_key(), None),
    )
    .await;
    // A lease call a gateway forwards is the leader's to answer.
    let (s, v) = gateway.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(leader.leases.active(), 1);
    // One signed with any other key is refused.
    let (s, v) = stranger.json("POST", "/v1/leases", json!({})).await;
    assert_ne!(s, 201, "{v}");
    assert_eq!(leader.leases.active(), 1);
    // Asking for the table naming itself, a gateway is still an observer;
    // a manager replica joins the followers grants wait for.
    let ask = |who: &str| format!("{}?replica={who}", feed::FEED_PATH);
    let fed: Option<Value> = feed::ask_leader(&gateway.state, &url, &ask("gw-1"), 1 << 20)
        .await
        .unwrap();
    assert!(fed.is_some_and(|f| f["state"].is_object()));
    let fed: Option<Value> = feed::ask_leader(&manager.state, &url, &ask("mgr-1"), 1 << 20)
        .await
        .unwrap();
    assert!(fed.is_some());
    let refused: Result<Option<Value>, String> =
        feed::ask_leader(&stranger.state, &url, &ask("x-1"), 1 << 20).await;
    assert!(refused.is_err(), "{refused:?}");
    // Each Api also follows the leader in the background, naming itself:
    // once the manager's and the gateway's copies hold the lease, the
    // manager is named in sync, the gateway never.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let named = loop {
        let (_, named) = leader.replicas.publish(&shared_key(), false);
        let copied = gateway.leases.active() == 1 && manager.leases.active() == 1;
        if copied && named.contains(manager.replicas.me()) {
            break named;
        }
        assert!(tokio::time::Instant::now() < deadline, "{named:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for not in [gateway.replicas.me(), "gw-1", stranger.replicas.me()] {
        assert!(!named.contains(not), "{not} in {named:?}");
    }
    for api in [gateway, stranger, manager, leader] {
        api.stop().await;
    }
}

#[tokio::test]
async fn a_gateway_copies_the_leaders_credentials_and_keeps_them_without_a_leader() {
    use crate::credentials::Credentials;
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::watcher::Event;
    let leader = Api::start_routed(5, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let gateway = Api::start_routed(5, Leader::At(url), FORWARD_TIMEOUT).await;
    // The credentials are for replicas: a crawler's token meets an
    // unknown route.
    let path = credentials_feed::CREDENTIALS_PATH;
    let (s, v) = leader.call("GET", path, Some("t0k"), None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // The leader's watch listed one credentials Secret.
    let at_leader = leader.state.credentials.clone();
    let mut writer = at_leader.take_writer().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds-a", "namespace": "ns",
            "labels": {"crawl.example.com/proxy-credentials": "true"}},
        "data": {"username": "dXNlci1h", "password": "cGFzcy1h"}}))
    .unwrap();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitApply(secret));
    writer.apply_watcher_event(&Event::InitDone);
    at_leader
        .change_counter()
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    // A gateway process (an observer) asks for them, signed.
    let copy = gateway.state.credentials.clone();
    assert!(!copy.synced(), "nothing before the first copy");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let follow = tokio::spawn(credentials_feed::follow_credentials(
        gateway.state.clone().as_observer(),
        async move {
            let _ = stopped.await;
        },
    ));
    let has = |name: &str, user: &str, pass: &str| {
        copy.get("ns", name) == Some(Credentials::new(user, pass))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !has("creds-a", "user-a", "pass-a") {
        assert!(tokio::time::Instant::now() < deadline, "no copy in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the leader writes next reaches the copy.
    at_leader.wrote("ns", "creds-b", &Credentials::new("user-b", "pass-b"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !has("creds-b", "user-b", "pass-b") {
        assert!(tokio::time::Instant::now() < deadline, "no change in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without a leader, the gateway keeps what it has.
    leader.stop().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(has("creds-a", "user-a", "pass-a") && has("creds-b", "user-b", "pass-b"));
    let _ = stop.send(());
    follow.await.unwrap();
    gateway.stop().await;
}

#[tokio::test]
async fn a_grant_is_answered_only_once_the_in_sync_follower_holds_it() {
    let leader = Api::start_routed(50, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(50, Leader::At(url), FORWARD_TIMEOUT).await;
    let me = follower.replicas.me().to_string();
    // The leader's election writes: until one names the follower in sync.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, named) = leader.replicas.publish(&shared_key(), false);
        leader.replicas.written(&named);
        if named.contains(&me) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never in sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 1..=20 {
        let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(
            follower.leases.active(),
            i,
            "the follower's copy holds grant {i} when the crawler hears of it"
        );
    }
    let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
    let path = format!("/v1/leases/{}/renew", v["id"].as_str().unwrap());
    assert_eq!(s, 201);
    let (s, v) = leader
        .json("POST", &path, json!({"ttlSeconds": 3000}))
        .await;
    assert_eq!(s, 200, "{v}");
    let copied = follower.leases.export();
    assert!(
        copied.leases.iter().any(|l| l.3 > 2_900_000),
        "the renewal is in the copy when answered"
    );
    // The follower was sent the table whole once, on joining, and after
    // that only what changed.
    let text = leader.metrics.encode().unwrap();
    let answers = |kind: &str| {
        let series = format!("proxy_operator_lease_feed_answers_total{{kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    assert!(answers("delta") >= 22, "{text}");
    assert!(answers("whole") <= 2, "{text}");
    // The follower goes silent: with nobody writing the Lease, a grant
    // waits for it and is refused, and nothing stays granted.
    follower.stop().await;
    let before = leader.leases.active();
    let started = std::time::Instant::now();
    let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s, code(&v)), (503, "leader_unavailable"), "{v}");
    assert!(started.elapsed() >= super::replicas::CONFIRM_LIMIT);
    assert_eq!(leader.leases.active(), before, "nothing granted");
    // Once a write leaves the follower out, grants go on without it.
    let r = leader.replicas.clone();
    let election = tokio::spawn(async move {
        r.write_now().notified().await;
        let (_, named) = r.publish(&shared_key(), false);
        r.written(&named);
        named
    });
    let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s, 201, "{v}");
    assert!(election.await.unwrap().is_empty(), "the follower is out");
    leader.stop().await;
}

/// A replacer that records what it was asked, its breaker open or not.
#[derive(Default)]
struct Recorded {
    open: std::sync::atomic::AtomicBool,
    asked: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl Replacer for Recorded {
    fn held(&self, provider: &str) -> Option<String> {
        self.open
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| format!("provider {provider}'s circuit breaker is open"))
    }

    async fn request(&self, key: &crate::lease::ProxyKey, value: &str) -> Result<(), String> {
        self.asked
            .lock()
            .unwrap()
            .push((key.to_string(), value.to_string()));
        Ok(())
    }
}

async fn replacing(replacer: Arc<Recorded>) -> Api {
    let tokens = [("crawler-a", "t0k"), ("crawler-b", "other")];
    let limits = (ClientLimits::default(), crate::server::DISCOVERY_LIMITS);
    let with = (Some(replacer as Arc<dyn Replacer>), None);
    Api::start_replacing(&tokens, 1, limits, Forwarder::alone(), with).await
}

#[tokio::test]
async fn a_replace_ends_the_lease_marks_the_proxy_and_leases_another() {
    let replacer = Arc::new(Recorded::default());
    let api = replacing(replacer.clone()).await;
    let (st, old) = api.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(st, 201, "{old}");
    let id = old["id"].as_str().unwrap();
    let old_proxy = old["proxy"]["name"].as_str().unwrap().to_string();

    // Another client's id is unknown to this one: nothing is done.
    let path = format!("/v1/leases/{id}/replace");
    let (st, body) = api.call("POST", &path, Some("other"), None).await;
    assert_eq!((st, code(&body)), (404, "unknown_lease"), "{body}");
    assert!(replacer.asked.lock().unwrap().is_empty());

    let (st, new) = api.json("POST", &path, json!({})).await;
    assert_eq!(st, 201, "{new}");
    assert_ne!(new["proxy"]["name"], old_proxy.as_str(), "another proxy");
    assert_ne!(new["id"], old["id"]);
    let asked = replacer.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].0, format!("ns/{old_proxy}"));
    assert!(
        asked[0].1.contains("crawler-a"),
        "names the client: {asked:?}"
    );
    let (st, body) = api
        .call("GET", &format!("/v1/leases/{id}"), Some("t0k"), None)
        .await;
    assert_eq!(
        (st, code(&body)),
        (404, "unknown_lease"),
        "the old lease ended"
    );
    let (st, body) = api.json("POST", &path, json!({})).await;
    assert_eq!(
        (st, code(&body)),
        (404, "unknown_lease"),
        "a second replace of it"
    );
    assert!(api
        .metrics
        .encode()
        .unwrap()
        .contains("event=\"replace_requested\"} 1"));
    api.stop().await;
}

#[tokio::test]
async fn a_replace_answers_409_while_the_breaker_is_open_and_keeps_the_lease() {
    let replacer = Arc::new(Recorded::default());
    replacer
        .open
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let api = replacing(replacer.clone()).await;
    let (_, lease) = api.json("POST", "/v1/leases", json!({})).await;
    let id = lease["id"].as_str().unwrap();
    let (st, body) = api
        .json("POST", &format!("/v1/leases/{id}/replace"), json!({}))
        .await;
    assert_eq!((st, code(&body)), (409, "circuit_open"), "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("kubernetes"));
    assert_eq!(api.last_retry_after(), "30");
    assert!(replacer.asked.lock().unwrap().is_empty());
    let (st, _) = api
        .call("GET", &format!("/v1/leases/{id}"), Some("t0k"), None)
        .await;
    assert_eq!(st, 200, "the lease is kept");
    api.stop().await;
}

#[tokio::test]
async fn replaces_are_limited_per_client_and_409_when_no_other_proxy_is_free() {
    let replacer = Arc::new(Recorded::default());
    let api = replacing(replacer.clone()).await;
    let mut answers = Vec::new();
    for _ in 0..REPLACES_PER_WINDOW + 1 {
        // Two proxies, one lease each: release whatever the last replace
        // gave, lease again, replace that.
        api.leases.sweep();
        let (st, lease) = api.json("POST", "/v1/leases", json!({})).await;
        assert_eq!(st, 201, "{lease}");
        let id = lease["id"].as_str().unwrap().to_string();
        let (st, body) = api
            .json("POST", &format!("/v1/leases/{id}/replace"), json!({}))
            .await;
        answers.push((st, code(&body).to_string()));
        if let Some(new) = body["id"].as_str() {
            api.call("DELETE", &format!("/v1/leases/{new}"), Some("t0k"), None)
                .await;
        }
    }
    assert!(
        answers[..REPLACES_PER_WINDOW]
            .iter()
            .all(|(st, _)| *st == 201),
        "{answers:?}"
    );
    assert_eq!(
        answers[REPLACES_PER_WINDOW],
        (429, "rate_limited".to_string()),
        "the eleventh within a minute"
    );
    assert_eq!(replacer.asked.lock().unwrap().len(), REPLACES_PER_WINDOW);

    // crawler-a still holds the lease its eleventh ask kept; crawler-b
    // takes the other proxy and asks to replace it: the ask goes through,
    // but no other proxy is free: 409 no_capacity.
    let (st, mine) = api
        .call("POST", "/v1/leases", Some("other"), Some(b"{}".to_vec()))
        .await;
    assert_eq!(st, 201, "{mine}");
    let id = mine["id"].as_str().unwrap();
    let (st, body) = api
        .call(
            "POST",
            &format!("/v1/leases/{id}/replace"),
            Some("other"),
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!((st, code(&body)), (409, "no_capacity"), "{body}");
    api.leases.sweep();
    api.stop().await;
}

/// A listing rebuilt with the same proxies keeps its generation and tells
/// the lease store nothing (no merge under its lock); once the store's
/// table is replaced (a follower's copy of the leader's), the next request
/// of a leading replica rebuilds it at once and tells it the set again,
/// and a grant finds the proxies.
#[tokio::test]
async fn a_rebuild_of_the_same_set_leaves_the_store_alone_unless_its_table_was_replaced() {
    let source: Vec<Arc<Proxy>> = vec![
        proxy("a", "z1", "True", json!({})),
        proxy("b", "z2", "True", json!({})),
    ];
    let config = LeaseConfig {
        max_leases_per_proxy: 1,
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    };
    let leases = Arc::new(LeaseStore::new(config).with_key(shared_key()));
    let mut registry = Registrar::new();
    let discovery = metrics::DiscoveryMetrics::register(&mut registry);
    let state = ApiState::new(Arc::new(source), leases.clone(), None, &discovery);
    let first = state.listing();
    assert_eq!(leases.eligible_generation(), Some(first.generation()));
    tokio::time::sleep(LISTING_MAX_AGE + Duration::from_millis(50)).await;
    let again = state.listing();
    assert!(!Arc::ptr_eq(&first, &again), "rebuilt");
    assert_eq!(
        again.generation(),
        first.generation(),
        "the same set keeps its generation"
    );
    // The leader's table replaces this store's: its eligible set is gone.
    let leader = LeaseStore::new(config).with_key(shared_key());
    assert!(leases
        .replace(&leader.export(), leases.term(), "leader")
        .unwrap());
    assert_eq!(leases.eligible_generation(), None);
    // At once, though the listing is fresh: this replica leads (it runs
    // alone), and no grant may go from a store without the set.
    let after = state.listing();
    assert_ne!(after.generation(), first.generation());
    assert_eq!(leases.eligible_generation(), Some(after.generation()));
    let req = crate::lease::AcquireRequest {
        client: Arc::from("c"),
        ..Default::default()
    };
    let members = after.members(&super::model::Filter::default());
    assert!(
        leases.acquire_among(&members, &req).is_ok(),
        "a grant finds the proxies"
    );
}

#[tokio::test]
async fn the_bench_routes_exist_only_when_asked_for_and_switch_the_probes() {
    let off = Api::start(Some("t0k"), 2).await;
    let (st, v) = off.json("POST", "/bench/leases", json!({})).await;
    assert_eq!(st, 404, "{v}");
    off.stop().await;

    let pause = crate::health::Pause::default();
    let limits = (ClientLimits::default(), crate::server::DISCOVERY_LIMITS);
    let tokens = [("default", "t0k")];
    let with = (None, Some(pause.clone()));
    let api = Api::start_replacing(&tokens, 2, limits, Forwarder::alone(), with).await;
    // Behind the same auth and parsing as a real acquire.
    let (st, _) = api.call("POST", "/bench/leases", None, None).await;
    assert_eq!(st, 401);
    let (st, v) = api.json("POST", "/bench/leases", json!({"ttl": 5})).await;
    assert_eq!(st, 422, "{v}");
    let (st, v) = api
        .json("POST", "/bench/leases", json!({"ttlSeconds": 60}))
        .await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["ttlSeconds"], 60);
    let id = v["id"].as_str().unwrap();
    let (st, _) = api
        .call("DELETE", &format!("/bench/leases/{id}"), Some("t0k"), None)
        .await;
    assert_eq!(st, 204);
    // No lease was taken.
    assert_eq!(api.leases.active(), 0);
    let (st, v) = api
        .json("PUT", "/bench/probes", json!({"paused": true}))
        .await;
    assert_eq!(st, 204, "{v}");
    assert!(pause.is_paused());
    let (st, _) = api
        .json("PUT", "/bench/probes", json!({"paused": false}))
        .await;
    assert_eq!(st, 204);
    assert!(!pause.is_paused());
    let (st, v) = api.json("PUT", "/bench/probes", json!({"hold": 1})).await;
    assert_eq!(st, 422, "{v}");
    api.stop().await;
}

/// A Proxy source that counts its changes and how often it was read.
struct Counted {
    proxies: std::sync::Mutex<Vec<Arc<Proxy>>>,
    version: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicUsize,
}

thread_local! {
    /// Set while a test's request runs on this thread.
    static IN_REQUEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Reads of a [`Counted`] source made by a request (see [`IN_REQUEST`]).
static READ_BY_REQUESTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl ProxySource for Counted {
    fn proxies(&self) -> Vec<Arc<Proxy>> {
        if IN_REQUEST.with(|r| r.get()) {
            READ_BY_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.proxies.lock().unwrap().clone()
    }
    fn version(&self) -> Option<u64> {
        Some(self.version.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A state over a [`Counted`] source holding the Proxy `a`, version 1.
fn counted_state() -> (Arc<Counted>, ApiState) {
    let source = Arc::new(Counted {
        proxies: std::sync::Mutex::new(vec![proxy("a", "z1", "True", json!({}))]),
        version: 1.into(),
        reads: 0.into(),
    });
    let api = state_over(source.clone());
    (source, api)
}

/// An open API's state over `source`, four leases a proxy.
fn state_over(source: Arc<dyn ProxySource>) -> ApiState {
    let leases = Arc::new(LeaseStore::new(LeaseConfig {
        max_leases_per_proxy: 4,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(60),
    }));
    let mut registry = Registrar::new();
    let discovery = metrics::DiscoveryMetrics::register(&mut registry);
    ApiState::new(source, leases, None, &discovery)
}

#[tokio::test]
async fn a_steady_fleet_is_not_listed_again_and_a_change_is() {
    let (source, api) = counted_state();
    let reads = || source.reads.load(std::sync::atomic::Ordering::SeqCst);
    let names = |l: &state::Listing| l.iter().map(|e| e.key.name.clone()).collect::<Vec<_>>();

    assert_eq!(names(&api.listing()), ["a"]);
    assert_eq!(reads(), 1, "the first request lists the Proxies");
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    assert_eq!(names(&api.listing()), ["a"]);
    assert_eq!(
        reads(),
        1,
        "nothing changed: past the listing's age, no Proxy is read again"
    );
    let mut seen = None;
    api.forget_deleted(&mut seen);
    api.forget_deleted(&mut seen);
    assert_eq!(
        reads(),
        2,
        "the sweep walks the Proxies once, not again while they stand still"
    );

    source
        .proxies
        .lock()
        .unwrap()
        .push(proxy("b", "z1", "True", json!({})));
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        names(&api.listing()),
        ["a", "b"],
        "a change is listed once the listing is past its age"
    );
    assert_eq!(reads(), 3);
    api.forget_deleted(&mut seen);
    assert_eq!(reads(), 4, "and the sweep looks again");
}

#[tokio::test]
async fn a_rebuild_reuses_the_entries_of_unchanged_proxies_only() {
    let (source, api) = counted_state();
    let with_rv = |name: &str, zone: &str, rv: Option<&str>| {
        let mut p = (*proxy(name, zone, "True", json!({}))).clone();
        p.metadata.resource_version = rv.map(String::from);
        Arc::new(p)
    };
    *source.proxies.lock().unwrap() = vec![
        with_rv("a", "z1", Some("1")),
        with_rv("b", "z1", Some("2")),
        with_rv("c", "z1", None),
    ];
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let before = api.listing();
    assert_eq!(before.len(), 3);

    // b changes (a new resourceVersion); a and c do not.
    source.proxies.lock().unwrap()[1] = with_rv("b", "z2", Some("3"));
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    let after = api.listing();
    assert!(!Arc::ptr_eq(&before, &after), "a new listing was built");
    assert!(
        Arc::ptr_eq(&before[0], &after[0]),
        "a's entry is the one already made"
    );
    assert!(!Arc::ptr_eq(&before[1], &after[1]), "b's is made again");
    assert_eq!(after[1].item.zone.as_deref(), Some("z2"), "with its change");
    assert!(
        !Arc::ptr_eq(&before[2], &after[2]),
        "a Proxy without a resourceVersion is never taken as unchanged"
    );
}

/// A leading replica and one that follows it (forwards and table copies).
async fn leader_and_follower() -> (Api, Api) {
    let leader = Api::start_routed(50, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(50, Leader::At(url), FORWARD_TIMEOUT).await;
    (leader, follower)
}

/// The key of the test source's Proxy `name` (namespace `ns`).
fn test_proxy_key(name: &str) -> crate::lease::ProxyKey {
    crate::lease::ProxyKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn a_flood_of_gateway_cooldowns_waits_bounded_and_reaches_the_leader_one_call_at_a_time() {
    use super::outbox::{Tell, MAX_WAITING};
    // A leader that takes connections and never answers.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut c, _)) = l.accept().await {
            let head = read_head(&mut c).await;
            if head.starts_with("POST /internal/v1/cooldowns") {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            held.push(c);
        }
    });
    let follower = Api::start_routed(50, Leader::At(url), FORWARD_TIMEOUT).await;
    let me: Arc<str> = "default".into();
    for i in 0..10_000 {
        let site = format!("site-{i}.example");
        follower.state.tell(Tell::Cooldown {
            proxy: test_proxy_key("a"),
            client: me.clone(),
            site: Some(site),
        });
    }
    assert!(follower.state.outbox.waiting() <= MAX_WAITING);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(sent, 1, "one call at a time, not a task per event");
    let text = follower.metrics.encode().unwrap();
    let dropped = text
        .lines()
        .find_map(|l| l.strip_prefix("proxy_operator_gateway_leader_messages_dropped_total "))
        .map_or(0.0, |n| n.trim().parse::<f64>().unwrap());
    assert!(dropped >= (10_000 - MAX_WAITING - 1) as f64, "{text}");
    follower.stop().await;
}

#[tokio::test]
async fn a_followers_cooldown_is_held_by_the_leader_and_its_route_is_for_replicas_only() {
    let (leader, follower) = leader_and_follower().await;
    let key = test_proxy_key;
    let (a, b, c) = (key("a"), key("b"), key("sick"));
    let me: Arc<str> = "default".into();
    assert!(leader.leases.lets_gateway_use("default", &a, None));
    follower.state.cool_down(&a, &me, None).await;
    follower
        .state
        .cool_down(&b, &me, Some("shop.example"))
        .await;
    let held = |l: &LeaseStore| {
        !l.lets_gateway_use("default", &a, None)
            && l.lets_gateway_use("default", &c, None)
            && !l.lets_gateway_use("default", &b, Some("shop.example"))
            && l.lets_gateway_use("default", &b, Some("news.example"))
    };
    // The leader has them once the follower's call returned; the
    // follower's copy, taken from the leader's table, keeps them.
    assert!(held(&leader.leases), "the leader holds both cooldowns");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !held(&follower.leases) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower's copy lost them"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Sent by a replica only: a crawler's token meets an unknown route.
    let body = br#"{"namespace": "ns", "name": "b"}"#.to_vec();
    let (s, v) = leader
        .call("POST", "/internal/v1/cooldowns", Some("t0k"), Some(body))
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    assert!(leader.leases.lets_gateway_use("default", &b, None));
    follower.stop().await;
    leader.stop().await;
}

/// With its refresher running (as `serve` runs it), no request walks the
/// Proxies: a change reaches the listing requests take within the
/// listing's age, rebuilt off their path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_refresher_running_no_request_rebuilds_the_listing() {
    let (source, api) = counted_state();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let refresher = tokio::spawn(api.clone().refresh_listing(async move {
        let _ = rx.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !api.refreshing() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refresher never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names = |l: &state::Listing| l.iter().map(|e| e.key.name.clone()).collect::<Vec<_>>();
    let request = || {
        IN_REQUEST.with(|r| r.set(true));
        let l = api.listing();
        IN_REQUEST.with(|r| r.set(false));
        names(&l)
    };
    assert_eq!(request(), ["a"]);
    source
        .proxies
        .lock()
        .unwrap()
        .push(proxy("b", "z1", "True", json!({})));
    source
        .version
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + LISTING_MAX_AGE * 4;
    while request() != ["a", "b"] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change never reached the listing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        READ_BY_REQUESTS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a request walked the Proxies"
    );
    let _ = tx.send(());
    refresher.await.unwrap();
    assert!(!api.refreshing(), "stopped: requests build their own again");
}

#[tokio::test]
async fn an_upstream_a_followers_gateway_saw_fail_reaches_the_leaders_health_engine() {
    let (leader, follower) = leader_and_follower().await;
    let key = test_proxy_key;
    let hints = |api: &Api| api.state.hints.as_ref().unwrap().take();
    follower.state.upstream_failed(&key("a")).await;
    assert_eq!(hints(&leader), ["ns/a"], "sent to the leader");
    assert!(hints(&follower).is_empty(), "a follower runs no engine");
    leader.state.upstream_failed(&key("b")).await;
    assert_eq!(hints(&leader), ["ns/b"], "the leader's own gateway");
    // Sent by a replica only: a crawler's token meets an unknown route.
    let body = br#"{"namespace": "ns", "name": "a"}"#.to_vec();
    let (s, v) = leader
        .call("POST", "/internal/v1/failed", Some("t0k"), Some(body))
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    assert!(hints(&leader).is_empty());
    follower.stop().await;
    leader.stop().await;
}

/// A source that announces its changes (the Proxy store) has its listing
/// patched where they fall: a changed Proxy, one no longer healthy, a
/// deleted one and a new one reach the listing, the other entries stay
/// the ones already made, and the store is walked only for the first
/// listing and after a relist; the sweep likewise forgets the cooldowns
/// of the deleted Proxies it is told of.
#[tokio::test]
async fn a_listing_follows_the_stores_events_without_a_walk() {
    use kube::runtime::watcher::Event;
    let at = |name: &str, zone: &str, healthy: &str, rv: &str| {
        let mut p = (*proxy(name, zone, healthy, json!({}))).clone();
        p.metadata.resource_version = Some(rv.into());
        p
    };
    let (store, mut fill) = crate::proxy_store::ProxyStore::by_hand();
    fill.list([
        at("b", "z1", "True", "1"),
        at("d", "z1", "True", "2"),
        at("f", "z1", "True", "3"),
        at("h", "z1", "True", "4"),
    ]);
    let api = state_over(Arc::new(store));
    let names = |l: &state::Listing| {
        l.iter()
            .map(|e| format!("{}:{}", e.key.name, e.item.zone.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
    };
    let first = api.listing();
    assert_eq!(names(&first), ["b:z1", "d:z1", "f:z1", "h:z1"]);
    assert_eq!(api.walks(), 1);

    // Before b, between d and f, at the end; d moves, f turns unhealthy,
    // h is deleted.
    for ev in [
        Event::Apply(at("a", "z1", "True", "5")),
        Event::Apply(at("e", "z1", "True", "6")),
        Event::Apply(at("i", "z1", "True", "7")),
        Event::Apply(at("d", "z2", "True", "8")),
        Event::Apply(at("f", "z1", "False", "9")),
        Event::Delete(at("h", "z1", "True", "4")),
    ] {
        fill.apply(ev);
    }
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    let patched = api.listing();
    assert_eq!(
        names(&patched),
        ["a:z1", "b:z1", "d:z2", "e:z1", "i:z1"],
        "every change in its place"
    );
    assert_eq!(api.walks(), 1, "patched, not walked");
    assert!(
        Arc::ptr_eq(&first[0], &patched[1]),
        "b's entry is the one already made"
    );
    let keys: Vec<_> = patched.iter().map(|e| e.key.clone()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "still sorted for its binary searches");
    assert!(patched.get(&test_proxy_key("e")).is_some());

    // The sweep walks the store once, then forgets the cooldowns of the
    // Proxies whose deletes it was told of, and of no other.
    let mut seen = None;
    api.forget_deleted(&mut seen);
    assert_eq!(api.walks(), 2, "the sweep's first look walks");
    let me: Arc<str> = "default".into();
    for name in ["a", "b", "e"] {
        api.cool_down(&test_proxy_key(name), &me, None).await;
    }
    let cooling = |name: &str| {
        !api.lease_store()
            .lets_gateway_use("default", &test_proxy_key(name), None)
    };
    assert!(cooling("a") && cooling("b") && cooling("e"));
    fill.apply(Event::Delete(at("e", "z1", "True", "6")));
    fill.apply(Event::Delete(at("b", "z1", "True", "1")));
    // b is made again before the sweep: it keeps its cooldown.
    fill.apply(Event::Apply(at("b", "z1", "True", "11")));
    api.forget_deleted(&mut seen);
    assert!(!cooling("e"), "e's cooldown is forgotten");
    assert!(cooling("a") && cooling("b"), "a's and b's stay");
    assert_eq!(api.walks(), 2, "told, not walked");

    // A relist (the watch restarted) is walked.
    fill.list([at("a", "z3", "True", "10")]);
    tokio::time::sleep(LISTING_MAX_AGE * 2).await;
    assert_eq!(names(&api.listing()), ["a:z3"]);
    assert_eq!(api.walks(), 3, "a relist is walked");
    api.forget_deleted(&mut seen);
    assert_eq!(api.walks(), 4, "by the sweep too");
    assert!(cooling("a") && !cooling("b"), "b is gone in the relist");
}
