//! System test of the circuit breaker (issue 18) on a gcp provider: the
//! real operator binary on the real test cluster (control plane only),
//! through the real Google client against the Compute stand-in. Each
//! instance's NAT IP (on 127.0.0.0/8) runs a real Squid that the operator
//! probes through, so the Proxies become Ready. The outage: four of five
//! instances stop at once (the stand-in reports them TERMINATED) and their
//! Squids with them, as when a zone goes down. Stopped instances would
//! otherwise be deleted and inserted again.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use egress_proxies_operator::api::{ProviderHealth, Proxy};
use egress_proxies_operator::provider::naming::name_from_uid;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::e2e_create_limits::{providers_named, reason};
use crate::gcp_standin::{StandIn, ZONE};
use crate::support::breaker::{gauge, until_event, until_replacing};
use crate::support::squid::{self, Squid};
use crate::support::{self, eventually, phase, Operator};

/// The provider's name: the ProviderHealth object and its Events are named
/// after it, cluster-wide.
const PROVIDER: &str = "breaker-gcp";
/// Stopped instances the breaker lets be replaced before it opens: with
/// threshold 50% of five, two lost is not more than half, the third is.
const ALLOWED: usize = 2;
const PROXIES: usize = 5;

/// A Proxy on [`PROVIDER`] listening on `port`, probing `target` through
/// its Squid every second.
fn probed_proxy(name: &str, port: u16, target: SocketAddr) -> Proxy {
    support::proxy(
        name,
        json!({
            "provider": PROVIDER,
            "port": port,
            "placement": {"zone": ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
            "healthCheck": {"url": format!("http://{target}/"), "expectedStatus": 200,
                "intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 1, "successThreshold": 1},
        }),
    )
}

/// One Proxy's instance as the test plays it.
struct Vm {
    instance: String,
    port: u16,
}

/// Calls of `kind` (insert, delete) for `instances` that reached the
/// stand-in after `since`.
fn calls_since(standin: &StandIn, kind: &str, instances: &[&Vm], since: Instant) -> usize {
    standin
        .calls(kind, "")
        .iter()
        .filter(|c| c.at > since && instances.iter().any(|v| v.instance == c.instance))
        .count()
}

/// Five gcp Proxies Ready; four instances stop at once with their Squids:
/// the breaker opens (ProviderHealth `Replacing=False CircuitOpen` naming
/// the share, a Warning Event, the gauge at 1). From the stand-in's calls:
/// at most the two the 50% threshold lets go were deleted (before it
/// opened), no delete came once open, and each other stopped instance is
/// looked at again and kept, showing `Provisioned=False CircuitOpen`. The
/// instances come back: it closes (`Replacing=True`, Event
/// `CircuitClosed`, gauge 0), every Proxy is Ready, and over the whole
/// outage each deleted instance got exactly one new one (an insert held
/// by the open breaker goes once it closes) and no kept instance any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_when_most_gcp_instances_stop_at_once_keeps_them_and_closes() {
    squid::require();
    let ground = support::ground_without_pods("breaker-gcp").await;
    let standin = StandIn::start_for(Duration::from_secs(600)).await;
    standin.with(|s| s.running_after_gets = 1);
    let target = support::http_target().await;
    let dir = tempfile::tempdir().unwrap();
    let metrics: SocketAddr = support::loopback();
    let providers = providers_named(
        PROVIDER,
        &standin,
        "    circuitBreaker: {threshold: 50%, window: 10m, minReadyProxies: 3}\n",
    );
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--metrics-bind-address", &metrics.to_string()])
        .env("LOG_LEVEL", "info");
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    let ph: Api<ProviderHealth> = Api::all(ground.client.clone());

    let mut vms = BTreeMap::new();
    for i in 0..PROXIES {
        let name = format!("px-{i}");
        let port = support::free_port();
        let created = proxies
            .create(&PostParams::default(), &probed_proxy(&name, port, target))
            .await
            .unwrap();
        let instance = name_from_uid(&created.uid().unwrap());
        vms.insert(name, (instance, port));
    }
    let mut squids: BTreeMap<String, Squid> = BTreeMap::new();
    let mut played = BTreeMap::new();
    for (name, (instance, port)) in vms {
        let ip = eventually(
            &format!("{name} has an IP"),
            Duration::from_secs(90),
            || async {
                proxies
                    .get(&name)
                    .await
                    .ok()?
                    .status?
                    .ip?
                    .parse::<IpAddr>()
                    .ok()
            },
        )
        .await;
        let IpAddr::V4(ip) = ip else {
            panic!("{name}: {ip}")
        };
        squids.insert(
            name.clone(),
            squid::start(ip, port, &name.replace('-', ""), "http_access allow me").await,
        );
        played.insert(name, Vm { instance, port });
    }
    let started = Instant::now();
    eventually("all five Ready", Duration::from_secs(120), || async {
        let list = proxies.list(&Default::default()).await.ok()?.items;
        (list.len() == PROXIES && list.iter().all(|p| phase(p) == Some("Ready"))).then_some(())
    })
    .await;
    println!(
        "five gcp Proxies Ready {:?} after their Squids",
        started.elapsed()
    );
    let closed = until_replacing(&ph, PROVIDER, "True", "Replacing=True", 60).await;
    assert_eq!(closed.1, "CircuitClosed", "{closed:?}");
    assert_eq!(gauge(metrics, PROVIDER).await, Some(0.0));

    // The outage: four instances stop, their Squids with them.
    let victims: Vec<&String> = played.keys().skip(1).collect();
    let stopped: Vec<&Vm> = victims.iter().map(|n| &played[*n]).collect();
    let failed_at = Instant::now();
    for v in &stopped {
        standin.stop(&v.instance);
    }
    for name in &victims {
        squids.remove(*name);
    }
    let open = until_replacing(&ph, PROVIDER, "False", "Replacing=False", 60).await;
    let opened_at = Instant::now();
    println!(
        "breaker open {:?} after the instances stopped",
        opened_at - failed_at
    );
    assert_eq!(open.1, "CircuitOpen", "{open:?}");
    support::breaker::assert_names_share(&open.2, 4, PROXIES);
    let warned = until_event(&ground.client, PROVIDER, "CircuitOpen").await;
    assert!(warned[0].contains(PROVIDER), "{warned:?}");
    assert_eq!(gauge(metrics, PROVIDER).await, Some(1.0));

    // The Proxies whose instance was replaced before the breaker opened
    // (at most what the threshold lets go), and the rest held: each looked
    // at again and showing `Provisioned=False CircuitOpen`, with no call
    // that deletes or inserts, while the breaker stays open.
    let replaced: Vec<&Vm> = stopped
        .iter()
        .copied()
        .filter(|v| !standin.calls("delete", &v.instance).is_empty())
        .collect();
    let held: Vec<(&String, &Vm)> = victims
        .iter()
        .map(|n| (*n, &played[*n]))
        .filter(|(_, v)| standin.calls("delete", &v.instance).is_empty())
        .collect();
    let gets_before: Vec<usize> = held
        .iter()
        .map(|(_, v)| standin.calls("get", &v.instance).len())
        .collect();
    eventually(
        "every held instance looked at again and held",
        Duration::from_secs(120),
        || async {
            let still = support::breaker::replacing(&ph, PROVIDER).await.unwrap();
            assert_eq!(
                (still.0.as_str(), still.1.as_str()),
                ("False", "CircuitOpen")
            );
            let seen = held
                .iter()
                .zip(&gets_before)
                .all(|((_, v), b)| standin.calls("get", &v.instance).len() > *b);
            let mut shown = 0;
            for (name, _) in &held {
                let p = proxies.get(name).await.ok()?;
                shown += usize::from(reason(&p).as_deref() == Some("CircuitOpen"));
            }
            (seen && shown == held.len()).then_some(())
        },
    )
    .await;
    let inserted = calls_since(&standin, "insert", &stopped, failed_at);
    let deleted = calls_since(&standin, "delete", &stopped, failed_at);
    let held_vms: Vec<&Vm> = held.iter().map(|(_, v)| *v).collect();
    let held_calls = calls_since(&standin, "insert", &held_vms, failed_at)
        + calls_since(&standin, "delete", &held_vms, failed_at);
    let deleted_open = calls_since(&standin, "delete", &stopped, opened_at);
    println!(
        "{} replaced before the breaker opened ({inserted} inserts, {deleted} deletes), {} held for {:?} with {held_calls} calls that insert or delete",
        replaced.len(),
        held.len(),
        opened_at.elapsed()
    );
    assert!(
        replaced.len() <= ALLOWED,
        "{} of 5 replaced: more than the {ALLOWED} the 50% threshold lets go",
        replaced.len()
    );
    assert!(inserted <= ALLOWED, "{inserted} inserts");
    assert_eq!(deleted, replaced.len(), "one delete per replaced instance");
    assert_eq!(held_calls, 0, "the held instances are kept as they are");
    assert_eq!(deleted_open, 0, "no delete while open");

    // The zone is back: the held instances run again; each victim's
    // instance (held or new) gets a Squid on the NAT IP it has now.
    for v in &held_vms {
        standin.start_again(&v.instance);
    }
    // In any order: a victim whose insert is held until the breaker closes
    // gets its NAT IP only after the others' Squids let it close.
    let deadline = Instant::now() + Duration::from_secs(180);
    while victims.iter().any(|n| !squids.contains_key(*n)) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the victims' instances to have NAT IPs: served {:?}",
            squids.keys().collect::<Vec<_>>()
        );
        for name in &victims {
            let v = &played[*name];
            if squids.contains_key(*name) {
                continue;
            }
            if let Some(ip) = nat_ip(&standin, &v.instance) {
                squids.insert(
                    (*name).clone(),
                    squid::start(ip, v.port, &name.replace('-', ""), "http_access allow me").await,
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let healed_at = Instant::now();
    let closed = until_replacing(&ph, PROVIDER, "True", "Replacing=True again", 120).await;
    println!(
        "breaker closed {:?} after the instances came back",
        healed_at.elapsed()
    );
    assert_eq!(closed.1, "CircuitClosed", "{closed:?}");
    let notes = until_event(&ground.client, PROVIDER, "CircuitClosed").await;
    assert!(notes[0].contains("closed"), "{notes:?}");
    assert_eq!(gauge(metrics, PROVIDER).await, Some(0.0));
    eventually("all five Ready again", Duration::from_secs(120), || async {
        let list = proxies.list(&Default::default()).await.ok()?.items;
        list.iter().all(|p| phase(p) == Some("Ready")).then_some(())
    })
    .await;
    // A replace admitted before the breaker opened whose insert was then
    // held (its old instance already deleted) completes once it closes:
    // one new instance per deleted one, and none for a held instance.
    let all: Vec<&Vm> = played.values().collect();
    assert_eq!(
        calls_since(&standin, "insert", &all, failed_at),
        replaced.len(),
        "one insert per replaced instance, over the whole outage"
    );
    assert_eq!(
        calls_since(&standin, "insert", &held_vms, failed_at),
        0,
        "a held instance is never replaced once it runs again"
    );
    assert_eq!(standin.instance_count(), PROXIES);
    drop(squids);
}

/// The NAT IP the stand-in gave the instance `name`, while it has one.
fn nat_ip(standin: &StandIn, name: &str) -> Option<Ipv4Addr> {
    standin
        .instance_bodies()
        .into_iter()
        .find(|b| b["name"] == name)?
        .pointer("/networkInterfaces/0/accessConfigs/0/natIP")?
        .as_str()?
        .parse()
        .ok()
}
