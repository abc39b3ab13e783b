//! The effects of a reconcile: gather observations, ask `plan` for the next
//! step, perform it, repeat; then write the status once, only if it changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::plan::{self, DeleteInput, DeleteStep, GetOutcome, ManagedInput, ReleaseReason, Step};
use super::{cloud_init, status_patch};
use crate::api::constants::{
    is_true_annotation, FINALIZER, SKIP_CLEANUP_ANNOTATION, SPEC_HASH_ANNOTATION,
};
use crate::api::health::{HealthReport, HealthSource};
use crate::api::{Proxy, ProxyMode, ProxyPhase, ProxyStatus};
use crate::provider::error::plain_message;
use crate::provider::naming::{name_from_uid, spec_hash, HashInput};
use crate::provider::registry::Registry;
use crate::provider::{CreateRequest, ErrorClass, Provider, ProviderError, UserData};

/// How long a Running instance waits before the next `get` (catches
/// instances that stop behind the operator's back).
pub const RUNNING_RESYNC: Duration = Duration::from_secs(60);

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Configured providers, decorated.
    pub registry: Registry,
    /// This installation's identity.
    pub installation_id: String,
    /// Health verdicts, when the health engine runs.
    pub health: Option<Arc<dyn HealthSource>>,
    /// The labelled cloud-init Secrets, filled by the controller's Secret
    /// watch; cloud-init is read from here, never with `get`.
    pub secrets: cloud_init::SecretCache,
    failures: Mutex<HashMap<String, u32>>,
    /// Reconcile count, error and duration series, when exported.
    pub metrics: Option<super::metrics::ReconcileMetrics>,
}

impl Context {
    /// A context.
    pub fn new(
        client: Client,
        registry: Registry,
        installation_id: String,
        health: Option<Arc<dyn HealthSource>>,
    ) -> Self {
        Context {
            client,
            registry,
            installation_id,
            health,
            secrets: cloud_init::SecretCache::default(),
            failures: Mutex::new(HashMap::new()),
            metrics: None,
        }
    }

