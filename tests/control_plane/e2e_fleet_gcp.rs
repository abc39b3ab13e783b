//! System tests of fleet policy (issue 18) on a gcp provider: the real
//! operator binary on the real test cluster (control plane only), through
//! the real Google client against the Compute stand-in, which records
//! every call with its time and can stop an instance or answer every call
//! with an error for a while.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use chrono::Utc;
use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::provider::naming::{instance_name, name_from_uid};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::ResourceExt;
use serde_json::json;

use crate::e2e_create_limits::{gcp_proxy, providers, reason};
use crate::gcp_standin::{StandIn, ZONE};
use crate::support::recycle::{assert_no_lease_cut, Crawler};
use crate::support::squid;
use crate::support::{self, eventually, phase, Ground, Operator};

pub(crate) fn operator(
    ground: &Ground,
    standin: &StandIn,
    dir: &std::path::Path,
    limits: &str,
) -> Operator {
    Operator::spawn(
        ground.operator(dir, &providers(standin, limits)),
        &dir.join("operator.log"),
    )
}

/// Creates the Proxies `names` and returns their instance names.
pub(crate) async fn create(ground: &Ground, names: &[String]) -> BTreeMap<String, String> {
    let proxies = ground.proxies();
    let mut out = BTreeMap::new();
    for name in names {
        let p = proxies
            .create(&PostParams::default(), &gcp_proxy(name))
            .await
            .unwrap();
        out.insert(name.clone(), name_from_uid(&p.uid().unwrap()));
    }
    out
}

