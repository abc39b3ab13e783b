//! Issue 17: secrets never leave the operator. The real operator binary,
//! logging everything at TRACE and exporting every span to an OTLP/HTTP
//! receiver in this test, runs two gcp Proxies (against the Compute
//! stand-in, the wire log of full payloads on): one with a sentinel in its
//! inline cloud-init, one whose cloud-init Secret holds another; a third
//! sentinel is `DISCOVERY_TOKEN`; the passwords the operator generated for
//! the two instances are sentinels too. After the API is called with a wrong, no
//! and the right token, and `/metrics` is scraped, no sentinel, plain or
//! base64 at any alignment, is in the log, the exported spans, `/metrics`,
//! the Proxies' status, the namespace's Events or an API error body.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::gcp_standin;
use crate::support;

use support::{api_call, eventually, Operator};

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use gcp_standin::{StandIn, ZONE};
use kube::api::PostParams;
use kube::Api;
use serde_json::json;

/// Lengths that are multiples of 3, so each has a base64 form of its own.
const INLINE: &str = "SENTINEL-INLINE-c0ffee5a1d";
const IN_SECRET: &str = "SENTINEL-SECRET-4b1d0e9f77";
const TOKEN: &str = "SENTINEL-TOKEN-7e57ab1e0042";

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What a sentinel looks like inside any base64 text that encodes it,
/// whatever precedes it: for each of the three byte offsets, the encoded
/// groups that hold sentinel bytes only.
fn base64_forms(s: &str) -> Vec<String> {
    (0..3)
        .map(|k| {
            let mut bytes = vec![b'x'; k];
            bytes.extend_from_slice(s.as_bytes());
            let enc = base64(&bytes);
            let first = k.div_ceil(3);
            let last = bytes.len() / 3;
            enc[first * 4..last * 4].to_string()
        })
        .collect()
}

#[test]
fn base64_forms_are_found_in_an_encoded_secret() {
    assert_eq!(base64(b"Man"), "TWFu");
    assert_eq!(base64(b"Ma"), "TWE=");
    for prefix in ["", "a", "ab", "#cloud-config\n"] {
        let enc = base64(format!("{prefix}{IN_SECRET}\n").as_bytes());
        assert!(
            base64_forms(IN_SECRET).iter().any(|f| enc.contains(f)),
            "{prefix:?}: {enc}"
        );
    }
}

/// Every sentinel form found in `text`: the fixed ones and `generated`
/// (the proxies' passwords).
fn leaks(text: &str, generated: &[String]) -> Vec<String> {
    [INLINE, IN_SECRET, TOKEN]
        .iter()
        .copied()
        .chain(generated.iter().map(String::as_str))
        .flat_map(|s| {
            let mut forms = vec![s.to_string()];
            forms.extend(base64_forms(s));
            forms
        })
        .filter(|f| text.contains(f.as_str()))
        .collect()
}

/// An OTLP/HTTP receiver keeping each export's raw protobuf body (strings
/// are stored as they are in protobuf) and the names of the spans in it.
async fn otlp_receiver() -> (String, Arc<Mutex<(Vec<u8>, Vec<String>)>>) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let got: Arc<Mutex<(Vec<u8>, Vec<String>)>> = Arc::default();
    let sink = got.clone();
    let endpoint = support::otlp_receiver(move |body| {
        let mut g = sink.lock().unwrap();
        g.0.extend_from_slice(&body);
        if let Ok(req) = ExportTraceServiceRequest::decode(body) {
            for rs in req.resource_spans {
                for ss in rs.scope_spans {
                    g.1.extend(ss.spans.into_iter().map(|sp| sp.name));
                }
            }
        }
    })
    .await;
    (endpoint, got)
}

