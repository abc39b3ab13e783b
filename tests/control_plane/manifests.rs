//! The shipped manifests: `kubectl kustomize config/default` renders, the
//! manager Deployment keeps the runtime envelope (operator.md §9.1), its
//! args and providers file are ones the binary accepts, and RBAC grants no
//! more than the rules checked here. (tests/e2e_samples.rs runs the
//! operator under these RBAC rules and checks each one is needed.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use serde_json::Value;
use std::process::Command;
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
    assert_eq!(c["image"], "example.com/egress-proxies-operator:v0.0.1");
    assert_eq!(pod["serviceAccountName"], SA);
    object(docs, "ServiceAccount", SA);
    // Above the 24 s a stopping leader may take to hand its leases over.
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
}

/// The manager's pod template as a Pod, in no namespace.
fn manager_pod(name: &str) -> Value {
    let d = object(rendered(), "Deployment", DEPLOYMENT);
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
    // The real PodSecurity admission of kube-apiserver, in a namespace
    // enforcing `restricted` as the shipped one does, judges a Pod made
    // from the manager's template (server-side dry run: nothing runs).
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
    // The template runs as the manager's ServiceAccount, which the
    // ServiceAccount admission wants to exist.
    let sa = manager_pod("x")["spec"]["serviceAccountName"]
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

    let admitted = dry_run(&pods, manager_pod("manager")).await;
    assert!(
        admitted.is_ok(),
        "the restricted PodSecurity refused the manager's pod template: {admitted:?}"
    );

    // The check can fail: a variant allowed to escalate privileges is
    // refused, naming PodSecurity. (`privileged: true` itself never reaches
    // PodSecurity: this API server disallows privileged containers and
    // validation refuses it next to allowPrivilegeEscalation=false, 422.)
    let mut bad = manager_pod("escalating");
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
    let state: Vec<String> = (0..egress_proxies_operator::operator::handover::MAX_CHUNKS)
        .map(|i| format!("egress-proxies-operator-lease-state-{i}"))
        .collect();
    for r in rules {
        let resources = list(&r.resources);
        assert!(
            resources == ["leases"] || resources == ["secrets"],
            "{resources:?}"
        );
        if r.verbs != ["create"] {
            let names: Vec<String> = if resources == ["leases"] {
                vec!["egress-proxies-operator.crawl.example.com".into()]
            } else if r.verbs == ["get"] {
                vec!["egress-proxies-operator-lease-key".into()]
            } else {
                assert_eq!(r.verbs, ["get", "update"], "{resources:?}");
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
    let parent = support::repo().join("target");
    std::fs::create_dir_all(&parent).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("no-pods-")
        .tempdir_in(&parent)
        .unwrap();
    let default =
        std::fs::read_to_string(support::repo().join("config/default/kustomization.yaml")).unwrap();
    let rel = pathdiff(dir.path());
    let text: String = default
        .lines()
        .filter(|l| !l.contains("components/kubernetes-provider") && !l.starts_with("components:"))
        .map(|l| {
            if let Some(rest) = l.strip_prefix("- ../") {
                format!("- {rel}/config/{rest}\n")
            } else if l == "- metrics_service.yaml" {
                format!("- {rel}/config/default/metrics_service.yaml\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    // Plain files must sit inside the kustomization root: copy the Service.
    let text = text.replace(
        &format!("- {rel}/config/default/metrics_service.yaml\n"),
        "- metrics_service.yaml\n",
    );
    std::fs::copy(
        support::repo().join("config/default/metrics_service.yaml"),
        dir.path().join("metrics_service.yaml"),
    )
    .unwrap();
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    let rel_dir = dir
        .path()
        .strip_prefix(support::repo())
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let docs = kustomize(&rel_dir);
    let (cluster, _) = rules_of(&docs, NS, SA);
    assert!(grants(&cluster, "", "pods").is_empty());
    assert!(!grants(&cluster, "crawl.example.com", "proxies").is_empty());
}

/// `../..` from `dir` back to the repository root.
fn pathdiff(dir: &std::path::Path) -> String {
    let depth = dir
        .strip_prefix(support::repo())
        .unwrap()
        .components()
        .count();
    vec![".."; depth].join("/")
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
