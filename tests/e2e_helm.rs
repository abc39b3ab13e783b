//! The Helm chart (config/helm/egress-proxies-operator) with the real
//! `helm` built from tests/cluster/go/helm: its defaults render the objects
//! config/default renders (so the two never drift), and with
//! `gateway.enabled` those plus config/components/gateway's; its schema refuses
//! wrong types naming the key, and on the real test cluster it installs,
//! runs a Proxy through a real Squid Pod, upgrades with changed values and
//! uninstalls leaving no operator objects (the CRDs only when asked).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use kube::api::Api;
use serde_json::{json, Value};
use support::*;

const CHART: &str = "config/helm/egress-proxies-operator";
/// The release and namespace that make the chart's names those of config/default.
const RELEASE: &str = "egress-proxies-operator";
const NS: &str = "egress-proxies-operator-system";
const DEPLOYMENT: &str = "egress-proxies-operator-controller-manager";

/// The pinned helm, with its cache and config in `home` (never the user's),
/// talking to `kubeconfig` when given.
fn helm(home: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(test_cluster::bin("helm"));
    cmd.args(args)
        .current_dir(repo())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBERNETES_SERVICE_HOST");
    match kubeconfig {
        Some(k) => cmd.env("KUBECONFIG", k),
        None => cmd.env("KUBECONFIG", home.join("no-cluster")),
    };
    cmd.output()
        .expect("helm runs (make test-cluster builds it)")
}

fn helm_ok(home: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> String {
    let out = helm(home, kubeconfig, args);
    assert!(
        out.status.success(),
        "helm {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// `helm template` of the chart as the release that reproduces
/// config/default's names, with `--set` values.
fn template(home: &Path, sets: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", NS];
    for s in sets {
        args.extend(["--set", s]);
    }
    yaml_docs(&helm_ok(home, None, &args))
}

/// Label keys only helm sets (release bookkeeping); kustomize has none of them.
const HELM_LABELS: [&str; 4] = [
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

/// An object as the comparison sees it: helm's own labels (wherever a label
/// map is, selectors too) and annotations dropped, maps left empty by that
/// removed, and the providers file parsed (the chart writes it with toYaml).
fn normalized(v: &Value) -> Value {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut out = serde_json::Map::new();
                for (k, x) in m {
                    if HELM_LABELS.contains(&k.as_str())
                        || k.starts_with("checksum/")
                        || k == "helm.sh/resource-policy"
                    {
                        continue;
                    }
                    let x = strip(x);
                    let emptied = matches!(&x, Value::Object(o) if o.is_empty())
                        && matches!(k.as_str(), "labels" | "annotations");
                    if !emptied {
                        out.insert(k.clone(), x);
                    }
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    let mut v = strip(v);
    // kustomize does not know these kinds are cluster-scoped and gives
    // them its namespace, which the API server drops.
    if [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    .contains(&v["kind"].as_str().unwrap_or_default())
    {
        if let Some(meta) = v["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
    }
    if v["kind"] == "ConfigMap" {
        if let Some(Value::String(text)) = v["data"].get("providers.yaml").cloned() {
            let parsed: Value = serde_norway::from_str(&text).unwrap();
            v["data"]["providers.yaml"] = parsed;
        }
    }
    v
}

fn by_key(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter()
        .filter(|d| d["kind"] != "Namespace") // helm installs into an existing (or --create-namespace) one
        .map(|d| {
            let key = format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            );
            (key, normalized(d))
        })
        .collect()
}

/// Every difference between two object sets, one line each, field by field.
fn differences(kustomize: &[Value], helm: &[Value]) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                    let p = format!("{path}.{k}");
                    match (x.get(k), y.get(k)) {
                        (Some(u), Some(v)) => walk(&p, u, v, out),
                        (Some(u), None) => out.push(format!("{p}: only kustomize has it ({u})")),
                        (None, Some(v)) => out.push(format!("{p}: only helm has it ({v})")),
                        (None, None) => {}
                    }
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (u, v)) in x.iter().zip(y).enumerate() {
                    walk(&format!("{path}[{i}]"), u, v, out);
                }
            }
            _ if a != b => out.push(format!("{path}: kustomize {a}, helm {b}")),
            _ => {}
        }
    }
    let (k, h) = (by_key(kustomize), by_key(helm));
    let mut out = Vec::new();
    for name in k.keys().chain(h.keys().filter(|n| !k.contains_key(*n))) {
        match (k.get(name), h.get(name)) {
            (Some(a), Some(b)) => walk(name, a, b, &mut out),
            (Some(_), None) => out.push(format!("{name}: only kustomize renders it")),
            (None, Some(_)) => out.push(format!("{name}: only helm renders it")),
            (None, None) => {}
        }
    }
    out
}

#[test]
fn the_comparison_sees_a_changed_field_and_ignores_helms_labels() {
    let base = json!({"kind": "Service", "metadata": {"name": "s", "labels": {"a": "b"}}, "spec": {"ports": [{"port": 1}]}});
    let mut helmish = base.clone();
    helmish["metadata"]["labels"]["helm.sh/chart"] = json!("x-1");
    helmish["metadata"]["labels"]["app.kubernetes.io/instance"] = json!("r");
    assert_eq!(
        differences(std::slice::from_ref(&base), &[helmish]),
        Vec::<String>::new()
    );
    let mut changed = base.clone();
    changed["spec"]["ports"][0]["port"] = json!(2);
    assert_eq!(
        differences(std::slice::from_ref(&base), &[changed]),
        vec!["Service/s.spec.ports[0].port: kustomize 1, helm 2"]
    );
    assert_eq!(
        differences(&[base], &[]),
        vec!["Service/s: only kustomize renders it"]
    );
}

/// config/default plus config/prometheus with config/default's namespace
/// and prefix: what the chart renders with the Prometheus objects on.
fn kustomize_with_prometheus() -> Vec<Value> {
    // Inside the checkout (kustomize takes only relative paths), under
    // target/, which a clean clone whose cargo target lives elsewhere
    // does not have.
    let scratch = repo().join("target");
    std::fs::create_dir_all(&scratch).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("helm-drift")
        .tempdir_in(&scratch)
        .unwrap();
    let rel = |p: &str| {
        let depth = dir
            .path()
            .strip_prefix(repo())
            .unwrap()
            .components()
            .count();
        format!("{}{p}", "../".repeat(depth))
    };
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {NS}\nnamePrefix: {RELEASE}-\nresources:\n- {}\n",
            rel("config/prometheus")
        ),
    )
    .unwrap();
    let mut docs = kustomize("config/default");
    docs.extend(kustomize(dir.path().to_str().unwrap()));
    docs
}

