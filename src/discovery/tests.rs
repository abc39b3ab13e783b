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
    replicas: Arc<crate::replica::members::Replicas>,
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
        let replicas = Arc::new(crate::replica::members::Replicas::new(
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

/// The key of the test source's Proxy `name` (namespace `ns`).
fn test_proxy_key(name: &str) -> crate::lease::ProxyKey {
    crate::lease::ProxyKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

mod listing;
mod replace;
mod replica;
