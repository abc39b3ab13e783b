//! The shipped manifests: `kubectl kustomize config/default` renders, the
//! manager Deployment keeps the runtime envelope (operator.md §9.1), its
//! args and providers file are ones the binary accepts, and RBAC grants no
//! more than the rules checked here. (tests/e2e_samples.rs runs the
//! operator under these RBAC rules and checks each one is needed.) With
//! config/components/gateway on: the gateway's Deployment passes the same
//! Pod security, its Service and NetworkPolicy reach its ports, and the
//! real binary runs on its args under exactly its RBAC, each rule used.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;
use support::{kustomize, object, rules_of};

const NS: &str = "egress-proxies-operator-system";
const SA: &str = "egress-proxies-operator-controller-manager";
const DEPLOYMENT: &str = "egress-proxies-operator-controller-manager";

/// `config/default`, rendered once for all the tests of this file.
fn rendered() -> &'static [Value] {
    static DOCS: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    DOCS.get_or_init(|| kustomize("config/default"))
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn manager(docs: &[Value]) -> &Value {
    let d = object(docs, "Deployment", DEPLOYMENT);
    assert_eq!(d["metadata"]["namespace"], NS);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["name"], "manager");
    c
}

/// The value of `--flag=value` in the container args.
fn arg<'a>(c: &'a Value, flag: &str) -> Option<&'a str> {
    strs(&c["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
}

#[test]
fn the_deployment_keeps_the_runtime_envelope() {
    let docs = rendered();
    let d = object(docs, "Deployment", DEPLOYMENT);
    let pod = &d["spec"]["template"]["spec"];
    let c = manager(docs);

    // Pod and container security: restricted PSS.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsGroup"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null());
    assert!(sc["privileged"].is_null() || sc["privileged"] == false);
    let ns = object(docs, "Namespace", NS);
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );

    // Memory and scratch space.
    assert_eq!(c["resources"]["limits"]["memory"], "128Mi");
    assert_eq!(c["resources"]["limits"]["cpu"], "500m");
    assert_eq!(c["resources"]["requests"]["memory"], "64Mi");
    let volumes = pod["volumes"].as_array().unwrap();
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    let mount = |name: &str| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no mount {name}"))
            .clone()
    };
    assert_eq!(volume("tmp")["emptyDir"]["sizeLimit"], "64Mi");
    assert_eq!(mount("tmp")["mountPath"], "/tmp");
    // Nothing but /tmp is writable.
    for m in c["volumeMounts"].as_array().unwrap() {
        if m["name"] != "tmp" {
            assert_eq!(m["readOnly"], true, "{m}");
        }
    }
    assert_eq!(volume("kvm-ssh")["secret"]["secretName"], "kvm-ssh");
    assert_eq!(volume("kvm-ssh")["secret"]["optional"], true);
    assert_eq!(mount("kvm-ssh")["mountPath"], "/etc/proxy-operator/kvm");
    let cm = volume("providers-config")["configMap"]["name"]
        .as_str()
        .unwrap();
    object(docs, "ConfigMap", cm);
    assert_eq!(
        mount("providers-config")["mountPath"],
        "/etc/proxy-operator"
    );

    // Environment: the optional token, then the downward API before its use.
    let env = c["env"].as_array().unwrap();
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    let token = env.iter().find(|e| e["name"] == "DISCOVERY_TOKEN").unwrap();
    let key = &token["valueFrom"]["secretKeyRef"];
    assert_eq!(
        (&key["name"], &key["key"], &key["optional"]),
        (
            &Value::from("discovery-token"),
            &Value::from("token"),
            &Value::from(true)
        )
    );
    let pos = |n: &str| names.iter().position(|x| *x == n).unwrap();
    assert!(pos("POD_NAME") < pos("OTEL_RESOURCE_ATTRIBUTES"));
    assert!(pos("POD_NAMESPACE") < pos("OTEL_RESOURCE_ATTRIBUTES"));
    assert_eq!(
        env[pos("OTEL_SERVICE_NAME")]["value"],
        "egress-proxies-operator"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("OTEL_EXPORTER")),
        "tracing is off by default"
    );

    // Probes hit the probe server the args start; ports match the args.
    let probe_port = arg(c, "--health-probe-bind-address").unwrap();
    let port_of = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(probe_port, format!(":{}", port_of("probes")));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "probes");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "probes");
    assert_eq!(
        arg(c, "--discovery-bind-address"),
        Some(format!(":{}", port_of("discovery")).as_str())
    );
    assert_eq!(
        arg(c, "--metrics-bind-address"),
        Some(format!(":{}", port_of("metrics")).as_str())
    );
    assert_eq!(port_of("discovery"), 8090);
    assert!(strs(&c["args"]).contains(&"--leader-elect"));

    // Image set by kustomize, never the placeholder.
    assert_eq!(c["image"], "example.com/egress-proxies-operator:0.1.0");
    assert_eq!(pod["serviceAccountName"], SA);
    object(docs, "ServiceAccount", SA);
    // Above the 24 s a stopping leader may take to hand its leases over.
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
}

/// The pod template of Deployment `deployment` in `docs` as a Pod named
/// `name`, in no namespace.
fn pod_of(docs: &[Value], deployment: &str, name: &str) -> Value {
    let d = object(docs, "Deployment", deployment);
    let template = &d["spec"]["template"];
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"]["labels"].clone()},
        "spec": template["spec"].clone(),
    })
}

