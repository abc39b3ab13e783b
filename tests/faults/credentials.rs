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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_gcp_credentials_revoked_and_restored_lose_no_ready_proxy() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    squid::require();
    let ground = support::ground_without_pods("revoke-gcp").await;
    let standin = StandIn::start_for(Duration::from_secs(900)).await;
    standin.with(|s| s.running_after_gets = 1);
    let target = support::http_target().await;
    let dir = tempfile::tempdir().unwrap();
    let api: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let providers = format!(
        "providers:\n  - name: gcp\n    type: gcp\n    gcp:\n      project: my-project\n      networkTag: egress-proxy\n      endpoint: {}\n      anonymous: true\n",
        standin.url
    );
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args([
        "--discovery-bind-address",
        &api.to_string(),
        "--default-probe-url",
        &format!("http://{target}/"),
        "--default-probe-expected-status",
        "200",
    ])
    .env("DISCOVERY_TOKEN", TOKEN);
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
    eventually(
        "every Proxy Ready and listed",
        Duration::from_secs(90),
        || async {
            let all_ready = states(&proxies)
                .await
                .iter()
                .all(|(_, ph, _)| *ph == Some("Ready"));
            (all_ready && listed(api).await == names).then_some(())
        },
    )
    .await;

    // Revoked: every call is refused until each instance was asked for
    // (its next resync) and refused, and the provider check saw it too.
    let before: Vec<usize> = instance_paths
        .iter()
        .map(|p| standin.count("GET", p))
        .collect();
    revoke(&standin);
    let revoked_at = Instant::now();
    let checks = Cell::new(0usize);
    let unavailable_seen = RefCell::new(BTreeSet::new());
    eventually(
        "every instance refused while Ready",
        Duration::from_secs(180),
        || async {
            checks.set(checks.get() + 1);
            for (name, ph, (_, reason)) in states(&proxies).await {
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
            assert_eq!(listed(api).await, names, "left the discovery pool");
            let refused = instance_paths
                .iter()
                .zip(&before)
                .all(|(p, b)| standin.count("GET", p) > *b);
            (refused && unavailable_seen.borrow().len() == PROXIES).then_some(())
        },
    )
    .await;
    let revoked_for = revoked_at.elapsed();

    // Restored: Ready with the provider condition True again, no edit.
    restore(&standin);
    let restored_at = Instant::now();
    eventually(
        "every Proxy Ready and Provisioned again",
        Duration::from_secs(240),
        || async {
            let s = states(&proxies).await;
            for (name, ph, _) in &s {
                assert_eq!(*ph, Some("Ready"), "{name} left Ready after the restore");
            }
            let provisioned = s.iter().all(|(_, _, (c, _))| c == "True");
            (provisioned && listed(api).await == names).then_some(())
        },
    )
    .await;
    let recovered = restored_at.elapsed();
    println!(
        "| gcp credentials revoked (the stand-in answers 401 to every call) for {revoked_for:.0?}, until each of {PROXIES} Ready Proxies' instance was refused; then restored | Failed 0; left Ready 0; left the discovery pool 0 ({} checks); Provisioned=Unknown/ProviderUnavailable on {} of {PROXIES} while revoked; all Provisioned=True again {recovered:.0?} after the restore, with no edit |",
        checks.get(),
        unavailable_seen.borrow().len()
    );
    drop(squids);
}