    /// Records reconciles into `metrics`.
    pub fn with_metrics(mut self, metrics: super::metrics::ReconcileMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Exponential backoff per object: 5ms doubling up to 1000s, reset on
    /// success (the controller-runtime defaults).
    pub fn backoff(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        let ms = 5u64.saturating_mul(1u64 << (*n - 1).min(30));
        Duration::from_millis(ms.min(1_000_000))
    }

    fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// A reconcile that should be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A provider call failed transiently (or with NotFound outside get).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {msg}", msg = plain_message(.0))]
    Kube(#[from] kube::Error),
    /// The provider of a Proxy being deleted is not configured.
    #[error("provider {provider:?} is not configured; cannot clean up instance {id}; set {SKIP_CLEANUP_ANNOTATION}: \"true\" to abandon it")]
    NotConfigured {
        /// The provider name.
        provider: String,
        /// The instance.
        id: String,
    },
    /// Cleanup after a permanent get failed too.
    #[error("instance unreachable ({get_error}) and delete failed: {delete_error}")]
    Cleanup {
        /// The get error.
        get_error: String,
        /// The delete error.
        delete_error: ProviderError,
    },
}

fn key(p: &Proxy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// Reconciles one Proxy; the status is patched at the end if it changed.
#[instrument(
    name = "Reconcile Proxy",
    skip_all,
    fields(
        proxy = %key(&proxy),
        otel.kind = "internal",
        k8s.namespace.name = %proxy.namespace().unwrap_or_default(),
        k8s.object.name = %proxy.name_any(),
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
)]
pub async fn reconcile(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let res = reconcile_inner(proxy, ctx).await;
    let span = tracing::Span::current();
    match &res {
        Ok(_) => span.record("otel.status_code", "ok"),
        Err(e) => {
            span.record("otel.status_code", "error");
            span.record("otel.status_description", plain_message(e))
        }
    };
    res
}

async fn reconcile_inner(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let base = proxy.status.clone().unwrap_or_default();
    let mut status = base.clone();
    let result = if proxy.metadata.deletion_timestamp.is_some() {
        delete_path(&proxy, &ctx, &mut status).await
    } else if proxy.spec.mode == ProxyMode::External {
        Ok(external_path(&proxy, &ctx, &mut status))
    } else {
        managed_path(&proxy, &ctx, &mut status).await
    };
    let patched = patch_status(&proxy, &ctx.client, &base, &status).await;
    let action = result?;
    patched?;
    ctx.succeeded(&key(&proxy));
    Ok(action)
}

/// Requeue policy for a failed reconcile.
pub fn error_policy(proxy: Arc<Proxy>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff(&key(&proxy));
    warn!(proxy = %key(&proxy), error = %plain_message(err), retry_in = ?delay, "Reconcile failed");
    Action::requeue(delay)
}

#[instrument(name = "status.patch", skip_all)]
async fn patch_status(
    proxy: &Proxy,
    client: &Client,
    base: &ProxyStatus,
    new: &ProxyStatus,
) -> Result<(), Error> {
    let (Ok(b), Ok(n)) = (serde_json::to_value(base), serde_json::to_value(new)) else {
        return Ok(());
    };
    let Some(diff) = status_patch::merge_diff(&b, &n) else {
        return Ok(());
    };
    let api: Api<Proxy> = Api::namespaced(client.clone(), &proxy.namespace().unwrap_or_default());
    match api
        .patch_status(
            &proxy.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": diff })),
        )
        .await
    {
        Ok(_) => Ok(()),
        // The reconcile may just have released the last finalizer.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn health_of(ctx: &Context, proxy: &Proxy) -> Option<bool> {
    let h = ctx.health.as_ref()?;
    h.verdict(
        &proxy.namespace().unwrap_or_default(),
        &proxy.name_any(),
        &proxy.uid().unwrap_or_default(),
    )
}

fn report_of(ctx: &Context, proxy: &Proxy) -> Option<HealthReport> {
    let h = ctx.health.as_ref()?;
    h.report(
        &proxy.namespace().unwrap_or_default(),
        &proxy.name_any(),
        &proxy.uid().unwrap_or_default(),
    )
}

fn external_path(proxy: &Proxy, ctx: &Context, status: &mut ProxyStatus) -> Action {
    let now = Utc::now();
    match &proxy.spec.endpoint {
        None => {
            plan::mark_invalid(
                status,
                "spec.endpoint is required when spec.mode is External",
                now,
                proxy.metadata.generation,
            );
            Action::await_change()
        }
        Some(ep) => {
            status.ip = Some(ep.host.clone());
            status.phase = Some(if health_of(ctx, proxy) == Some(true) {
                ProxyPhase::Ready
            } else {
                ProxyPhase::Running
            });
            plan::apply_health(status, report_of(ctx, proxy).as_ref(), now);
            Action::await_change()
        }
    }
}

/// Updates metadata with the object's resourceVersion as a precondition,
/// so a stale write fails with a conflict instead of clobbering.
async fn patch_metadata(
    proxy: &Proxy,
    client: &Client,
    metadata: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<Proxy> = Api::namespaced(client.clone(), &proxy.namespace().unwrap_or_default());
    let mut md = metadata;
    md["resourceVersion"] = json!(proxy.resource_version());
    api.patch(
        &proxy.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": md })),
    )
    .await?;
    Ok(())
}

/// Writes the spec-hash annotation unless it already holds `hash`, and
/// remembers what was written.
async fn record_hash(
    proxy: &Proxy,
    client: &Client,
    recorded: &mut Option<String>,
    hash: &Option<String>,
) -> Result<(), Error> {
    if recorded != hash {
        patch_metadata(
            proxy,
            client,
            json!({ "annotations": { SPEC_HASH_ANNOTATION: hash } }),
        )
        .await?;
        recorded.clone_from(hash);
    }
    Ok(())
}

fn outcome(res: Result<crate::provider::Instance, ProviderError>) -> GetOutcome {
    match res {
        Ok(i) => GetOutcome::Found(i),
        Err(e) if e.class() == ErrorClass::NotFound => GetOutcome::NotFound,
        Err(e) => GetOutcome::Failed(e.class(), plain_message(&e)),
    }
}

/// Permanent: latched; quota: retried in 5 minutes; the rest: backoff.
fn on_error(proxy: &Proxy, status: &mut ProxyStatus, err: ProviderError) -> Result<Action, Error> {
    let now = Utc::now();
    match err.class() {
        ErrorClass::Permanent => {
            plan::mark_permanent(status, &plain_message(&err), now, proxy.metadata.generation);
            Ok(Action::await_change())
        }
        ErrorClass::QuotaExceeded => {
            plan::mark_quota(status, &plain_message(&err), now, proxy.metadata.generation);
            Ok(Action::requeue(plan::QUOTA_RETRY))
        }
        _ => Err(err.into()),
    }
}

fn get_error(class: ErrorClass, provider: &str, id: &str, message: String) -> ProviderError {
    ProviderError::new(class, crate::provider::Op::Get, provider, id, message)
}

#[instrument(name = "reconcile.managed", skip_all)]
async fn managed_path(
    proxy: &Proxy,
    ctx: &Context,
    status: &mut ProxyStatus,
) -> Result<Action, Error> {
    let generation = proxy.metadata.generation;
    let has_finalizer = proxy.finalizers().iter().any(|f| f == FINALIZER);
    let provider_name = proxy.spec.provider.clone().unwrap_or_default();
    let provider: Option<Arc<dyn Provider>> = ctx.registry.get(&provider_name);
    let mut recorded: Option<String> = proxy.annotations().get(SPEC_HASH_ANNOTATION).cloned();
    let mut hash: Option<String> = None;
    let mut user_data = UserData::default();
    let mut get: Option<GetOutcome> = None;
    let namespace = proxy.namespace().unwrap_or_default();

    // Bounded: every step either ends the pass or adds an observation.
    for _ in 0..16 {
        let now = Utc::now();
        let step = plan::next_managed_step(&ManagedInput {
            generation,
            has_finalizer,
            status,
            provider_configured: provider.is_some(),
            recorded_hash: recorded.as_deref(),
            spec_hash: hash.as_deref(),
            get: get.as_ref(),
            now,
        });
        // The plan only asks for provider calls once the provider is known.
        let p = || {
            provider.clone().ok_or_else(|| {
                get_error(
                    ErrorClass::Permanent,
                    &provider_name,
                    "",
                    "provider not configured".into(),
                )
            })
        };
        let id = status.provider_id.clone().unwrap_or_default();
        match step {
            Step::AddFinalizer => {
                let mut fins = proxy.finalizers().to_vec();
                fins.push(FINALIZER.to_string());
                patch_metadata(proxy, &ctx.client, json!({ "finalizers": fins })).await?;
                return Ok(Action::requeue(plan::REQUEUE_NOW));
            }
            Step::Latched => return Ok(Action::await_change()),
            Step::ProviderNotConfigured => {
                plan::mark_not_configured(status, &provider_name, now);
                return Ok(Action::await_change());
            }
            Step::ResolveCloudInit => {
                match cloud_init::resolve(&ctx.secrets, &namespace, proxy.spec.cloud_init.as_ref())
                    .await
                {
                    Ok(text) => {
                        let port = proxy.spec.port.unwrap_or(0);
                        hash = Some(spec_hash(HashInput {
                            placement: proxy.spec.placement.as_ref(),
                            cloud_init: &text,
                            port,
                        }));
                        user_data = UserData::new(text);
                    }
                    Err(e) => {
                        plan::mark_cloud_init_error(status, &plain_message(&e), now, generation);
                        return Ok(Action::requeue(plan::CLOUD_INIT_RETRY));
                    }
                }
            }
            Step::RecordHash => record_hash(proxy, &ctx.client, &mut recorded, &hash).await?,
            Step::Create => {
                record_hash(proxy, &ctx.client, &mut recorded, &hash).await?;
                let Some(port) = proxy
                    .spec
                    .port
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0)
                else {
                    plan::mark_invalid(
                        status,
                        "spec.port must be 1-65535 for a Managed Proxy",
                        now,
                        generation,
                    );
                    return Ok(Action::await_change());
                };
                let uid = proxy.uid().unwrap_or_default();
                let req = CreateRequest {
                    name: name_from_uid(&uid),
                    uid,
                    namespace: namespace.clone(),
                    proxy_name: proxy.name_any(),
                    placement: proxy.spec.placement.clone().unwrap_or_default(),
                    cloud_init: user_data.clone(),
                    port,
                    installation_id: ctx.installation_id.clone(),
                };
                match p()?.create(&req).await {
                    Ok(new_id) => {
                        info!(providerID = %new_id, provider = %provider_name, cloudInitBytes = req.cloud_init.len(), "Instance created");
                        status.provider_id = Some(new_id);
                        plan::mark_creating(status, now, generation);
                        plan::health_unknown(status, now);
                        return Ok(Action::requeue(plan::REQUEUE_NOW));
                    }
                    Err(e) => return on_error(proxy, status, e),
                }
            }
            Step::Get => get = Some(outcome(p()?.get(&id).await)),
            Step::Delete { why } => match p()?.delete(&id).await {
                Ok(()) => {
                    info!(providerID = %id, reason = ?why, "Replacing instance");
                    plan::mark_replacing(status, why, true, now, generation);
                    plan::health_unknown(status, now);
                    return Ok(Action::requeue(plan::DELETION_POLL));
                }
                Err(e) => return on_error(proxy, status, e),
            },
            Step::WaitForDeletion { why } => {
                plan::mark_replacing(status, why, false, now, generation);
                return Ok(Action::requeue(plan::DELETION_POLL));
            }
            Step::ClearAndCreate => {
                record_hash(proxy, &ctx.client, &mut recorded, &hash).await?;
                plan::clear_instance(status);
                get = None;
            }
            Step::WaitProvisioning => {
                plan::mark_creating(status, now, generation);
                plan::health_unknown(status, now);
                return Ok(Action::requeue(plan::PROVISIONING_POLL));
            }
            Step::Running { ip } => {
                plan::mark_running(status, &ip, health_of(ctx, proxy), now, generation);
                plan::apply_health(status, report_of(ctx, proxy).as_ref(), now);
                return Ok(Action::requeue(RUNNING_RESYNC));
            }
            Step::Failed { class, message } => {
                return on_error(
                    proxy,
                    status,
                    get_error(class, &provider_name, &id, message),
                )
            }
        }
    }
    // Unreachable in practice; requeue rather than spin.
    Ok(Action::requeue(plan::REQUEUE_NOW))
}

#[instrument(name = "reconcile.delete", skip_all)]
async fn delete_path(
    proxy: &Proxy,
    ctx: &Context,
    status: &mut ProxyStatus,
) -> Result<Action, Error> {
    let provider_name = proxy.spec.provider.clone().unwrap_or_default();
    let provider = ctx.registry.get(&provider_name);
    let id = status.provider_id.clone().unwrap_or_default();
    let mut get: Option<GetOutcome> = None;
    for _ in 0..4 {
        let now = Utc::now();
        let step = plan::next_delete_step(&DeleteInput {
            has_finalizer: proxy.finalizers().iter().any(|f| f == FINALIZER),
            provider_id: status.provider_id.as_deref(),
            skip_cleanup: is_true_annotation(
                proxy
                    .annotations()
                    .get(SKIP_CLEANUP_ANNOTATION)
                    .map(String::as_str),
            ),
            provider_configured: provider.is_some(),
            get: get.as_ref(),
            delete_requested_at: status.delete_requested_at,
            now,
        });
        let not_configured = || Error::NotConfigured {
            provider: provider_name.clone(),
            id: id.clone(),
        };
        let p = || provider.clone().ok_or_else(not_configured);
        match step {
            DeleteStep::Nothing => return Ok(Action::await_change()),
            DeleteStep::Release { why } => {
                if why == ReleaseReason::SkipCleanup {
                    info!(providerID = %id, provider = %provider_name, "skip-cleanup set: abandoning the instance");
                }
                let fins: Vec<String> = proxy
                    .finalizers()
                    .iter()
                    .filter(|f| *f != FINALIZER)
                    .cloned()
                    .collect();
                patch_metadata(proxy, &ctx.client, json!({ "finalizers": fins })).await?;
                return Ok(Action::await_change());
            }
            DeleteStep::ProviderNotConfigured => return Err(not_configured()),
            DeleteStep::Get => get = Some(outcome(p()?.get(&id).await)),
            DeleteStep::Delete => match p()?.delete(&id).await {
                Ok(()) => {
                    status.delete_requested_at = Some(now);
                    return Ok(Action::requeue(plan::DELETION_POLL));
                }
                Err(e) if e.class() == ErrorClass::QuotaExceeded => {
                    return Ok(Action::requeue(plan::QUOTA_RETRY))
                }
                Err(e) => return Err(e.into()),
            },
            DeleteStep::DeleteAfterPermanentGet { get_error } => match p()?.delete(&id).await {
                Ok(()) => {
                    info!(providerID = %id, error = %get_error, "Instance unreachable but cleanup succeeded");
                    get = Some(GetOutcome::NotFound);
                }
                Err(delete_error) => {
                    return Err(Error::Cleanup {
                        get_error,
                        delete_error,
                    })
                }
            },
            DeleteStep::Wait => return Ok(Action::requeue(plan::DELETION_POLL)),
            DeleteStep::Failed { class, message } => {
                if class == ErrorClass::QuotaExceeded {
                    return Ok(Action::requeue(plan::QUOTA_RETRY));
                }
                return Err(get_error(class, &provider_name, &id, message).into());
            }
        }
    }
    Ok(Action::requeue(plan::REQUEUE_NOW))
}
