//! The autoscaler's edge: what a pass of an autoscaled pool saw goes to
//! [`autoscale::decide`]; a decision is written into `spec.replicas` (as
//! a HorizontalPodAutoscaler writes a Deployment's), told in an Event and
//! `status.lastScale`, and counted. The lease API learns which pools to
//! count acquires for, and which are coming back from zero.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use tracing::info;

use super::autoscale::{self, Decision, History, Policy, Seen};
use super::plan::Counts;
use super::{api_error, PoolContext, PoolError};
use crate::api::{ProxyPool, ScaleRecord};
use crate::events::{Note, Severity};
use crate::lease::demand::{Answer, Shape};

/// The Retry-After of an acquire naming a pool that is coming back from
/// zero: about what a first proxy takes on a fast provider; a crawler
/// asking sooner is told again.
pub const WAKE_RETRY: Duration = Duration::from_secs(10);
/// The longest Retry-After of a refused acquire naming a pool that can
/// still grow: the pool grows for it within a few seconds, and a crawler
/// asleep until some lease ends would be demand nobody sees.
pub const GROW_RETRY: Duration = Duration::from_secs(5);

/// What the autoscaler remembers of each pool, by namespace and name:
/// what [`autoscale::decide`] needs, and the latest change it made (a
/// pass on an object the watch has not refreshed yet must not write an
/// older `lastScale` back).
#[derive(Debug, Default)]
pub struct Scaling {
    pools: Mutex<HashMap<PoolKey, Remembered>>,
}

/// A pool's namespace and name.
type PoolKey = (String, String);
/// The decisions' memory and the latest change made.
type Remembered = (History, Option<ScaleRecord>);

impl Scaling {
    fn decide(&self, key: (String, String), p: &Policy, s: &Seen) -> Option<Decision> {
        let mut m = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        autoscale::decide(p, s, &mut m.entry(key).or_default().0)
    }

    fn made(&self, key: (String, String), record: Option<ScaleRecord>) -> Option<ScaleRecord> {
        let mut m = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let last = &mut m.entry(key).or_default().1;
        if record.is_some() {
            *last = record;
        }
        last.clone()
    }

    /// Forgets `key` (its pool is gone or no longer autoscaled).
    pub(super) fn forget(&self, key: &(String, String)) {
        let mut m = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(key);
    }
}

/// What the autoscaler made of one pass.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The size to plan for.
    pub replicas: i32,
    /// The latest change this leader made, this pass or before.
    pub scaled: Option<ScaleRecord>,
    /// `spec.autoscale` cannot be acted on: the field and value.
    pub invalid: Option<String>,
}

/// Runs the autoscaler of `pool` on `counts` (the pass's counts at its
/// current size); writes the new size when it decides one.
pub async fn run(
    ctx: &PoolContext,
    pool: &ProxyPool,
    counts: &Counts,
    now: DateTime<Utc>,
) -> Result<Outcome, PoolError> {
    let (ns, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let key = (ns.clone(), name.clone());
    let demand = ctx.leases.as_ref().map(|l| l.demand());
    let mut out = Outcome {
        replicas: pool.spec.replicas,
        ..Outcome::default()
    };
    let Some(spec) = &pool.spec.autoscale else {
        ctx.scaling.forget(&key);
        if let Some(d) = demand {
            d.forget(&ns, &name);
        }
        return Ok(out);
    };
    let policy = match Policy::of(spec) {
        Ok(p) => p,
        Err(why) => {
            out.invalid = Some(why);
            return Ok(out);
        }
    };
    let seen = Seen {
        now,
        replicas: pool.spec.replicas,
        ready: counts.ready,
        leased: counts.leased,
        asked: demand.map(|d| d.read(&ns, &name)).unwrap_or_default(),
        max_step: max_step(ctx, pool),
    };
    let mut record = None;
    if let Some(d) = ctx.scaling.decide(key.clone(), &policy, &seen) {
        write_replicas(ctx, pool, d.replicas).await?;
        info!(pool = %name, namespace = %ns, from = seen.replicas, to = d.replicas, reason = d.reason, "Autoscaled a ProxyPool: {}", d.message);
        let text = format!(
            "scaled from {} to {}: {}",
            seen.replicas, d.replicas, d.message
        );
        if let Some(events) = &ctx.events {
            let note = Note {
                severity: Severity::Normal,
                reason: "Scaled",
                action: "Scale",
                text,
            };
            events.record(&pool.object_ref(&()), note).await;
        }
        if let Some(m) = &ctx.metrics {
            m.decided(&ns, &name, d.reason);
        }
        record = Some(ScaleRecord {
            time: now,
            from: seen.replicas,
            to: d.replicas,
            reason: d.reason.to_string(),
            message: d.message,
        });
        out.replicas = d.replicas;
    }
    out.scaled = ctx.scaling.made(key, record);
    if let Some(d) = demand {
        // Waking: at zero, or back from it with no Ready Proxy yet (a pool
        // whose Proxies fail is answered as any other, not "waking").
        let woke = out.scaled.as_ref().is_some_and(|r| r.from == 0);
        let answer = if out.replicas == 0 || (counts.ready == 0 && woke) {
            Answer::Waking(WAKE_RETRY)
        } else if out.replicas < policy.max {
            Answer::Growing(GROW_RETRY)
        } else {
            Answer::Plain
        };
        d.register(&ns, &name, answer, shape(pool), Instant::now());
    }
    Ok(out)
}

/// The most Proxies one step adds: the provider's create burst (what it
/// lets go at once), one when the provider is not configured.
fn max_step(ctx: &PoolContext, pool: &ProxyPool) -> i32 {
    ctx.providers
        .get(
            pool.spec
                .template
                .spec
                .provider
                .as_deref()
                .unwrap_or_default(),
        )
        .map(|l| i32::try_from(l.burst()).unwrap_or(i32::MAX))
        .unwrap_or(1)
}

async fn write_replicas(
    ctx: &PoolContext,
    pool: &ProxyPool,
    replicas: i32,
) -> Result<(), PoolError> {
    let Some(ns) = pool.namespace() else {
        return Ok(());
    };
    let api: Api<ProxyPool> = Api::namespaced(ctx.client.clone(), &ns);
    // Guarded by the resourceVersion the decision was made on: a size
    // someone wrote meanwhile wins, and the next pass decides again.
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": pool.resource_version()},
        "spec": {"replicas": replicas},
    });
    api.patch(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| api_error("writing the pool's replicas", &e))?;
    Ok(())
}

/// What a new Proxy of `pool` would be, as lease filters see it: the
/// Proxy its template makes, read as the discovery API lists one.
fn shape(pool: &ProxyPool) -> Shape {
    let p = super::from_template(pool, "", "");
    let placement = p.spec.placement.unwrap_or_default();
    let non_empty = |s: String| (!s.is_empty()).then_some(s);
    Shape {
        provider: p.spec.provider.filter(|s| !s.is_empty()),
        zone: non_empty(placement.zone),
        region: non_empty(placement.region),
        namespace: p.metadata.namespace.unwrap_or_default(),
        pool: pool.name_any(),
        attributes: p.spec.attributes,
        labels: p.metadata.labels.unwrap_or_default(),
    }
}
