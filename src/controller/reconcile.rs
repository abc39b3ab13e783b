//! The I/O shell of a reconcile. It gathers what [`plan`] decides on (the
//! Proxy, its cloud-init, the provider's `get`, the health engine's word),
//! performs the step the plan names, and asks again, until the plan says
//! how the pass ends; then it writes the status once, only if it changed.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::json;
use tracing::{info, instrument, warn};

use super::context::Context;
use super::error::Error;
use super::plan::{self, Ending, GetOutcome, ManagedInput, Path, Step};
mod credentials;
mod delete;
mod endings;
mod events;
mod look;
mod side;
mod writes;

use super::throttle::create_gate;
use super::{cloud_init, status_patch, user_data};
use crate::api::constants::{FINALIZER, SPEC_HASH_ANNOTATION};
use crate::api::{AuthMode, Proxy, ProxyAuth, ProxyStatus};
use crate::config::DestinationRules;
use crate::crashpoint;
use crate::fleet::{replace_pending, RecyclePolicy};
use crate::provider::error::plain_message;
use crate::provider::naming::{instance_name, spec_hash, HashInput};
use crate::provider::{
    CreateRequest, ErrorClass, InstanceCredentials, Op, Provider, ProviderError, UserData,
};
use delete::delete_path;
use endings::{action, external_path, fail, fail_delete, finish, health_of};
use writes::{patch_metadata, patch_status, record_hash};

/// Steps of one managed pass; every step either ends the pass or adds an
/// observation, so the bound is never reached in practice.
const MANAGED_STEPS: usize = 24;

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
    let uid = proxy.uid().unwrap_or_default();
    let read = proxy.status.clone().unwrap_or_default();
    // Our own last write when the cache has not caught up with it yet.
    let base = ctx.written.base(&uid, read, ctx.clock.now());
    let mut status = base.clone();
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    let result = match plan::path(deleting, proxy.spec.mode) {
        Path::Delete => delete_path(&proxy, &ctx, &mut status).await,
        Path::External => Ok(external_path(&proxy, &ctx, &mut status)),
        Path::Managed => managed_path(&proxy, &ctx, &mut status).await,
    };
    // A Proxy being deleted keeps the summary it had: its spec is no longer
    // acted on.
    if !deleting {
        plan::summarize(&mut status, proxy.metadata.generation, ctx.clock.now());
    }
    let patched = patch_status(&proxy, &ctx.client, &base, &status).await;
    if patched.is_ok() && status != base {
        ctx.written.wrote(&uid, &status, ctx.clock.now());
        events::record_pass(&ctx, &proxy, &base, &status).await;
    }
    let action = result?;
    patched?;
    ctx.succeeded(&key(&proxy));
    Ok(action)
}

/// Requeue policy for a failed reconcile.
pub fn error_policy(proxy: Arc<Proxy>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = plan::jitter(ctx.backoff(&key(&proxy)), ctx.random.unit());
    warn!(proxy = %key(&proxy), error = %plain_message(err), retry_in = ?delay, "Reconcile failed");
    Action::requeue(delay)
}

/// A failed `get`, as the error the controller retries.
fn get_error(class: ErrorClass, provider: &str, id: &str, message: String) -> ProviderError {
    ProviderError::new(class, Op::Get, provider, id, message)
}