/// Creates `pod` with a server-side dry run (nothing is stored) in `ns`.
async fn dry_run(pods: &Api<Pod>, pod: Value) -> Result<Pod, kube::Error> {
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&pp, &pod).await
}

#[tokio::test]
async fn the_pod_template_is_admitted_by_the_real_restricted_pod_security() {
    judged_by_restricted_pod_security(|name| pod_of(rendered(), DEPLOYMENT, name)).await;
}

/// The real PodSecurity admission of kube-apiserver, in a namespace
/// enforcing `restricted` as the shipped one does, admits a Pod made from
/// a shipped template (`pod` makes it, named) and refuses a variant of it
/// allowed to escalate privileges (server-side dry runs: nothing runs).
async fn judged_by_restricted_pod_security(pod: impl Fn(&str) -> Value) {
    let cluster = support::control_plane();
    let client = cluster.client().await;
    let ns = cluster.namespace(&client, "pss").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}
            })),
        )
        .await
        .unwrap();
    // The template runs as its own ServiceAccount, which the
    // ServiceAccount admission wants to exist.
    let sa = pod("x")["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    if sa != "default" {
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(sa),
                ..Default::default()
            },
            ..Default::default()
        };
        sas.create(&PostParams::default(), &account).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client, &ns);

    let admitted = dry_run(&pods, pod("shipped")).await;
    assert!(
        admitted.is_ok(),
        "the restricted PodSecurity refused the pod template: {admitted:?}"
    );

    // The check can fail: a variant allowed to escalate privileges is
    // refused, naming PodSecurity. (`privileged: true` itself never reaches
    // PodSecurity: this API server disallows privileged containers and
    // validation refuses it next to allowPrivilegeEscalation=false, 422.)
    let mut bad = pod("escalating");
    bad["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true.into();
    match dry_run(&pods, bad).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(s.message.contains("PodSecurity"), "{s:?}");
            assert!(s.message.contains("allowPrivilegeEscalation"), "{s:?}");
        }
        other => panic!("an escalating Pod must be refused by PodSecurity: {other:?}"),
    }
    // Dry runs store nothing.
    assert!(pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

#[test]
fn the_deployment_args_and_providers_file_are_accepted_by_the_binary() {
    let docs = rendered();
    let c = manager(docs);
    let cm_name = object(docs, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "providers-config")
        .unwrap()["configMap"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let cm = object(docs, "ConfigMap", &cm_name);
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&providers, cm["data"]["providers.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(
        arg(c, "--providers-config"),
        Some("/etc/proxy-operator/providers.yaml"),
        "the args name the ConfigMap key under its mount"
    );
    // The Deployment's own args, with the file path swapped for the copy.
    let args: Vec<String> = strs(&c["args"])
        .into_iter()
        .map(|a| {
            if a.starts_with("--providers-config=") {
                format!("--providers-config={}", providers.display())
            } else {
                a.to_string()
            }
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .args(&args)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} --check-config: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("kubernetes (kubernetes)"));
}

#[test]
fn services_and_network_policy_reach_the_manager_ports() {
    let docs = rendered();
    let d = object(docs, "Deployment", DEPLOYMENT);
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let c = manager(docs);
    let has_port = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == name)
    };
    for (svc, port, target) in [
        (
            "egress-proxies-operator-controller-manager-discovery-service",
            8090,
            "discovery",
        ),
        (
            "egress-proxies-operator-controller-manager-metrics-service",
            8443,
            "metrics",
        ),
    ] {
        let s = object(docs, "Service", svc);
        assert_eq!(s["metadata"]["namespace"], NS);
        assert_eq!(s["spec"]["ports"][0]["port"], port);
        assert_eq!(s["spec"]["ports"][0]["targetPort"], target);
        assert!(has_port(target));
        for (k, v) in s["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&pod_labels[k], v, "{svc} selects the manager pods");
        }
    }
    let np = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("a NetworkPolicy");
    for (k, v) in np["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&pod_labels[k], v);
    }
    assert_eq!(strs(&np["spec"]["policyTypes"]), ["Ingress"]);
    let allowed: Vec<i64> = np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_array().unwrap().iter())
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(allowed, [8090, 8443]);
}

/// The strings of an optional list of a PolicyRule (absent: none).
fn list(v: &Option<Vec<String>>) -> &[String] {
    v.as_deref().unwrap_or_default()
}

