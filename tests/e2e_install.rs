//! Installed as users install it: `kubectl apply --server-side -k
//! config/default` on the real test cluster. The operator runs as its two
//! Pods (uid 65532, read-only root, 128Mi limit) under its ServiceAccount
//! and the shipped RBAC; a kubernetes-provider Proxy and one whose
//! cloud-init comes from a Secret become Ready through real Squid Pods;
//! leases, a sticky key and a site cooldown hold through a rolling restart
//! of the Deployment while new leases keep being granted; deleting a Proxy
//! removes its Pod; deleting the namespace removes everything; the
//! operator is never refused by the API server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod support;

use std::time::Duration;

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use support::*;

const NS: &str = "egress-proxies-operator-system";
const DEPLOYMENT: &str = "egress-proxies-operator-controller-manager";
const SA: &str = "egress-proxies-operator-controller-manager";

/// The host processes running the operator binary with `--leader-elect`
/// (the Deployment's args) as uid 65532 for one of the Pods `pods` (by
/// their `POD_NAME`): the node agent's containers. Other test binaries'
/// clusters (the Helm test's) run the same binary the same way on this
/// host at the same time.
fn operator_pids(pods: &[String]) -> Vec<u32> {
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
        // Other test binaries run replicas with --leader-elect too, as
        // root: the Pods' run as 65532 (asserted below on every replica).
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let ours = environ
            .split(|b| *b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok()?.strip_prefix("POD_NAME="))
            .any(|n| pods.iter().any(|p| p == n));
        if args.first().and_then(|a| name(a)) == name(bin)
            && args.iter().any(|a| a == "--leader-elect")
            && uid(pid) == Some(65532)
            && ours
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

async fn check_operator_process(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mine = ListParams::default().labels("control-plane=controller-manager");
    let pids = eventually(
        "the two replicas' processes",
        Duration::from_secs(30),
        || async {
            let names: Vec<String> = pods
                .list(&mine)
                .await
                .ok()?
                .items
                .iter()
                .map(|p| p.name_any())
                .collect();
            let p = operator_pids(&names);
            (p.len() == 2).then_some(p)
        },
    )
    .await;
    for pid in pids {
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
}

const TOKEN: &str = "install-test-token";

/// The discovery API of every Ready operator Pod.
async fn ready_apis(client: &kube::Client) -> Vec<std::net::SocketAddr> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mine = ListParams::default().labels("control-plane=controller-manager");
    let Ok(list) = pods.list(&mine).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let s = p.status.as_ref()?;
            let ready = s
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = s.pod_ip.as_ref()?;
            ready.then(|| format!("{ip}:8090").parse().ok())?
        })
        .collect()
}

/// One lease call on a fresh connection; `None` when the Pod did not
/// answer (it is going away).
async fn lease_call(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (status, b) = raw_call(addr, None, (method, path), Some(TOKEN), &body).await?;
    Some((
        status,
        serde_json::from_str(&b).unwrap_or(serde_json::Value::Null),
    ))
}

/// A lease call at any Ready replica, until one answers other than
/// `503 leader_unavailable`.
async fn at_any(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    eventually(
        &format!("{method} {path}"),
        Duration::from_secs(60),
        || async {
            for api in ready_apis(client).await {
                match lease_call(api, method, path, body.clone()).await {
                    // A crawler retries it after Retry-After: the leader is
                    // changing hands.
                    Some((503, v)) if v["error"]["code"] == "leader_unavailable" => {}
                    Some(answer) => return Some(answer),
                    None => {}
                }
            }
            None
        },
    )
    .await
}

/// Every operator Pod's log, old and new (the node agent keeps a deleted
/// Pod's container logs): what a refused call is explained by.
fn operator_logs(c: &test_cluster::TestCluster) -> String {
    let Some(info) = c.info() else {
        return "(not the launcher's cluster: no Pod logs at hand)".into();
    };
    let mut out = String::new();
    for node in std::fs::read_dir(&info.pods_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        let pods = node.path().join("pods");
        for pod in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let name = pod.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&format!("{NS}_")) {
                continue;
            }
            let log = std::fs::read_to_string(pod.path().join("manager.log")).unwrap_or_default();
            out.push_str(&format!("\n==== {name} ====\n{log}"));
        }
    }
    out
}

fn proxy_of(lease: &serde_json::Value) -> String {
    lease["proxy"]["name"].as_str().unwrap().to_string()
}

