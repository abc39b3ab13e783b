//! Credentials revoked and restored while Proxies are Ready (issue 17, and
//! issue 18's system test): the provider refuses the operator (the gcp
//! stand-in answers 401 to every call) until each Proxy's instance has been
//! asked for at least once and refused; meanwhile no Proxy becomes Failed
//! or leaves Ready (each shows `Provisioned=Unknown/ProviderUnavailable`), and the discovery API keeps listing every one, since
//! their probes through a real Squid keep passing. After the credentials
//! come back, every Proxy is Ready with its provider condition True again,
//! with no edit.

use crate::gcp_standin::{self, StandIn};
use crate::support;

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use kube::api::PostParams;
use kube::Api;
use serde_json::json;
use support::shipped::{apply_kinds, apply_rbac, token_kubeconfig};
use support::squid::{self, Squid};
use support::{condition, eventually, phase, Operator};

const PROXIES: usize = 2;
const TOKEN: &str = "revoke-test-token";
/// The stand-in's methods, each refused while the credentials are revoked.
const METHODS: [&str; 5] = ["insert", "get", "delete", "list", "op"];
/// Refusals queued per method: more than the operator can use up in the
/// test's time.
const REFUSALS: usize = 100_000;

/// The names the discovery API lists.
async fn listed(api: SocketAddr) -> BTreeSet<String> {
    let (status, body) = support::api_call(api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every Proxy's name, phase and `Provisioned` condition (status and
/// reason).
async fn states(proxies: &Api<Proxy>) -> Vec<(String, Option<&'static str>, (String, String))> {
    proxies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let provisioned = condition(&p, "Provisioned")
                .map(|c| (c.status.as_str().to_string(), c.reason.clone()))
                .unwrap_or_default();
            (p.metadata.name.clone().unwrap(), phase(&p), provisioned)
        })
        .collect()
}

fn revoke(standin: &StandIn) {
    standin.with(|s| {
        for m in METHODS {
            let q = s.inject.entry(m.into()).or_default();
            q.extend(std::iter::repeat_n(
                gcp_standin::Inject {
                    status: 401,
                    reason: "authError".into(),
                    message: "Request had invalid authentication credentials.".into(),
                },
                REFUSALS,
            ));
        }
    });
}

fn restore(standin: &StandIn) {
    standin.with(|s| s.inject.clear());
}

/// The operator with `providers`, its discovery API on `api` (token
/// [`TOKEN`]) and its probes fetching `target` through each proxy.
fn serving(
    ground: &support::Ground,
    dir: &std::path::Path,
    providers: &str,
    api: SocketAddr,
    target: SocketAddr,
) -> std::process::Command {
    let mut cmd = ground.operator(dir, providers);
    cmd.args([
        "--discovery-bind-address",
        &api.to_string(),
        "--default-probe-url",
        &format!("http://{target}/"),
        "--default-probe-expected-status",
        "200",
    ])
    .env("DISCOVERY_TOKEN", TOKEN);
    cmd
}