fn gcp_proxy(name: &str, cloud_init: serde_json::Value) -> Proxy {
    support::proxy(
        name,
        json!({"provider": "gcp-eu", "port": 3128, "cloudInit": cloud_init,
            "placement": {"zone": ZONE, "machineType": "e2-micro",
                "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_logs_spans_metrics_status_events_or_api_errors() {
    let ground = support::ground_without_pods("sentinel").await;
    let standin = StandIn::start().await;
    standin.with(|st| st.running_after_gets = 1);
    let (endpoint, exported) = otlp_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let api_addr: SocketAddr = support::loopback();
    let metrics_addr: SocketAddr = support::loopback();
    let providers = standin.providers_yaml();
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--discovery-bind-address", &api_addr.to_string()])
        .args(["--metrics-bind-address", &metrics_addr.to_string()])
        .args(["--gcp-wire-log-full-payloads", "--trace-health-probes"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LOG_LEVEL", "trace")
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    let log_path = dir.path().join("operator.log");
    let mut op = Operator::spawn(cmd, &log_path);

    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ground.api();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "user-data", "labels": {"crawl.example.com/cloud-init": "true"}},
                "stringData": {"user-data": format!("#cloud-config\nwrite_files:\n- content: {IN_SECRET}\n")},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let proxies: Api<Proxy> = ground.proxies();
    for p in [
        gcp_proxy(
            "inline",
            json!({"inline": format!("#cloud-config\nwrite_files:\n- content: {INLINE}\n")}),
        ),
        gcp_proxy(
            "from-secret",
            json!({"secretRef": {"name": "user-data", "key": "user-data"}}),
        ),
    ] {
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    for name in ["inline", "from-secret"] {
        eventually(
            &format!("{name} Running"),
            Duration::from_secs(90),
            || async {
                let p = proxies.get(name).await.ok()?;
                let phase = p.status.as_ref()?.phase?;
                (phase.as_str() == "Running" || phase.as_str() == "Ready").then_some(())
            },
        )
        .await;
    }
    // Both cloud-inits went through the provider: the stand-in got them.
    let bodies: String = standin
        .instance_bodies()
        .iter()
        .map(|b| b.to_string())
        .collect();
    assert!(
        bodies.contains(INLINE) && bodies.contains(IN_SECRET),
        "the stand-in never received the cloud-inits"
    );

    // Each instance's generated password (the probes send it, base64 in
    // Proxy-Authorization, which the sentinel forms cover at any
    // alignment).
    let mut passwords = Vec::new();
    for name in ["inline", "from-secret"] {
        let p = proxies.get(name).await.unwrap();
        let secret = p.status.and_then(|s| s.credentials_secret);
        let secret = secrets
            .get(&secret.expect("credentials generated"))
            .await
            .unwrap();
        let password = &secret.data.as_ref().unwrap()["password"].0;
        passwords.push(String::from_utf8(password.clone()).unwrap());
    }

    // The API, with a wrong token, none, and the right one.
    let mut answers = String::new();
    let wrong = format!("{}x", &TOKEN[..TOKEN.len() - 1]);
    for (method, path, token, body) in [
        ("GET", "/v1/proxies", Some(wrong.as_str()), vec![]),
        ("GET", "/v1/proxies", None, vec![]),
        ("POST", "/v1/leases", Some(wrong.as_str()), b"{}".to_vec()),
        ("GET", "/v1/proxies", Some(TOKEN), vec![]),
        ("POST", "/v1/leases", Some(TOKEN), b"{not json".to_vec()),
        ("GET", "/v1/leases/nope", Some(TOKEN), vec![]),
        ("GET", "/nowhere", Some(TOKEN), vec![]),
    ] {
        let (status, v) = api_call(api_addr, method, path, token, body).await;
        answers.push_str(&format!("{method} {path} {status} {v}\n"));
    }
    assert!(answers.contains("GET /v1/proxies 401"), "{answers}");
    assert!(answers.contains("GET /v1/proxies 200"), "{answers}");
    let (_, metrics) = api_call(metrics_addr, "GET", "/metrics", None, vec![]).await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("proxy_operator_discovery_requests_total"),
        "{metrics}"
    );

    // Spans of both reconciles were exported.
    eventually(
        "reconcile spans exported",
        Duration::from_secs(30),
        || async {
            let g = exported.lock().unwrap();
            (g.1.iter().filter(|n| *n == "Reconcile Proxy").count() >= 2).then_some(())
        },
    )
    .await;
    // SIGTERM flushes the spans of the API requests too.
    let pid = op.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    while op.0.try_wait().unwrap().is_none() {
        // A hang guard, far above the 5 s drain: a stop is judged by its
        // exit status below, its time printed.
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the operator did not stop within 120 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("stopped {:?} after SIGTERM", t.elapsed());

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("TRACE"), "trace logging was on");
    assert!(log.contains("api request"), "the gcp wire log ran");
    let (spans_raw, names) = {
        let g = exported.lock().unwrap();
        (String::from_utf8_lossy(&g.0).into_owned(), g.1.clone())
    };
    println!(
        "log {} bytes, {} spans exported ({} bytes), metrics {} bytes",
        log.len(),
        names.len(),
        spans_raw.len(),
        metrics.len()
    );
    assert!(
        names.iter().any(|n| n.contains("/v1/proxies")),
        "API spans exported: {names:?}"
    );
    // The status only: the spec holds the inline cloud-init, as written.
    let status: String = proxies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| serde_json::to_string(&p.status).unwrap())
        .collect();
    assert!(status.contains("Provisioned"), "{status}");
    let events = ground.kubectl(&["get", "events", "-o", "json"]);
    let events_new = ground.kubectl(&["get", "events.events.k8s.io", "-o", "json"]);
    for (what, text) in [
        ("the trace log", &log),
        ("the exported spans", &spans_raw),
        ("/metrics", &metrics),
        ("the Proxies", &status),
        ("the Events", &events),
        ("the events.k8s.io Events", &events_new),
        ("the API answers", &answers),
    ] {
        assert_eq!(
            leaks(text, &passwords),
            Vec::<String>::new(),
            "a secret in {what}"
        );
    }
}
