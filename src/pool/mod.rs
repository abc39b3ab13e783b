//! The ProxyPool controller (leader-only): keeps each pool at its
//! `replicas` of Proxies made from its template. Decisions are in
//! [`plan`]; this module reads the Proxies and the lease table and
//! writes what the plan says (docs/pools.md).

pub mod autoscale;
pub mod metrics;
pub mod plan;
mod scaling;
mod status;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::Store;
use kube::runtime::{watcher, Controller};
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::api::constants::{POOL_LABEL, POOL_TEMPLATE_ANNOTATION, SCALE_DOWN_ANNOTATION};
use crate::api::{Proxy, ProxyPool};
use crate::config::CreateLimits;
use crate::events::{Events, Note, Severity};
use crate::fleet::{DrainStep, Fleet};
use crate::lease::{LeaseStore, ProxyKey};
use crate::provider::error::plain_message;
use crate::proxy_store::ProxyStore;
use metrics::{PoolGauges, PoolMetrics};
use plan::{Member, Step};
use status::Notes;

/// A pool that is not where it should be is looked at again this soon.
const CONVERGING: Duration = Duration::from_secs(2);
/// A settled pool is looked at again this often: leases come and go
/// without an event (its leased count), and a Proxy's deletion finishing
/// triggers nothing. A pass reads the store and writes only a change.
const SETTLED: Duration = Duration::from_secs(10);
/// An autoscaled pool is looked at this often: demand moves without an
/// event, and a crawler waiting on a pool at zero should not wait long.
const AUTOSCALED: Duration = Duration::from_secs(3);
/// Provisioned reasons of a Proxy held back by its provider's cap, a quota
/// or the circuit breaker: the pool cannot grow past them.
const HELD_BACK: [&str; 3] = [
    crate::api::proxy::conditions::REASON_INSTANCE_LIMIT,
    crate::api::proxy::conditions::REASON_QUOTA_EXCEEDED,
    crate::api::proxy::conditions::REASON_CIRCUIT_OPEN,
];

/// What a pool's reconcile reads and writes with.
pub struct PoolContext {
    /// The API.
    pub client: kube::Client,
    /// The process's one Proxy store.
    pub proxies: Store<Proxy>,
    /// Drains of scaled-down Proxies end as the fleet's drains do.
    pub fleet: Arc<Fleet>,
    /// The lease table: which Proxies hold leases, and what crawlers
    /// asked of each pool.
    pub leases: Option<Arc<LeaseStore>>,
    /// The configured providers and their create limits (a step of the
    /// autoscaler adds at most one create burst).
    pub providers: HashMap<String, CreateLimits>,
    /// Where "Scaled" and "ScalingLimited" Events go.
    pub events: Option<Events>,
    /// The pool series.
    pub metrics: Option<PoolMetrics>,
    /// The autoscaler's memory of each pool.
    pub scaling: scaling::Scaling,
}

/// Why a pass failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A call to the API server failed.
    #[error("{what}: {message}")]
    Api {
        /// What was being done.
        what: String,
        /// The API server's words.
        message: String,
    },
}

fn api_error(what: impl Into<String>, e: &kube::Error) -> PoolError {
    PoolError::Api {
        what: what.into(),
        message: plain_message(e),
    }
}

/// Runs the pool controller until `shutdown` resolves. Pools are
/// watched; their Proxies come from the process's Proxy store.
pub async fn run(
    ctx: Arc<PoolContext>,
    proxies: &ProxyStore,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let pools: Api<ProxyPool> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    Controller::new(pools, watcher::Config::default())
        .owns_shared_stream(proxies.triggers())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = res {
                match e {
                    controller::Error::ReconcilerFailed(e, obj) => {
                        warn!(pool = %obj, error = %e, "ProxyPool reconcile failed");
                    }
                    other => debug!(error = %plain_message(&other), "ProxyPool controller"),
                }
            }
            futures::future::ready(())
        })
        .await;
    info!("ProxyPool controller stopped");
}

