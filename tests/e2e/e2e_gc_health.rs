//! System tests of orphan GC, the ProviderHealth objects, the /metrics
//! exposition and tracing export: the real operator binary against the
//! real test cluster (with its node agent), a namespace per test.
//!
//! ProviderHealth objects are cluster-scoped and named after providers, and
//! an operator deletes, at start, the managed ones of providers it does not
//! have: every test names its kubernetes provider after itself, and the
//! tests that assert on ProviderHealth objects hold [`PH_LOCK`] exclusively
//! (the others share it), so no other test's operator starts meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::{eventually, free_port, scrape, Ground, Operator};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// Held exclusively by the tests that assert on ProviderHealth objects,
/// shared by every other test that starts an operator.
/// The providers of the ProviderHealth test: before and after a rename.
const KUBE: &str = "ph-kube";
const K2: &str = "ph-k2";
/// The kubernetes providers of the other tests, one each.
const GC_KUBE: &str = "gc-kube";
const METRICS_KUBE: &str = "metrics-kube";
#[cfg(feature = "kvm")]
const KVM_KUBE: &str = "kvm-kube";

pub(crate) static PH_LOCK: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A providers file with one kubernetes provider named `name`.
fn kube_only(name: &str) -> String {
    format!("providers:\n  - name: {name}\n    type: kubernetes\n")
}

/// A Proxy on the kubernetes provider `provider`, port 3128.
fn proxy(name: &str, provider: &str) -> Proxy {
    support::proxy(name, json!({"provider": provider, "port": 3128}))
}

fn start(
    ground: &Ground,
    providers: &str,
    dir: &Path,
    log_name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Operator {
    let mut cmd: Command = ground.operator(dir, providers);
    cmd.args(args).env("LOG_LEVEL", "info");
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Operator::spawn(cmd, &dir.join(log_name))
}

async fn server(prefix: &str) -> (Ground, tempfile::TempDir, Client) {
    let ground = support::ground(prefix).await;
    let dir = tempfile::tempdir().unwrap();
    let client = ground.client.clone();
    (ground, dir, client)
}

/// The API server URL of the admin kubeconfig, which the operator uses.
fn api_server_url(ground: &Ground) -> String {
    let kc = kube::config::Kubeconfig::read_from(ground.cluster.kubeconfig()).unwrap();
    let server = kc.clusters[0].cluster.as_ref().unwrap().server.clone();
    server.unwrap().trim_end_matches('/').to_string()
}

fn ready_of(ph: &ProviderHealth) -> Option<(String, String)> {
    let s = ph.status.as_ref()?;
    let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((
        c.status.as_str().to_string(),
        s.targets_ready.clone().unwrap_or_default(),
    ))
}

async fn ph_ready(api: &Api<ProviderHealth>, name: &str) -> Option<(String, String)> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|p| ready_of(&p))
}

