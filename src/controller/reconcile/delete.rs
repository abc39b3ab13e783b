//! The deletion path of a reconcile: clean up the instance (unless
//! skip-cleanup), then release the finalizer.

use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::json;
use tracing::{info, instrument};

use super::{fail_delete, finish, get_error, patch_metadata};
use crate::api::constants::{is_true_annotation, FINALIZER, SKIP_CLEANUP_ANNOTATION};
use crate::api::{Proxy, ProxyStatus};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::plan::delete::Target;
use crate::controller::plan::{self, DeleteInput, DeleteStep, Ending, GetOutcome, ReleaseReason};
use crate::crashpoint;
use crate::provider::error::plain_message;

/// Steps of one deletion pass (get, delete after a permanent get, release),
/// for up to three instances (retiring, surge, current).
const DELETE_STEPS: usize = 10;

#[instrument(name = "reconcile.delete", skip_all)]
pub(super) async fn delete_path(
    proxy: &Proxy,
    ctx: &Context,
    status: &mut ProxyStatus,
) -> Result<Action, Error> {
    let generation = proxy.metadata.generation;
    let provider_name = proxy.spec.provider.clone().unwrap_or_default();
    let provider = ctx.registry.get(&provider_name);
    ctx.throttle
        .forget(&provider_name, &proxy.uid().unwrap_or_default());
    let mut get: Option<GetOutcome> = None;
    for _ in 0..DELETE_STEPS {
        let now = ctx.clock.now();
        let (target, target_id, requested) = plan::delete::deletion_target(status);
        let id = target_id.unwrap_or_default().to_string();
        let step = plan::next_delete_step(&DeleteInput {
            has_finalizer: proxy.finalizers().iter().any(|f| f == FINALIZER),
            provider_id: target_id,
            skip_cleanup: is_true_annotation(
                proxy
                    .annotations()
                    .get(SKIP_CLEANUP_ANNOTATION)
                    .map(String::as_str),
            ),
            provider_configured: provider.is_some(),
            get: get.as_ref(),
            delete_requested_at: requested,
            now,
        });
        let not_configured = || Error::NotConfigured {
            provider: provider_name.clone(),
            id: id.clone(),
        };
        let p = || provider.clone().ok_or_else(not_configured);
        let ending = match step {
            DeleteStep::Nothing => Ending::NotHeld,
            // A surge or retiring instance is gone: on to the next.
            DeleteStep::Release { why }
                if why != ReleaseReason::SkipCleanup && target != Target::Current =>
            {
                plan::delete::forget_target(status, target);
                get = None;
                continue;
            }
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
                crashpoint::hit(crashpoint::BEFORE_RELEASE);
                patch_metadata(proxy, &ctx.client, json!({ "finalizers": fins })).await?;
                ctx.cleanup_done(&super::key(proxy));
                let note = plan::events::released_note(why, status.provider_id.as_deref());
                super::events::record(ctx, proxy, note).await;
                Ending::Released
            }
            DeleteStep::ProviderNotConfigured => return Err(not_configured()),
            DeleteStep::Get => {
                get = Some(super::look::look(p()?.as_ref(), &id, status).await);
                continue;
            }
            DeleteStep::Delete => match p()?.delete(&id).await {
                Ok(()) if target == Target::Current => Ending::CleanupRequested,
                Ok(()) => {
                    plan::delete::target_delete_requested(status, target, now);
                    Ending::CleanupPending
                }
                Err(e) => {
                    failed(ctx, proxy, status, &plain_message(&e));
                    return fail_delete(ctx, e);
                }
            },
            DeleteStep::DeleteAfterPermanentGet { get_error } => match p()?.delete(&id).await {
                Ok(()) => {
                    info!(providerID = %id, error = %get_error, "Instance unreachable but cleanup succeeded");
                    get = Some(GetOutcome::NotFound);
                    continue;
                }
                Err(delete_error) => {
                    let message = plain_message(&delete_error);
                    failed(ctx, proxy, status, &message);
                    return Err(Error::Cleanup {
                        get_error,
                        delete_error,
                    });
                }
            },
            DeleteStep::Wait => Ending::CleanupPending,
            DeleteStep::Failed { class, message } => {
                failed(ctx, proxy, status, &message);
                return fail_delete(ctx, get_error(class, &provider_name, &id, message));
            }
        };
        return finish(ctx, ending, status, now, generation);
    }
    finish(ctx, Ending::StepLimit, status, ctx.clock.now(), generation)
}

/// A cleanup attempt failed with the provider's `message`: after a few in
/// a row the Proxy says so (`plan::delete::mark_cleanup_failed`), and the
/// pass's Events carry it.
fn failed(ctx: &Context, proxy: &Proxy, status: &mut ProxyStatus, message: &str) {
    let failures = ctx.cleanup_failed(&super::key(proxy));
    plan::delete::mark_cleanup_failed(status, failures, message, ctx.clock.now());
}