fn grants(rules: &[PolicyRule], group: &str, resource: &str) -> Vec<String> {
    let mut v: Vec<String> = rules
        .iter()
        .filter(|r| {
            list(&r.api_groups).iter().any(|g| g == group)
                && list(&r.resources).iter().any(|x| x == resource)
        })
        .flat_map(|r| r.verbs.clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn the_manager_gets_least_privilege_rbac() {
    let docs = rendered();
    let (cluster, namespaced) = rules_of(docs, NS, SA);
    for r in &cluster {
        for names in [list(&r.api_groups), list(&r.resources), &r.verbs] {
            assert!(!names.iter().any(|x| x == "*"), "no wildcards: {r:?}");
        }
    }
    // Secrets: the labelled caches' list and watch, and the writes of the
    // credentials Secrets (create, patch to rotate, delete once their
    // instance is gone); never get or update.
    assert_eq!(
        grants(&cluster, "", "secrets"),
        ["create", "delete", "list", "patch", "watch"]
    );
    // Only kube-system, and only get.
    let ns_rule = cluster
        .iter()
        .find(|r| list(&r.resources).iter().any(|x| x == "namespaces"))
        .unwrap();
    assert_eq!(list(&ns_rule.resource_names), ["kube-system"]);
    assert_eq!(ns_rule.verbs, ["get"]);
    // Proxies: the cache, the finalizer and annotations; a pool's Proxies
    // are created and deleted.
    assert_eq!(
        grants(&cluster, "crawl.example.com", "proxies"),
        ["create", "delete", "list", "patch", "watch"]
    );
    assert_eq!(
        grants(&cluster, "crawl.example.com", "proxies/status"),
        ["patch"]
    );
    // Pools: watched, their status written, an autoscaled pool's
    // spec.replicas patched; never created or deleted.
    assert_eq!(
        grants(&cluster, "crawl.example.com", "proxypools"),
        ["list", "patch", "watch"]
    );
    assert_eq!(
        grants(&cluster, "crawl.example.com", "proxypools/status"),
        ["patch"]
    );
    assert_eq!(
        grants(&cluster, "crawl.example.com", "providerhealths"),
        ["create", "delete", "get", "list", "patch", "watch"]
    );
    assert_eq!(
        grants(&cluster, "crawl.example.com", "providerhealths/status"),
        ["patch"]
    );
    // The event recorder writes events.k8s.io Events only (a repeat is a
    // patch of the series), never core ones.
    assert!(grants(&cluster, "", "events").is_empty(), "no core events");
    assert_eq!(
        grants(&cluster, "events.k8s.io", "events"),
        ["create", "patch"]
    );
    // Secure /metrics: a TokenReview and a SubjectAccessReview per scrape
    // token, nothing else of either group.
    assert_eq!(
        grants(&cluster, "authentication.k8s.io", "tokenreviews"),
        ["create"]
    );
    assert_eq!(
        grants(&cluster, "authorization.k8s.io", "subjectaccessreviews"),
        ["create"]
    );
    // The scraper's role: get on /metrics, and only that.
    let reader = object(
        docs,
        "ClusterRole",
        "egress-proxies-operator-metrics-reader",
    );
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    // Pods come from the kubernetes-provider component only.
    assert_eq!(
        grants(&cluster, "", "pods"),
        ["create", "delete", "get", "list", "watch"]
    );
    let pods_role = object(
        docs,
        "ClusterRole",
        "egress-proxies-operator-manager-pods-role",
    );
    assert!(pods_role["rules"].to_string().contains("pods"));
    let base = object(docs, "ClusterRole", "egress-proxies-operator-manager-role");
    assert!(!base["rules"].to_string().contains("pods"));
    // In the install namespace only: the election Lease, the lease signing
    // key Secret and the lease hand-over Secrets, each read and written by
    // name (create cannot be limited to a name), nothing else.
    assert_eq!(namespaced.len(), 1);
    let (ns, rules) = &namespaced[0];
    assert_eq!(ns, NS);
    assert_eq!(
        grants(rules, "coordination.k8s.io", "leases"),
        ["create", "get", "update"]
    );
    assert_eq!(grants(rules, "", "secrets"), ["create", "get", "update"]);
    let state: Vec<String> = (0..egress_proxies_operator::replica::handover::MAX_CHUNKS)
        .map(|i| format!("egress-proxies-operator-lease-state-{i}"))
        .collect();
    for r in rules {
        let resources = list(&r.resources);
        assert!(
            resources == ["leases"] || resources == ["secrets"],
            "{resources:?}"
        );
        if r.verbs != ["create"] {
            assert_eq!(r.verbs, ["get", "update"], "{resources:?}");
            let keys = list(&r.resource_names).iter().any(|n| n.ends_with("-key"));
            let names: Vec<String> = if resources == ["leases"] {
                vec!["egress-proxies-operator.crawl.example.com".into()]
            } else if keys {
                // Read again every 10 s; updated to fold a key rotation.
                vec![
                    "egress-proxies-operator-lease-key".into(),
                    "egress-proxies-operator-gateway-key".into(),
                ]
            } else {
                state.clone()
            };
            assert_eq!(list(&r.resource_names), names, "{resources:?}");
        }
    }
}

#[test]
fn user_roles_never_write_status() {
    let docs = rendered();
    for (role, verbs) in [
        ("proxy-admin-role", vec!["*"]),
        (
            "proxy-editor-role",
            vec![
                "create", "delete", "get", "list", "patch", "update", "watch",
            ],
        ),
        ("proxy-viewer-role", vec!["get", "list", "watch"]),
        ("providerhealth-viewer-role", vec!["get", "list", "watch"]),
    ] {
        let r = object(
            docs,
            "ClusterRole",
            &format!("egress-proxies-operator-{role}"),
        );
        let rules: Vec<PolicyRule> = serde_json::from_value(r["rules"].clone()).unwrap();
        let kind = if role.starts_with("proxy-") {
            "proxies"
        } else {
            "providerhealths"
        };
        assert_eq!(grants(&rules, "crawl.example.com", kind), verbs, "{role}");
        assert_eq!(
            grants(&rules, "crawl.example.com", &format!("{kind}/status")),
            ["get"],
            "{role}"
        );
        if kind == "proxies" {
            // The Proxy roles cover pools alike; who may change a pool may
            // scale it.
            assert_eq!(
                grants(&rules, "crawl.example.com", "proxypools"),
                verbs,
                "{role}"
            );
            assert_eq!(
                grants(&rules, "crawl.example.com", "proxypools/status"),
                ["get"],
                "{role}"
            );
            let scale = grants(&rules, "crawl.example.com", "proxypools/scale");
            let want: &[&str] = match role {
                "proxy-admin-role" => &["*"],
                "proxy-editor-role" => &["get", "patch", "update"],
                _ => &[],
            };
            assert_eq!(scale, want, "{role}");
        }
        // The built-in view/edit/admin roles take these in: read access
        // into all three, write access into edit and admin only.
        let aggregated: Vec<&str> = ["view", "edit", "admin"]
            .into_iter()
            .filter(|to| {
                r["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{to}")]
                    == "true"
            })
            .collect();
        let expected: &[&str] = match role {
            "proxy-admin-role" => &[],
            "proxy-editor-role" => &["edit", "admin"],
            _ => &["view", "edit", "admin"],
        };
        assert_eq!(aggregated, expected, "{role}");
    }
}

#[test]
fn without_the_component_no_pod_permissions_are_granted() {
    // What a gcp/kvm-only install renders: config/default minus the
    // kubernetes-provider component.
    let default = support::repo_file("config/default/kustomization.yaml");
    let text: String = default
        .lines()
        .filter(|l| !l.contains("components/kubernetes-provider") && !l.starts_with("components:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let docs = support::kustomize_default_as(&text, "no-pods-");
    let (cluster, _) = rules_of(&docs, NS, SA);
    assert!(grants(&cluster, "", "pods").is_empty());
    assert!(!grants(&cluster, "crawl.example.com", "proxies").is_empty());
}

#[test]
fn every_sample_renders_and_names_a_sample_provider() {
    let samples = kustomize("config/samples");
    let kinds: Vec<&str> = samples
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.iter().all(|k| *k == "Proxy" || *k == "ProxyPool"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "ProxyPool").count(),
        1,
        "one pool sample"
    );
    let providers_text =
        std::fs::read_to_string(support::repo().join("config/samples/providers-config.yaml"))
            .unwrap();
    let providers: Value = serde_norway::from_str(&providers_text).unwrap();
    let names: Vec<&str> = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for s in &samples {
        let spec = match s["kind"].as_str() {
            Some("ProxyPool") => &s["spec"]["template"]["spec"],
            _ => &s["spec"],
        };
        if spec["mode"] == "External" {
            continue;
        }
        let p = spec["provider"].as_str().unwrap();
        assert!(
            names.contains(&p),
            "{} names provider {p}, not in providers-config.yaml ({names:?})",
            s["metadata"]["name"]
        );
    }
    // Every sample file in the folder is listed.
    let mut files: Vec<String> = std::fs::read_dir(support::repo().join("config/samples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("proxy_") || f.starts_with("proxypool_"))
        .collect();
    files.sort();
    assert_eq!(files.len(), samples.len(), "{files:?}");
    // The samples providers file is valid as written.
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .arg("--providers-config")
        .arg(support::repo().join("config/samples/providers-config.yaml"))
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const GATEWAY: &str = "egress-proxies-operator-gateway";

/// config/default with the gateway component on (its line uncommented, as
/// docs/gateway.md says), rendered once for all the tests of this file.
fn with_gateway() -> &'static [Value] {
    static DOCS: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    DOCS.get_or_init(|| support::kustomize_default_with("gateway"))
}

fn gateway(docs: &[Value]) -> &Value {
    let d = object(docs, "Deployment", GATEWAY);
    assert_eq!(d["metadata"]["namespace"], NS);
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["name"], "gateway");
    c
}

/// The port number of the container's port `name`.
fn port_of(c: &Value, name: &str) -> i64 {
    c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
        .as_i64()
        .unwrap()
}

/// Whether `selector` (a label map) selects Pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

#[test]
fn the_gateway_component_adds_the_gateway_and_leaves_the_rest_as_it_is() {
    let key = |d: &Value| {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        format!("{}/{}", text(&d["kind"]), text(&d["metadata"]["name"]))
    };
    let plain: std::collections::BTreeMap<String, &Value> =
        rendered().iter().map(|d| (key(d), d)).collect();
    let mut added: Vec<String> = Vec::new();
    for d in with_gateway() {
        match plain.get(&key(d)) {
            // The component's image setting must not touch the manager.
            Some(before) => assert_eq!(*before, d, "{} changed", key(d)),
            None => added.push(key(d)),
        }
    }
    added.sort();
    assert_eq!(
        added,
        [
            "ClusterRole/egress-proxies-operator-gateway-role",
            "ClusterRoleBinding/egress-proxies-operator-gateway-rolebinding",
            "Deployment/egress-proxies-operator-gateway",
            "NetworkPolicy/egress-proxies-operator-gateway-allow-proxy-api-and-metrics",
            "PodDisruptionBudget/egress-proxies-operator-gateway",
            "Role/egress-proxies-operator-gateway-follower-role",
            "RoleBinding/egress-proxies-operator-gateway-follower-rolebinding",
            "Service/egress-proxies-operator-gateway",
            "Service/egress-proxies-operator-gateway-metrics-service",
            "ServiceAccount/egress-proxies-operator-gateway",
        ]
    );
    assert_eq!(with_gateway().len(), rendered().len() + added.len());
    for d in with_gateway() {
        if !plain.contains_key(&key(d)) && d["metadata"]["namespace"].is_string() {
            assert_eq!(d["metadata"]["namespace"], NS, "{}", key(d));
        }
    }
    // The manager's own image, replaced with it by `make deploy IMG=...`.
    let c = gateway(with_gateway());
    assert_eq!(c["image"], manager(rendered())["image"]);
    let pod = &object(with_gateway(), "Deployment", GATEWAY)["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], GATEWAY);
    assert_eq!(c["resources"]["requests"]["cpu"], "50m");
    assert_eq!(c["resources"]["requests"]["memory"], "64Mi");
    assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
    assert!(
        c["resources"]["limits"]["cpu"].is_null(),
        "no CPU throttling"
    );
    assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "64Mi");
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/tmp");
    // It stops accepting only once the Service has stopped sending to it.
    assert_eq!(c["lifecycle"]["preStop"]["sleep"]["seconds"], 5);
}

#[tokio::test]
async fn the_gateway_pod_template_is_admitted_by_the_real_restricted_pod_security() {
    judged_by_restricted_pod_security(|name| pod_of(with_gateway(), GATEWAY, name)).await;
}

#[test]
fn the_gateways_service_and_network_policy_reach_its_ports() {
    let docs = with_gateway();
    let d = object(docs, "Deployment", GATEWAY);
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let manager_labels =
        &object(docs, "Deployment", DEPLOYMENT)["spec"]["template"]["metadata"]["labels"];
    let c = gateway(docs);

    // The args listen where the container ports say; probes hit the probe
    // server the args start.
    for (flag, port) in [
        ("--gateway-bind-address", "proxy"),
        ("--discovery-bind-address", "discovery"),
        ("--metrics-bind-address", "metrics"),
        ("--health-probe-bind-address", "probes"),
    ] {
        assert_eq!(
            arg(c, flag),
            Some(format!(":{}", port_of(c, port)).as_str()),
            "{flag}"
        );
    }
    assert_eq!(strs(&c["args"])[0], "gateway", "the subcommand comes first");
    assert_eq!(port_of(c, "proxy"), 3128);
    assert_eq!(port_of(c, "discovery"), 8090);
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "probes");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "probes");

    // Its Service selects its Pods only, and the manager's Services,
    // PDB and NetworkPolicy do not select them.
    let s = object(docs, "Service", GATEWAY);
    assert!(selects(&s["spec"]["selector"], pod_labels));
    assert!(!selects(&s["spec"]["selector"], manager_labels));
    let ports: Vec<(&str, i64, &str)> = s["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["port"].as_i64().unwrap(),
                p["targetPort"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("proxy", 3128, "proxy"), ("api", 8090, "discovery")]
    );
    for other in docs.iter().filter(|o| {
        o["metadata"]["name"]
            .as_str()
            .is_some_and(|n| !n.contains("gateway"))
    }) {
        let selector = match other["kind"].as_str() {
            Some("Service") => &other["spec"]["selector"],
            Some("PodDisruptionBudget") => &other["spec"]["selector"]["matchLabels"],
            Some("NetworkPolicy") => &other["spec"]["podSelector"]["matchLabels"],
            _ => continue,
        };
        assert!(
            !selects(selector, pod_labels),
            "{} selects the gateway's Pods",
            other["metadata"]["name"]
        );
    }

    // Its /metrics has a Service of its own, which the shipped
    // ServiceMonitor selects with the manager's.
    let metrics = object(
        docs,
        "Service",
        "egress-proxies-operator-gateway-metrics-service",
    );
    assert!(selects(&metrics["spec"]["selector"], pod_labels));
    assert!(!selects(&metrics["spec"]["selector"], manager_labels));
    assert_eq!(metrics["spec"]["ports"][0]["port"], port_of(c, "metrics"));
    assert_eq!(metrics["spec"]["ports"][0]["targetPort"], "metrics");
    let monitoring = kustomize("config/prometheus");
    let monitor = monitoring
        .iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .expect("config/prometheus has a ServiceMonitor");
    for name in [
        "egress-proxies-operator-gateway-metrics-service",
        "egress-proxies-operator-controller-manager-metrics-service",
    ] {
        let labels = &object(docs, "Service", name)["metadata"]["labels"];
        assert!(
            selects(&monitor["spec"]["selector"]["matchLabels"], labels),
            "the ServiceMonitor does not scrape {name}"
        );
    }

    let pdb = object(docs, "PodDisruptionBudget", GATEWAY);
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);

    // Ingress: 3128 and 8090 from every namespace, 8443 from namespaces
    // labelled metrics=enabled; nothing else.
    let np = object(
        docs,
        "NetworkPolicy",
        "egress-proxies-operator-gateway-allow-proxy-api-and-metrics",
    );
    assert!(selects(
        &np["spec"]["podSelector"]["matchLabels"],
        pod_labels
    ));
    assert!(!selects(
        &np["spec"]["podSelector"]["matchLabels"],
        manager_labels
    ));
    assert_eq!(strs(&np["spec"]["policyTypes"]), ["Ingress"]);
    let rules: Vec<(Vec<i64>, Value)> = np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ports = r["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["port"].as_i64().unwrap())
                .collect();
            (ports, r["from"].clone())
        })
        .collect();
    assert_eq!(
        rules,
        [
            (
                vec![3128, 8090],
                serde_json::json!([{"namespaceSelector": {}}])
            ),
            (
                vec![8443],
                serde_json::json!([{"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}}])
            ),
        ]
    );
    // The gateway follows the leader on the manager's 8090: the manager's
    // policy admits that port from every namespace, its own included.
    let manager_np = object(
        docs,
        "NetworkPolicy",
        "egress-proxies-operator-allow-discovery-and-metrics",
    );
    assert!(manager_np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["ports"][0]["port"] == 8090
            && r["from"] == serde_json::json!([{"namespaceSelector": {}}])));
}

/// The verbs the gateway's RBAC grants on (group, resource), the
/// resourceNames they are limited to (empty: any), all of them.
fn granted(rules: &[PolicyRule]) -> Vec<(String, String, Vec<String>, Vec<String>)> {
    let mut out: Vec<_> = rules
        .iter()
        .flat_map(|r| {
            list(&r.api_groups).iter().flat_map(move |g| {
                list(&r.resources).iter().map(move |res| {
                    let mut verbs = r.verbs.clone();
                    verbs.sort();
                    (
                        g.clone(),
                        res.clone(),
                        verbs,
                        list(&r.resource_names).to_vec(),
                    )
                })
            })
        })
        .collect();
    out.sort();
    out
}

fn rule(
    group: &str,
    resource: &str,
    verbs: &[&str],
    names: &[&str],
) -> (String, String, Vec<String>, Vec<String>) {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    (group.into(), resource.into(), s(verbs), s(names))
}

#[test]
fn the_gateway_gets_least_privilege_rbac() {
    let docs = with_gateway();
    let (cluster, namespaced) = rules_of(docs, NS, GATEWAY);
    for r in &cluster {
        assert!(r.non_resource_urls.is_none(), "{r:?}");
    }
    // Cluster-wide: the Proxy cache and the two reviews of secure
    // /metrics. No Secret (the leader hands over the credentials), no
    // write of any object.
    assert_eq!(
        granted(&cluster),
        [
            rule("authentication.k8s.io", "tokenreviews", &["create"], &[]),
            rule(
                "authorization.k8s.io",
                "subjectaccessreviews",
                &["create"],
                &[]
            ),
            rule("crawl.example.com", "proxies", &["list", "watch"], &[]),
        ]
    );
    // In the install namespace: the election Lease read (never written:
    // the gateway never campaigns) and the gateway key Secret read and, by
    // the first replica to start, created (create cannot be limited to a
    // name). No lease hand-over Secrets.
    assert_eq!(namespaced.len(), 1, "{namespaced:?}");
    let (ns, rules) = &namespaced[0];
    assert_eq!(ns, NS);
    let gateway_key = egress_proxies_operator::replica::lease_key::GATEWAY_SECRET_NAME;
    let election = egress_proxies_operator::api::constants::LEADER_ELECTION_ID;
    assert_eq!(
        granted(rules),
        [
            rule("", "secrets", &["create"], &[]),
            rule("", "secrets", &["get"], &[gateway_key]),
            rule("coordination.k8s.io", "leases", &["get"], &[election]),
        ]
    );
    // Nothing of the manager's is bound to it.
    let binds_gateway = |d: &&Value| {
        d["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == GATEWAY)
    };
    for b in docs.iter().filter(binds_gateway) {
        assert!(
            b["roleRef"]["name"].as_str().unwrap().starts_with(GATEWAY),
            "{b}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_policy_confines_the_managers_secret_writes_to_labelled_ones() {
    // RBAC grants the manager Secret writes in every namespace; the
    // shipped ValidatingAdmissionPolicy, enforced by the real API server,
    // lets through only the labelled credentials Secrets outside the
    // manager's own namespace. The calls are made as the manager's
    // ServiceAccount (a token from `kubectl create token`).
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{DeleteParams, Patch, PatchParams};
    let ground = support::ground_without_pods("secret-policy").await;
    let c = ground.cluster;
    support::shipped::apply_rbac(c, rendered());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = support::shipped::service_account_kubeconfig(c, (NS, SA), dir.path());
    let manager = test_cluster::launch::client(&kubeconfig).await.unwrap();
    let ns = ground.ns.as_str();
    let (theirs_api, own_api): (Api<Secret>, Api<Secret>) = (
        Api::namespaced(manager.clone(), ns),
        Api::namespaced(manager, NS),
    );
    let secret = |name: &str, labelled: bool| -> Secret {
        let labels = match labelled {
            true => serde_json::json!({"crawl.example.com/proxy-credentials": "true"}),
            false => serde_json::json!({}),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "stringData": {"username": "u", "password": "p"}}))
        .unwrap()
    };
    fn said<T>(r: Result<T, kube::Error>) -> Result<(), String> {
        match r {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) => Err(e.message),
            Err(e) => panic!("not an answer of the API server: {e}"),
        }
    }
    let create_generic = |name: &str| {
        let literal = "--from-literal=k=v";
        ground.kubectl(&["create", "secret", "generic", name, literal]);
    };
    let pp = PostParams::default();
    // A policy takes effect once the API server compiled it: wait for its
    // first refusal.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match said(theirs_api.create(&pp, &secret("unlabelled", false)).await) {
            Err(message) => break message,
            Ok(()) => c.kubectl_ok(&["-n", ns, "delete", "secret", "unlabelled"]),
        };
        assert!(
            std::time::Instant::now() < deadline,
            "the manager created an unlabelled Secret in {ns} for 30 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains("secret-writes")
            && refused.contains("crawl.example.com/proxy-credentials=true")
            && refused.contains(&format!("CREATE of Secret {ns}/unlabelled")),
        "{refused}"
    );
    // The credentials Secrets it makes go through, and stay labelled.
    said(theirs_api.create(&pp, &secret("labelled", true)).await).unwrap();
    let merge = |v: serde_json::Value| Patch::Merge(v);
    let unlabel =
        serde_json::json!({"metadata": {"labels": {"crawl.example.com/proxy-credentials": null}}});
    let label = serde_json::json!({"metadata": {"labels": {"crawl.example.com/proxy-credentials": "true"}}});
    let pa = PatchParams::default();
    let message = said(theirs_api.patch("labelled", &pa, &merge(unlabel)).await).unwrap_err();
    assert!(message.contains("UPDATE of Secret"), "{message}");
    let changed = serde_json::json!({"stringData": {"password": "new"}});
    said(
        theirs_api
            .patch("labelled", &pa, &merge(changed.clone()))
            .await,
    )
    .unwrap();
    theirs_api
        .delete("labelled", &DeleteParams::default())
        .await
        .unwrap();
    // Another application's Secret: the manager cannot touch it.
    create_generic("theirs");
    let refusals = [
        said(theirs_api.patch("theirs", &pa, &merge(label)).await),
        said(theirs_api.patch("theirs", &pa, &merge(changed)).await),
        said(theirs_api.delete("theirs", &DeleteParams::default()).await),
    ];
    for r in refusals {
        let message = r.expect_err("the manager wrote another application's Secret");
        assert!(message.contains("secret-writes"), "{message}");
    }
    let kept = ground.kubectl(&["get", "secret", "theirs", "-o", "jsonpath={.data.k}"]);
    assert_eq!(kept, "dg==", "base64 of v");
    // Its own namespace holds its lease key and hand-over Secrets.
    let own = format!("policy-test-{}", ground.ns);
    said(own_api.create(&pp, &secret(&own, false)).await).unwrap();
    own_api
        .delete(&own, &DeleteParams::default())
        .await
        .unwrap();
    // Anyone else is not this policy's business.
    create_generic("admins");
}

