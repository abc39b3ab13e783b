//! System test of what ships: the operator binary runs on the host with the
//! args of the rendered manager Deployment, as its real ServiceAccount (a
//! token from `kubectl create token`) under the RBAC objects that `kubectl
//! kustomize config/default` renders, applied to the real test cluster,
//! with the samples' own providers file (gcp pointed at the local Compute
//! stand-in). The samples, applied unchanged with kubectl, reach Ready
//! (kubernetes, a real Squid Pod) and Running (gcp); the External one is
//! probed. Afterwards the API server's audit log shows no request of the
//! ServiceAccount refused, and every verb the manifests grant used. The
//! kvm sample has its own test (e2e_samples_kvm.rs) because it needs
//! libvirt and a VM.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod gcp_standin;
mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::Value;
use support::shipped::{apply_rbac, token_kubeconfig};
use support::{eventually, free_port, phase, Ground, Operator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "egress-proxies-operator-system";
const SA: &str = "egress-proxies-operator-controller-manager";
const RESET: &str = "crawl.example.com/reset-circuit-breaker";

/// The samples' providers file, with the gcp entry aimed at the stand-in,
/// the kubernetes Pods allowed to reach the probe target (on the cluster
/// bridge, a private address they refuse by default), and the kvm entry
/// left to e2e_samples_kvm.rs.
fn providers(gcp_endpoint: &str, target: std::net::IpAddr) -> String {
    let text =
        std::fs::read_to_string(support::repo().join("config/samples/providers-config.yaml"))
            .unwrap();
    let mut v: Value = serde_norway::from_str(&text).unwrap();
    let list = v["providers"].as_array_mut().unwrap();
    list.retain(|p| p["type"] != "kvm");
    for p in list.iter_mut().filter(|p| p["type"] == "gcp") {
        p["gcp"]["endpoint"] = gcp_endpoint.into();
        p["gcp"]["anonymous"] = true.into();
    }
    for p in list.iter_mut().filter(|p| p["type"] == "kubernetes") {
        p["kubernetes"]["destinations"]["allow"] = serde_json::json!([target.to_string()]);
    }
    serde_norway::to_string(&v).unwrap()
}

/// The Deployment's args with its ports moved to free loopback ports and
/// the providers file swapped for `providers`; the probe and metrics
/// addresses.
fn deployment_args(
    docs: &[Value],
    providers: &std::path::Path,
) -> (Vec<String>, SocketAddr, SocketAddr) {
    let d = support::object(docs, "Deployment", SA);
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    let probes: SocketAddr = support::loopback();
    let metrics: SocketAddr = support::loopback();
    let out = args
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            let (flag, _) = a.split_once('=').unwrap_or((a, ""));
            match flag {
                "--providers-config" => format!("{flag}={}", providers.display()),
                "--health-probe-bind-address" => format!("{flag}={probes}"),
                "--metrics-bind-address" => format!("{flag}={metrics}"),
                "--discovery-bind-address" => {
                    format!("{flag}=127.0.0.1:{}", free_port())
                }
                _ => a.to_string(),
            }
        })
        .collect();
    (out, probes, metrics)
}

/// The samples this test covers (the kvm one is in e2e_samples_kvm.rs).
const SAMPLES: [&str; 4] = [
    "config/samples/proxy_kubernetes.yaml",
    "config/samples/proxy_gcp.yaml",
    "config/samples/proxy_external.yaml",
    "config/samples/proxypool_gcp.yaml",
];

