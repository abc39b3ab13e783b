//! System test of ProxyPool (issue 35) on a gcp provider: the real
//! operator binary on the real test cluster, the real Google client
//! against the Compute stand-in, every instance's address a real Squid on
//! loopback, the real garbage collector, `kubectl scale` and `kubectl wait`
//! as a user types them.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use egress_proxies_operator::api::{Proxy, ProxyPool};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};

use crate::e2e_create_limits::providers;
use crate::gcp_standin::{StandIn, ZONE};
use crate::support::{self, api_call, eventually, squid, Operator};

const TOKEN: &str = "pool-gcp-token";
const LEASE_TTL_S: i64 = 20;

/// What a pool test runs against: the test cluster's namespace, the
/// Compute stand-in, an HTTP target, one Squid on loopback serving every
/// instance, and the operator with its discovery API, its leases `ttl`
/// long.
pub(crate) struct PoolWorld {
    pub ground: support::Ground,
    pub standin: StandIn,
    pub target: std::net::SocketAddr,
    pub port: u16,
    pub api: std::net::SocketAddr,
    pub dir: tempfile::TempDir,
    _squid: squid::Squid,
    _op: Operator,
}

impl PoolWorld {
    pub(crate) async fn start(name: &str, token: &str, ttl: &str) -> PoolWorld {
        Self::with_limits(name, token, ttl, "").await
    }

    /// [`PoolWorld::start`] with `limits` in the provider's entry.
    pub(crate) async fn with_limits(name: &str, token: &str, ttl: &str, limits: &str) -> PoolWorld {
        let ground = support::ground_without_pods(name).await;
        let standin = StandIn::serving_on_loopback(Duration::from_secs(900)).await;
        let target = support::http_target().await;
        let tag: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
        let (port, squid) = squid::on_loopback(&tag).await;
        let api = support::loopback();
        let dir = tempfile::tempdir().unwrap();
        let mut cmd =
            ground.discovery_operator(dir.path(), &providers(&standin, limits), api, token);
        cmd.args(["--max-lease-ttl", ttl, "--default-lease-ttl", ttl]);
        let op = Operator::spawn(cmd, &dir.path().join("operator.log"));
        PoolWorld {
            ground,
            standin,
            target,
            port,
            api,
            dir,
            _squid: squid,
            _op: op,
        }
    }

    /// The operator log's last 40 lines, newest first.
    pub(crate) fn log(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("operator.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        format!("operator log (newest first):\n{}", tail.join("\n"))
    }
}

async fn members(proxies: &Api<Proxy>) -> Vec<Proxy> {
    let lp = ListParams::default().labels("crawl.example.com/pool=crawl");
    proxies.list(&lp).await.unwrap().items
}

/// A pool of 5 on the gcp stand-in becomes Ready (`kubectl wait`);
/// `kubectl scale --replicas=8` makes exactly 3 more Proxies and
/// instances; `--replicas=3` removes 5, the unleased first, and deletes a
/// leased one only once its lease has ended; deleting the pool leaves no
/// Proxy and no instance (the garbage collector follows the owner
/// references).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_scales_with_kubectl_without_cutting_a_lease_and_goes_with_its_proxies() {
    squid::require();
    let w = PoolWorld::start("pool", TOKEN, &format!("{LEASE_TTL_S}s")).await;
    let (ground, standin, target, port, api) = (&w.ground, &w.standin, w.target, w.port, w.api);
    let log = || w.log();