/// What one audited request of a user asked for: (verb, group, resource,
/// namespace, name).
type Asked = (String, String, String, Option<String>, Option<String>);

/// The API requests of `user` in the audit log: (allowed, refused).
fn audited(events: &[Value], user: &str) -> (Vec<Asked>, Vec<String>) {
    let (mut allowed, mut refused) = (Vec::new(), Vec::new());
    for e in events.iter().filter(|e| e["user"]["username"] == user) {
        if e["annotations"]["authorization.k8s.io/decision"] == "forbid" {
            let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            refused.push(format!("{} {}", text("verb"), text("requestURI")));
            continue;
        }
        let r = &e["objectRef"];
        let text = |v: &Value| v.as_str().map(String::from);
        if let (Some(verb), Some(resource)) = (text(&e["verb"]), text(&r["resource"])) {
            let group = text(&r["apiGroup"]).unwrap_or_default();
            allowed.push((
                verb,
                group,
                resource,
                text(&r["namespace"]),
                text(&r["name"]),
            ));
        }
    }
    refused.sort();
    refused.dedup();
    (allowed, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_on_its_deployment_under_exactly_its_rbac() {
    // The Deployment's args and env, run by the real binary as the
    // gateway's ServiceAccount (a token from `kubectl create token`) under
    // the RBAC the component renders, applied to the real test cluster;
    // only its ports move to free loopback ones, as parallel tests share
    // this host. It must serve as crawlers use it, and the audit log must
    // show no request refused, every granted verb used, and no write but
    // the gateway key and the metrics reviews.
    const TOKEN: &str = "gateway-manifest-token";
    let ground = support::ground_without_pods("gateway-rbac").await;
    let c = ground.cluster;
    let docs = with_gateway();
    support::shipped::apply_rbac(c, docs);
    // The API server takes the rest of the component as rendered.
    let rest: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(GATEWAY))
        })
        .filter(|d| {
            [
                "Deployment",
                "Service",
                "PodDisruptionBudget",
                "NetworkPolicy",
            ]
            .contains(&d["kind"].as_str().unwrap_or_default())
        })
        .collect();
    assert_eq!(
        rest.len(),
        5,
        "Deployment, two Services, PDB, NetworkPolicy"
    );
    let list = tempfile::NamedTempFile::new().unwrap();
    let items = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": rest});
    std::fs::write(list.path(), items.to_string()).unwrap();
    let dry = c.kubectl_ok(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        list.path().to_str().unwrap(),
    ]);
    assert_eq!(dry.matches("(server dry run)").count(), rest.len(), "{dry}");
    let lease_key = egress_proxies_operator::replica::lease_key::SECRET_NAME;
    let gateway_key = egress_proxies_operator::replica::lease_key::GATEWAY_SECRET_NAME;
    // Absent, as at a first install, so the gateway's create is exercised.
    c.kubectl_ok(&[
        "-n",
        NS,
        "delete",
        "secret",
        gateway_key,
        "--ignore-not-found",
    ]);
    // The API server's own answer: the gateway reads no Secret outside
    // its namespace, and there only the gateway key (never the lease
    // signing key: it cannot sign a lease id).
    let user = format!("system:serviceaccount:{NS}:{GATEWAY}");
    for (args, want) in [
        (vec!["list", "secrets", "-A"], "no"),
        (vec!["get", "secrets", "-n", "default"], "no"),
        (vec!["list", "secrets", "-n", NS], "no"),
        (vec!["get", &format!("secret/{lease_key}"), "-n", NS], "no"),
        (
            vec!["get", &format!("secret/{gateway_key}"), "-n", NS],
            "yes",
        ),
    ] {
        let out = c
            .kubectl()
            .args(["auth", "can-i", "--as", &user])
            .args(&args)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(said, want, "can-i {args:?} as the gateway");
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = support::shipped::service_account_kubeconfig(c, (NS, GATEWAY), dir.path());
    // A scraper bound to the shipped metrics-reader role.
    ground.kubectl(&["create", "serviceaccount", "scraper"]);
    c.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &format!("{}-gateway-scraper", ground.ns),
        "--clusterrole=egress-proxies-operator-metrics-reader",
        &format!("--serviceaccount={}:scraper", ground.ns),
    ]);
    let scraper = ground.kubectl(&["create", "token", "scraper"]);

    let container = gateway(docs);
    let addrs: std::collections::BTreeMap<&str, std::net::SocketAddr> = [
        "--health-probe-bind-address",
        "--metrics-bind-address",
        "--discovery-bind-address",
        "--gateway-bind-address",
    ]
    .into_iter()
    .map(|f| (f, support::loopback()))
    .collect();
    let args: Vec<String> = strs(&container["args"])
        .into_iter()
        .map(|a| match a.split_once('=') {
            Some((flag, _)) if addrs.contains_key(flag) => format!("{flag}={}", addrs[flag]),
            _ => a.to_string(),
        })
        .collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
    cmd.args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .env("TMPDIR", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("POD_IP");
    // The env as the kubelet would set it: the token Secret's value, the
    // downward API, $(VAR) expanded from the variables before it.
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().unwrap() {
        let value = if let Some(v) = e["value"].as_str() {
            env.iter()
                .fold(v.to_string(), |v, (n, x)| v.replace(&format!("$({n})"), x))
        } else if !e["valueFrom"]["secretKeyRef"].is_null() {
            TOKEN.to_string()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => "egress-proxies-operator-gateway-0".to_string(),
                Some("metadata.namespace") => NS.to_string(),
                _ => panic!("an env source this test does not stand in for: {e}"),
            }
        };
        env.push((e["name"].as_str().unwrap().to_string(), value));
    }
    cmd.envs(env);
    let log = dir.path().join("gateway.log");
    let _gateway = support::Operator::spawn(cmd, &log);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    let refused = || audited(&c.audit_events(), &user).1;
    let probes = addrs["--health-probe-bind-address"];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while support::raw_call(probes, None, ("GET", "/readyz"), None, "")
        .await
        .is_none_or(|(status, _)| status != 200)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not ready in 60 s; refused: {:#?}\n{}",
            refused(),
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The proxy port: a crawler without the token is asked for it; with
    // it, the gateway chooses among the fleet it watches, cluster-wide
    // (other tests' Proxies too): in a namespace with none, a 503.
    let gw = addrs["--gateway-bind-address"];
    let url = "http://example.invalid/";
    let anonymous = support::curl_status(&format!("http://{gw}"), url);
    assert_eq!(anonymous, "407", "{}", log_text());
    let nowhere = format!("http://default-ns-nowhere:{TOKEN}@{gw}");
    let signed_in = support::curl_status(&nowhere, url);
    assert_eq!(signed_in, "503", "{}", log_text());
    // The discovery port takes the session reports of this gateway.
    let body = serde_json::to_vec(&serde_json::json!({"result": "blocked"})).unwrap();
    let api = addrs["--discovery-bind-address"];
    let (status, v) =
        support::api_call(api, "POST", "/v1/sessions/s1/report", Some(TOKEN), body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("session_not_found")),
        "{v}"
    );
    // Secure /metrics: the scraper reads the gateway's series.
    let metrics = addrs["--metrics-bind-address"];
    let (status, text) = support::https_get(metrics, "/metrics", Some(scraper.trim()));
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("proxy_operator_gateway_requests_total"),
        "{text}"
    );

    // Every verb granted, used; nothing refused; no write but these.
    let (cluster, namespaced) = rules_of(docs, NS, GATEWAY);
    let in_ns = namespaced
        .into_iter()
        .flat_map(|(_, r)| r)
        .collect::<Vec<_>>();
    let unused = |seen: &[Asked]| -> Vec<String> {
        let mut out = Vec::new();
        for (rules, ns) in [(&cluster, None), (&in_ns, Some(NS))] {
            for (group, resource, verbs, names) in granted(rules) {
                for verb in verbs {
                    let used = seen.iter().any(|(v, g, r, n, name)| {
                        (v, g, r) == (&verb, &group, &resource)
                            && ns.is_none_or(|ns| n.as_deref() == Some(ns))
                            && (names.is_empty() || names.iter().any(|x| Some(x) == name.as_ref()))
                    });
                    if !used {
                        out.push(format!("{verb} {group}/{resource} {names:?}"));
                    }
                }
            }
        }
        out
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (allowed, refused) = loop {
        let (allowed, refused) = audited(&c.audit_events(), &user);
        let left = unused(&allowed);
        if left.is_empty() {
            break (allowed, refused);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "granted, never used: {left:#?}\nrefused: {refused:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(refused.is_empty(), "refused: {refused:#?}\n{}", log_text());
    for (verb, group, resource, _, name) in &allowed {
        let reads = ["get", "list", "watch"].contains(&verb.as_str());
        let allowed_write = verb == "create"
            && match resource.as_str() {
                "secrets" => name.as_deref() == Some(gateway_key),
                "tokenreviews" | "subjectaccessreviews" => true,
                _ => false,
            };
        assert!(
            reads || allowed_write,
            "the gateway wrote: {verb} {group}/{resource} {name:?}"
        );
    }
    let election = egress_proxies_operator::api::constants::LEADER_ELECTION_ID;
    assert!(
        allowed
            .iter()
            .any(|(v, _, r, _, n)| v == "get" && r == "leases" && n.as_deref() == Some(election)),
        "it follows the election Lease"
    );
    c.kubectl_ok(&["-n", NS, "get", "secret", gateway_key]);
    assert!(!log_text().contains(TOKEN), "the token reached the log");
}