fn error_policy(_: Arc<ProxyPool>, _: &PoolError, _: Arc<PoolContext>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// The hash of a pool's template: what its Proxies were made from.
pub fn template_hash(pool: &ProxyPool) -> String {
    let json = serde_json::to_vec(&pool.spec.template).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `p` belongs to the pool of `uid`.
fn owned_by(p: &Proxy, uid: &str) -> bool {
    p.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn ready(p: &Proxy) -> bool {
    p.status.as_ref().is_some_and(|s| {
        crate::api::condition::find(&s.conditions, crate::api::proxy::conditions::READY)
            .is_some_and(|c| c.status == crate::api::ConditionStatus::True)
    })
}

/// When the pool scaled `p` down, if it did (a value that is not a time
/// counts from the Proxy's creation: the annotation alone already keeps
/// it out of the listing).
pub fn scaled_down_at(p: &Proxy) -> Option<DateTime<Utc>> {
    let v = p.annotations().get(SCALE_DOWN_ANNOTATION)?;
    let created = crate::api::created_at(p.meta());
    DateTime::parse_from_rfc3339(v)
        .ok()
        .map(|t| t.with_timezone(&Utc))
        .or(created)
        .or(Some(DateTime::<Utc>::MIN_UTC))
}

async fn reconcile(pool: Arc<ProxyPool>, ctx: Arc<PoolContext>) -> Result<Action, PoolError> {
    let (Some(ns), Some(uid)) = (pool.namespace(), pool.uid()) else {
        return Ok(Action::await_change());
    };
    let name = pool.name_any();
    if pool.meta().deletion_timestamp.is_some() {
        if let Some(l) = &ctx.leases {
            l.demand().forget(&ns, &name);
        }
        ctx.scaling.forget(&(ns, name));
        // The garbage collector deletes the Proxies it owns.
        return Ok(Action::await_change());
    }
    let now = Utc::now();
    let hash = template_hash(&pool);
    let (owned, others): (Vec<Arc<Proxy>>, Vec<Arc<Proxy>>) = ctx
        .proxies
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .partition(|p| owned_by(p, &uid));
    let taken: BTreeSet<String> = others.iter().map(|p| p.name_any()).collect();
    let members: Vec<Member> = owned.iter().map(|p| member(p, &hash, &ctx, now)).collect();
    let at_size = plan::plan(&name, pool.spec.replicas, &members, &taken);
    let provider = pool
        .spec
        .template
        .spec
        .provider
        .as_deref()
        .unwrap_or_default();
    let known = ctx.providers.contains_key(provider);
    let scaled = if known {
        scaling::run(&ctx, &pool, &at_size.counts, now).await?
    } else {
        scaling::Outcome {
            replicas: pool.spec.replicas,
            ..Default::default()
        }
    };
    let mut plan = if scaled.replicas == pool.spec.replicas {
        at_size
    } else {
        plan::plan(&name, scaled.replicas, &members, &taken)
    };
    let mut notes = Notes {
        desired: scaled.replicas,
        scaled: scaled.scaled,
        ..Notes::default()
    };
    if !known {
        // Proxies made now would only fail: none is, until the provider
        // is configured (a reload restarts this controller).
        let why = format!(
            "spec.template.spec.provider {provider:?} is not configured in the operator's providers config"
        );
        plan.steps.retain(|s| !matches!(s, Step::Create(_)));
        notes.limited = Some(("UnknownProvider", why.clone()));
        notes.invalid = Some(("InvalidSpec", why));
    } else if let Some(why) = scaled.invalid {
        notes.invalid = Some(("InvalidSpec", why));
    }
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &ns);
    for step in &plan.steps {
        let current = owned
            .iter()
            .find(|p| p.metadata.name.as_deref() == step_name(step));
        act(
            &api,
            (pool.as_ref(), hash.as_str()),
            step,
            current.map(|p| p.as_ref()),
            now,
        )
        .await?;
    }
    let status = status::status_of(&pool, &plan, &notes, now);
    if let (Some(text), Some(events)) = (status::newly_limited(&pool, &status), &ctx.events) {
        let note = Note {
            severity: Severity::Warning,
            reason: status::SCALING_LIMITED,
            action: "Scale",
            text,
        };
        events.record(&pool.object_ref(&()), note).await;
    }
    status::write(&ctx.client, &pool, &status).await?;
    if let Some(m) = &ctx.metrics {
        let min = pool.spec.autoscale.as_ref().map(|a| {
            let floor = a.min_replicas.unwrap_or(autoscale::DEFAULT_MIN);
            if notes.desired == 0 {
                0
            } else {
                floor
            }
        });
        let c = &plan.counts;
        m.saw(
            &ns,
            &name,
            PoolGauges {
                desired: notes.desired,
                ready: c.ready,
                leased: c.leased,
                min,
            },
        );
    }
    let settled = plan.steps.is_empty() && plan.counts.settled(notes.desired);
    let mut after = if settled { SETTLED } else { CONVERGING };
    if pool.spec.autoscale.is_some() {
        after = after.min(AUTOSCALED);
    }
    if let Some(wake) = plan.wake {
        let until = (wake - now).to_std().unwrap_or(Duration::ZERO);
        after = after.min(until.max(Duration::from_millis(500)));
    }
    Ok(Action::requeue(after))
}

fn member(p: &Proxy, hash: &str, ctx: &PoolContext, now: DateTime<Utc>) -> Member {
    let key = ProxyKey {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
    };
    let leased = ctx.leases.as_ref().is_some_and(|l| l.active_on(&key) > 0);
    let removing = scaled_down_at(p).map(|since| {
        let step = ctx.fleet.retire_step(p, since, now);
        // Already marked: a drain that "starts" has started.
        match step {
            DrainStep::Start => DrainStep::Wait { until: now },
            s => s,
        }
    });
    let is_ready = ready(p);
    Member {
        held: (!is_ready).then(|| held_back(p)).flatten(),
        name: key.name,
        ready: is_ready,
        leased,
        created: crate::api::created_at(p.meta()).unwrap_or(now),
        deleting: p.meta().deletion_timestamp.is_some(),
        removing,
        up_to_date: p
            .annotations()
            .get(POOL_TEMPLATE_ANNOTATION)
            .map(String::as_str)
            == Some(hash),
    }
}

/// Why `p` waits, when its provider's cap, a quota or the circuit
/// breaker holds it back: its Provisioned reason and message.
fn held_back(p: &Proxy) -> Option<(String, String)> {
    let conds = &p.status.as_ref()?.conditions;
    let c = crate::api::condition::find(conds, crate::api::proxy::conditions::PROVISIONED)?;
    HELD_BACK
        .contains(&c.reason.as_str())
        .then(|| (c.reason.clone(), c.message.clone()))
}

/// The Proxy `name` of `pool` as its template says.
fn from_template(pool: &ProxyPool, hash: &str, name: &str) -> Proxy {
    let t = &pool.spec.template;
    let mut labels = t.metadata.labels.clone();
    labels.insert(POOL_LABEL.into(), pool.name_any());
    let mut annotations = t.metadata.annotations.clone();
    annotations.insert(POOL_TEMPLATE_ANNOTATION.into(), hash.into());
    Proxy {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: pool.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner(pool)]),
            ..Default::default()
        },
        spec: t.spec.clone(),
        status: None,
    }
}

