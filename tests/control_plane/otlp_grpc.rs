//! Tracing export over OTLP/gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) to
//! a real trace backend (the test process's Jaeger, whose OTLP/gRPC
//! receiver is on 127.0.0.1): a Proxy's reconcile trace is found by its
//! trace id through Jaeger's query API; and with the collector
//! unreachable the operator still reconciles a Proxy to Ready.

use std::net::SocketAddr;
use std::time::Duration;

use egress_proxies_operator::api::constants::OPERATOR_NAME;
use egress_proxies_operator::api::Proxy;
use kube::api::PostParams;

use crate::support::{self, eventually, free_port, phase, Ground, Operator};

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

/// Exported over gRPC to Jaeger with the default service name: the
/// External Proxy's reconcile traces are found by service, operation and
/// the Proxy's name; a kubernetes Proxy's creating reconcile (its Pod is
/// never run: no node agent) is found by the trace id on its "Instance
/// created" line, whole: the reconcile, `provider.create` and the Pod
/// POST below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_reconcile_trace_exported_over_grpc_is_found_in_jaeger() {
    let ground = support::ground_without_pods("otlp-grpc").await;
    let target = support::http_target().await;
    let jaeger = support::jaeger();
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(&ground, dir.path(), &jaeger.endpoint("grpc"), target);
    let proxies = ground.proxies();
    proxies
        .create(&PostParams::default(), &external("ext", target))
        .await
        .unwrap();
    ready(&ground, "ext").await;
    let of_ext = |t: &support::Trace| {
        t.named("Reconcile Proxy").any(|r| {
            r.parent.is_none()
                && r.tag("k8s.object.name").as_deref() == Some("ext")
                && r.tag("k8s.namespace.name").as_deref() == Some(ground.ns.as_str())
        })
    };
    let found = jaeger
        .wait_find(
            OPERATOR_NAME,
            "Reconcile Proxy",
            Duration::from_secs(30),
            |f| f.iter().any(of_ext),
        )
        .await;
    let id = &found.iter().find(|t| of_ext(t)).unwrap().id;
    let ext = jaeger
        .trace(id)
        .await
        .unwrap()
        .expect("the trace by its id");
    assert!(of_ext(&ext), "{ext:#?}");
    assert!(
        ext.spans.iter().all(|s| s.service == OPERATOR_NAME),
        "every span carries the service name: {ext:#?}"
    );
    println!(
        "External Proxy's reconcile trace {id}: {} spans",
        ext.spans.len()
    );

    proxies
        .create(&PostParams::default(), &support::kube_proxy("pod"))
        .await
        .unwrap();
    let line = eventually(
        "an Instance created line",
        Duration::from_secs(30),
        || async {
            let log = std::fs::read_to_string(dir.path().join("operator.log")).ok()?;
            let l = log.lines().find(|l| l.contains("Instance created"))?;
            Some(l.to_string())
        },
    )
    .await;
    let trace_id = support::trace_id_of(&line).unwrap_or_else(|| panic!("no traceID: {line}"));
    support::creating_reconcile_trace(&trace_id, OPERATOR_NAME, &ground.ns, "pod", "kubernetes")
        .await;
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