    let pools: Api<ProxyPool> = ground.api();
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "crawl"},
        "spec": {"replicas": 5, "template": {
            "metadata": {"labels": {"team": "crawl"}},
            "spec": {
                "provider": "gcp-eu",
                "port": port,
                "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
                "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200, "failureThreshold": 20},
                "recycle": {"drainTimeout": "120s"},
            }}}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let proxies = ground.proxies();
    let started = Instant::now();
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/crawl",
        "--timeout=180s",
    ]);
    println!("pool of 5 Ready after {:?}", started.elapsed());
    let five = members(&proxies).await;
    assert_eq!(five.len(), 5, "{}", log());
    assert_eq!(standin.calls_of("insert"), 5, "one instance each");
    for p in &five {
        let owner = &p.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("ProxyPool", "crawl")
        );
        assert_eq!(p.labels().get("team").map(String::as_str), Some("crawl"));
    }
    let table = ground.kubectl(&["get", "ppool"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "DESIRED", "READY", "LEASED", "PROVIDER", "AGE"],
        "{table}"
    );

    // Scale up: exactly 3 more.
    ground.kubectl(&["scale", "proxypool/crawl", "--replicas=8"]);
    ground.kubectl(&[
        "wait",
        "--for=jsonpath={.status.readyReplicas}=8",
        "proxypool/crawl",
        "--timeout=180s",
    ]);
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/crawl",
        "--timeout=60s",
    ]);
    let eight = members(&proxies).await;
    assert_eq!(eight.len(), 8, "{}", log());
    let five_names: BTreeSet<String> = five.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        eight
            .iter()
            .filter(|p| !five_names.contains(&p.name_any()))
            .count(),
        3,
        "the first five kept, three added"
    );
    assert_eq!(standin.calls_of("insert"), 8, "exactly 3 more instances");

    // Six leases (one per proxy, the fairest choice spreads them), so
    // scaling to 3 must take 3 leased Proxies besides the 2 unleased.
    let mut leased: BTreeMap<String, (String, DateTime<Utc>)> = BTreeMap::new();
    for _ in 0..6 {
        let body = json!({"ttlSeconds": LEASE_TTL_S}).to_string();
        let (code, lease): (u16, Value) =
            api_call(api, "POST", "/v1/leases", Some(TOKEN), body.into()).await;
        assert_eq!(code, 201, "{lease}");
        let name = lease["proxy"]["name"].as_str().unwrap().to_string();
        let ends: DateTime<Utc> = lease["expiresAt"].as_str().unwrap().parse().unwrap();
        leased.insert(name, (lease["id"].as_str().unwrap().to_string(), ends));
    }
    assert_eq!(leased.len(), 6, "six proxies leased: {leased:?}");
    eventually(
        "the pool counts 6 leased",
        Duration::from_secs(30),
        || async {
            let p = pools.get("crawl").await.ok()?;
            (p.status?.leased_replicas == 6).then_some(())
        },
    )
    .await;

    ground.kubectl(&["scale", "proxypool/crawl", "--replicas=3"]);
    let scaled_at = Utc::now();
    // Sampled every 200 ms: when each Proxy was first seen being deleted
    // (or gone).
    let mut went: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = Utc::now();
        let list = members(&proxies).await;
        for p in &eight {
            let name = p.name_any();
            let gone = list
                .iter()
                .find(|q| q.name_any() == name)
                .is_none_or(|q| q.metadata.deletion_timestamp.is_some());
            if gone {
                went.entry(name).or_insert(now);
            }
        }
        if went.len() == 5 && list.len() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not scaled to 3: {went:?}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "scaled 8 -> 3: {:?} after the scale",
        Utc::now() - scaled_at
    );
    let removed_leased: Vec<&String> = went.keys().filter(|n| leased.contains_key(*n)).collect();
    assert_eq!(
        removed_leased.len(),
        3,
        "the 2 unleased went, then 3 leased: {went:?}"
    );
    for name in removed_leased {
        let (_, ends) = leased[name];
        assert!(
            went[name] >= ends,
            "{name} was deleted at {} while its lease ran to {ends}",
            went[name]
        );
    }
    for name in went.keys().filter(|n| !leased.contains_key(*n)) {
        assert!(
            went[name] - scaled_at < chrono::Duration::seconds(LEASE_TTL_S),
            "{name} held no lease: it goes without waiting for the others"
        );
    }
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/crawl",
        "--timeout=60s",
    ]);
    let kept = members(&proxies).await;
    assert!(
        kept.iter().all(|p| leased.contains_key(&p.name_any())),
        "the 3 kept are leased ones"
    );

    // Deleting the pool: the garbage collector deletes its Proxies, their
    // finalizers delete the instances.
    pools.delete("crawl", &Default::default()).await.unwrap();
    eventually(
        "no Proxy and no instance left",
        Duration::from_secs(120),
        || async {
            let left = proxies.list(&ListParams::default()).await.ok()?.items.len();
            (left == 0 && standin.instance_count() == 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        standin.calls_of("insert"),
        8,
        "no instance made while going"
    );
}

/// A pool of 3 on a provider whose `maxInstances` is 2: two Proxies run,
/// the third waits, and the pool says so in `ScalingLimited`
/// (`InstanceLimit`, how many wait and the provider's words) and a
/// Warning Event; raising the pool's size past the cap changes the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_held_by_its_providers_cap_says_so() {
    squid::require();
    let w = PoolWorld::with_limits("pool-cap", TOKEN, "60s", "    maxInstances: 2\n").await;
    let pools: Api<ProxyPool> = w.ground.api();
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "capped"},
        "spec": {"replicas": 3, "template": {"spec": {
            "provider": "gcp-eu",
            "port": w.port,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "healthCheck": {"url": format!("http://{}/", w.target), "expectedStatus": 200, "failureThreshold": 20},
        }}}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let limited = |n: &'static str| {
        let pools = pools.clone();
        async move {
            let s = pools.get("capped").await.ok()?.status?;
            let c = s.conditions.iter().find(|c| c.type_ == "ScalingLimited")?;
            (c.status.as_str() == "True" && c.message.starts_with(n) && s.ready_replicas == 2)
                .then(|| (c.reason.clone(), c.message.clone()))
        }
    };
    let (reason, message) = eventually(
        "ScalingLimited: one Proxy waits",
        Duration::from_secs(120),
        || limited("1 Proxy of the pool waits"),
    )
    .await;
    assert_eq!(reason, "InstanceLimit", "{message}\n{}", w.log());
    assert!(message.contains("maxInstances is 2"), "{message}");
    assert_eq!(w.standin.calls_of("insert"), 2, "the cap holds");
    let events: Api<Event> = w.ground.api();
    let note = support::event_note(&events, "capped", "ScalingLimited").await;
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains("1 Proxy of the pool waits")),
        "a ScalingLimited Event: {note:?}"
    );
    w.ground
        .kubectl(&["scale", "proxypool/capped", "--replicas=4"]);
    eventually(
        "ScalingLimited: two Proxies wait",
        Duration::from_secs(60),
        || limited("2 Proxies of the pool wait"),
    )
    .await;
}

