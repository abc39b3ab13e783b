//! Installed as users install it: `kubectl apply --server-side -k
//! config/default` on the real test cluster. The operator runs as its Pod
//! (uid 65532, read-only root, 128Mi limit) under its ServiceAccount and
//! the shipped RBAC; a kubernetes-provider Proxy and one whose cloud-init
//! comes from a Secret become Ready through real Squid Pods; deleting a
//! Proxy removes its Pod; deleting the namespace removes everything; the
//! operator is never refused by the API server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod support;

use std::time::Duration;

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use support::*;

const NS: &str = "egress-proxies-operator-system";
const DEPLOYMENT: &str = "egress-proxies-operator-controller-manager";
const SA: &str = "egress-proxies-operator-controller-manager";

/// The host processes running the operator binary with `--leader-elect`
/// (the Deployment's args): the node agent's containers.
fn operator_pids() -> Vec<u32> {
    let bin = env!("CARGO_BIN_EXE_egress-proxies-operator");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // By name: the node agent runs a program its Pod's /tmp would hide
        // (a checkout under /tmp) from a bind mount of its own.
        let name = |p: &str| std::path::Path::new(p).file_name().map(|n| n.to_owned());
        if args.first().and_then(|a| name(a)) == name(bin)
            && args.iter().any(|a| a == "--leader-elect")
        {
            pids.push(pid);
        }
    }
    pids
}

fn proc_file(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{name}")).unwrap_or_default()
}

/// The memory limit of the process's cgroup v1 memory group, in bytes.
fn memory_limit(pid: u32) -> Option<u64> {
    let cgroup = proc_file(pid, "cgroup");
    let path = cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path.to_string())
    })?;
    std::fs::read_to_string(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the process's root mount is read-only.
fn root_read_only(pid: u32) -> bool {
    proc_file(pid, "mountinfo").lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "ro")
    })
}

fn uid(pid: u32) -> Option<u32> {
    proc_file(pid, "status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits until the operator's Deployment has rolled out.
fn rolled_out(c: &test_cluster::TestCluster) {
    let deployment = format!("deployment/{DEPLOYMENT}");
    c.kubectl_ok(&["-n", NS, "rollout", "status", &deployment, "--timeout=120s"]);
}

async fn check_operator_process() {
    let pids = eventually("the operator process", Duration::from_secs(30), || async {
        let p = operator_pids();
        (p.len() == 1).then_some(p)
    })
    .await;
    let pid = pids[0];
    assert_eq!(uid(pid), Some(65532), "the operator must run as uid 65532");
    assert!(
        root_read_only(pid),
        "the operator's root filesystem must be read-only"
    );
    assert_eq!(
        memory_limit(pid),
        Some(128 * 1024 * 1024),
        "the 128Mi limit must be enforced"
    );
}

/// The operator Pod's `/metrics` (port 8443): 200 with a metrics-reader
/// token, 401 without one.
async fn scrape_the_pods_metrics(c: &test_cluster::TestCluster, client: &kube::Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mine = ListParams::default().labels("control-plane=controller-manager");
    let ip = pods.list(&mine).await.unwrap().items[0]
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let addr: std::net::SocketAddr = format!("{ip}:8443").parse().unwrap();
    c.kubectl_ok(&["-n", ns, "create", "serviceaccount", "scraper"]);
    c.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &format!("{ns}-scraper"),
        "--clusterrole=egress-proxies-operator-metrics-reader",
        &format!("--serviceaccount={ns}:scraper"),
    ]);
    let token = c.kubectl_ok(&["-n", ns, "create", "token", "scraper"]);
    let (status, body) = eventually("the Pod's /metrics", Duration::from_secs(30), || async {
        let got = https_get(addr, "/metrics", Some(token.trim()));
        (got.0 == 200).then_some(got)
    })
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("# TYPE proxy_operator_"), "{body}");
    println!(
        "the Pod's /metrics at {addr}: {status}, {} bytes",
        body.len()
    );
    assert_eq!(https_get(addr, "/metrics", None).0, 401);
    c.kubectl_ok(&["delete", "clusterrolebinding", &format!("{ns}-scraper")]);
}

