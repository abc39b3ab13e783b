//! The ProviderHealth writer against the real test cluster (control plane
//! only, the generated CRDs installed): the generated
//! schema accepts what the monitor writes (cluster scope, status
//! subresource, required fields, list-map keys, the 1024-character message
//! limit), transition times move only on a flip, and cleanup deletes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use egress_proxies_operator::api::ProviderHealth;
use egress_proxies_operator::provider::registry::{CheckerEntry, ProviderType};
use egress_proxies_operator::provider::{Checker, TargetStatus};
use egress_proxies_operator::providerhealth::writer::{cleanup, Writer};
use egress_proxies_operator::providerhealth::Monitor;
use kube::Api;

use crate::support;

/// The provider's name, which names its (cluster-scoped) ProviderHealth:
/// unique to this test binary.
const PROVIDER: &str = "kvm-phwriter-home";

/// Two hosts; nas2 is down until `up` is set.
struct Hosts {
    up: AtomicBool,
}

#[async_trait]
impl Checker for Hosts {
    async fn check(&self) -> Vec<TargetStatus> {
        let nas2_up = self.up.load(Ordering::SeqCst);
        vec![
            TargetStatus {
                name: "nas1".into(),
                address: "10.0.0.1:22".into(),
                ready: true,
                reason: "Reachable".into(),
                latency: Duration::from_millis(42),
                details: BTreeMap::from([("pool".into(), "default".into())]),
                ..Default::default()
            },
            TargetStatus {
                name: "nas2".into(),
                address: "10.0.0.2:22".into(),
                ready: nas2_up,
                reason: if nas2_up { "Reachable" } else { "Unreachable" }.into(),
                message: if nas2_up {
                    String::new()
                } else {
                    "x".repeat(2000)
                },
                latency: Duration::from_millis(7),
                ..Default::default()
            },
        ]
    }
}

/// The installation this test writes as.
const INSTALLATION: &str = "inst-writer";

#[tokio::test]
async fn writes_pass_the_schema_and_keep_transition_times() {
    let cluster = support::control_plane();
    support::install_crds(cluster);
    let client = cluster.client().await;
    let hosts = Arc::new(Hosts {
        up: AtomicBool::new(false),
    });
    let mut monitor = Monitor::new(
        vec![CheckerEntry {
            name: PROVIDER.into(),
            provider_type: ProviderType::Kvm,
            checker: Some(hosts.clone()),
        }],
        Duration::from_secs(3600),
        Duration::from_secs(5),
    );
    let names: BTreeSet<String> = [PROVIDER.to_string()].into();
    let writer = Writer::new(
        client.clone(),
        monitor.snapshot(),
        names,
        INSTALLATION,
        None,
    );
    let api: Api<ProviderHealth> = Api::all(client.clone());

    monitor.round().await;
    writer.publish(PROVIDER).await.unwrap();
    let s = api.get(PROVIDER).await.unwrap().status.unwrap();
    assert_eq!(s.type_.as_deref(), Some("kvm"));
    assert_eq!(s.targets_ready.as_deref(), Some("1/2"));
    assert_eq!(s.conditions[0].reason, "TargetsNotReady");
    assert_eq!(s.targets[0].latency_millis, Some(42));
    assert_eq!(s.targets[0].details["pool"], "default");
    assert_eq!(
        s.targets[1].message.as_deref().unwrap().chars().count(),
        1024
    );
    let (t1_nas1, t1_nas2) = (
        s.targets[0].last_transition_time,
        s.targets[1].last_transition_time,
    );

    // Not a wait for something: Kubernetes times have one-second
    // resolution, so a flip is seen only when it is a second later.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    hosts.up.store(true, Ordering::SeqCst);
    monitor.round().await;
    writer.publish(PROVIDER).await.unwrap();
    let s = api.get(PROVIDER).await.unwrap().status.unwrap();
    assert_eq!(s.conditions[0].reason, "AllTargetsReady");
    assert_eq!(s.targets_ready.as_deref(), Some("2/2"));
    assert_eq!(
        s.targets[0].last_transition_time, t1_nas1,
        "nas1 did not flip"
    );
    assert!(s.targets[1].last_transition_time > t1_nas2, "nas2 flipped");
    assert_eq!(s.targets[1].message, None);

    // Another installation's cleanup leaves the object alone; its own
    // deletes it.
    let labels = api.get(PROVIDER).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels["proxy-operator-installation"], INSTALLATION);
    cleanup(&client, "another-installation", &BTreeSet::new()).await;
    assert!(api.get_opt(PROVIDER).await.unwrap().is_some());
    cleanup(&client, INSTALLATION, &BTreeSet::new()).await;
    assert!(api.get_opt(PROVIDER).await.unwrap().is_none());
}