/// The create of `proxy`'s instance of `serial` (its name's suffix).
fn create_request(
    proxy: &Proxy,
    (installation_id, serial): (&str, u32),
    (port, destinations): (u16, &DestinationRules),
    (cloud_init, credentials): (&UserData, Option<InstanceCredentials>),
) -> Result<CreateRequest, Error> {
    let uid = proxy.uid().unwrap_or_default();
    let creds = credentials.as_ref().map(|c| &c.credentials);
    // A hash is CPU work: made only for user-data that holds one.
    let wanted = user_data::wants_htpasswd(proxy.spec.cloud_init.as_ref(), cloud_init.expose());
    let htpasswd = match creds {
        Some(c) if wanted => Some(
            c.htpasswd()
                .map_err(|e| Error::Credentials(e.to_string()))?,
        ),
        _ => None,
    };
    let fill = user_data::Fill {
        port,
        credentials: creds,
        htpasswd: htpasswd.as_deref(),
        destinations,
    };
    let cloud_init = UserData::new(user_data::render(
        proxy.spec.cloud_init.as_ref(),
        cloud_init.expose(),
        &fill,
    ));
    Ok(CreateRequest {
        credentials,
        name: instance_name(&uid, serial),
        uid,
        namespace: proxy.namespace().unwrap_or_default(),
        proxy_name: proxy.name_any(),
        placement: proxy.spec.placement.clone().unwrap_or_default(),
        cloud_init,
        port,
        installation_id: installation_id.to_string(),
    })
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
    let uid = proxy.uid().unwrap_or_default();
    let startup_timeout = RecyclePolicy::of(proxy.spec.recycle.as_ref())
        .ok()
        .and_then(|p| p.startup_timeout)
        .unwrap_or(ctx.throttle.limits(&provider_name).startup_timeout);

    let mut gates = plan::Gates::default();
    let mut side_obs = plan::surge::SideObs::default();
    for _ in 0..MANAGED_STEPS {
        let now = ctx.clock.now();
        let step = plan::next_managed_step(&ManagedInput {
            generation,
            has_finalizer,
            status,
            provider_configured: provider.is_some(),
            recorded_hash: recorded.as_deref(),
            spec_hash: hash.as_deref(),
            get: get.as_ref(),
            now,
            startup_timeout,
            port: proxy.spec.port,
            gates,
            side: &side_obs,
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
        let died = plan::replace::died(&step, status);
        let ending = match step {
            Step::AddFinalizer => {
                let mut fins = proxy.finalizers().to_vec();
                fins.push(FINALIZER.to_string());
                patch_metadata(proxy, &ctx.client, json!({ "finalizers": fins })).await?;
                Ending::FinalizerAdded
            }
            Step::Latched => Ending::Latched,
            Step::ProviderNotConfigured => Ending::ProviderNotConfigured {
                provider: &provider_name,
            },
            Step::ResolveCloudInit => {
                match cloud_init::resolve(&ctx.secrets, &namespace, proxy.spec.cloud_init.as_ref())
                    .await
                {
                    Ok(text) => {
                        hash = Some(spec_hash(HashInput {
                            placement: proxy.spec.placement.as_ref(),
                            cloud_init: &text,
                            port: proxy.spec.port.unwrap_or(0),
                            open: ProxyAuth::mode_of(proxy.spec.auth.as_ref()) == AuthMode::None,
                        }));
                        user_data = UserData::new(text);
                        continue;
                    }
                    Err(e) => Ending::CloudInitUnreadable {
                        message: plain_message(&e),
                    },
                }
            }
            Step::RecordHash => {
                record_hash(proxy, &ctx.client, &mut recorded, &hash).await?;
                continue;
            }
            Step::NoPort => Ending::NoPort,
            Step::AskCreate => {
                gates.create = Some(create_gate(ctx, &provider_name, (&uid, 0), generation, now));
                continue;
            }
            Step::Held(held) => {
                if let Some(reason) = held.counted_as() {
                    ctx.throttle.held(&provider_name, reason);
                }
                Ending::Held {
                    provider: &provider_name,
                    held,
                }
            }
            Step::Create { port } => {
                record_hash(proxy, &ctx.client, &mut recorded, &hash).await?;
                let serial = u32::try_from(status.instance_serial.unwrap_or(0)).unwrap_or(0);
                let installation = (ctx.installation_id.as_str(), serial);
                let creds = credentials::ensure(ctx, proxy, serial).await?;
                let secret = creds.as_ref().map(|c| c.secret_name.clone());
                let rules = ctx.registry.destinations(&provider_name);
                let req = create_request(proxy, installation, (port, &rules), (&user_data, creds))?;
                match p()?.create(&req).await {
                    Ok(id) => {
                        crashpoint::hit(crashpoint::AFTER_CREATE);
                        status.credentials_secret = secret;
                        // A new instance is what a pending replace asks for.
                        plan::recycle::handle_replace(replace_pending(proxy), status);
                        info!(providerID = %id, provider = %provider_name, cloudInitBytes = req.cloud_init.len(), "Instance created");
                        Ending::Created { id, port }
                    }
                    Err(e) => {
                        ctx.throttle.create_failed(&provider_name, &uid);
                        return fail(ctx, proxy, e, status, now);
                    }
                }
            }
            Step::Get => {
                get = Some(look::look(p()?.as_ref(), &id, status).await);
                continue;
            }
            Step::Side(step) => {
                let side = side::Side {
                    proxy,
                    ctx,
                    provider: p()?,
                    provider_name: &provider_name,
                    user_data: &user_data,
                    hash: hash.as_deref().unwrap_or_default(),
                };
                let seen = (&mut recorded, &mut get);
                side.perform(step, status, &mut side_obs, seen, now).await?;
                continue;
            }
            Step::AskReplace => {
                gates.replace = Some(ctx.fleet.admit_replace(&provider_name, &key(proxy), now));
                continue;
            }
            Step::CircuitOpen => Ending::CircuitOpen,
            Step::AskRecycle => {
                gates.recycle = Some(ctx.fleet.step(proxy, status, now));
                continue;
            }
            Step::DeleteDrained { why } => match p()?.delete(&id).await {
                Ok(()) => {
                    credentials::replaced(ctx, proxy, status.credentials_secret.as_deref()).await;
                    // Replaced for failing its probe: the next create
                    // backs off as after a death.
                    if plan::replace::unhealthy(status) {
                        plan::replace::note(status, now);
                    }
                    plan::recycle::handle_replace(replace_pending(proxy), status);
                    info!(providerID = %id, reason = ?why, "Recycling: replacing the drained instance");
                    Ending::Replacing {
                        why,
                        requested: true,
                    }
                }
                Err(e) => return fail(ctx, proxy, e, status, now),
            },
            Step::Delete { why } => match p()?.delete(&id).await {
                Ok(()) => {
                    credentials::replaced(ctx, proxy, status.credentials_secret.as_deref()).await;
                    if died {
                        plan::replace::note(status, now);
                    }
                    info!(providerID = %id, reason = ?why, "Replacing instance");
                    Ending::Replacing {
                        why,
                        requested: true,
                    }
                }
                Err(e) => return fail(ctx, proxy, e, status, now),
            },
            Step::WaitForDeletion { why } => Ending::Replacing {
                why,
                requested: false,
            },
            Step::ClearAndCreate => {
                record_hash(proxy, &ctx.client, &mut recorded, &hash).await?;
                crashpoint::hit(crashpoint::AFTER_RECORD_HASH);
                if died {
                    info!(providerID = %id, "Instance vanished: replacing it");
                    plan::replace::note(status, now);
                }
                ctx.throttle.settle(&provider_name, &uid, false, now);
                plan::recycle::handle_replace(replace_pending(proxy), status);
                plan::status::clear_instance(status);
                plan::recycle::clear_drain(status);
                get = None;
                continue;
            }
            Step::WaitProvisioning => Ending::Provisioning,
            Step::Running {
                ip,
                outdated,
                recycle,
            } => {
                credentials::restore(ctx, proxy, status.credentials_secret.as_deref()).await?;
                Ending::Running {
                    health: health_of(ctx, proxy, Some(&ip)),
                    ip,
                    recycle: Some(plan::recycle::Recycle {
                        step: recycle,
                        outdated,
                        spec_port: proxy.spec.port,
                        asked: replace_pending(proxy).map(str::to_string),
                    }),
                }
            }
            Step::Failed { class, message } => {
                let err = get_error(class, &provider_name, &id, message);
                return fail(ctx, proxy, err, status, now);
            }
            Step::CreateFailed { class, message } => {
                let err = ProviderError::new(class, Op::Create, &provider_name, &id, message);
                return fail(ctx, proxy, err, status, now);
            }
        };
        let provisioning = matches!(ending, Ending::Created { .. } | Ending::Provisioning);
        ctx.throttle.settle(&provider_name, &uid, provisioning, now);
        let end = plan::end(ending, status, now, generation);
        return Ok(action(ctx, plan::surge::poll(status, end)));
    }
    finish(ctx, Ending::StepLimit, status, ctx.clock.now(), generation)
}