/// Waits until every Proxy is Ready and listed; then `revoke`s and polls
/// until `refused` and (with `per_proxy`) every Proxy shows
/// `ProviderUnavailable`, asserting
/// throughout that none is Failed, none leaves Ready and the discovery API
/// lists all; then `restore`s and waits until every Proxy is
/// `Provisioned=True` and listed again. Returns the measured cells.
async fn ride_out(
    proxies: &Api<Proxy>,
    api: SocketAddr,
    names: &BTreeSet<String>,
    revoke: impl FnOnce(),
    restore: impl FnOnce(),
    refused: impl Fn() -> bool,
    per_proxy: bool,
) -> String {
    eventually(
        "every Proxy Ready and listed",
        Duration::from_secs(120),
        || async {
            let all_ready = states(proxies)
                .await
                .iter()
                .all(|(_, ph, _)| *ph == Some("Ready"));
            (all_ready && listed(api).await == *names).then_some(())
        },
    )
    .await;
    revoke();
    let revoked_at = Instant::now();
    let checks = Cell::new(0usize);
    let unavailable_seen = RefCell::new(BTreeSet::new());
    eventually(
        "every Proxy refused while Ready",
        Duration::from_secs(180),
        || async {
            checks.set(checks.get() + 1);
            for (name, ph, (_, reason)) in states(proxies).await {
                assert_ne!(ph, Some("Failed"), "{name} Failed while its probe passes");
                assert_eq!(
                    ph,
                    Some("Ready"),
                    "{name} left Ready while its probe passes"
                );
                if reason == "ProviderUnavailable" {
                    unavailable_seen.borrow_mut().insert(name);
                }
            }
            assert_eq!(listed(api).await, *names, "left the discovery pool");
            let shown = !per_proxy || unavailable_seen.borrow().len() == names.len();
            (refused() && shown).then_some(())
        },
    )
    .await;
    let revoked_for = revoked_at.elapsed();

    // Restored: Ready with the provider condition True again, no edit.
    restore();
    let restored_at = Instant::now();
    eventually(
        "every Proxy Ready and Provisioned again",
        Duration::from_secs(240),
        || async {
            let s = states(proxies).await;
            for (name, ph, _) in &s {
                assert_eq!(*ph, Some("Ready"), "{name} left Ready after the restore");
            }
            let provisioned = s.iter().all(|(_, _, (c, _))| c == "True");
            (provisioned && listed(api).await == *names).then_some(())
        },
    )
    .await;
    format!(
        "revoked {revoked_for:.0?}; Failed 0; left Ready 0; left the discovery pool 0 ({} checks); Provisioned=Unknown/ProviderUnavailable on {} of {}; all Provisioned=True again {:.1?} after the restore, with no edit",
        checks.get(),
        unavailable_seen.borrow().len(),
        names.len(),
        restored_at.elapsed()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_gcp_credentials_revoked_and_restored_lose_no_ready_proxy() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    squid::require();
    let ground = support::ground_without_pods("revoke-gcp").await;
    let standin = StandIn::start_for(Duration::from_secs(900)).await;
    standin.with(|s| s.running_after_gets = 1);
    let target = support::http_target().await;
    let dir = tempfile::tempdir().unwrap();
    let api: SocketAddr = support::loopback();
    let providers = format!(
        "providers:\n  - name: gcp\n    type: gcp\n    gcp:\n      project: my-project\n      networkTag: egress-proxy\n      endpoint: {}\n      anonymous: true\n      allowedPorts: [\"1-65535\"]\n",
        standin.url
    );
    let cmd = serving(&ground, dir.path(), &providers, api, target);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();

    // Each instance gets a NAT IP on 127.0.0.0/8 from the stand-in; a real
    // Squid on that address and the Proxy's port plays the VM's.
    let mut squids: Vec<Squid> = Vec::new();
    let mut names = BTreeSet::new();
    let mut instance_paths = Vec::new();
    for i in 0..PROXIES {
        let name = format!("r{i}");
        let port = support::free_port();
        let proxy = support::proxy(
            &name,
            json!({
                "provider": "gcp",
                "port": port,
                "placement": {"zone": gcp_standin::ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
                "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
            }),
        );
        proxies
            .create(&PostParams::default(), &proxy)
            .await
            .unwrap();
        let (ip, id) = eventually(
            &format!("{name} Running"),
            Duration::from_secs(90),
            || async {
                let s = proxies.get(&name).await.ok()?.status?;
                Some((s.ip?.parse::<IpAddr>().ok()?, s.provider_id?))
            },
        )
        .await;
        let IpAddr::V4(ip) = ip else {
            panic!("{name}: {ip}")
        };
        squids.push(squid::start(ip, port, &name, "http_access allow me").await);
        instance_paths.push(format!("/{id}"));
        names.insert(name);
    }
    let before: Vec<usize> = instance_paths
        .iter()
        .map(|p| standin.count("GET", p))
        .collect();
    // Refused: each instance asked for (its next resync) since.
    let refused = || {
        instance_paths
            .iter()
            .zip(&before)
            .all(|(p, b)| standin.count("GET", p) > *b)
    };
    let figures = ride_out(
        &proxies,
        api,
        &names,
        || revoke(&standin),
        || restore(&standin),
        refused,
        true,
    )
    .await;
    println!(
        "| gcp credentials revoked (the stand-in answers 401 to every call) until each of {PROXIES} Ready Proxies' instance was refused; then restored | {figures} |"
    );
    drop(squids);
}

/// The shipped ServiceAccount's namespace and name (config/default).
const SHIPPED_NS: &str = "egress-proxies-operator-system";
const SHIPPED_SA: &str = "egress-proxies-operator-controller-manager";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kubernetes_pod_rbac_revoked_and_restored_lose_no_ready_proxy() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    support::require_squid_pods();
    let ground = support::ground("revoke-kube").await;
    let c = ground.cluster;
    // The operator runs as the shipped ServiceAccount under the shipped
    // RBAC, whose Pod permissions are a binding of their own
    // (config/components/kubernetes-provider): that binding is revoked.
    let docs = support::kustomize("config/default");
    apply_rbac(c, &docs);
    // The operator's namespace is the test's: the shipped namespaced Role
    // (the election Lease, the lease key Secret) is bound there as it is in
    // the install namespace.
    let here: Vec<serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding")
        .cloned()
        .map(|mut d| {
            d["metadata"]["namespace"] = serde_json::Value::from(ground.ns.clone());
            d
        })
        .collect();
    apply_kinds(c, &here, &["Role", "RoleBinding"]);
    let pods_binding = docs
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRoleBinding"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("pods"))
        })
        .expect("config/default binds the Pod permissions on their own")
        .clone();
    let binding_name = pods_binding["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let token = c.kubectl_ok(&[
        "create",
        "token",
        SHIPPED_SA,
        "-n",
        SHIPPED_NS,
        "--duration=1h",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("manager.kubeconfig");
    std::fs::write(&kubeconfig, token_kubeconfig(c, token.trim())).unwrap();
    let target = support::http_target_on(ground.host_ip()).await;
    let api: SocketAddr = support::loopback();
    let providers = support::kubernetes_reaching("kubernetes", "", target.ip());
    let mut cmd = serving(&ground, dir.path(), &providers, api, target);
    cmd.env("KUBECONFIG", &kubeconfig);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    let mut names = BTreeSet::new();
    for i in 0..PROXIES {
        let name = format!("k{i}");
        proxies
            .create(&PostParams::default(), &support::kube_proxy(&name))
            .await
            .unwrap();
        names.insert(name);
    }
    let figures = ride_out(
        &proxies,
        api,
        &names,
        || {
            c.kubectl_ok(&["delete", "clusterrolebinding", &binding_name]);
        },
        || apply_kinds(c, &[pods_binding], &["ClusterRoleBinding"]),
        // A Running Proxy is answered from the operator's Pod watch, which
        // the revoke does not cut: no per-Proxy call is refused, so none
        // shows ProviderUnavailable. The provider's check (a Pod list) is
        // refused, and `kubectl get ph` says so.
        || {
            c.kubectl()
                .args([
                    "get",
                    "providerhealth",
                    "kubernetes",
                    "-o",
                    "jsonpath={.status.targetsReady}",
                ])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0/1")
        },
        false,
    )
    .await;
    println!(
        "| kubernetes: the shipped ClusterRoleBinding of the operator's Pod permissions (`{binding_name}`) deleted while {PROXIES} Proxies are Ready through their Squid Pods; then applied again | {figures} |"
    );
}

