//! A create refused as Unavailable waits its slow retry (issue 18, point
//! 1): the real operator binary on the real test cluster, the real Google
//! client against the Compute stand-in, which refuses every call with 401
//! and then 403 while Proxies are applied and records every insert with
//! its time.
#![cfg(feature = "gcp")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use egress_proxies_operator::controller::plan::end::UNAVAILABLE_RETRY_MIN;
use egress_proxies_operator::controller::plan::jitter::JITTER_SHARE;

use crate::e2e_fleet_gcp::{all_show, create, operator};
use crate::gcp_standin::StandIn;
use crate::support::{self, Ground};

/// Proxies applied during each kind of refusal.
const PER_REFUSAL: usize = 2;

/// Applies [`PER_REFUSAL`] Proxies named `prefix-*` while the API refuses
/// every call with `status`, waits until they show `ProviderUnavailable`
/// with the API's words, and returns their instance names.
async fn refused_with(
    standin: &StandIn,
    ground: &Ground,
    dir: &std::path::Path,
    status: u16,
    reason: &str,
    prefix: &str,
    so_far: usize,
) -> BTreeMap<String, String> {
    standin.outage(status, reason);
    let names: Vec<String> = (0..PER_REFUSAL).map(|i| format!("{prefix}-{i}")).collect();
    let ids = create(ground, &names).await;
    let list = all_show(
        standin,
        ground,
        so_far + PER_REFUSAL,
        "ProviderUnavailable",
        Duration::from_secs(60),
        dir,
    )
    .await;
    for p in list
        .iter()
        .filter(|p| ids.contains_key(&kube::ResourceExt::name_any(*p)))
    {
        let message = &support::condition(p, "Provisioned").unwrap().message;
        assert!(
            message.contains(&format!("injected outage {status}")),
            "the API's words: {message}"
        );
    }
    ids
}

/// The API refuses every call with 401 while two Proxies are applied, then
/// with 403 (a permission, not a quota) while two more are, for 90 s in
/// all. Each shows `ProviderUnavailable` with the API's words, and no
/// Proxy inserts again before its slow retry (a minute, less up to a fifth
/// of jitter): neither its own status write nor any other watch event
/// starts a create early. Then the API heals: every Proxy runs with
/// exactly one instance, with no edit of its spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_as_unavailable_waits_its_slow_retry_and_recovers() {
    const WINDOW: Duration = Duration::from_secs(90);
    let ground = support::ground_without_pods("unavail").await;
    let standin = StandIn::start_for(Duration::from_secs(400)).await;
    standin.with(|st| st.running_after_gets = 1);
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(&ground, &standin, dir.path(), "    createsPerMinute: 30\n");
    let started = Instant::now();

    let mut ids = refused_with(&standin, &ground, dir.path(), 401, "authError", "unauth", 0).await;
    ids.extend(
        refused_with(
            &standin,
            &ground,
            dir.path(),
            403,
            "forbidden",
            "denied",
            PER_REFUSAL,
        )
        .await,
    );
    tokio::time::sleep(WINDOW.saturating_sub(started.elapsed())).await;
    standin.heal();
    let healed = Instant::now();

    // No Proxy asks again before its slow retry; 1 s of slack for the
    // way from the operator to the stand-in.
    let earliest = UNAVAILABLE_RETRY_MIN.mul_f64(1.0 - JITTER_SHARE) - Duration::from_secs(1);
    let inserts = standin.calls("insert", "");
    let mut per_proxy = BTreeMap::new();
    for (name, id) in &ids {
        let at: Vec<Instant> = inserts
            .iter()
            .filter(|c| &c.instance == id && c.at < healed)
            .map(|c| c.at)
            .collect();
        assert!(!at.is_empty(), "{name} was never tried");
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g >= earliest),
            "{name} inserted again before its slow retry ({earliest:?}): gaps {gaps:?}"
        );
        per_proxy.insert(name.clone(), at.len());
    }
    println!(
        "inserts per Proxy in the {:?} of refusals: {per_proxy:?}",
        healed - started
    );

    // All recover at their next retry, with no edit.
    let list = all_show(
        &standin,
        &ground,
        2 * PER_REFUSAL,
        "InstanceRunning",
        Duration::from_secs(200),
        dir.path(),
    )
    .await;
    println!(
        "all Running {:?} after the refusals ended",
        healed.elapsed()
    );
    for p in &list {
        assert_eq!(p.metadata.generation, Some(1), "no edit");
    }
    assert_eq!(
        standin.instance_count(),
        2 * PER_REFUSAL,
        "one instance per Proxy"
    );
    let made = standin.with(|s| s.inserts.len());
    assert_eq!(made, 2 * PER_REFUSAL, "one successful insert per Proxy");
}
