//! How a pass ends: the controller's action for the plan's ending, a
//! provider failure turned into a status or the controller's backoff, and
//! the External path, which is one ending.

use chrono::{DateTime, Utc};
use kube::runtime::controller::Action;
use kube::ResourceExt;

use crate::api::{Proxy, ProxyStatus};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::plan::{self, Backoff, End, Ending, Failure, Health};
use crate::provider::error::plain_message;
use crate::provider::ProviderError;

/// What the health engine says of `proxy` served at `host` (the instance's
/// IP, or the External endpoint).
pub(super) fn health_of(ctx: &Context, proxy: &Proxy, host: Option<&str>) -> Health {
    let Some(h) = ctx.health.as_ref() else {
        return Health::Unknown;
    };
    let (ns, name, uid) = (
        proxy.namespace().unwrap_or_default(),
        proxy.name_any(),
        proxy.uid().unwrap_or_default(),
    );
    Health::at(
        h.report(&ns, &name, &uid),
        h.verdict(&ns, &name, &uid),
        h.probed_host(&ns, &name, &uid).as_deref(),
        host,
    )
}

/// The controller's action for `end`, its delay jittered.
pub(super) fn action(ctx: &Context, end: End) -> Action {
    controller_action(plan::jittered(end, ctx.random.unit()))
}

pub(super) fn controller_action(end: End) -> Action {
    match end {
        End::AwaitChange => Action::await_change(),
        // Spread by `jittered` already; a bare one waits exactly that.
        End::NotBefore(d) => Action::requeue(d),
        End::RequeueAfter(d) => Action::requeue(d),
    }
}

/// Ends a pass the way the plan says `ending` ends.
pub(super) fn finish(
    ctx: &Context,
    ending: Ending<'_>,
    status: &mut ProxyStatus,
    now: DateTime<Utc>,
    generation: Option<i64>,
) -> Result<Action, Error> {
    Ok(action(ctx, plan::end(ending, status, now, generation)))
}

/// Ends a managed pass after `err`, or hands it to the controller's backoff.
pub(super) fn fail(
    ctx: &Context,
    proxy: &Proxy,
    err: ProviderError,
    status: &mut ProxyStatus,
    now: DateTime<Utc>,
) -> Result<Action, Error> {
    let message = plain_message(&err);
    let failure = Failure {
        op: err.op(),
        class: err.class(),
        message: &message,
    };
    let health = health_of(ctx, proxy, status.ip.as_deref());
    let generation = proxy.metadata.generation;
    let end = match plan::managed_failure(&failure, &health, status, now, generation) {
        Ok(end) => plan::jittered(end, ctx.random.unit()),
        Err(Backoff) => return Err(err.into()),
    };
    if let Some(hold) = plan::hold::hold_after(&failure, generation, end, now) {
        ctx.hold_creates(&proxy.uid().unwrap_or_default(), hold);
    }
    Ok(controller_action(end))
}

/// Ends a deletion pass after `err`, or hands it to the controller's backoff.
pub(super) fn fail_delete(ctx: &Context, err: ProviderError) -> Result<Action, Error> {
    plan::delete_failure(err.class())
        .map(|end| action(ctx, end))
        .map_err(|Backoff| err.into())
}

pub(super) fn external_path(proxy: &Proxy, ctx: &Context, status: &mut ProxyStatus) -> Action {
    let namespace = proxy.namespace().unwrap_or_default();
    let credentials = external_credentials(proxy, ctx, &namespace);
    let ending = if !ctx.external.allows(&namespace) {
        Ending::ExternalNotAllowed {
            message: ctx.external.refusal(&namespace),
        }
    } else if let Err(message) = credentials {
        Ending::ExternalCredentialsUnavailable { message }
    } else {
        Ending::External {
            host: proxy.spec.endpoint.as_ref().map(|ep| ep.host.as_str()),
            health: health_of(
                ctx,
                proxy,
                proxy.spec.endpoint.as_ref().map(|ep| ep.host.as_str()),
            ),
        }
    };
    action(
        ctx,
        plan::end(ending, status, ctx.clock.now(), proxy.metadata.generation),
    )
}

/// Whether an External Proxy's `spec.auth.secretRef` (if any) holds usable
/// credentials; `Err` says what is wrong, naming the field and the Secret.
fn external_credentials(proxy: &Proxy, ctx: &Context, namespace: &str) -> Result<(), String> {
    use crate::credentials::cache::Lookup;
    let Some(name) = crate::credentials::secret_of(proxy) else {
        return Ok(());
    };
    let label = crate::api::constants::CREDENTIALS_SECRET_LABEL;
    match ctx.credentials.lookup(namespace, name) {
        Lookup::Found(_) => Ok(()),
        Lookup::NotSynced => Err(format!(
            "spec.auth.secretRef: the operator's watch of credentials Secrets has not synced yet (Secret {name:?})"
        )),
        Lookup::Missing => Err(format!(
            "spec.auth.secretRef: no Secret {name:?} labelled {label}: \"true\" in namespace {namespace:?} (create it with keys username and password, and label it)"
        )),
        Lookup::Invalid(e) => Err(format!("spec.auth.secretRef: {e}")),
    }
}