#[tokio::test]
async fn the_default_install_runs_the_operator_as_its_pod_and_serves_proxies() {
    let c = cluster();
    let client = c.client().await;
    let target = http_target_on(c.host_ip()).await;

    // 1. Install exactly as the README says: the discovery token first
    // (docs/operations.md), then the manifests.
    c.kubectl_ok(&["create", "namespace", NS]);
    c.kubectl_ok(&[
        "-n",
        NS,
        "create",
        "secret",
        "generic",
        "discovery-token",
        "--from-literal=token=install-test-token",
    ]);
    c.kubectl_ok(&[
        "apply",
        "--server-side",
        "-k",
        repo().join("config/default").to_str().unwrap(),
    ]);
    rolled_out(c);

    // 2. The node agent runs the Deployment's Pod as the manifest asks
    // (only on the launcher's cluster: its node agent runs the Pod here).
    if c.is_local() {
        check_operator_process().await;
    }

    // 3. Point the default probe at the test target (no internet here): a
    // rollout, as a user changing the Deployment's args would make. The
    // target is on the cluster bridge, a private address the Squid Pods
    // refuse by default, so the providers file opens it first, as
    // docs/configuration.md tells a user with an internal target to.
    let providers = support::kubernetes_reaching("kubernetes", "", target.ip());
    let cm = serde_json::json!({"data": {"providers.yaml": providers}});
    c.kubectl_ok(&[
        "-n",
        NS,
        "patch",
        "configmap",
        "egress-proxies-operator-providers-config",
        "--type=merge",
        "-p",
        &cm.to_string(),
    ]);
    let patch = serde_json::json!([
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": format!("--default-probe-url=http://{target}/")},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--default-probe-expected-status=200"},
    ]);
    c.kubectl_ok(&[
        "-n",
        NS,
        "patch",
        "deployment",
        DEPLOYMENT,
        "--type=json",
        "-p",
        &patch.to_string(),
    ]);
    rolled_out(c);

    // 4. A kubernetes-provider Proxy and a Proxy whose cloud-init is a
    // Secret both become Ready through real Squid Pods.
    let ns = c.namespace(&client, "install").await;
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "user-data", "labels": {"crawl.example.com/cloud-init": "true"}},
        "stringData": {"user-data": "#cloud-config\nhostname: from-secret\n"},
    });
    let proxies = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        secret,
        {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
         "metadata": {"name": "plain"},
         "spec": {"provider": "kubernetes", "port": 3128}},
        {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
         "metadata": {"name": "from-secret"},
         "spec": {"provider": "kubernetes", "port": 3128,
                  "cloudInit": {"secretRef": {"name": "user-data", "key": "user-data"}}}},
    ]});
    let file = std::env::temp_dir().join(format!("install-{}.json", std::process::id()));
    std::fs::write(&file, proxies.to_string()).unwrap();
    c.kubectl_ok(&["-n", &ns, "apply", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    let api: Api<Proxy> = Api::namespaced(client.clone(), &ns);
    for name in ["plain", "from-secret"] {
        let p = eventually(
            &format!("Proxy {name} Ready"),
            Duration::from_secs(180),
            || async {
                let p = api.get(name).await.ok()?;
                (phase(&p) == Some("Ready")).then_some(p)
            },
        )
        .await;
        let status = p.status.unwrap();
        let ip = status.ip.unwrap();
        assert!(
            !c.is_local() || ip.starts_with("10.216."),
            "{name}: the Pod's own address, got {ip}"
        );
    }

    // 5. kubectl get ph shows the provider the default install defines.
    let ph: Api<ProviderHealth> = Api::all(client.clone());
    eventually(
        "ProviderHealth kubernetes",
        Duration::from_secs(120),
        || async { ph.get("kubernetes").await.ok() },
    )
    .await;
    let table = c.kubectl_ok(&["get", "ph"]);
    assert!(
        table.lines().any(|l| l.starts_with("kubernetes")),
        "{table}"
    );

    // 6. The Pod's /metrics is HTTPS for a token bound to the shipped
    // metrics-reader ClusterRole, as the ServiceMonitor scrapes it (from
    // this host only on the launcher's cluster: the Pod's address is on
    // its bridge).
    if c.is_local() {
        scrape_the_pods_metrics(c, &client, &ns).await;
    }

    // 7. Deleting a Proxy removes its Pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let managed = ListParams::default().labels("app.kubernetes.io/name=egress-proxy");
    assert_eq!(pods.list(&managed).await.unwrap().items.len(), 2);
    c.kubectl_ok(&["-n", &ns, "delete", "px", "plain", "--timeout=60s"]);
    eventually(
        "the plain Proxy's Pod gone",
        Duration::from_secs(60),
        || async { (pods.list(&managed).await.ok()?.items.len() == 1).then_some(()) },
    )
    .await;

    // 8. Deleting the namespace removes everything in it.
    c.kubectl_ok(&["delete", "namespace", &ns, "--timeout=120s"]);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    eventually("the namespace gone", Duration::from_secs(120), || async {
        namespaces.get_opt(&ns).await.ok()?.is_none().then_some(())
    })
    .await;

    // 9. RBAC never refused the operator's ServiceAccount (the audit log
    // records every authorization decision), and it made requests at all.
    let user = format!("system:serviceaccount:{NS}:{SA}");
    let refused: Vec<String> = c
        .audit_events()
        .iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str()
                && e["annotations"]["authorization.k8s.io/decision"] == "forbid"
        })
        .map(|e| {
            format!(
                "{} {}: {}",
                e["verb"], e["requestURI"], e["annotations"]["authorization.k8s.io/reason"]
            )
        })
        .collect();
    assert!(
        refused.is_empty(),
        "the shipped RBAC refused the operator: {refused:?}"
    );
    let allowed = c
        .audit_events()
        .iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str()
                && e["annotations"]["authorization.k8s.io/decision"] == "allow"
        })
        .count();
    assert!(
        !c.is_local() || allowed > 10,
        "the operator must run as its ServiceAccount: {allowed} allowed requests"
    );

    // 10. Uninstall as docs/operations.md says (the RBAC goes with it, so
    // refusals are counted before): every Proxy first, so the
    // operator runs their finalizers, then the installation.
    c.kubectl_ok(&["delete", "px", "--all", "-A", "--wait", "--timeout=120s"]);
    c.kubectl_ok(&[
        "delete",
        "--ignore-not-found",
        "--timeout=120s",
        "-k",
        repo().join("config/default").to_str().unwrap(),
    ]);
}
