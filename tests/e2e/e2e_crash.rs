//! Crash safety: the operator is killed with SIGKILL at pseudo-random
//! moments while 20 Proxies are created, replaced and deleted, and is
//! restarted each time. In the end there is exactly one Pod per live Proxy,
//! built from its current spec, and none for deleted ones.
//!
//! It runs on the real test cluster WITH the node agent (`support::ground`):
//! the end state it checks is Running Pods, so it needs Pods that run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use support::Operator;

const PROXIES: usize = 20;
const KILLS: usize = 8;

/// A small deterministic generator, so a failing run can be repeated.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the test saw: each Proxy's phase, instance and Provisioned reason,
/// and each managed Pod's owner, port, phase and deletion.
async fn state(proxies: &Api<Proxy>, pods: &Api<Pod>) -> String {
    let mut out = String::from("Proxies:\n");
    for p in proxies
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let st = p.status.clone().unwrap_or_default();
        let reason = support::condition(&p, "Provisioned").map(|c| c.reason.clone());
        out.push_str(&format!(
            "  {} uid={} phase={:?} id={:?} reason={reason:?} deleting={}\n",
            p.metadata.name.clone().unwrap_or_default(),
            p.metadata.uid.clone().unwrap_or_default(),
            st.phase,
            st.provider_id,
            p.metadata.deletion_timestamp.is_some()
        ));
    }
    out.push_str("Pods:\n");
    let managed = ListParams::default().labels("proxy-operator-managed=true");
    for p in pods
        .list(&managed)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let uid = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("proxy-operator-uid").cloned());
        let port = p
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].ports.as_ref())
            .map(|ps| ps[0].container_port);
        out.push_str(&format!(
            "  {} owner={uid:?} port={port:?} phase={:?} deleting={}\n",
            p.metadata.name.clone().unwrap_or_default(),
            p.status.as_ref().and_then(|s| s.phase.clone()),
            p.metadata.deletion_timestamp.is_some()
        ));
    }
    out
}

fn proxy(i: usize) -> Proxy {
    support::kube_proxy(&format!("c{i}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_leaves_one_pod_per_live_proxy() {
    assert!(
        support::squid_present(),
        "/usr/sbin/squid is missing: install it (apt-get install squid); .ci/run does"
    );
    let ground = support::ground("crash").await;
    let dir = tempfile::tempdir().unwrap();
    let proxies: Api<Proxy> = ground.proxies();
    let pods: Api<Pod> = ground.api();
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261129);
    println!("crash test seed {seed} (set CRASH_SEED to repeat)");
    let mut rng = Lcg(seed);
    let start = || {
        Operator::spawn(
            ground.operator(
                dir.path(),
                "providers:\n  - name: kubernetes\n    type: kubernetes\n",
            ),
            &dir.path().join("operator.log"),
        )
    };

    // The plan: every Proxy is created; a third get a new port (replaced);
    // a quarter are deleted. Steps are spread over the kills.
    let mut steps: Vec<(usize, &str)> = (0..PROXIES).map(|i| (i, "create")).collect();
    for i in 0..PROXIES {
        if rng.below(3) == 0 {
            steps.push((i, "replace"));
        }
    }
    for i in 0..PROXIES {
        if rng.below(4) == 0 {
            steps.push((i, "delete"));
        }
    }
    let mut live: BTreeMap<String, i32> = BTreeMap::new();
    let mut deleted: Vec<String> = Vec::new();
    let per_round = steps.len().div_ceil(KILLS);
    let mut steps = steps.into_iter();
    for round in 0..KILLS {
        let op = start();
        for (i, what) in steps.by_ref().take(per_round) {
            let name = format!("c{i}");
            match what {
                "create" => {
                    proxies
                        .create(&PostParams::default(), &proxy(i))
                        .await
                        .unwrap();
                    live.insert(name, 3128);
                }
                "replace" if live.contains_key(&name) => {
                    proxies
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"port": 3129}})),
                        )
                        .await
                        .unwrap();
                    live.insert(name, 3129);
                }
                "delete" if live.contains_key(&name) => {
                    proxies
                        .delete(&name, &DeleteParams::default())
                        .await
                        .unwrap();
                    live.remove(&name);
                    deleted.push(name);
                }
                _ => {}
            }
        }
        // Let it work for a while, then kill it mid-flight.
        let ms = 300 + rng.below(2500);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        std::process::Command::new("kill")
            .args(["-KILL", &op.pid().to_string()])
            .status()
            .unwrap();
        drop(op);
        println!("round {round}: killed after {ms} ms");
    }

    // A last restart converges.
    let _op = start();
    let check = || async {
        let current = proxies.list(&ListParams::default()).await.ok()?;
        if current.items.len() != live.len() {
            return None;
        }
        let all_pods = pods
            .list(&ListParams::default().labels("proxy-operator-managed=true"))
            .await
            .ok()?;
        let mut by_uid: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
        for p in &all_pods.items {
            let uid = p
                .metadata
                .labels
                .as_ref()?
                .get("proxy-operator-uid")?
                .clone();
            by_uid.entry(uid).or_default().push(p);
        }
        for px in &current.items {
            let want_port = *live.get(&px.metadata.name.clone()?)?;
            let uid = px.metadata.uid.clone()?;
            let mine = by_uid.remove(&uid)?;
            if mine.len() != 1 {
                return None;
            }
            let pod = mine[0];
            let port = pod.spec.as_ref()?.containers[0].ports.as_ref()?[0].container_port;
            let running = pod.status.as_ref()?.phase.as_deref() == Some("Running");
            if port != want_port || !running || pod.metadata.deletion_timestamp.is_some() {
                return None;
            }
        }
        // Whatever is left belongs to no live Proxy.
        by_uid.is_empty().then_some(all_pods.items.len())
    };
    let deadline = Instant::now() + Duration::from_secs(240);
    let converged = loop {
        if let Some(n) = check().await {
            break n;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "timed out after 240 s waiting for one Running Pod per live Proxy and none for deleted ones\nwanted: {live:?}\n{}\noperator log (newest first):\n{}",
                state(&proxies, &pods).await,
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(converged, live.len());
    for name in &deleted {
        assert!(
            proxies.get_opt(name).await.unwrap().is_none(),
            "{name} must be gone"
        );
    }
    println!(
        "converged: {} live Proxies, {} deleted, one Pod each",
        live.len(),
        deleted.len()
    );
}