/// The real API server refuses each bad pool, naming the field (the
/// autoscale bounds included).
#[tokio::test]
async fn a_bad_pool_is_refused_naming_its_field() {
    let ground = support::ground_without_pods("pool-bad").await;
    let pools: Api<ProxyPool> = ground.api();
    let template = json!({"spec": {"provider": "gcp-eu", "port": 3128}});
    let cases = [
        (
            "negative replicas",
            json!({"replicas": -1, "template": template}),
            "spec.replicas",
        ),
        (
            "past the cap",
            json!({"replicas": 1001, "template": template}),
            "spec.replicas",
        ),
        (
            "an External template",
            json!({"replicas": 1, "template": {"spec": {"mode": "External", "port": 3128, "endpoint": {"host": "a", "port": 1}}}}),
            "spec.template.spec.mode",
        ),
        (
            "no provider",
            json!({"replicas": 1, "template": {"spec": {"port": 3128}}}),
            "spec.template.spec.provider",
        ),
        (
            "no port",
            json!({"replicas": 1, "template": {"spec": {"provider": "gcp-eu"}}}),
            "spec.template.spec.port",
        ),
        (
            "minReplicas above maxReplicas",
            json!({"template": template, "autoscale": {"minReplicas": 5, "maxReplicas": 2}}),
            "spec.autoscale.minReplicas",
        ),
        (
            "maxReplicas 0",
            json!({"template": template, "autoscale": {"maxReplicas": 0}}),
            "spec.autoscale.maxReplicas",
        ),
        (
            "maxReplicas past the cap",
            json!({"template": template, "autoscale": {"maxReplicas": 1001}}),
            "spec.autoscale.maxReplicas",
        ),
        (
            "targetUtilization over 100",
            json!({"template": template, "autoscale": {"maxReplicas": 2, "targetUtilization": 101}}),
            "spec.autoscale.targetUtilization",
        ),
        (
            "a window that is not a duration",
            json!({"template": template, "autoscale": {"maxReplicas": 2, "scaleToZeroAfter": "soon"}}),
            "spec.autoscale.scaleToZeroAfter",
        ),
    ];
    for (name, spec, field) in cases {
        let pool: ProxyPool = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "bad"}, "spec": spec,
        }))
        .unwrap();
        match pools.create(&PostParams::default(), &pool).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{name}: {e:?}");
                assert!(e.message.contains(field), "{name}: {}", e.message);
            }
            other => panic!("{name}: a bad pool must be refused: {other:?}"),
        }
    }
    // The provider of a pool cannot change.
    let good: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "good"}, "spec": {"replicas": 0, "template": template},
    }))
    .unwrap();
    pools.create(&PostParams::default(), &good).await.unwrap();
    let moved = json!({"spec": {"template": {"spec": {"provider": "kvm"}}}});
    match pools
        .patch(
            "good",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(moved),
        )
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(
                e.message.contains("spec.template.spec.provider"),
                "{}",
                e.message
            );
            assert!(e.message.contains("immutable"), "{}", e.message);
        }
        other => panic!("a pool's provider must not change: {other:?}"),
    }
}