/// Issue 31 on the shipped Deployment: a rolling restart of its two
/// replicas while a crawler keeps acquiring. New leases keep being granted
/// (never `503 recovering`), the leases held before renew after, and a
/// sticky key and a site cooldown are still in force.
async fn leases_hold_through_a_rolling_restart(
    c: &'static test_cluster::TestCluster,
    client: &kube::Client,
) {
    let grant = |body: serde_json::Value| async move {
        let (s, v) = at_any(client, "POST", "/v1/leases", body).await;
        assert_eq!(s, 201, "{v}{}", operator_logs(c));
        v
    };
    // Ready in the API server is listed by every replica within its
    // cache's lag and the listing's refresh: both, before the fairest
    // choice below is judged.
    eventually(
        "both Proxies listed by every replica",
        Duration::from_secs(30),
        || async {
            let apis = ready_apis(client).await;
            for api in &apis {
                let (s, v) =
                    lease_call(*api, "GET", "/v1/proxies", serde_json::Value::Null).await?;
                (s == 200 && v["items"].as_array().map(Vec::len) == Some(2)).then_some(())?;
            }
            (!apis.is_empty()).then_some(())
        },
    )
    .await;
    // Two leases under one sticky key on X, one on Y reported blocked for
    // a site.
    let s1 = grant(serde_json::json!({"stickyKey": "s1"})).await;
    let s2 = grant(serde_json::json!({"stickyKey": "s1"})).await;
    let x = proxy_of(&s1);
    assert_eq!(proxy_of(&s2), x);
    let blocked = grant(serde_json::json!({})).await;
    let y = proxy_of(&blocked);
    assert_ne!(x, y, "the fairest proxy holds no lease");
    let report = format!("/v1/leases/{}/report", blocked["id"].as_str().unwrap());
    let (s, v) = at_any(
        client,
        "POST",
        &report,
        serde_json::json!({"result": "blocked", "site": "shop.example"}),
    )
    .await;
    assert_eq!(s, 204, "{v}");

    // The rollout, and a crawler acquiring (and releasing) every 250 ms
    // through any Ready replica meanwhile.
    let restart = tokio::task::spawn_blocking(move || {
        let deployment = format!("deployment/{DEPLOYMENT}");
        c.kubectl_ok(&["-n", NS, "rollout", "restart", &deployment]);
        rolled_out(c);
    });
    let started = std::time::Instant::now();
    let (mut grants, mut unavailable, mut gone) = (Vec::new(), 0, 0);
    while !restart.is_finished() {
        for api in ready_apis(client).await.into_iter().take(1) {
            match lease_call(
                api,
                "POST",
                "/v1/leases",
                serde_json::json!({"ttlSeconds": 30}),
            )
            .await
            {
                Some((201, v)) => {
                    grants.push(started.elapsed());
                    let path = format!("/v1/leases/{}", v["id"].as_str().unwrap());
                    let _ = lease_call(api, "DELETE", &path, serde_json::Value::Null).await;
                }
                Some((503, v)) => {
                    assert_eq!(
                        v["error"]["code"],
                        "leader_unavailable",
                        "never a recovery window: {v}{}",
                        operator_logs(c)
                    );
                    unavailable += 1;
                }
                Some((s, v)) => panic!("acquire during the rollout answered {s}: {v}"),
                None => gone += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    restart.await.unwrap();
    let took = started.elapsed();
    let mut edges = vec![Duration::ZERO];
    edges.extend(grants.iter().copied());
    edges.push(took);
    let longest = edges.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    println!(
        "rolling restart of 2 replicas in {:.1} s: {} grants, {unavailable} 503 leader_unavailable, {gone} calls to a Pod going away; longest time without a new grant {:.1} s",
        took.as_secs_f64(),
        grants.len(),
        longest.as_secs_f64()
    );
    assert!(
        longest < Duration::from_secs(10),
        "new leases are granted through the rollout, not after a recovery window: {longest:?}"
    );

    // Every lease held before renews after, on its proxy.
    for held in [&s1, &s2, &blocked] {
        let path = format!("/v1/leases/{}/renew", held["id"].as_str().unwrap());
        let (s, v) = at_any(client, "POST", &path, serde_json::json!({})).await;
        assert_eq!(s, 200, "a lease held before the rollout renews after: {v}");
        assert_eq!(proxy_of(&v), proxy_of(held));
    }
    // Y is still blocked for the site (else Y, with fewer leases, is
    // fairer)...
    let site = grant(serde_json::json!({"site": "shop.example"})).await;
    assert_eq!(proxy_of(&site), x, "the site cooldown survived: {site}");
    let path = format!("/v1/leases/{}", site["id"].as_str().unwrap());
    assert_eq!(
        at_any(client, "DELETE", &path, serde_json::Value::Null)
            .await
            .0,
        204
    );
    // ...and the sticky key still leads to X.
    let again = grant(serde_json::json!({"stickyKey": "s1"})).await;
    assert_eq!(proxy_of(&again), x, "the sticky key survived: {again}");
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

/// `make build-installer` with the default image, into a scratch file
/// (the checkout's `dist/` is the user's); returns its path.
fn build_installer(c: &test_cluster::TestCluster) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("installer-{}", std::process::id()));
    let out = dir.join("install.yaml");
    let kubectl = c.kubectl();
    let run = std::process::Command::new("make")
        .current_dir(repo())
        .arg("-s")
        .arg("build-installer")
        .arg(format!("INSTALLER={}", out.display()))
        .arg(format!(
            "KUBECTL={}",
            kubectl.get_program().to_string_lossy()
        ))
        .output()
        .expect("make runs");
    assert!(
        run.status.success(),
        "make build-installer failed: {}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    out
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
        &format!("--from-literal=token={TOKEN}"),
    ]);
    // The one-file installer (`make build-installer`) is what `kubectl
    // apply -k config/default` applies, object for object; it is applied.
    let installer = build_installer(c);
    let kustomized = c.kubectl_ok(&["kustomize", repo().join("config/default").to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(&installer).unwrap(),
        kustomized,
        "dist/install.yaml differs from config/default"
    );
    c.kubectl_ok(&["apply", "--server-side", "-f", installer.to_str().unwrap()]);
    if let Some(dir) = installer.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    rolled_out(c);

    // 2. The node agent runs the Deployment's Pod as the manifest asks
    // (only on the launcher's cluster: its node agent runs the Pod here).
    if c.is_local() {
        check_operator_process(&client).await;
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
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--max-leases-per-proxy=3"},
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

    // 4b. Leases hold through a rolling restart of the two replicas (the
    // Pods' addresses are on the launcher's bridge).
    if c.is_local() {
        leases_hold_through_a_rolling_restart(c, &client).await;
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