fn labelled_ph(name: &str, managed: bool) -> ProviderHealth {
    let mut o = ProviderHealth::new(name);
    if managed {
        o.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            "egress-proxies-operator".to_string(),
        )]));
    }
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_health_is_published_restored_and_cleaned_up() {
    let _exclusive = PH_LOCK.write().await;
    let (server, dir, client) = server("ph").await;
    let ph: Api<ProviderHealth> = Api::all(client.clone());
    let pp = PostParams::default();
    ph.create(&pp, &labelled_ph("retired", true)).await.unwrap();
    ph.create(&pp, &labelled_ph("foreign", false))
        .await
        .unwrap();

    let t0 = Instant::now();
    let op = start(&server, &kube_only(KUBE), dir.path(), "op1.log", &[], &[]);
    let got = eventually(
        "ProviderHealth ph-kube Ready",
        Duration::from_secs(30),
        || ph_ready(&ph, KUBE),
    )
    .await;
    assert_eq!(got, ("True".to_string(), "1/1".to_string()));
    println!("ProviderHealth ph-kube Ready after {:?}", t0.elapsed());
    let obj = ph.get(KUBE).await.unwrap();
    assert_eq!(
        obj.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("egress-proxies-operator")
    );
    let status = obj.status.unwrap();
    assert_eq!(status.type_.as_deref(), Some("kubernetes"));
    assert_eq!(status.targets[0].name, "apiserver");
    assert_eq!(status.targets[0].reason.as_deref(), Some("Reachable"));
    // The address is the API server the operator talks to.
    assert_eq!(
        status.targets[0]
            .address
            .as_deref()
            .map(|a| a.trim_end_matches('/')),
        Some(api_server_url(&server).as_str())
    );
    assert!(
        ph.get_opt("retired").await.unwrap().is_none(),
        "unconfigured, labelled: deleted"
    );
    assert!(
        ph.get_opt("foreign").await.unwrap().is_some(),
        "unlabelled: kept"
    );

    let text = server.cluster.kubectl_ok(&["get", "ph"]);
    println!("{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{KUBE} ")))
        .unwrap_or_else(|| panic!("no {KUBE} row: {text}"));
    assert!(line.contains("True") && line.contains("1/1"), "{line}");

    // Deleted: back within 5 s, long before the next 1m round.
    ph.delete(KUBE, &DeleteParams::default()).await.unwrap();
    let t = Instant::now();
    eventually(
        "ProviderHealth ph-kube restored",
        Duration::from_secs(5),
        || ph_ready(&ph, KUBE),
    )
    .await;
    println!("restored after {:?}", t.elapsed());

    // Edited: the operator's view wins again within 5 s.
    let edit = serde_json::json!({"status": {"targetsReady": "0/9", "conditions": []}});
    ph.patch_status(
        KUBE,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&edit),
    )
    .await
    .unwrap();
    eventually(
        "ProviderHealth ph-kube repaired",
        Duration::from_secs(5),
        || async {
            (ph_ready(&ph, KUBE).await? == ("True".to_string(), "1/1".to_string())).then_some(())
        },
    )
    .await;
    drop(op);

    // The provider leaves the config: its object goes at the next start.
    let renamed = kube_only(K2);
    let op = start(&server, &renamed, dir.path(), "op2.log", &[], &[]);
    eventually(
        "ph-kube deleted, ph-k2 written",
        Duration::from_secs(30),
        || async {
            let gone = ph.get_opt(KUBE).await.ok()?.is_none();
            (gone && ph_ready(&ph, K2).await.is_some()).then_some(())
        },
    )
    .await;
    drop(op);

    // Checks off: every managed object goes, the foreign one stays.
    let op = start(
        &server,
        &renamed,
        dir.path(),
        "op3.log",
        &["--provider-check-interval", "0"],
        &[],
    );
    eventually("ph-k2 deleted", Duration::from_secs(30), || async {
        ph.get_opt(K2).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(ph.get_opt("foreign").await.unwrap().is_some());
    let log = std::fs::read_to_string(dir.path().join("op3.log")).unwrap();
    assert!(log.contains("Provider checks are off"), "{log}");
    drop(op);
}

fn marked_pod(name: &str, uid: Option<&str>, installation: &str) -> Pod {
    let mut labels = serde_json::Map::new();
    labels.insert("proxy-operator-managed".into(), json!("true"));
    labels.insert("proxy-operator-installation".into(), json!(installation));
    if let Some(uid) = uid {
        labels.insert("proxy-operator-uid".into(), json!(uid));
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        // No node matches: the scheduler leaves it Pending (and, never
        // bound, it goes at once when deleted).
        "spec": {"nodeSelector": {"example.com/no-such-node": "true"},
                 "containers": [{"name": "c", "image": "none"}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_only_this_installations_orphans() {
    let _shared = PH_LOCK.read().await;
    let (server, dir, client) = server("gc").await;
    let pods: Api<Pod> = server.api();
    let proxies: Api<Proxy> = server.proxies();
    // GC lists marked Pods in every namespace: installation ids of this
    // test's own (the operators of parallel tests have theirs).
    let inst_a = format!("{}-a", server.ns);
    let inst_b = format!("{}-b", server.ns);
    let pp = PostParams::default();
    // A live Proxy on a provider that is not configured: nothing else
    // creates its instance, so the Pod below is only protected by its UID.
    let live: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "live"},
        "spec": {"provider": "elsewhere", "port": 3128},
    }))
    .unwrap();
    let live_uid = proxies.create(&pp, &live).await.unwrap().uid().unwrap();
    for pod in [
        marked_pod("orphan", Some("gone-uid"), &inst_a),
        marked_pod("theirs", Some("gone-uid-2"), &inst_b),
        marked_pod("unowned", None, &inst_a),
        marked_pod("owned", Some(&live_uid), &inst_a),
    ] {
        pods.create(&pp, &pod).await.unwrap();
    }
    let t0 = Instant::now();
    let metrics = format!("127.0.0.1:{}", free_port());
    let _op = start(
        &server,
        &kube_only(GC_KUBE),
        dir.path(),
        "op.log",
        &[
            "--installation-id",
            &inst_a,
            "--gc-interval",
            "2s",
            "--gc-min-age",
            "2s",
            "--metrics-bind-address",
            &metrics,
        ],
        &[],
    );
    eventually("orphan deleted", Duration::from_secs(20), || async {
        pods.get_opt("orphan").await.ok()?.is_none().then_some(())
    })
    .await;
    println!("orphan deleted after {:?}", t0.elapsed());
    // Two more sweeps: the others stay.
    let ok_sweeps = || async { support::sample(&scrape(&metrics).await?, OK_SWEEPS) };
    let before = ok_sweeps().await.unwrap_or(0.0);
    eventually("two more GC sweeps", Duration::from_secs(20), || async {
        (ok_sweeps().await? >= before + 2.0).then_some(())
    })
    .await;
    for name in ["theirs", "unowned", "owned"] {
        assert!(
            pods.get_opt(name).await.unwrap().is_some(),
            "{name} must never be collected"
        );
    }
    // One OrphansCollected Event on the provider's ProviderHealth (its
    // Events are in `default`, the object being cluster-scoped).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let collected = eventually(
        "OrphansCollected Event",
        Duration::from_secs(20),
        || async {
            let list = events.list(&Default::default()).await.ok()?.items;
            let found: Vec<String> = list
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(GC_KUBE)
                        && e.reason.as_deref() == Some("OrphansCollected")
                })
                .filter_map(|e| e.note)
                .collect();
            (!found.is_empty()).then_some(found)
        },
    )
    .await;
    assert_eq!(collected.len(), 1, "{collected:?}");
    assert!(
        collected[0].starts_with("deleted 1 orphaned instance: ")
            && collected[0].contains("orphan"),
        "{collected:?}"
    );
    let log = std::fs::read_to_string(dir.path().join("op.log")).unwrap();
    assert!(log.contains("Deleted orphaned instance"), "{log}");
    assert_eq!(log.matches("Deleted orphaned instance").count(), 1, "{log}");
    // The GC series count the same: one delete, ok sweeps, no errors.
    let body = scrape(&metrics).await.expect("a scrape");
    for want in [
        "proxy_operator_gc_deleted_total{provider=\"gc-kube\"} 1\n",
        "proxy_operator_gc_delete_failures_total{provider=\"gc-kube\"} 0\n",
        "proxy_operator_gc_sweeps_total{provider=\"gc-kube\",result=\"error\"} 0\n",
        "proxy_operator_gc_last_success_timestamp_seconds{provider=\"gc-kube\"} ",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    let ok = support::sample(&body, OK_SWEEPS).unwrap_or_else(|| panic!("no ok sweeps in\n{body}"));
    assert!(ok >= 2.0, "{ok} ok sweeps in\n{body}");
}