/// Waits until every Proxy of the namespace shows `want` as its
/// `Provisioned` reason; on timeout the panic shows what they show and
/// the operator's last log lines.
pub(crate) async fn all_show(
    standin: &StandIn,
    ground: &Ground,
    n: usize,
    want: &str,
    timeout: Duration,
    dir: &std::path::Path,
) -> Vec<Proxy> {
    let proxies = ground.proxies();
    let deadline = Instant::now() + timeout;
    loop {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        let hits = list
            .iter()
            .filter(|p| reason(p).as_deref() == Some(want))
            .count();
        if hits == n {
            return list;
        }
        if Instant::now() >= deadline {
            let shown: Vec<String> = list
                .iter()
                .map(|p| {
                    format!(
                        "{}: {:?}",
                        p.name_any(),
                        support::condition(p, "Provisioned")
                    )
                })
                .collect();
            let log = std::fs::read_to_string(dir.join("operator.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let calls: Vec<String> = standin
                .with(|s| s.calls.clone())
                .iter()
                .map(|c| format!("{:?} {} {}", c.at, c.kind, c.instance))
                .collect();
            panic!(
                "{hits} of {n} Proxies {want} after {timeout:?}: {shown:#?}\ncalls to the stand-in: {calls:#?}\noperator log (newest first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Three Proxies run; one instance stops behind the operator's back (the
/// stand-in reports it TERMINATED). At its next resync the operator
/// deletes it and inserts exactly one new instance (`status.replacements:
/// 1`), the Proxy runs again, and when the operator has looked at the new
/// instance once more no further insert or delete came; the other two
/// instances are never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_is_replaced_by_exactly_one_new_instance() {
    let ground = support::ground_without_pods("fleet-stop").await;
    let standin = StandIn::start_for(Duration::from_secs(300)).await;
    standin.with(|st| {
        st.running_after_gets = 1;
        st.delete_gets = 0;
    });
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(&ground, &standin, dir.path(), "");
    let names: Vec<String> = (0..3).map(|i| format!("stop-{i}")).collect();
    let instances = create(&ground, &names).await;
    all_show(
        &standin,
        &ground,
        3,
        "InstanceRunning",
        Duration::from_secs(90),
        dir.path(),
    )
    .await;

    let victim = &instances["stop-0"];
    standin.stop(victim);
    let proxies = ground.proxies();
    // Found at the next resync (every 60 s while Running).
    let running = eventually(
        "stop-0 Running on a new instance",
        Duration::from_secs(120),
        || async {
            let p = proxies.get("stop-0").await.ok()?;
            let replaced = p.status.as_ref()?.replacements == Some(1);
            (replaced && reason(&p).as_deref() == Some("InstanceRunning")).then_some(p)
        },
    )
    .await;
    assert_eq!(standin.calls("insert", victim).len(), 2, "one new instance");
    assert_eq!(
        standin.calls("delete", victim).len(),
        1,
        "the stopped one deleted once"
    );
    assert_eq!(support::phase(&running), Some("Running"));

    // The operator looks at the new instance again (its next resync) and
    // leaves it be.
    let gets = standin.calls("get", victim).len();
    eventually(
        "another get of the new instance",
        Duration::from_secs(90),
        || async { (standin.calls("get", victim).len() > gets).then_some(()) },
    )
    .await;
    assert_eq!(
        standin.calls("insert", victim).len(),
        2,
        "no further insert"
    );
    assert_eq!(
        standin.calls("delete", victim).len(),
        1,
        "no further delete"
    );
    for name in ["stop-1", "stop-2"] {
        let id = &instances[name];
        assert_eq!(standin.calls("insert", id).len(), 1, "{name} inserted once");
        assert!(
            standin.calls("delete", id).is_empty(),
            "{name} never deleted"
        );
    }
    assert_eq!(standin.instance_count(), 3);
}

/// The Compute API answers every call with 429 (rate limit) while five
/// Proxies are applied, then with 503 (unavailable) while five more are,
/// then heals. The first five show `QuotaExceeded` with the API's words
/// and wait the quota retry (5 minutes, less up to a fifth of jitter)
/// instead of asking again; the second five are retried with backoff.
/// Every insert of the outage stays within the provider's create bucket
/// (`createsPerMinute: 30`: a burst of 5, then one per 2 s), a failed
/// insert taking its token like any other. Once healed every Proxy runs
/// with one instance each, and the quota retries come spread out, not in
/// one burst. About six minutes: the quota retry is the specification's
/// fixed 5 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_then_unavailable_api_is_retried_with_backoff_and_all_recover() {
    const PER_MINUTE: i64 = 30;
    const BURST: usize = 5;
    let ground = support::ground_without_pods("fleet-outage").await;
    let standin = StandIn::start_for(Duration::from_secs(600)).await;
    standin.with(|st| st.running_after_gets = 1);
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(
        &ground,
        &standin,
        dir.path(),
        &format!("    createsPerMinute: {PER_MINUTE}\n"),
    );
    let started = Instant::now();

    standin.outage(429, "rateLimitExceeded");
    let quota: Vec<String> = (0..5).map(|i| format!("quota-{i}")).collect();
    let quota_ids = create(&ground, &quota).await;
    let list = all_show(
        &standin,
        &ground,
        5,
        "QuotaExceeded",
        Duration::from_secs(60),
        dir.path(),
    )
    .await;
    for p in &list {
        let message = &support::condition(p, "Provisioned").unwrap().message;
        assert!(
            message.contains("injected outage 429"),
            "the API's words: {message}"
        );
    }
    let quota_seen = Instant::now();

    standin.outage(503, "backendError");
    let unavailable: Vec<String> = (0..5).map(|i| format!("down-{i}")).collect();
    let down_ids = create(&ground, &unavailable).await;
    // The outage goes on for a while: a window of calls to count.
    tokio::time::sleep(Duration::from_secs(30)).await;
    standin.heal();
    let healed = Instant::now();
    println!("outage over {:?} after it began", healed - started);

    // Every insert of the outage within the bucket (2 s of slack for the
    // way from the operator to the stand-in).
    let inserts = standin.calls("insert", "");
    let during: Vec<i64> = inserts
        .iter()
        .filter(|c| c.at < healed)
        .map(|c| i64::try_from((c.at - started).as_millis()).unwrap())
        .collect();
    support::assert_within_rate(&during, BURST, 60_000 / PER_MINUTE, 2_000);
    // A Proxy in QuotaExceeded does not ask again within the quota retry.
    for (name, id) in &quota_ids {
        let again = inserts
            .iter()
            .filter(|c| &c.instance == id && c.at > quota_seen && c.at < healed)
            .count();
        assert_eq!(
            again, 0,
            "{name} inserted {again} times while it waited the quota retry"
        );
    }
    let per_down: Vec<usize> = down_ids
        .values()
        .map(|id| {
            inserts
                .iter()
                .filter(|c| &c.instance == id && c.at < healed)
                .count()
        })
        .collect();
    println!(
        "{} inserts in the outage: {:?} per Proxy created during the 503s",
        during.len(),
        per_down
    );
    assert!(
        per_down.iter().all(|n| *n >= 2),
        "the 503s are retried: {per_down:?}"
    );

    // All recover: the 503 ones at their next backoff, the rate-limited
    // ones at their quota retry.
    all_show(
        &standin,
        &ground,
        10,
        "InstanceRunning",
        Duration::from_secs(330),
        dir.path(),
    )
    .await;
    println!("all Running {:?} after the outage ended", healed.elapsed());
    assert_eq!(standin.instance_count(), 10, "one instance per Proxy");
    let made = standin.with(|s| s.inserts.len());
    assert_eq!(made, 10, "one successful insert per Proxy");
    let retries: Vec<Instant> = standin
        .calls("insert", "")
        .into_iter()
        .filter(|c| c.at >= healed && quota_ids.values().any(|id| *id == c.instance))
        .map(|c| c.at)
        .collect();
    let spread = retries
        .iter()
        .max()
        .unwrap()
        .duration_since(*retries.iter().min().unwrap());
    println!("quota retries spread over {spread:?}");
    assert!(
        spread > Duration::from_secs(2),
        "the quota retries of Proxies that failed together come spread out: {spread:?}"
    );
}

/// `maxAge` on 10 gcp Proxies with `maxUnavailable: 2`, as the kubernetes
/// test does it: every Proxy gets a new instance (the stand-in records a
/// delete and one insert more for each), sampling never finds more than 2
/// unavailable (not Ready, or draining) once all were Ready, no instance
/// whose lease a crawler held (and renewed until refused) is deleted
/// before that lease's end or the drain timeout, and a draining proxy is
/// never leased. Every instance gets the same NAT IP, where one real Squid
/// serves them all, so each new instance is probed Ready through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_recycles_every_gcp_instance_within_the_budget_without_cutting_a_lease() {
    roll_ten("fleet-age-gcp", "age", Roll::MaxAge).await;
}

/// A changed cloud-init rolls through the provider's budget (issue 32):
/// the ten Proxies share one labelled cloud-init Secret; its content
/// changes; the same checks, and every instance is replaced exactly once
/// and runs the new user-data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_cloud_init_secret_rolls_through_the_budget_without_cutting_a_lease() {
    roll_ten("rollout-gcp", "roll", Roll::SecretChange).await;
}

/// The same change with `maxSurge: 2` (issue 32): each replacement is
/// created, and passes its probe, before the instance it replaces stops
/// taking leases, so every sample (at least five a second) finds all ten
/// Proxies Ready; each Proxy gets exactly one new instance, under the
/// next instance name, running the new user-data; the old one is deleted
/// once, no sooner than the end of the lease held on it or the drain
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_surge_a_changed_cloud_init_secret_rolls_without_lowering_the_ready_count() {
    roll_ten("surge-gcp", "surge", Roll::SecretChangeSurge).await;
}

/// What makes every instance of [`roll_ten`] be replaced.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Roll {
    /// `maxAge: 45s`.
    MaxAge,
    /// The shared cloud-init Secret's content changes once all are leased.
    SecretChange,
    /// The same, with `maxSurge: 2`.
    SecretChangeSurge,
}

const SECRET: &str = "rollout-ci";

fn user_data(version: &str) -> BTreeMap<String, ByteString> {
    let doc = format!("#cloud-config\n# rollout {version}\nruncmd: []\n");
    BTreeMap::from([("user-data".to_string(), ByteString(doc.into_bytes()))])
}

async fn roll_ten(prefix: &str, names: &str, roll: Roll) {
    const N: usize = 10;
    const BUDGET: usize = 2;
    const LEASE_TTL_S: i64 = 15;
    const DRAIN_TIMEOUT_S: i64 = 60;
    const TOKEN: &str = "fleet-gcp-token";
    squid::require();
    let ground = support::ground_without_pods(prefix).await;
    let standin = StandIn::serving_on_loopback(Duration::from_secs(600)).await;
    let target = support::http_target().await;
    let (port, _squid) = squid::on_loopback(names).await;
    let api = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let ttl = format!("{LEASE_TTL_S}s");
    let surge = roll == Roll::SecretChangeSurge;
    let mut limits = format!("    maxUnavailable: {BUDGET}\n");
    if surge {
        limits.push_str("    maxSurge: 2\n");
    }
    let mut cmd = ground.discovery_operator(dir.path(), &providers(&standin, &limits), api, TOKEN);
    cmd.args(["--max-lease-ttl", &ttl, "--default-lease-ttl", &ttl]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let secrets: kube::Api<Secret> = ground.api();
    let mut secret = Secret {
        data: Some(user_data("v1")),
        ..Default::default()
    };
    secret.metadata.name = Some(SECRET.into());
    secret.metadata.labels = Some(BTreeMap::from([(
        "crawl.example.com/cloud-init".to_string(),
        "true".to_string(),
    )]));
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let proxies = ground.proxies();
    let names: Vec<String> = (0..N).map(|i| format!("{names}-{i}")).collect();
    let mut recycle = json!({"drainTimeout": format!("{DRAIN_TIMEOUT_S}s")});
    if roll == Roll::MaxAge {
        recycle["maxAge"] = json!("45s");
    }
    let mut instances = BTreeMap::new();
    for name in &names {
        let spec = json!({
            "provider": "gcp-eu",
            "port": port,
            "attributes": {"slot": name},
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "cloudInit": {"secretRef": {"name": SECRET}},
            "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200, "failureThreshold": 20},
            "recycle": recycle,
        });
        let p = proxies
            .create(&PostParams::default(), &support::proxy(name, spec))
            .await
            .unwrap();
        instances.insert(name.clone(), name_from_uid(&p.uid().unwrap()));
    }
    let started = Instant::now();
    eventually("all 10 Ready", Duration::from_secs(150), || async {
        let list = proxies.list(&Default::default()).await.ok()?.items;
        (list.iter().filter(|p| phase(p) == Some("Ready")).count() == N).then_some(())
    })
    .await;
    println!(
        "{N} gcp Proxies Ready {:?} after applying",
        started.elapsed()
    );
    for (name, instance) in &instances {
        let data = standin.user_data(instance).unwrap_or_default();
        assert!(data.contains("rollout v1"), "{name}: {data}");
    }

    let crawler = Crawler {
        api,
        token: TOKEN,
        ttl_s: LEASE_TTL_S,
    };
    let mut held = crawler.lease_each(&names).await;
    if roll != Roll::MaxAge {
        // Every Proxy's spec hash changes with the Secret's content.
        let mut changed = secrets.get(SECRET).await.unwrap();
        changed.data = Some(user_data("v2"));
        secrets
            .replace(SECRET, &PostParams::default(), &changed)
            .await
            .unwrap();
    }
    let old_gone = |name: &str| !standin.calls("delete", &instances[name]).is_empty();
    let report = || {
        let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        format!("operator log (newest first):\n{}", tail.join("\n"))
    };
    let sampled = crawler
        .until_recycled(
            &proxies,
            &mut held,
            N,
            Duration::from_secs(420),
            old_gone,
            report,
        )
        .await;
    if surge {
        sampled.assert_all_ready(N, started.elapsed());
    } else {
        sampled.assert_within(BUDGET, started.elapsed());
    }
    // One new instance per recycle: never two for one drain; a changed
    // spec replaces each exactly once, with the new user-data.
    for name in names.iter().filter(|_| !surge) {
        let inserts = standin.calls("insert", &instances[name]).len();
        let recycles = sampled.drains.get(name).map_or(0, |d| d.len());
        assert!(
            inserts >= 2 && inserts <= 1 + recycles,
            "{name}: {inserts} inserts for {recycles} recycles"
        );
        if roll == Roll::SecretChange {
            assert_eq!(inserts, 2, "{name}: replaced exactly once");
            let data = standin.user_data(&instances[name]).unwrap_or_default();
            assert!(
                data.contains("rollout v2"),
                "{name} runs the new user-data: {data}"
            );
        }
    }
    // A surge replacement is the next instance name: created once, with
    // the new user-data; the old name is never created again.
    for name in names.iter().filter(|_| surge) {
        let p = proxies.get(name).await.unwrap();
        let next = instance_name(&p.uid().unwrap(), 1);
        let old = &instances[name];
        let count = |kind, inst: &str| standin.calls(kind, inst).len();
        assert_eq!(count("insert", old), 1, "{name}: the old name created once");
        assert_eq!(
            count("delete", old),
            1,
            "{name}: the old instance deleted once"
        );
        assert_eq!(count("insert", &next), 1, "{name}: replaced exactly once");
        assert_eq!(count("delete", &next), 0, "{name}: the new one stays");
        let data = standin.user_data(&next).unwrap_or_default();
        assert!(
            data.contains("rollout v2"),
            "{name} runs the new user-data: {data}"
        );
        let st = p.status.clone().unwrap_or_default();
        assert_eq!(st.instance_serial, Some(1), "{name}");
        assert!(st.surge.is_none(), "{name}: no surge left");
    }
    // The stand-in's clock is the test's: a call's Instant, as wall time.
    let (now_wall, now) = (Utc::now(), Instant::now());
    let deleted_at = |name: &str| {
        let first = &standin.calls("delete", &instances[name])[0];
        now_wall - chrono::TimeDelta::from_std(now - first.at).unwrap()
    };
    let checked = assert_no_lease_cut(&held, &sampled.drains, deleted_at, DRAIN_TIMEOUT_S);
    assert!(
        checked > 0,
        "some lease was held when its proxy's drain began"
    );
    if roll != Roll::MaxAge {
        for p in proxies.list(&Default::default()).await.unwrap().items {
            let up = support::condition(&p, "UpToDate");
            assert!(up.is_none(), "{} is up to date: {up:?}", p.name_any());
        }
    }
}