#[test]
fn the_charts_defaults_render_what_config_default_renders() {
    let home = tempfile::tempdir().unwrap();
    let kustomized = kustomize("config/default");
    let helmed = template(home.path(), &[]);
    // Not vacuous: the whole installation, CRDs and RBAC included.
    assert!(
        by_key(&kustomized).len() >= 17,
        "{:?}",
        by_key(&kustomized).keys()
    );
    let diff = differences(&kustomized, &helmed);
    assert!(
        diff.is_empty(),
        "the chart and config/default drifted:\n{}",
        diff.join("\n")
    );

    let kustomized = kustomize_with_prometheus();
    let helmed = template(
        home.path(),
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
        ],
    );
    let diff = differences(&kustomized, &helmed);
    assert!(
        diff.is_empty(),
        "the chart's Prometheus objects and config/prometheus drifted:\n{}",
        diff.join("\n")
    );

    // The gateway: config/default with its component's line uncommented.
    let kustomized = kustomize_default_with("gateway");
    let helmed = template(home.path(), &["gateway.enabled=true"]);
    assert!(
        by_key(&kustomized).contains_key("Deployment/egress-proxies-operator-gateway"),
        "{:?}",
        by_key(&kustomized).keys()
    );
    let diff = differences(&kustomized, &helmed);
    assert!(
        diff.is_empty(),
        "the chart's gateway and config/components/gateway drifted:\n{}",
        diff.join("\n")
    );
}