const OK_SWEEPS: &str = "proxy_operator_gc_sweeps_total{provider=\"gc-kube\",result=\"ok\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_metrics_pass_promtool_and_carry_every_series() {
    support::require_squid_pods();
    let _shared = PH_LOCK.read().await;
    let (server, dir, _client) = server("metrics").await;
    let addr = format!("127.0.0.1:{}", free_port());
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let before_start = unix_now();
    let _op = start(
        &server,
        &kube_only(METRICS_KUBE),
        dir.path(),
        "op.log",
        &["--metrics-bind-address", &addr],
        &[],
    );
    let proxies: Api<Proxy> = server.proxies();
    proxies
        .create(&PostParams::default(), &proxy("m1", METRICS_KUBE))
        .await
        .unwrap();
    let body = eventually("a full scrape", Duration::from_secs(40), || async {
        let b = scrape(&addr).await?;
        let done = b.contains("proxy_operator_provider_target_up{")
            && b.contains("op=\"create\"")
            && b.contains("proxy_operator_proxies{phase=\"Running\",provider=\"metrics-kube\"} 1")
            // The create limiter lets the create go once a pass has seen
            // the Pod run; under load that pass can trail the phase.
            && b.contains("proxy_operator_creates_in_flight{provider=\"metrics-kube\"} 0");
        done.then_some(b)
    })
    .await;
    for want in [
        "# TYPE proxy_operator_proxies gauge",
        "proxy_operator_proxies{phase=\"Provisioning\",provider=\"metrics-kube\"} 0",
        // Build info and the process series, read from /proc at the scrape.
        "proxy_operator_build_info{version=\"",
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "# TYPE proxy_operator_leases_active gauge",
        "proxy_operator_leases_active 0",
        "proxy_operator_provider_requests_total{provider=\"metrics-kube\",op=\"create\",result=\"ok\"} ",
        "proxy_operator_provider_request_duration_seconds_bucket{",
        "proxy_operator_provider_target_up{provider=\"metrics-kube\",target=\"apiserver\"} 1",
        "proxy_operator_provider_check_duration_seconds{provider=\"metrics-kube\",target=\"apiserver\"}",
        "proxy_operator_provider_check_timestamp_seconds{provider=\"metrics-kube\",target=\"apiserver\"}",
        "# HELP proxy_operator_provider_target_up Whether the target passed its latest provider health check (1) or not (0).",
        "proxy_operator_reconcile_total{controller=\"proxy\",result=\"success\"}",
        "proxy_operator_reconcile_total{controller=\"providerhealth\",result=\"success\"}",
        "proxy_operator_reconcile_duration_seconds_count{controller=\"proxy\"}",
        // The create limiter: the one create is over (its Pod runs).
        "proxy_operator_create_tokens{provider=\"metrics-kube\"} ",
        "proxy_operator_creates_in_flight{provider=\"metrics-kube\"} 0",
        "proxy_operator_creates_waiting{provider=\"metrics-kube\"} 0",
        // GC (default interval 10m) has not swept yet: its counters are 0.
        "proxy_operator_gc_sweeps_total{provider=\"metrics-kube\",result=\"ok\"} 0",
        "proxy_operator_gc_deleted_total{provider=\"metrics-kube\"} 0",
    ] {
        assert!(body.contains(want), "missing {want} in\n{body}");
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install it (Debian/Ubuntu: apt-get install prometheus)"
            )
        });
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The process series describe the operator's process, not a constant.
    let value = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} sample in\n{body}"))
            .parse()
            .unwrap()
    };
    let started = value("process_start_time_seconds");
    // /proc/stat's btime is whole seconds: allow one second either way.
    assert!(
        started > before_start - 1.0 && started < unix_now() + 1.0,
        "start time {started} outside [{before_start}, now]"
    );
    assert!(value("process_resident_memory_bytes") > 1_000_000.0);
    let (open, max) = (value("process_open_fds"), value("process_max_fds"));
    assert!(open >= 3.0 && open <= max, "open fds {open}, max {max}");
    // It served and reconciled: it used CPU.
    assert!(value("process_cpu_seconds_total") > 0.0);
    // No OTEL_* set: no exporter, no trace keys on any line.
    let log = std::fs::read_to_string(dir.path().join("op.log")).unwrap();
    assert!(log.contains("tracing disabled"), "{log}");
    assert!(!log.contains("traceID"), "{log}");
    assert!(!log.contains("tracing enabled"), "{log}");
}