/// A template change under `maxUnavailable: 1`: sampled every 200 ms,
/// never more than one Proxy of the pool is out of service (not Ready, or
/// draining); each Proxy gets
/// the new spec and exactly one new instance with the new user-data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_rolls_one_proxy_at_a_time() {
    const N: usize = 3;
    squid::require();
    let ground = support::ground_without_pods("pool-roll").await;
    let standin = StandIn::serving_on_loopback(Duration::from_secs(600)).await;
    let target = support::http_target().await;
    let (port, _squid) = squid::on_loopback("poolroll").await;
    let dir = tempfile::tempdir().unwrap();
    let cmd = ground.operator(dir.path(), &providers(&standin, "    maxUnavailable: 1\n"));
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let spec = |version: &str| {
        json!({
            "provider": "gcp-eu",
            "port": port,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "cloudInit": {"inline": format!("#cloud-config\n# template {version}\n")},
            "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200, "failureThreshold": 20},
        })
    };
    let pools: Api<ProxyPool> = ground.api();
    let pool: ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "crawl"},
        "spec": {"replicas": N, "template": {"spec": spec("v1")}}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/crawl",
        "--timeout=180s",
    ]);
    let proxies = ground.proxies();
    let instances: BTreeMap<String, String> = members(&proxies)
        .await
        .iter()
        .map(|p| {
            (
                p.name_any(),
                egress_proxies_operator::provider::naming::name_from_uid(&p.uid().unwrap()),
            )
        })
        .collect();
    assert_eq!(instances.len(), N);

    pools
        .patch(
            "crawl",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"template": {"spec": spec("v2")}}})),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let mut samples = 0;
    let mut most_down = 0;
    loop {
        let list = members(&proxies).await;
        // Out of service: not Ready, or draining before its replacement
        // (a draining Proxy takes no new lease).
        let down = list
            .iter()
            .filter(|p| {
                support::phase(p) != Some("Ready")
                    || p.status
                        .as_ref()
                        .is_some_and(|s| s.draining_since.is_some())
            })
            .count();
        most_down = most_down.max(down);
        assert!(down <= 1, "{down} of the pool out of service at once");
        samples += 1;
        let rolled = instances.values().all(|i| {
            standin.calls("insert", i).len() == 2
                && standin
                    .user_data(i)
                    .is_some_and(|d| d.contains("template v2"))
        });
        if rolled && down == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "not rolled in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "rolled {N} Proxies in {:?}: {samples} samples, at most {most_down} out of service",
        started.elapsed()
    );
    assert_eq!(most_down, 1, "each Proxy was replaced (one at a time)");
    for p in members(&proxies).await {
        let inline = p.spec.cloud_init.as_ref().and_then(|c| c.inline.clone());
        assert!(
            inline.unwrap_or_default().contains("template v2"),
            "{}",
            p.name_any()
        );
    }
    for i in instances.values() {
        assert_eq!(
            standin.calls("delete", i).len(),
            1,
            "{i}: the old one deleted once"
        );
    }
    ground.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "proxypool/crawl",
        "--timeout=60s",
    ]);
    let status = pools.get("crawl").await.unwrap().status.unwrap();
    assert_eq!((status.ready_replicas, status.updated_replicas), (3, 3));
}