#[test]
fn the_chart_lints_and_its_toggles_render_their_objects() {
    let home = tempfile::tempdir().unwrap();
    helm_ok(home.path(), None, &["lint", "--strict", CHART]);

    // Packaged (as a chart repository serves it), the linked sources are
    // stored in the archive: it renders the same objects as the directory.
    let dest = home.path().join("package");
    let dest_s = dest.to_str().unwrap();
    helm_ok(home.path(), None, &["package", CHART, "-d", dest_s]);
    let archive = std::fs::read_dir(&dest)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let packaged = yaml_docs(&helm_ok(
        home.path(),
        None,
        &[
            "template",
            RELEASE,
            archive.to_str().unwrap(),
            "--namespace",
            NS,
        ],
    ));
    let diff = differences(&template(home.path(), &[]), &packaged);
    assert!(
        diff.is_empty(),
        "the packaged chart differs:\n{}",
        diff.join("\n")
    );

    let kinds = |docs: &[Value]| by_key(docs).into_keys().collect::<Vec<_>>();
    let off = template(
        home.path(),
        &[
            "crds.enabled=false",
            "kubernetesProvider.rbac=false",
            "networkPolicy.enabled=false",
            "metrics.service.enabled=false",
        ],
    );
    for gone in [
        "CustomResourceDefinition/proxies.crawl.example.com",
        "ClusterRole/egress-proxies-operator-manager-pods-role",
        "NetworkPolicy/egress-proxies-operator-allow-discovery-and-metrics",
        "Service/egress-proxies-operator-controller-manager-metrics-service",
    ] {
        assert!(
            !kinds(&off).iter().any(|k| k == gone),
            "{gone} still rendered"
        );
    }

    // The gateway's objects come only with gateway.enabled; its PDB and
    // NetworkPolicy have toggles of their own.
    let gateway_objects = |docs: &[Value]| {
        kinds(docs)
            .into_iter()
            .filter(|k| k.contains("-gateway"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        gateway_objects(&template(home.path(), &[])),
        Vec::<String>::new()
    );
    let annotated = "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=epo@p.iam.gserviceaccount.com";
    let gateway_on = template(
        home.path(),
        &[
            "gateway.enabled=true",
            "gateway.service.port=8080",
            "gateway.extraArgs[0]=--gateway-max-connections=500",
            annotated,
        ],
    );
    assert_eq!(
        gateway_objects(&gateway_on),
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
    let service = object(&gateway_on, "Service", "egress-proxies-operator-gateway");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "proxy");
    let gateway = object(&gateway_on, "Deployment", "egress-proxies-operator-gateway");
    let args = &gateway["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[0], "gateway");
    assert_eq!(
        args.as_array().unwrap().last().unwrap(),
        "--gateway-max-connections=500"
    );
    // The manager's cloud identity stays the manager's.
    let annotations =
        |name: &str| object(&gateway_on, "ServiceAccount", name)["metadata"]["annotations"].clone();
    assert!(!annotations(DEPLOYMENT).is_null());
    assert!(annotations("egress-proxies-operator-gateway").is_null());
    let without = template(
        home.path(),
        &[
            "gateway.enabled=true",
            "gateway.pdb.enabled=false",
            "gateway.networkPolicy.enabled=false",
        ],
    );
    let left = gateway_objects(&without);
    assert!(left.contains(&"Deployment/egress-proxies-operator-gateway".to_string()));
    assert!(
        !left
            .iter()
            .any(|k| k.starts_with("PodDisruptionBudget/") || k.starts_with("NetworkPolicy/")),
        "{left:?}"
    );

    let on = template(
        home.path(),
        &[
            "metrics.dashboard.enabled=true",
            "discoveryToken.generate=true",
            "kvmSsh.create=true",
            "kvmSsh.privateKey=KEY",
            "kvmSsh.knownHosts=HOSTS",
            "otel.endpoint=http://collector:4317",
            "otel.protocol=grpc",
            "gateway.enabled=true",
        ],
    );
    let dashboard = object(&on, "ConfigMap", "egress-proxies-operator-dashboard");
    let json_text = dashboard["data"]["egress-proxies-operator.json"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(json_text).unwrap(),
        serde_json::from_str::<Value>(&repo_file("config/grafana/egress-proxies-operator.json"))
            .unwrap()
    );
    let deployment = object(&on, "Deployment", DEPLOYMENT);
    let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
    let env_var = |n: &str| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .cloned()
    };
    assert_eq!(
        env_var("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap()["value"],
        "grpc"
    );
    // discoveryToken.generate: the operator makes the token (no variable,
    // no Secret rendered), and the gateway watches the same Secret.
    assert!(env_var("DISCOVERY_TOKEN").is_none(), "{env}");
    let args = |d: &Value| d["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    let manager_args = args(deployment);
    for wanted in [
        "--discovery-tokens-secret=egress-proxies-operator-discovery-token",
        "--generate-discovery-token=default",
    ] {
        assert!(
            manager_args.as_array().unwrap().contains(&json!(wanted)),
            "{manager_args}"
        );
    }
    assert!(
        !on.iter().any(|d| d["kind"] == "Secret"
            && d["metadata"]["name"] == "egress-proxies-operator-discovery-token"),
        "the chart renders no token"
    );
    let gateway_args = args(object(&on, "Deployment", "egress-proxies-operator-gateway"));
    let gateway_args = gateway_args.as_array().unwrap();
    assert!(gateway_args.contains(&json!(
        "--discovery-tokens-secret=egress-proxies-operator-discovery-token"
    )));
    assert!(!gateway_args.contains(&json!("--generate-discovery-token=default")));
    // Reading no Secret cluster-wide, the gateway gets list and watch of
    // that one Secret, bound to its ServiceAccount.
    let role = object(&on, "Role", "egress-proxies-operator-gateway-tokens-role");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"],
            "resourceNames": ["egress-proxies-operator-discovery-token"],
            "verbs": ["list", "watch"]}])
    );
    let binding = object(
        &on,
        "RoleBinding",
        "egress-proxies-operator-gateway-tokens-rolebinding",
    );
    assert_eq!(
        binding["roleRef"]["name"],
        "egress-proxies-operator-gateway-tokens-role"
    );
    assert_eq!(
        binding["subjects"][0]["name"],
        "egress-proxies-operator-gateway"
    );
    let ssh = object(&on, "Secret", "egress-proxies-operator-kvm-ssh");
    assert_eq!(ssh["data"]["known_hosts"], "SE9TVFM="); // base64 of HOSTS

    // kvmSsh.create without the key is refused with the keys to set.
    let out = helm(
        home.path(),
        None,
        &["template", RELEASE, CHART, "--set", "kvmSsh.create=true"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("kvmSsh.privateKey"));

    // A tokens Secret named twice is refused, naming both ways.
    let out = helm(
        home.path(),
        None,
        &[
            "template",
            RELEASE,
            CHART,
            "--set",
            "discoveryToken.generate=true",
            "--set",
            "extraArgs={--discovery-tokens-secret=mine}",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("drop --discovery-tokens-secret from extraArgs"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Under Argo CD or `helm template | kubectl apply` nothing is read back
/// from the cluster: two renders with a generated token must be the same
/// objects, or every sync would hand crawlers a new token (401).
#[test]
fn two_renders_with_a_generated_token_are_the_same() {
    let home = tempfile::tempdir().unwrap();
    let render = || {
        let sets = ["discoveryToken.generate=true", "gateway.enabled=true"];
        template(home.path(), &sets)
    };
    let (first, second) = (render(), render());
    assert_eq!(first, second);
    let rendered = serde_json::to_string(&first).unwrap();
    assert!(rendered.contains("--generate-discovery-token=default"));
}

/// A values file setting each of the chart's escape hatches: a pinned
/// digest, ServiceAccount annotations (Workload Identity), Pod labels, a
/// priority class, topology spread, and an extra
/// volume mounted into the manager (a probe CA, as `--probe-ca-file`
/// would read it).
#[tokio::test]
async fn the_charts_gateway_reads_its_tokens_secret_and_no_other() {
    // The chart's gateway, watching a generated tokens Secret, under the
    // RBAC the chart renders for it, on the real API server: a list and a
    // watch of that Secret by name go through; any other Secret read is
    // refused.
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{ListParams, WatchParams};
    let ground = ground_without_pods("gw-tokens").await;
    let c = ground.cluster;
    let home = tempfile::tempdir().unwrap();
    let ns = ground.ns.as_str();
    let args = [
        "template",
        "tok",
        CHART,
        "--namespace",
        ns,
        "--set",
        "gateway.enabled=true",
        "--set",
        "discoveryToken.generate=true",
    ];
    let docs = yaml_docs(&helm_ok(home.path(), None, &args));
    let gateway = "tok-egress-proxies-operator-gateway";
    let wanted = |d: &&Value| match d["kind"].as_str() {
        Some("ServiceAccount") => d["metadata"]["name"] == gateway,
        Some("Role" | "RoleBinding") => d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("tok-egress-proxies-operator-gateway-tokens")),
        _ => false,
    };
    let items: Vec<&Value> = docs.iter().filter(wanted).collect();
    assert_eq!(
        items.len(),
        3,
        "the gateway's ServiceAccount, tokens Role and binding"
    );
    let file = home.path().join("rbac.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    std::fs::write(&file, list.to_string()).unwrap();
    c.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
    let tokens = "tok-egress-proxies-operator-discovery-token";
    ground.kubectl(&[
        "create",
        "secret",
        "generic",
        tokens,
        "--from-literal=default=t0k",
    ]);
    ground.kubectl(&["create", "secret", "generic", "other", "--from-literal=k=v"]);
    let kubeconfig = shipped::service_account_kubeconfig(c, (ns, gateway), home.path());
    let client = test_cluster::launch::client(&kubeconfig).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client, ns);
    let by_name = format!("metadata.name={tokens}");
    let listed = secrets
        .list(&ListParams::default().fields(&by_name))
        .await
        .expect("its tokens Secret, listed by name");
    assert_eq!(listed.items.len(), 1);
    let events = secrets
        .watch(&WatchParams::default().fields(&by_name).timeout(5), "0")
        .await
        .expect("its tokens Secret, watched by name");
    let mut events = std::pin::pin!(events);
    match futures::StreamExt::next(&mut events).await {
        Some(Ok(kube::api::WatchEvent::Added(s))) => {
            assert_eq!(s.metadata.name.as_deref(), Some(tokens))
        }
        other => panic!("the watch's first event: {other:?}"),
    }
    let forbidden = |r: Result<(), kube::Error>, what: &str| match r {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{what}: {e:?}"),
        other => panic!("{what} was not refused: {other:?}"),
    };
    forbidden(
        secrets.list(&ListParams::default()).await.map(drop),
        "a list of every Secret",
    );
    forbidden(secrets.get("other").await.map(drop), "another Secret");
    let other = "metadata.name=other";
    forbidden(
        secrets
            .list(&ListParams::default().fields(other))
            .await
            .map(drop),
        "another Secret by name",
    );
    forbidden(
        secrets
            .watch(&WatchParams::default().fields(other).timeout(1), "0")
            .await
            .map(drop),
        "a watch of another Secret",
    );
}

fn escape_hatches(dir: &Path) -> std::path::PathBuf {
    let v = json!({
        "image": {"repository": "registry.example/epo", "digest": format!("sha256:{}", "ab".repeat(32))},
        "podLabels": {"team": "crawl"},
        "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "epo@project.iam.gserviceaccount.com"}},
        "priorityClassName": "system-cluster-critical",
        "topologySpreadConstraints": [{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"control-plane": "controller-manager"}},
        }],
        "extraVolumes": [{"name": "probe-ca", "secret": {"secretName": "probe-ca", "optional": true}}],
        "extraVolumeMounts": [{"name": "probe-ca", "mountPath": "/etc/probe-ca", "readOnly": true}],
        "extraArgs": ["--probe-ca-file=/etc/probe-ca/ca.crt", "--max-leases-per-proxy=3"],
        // The gateway's Pods go elsewhere than the manager's.
        "gateway": {
            "enabled": true,
            "nodeSelector": {"node-role.example/edge": "true"},
            "tolerations": [{"key": "edge", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-node-critical",
            "podLabels": {"team": "gateway"},
            "podAnnotations": {"example/owner": "crawl"},
        },
    });
    let file = dir.join("escape-hatches.json");
    std::fs::write(&file, v.to_string()).unwrap();
    file
}

#[test]
fn the_escape_hatches_render_into_the_pod() {
    let home = tempfile::tempdir().unwrap();
    let values = escape_hatches(home.path());
    let docs = yaml_docs(&helm_ok(
        home.path(),
        None,
        &[
            "template",
            RELEASE,
            CHART,
            "--namespace",
            NS,
            "-f",
            values.to_str().unwrap(),
        ],
    ));
    let deployment = object(&docs, "Deployment", DEPLOYMENT);
    let account = object(&docs, "ServiceAccount", DEPLOYMENT);
    assert_eq!(
        account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
        "epo@project.iam.gserviceaccount.com"
    );
    let pod = &deployment["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "crawl");
    assert_eq!(
        pod["metadata"]["labels"]["control-plane"], "controller-manager",
        "the selector labels stay"
    );
    let spec = &pod["spec"];
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(spec["topologySpreadConstraints"][0]["maxSkew"], 1);
    let manager = &spec["containers"][0];
    assert_eq!(
        manager["image"],
        format!("registry.example/epo@sha256:{}", "ab".repeat(32))
    );
    let named =
        |list: &Value, name: &str| list.as_array().unwrap().iter().any(|v| v["name"] == name);
    assert!(named(&spec["volumes"], "probe-ca"), "{}", spec["volumes"]);
    assert!(
        named(&spec["volumes"], "providers-config"),
        "the chart's own volumes stay"
    );
    assert!(named(&manager["volumeMounts"], "probe-ca"));
    assert!(named(&manager["volumeMounts"], "tmp"));
    assert!(
        spec["nodeSelector"].is_null(),
        "the gateway's placement is its own"
    );
    // The gateway's own scheduling values, and the manager's lease bound
    // passed on (it judges exclusive leases by it).
    let gateway =
        &object(&docs, "Deployment", "egress-proxies-operator-gateway")["spec"]["template"];
    assert_eq!(gateway["metadata"]["labels"]["team"], "gateway");
    assert_eq!(
        gateway["metadata"]["labels"]["app.kubernetes.io/component"],
        "gateway"
    );
    assert_eq!(gateway["metadata"]["annotations"]["example/owner"], "crawl");
    let gspec = &gateway["spec"];
    assert_eq!(gspec["nodeSelector"]["node-role.example/edge"], "true");
    assert_eq!(gspec["tolerations"][0]["key"], "edge");
    assert_eq!(gspec["priorityClassName"], "system-node-critical");
    assert!(gspec["topologySpreadConstraints"].is_null());
    let gargs = gspec["containers"][0]["args"].as_array().unwrap();
    assert!(
        gargs.contains(&json!("--max-leases-per-proxy=3")),
        "{gargs:?}"
    );
    assert!(!gargs.contains(&json!("--probe-ca-file=/etc/probe-ca/ca.crt")));
    // Its own bound wins over the manager's.
    let own = template(
        home.path(),
        &[
            "gateway.enabled=true",
            "extraArgs[0]=--max-leases-per-proxy=3",
            "gateway.extraArgs[0]=--max-leases-per-proxy=5",
        ],
    );
    let gargs = object(&own, "Deployment", "egress-proxies-operator-gateway")["spec"]["template"]
        ["spec"]["containers"][0]["args"]
        .clone();
    let bounds: Vec<&Value> = gargs
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a.as_str().unwrap().starts_with("--max-leases"))
        .collect();
    assert_eq!(bounds, [&json!("--max-leases-per-proxy=5")]);
    // A digest that is not one is refused, naming the key.
    let out = helm(
        home.path(),
        None,
        &["template", RELEASE, CHART, "--set", "image.digest=latest"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("digest"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Case {
    name: &'static str,
    set: &'static str,
    /// What the error must name: the value's path in the schema.
    names: &'static str,
}

#[test]
fn the_schema_refuses_wrong_types_naming_the_key() {
    let home = tempfile::tempdir().unwrap();
    let cases = [
        Case {
            name: "replicas as a word",
            set: "replicas=two",
            names: "/replicas",
        },
        Case {
            name: "keep as a word",
            set: "crds.keep=yes",
            names: "/crds/keep",
        },
        Case {
            name: "an unknown provider type",
            set: "providers[0].type=aws",
            names: "/providers/0/type",
        },
        Case {
            name: "a misspelt key",
            set: "metrics.serviceMonitor.enable=true",
            names: "/metrics/serviceMonitor",
        },
        Case {
            name: "an OTLP protocol helm cannot pass on",
            set: "otel.protocol=udp",
            names: "/otel/protocol",
        },
        Case {
            name: "an extra arg that is no flag",
            set: "extraArgs[0]=debug",
            names: "/extraArgs/0",
        },
        Case {
            name: "the gateway on as a word",
            set: "gateway.enabled=yes",
            names: "/gateway/enabled",
        },
        Case {
            name: "the gateway's port by name",
            set: "gateway.service.port=proxy",
            names: "/gateway/service/port",
        },
        Case {
            name: "a gateway extra arg that is no flag",
            set: "gateway.extraArgs[0]=debug",
            names: "/gateway/extraArgs/0",
        },
        Case {
            name: "a misspelt gateway key",
            set: "gateway.pdb.enable=false",
            names: "/gateway/pdb",
        },
    ];
    for case in cases {
        for verb in ["template", "lint"] {
            let args: Vec<&str> = if verb == "lint" {
                vec!["lint", CHART, "--set", case.set]
            } else {
                vec!["template", RELEASE, CHART, "--set", case.set]
            };
            let out = helm(home.path(), None, &args);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !out.status.success(),
                "{}: helm {verb} accepted {}",
                case.name,
                case.set
            );
            assert!(
                text.contains(case.names),
                "{}: helm {verb} must name {}: {text}",
                case.name,
                case.names
            );
        }
    }
}

/// The objects of the release still in the cluster (by its instance label).
fn release_objects(c: &test_cluster::TestCluster, release: &str) -> Vec<String> {
    let kinds = "deployments,replicasets,pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,networkpolicies,poddisruptionbudgets,clusterroles,clusterrolebindings";
    let selector = format!("app.kubernetes.io/instance={release}");
    c.kubectl_ok(&["get", kinds, "-A", "-l", &selector, "-o", "name"])
        .lines()
        .map(str::to_string)
        .collect()
}

async fn no_release_objects_left(c: &test_cluster::TestCluster) {
    eventually(
        "no release objects left",
        Duration::from_secs(120),
        || async { release_objects(c, RELEASE).is_empty().then_some(()) },
    )
    .await;
}

fn crd_present(c: &test_cluster::TestCluster) -> bool {
    c.kubectl()
        .args(["get", "crd", "proxies.crawl.example.com"])
        .output()
        .unwrap()
        .status
        .success()
}

/// `kubectl get pods` of the operator's Pods, printed with `jsonpath`.
fn manager_pods(c: &test_cluster::TestCluster, jsonpath: &str) -> String {
    let jsonpath = format!("jsonpath={jsonpath}");
    c.kubectl_ok(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        "control-plane=controller-manager",
        "-o",
        &jsonpath,
    ])
}

fn discovery_token(c: &test_cluster::TestCluster) -> String {
    let b64 = c.kubectl_ok(&[
        "-n",
        NS,
        "get",
        "secret",
        "egress-proxies-operator-discovery-token",
        "-o",
        "jsonpath={.data.default}",
    ]);
    let out = Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            use std::io::Write;
            p.stdin.take().unwrap().write_all(b64.as_bytes())?;
            p.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn rolled_out(c: &test_cluster::TestCluster) {
    let deployment = format!("deployment/{DEPLOYMENT}");
    c.kubectl_ok(&["-n", NS, "rollout", "status", &deployment, "--timeout=180s"]);
}

#[tokio::test]
async fn e2e_helm_install_upgrade_uninstall() {
    require_squid_pods();
    let c = cluster();
    let client = c.client().await;
    let kubeconfig = Some(c.kubeconfig());
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let target = http_target_on(c.host_ip()).await;

    // Values as a user writes them: the providers file opens the probe
    // target (a private address on the cluster bridge), the probe points
    // at it, the discovery token is generated.
    let providers: Value =
        serde_norway::from_str(&support::kubernetes_reaching("kubernetes", "", target.ip()))
            .unwrap();
    let values = |extra: Value| {
        let mut v = json!({
            "providers": providers["providers"],
            "discoveryToken": {"generate": true},
            "extraArgs": [format!("--default-probe-url=http://{target}/"), "--default-probe-expected-status=200"],
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let file = home.join(format!("values-{}.json", v.to_string().len()));
        std::fs::write(&file, v.to_string()).unwrap();
        file
    };
    let first = values(json!({}));
    let first = first.to_str().unwrap();

    // 1. helm template, validated by the real API server (server-side dry
    // run): the defaults, and the escape hatches.
    c.kubectl_ok(&["create", "namespace", NS]);
    let hatches = escape_hatches(home);
    for (n, file) in [first, hatches.to_str().unwrap()].into_iter().enumerate() {
        let rendered = helm_ok(
            home,
            None,
            &["template", RELEASE, CHART, "-n", NS, "-f", file],
        );
        let manifest = home.join(format!("rendered-{n}.yaml"));
        std::fs::write(&manifest, &rendered).unwrap();
        let dry = c.kubectl_ok(&[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            manifest.to_str().unwrap(),
        ]);
        assert!(dry.contains("deployment.apps/egress-proxies-operator-controller-manager serverside-applied (server dry run)"), "{file}: {dry}");
    }

    // 2. helm install; the operator becomes Ready.
    let installed = helm_ok(
        home,
        kubeconfig,
        &["install", RELEASE, CHART, "-n", NS, "-f", first],
    );
    // The release notes tell where the generated token is.
    assert!(
        installed.contains("get secret egress-proxies-operator-discovery-token"),
        "{installed}"
    );
    rolled_out(c);
    let token = discovery_token(c);
    assert!(token.len() >= 32, "a generated token: {token:?}");

    // 3. A kubernetes-provider Proxy becomes Ready through a real Squid Pod.
    let ns = c.namespace(&client, "helm").await;
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &ns);
    proxies
        .create(&Default::default(), &kube_proxy("via-helm"))
        .await
        .unwrap();
    eventually("Proxy via-helm Ready", Duration::from_secs(180), || async {
        let p = proxies.get("via-helm").await.ok()?;
        (phase(&p) == Some("Ready")).then_some(())
    })
    .await;

    // The discovery API offers it, with the generated token only.
    if c.is_local() {
        let pod_ip = manager_pods(c, "{.items[0].status.podIP}");
        let addr = std::net::SocketAddr::new(pod_ip.parse().unwrap(), 8090);
        let (status, _) = api_call(addr, "GET", "/v1/proxies", None, vec![]).await;
        assert_eq!(status, 401, "the discovery API without the token");
        let (status, body) = api_call(addr, "GET", "/v1/proxies", Some(&token), vec![]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["items"].as_array().map(Vec::len), Some(1), "{body}");
    }

    // 4. helm upgrade with changed values: the two replicas at debug and a
    // second provider, seen in the running Deployment and a new
    // ProviderHealth; the generated token survives the upgrade.
    let mut two = providers["providers"].clone();
    let mut added = two[0].clone();
    added["name"] = json!("kubernetes-2");
    two.as_array_mut().unwrap().push(added);
    let second = values(json!({"replicas": 2, "logLevel": "debug", "providers": two}));
    let upgrade = |file: &std::path::Path| {
        let args = [
            "upgrade",
            RELEASE,
            CHART,
            "-n",
            NS,
            "-f",
            file.to_str().unwrap(),
        ];
        helm_ok(home, kubeconfig, &args)
    };
    upgrade(&second);
    rolled_out(c);
    let ready = c.kubectl_ok(&[
        "-n",
        NS,
        "get",
        "deployment",
        DEPLOYMENT,
        "-o",
        "jsonpath={.status.readyReplicas}",
    ]);
    assert_eq!(ready, "2", "two replicas Ready after the upgrade");
    // Every Pod left (the old ones gone) runs at debug.
    eventually("two Pods at debug", Duration::from_secs(120), || async {
        let args = manager_pods(
            c,
            "{range .items[*]}{.spec.containers[0].args}{\"\\n\"}{end}",
        );
        let pods: Vec<&str> = args.lines().filter(|l| !l.is_empty()).collect();
        (pods.len() == 2 && pods.iter().all(|a| a.contains("--log-level=debug"))).then_some(())
    })
    .await;
    assert_eq!(
        discovery_token(c),
        token,
        "the upgrade must keep the generated token"
    );
    // Ready after the upgrade. The new leader's first probes through the
    // Squid Pod timed out three times in a row (5 s each) once in the full
    // suite on 2 cores, marking it Running for a while; the cause is left
    // open in issue 31's note.
    eventually(
        "the Proxy Ready after the upgrade",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("via-helm").await.ok()?;
            (phase(&p) == Some("Ready")).then_some(())
        },
    )
    .await;
    let health: Api<ProviderHealth> = Api::all(client.clone());
    eventually(
        "ProviderHealth kubernetes-2 from the upgraded providers",
        Duration::from_secs(120),
        || async { health.get_opt("kubernetes-2").await.ok()? },
    )
    .await;

    // 4b. helm upgrade changing the providers alone: the running Pods
    // reload the file (no checksum annotation restarts them); a
    // ProviderHealth for the third provider says the reload happened.
    let pods_before = manager_pods(c, "{.items[*].metadata.uid}");
    let mut three = two.clone();
    let mut third = three[0].clone();
    third["name"] = json!("kubernetes-3");
    three.as_array_mut().unwrap().push(third);
    let reloaded = values(json!({"replicas": 2, "logLevel": "debug", "providers": three}));
    let upgraded = upgrade(&reloaded);
    assert!(
        upgraded.contains("providers config reload"),
        "the notes say how to see a reload: {upgraded}"
    );
    let asked = std::time::Instant::now();
    eventually(
        "ProviderHealth kubernetes-3 by a reload",
        Duration::from_secs(120),
        || async { health.get_opt("kubernetes-3").await.ok()? },
    )
    .await;
    println!(
        "providers reloaded {:?} after helm upgrade",
        asked.elapsed()
    );
    assert_eq!(
        manager_pods(c, "{.items[*].metadata.uid}"),
        pods_before,
        "a providers change restarts no Pod"
    );

    // 5. helm uninstall (Proxies first, so the operator runs their
    // finalizers): no operator object is left; the CRDs are (crds.keep).
    assert!(
        release_objects(c, RELEASE).len() >= 15,
        "{:?}",
        release_objects(c, RELEASE)
    );
    c.kubectl_ok(&["delete", "px", "--all", "-A", "--wait", "--timeout=120s"]);
    helm_ok(
        home,
        kubeconfig,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout=120s"],
    );
    no_release_objects_left(c).await;
    assert!(crd_present(c), "crds.keep must leave the CRDs");

    // 6. With crds.keep=false the release adopts the kept CRDs and its
    // uninstall removes them.
    helm_ok(
        home,
        kubeconfig,
        &[
            "install",
            RELEASE,
            CHART,
            "-n",
            NS,
            "-f",
            first,
            "--set",
            "crds.keep=false",
        ],
    );
    helm_ok(
        home,
        kubeconfig,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout=120s"],
    );
    eventually("the CRDs gone", Duration::from_secs(60), || async {
        (!crd_present(c)).then_some(())
    })
    .await;
    no_release_objects_left(c).await;
    c.kubectl_ok(&["delete", "namespace", NS, "--timeout=120s"]);
}
