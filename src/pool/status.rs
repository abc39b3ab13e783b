//! A pool's status from its plan (pure), and its write.

use chrono::{DateTime, Utc};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::plan::{Counts, Plan};
use super::{api_error, PoolError};
use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::constants::POOL_LABEL;
use crate::api::{ProxyPool, ProxyPoolStatus, ScaleRecord};

/// Condition type: every Proxy the pool keeps is Ready and up to date.
pub const READY: &str = "Ready";
/// Condition type: the pool is scaling or rolling.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: a provider cap, quota or the circuit breaker (or a
/// provider that is not configured) holds the pool back.
pub const SCALING_LIMITED: &str = "ScalingLimited";

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

/// What the status says besides the plan's counts.
#[derive(Debug, Default)]
pub struct Notes {
    /// The size planned for (`spec.replicas`, or the autoscaler's new one).
    pub desired: i32,
    /// The pool cannot be acted on as asked: reason, and a message naming
    /// the field and value.
    pub invalid: Option<(&'static str, String)>,
    /// The autoscaler's change this pass.
    pub scaled: Option<ScaleRecord>,
    /// The pool cannot grow for a reason of its own (besides Proxies the
    /// plan found held back): reason and message.
    pub limited: Option<(&'static str, String)>,
}

/// The status `pool` should show for `plan` and `notes` at `now`.
pub fn status_of(
    pool: &ProxyPool,
    plan: &Plan,
    notes: &Notes,
    now: DateTime<Utc>,
) -> ProxyPoolStatus {
    let desired = notes.desired;
    let generation = pool.metadata.generation;
    let old = pool.status.as_ref();
    let mut conditions = old.map(|s| s.conditions.clone()).unwrap_or_default();
    let c = &plan.counts;
    let (ready, progressing) = match (&notes.invalid, unsettled(desired, c)) {
        (Some((reason, message)), _) => (
            Condition::new(READY, ConditionStatus::False, reason, message.clone(), now),
            Condition::new(
                PROGRESSING,
                ConditionStatus::False,
                reason,
                message.clone(),
                now,
            ),
        ),
        (None, None) => (
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
        (None, Some((reason, message))) => (
            Condition::new(READY, ConditionStatus::False, reason, message.clone(), now),
            Condition::new(PROGRESSING, ConditionStatus::True, reason, message, now),
        ),
    };
    let held = plan.held.as_ref().map(|(n, reason, message)| {
        let whom = if *n == 1 {
            "1 Proxy of the pool waits".to_string()
        } else {
            format!("{n} Proxies of the pool wait")
        };
        (reason.clone(), format!("{whom}: {message}"))
    });
    let limited = match notes
        .limited
        .as_ref()
        .map(|(r, m)| (r.to_string(), m.clone()))
        .or(held)
    {
        Some((reason, message)) => Condition::new(
            SCALING_LIMITED,
            ConditionStatus::True,
            &reason,
            message,
            now,
        ),
        None => Condition::new(
            SCALING_LIMITED,
            ConditionStatus::False,
            "NotLimited",
            "no Proxy of the pool is held back by a provider cap, quota or the circuit breaker",
            now,
        ),
    };
    for cond in [ready, progressing, limited] {
        condition::set(&mut conditions, cond.at_generation(generation));
    }
    ProxyPoolStatus {
        replicas: c.replicas,
        ready_replicas: c.ready,
        leased_replicas: c.leased,
        updated_replicas: c.updated,
        observed_generation: generation,
        selector: format!("{POOL_LABEL}={}", pool.name_any()),
        last_scale: notes
            .scaled
            .clone()
            .or_else(|| old.and_then(|s| s.last_scale.clone())),
        conditions,
    }
}

/// Whether `status` turns ScalingLimited True (from anything else on
/// `pool`): the moment for an Event.
pub fn newly_limited(pool: &ProxyPool, status: &ProxyPoolStatus) -> Option<String> {
    fn is_true(conds: &[Condition]) -> Option<&Condition> {
        condition::find(conds, SCALING_LIMITED).filter(|c| c.status == ConditionStatus::True)
    }
    let now = is_true(&status.conditions)?;
    let before = pool.status.as_ref().and_then(|s| is_true(&s.conditions));
    before.is_none().then(|| now.message.clone())
}

/// Writes `status` when it differs from the one shown.
pub async fn write(
    client: &kube::Client,
    pool: &ProxyPool,
    status: &ProxyPoolStatus,
) -> Result<(), PoolError> {
    if pool.status.as_ref() == Some(status) {
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

    fn pool(replicas: i32) -> ProxyPool {
        let mut p = ProxyPool::new(
            "eu",
            crate::api::ProxyPoolSpec {
                replicas,
                ..Default::default()
            },
        );
        p.metadata.generation = Some(4);
        p
    }

    fn plan(c: Counts, held: Option<(i32, &str, &str)>) -> Plan {
        Plan {
            steps: Vec::new(),
            counts: c,
            wake: None,
            held: held.map(|(n, r, m)| (n, r.to_string(), m.to_string())),
        }
    }

    fn cond<'a>(s: &'a ProxyPoolStatus, t: &str) -> (&'a str, &'a str, &'a str) {
        let c = condition::find(&s.conditions, t).unwrap();
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn held_back_proxies_and_bad_input_show_in_the_conditions() {
        let now = Utc::now();
        let settled = plan(counts(3, 3, 3, 3), None);
        let notes = Notes {
            desired: 3,
            ..Notes::default()
        };
        let s = status_of(&pool(3), &settled, &notes, now);
        assert_eq!(cond(&s, READY).0, "True");
        assert_eq!(cond(&s, SCALING_LIMITED).1, "NotLimited");

        let capped = plan(
            counts(3, 1, 3, 3),
            Some((2, "InstanceLimit", "gcp-eu holds its maxInstances (3)")),
        );
        let s = status_of(&pool(3), &capped, &notes, now);
        assert_eq!(
            cond(&s, SCALING_LIMITED),
            (
                "True",
                "InstanceLimit",
                "2 Proxies of the pool wait: gcp-eu holds its maxInstances (3)"
            )
        );
        assert_eq!(
            cond(&s, READY),
            ("False", "NotReady", "1 of 3 Proxies are Ready")
        );

        let unknown = Notes {
            desired: 3,
            invalid: Some((
                "InvalidSpec",
                "spec.template.spec.provider \"nope\" is not configured".into(),
            )),
            limited: Some((
                "UnknownProvider",
                "spec.template.spec.provider \"nope\" is not configured".into(),
            )),
            ..Notes::default()
        };
        let s = status_of(&pool(3), &plan(counts(0, 0, 0, 0), None), &unknown, now);
        assert_eq!(cond(&s, READY).1, "InvalidSpec");
        assert_eq!(cond(&s, PROGRESSING).0, "False", "nothing will progress");
        assert_eq!(cond(&s, SCALING_LIMITED).1, "UnknownProvider");
        assert_eq!(s.observed_generation, Some(4));
    }

    #[test]
    fn the_last_scale_is_kept_until_the_next_and_a_limit_is_news_once() {
        let now = Utc::now();
        let record = ScaleRecord {
            time: now,
            from: 1,
            to: 2,
            reason: "Refusals".into(),
            message: "3 acquires refused".into(),
        };
        let notes = Notes {
            desired: 2,
            scaled: Some(record.clone()),
            ..Notes::default()
        };
        let mut p = pool(1);
        let s = status_of(&p, &plan(counts(1, 1, 1, 1), None), &notes, now);
        assert_eq!(s.last_scale.as_ref(), Some(&record));
        assert_eq!(newly_limited(&p, &s), None);
        p.status = Some(s);
        let later = Notes {
            desired: 2,
            ..Notes::default()
        };
        let held = plan(counts(2, 1, 2, 2), Some((1, "QuotaExceeded", "quota")));
        let s = status_of(&p, &held, &later, now);
        assert_eq!(s.last_scale.as_ref(), Some(&record), "kept");
        assert_eq!(
            newly_limited(&p, &s).as_deref(),
            Some("1 Proxy of the pool waits: quota")
        );
        p.status = Some(s.clone());
        assert_eq!(
            newly_limited(&p, &status_of(&p, &held, &later, now)),
            None,
            "already said"
        );
    }
}