/// kvm: the host stops accepting the operator's SSH key (authorized_keys
/// holds another key, and the live session is killed, so the provider must
/// dial again) while a Proxy's domain runs. The harness's guests get no
/// address, so the Proxy is Provisioning, not Ready: asserted is that it
/// never turns Failed, shows `ProviderUnavailable`, and leaves it with no
/// edit once the key is accepted again.
#[cfg(feature = "kvm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kvm_ssh_key_revoked_and_restored_fails_no_proxy() {
    use crate::kvm_support::{self, Env};
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let env = Env::start("revoke");
    let (url, _) = env.serve_qcow2("base.qcow2", "64M");
    let ground = support::ground_without_pods("revoke-kvm").await;
    let dir = tempfile::tempdir().unwrap();
    let _op = Operator::spawn(
        ground.operator(
            dir.path(),
            &env.providers_yaml("kvm", "h1", "test-image", &url),
        ),
        &dir.path().join("operator.log"),
    );
    let proxies: Api<Proxy> = ground.proxies();
    let created = proxies
        .create(
            &PostParams::default(),
            &support::proxy(
                "v0",
                json!({
                    "provider": "kvm", "port": 3128,
                    "placement": {"zone": "h1", "machineType": "small", "image": "test-image"},
                    "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
                }),
            ),
        )
        .await
        .unwrap();
    env.track(&egress_proxies_operator::provider::naming::name_from_uid(
        &created.metadata.uid.clone().unwrap(),
    ));
    eventually("v0's domain recorded", Duration::from_secs(180), || async {
        proxies.get("v0").await.ok()?.status?.provider_id
    })
    .await;

    let keys = env.dir.path().join("authorized_keys");
    let ours = std::fs::read_to_string(&keys).unwrap();
    let stranger = env.dir.path().join("stranger_key");
    kvm_support::new_ed25519_key(&stranger);
    std::fs::write(
        &keys,
        std::fs::read_to_string(stranger.with_extension("pub")).unwrap(),
    )
    .unwrap();
    // The provider keeps one session per host: end it (the sshd's
    // per-connection children), so the next call dials and is refused.
    for pid in env.sshd_pids().iter().skip(1) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", pid])
            .status();
    }
    let revoked_at = Instant::now();
    let checks = Cell::new(0usize);
    eventually(
        "v0 to show ProviderUnavailable, never Failed",
        Duration::from_secs(120),
        || async {
            checks.set(checks.get() + 1);
            let (name, ph, (_, reason)) = states(&proxies).await.remove(0);
            assert_ne!(ph, Some("Failed"), "{name} Failed while the key is refused");
            (reason == "ProviderUnavailable").then_some(())
        },
    )
    .await;
    let noticed = revoked_at.elapsed();
    std::fs::write(&keys, ours).unwrap();
    let restored_at = Instant::now();
    let (ph, reason) = eventually(
        "v0 to leave ProviderUnavailable with no edit",
        Duration::from_secs(240),
        || async {
            checks.set(checks.get() + 1);
            let (name, ph, (_, reason)) = states(&proxies).await.remove(0);
            assert_ne!(ph, Some("Failed"), "{name} Failed after the restore");
            (reason != "ProviderUnavailable").then_some((ph, reason))
        },
    )
    .await;
    println!(
        "| kvm: the host's authorized_keys swapped for another key and the operator's SSH session killed, while a Proxy's domain runs (Provisioning: the harness's guests get no address); then the key restored | Failed 0 ({} checks); ProviderUnavailable {noticed:.1?} after the revocation; {} / {reason} again {:.1?} after the restore, with no edit |",
        checks.get(),
        ph.unwrap_or("-"),
        restored_at.elapsed()
    );
}