/// `kubectl VERB EXTRA -f SAMPLE...` (paths absolute: kubectl runs
/// anywhere).
fn samples_args(verb: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![verb.to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    for s in SAMPLES {
        args.push("-f".into());
        args.push(support::repo().join(s).to_str().unwrap().to_string());
    }
    args
}

/// kubectl (the cluster's own, admin) in the test's namespace.
fn kubectl(ground: &Ground, args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ground.kubectl(&args)
}

/// One RBAC rule as rendered (resourceNames are not told apart).
/// What one audited request asked for.
#[derive(Debug)]
struct Attributes {
    verb: String,
    group: String,
    /// `resource` or `resource/subresource`, as RBAC names it.
    resource: String,
    namespace: Option<String>,
}

/// The API requests of `user` in the audit log: (allowed, refused), the
/// refused ones described. Non-resource requests (discovery) count only
/// when refused.
fn audited(events: &[Value], user: &str) -> (Vec<Attributes>, Vec<String>) {
    let mut allowed = Vec::new();
    let mut refused = Vec::new();
    for e in events.iter().filter(|e| e["user"]["username"] == user) {
        let decision = e["annotations"]["authorization.k8s.io/decision"].as_str();
        if decision == Some("forbid") {
            refused.push(format!(
                "{} {}: {}",
                e["verb"], e["requestURI"], e["annotations"]["authorization.k8s.io/reason"]
            ));
            continue;
        }
        let r = &e["objectRef"];
        let (Some(verb), Some(resource)) = (e["verb"].as_str(), r["resource"].as_str()) else {
            continue;
        };
        let resource = match r["subresource"].as_str() {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        allowed.push(Attributes {
            verb: verb.to_string(),
            group: r["apiGroup"].as_str().unwrap_or_default().to_string(),
            resource,
            namespace: r["namespace"].as_str().map(String::from),
        });
    }
    (allowed, refused)
}

fn condition(p: &Proxy, type_: &str) -> Option<(String, String)> {
    support::condition(p, type_).map(|c| (c.status.as_str().to_string(), c.reason.clone()))
}

/// Grants no request used: (rule, verb) pairs the operator never exercised.
fn unused(rules: &[PolicyRule], ns: Option<&str>, seen: &[Attributes]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rules {
        for verb in &r.verbs {
            for group in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    let used = seen.iter().any(|a| {
                        &a.verb == verb
                            && &a.group == group
                            && &a.resource == res
                            && ns.is_none_or(|n| a.namespace.as_deref() == Some(n))
                    });
                    if !used {
                        out.push(format!("{verb} {group}/{res}"));
                    }
                }
            }
        }
    }
    out
}

