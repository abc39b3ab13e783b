//! Tracing export over OTLP/gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`): a
//! real gRPC collector endpoint (tonic serving opentelemetry-proto's
//! TraceService on 127.0.0.1) receives the operator's spans; and with the
//! collector unreachable the operator still reconciles a Proxy to Ready.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use kube::api::PostParams;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use crate::support::{self, eventually, free_port, phase, Ground, Operator};

/// Exported spans as (service.name, span name).
type Received = Arc<Mutex<Vec<(String, String)>>>;

struct Collector(Received);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                got.extend(ss.spans.into_iter().map(|s| (service.clone(), s.name)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A gRPC trace collector on 127.0.0.1, served on the test's runtime (it
/// stops with the test); answers once it listens.
async fn collector() -> (SocketAddr, Received) {
    let got = Received::default();
    let addr: SocketAddr = support::loopback();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(Collector(got.clone())))
        .serve(addr);
    tokio::spawn(server);
    eventually(
        "the collector listening",
        Duration::from_secs(10),
        || async { tokio::net::TcpStream::connect(addr).await.ok() },
    )
    .await;
    (addr, got)
}

/// The operator exporting over gRPC to `endpoint`, probing External
/// Proxies at `target`.
fn operator(
    ground: &Ground,
    dir: &std::path::Path,
    endpoint: &str,
    target: SocketAddr,
) -> Operator {
    let mut cmd = ground.operator(
        dir,
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
    );
    cmd.args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LOG_LEVEL", "info")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        // An unreachable collector fails each export after this long.
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "1000");
    Operator::spawn(cmd, &dir.join("operator.log"))
}

/// An External Proxy whose endpoint is the local HTTP target (it answers
/// the proxied probe), so it turns Ready without any Pod.
fn external(name: &str, target: SocketAddr) -> Proxy {
    support::proxy(
        name,
        serde_json::json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": target.port()}}),
    )
}

async fn ready(ground: &Ground, name: &str) {
    let proxies = ground.proxies();
    eventually(
        &format!("Proxy {name} Ready"),
        Duration::from_secs(60),
        || async { (phase(&proxies.get(name).await.ok()?) == Some("Ready")).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_collector_receives_the_operators_spans() {
    let ground = support::ground_without_pods("otlp-grpc").await;
    let target = support::http_target().await;
    let (addr, got) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(&ground, dir.path(), &format!("http://{addr}"), target);
    ground
        .proxies()
        .create(&PostParams::default(), &external("ext", target))
        .await
        .unwrap();
    ready(&ground, "ext").await;
    let spans = eventually(
        "a Reconcile Proxy span at the gRPC collector",
        Duration::from_secs(30),
        || async {
            let g = got.lock().unwrap().clone();
            g.iter().any(|(_, n)| n == "Reconcile Proxy").then_some(g)
        },
    )
    .await;
    println!("spans received over gRPC: {}", spans.len());
    assert!(
        spans
            .iter()
            .all(|(service, _)| service.contains("egress-proxies-operator")),
        "every span carries the service name: {spans:?}"
    );
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap();
    assert!(log.contains("otlp/grpc"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_grpc_collector_never_stops_the_operator() {
    let ground = support::ground_without_pods("otlp-down").await;
    let target = support::http_target().await;
    // Nothing listens here.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let mut op = operator(&ground, dir.path(), &endpoint, target);
    let proxies = ground.proxies();
    proxies
        .create(&PostParams::default(), &external("first", target))
        .await
        .unwrap();
    // Exports every 200 ms have been failing all the while the first
    // Proxy turned Ready; the operator goes on reconciling.
    ready(&ground, "first").await;
    proxies
        .create(&PostParams::default(), &external("second", target))
        .await
        .unwrap();
    ready(&ground, "second").await;
    assert!(
        op.0.try_wait().unwrap().is_none(),
        "the operator still runs"
    );
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap();
    assert!(log.contains("otlp/grpc"), "{log}");
}