/// The operator exporting to the test process's Jaeger over OTLP/HTTP
/// every 200 ms as `service`, with `args`, and a Proxy `name` created on
/// its kubernetes provider `provider`.
async fn traced_proxy(
    name: &str,
    provider: &str,
    service: &str,
    args: &[&str],
) -> (Ground, tempfile::TempDir, Operator) {
    let otel = support::otel_to_jaeger("http/protobuf", service);
    let (server, dir, _client) = server(name).await;
    let env: Vec<(&str, &str)> = otel.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let op = start(
        &server,
        &kube_only(provider),
        dir.path(),
        "op.log",
        args,
        &env,
    );
    let proxies: Api<Proxy> = server.proxies();
    proxies
        .create(&PostParams::default(), &proxy(name, provider))
        .await
        .unwrap();
    (server, dir, op)
}

/// Exported over OTLP/HTTP to Jaeger: the trace id on the operator's
/// "Instance created" line finds, through Jaeger's query API, the Proxy's
/// reconcile trace: a root `Reconcile Proxy` span naming the Proxy, with
/// `provider.create` below it and the Pod POST (a Kubernetes client span)
/// below that. The service's traces also hold the provider checks, and
/// no Kubernetes client span is a root of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_life_is_one_reconcile_trace_with_correlated_logs() {
    support::require_squid_pods();
    let _shared = PH_LOCK.read().await;
    const SERVICE: &str = "epo-trace-life";
    let (server, dir, _op) = traced_proxy("t1", "trace-kube", SERVICE, &[]).await;
    let t0 = Instant::now();
    let line = eventually(
        "an Instance created line with a trace id",
        Duration::from_secs(40),
        || async {
            let log = std::fs::read_to_string(dir.path().join("op.log")).ok()?;
            let l = log.lines().find(|l| l.contains("Instance created"))?;
            Some(l.to_string())
        },
    )
    .await;
    println!("{line}");
    let trace_id = support::trace_id_of(&line).unwrap_or_else(|| panic!("no traceID: {line}"));
    let trace =
        support::creating_reconcile_trace(&trace_id, SERVICE, &server.ns, "t1", "trace-kube").await;
    println!(
        "trace {trace_id} found in Jaeger after {:?}: {} spans",
        t0.elapsed(),
        trace.spans.len()
    );
    let jaeger = support::jaeger();
    // The provider checks are traced too, as the service's own traces.
    jaeger
        .wait_find(
            SERVICE,
            "providerhealth.check",
            Duration::from_secs(20),
            |f| !f.is_empty(),
        )
        .await;
    // Kubernetes client spans only as children (no watch or informer roots).
    let all = jaeger.find(SERVICE, "").await.unwrap();
    let clients: Vec<_> = all
        .iter()
        .flat_map(|t| &t.spans)
        .filter(|s| s.tags.contains_key("http.method"))
        .collect();
    assert!(!clients.is_empty(), "no client span in {all:#?}");
    for s in clients {
        assert!(s.parent.is_some(), "parentless client span {s:?}");
    }
    let log = std::fs::read_to_string(dir.path().join("op.log")).unwrap();
    assert!(log.contains("tracing enabled"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_carry_trace_ids_as_keys() {
    support::require_squid_pods();
    let _shared = PH_LOCK.read().await;
    let (_server, dir, _op) = traced_proxy(
        "j1",
        "json-kube",
        "epo-trace-json",
        &["--log-format", "json"],
    )
    .await;
    let line: serde_json::Value = eventually(
        "a JSON Instance created line",
        Duration::from_secs(30),
        || async {
            let log = std::fs::read_to_string(dir.path().join("op.log")).ok()?;
            let l = log.lines().find(|l| l.contains("Instance created"))?;
            serde_json::from_str(l).ok()
        },
    )
    .await;
    let trace_id = line["traceID"].as_str().expect("traceID key").to_string();
    let span_id = line["spanID"].as_str().expect("spanID key").to_string();
    assert_eq!(span_id.len(), 16, "{line}");
    // The line's trace and span are in Jaeger: the span it was logged in
    // is part of the Proxy's reconcile trace.
    let trace = support::jaeger()
        .wait_trace(&trace_id, Duration::from_secs(20), |t| {
            t.span(&span_id).is_some() && t.named("Reconcile Proxy").next().is_some()
        })
        .await;
    let root = trace.named("Reconcile Proxy").next().unwrap();
    assert_eq!(
        root.tag("k8s.object.name").as_deref(),
        Some("j1"),
        "{root:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_flushed_on_sigterm() {
    let _shared = PH_LOCK.read().await;
    const SERVICE: &str = "epo-trace-sigterm";
    let mut otel = support::otel_to_jaeger("http/protobuf", SERVICE);
    // Nothing is exported on schedule within this test.
    otel.push(("OTEL_BSP_SCHEDULE_DELAY", "600000".to_string()));
    let env: Vec<(&str, &str)> = otel.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (server, dir, _client) = server("sigterm").await;
    let mut op = start(
        &server,
        &kube_only("sigterm-kube"),
        dir.path(),
        "op.log",
        &[],
        &env,
    );
    // The first provider check round runs at start.
    eventually(
        "the first round logged",
        Duration::from_secs(20),
        || async {
            let log = std::fs::read_to_string(dir.path().join("op.log")).ok()?;
            log.contains("Created ProviderHealth").then_some(())
        },
    )
    .await;
    let jaeger = support::jaeger();
    let before = jaeger.find(SERVICE, "").await.unwrap();
    assert!(before.is_empty(), "exported before shutdown: {before:#?}");
    let pid = op.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = op.0.try_wait().unwrap() {
            break s;
        }
        // A hang guard, far above the 5 s drain: a stop is judged by its
        // exit status below, its time printed.
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the operator did not stop within 120 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    println!("stopped after {:?}", t.elapsed());
    // Exported before the exit: Jaeger stores them within its batch time.
    jaeger
        .wait_find(
            SERVICE,
            "providerhealth.check",
            Duration::from_secs(10),
            |f| !f.is_empty(),
        )
        .await;
}

/// A kvm provider whose only host refuses SSH: its ProviderHealth reads
/// False 0/1 with reason Unreachable, and the gauges say the same.
#[cfg(feature = "kvm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_kvm_host_is_reported_in_the_object_and_the_gauges() {
    let _exclusive = PH_LOCK.write().await;
    let (server, dir, client) = server("kvm").await;
    // Real key material, so the verdict is about the host, not the files.
    let key = dir.path().join("id_ed25519");
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status();
    assert!(
        keygen.is_ok_and(|s| s.success()),
        "ssh-keygen must run (Debian: apt-get install openssh-client)"
    );
    let known = dir.path().join("known_hosts");
    std::fs::write(&known, "").unwrap();
    // A port nothing listens on: connections are refused at once.
    let refused = free_port();
    let providers = format!(
        "{}  - name: kvm-home
    type: kvm
    kvm:
      sshKeyFile: {}
      knownHostsFile: {}
      images: {{}}
      machineTypes:
        small: {{vcpus: 1, memoryMiB: 512}}
      hosts:
        - {{name: nas1, address: \"127.0.0.1:{refused}\", user: virt, bridge: br0}}
",
        kube_only(KVM_KUBE),
        key.display(),
        known.display()
    );
    let addr = format!("127.0.0.1:{}", free_port());
    let _op = start(
        &server,
        &providers,
        dir.path(),
        "op.log",
        &["--metrics-bind-address", &addr],
        &[],
    );
    let phs: Api<ProviderHealth> = Api::all(client.clone());
    let ph = eventually("kvm-home checked", Duration::from_secs(40), || async {
        let ph = phs.get_opt("kvm-home").await.ok()??;
        ph.status.as_ref()?.last_check_time?;
        Some(ph)
    })
    .await;
    assert_eq!(
        ready_of(&ph),
        Some(("False".to_string(), "0/1".to_string()))
    );
    let target = &ph.status.as_ref().unwrap().targets[0];
    assert_eq!(target.name, "nas1");
    assert!(!target.ready);
    assert_eq!(target.reason.as_deref(), Some("Unreachable"), "{target:?}");
    // The kubernetes provider next to it is unaffected (its object is
    // written by the same round, but not necessarily first).
    eventually(
        "kubernetes ready next to it",
        Duration::from_secs(20),
        || async { (ph_ready(&phs, KVM_KUBE).await?.0 == "True").then_some(()) },
    )
    .await;
    let body = eventually("the gauges", Duration::from_secs(20), || async {
        let b = scrape(&addr).await?;
        b.contains("proxy_operator_provider_target_up{provider=\"kvm-home\"")
            .then_some(b)
    })
    .await;
    assert!(
        body.contains("proxy_operator_provider_target_up{provider=\"kvm-home\",target=\"nas1\"} 0"),
        "{body}"
    );
    assert!(
        body.contains(
            "proxy_operator_provider_target_up{provider=\"kvm-kube\",target=\"apiserver\"} 1"
        ),
        "{body}"
    );
}