/// No sample opens a proxy to everyone: the VM samples use the built-in
/// setup (which asks for credentials), and no file under config/samples
/// tells Squid `http_access allow all`.
#[test]
fn no_sample_opens_a_proxy_to_everyone() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples");
    let mut vm_samples = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("http_access allow all"),
            "{} opens its proxy to everyone",
            path.display()
        );
        if text.contains("kind: Proxy") && text.contains("cloudInit") {
            let doc: Value = serde_norway::from_str(&text).unwrap();
            let spec = match doc["kind"].as_str() {
                Some("ProxyPool") => doc["spec"]["template"]["spec"].clone(),
                _ => doc["spec"].clone(),
            };
            assert_eq!(spec["cloudInit"]["builtin"], "squid", "{}", path.display());
            assert!(
                spec.get("auth").is_none(),
                "{}: credentials stay on",
                path.display()
            );
            vm_samples += 1;
        }
    }
    assert_eq!(vm_samples, 3, "the gcp, kvm and gcp pool samples");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_reach_ready_and_running_under_the_shipped_rbac() {
    support::require_squid_pods();
    let docs = support::kustomize("config/default");
    let (cluster, namespaced) = support::rules_of(&docs, NS, SA);
    // The samples go to a namespace of their own; the operator runs
    // cluster-wide, as the Deployment does (it is this binary's only one).
    let ground = support::ground("samples").await;
    let c = ground.cluster;
    let admin = ground.client.clone();
    apply_rbac(c, &docs);
    let token = c.kubectl_ok(&["create", "token", SA, "-n", NS, "--duration=2h"]);
    let user = format!("system:serviceaccount:{NS}:{SA}");

    // A ProviderHealth of a provider since removed from the config: the
    // operator must delete it.
    let ph: Api<ProviderHealth> = Api::all(admin.clone());
    let mut retired = ProviderHealth::new("retired");
    retired.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_string(),
            "egress-proxies-operator".to_string(),
        )]
        .into(),
    );
    ph.create(&PostParams::default(), &retired).await.unwrap();

    let standin = gcp_standin::StandIn::start().await;
    standin.with(|st| st.running_after_gets = 1);
    // Squid in the sample's Pod fetches the probe target: on the bridge.
    let target = support::http_target_on(ground.host_ip()).await;
    let dir = tempfile::tempdir().unwrap();
    let providers_file = dir.path().join("providers.yaml");
    std::fs::write(&providers_file, providers(&standin.url, target.ip())).unwrap();
    let kubeconfig = dir.path().join("manager.kubeconfig");
    std::fs::write(&kubeconfig, token_kubeconfig(c, token.trim())).unwrap();
    let (args, probes, metrics) = deployment_args(&docs, &providers_file);
    println!("operator args: {args:?}");
    let command = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
        cmd.args(&args)
            .args(["--default-probe-url", &format!("http://{target}/")])
            .args(["--default-probe-expected-status", "200"])
            .args(["--provider-check-interval", "10s"])
            // The samples' namespace may have External Proxies (the default
            // allows the operator's own namespace only).
            .args(["--external-proxy-namespaces", &ground.ns])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", NS)
            .env("POD_NAME", "manager-0")
            .env("LOG_LEVEL", "info")
            // The Deployment's discovery API refuses to serve without its token.
            .env("DISCOVERY_TOKEN", "samples-token")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("INSTALLATION_ID");
        cmd
    };
    let log = dir.path().join("operator.log");
    let op = Operator::spawn(command(), &log);

    // The samples' namespace enforces the restricted Pod Security Standard,
    // as a careful cluster would: the kubernetes provider's Pod must pass.
    c.kubectl_ok(&[
        "label",
        "namespace",
        &ground.ns,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let pods: Api<Pod> = ground.api();
    let rogue: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "rogue"},
        // A privileged container is refused by the API server itself
        // (privileged containers are off): this one only breaks the
        // restricted standard, which only PodSecurity admission enforces.
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"allowPrivilegeEscalation": true}}]}
    }))
    .unwrap();
    match pods.create(&PostParams::default(), &rogue).await {
        Err(kube::Error::Api(e)) => {
            assert!(e.code == 403 && e.message.contains("PodSecurity"), "{e:?}")
        }
        other => panic!("a Pod allowing privilege escalation must be refused in a restricted namespace: {other:?}"),
    }
    kubectl(&ground, &samples_args("apply", &[]));
    let proxies: Api<Proxy> = ground.proxies();
    let started = std::time::Instant::now();
    let k8s = eventually(
        "the kubernetes sample Ready and Healthy",
        Duration::from_secs(120),
        || async {
            let p = proxies.get("proxy-kubernetes-sample").await.ok()?;
            (phase(&p) == Some("Ready") && condition(&p, "Healthy")?.0 == "True").then_some(p)
        },
    )
    .await;
    println!("kubernetes sample Ready after {:?}", started.elapsed());
    let ip = k8s.status.unwrap().ip.unwrap();
    assert!(ip.starts_with("10.216."), "the Pod's own address: {ip}");
    let gcp = eventually(
        "the gcp sample Running",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("proxy-gcp-sample").await.ok()?;
            (phase(&p) == Some("Running")).then_some(p)
        },
    )
    .await;
    println!("gcp sample Running after {:?}", started.elapsed());
    let gs = gcp.status.unwrap();
    // The stand-in's NAT IPs.
    assert!(gs.ip.unwrap().starts_with("127.0.0."));
    assert!(gs
        .provider_id
        .unwrap()
        .starts_with("zones/europe-west1-b/instances/"));
    // The pool sample leaves `replicas` out (1): its autoscaler brings it
    // to minReplicas 2 (patch proxypools) and the pool makes 2 Proxies
    // (create proxies, patch proxypools/status). `kubectl scale` to 4 is
    // within its bounds and stays; a maxReplicas of 3 brings it back to 3:
    // one Proxy scaled down and deleted (patch, delete).
    let pooled = |n: usize| {
        let proxies = proxies.clone();
        async move {
            let lp = ListParams::default().labels("crawl.example.com/pool=pool-gcp-sample");
            let list = proxies.list(&lp).await.ok()?.items;
            (list.len() == n).then_some(list)
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let members = loop {
        if let Some(list) = pooled(2).await {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pool sample's 2 Proxies not made in 60 s; requests the shipped RBAC refused: {:#?}\noperator log:\n{}",
            audited(&c.audit_events(), &user).1,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for p in &members {
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("ProxyPool", "pool-gcp-sample")
        );
        assert_eq!(p.spec.provider.as_deref(), Some("gcp-eu"));
    }
    let scaled = ground.kubectl(&[
        "get",
        "proxypool/pool-gcp-sample",
        "-o",
        "jsonpath={.status.lastScale.reason} {.status.lastScale.from}->{.status.lastScale.to}",
    ]);
    assert_eq!(scaled.trim(), "Bounds 1->2", "the autoscaler's own write");
    ground.kubectl(&["scale", "proxypool/pool-gcp-sample", "--replicas=4"]);
    eventually("the pool sample at 4", Duration::from_secs(60), || {
        pooled(4)
    })
    .await;
    ground.kubectl(&[
        "patch",
        "proxypool/pool-gcp-sample",
        "--type=merge",
        "-p",
        r#"{"spec":{"autoscale":{"maxReplicas":3}}}"#,
    ]);
    eventually(
        "the pool sample brought back to its maxReplicas",
        Duration::from_secs(90),
        || pooled(3),
    )
    .await;

    // Cloud-init from a labelled Secret works under the shipped RBAC
    // (secrets: list, watch): the operator reads it from its watch, so no
    // `get` is refused (checked with the other requests below).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ground.api();
    let ci: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ci", "labels": {"crawl.example.com/cloud-init": "true"}},
        "stringData": {"user-data": "#cloud-config\n"}
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &ci).await.unwrap();
    let from_secret: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "cloud-init-from-secret"},
        "spec": {"provider": "kubernetes", "port": 3128, "cloudInit": {"secretRef": {"name": "ci"}}}
    }))
    .unwrap();
    proxies
        .create(&PostParams::default(), &from_secret)
        .await
        .unwrap();
    let created = eventually(
        "the Proxy with a cloud-init Secret created",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("cloud-init-from-secret").await.ok()?;
            p.status.as_ref()?.provider_id.is_some().then_some(p)
        },
    )
    .await;
    // Its credentials Secret (created under the shipped RBAC) gets new
    // credentials when the instance is replaced under its name (a patch),
    // and goes when the Proxy stops asking for credentials (a delete).
    let creds = created.status.unwrap().credentials_secret.unwrap();
    let password =
        |s: &k8s_openapi::api::core::v1::Secret| s.data.as_ref().unwrap()["password"].clone();
    let first = password(&secrets.get(&creds).await.unwrap());
    for (spec, what) in [
        (serde_json::json!({"port": 3129}), "rotated"),
        (serde_json::json!({"auth": {"mode": "None"}}), "deleted"),
    ] {
        proxies
            .patch(
                "cloud-init-from-secret",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .unwrap();
        eventually(
            &format!("the credentials Secret {what}"),
            Duration::from_secs(60),
            || async {
                let s = secrets.get_opt(&creds).await.ok()?;
                match what {
                    "rotated" => (password(s.as_ref()?) != first).then_some(()),
                    _ => s.is_none().then_some(()),
                }
            },
        )
        .await;
    }
    proxies
        .delete("cloud-init-from-secret", &Default::default())
        .await
        .unwrap();
    let ext = eventually(
        "the External sample probed",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("proxy-external-sample").await.ok()?;
            condition(&p, "Healthy").map(|c| (p, c))
        },
    )
    .await;
    // squid.example.internal does not resolve here.
    assert_eq!(ext.1 .0, "False", "{:?}", ext.1);
    assert!(ext.0.metadata.finalizers.unwrap_or_default().is_empty());

    // ProviderHealth for both configured providers; the retired one gone.
    let kube_ready = eventually(
        "ProviderHealth kubernetes Ready",
        Duration::from_secs(30),
        || async {
            let o = ph.get_opt("kubernetes").await.ok()??;
            let c = o
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            Some(c.status.as_str().to_string())
        },
    )
    .await;
    assert_eq!(kube_ready, "True");
    eventually("ProviderHealth gcp-eu", Duration::from_secs(30), || async {
        ph.get_opt("gcp-eu").await.ok()?.and_then(|o| o.status)
    })
    .await;
    eventually(
        "the retired ProviderHealth deleted",
        Duration::from_secs(30),
        || async { ph.get_opt("retired").await.ok()?.is_none().then_some(()) },
    )
    .await;

    // Resetting the circuit breaker twice under the shipped RBAC: the
    // operator removes the annotation (a patch of the ProviderHealth) and
    // records Event CircuitReset (a create, then a patch of its series).
    for round in 1..=2 {
        ph.patch(
            "gcp-eu",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {RESET: round.to_string()}}}),
            ),
        )
        .await
        .unwrap();
        eventually(
            "the reset annotation removed",
            Duration::from_secs(30),
            || async {
                let o = ph.get("gcp-eu").await.ok()?;
                (!o.metadata
                    .annotations
                    .unwrap_or_default()
                    .contains_key(RESET))
                .then_some(())
            },
        )
        .await;
    }
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    eventually(
        "Event CircuitReset seen twice",
        Duration::from_secs(30),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?.items;
            list.into_iter().find(|e| {
                e.reason.as_deref() == Some("CircuitReset")
                    && e.regarding
                        .as_ref()
                        .is_some_and(|r| r.name.as_deref() == Some("gcp-eu"))
                    && e.reporting_controller.as_deref() == Some("egress-proxies-operator")
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            })
        },
    )
    .await;

    // The probe server of the Deployment's args answers the kubelet's probes.
    for path in ["/healthz", "/readyz"] {
        let mut s = tokio::net::TcpStream::connect(probes).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{path}: {resp}");
    }

    // The Deployment's /metrics is HTTPS for tokens bound to the shipped
    // metrics-reader ClusterRole (the operator checks each with a
    // TokenReview and a SubjectAccessReview under the shipped RBAC).
    ground.kubectl(&["create", "serviceaccount", "scraper"]);
    c.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &format!("{}-scraper", ground.ns),
        "--clusterrole=egress-proxies-operator-metrics-reader",
        &format!("--serviceaccount={}:scraper", ground.ns),
    ]);
    let scraper = ground.kubectl(&["create", "token", "scraper"]);
    let (status, body) = support::https_get(metrics, "/metrics", Some(scraper.trim()));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE proxy_operator_"), "{body}");

    // Deleting the samples removes the Pod and the VM, and the finalizers.
    kubectl(&ground, &samples_args("delete", &["--wait=false"]));
    eventually(
        "samples and their Pod gone",
        Duration::from_secs(60),
        || async {
            let left = proxies.list(&ListParams::default()).await.ok()?.items.len();
            let pods_left = pods.list(&ListParams::default()).await.ok()?.items.len();
            (left == 0 && pods_left == 0 && standin.instance_count() == 0).then_some(())
        },
    )
    .await;

    // A leader stopped on purpose hands its lease table over through the
    // Secrets the Role names: the first stop creates them, the next
    // process reads them as it takes the Lease, and its stop replaces them.
    let sigterm = |mut op: Operator| {
        let pid = op.pid().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(status.unwrap().success());
        let exit = op.0.wait().unwrap();
        assert!(
            exit.success(),
            "the operator exits cleanly on SIGTERM: {exit:?}"
        );
    };
    sigterm(op);
    let log2 = dir.path().join("operator-2.log");
    let again = Operator::spawn(command(), &log2);
    eventually(
        "the hand-over taken in",
        Duration::from_secs(60),
        || async {
            let text = std::fs::read_to_string(&log2).ok()?;
            text.contains("Took over the previous leader's leases")
                .then_some(())
        },
    )
    .await;
    sigterm(again);
    let text = std::fs::read_to_string(&log2).unwrap_or_default();
    assert!(
        text.contains("Wrote the lease table for the next leader"),
        "{text}"
    );

    let (seen, denied) = audited(&c.audit_events(), &user);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        denied.is_empty(),
        "the shipped RBAC refused: {denied:#?}\noperator log:\n{log_text}"
    );
    assert!(!seen.is_empty(), "no request of {user} in the audit log");
    let mut missing = unused(&cluster, None, &seen);
    for (ns, rules) in &namespaced {
        missing.extend(unused(rules, Some(ns), &seen));
    }
    let used: BTreeSet<String> = seen
        .iter()
        .map(|a| format!("{} {}/{}", a.verb, a.group, a.resource))
        .collect();
    println!("requests the operator made: {used:#?}");
    assert!(
        missing.is_empty(),
        "granted but never used (least privilege: drop them or test the path): {missing:?}"
    );
}
