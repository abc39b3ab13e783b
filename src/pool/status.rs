//! A pool's status from its plan (pure), and its write.

use chrono::{DateTime, Utc};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::plan::{Counts, Plan};
use super::{api_error, PoolError};
use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::constants::POOL_LABEL;
use crate::api::{ProxyPool, ProxyPoolStatus};

/// Condition type: every Proxy the pool keeps is Ready and up to date.
pub const READY: &str = "Ready";
/// Condition type: the pool is scaling or rolling.
pub const PROGRESSING: &str = "Progressing";

/// Why the pool is not settled, as (reason, message); `None`: settled.
pub fn unsettled(desired: i32, c: &Counts) -> Option<(&'static str, String)> {
    if c.kept < desired {
        return Some((
            "ScalingUp",
            format!("{} of {desired} Proxies exist", c.kept),
        ));
    }
    if c.replicas > desired {
        return Some((
            "ScalingDown",
            format!(
                "{} scaled-down Proxies are draining: deleted once their leases end or their drain timeout passes",
                c.replicas - desired
            ),
        ));
    }
    if c.updated < desired {
        return Some((
            "Rolling",
            format!(
                "{} of {desired} Proxies are made from the current template; the rest are replaced within the provider's budget",
                c.updated
            ),
        ));
    }
    if c.ready < desired {
        return Some((
            "NotReady",
            format!("{} of {desired} Proxies are Ready", c.ready),
        ));
    }
    None
}

/// The status `pool` should show for `plan` at `now`.
pub fn status_of(pool: &ProxyPool, plan: &Plan, now: DateTime<Utc>) -> ProxyPoolStatus {
    let desired = pool.spec.replicas;
    let generation = pool.metadata.generation;
    let mut conditions = pool
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let c = &plan.counts;
    let (ready, progressing) = match unsettled(desired, c) {
        None => (
            Condition::new(
                READY,
                ConditionStatus::True,
                "AllReady",
                format!("{desired} of {desired} Proxies are Ready"),
                now,
            ),
            Condition::new(
                PROGRESSING,
                ConditionStatus::False,
                "Complete",
                "the pool is at its size, every Proxy made from the current template",
                now,
            ),
        ),
        Some((reason, message)) => (
            Condition::new(READY, ConditionStatus::False, reason, message.clone(), now),
            Condition::new(PROGRESSING, ConditionStatus::True, reason, message, now),
        ),
    };
    condition::set(&mut conditions, ready.at_generation(generation));
    condition::set(&mut conditions, progressing.at_generation(generation));
    ProxyPoolStatus {
        replicas: c.replicas,
        ready_replicas: c.ready,
        leased_replicas: c.leased,
        updated_replicas: c.updated,
        observed_generation: generation,
        selector: format!("{POOL_LABEL}={}", pool.name_any()),
        conditions,
    }
}

/// Writes the status `plan` gives, when it differs from the one shown.
pub async fn write(
    client: &kube::Client,
    pool: &ProxyPool,
    plan: &Plan,
    now: DateTime<Utc>,
) -> Result<(), PoolError> {
    let status = status_of(pool, plan, now);
    if pool.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let Some(ns) = pool.namespace() else {
        return Ok(());
    };
    let api: Api<ProxyPool> = Api::namespaced(client.clone(), &ns);
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .map_err(|e| api_error("writing the pool's status", &e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(replicas: i32, ready: i32, updated: i32, kept: i32) -> Counts {
        Counts {
            replicas,
            ready,
            leased: 0,
            updated,
            kept,
        }
    }

    #[test]
    fn the_pool_says_why_it_is_not_ready() {
        let cases = [
            ("settled", 3, counts(3, 3, 3, 3), None),
            ("too few", 5, counts(3, 3, 3, 3), Some("ScalingUp")),
            ("draining", 3, counts(5, 3, 3, 3), Some("ScalingDown")),
            ("old template", 3, counts(3, 3, 1, 3), Some("Rolling")),
            ("not ready", 3, counts(3, 2, 3, 3), Some("NotReady")),
            ("scaled to zero, gone", 0, counts(0, 0, 0, 0), None),
        ];
        for (name, desired, c, want) in cases {
            assert_eq!(unsettled(desired, &c).map(|(r, _)| r), want, "{name}");
            assert_eq!(c.settled(desired), want.is_none(), "{name}: settled agrees");
        }
    }
}
