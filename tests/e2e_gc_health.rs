//! System tests of orphan GC, the ProviderHealth objects, the /metrics
//! exposition and tracing export: the real operator binary against the
//! Kubernetes test API server (kubelet on) on loopback.

mod support;

use support::{eventually, free_port, kube_proxy as proxy, squid_present, Operator};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use test_apiserver::TestApiServer;

const KUBE_ONLY: &str = "providers:\n  - name: kubernetes\n    type: kubernetes\n";

fn start(
    server: &TestApiServer,
    providers: &str,
    dir: &Path,
    log_name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Operator {
    let mut cmd: Command = support::operator(dir, providers, server.kubeconfig_path());
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

async fn server() -> (TestApiServer, tempfile::TempDir, Client) {
    let server = support::api_server(true).await;
    let dir = tempfile::tempdir().unwrap();
    let client = server.client();
    (server, dir, client)
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
    let (server, dir, client) = server().await;
    let ph: Api<ProviderHealth> = Api::all(client.clone());
    let pp = PostParams::default();
    ph.create(&pp, &labelled_ph("retired", true)).await.unwrap();
    ph.create(&pp, &labelled_ph("foreign", false))
        .await
        .unwrap();

    let t0 = Instant::now();
    let op = start(&server, KUBE_ONLY, dir.path(), "op1.log", &[], &[]);
    let got = eventually(
        "ProviderHealth kubernetes Ready",
        Duration::from_secs(30),
        || ph_ready(&ph, "kubernetes"),
    )
    .await;
    assert_eq!(got, ("True".to_string(), "1/1".to_string()));
    println!("ProviderHealth kubernetes Ready after {:?}", t0.elapsed());
    let obj = ph.get("kubernetes").await.unwrap();
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
        Some(server.url().as_str())
    );
    assert!(
        ph.get_opt("retired").await.unwrap().is_none(),
        "unconfigured, labelled: deleted"
    );
    assert!(
        ph.get_opt("foreign").await.unwrap().is_some(),
        "unlabelled: kept"
    );

    if Path::new("/usr/bin/kubectl").exists() {
        let out = Command::new("/usr/bin/kubectl")
            .args(["get", "ph"])
            .env("KUBECONFIG", server.kubeconfig_path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("kubernetes"))
            .unwrap_or_else(|| {
                panic!(
                    "no kubernetes row: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert!(line.contains("True") && line.contains("1/1"), "{line}");
    } else {
        println!("SKIP kubectl get ph: /usr/bin/kubectl is not installed");
    }

    // Deleted: back within 5 s, long before the next 1m round.
    ph.delete("kubernetes", &DeleteParams::default())
        .await
        .unwrap();
    let t = Instant::now();
    eventually(
        "ProviderHealth kubernetes restored",
        Duration::from_secs(5),
        || ph_ready(&ph, "kubernetes"),
    )
    .await;
    println!("restored after {:?}", t.elapsed());

    // Edited: the operator's view wins again within 5 s.
    let edit = serde_json::json!({"status": {"targetsReady": "0/9", "conditions": []}});
    ph.patch_status(
        "kubernetes",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&edit),
    )
    .await
    .unwrap();
    eventually(
        "ProviderHealth kubernetes repaired",
        Duration::from_secs(5),
        || async {
            (ph_ready(&ph, "kubernetes").await? == ("True".to_string(), "1/1".to_string()))
                .then_some(())
        },
    )
    .await;
    drop(op);

    // The provider leaves the config: its object goes at the next start.
    let renamed = "providers:\n  - name: k2\n    type: kubernetes\n";
    let op = start(&server, renamed, dir.path(), "op2.log", &[], &[]);
    eventually(
        "kubernetes deleted, k2 written",
        Duration::from_secs(30),
        || async {
            let gone = ph.get_opt("kubernetes").await.ok()?.is_none();
            (gone && ph_ready(&ph, "k2").await.is_some()).then_some(())
        },
    )
    .await;
    drop(op);

    // Checks off: every managed object goes, the foreign one stays.
    let op = start(
        &server,
        renamed,
        dir.path(),
        "op3.log",
        &["--provider-check-interval", "0"],
        &[],
    );
    eventually("k2 deleted", Duration::from_secs(30), || async {
        ph.get_opt("k2").await.ok()?.is_none().then_some(())
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
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        // No SQUID_CONF: the test kubelet leaves it Pending.
        "spec": {"containers": [{"name": "c", "image": "none"}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_only_this_installations_orphans() {
    let (server, dir, client) = server().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    // A live Proxy on a provider that is not configured: nothing else
    // creates its instance, so the Pod below is only protected by its UID.
    let live: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "live", "namespace": "default"},
        "spec": {"provider": "elsewhere", "port": 3128},
    }))
    .unwrap();
    let live_uid = proxies.create(&pp, &live).await.unwrap().uid().unwrap();
    for pod in [
        marked_pod("orphan", Some("gone-uid"), "inst-a"),
        marked_pod("theirs", Some("gone-uid-2"), "inst-b"),
        marked_pod("unowned", None, "inst-a"),
        marked_pod("owned", Some(&live_uid), "inst-a"),
    ] {
        pods.create(&pp, &pod).await.unwrap();
    }
    let t0 = Instant::now();
    let metrics = format!("127.0.0.1:{}", free_port());
    let _op = start(
        &server,
        KUBE_ONLY,
        dir.path(),
        "op.log",
        &[
            "--installation-id",
            "inst-a",
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
    tokio::time::sleep(Duration::from_secs(5)).await;
    for name in ["theirs", "unowned", "owned"] {
        assert!(
            pods.get_opt(name).await.unwrap().is_some(),
            "{name} must never be collected"
        );
    }
    let log = std::fs::read_to_string(dir.path().join("op.log")).unwrap();
    assert!(log.contains("Deleted orphaned instance"), "{log}");
    assert_eq!(log.matches("Deleted orphaned instance").count(), 1, "{log}");
    // The GC series count the same: one delete, ok sweeps, no errors.
    let body = scrape(&metrics).await.expect("a scrape");
    for want in [
        "proxy_operator_gc_deleted_total{provider=\"kubernetes\"} 1\n",
        "proxy_operator_gc_delete_failures_total{provider=\"kubernetes\"} 0\n",
        "proxy_operator_gc_sweeps_total{provider=\"kubernetes\",result=\"error\"} 0\n",
        "proxy_operator_gc_last_success_timestamp_seconds{provider=\"kubernetes\"} ",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    let ok_sweeps: u64 = body
        .lines()
        .find_map(|l| {
            l.strip_prefix("proxy_operator_gc_sweeps_total{provider=\"kubernetes\",result=\"ok\"} ")
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ok sweeps in\n{body}"));
    assert!(ok_sweeps >= 2, "{ok_sweeps} ok sweeps in\n{body}");
}

async fn scrape(addr: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8(buf).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_metrics_pass_promtool_and_carry_every_series() {
    let (server, dir, client) = server().await;
    let addr = format!("127.0.0.1:{}", free_port());
    let _op = start(
        &server,
        KUBE_ONLY,
        dir.path(),
        "op.log",
        &["--metrics-bind-address", &addr],
        &[],
    );
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    proxies
        .create(&PostParams::default(), &proxy("m1"))
        .await
        .unwrap();
    let want_running = squid_present();
    let body = eventually("a full scrape", Duration::from_secs(40), || async {
        let b = scrape(&addr).await?;
        let done = b.contains("proxy_operator_provider_target_up{")
            && b.contains("op=\"create\"")
            && (!want_running || b.contains("proxy_operator_proxies{phase=\"Running\"} 1"));
        done.then_some(b)
    })
    .await;
    for want in [
        "# TYPE proxy_operator_proxies gauge",
        "proxy_operator_proxies{phase=\"Provisioning\"}",
        "# TYPE proxy_operator_leases_active gauge",
        "proxy_operator_leases_active 0",
        "proxy_operator_provider_requests_total{provider=\"kubernetes\",op=\"create\",result=\"ok\"} ",
        "proxy_operator_provider_request_duration_seconds_bucket{",
        "proxy_operator_provider_target_up{provider=\"kubernetes\",target=\"apiserver\"} 1",
        "proxy_operator_provider_check_duration_seconds{provider=\"kubernetes\",target=\"apiserver\"}",
        "proxy_operator_provider_check_timestamp_seconds{provider=\"kubernetes\",target=\"apiserver\"}",
        "# HELP proxy_operator_provider_target_up Whether the target passed its latest provider health check (1) or not (0).",
        "proxy_operator_reconcile_total{controller=\"proxy\",result=\"success\"}",
        "proxy_operator_reconcile_total{controller=\"providerhealth\",result=\"success\"}",
        "proxy_operator_reconcile_duration_seconds_count{controller=\"proxy\"}",
        // GC (default interval 10m) has not swept yet: its counters are 0.
        "proxy_operator_gc_sweeps_total{provider=\"kubernetes\",result=\"ok\"} 0",
        "proxy_operator_gc_deleted_total{provider=\"kubernetes\"} 0",
    ] {
        assert!(body.contains(want), "missing {want} in\n{body}");
    }
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Err(_) => {
            println!("SKIP promtool check: promtool is not installed (Debian package prometheus)")
        }
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics failed:\n{}{}\n{body}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // No OTEL_* set: no exporter, no trace keys on any line.
    let log = std::fs::read_to_string(dir.path().join("op.log")).unwrap();
    assert!(log.contains("tracing disabled"), "{log}");
    assert!(!log.contains("traceID"), "{log}");
    assert!(!log.contains("tracing enabled"), "{log}");
}

#[derive(Clone, Debug)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: Vec<String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A tiny OTLP/HTTP receiver on loopback collecting protobuf span exports.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<Span>>>) {
    use axum::body::Bytes;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let sink = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                if let Ok(req) = ExportTraceServiceRequest::decode(body) {
                    let mut s = sink.lock().unwrap();
                    for rs in req.resource_spans {
                        for ss in rs.scope_spans {
                            for sp in ss.spans {
                                s.push(Span {
                                    name: sp.name.clone(),
                                    trace_id: hex(&sp.trace_id),
                                    span_id: hex(&sp.span_id),
                                    parent: hex(&sp.parent_span_id),
                                    attrs: sp.attributes.iter().map(|a| a.key.clone()).collect(),
                                });
                            }
                        }
                    }
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Served on the test's runtime: it stops with the test.
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), spans)
}

/// The operator exporting to a loopback OTLP receiver every 200 ms, with
/// `args`, and a kubernetes Proxy `name` created.
async fn traced_proxy(
    name: &str,
    args: &[&str],
) -> (
    TestApiServer,
    tempfile::TempDir,
    Operator,
    Arc<Mutex<Vec<Span>>>,
) {
    let (endpoint, spans) = otlp_receiver().await;
    let (server, dir, client) = server().await;
    let op = start(
        &server,
        KUBE_ONLY,
        dir.path(),
        "op.log",
        args,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let proxies: Api<Proxy> = Api::namespaced(client, "default");
    proxies
        .create(&PostParams::default(), &proxy(name))
        .await
        .unwrap();
    (server, dir, op, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_life_is_one_reconcile_trace_with_correlated_logs() {
    if !squid_present() {
        println!("SKIP: /usr/sbin/squid is not installed");
        return;
    }
    let (_server, dir, _op, spans) = traced_proxy("t1", &[]).await;
    let t0 = Instant::now();
    let (root, create) = eventually(
        "a Reconcile Proxy trace with provider.create",
        Duration::from_secs(40),
        || {
            let spans = spans.lock().unwrap().clone();
            async move {
                let create = spans.iter().find(|s| s.name == "provider.create")?.clone();
                let root = spans
                    .iter()
                    .find(|s| s.name == "Reconcile Proxy" && s.trace_id == create.trace_id)?
                    .clone();
                // A Kubernetes client span under provider.create (the Pod POST).
                spans.iter().find(|s| {
                    s.parent == create.span_id && s.attrs.iter().any(|a| a == "http.method")
                })?;
                Some((root, create))
            }
        },
    )
    .await;
    println!("trace {} complete after {:?}", root.trace_id, t0.elapsed());
    assert!(
        root.parent.is_empty() || root.parent == "0000000000000000",
        "{root:?}"
    );
    assert!(
        create.attrs.iter().any(|a| a == "provider.name"),
        "{create:?}"
    );
    let all = spans.lock().unwrap().clone();
    assert!(all.iter().any(|s| s.name == "providerhealth.check"));
    // Kubernetes client spans only as children (no watch or informer roots).
    for s in all
        .iter()
        .filter(|s| s.attrs.iter().any(|a| a == "http.method"))
    {
        assert!(!s.parent.is_empty(), "parentless client span {s:?}");
    }
    // The reconcile's log lines carry the same trace.
    let log = eventually("correlated log line", Duration::from_secs(10), || async {
        let log = std::fs::read_to_string(dir.path().join("op.log")).ok()?;
        log.lines()
            .any(|l| {
                l.contains("Instance created") && l.contains(&format!("traceID={}", root.trace_id))
            })
            .then_some(log)
    })
    .await;
    assert!(log.contains("tracing enabled"), "{log}");
    if let Some(l) = log.lines().find(|l| l.contains("Instance created")) {
        println!("{l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_carry_trace_ids_as_keys() {
    if !squid_present() {
        println!("SKIP: /usr/sbin/squid is not installed");
        return;
    }
    let (_server, dir, _op, spans) = traced_proxy("j1", &["--log-format", "json"]).await;
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
    assert_eq!(line["spanID"].as_str().map(str::len), Some(16), "{line}");
    eventually("the line's trace exported", Duration::from_secs(20), || {
        let found = spans
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.name == "Reconcile Proxy" && s.trace_id == trace_id);
        async move { found.then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_flushed_on_sigterm() {
    let (endpoint, spans) = otlp_receiver().await;
    let (server, dir, _client) = server().await;
    let mut op = start(
        &server,
        KUBE_ONLY,
        dir.path(),
        "op.log",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            // Nothing is exported on schedule within this test.
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
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
    assert!(spans.lock().unwrap().is_empty(), "exported before shutdown");
    let pid = op.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = op.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "operator did not stop"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    println!("stopped after {:?}", t.elapsed());
    let names: Vec<String> = spans
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert!(
        names.iter().any(|n| n == "providerhealth.check"),
        "{names:?}"
    );
}

/// A kvm provider whose only host refuses SSH: its ProviderHealth reads
/// False 0/1 with reason Unreachable, and the gauges say the same.
#[cfg(feature = "kvm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_kvm_host_is_reported_in_the_object_and_the_gauges() {
    let (server, dir, client) = server().await;
    // Real key material, so the verdict is about the host, not the files.
    let key = dir.path().join("id_ed25519");
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status();
    if !keygen.is_ok_and(|s| s.success()) {
        println!("SKIP: ssh-keygen is not installed");
        return;
    }
    let known = dir.path().join("known_hosts");
    std::fs::write(&known, "").unwrap();
    // A port nothing listens on: connections are refused at once.
    let refused = free_port();
    let providers = format!(
        "{KUBE_ONLY}  - name: kvm-home
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
    // The kubernetes provider next to it is unaffected.
    assert_eq!(
        ph_ready(&phs, "kubernetes").await.map(|r| r.0),
        Some("True".to_string())
    );
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
            "proxy_operator_provider_target_up{provider=\"kubernetes\",target=\"apiserver\"} 1"
        ),
        "{body}"
    );
}