fn owner(pool: &ProxyPool) -> OwnerReference {
    OwnerReference {
        api_version: "crawl.example.com/v1alpha1".into(),
        kind: "ProxyPool".into(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        // Blocking the owner's foreground deletion would need update on
        // proxypools/finalizers where OwnerReferencesPermissionEnforcement
        // runs; the Proxies' own finalizers already hold their deletion
        // until their instances are gone.
        block_owner_deletion: Some(false),
    }
}

/// The existing Proxy a step acts on (a create has none).
fn step_name(step: &Step) -> Option<&str> {
    match step {
        Step::Create(_) => None,
        Step::ScaleDown(n) | Step::Keep(n) | Step::Delete(n) | Step::Update(n) => Some(n),
    }
}

async fn act(
    api: &Api<Proxy>,
    (pool, hash): (&ProxyPool, &str),
    step: &Step,
    current: Option<&Proxy>,
    now: DateTime<Utc>,
) -> Result<(), PoolError> {
    let pool_name = pool.name_any();
    match step {
        Step::Create(name) => {
            match api
                .create(&PostParams::default(), &from_template(pool, hash, name))
                .await
            {
                Ok(_) => info!(pool = %pool_name, proxy = %name, "Created a Proxy of the pool"),
                // Made already (the store had not shown it yet).
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(api_error(format!("creating Proxy {name}"), &e)),
            }
        }
        Step::ScaleDown(name) => {
            let patch = serde_json::json!({"metadata": {"annotations": {SCALE_DOWN_ANNOTATION: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}}});
            patch_proxy(api, name, &patch, "scaling down").await?;
            info!(pool = %pool_name, proxy = %name, "Scaling a Proxy of the pool down: no new lease; deleted once its leases end");
        }
        Step::Keep(name) => {
            let patch =
                serde_json::json!({"metadata": {"annotations": {SCALE_DOWN_ANNOTATION: null}}});
            patch_proxy(api, name, &patch, "keeping").await?;
            info!(pool = %pool_name, proxy = %name, "Keeping a Proxy the pool was scaling down");
        }
        Step::Delete(name) => match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                info!(pool = %pool_name, proxy = %name, "Deleted a scaled-down Proxy of the pool")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(api_error(format!("deleting Proxy {name}"), &e)),
        },
        Step::Update(name) => {
            let Some(current) = current else {
                return Ok(()); // gone meanwhile
            };
            let want = from_template(pool, hash, name);
            let to_json = |s: &crate::api::ProxySpec| serde_json::to_value(s).unwrap_or_default();
            // Fields the template dropped are removed from the Proxy too.
            let patch = serde_json::json!({
                "metadata": {"labels": want.metadata.labels, "annotations": want.metadata.annotations},
                "spec": plan::merge_diff(&to_json(&current.spec), &to_json(&want.spec)),
            });
            patch_proxy(api, name, &patch, "updating").await?;
            info!(pool = %pool_name, proxy = %name, "Wrote the pool's template into a Proxy");
        }
    }
    Ok(())
}

async fn patch_proxy(
    api: &Api<Proxy>,
    name: &str,
    patch: &serde_json::Value,
    what: &str,
) -> Result<(), PoolError> {
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(api_error(format!("{what} Proxy {name}"), &e)),
    }
}
