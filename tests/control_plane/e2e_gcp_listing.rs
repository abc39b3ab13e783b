//! Issue 19 on the gcp provider: a held fleet of Running gcp Proxies is
//! observed by one aggregated list per `--provider-list-interval`, with no
//! per-Proxy get, and an instance that stops behind the operator's back is
//! still replaced (the listing that shows it stopped triggers its Proxy).
//! The real operator binary, the real test API server (no nodes), the
//! Compute stand-in.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::gcp_standin;
use crate::support;

use support::{eventually, phase, Operator};

use std::time::Duration;

use crate::e2e_create_limits::gcp_proxy;
use egress_proxies_operator::api::Proxy;
use gcp_standin::StandIn;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

/// Proxies in the held fleet.
const FLEET: usize = 4;
/// Passes each Running Proxy is held through.
const PASSES: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_gcp_fleet_is_listed_not_got_and_a_stopped_instance_is_replaced() {
    let ground = support::ground_without_pods("gcp-list").await;
    let standin = StandIn::start_for(Duration::from_secs(300)).await;
    standin.with(|st| st.running_after_gets = 1);
    let dir = tempfile::tempdir().unwrap();
    let providers = standin.providers_yaml();
    let mut cmd = ground.operator(dir.path(), &providers);
    cmd.args(["--provider-list-interval", "2s"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    let names: Vec<String> = (0..FLEET).map(|i| format!("g{i}")).collect();
    for n in &names {
        proxies
            .create(&PostParams::default(), &gcp_proxy(n))
            .await
            .unwrap();
    }
    let all_running = || async {
        let list = proxies.list(&Default::default()).await.ok()?;
        (list.items.len() == FLEET && list.items.iter().all(|p| phase(p) == Some("Running")))
            .then_some(list.items)
    };
    let fleet = eventually("the fleet Running", Duration::from_secs(60), all_running).await;
    // A listing that started after every instance turned Running.
    let lists = standin.calls("list", "").len();
    eventually("two more listings", Duration::from_secs(20), || async {
        (standin.calls("list", "").len() >= lists + 2).then_some(())
    })
    .await;

    let (gets_before, lists_before) = (
        standin.calls("get", "").len(),
        standin.calls("list", "").len(),
    );
    for pass in 0..PASSES {
        for n in &names {
            proxies
                .patch(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"attributes": {"pass": pass.to_string()}}})),
                )
                .await
                .unwrap();
        }
        eventually("the pass reconciled", Duration::from_secs(30), || async {
            let list = proxies.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .all(|p| {
                    let generation = p.metadata.generation;
                    phase(p) == Some("Running")
                        && p.status.as_ref().is_some_and(|s| {
                            s.conditions
                                .iter()
                                .all(|c| c.observed_generation == generation)
                        })
                })
                .then_some(())
        })
        .await;
    }
    // The listing goes on meanwhile, one call for the whole fleet.
    eventually(
        "a listing after the passes",
        Duration::from_secs(20),
        || async { (standin.calls("list", "").len() > lists_before).then_some(()) },
    )
    .await;
    let (gets, lists) = (
        standin.calls("get", "").len() - gets_before,
        standin.calls("list", "").len() - lists_before,
    );
    println!(
        "held {FLEET} Running gcp Proxies through {PASSES} passes each: {gets} instances.get, {lists} aggregated lists"
    );
    assert_eq!(gets, 0, "Running Proxies are answered by the listing");

    // One instance stops: the next listing shows it and triggers its
    // Proxy, which replaces it (well within a periodic resync).
    let victim = fleet[0]
        .status
        .as_ref()
        .unwrap()
        .provider_id
        .clone()
        .unwrap();
    let victim_name = victim.rsplit('/').next().unwrap().to_string();
    let deletes = standin.calls("delete", &victim_name).len();
    let stopped = std::time::Instant::now();
    standin.stop(&victim_name);
    eventually(
        "the stopped instance deleted",
        Duration::from_secs(30),
        || async { (standin.calls("delete", &victim_name).len() > deletes).then_some(()) },
    )
    .await;
    let replaced_in = stopped.elapsed();
    eventually("Running again", Duration::from_secs(60), || async {
        let p = proxies.get(&fleet[0].metadata.name.clone()?).await.ok()?;
        (phase(&p) == Some("Running") && p.status?.replacements.unwrap_or(0) >= 1).then_some(())
    })
    .await;
    println!(
        "stopped instance replaced: delete {:.1} s after the stop",
        replaced_in.as_secs_f64()
    );
}
