//! How a reconcile pass ends. Each ending carries its policy: what it
//! writes into the status, and whether the Proxy waits for a change
//! (latched, or nothing to do), comes back after a set time, or goes back
//! to the controller's per-object backoff.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::managed::ReplaceCause;
use super::status::{self, Health};
use crate::api::condition::{self, ConditionStatus};
use crate::api::proxy::conditions::REASON_PROVIDER_UNAVAILABLE;
use crate::api::proxy::conditions::{PROVISIONED, REASON_PERMANENT_ERROR};
use crate::api::proxy::conditions::{REASON_CREDENTIALS_UNAVAILABLE, REASON_EXTERNAL_NOT_ALLOWED};
use crate::api::ProxyStatus;
use crate::provider::{ErrorClass, Op};

/// Re-poll while an instance is Provisioning.
pub const PROVISIONING_POLL: Duration = Duration::from_secs(10);
/// Re-poll while an instance is being deleted.
pub const DELETION_POLL: Duration = Duration::from_secs(10);
/// How long a Running instance waits before its next pass, which asks the
/// provider's observation first and makes a `get` only when it cannot
/// answer (catches instances that stop behind the operator's back).
pub const RUNNING_RESYNC: Duration = Duration::from_secs(60);
/// A quick follow-up pass.
pub const REQUEUE_NOW: Duration = Duration::from_secs(1);
/// Retry after a quota or rate-limit error.
pub const QUOTA_RETRY: Duration = Duration::from_secs(300);
/// The first retry after the provider refused the operator's credentials;
/// later ones wait as long as the refusal has lasted, up to
/// [`UNAVAILABLE_RETRY_MAX`].
pub const UNAVAILABLE_RETRY_MIN: Duration = Duration::from_secs(60);
/// The longest wait between retries while the provider stays unavailable.
pub const UNAVAILABLE_RETRY_MAX: Duration = Duration::from_secs(600);
/// Retry while the cloud-init Secret cannot be read (its watch usually
/// triggers sooner).
pub const CLOUD_INIT_RETRY: Duration = Duration::from_secs(30);
/// Until an External Proxy's credentials Secret is looked for again.
pub const CREDENTIALS_RETRY: Duration = Duration::from_secs(30);
/// A delete is not resubmitted within this long of the last one while the
/// instance still shows (providers may take minutes to finish a delete).
pub const DELETE_RESUBMIT_AFTER: Duration = Duration::from_secs(60);
/// While the instance shows it is going (Stopped or Terminated after our
/// delete: the provider is carrying it out), the delete is resubmitted
/// only this long after the last one, in case it was lost.
pub const DELETE_RESUBMIT_GOING_AFTER: Duration = Duration::from_secs(15 * 60);

/// The message of a Managed Proxy without a usable port.
pub const PORT_REQUIRED: &str = "spec.port must be 1-65535 for a Managed Proxy";
/// The message of an External Proxy without an endpoint.
pub const ENDPOINT_REQUIRED: &str = "spec.endpoint is required when spec.mode is External";

/// How a pass ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Nothing to do until the Proxy (or what it references) changes.
    AwaitChange,
    /// Reconcile again after this long.
    RequeueAfter(Duration),
    /// Reconcile again no sooner than this (a held create's next try):
    /// its spread goes after it, never before.
    NotBefore(Duration),
}

/// A failure that goes back to the controller as an error, retried with
/// per-object [`backoff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff;

/// Where a pass stopped: what the shell did or found last.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending<'a> {
    /// The finalizer was added; the next pass starts the work.
    FinalizerAdded,
    /// Permanently failed at this generation.
    Latched,
    /// `spec.provider` names no configured provider.
    ProviderNotConfigured {
        /// The name.
        provider: &'a str,
    },
    /// The cloud-init Secret or key cannot be read.
    CloudInitUnreadable {
        /// Why, in plain words.
        message: String,
    },
    /// A create was due but the spec has no usable port.
    NoPort,
    /// A create was submitted and returned this ID.
    Created {
        /// The provider's instance ID.
        id: String,
        /// The port it was created to serve on.
        port: u16,
    },
    /// The old instance was asked to go (`requested`), or is still going.
    Replacing {
        /// Why it goes.
        why: ReplaceCause,
        /// Whether a delete was submitted in this pass.
        requested: bool,
    },
    /// The instance is still being built.
    Provisioning,
    /// The instance runs at `ip`.
    Running {
        /// Its address.
        ip: String,
        /// What the health engine says.
        health: Health,
        /// What its recycle does now (`None`: not asked, as in tests of
        /// the running state alone).
        recycle: Option<super::recycle::Recycle>,
    },
    /// The instance is dead but the provider's circuit breaker is open.
    CircuitOpen,
    /// The create waits.
    Held {
        /// The provider's name, which the status names.
        provider: &'a str,
        /// Why, and until when.
        held: crate::controller::throttle::limiter::Held,
    },
    /// An External Proxy with this endpoint host (`None`: no endpoint).
    External {
        /// `spec.endpoint.host`.
        host: Option<&'a str>,
        /// What the health engine says.
        health: Health,
    },
    /// An External Proxy in a namespace `--external-proxy-namespaces` does
    /// not list.
    ExternalNotAllowed {
        /// The refusal, naming the field, the namespace and the flag.
        message: String,
    },
    /// An External Proxy whose `spec.auth.secretRef` holds no usable
    /// credentials.
    ExternalCredentialsUnavailable {
        /// What is wrong, naming the field and the Secret.
        message: String,
    },
    /// The deletion path has nothing to hold (no finalizer of ours).
    NotHeld,
    /// The finalizer was released.
    Released,
    /// The deletion path submitted a delete.
    CleanupRequested,
    /// The deletion path waits for a submitted delete.
    CleanupPending,
    /// The step bound of a pass was reached.
    StepLimit,
}

/// Writes what `ending` means into `status` and says when to come back.
pub fn end(
    ending: Ending<'_>,
    status: &mut ProxyStatus,
    now: DateTime<Utc>,
    generation: Option<i64>,
) -> End {
    match ending {
        Ending::FinalizerAdded | Ending::StepLimit => End::RequeueAfter(REQUEUE_NOW),
        Ending::Latched | Ending::NotHeld | Ending::Released => End::AwaitChange,
        Ending::ProviderNotConfigured { provider } => {
            status::mark_not_configured(status, provider, now);
            End::AwaitChange
        }
        Ending::CloudInitUnreadable { message } => {
            status::mark_cloud_init_error(status, &message, now, generation);
            End::RequeueAfter(CLOUD_INIT_RETRY)
        }
        Ending::NoPort => {
            status::mark_invalid(status, PORT_REQUIRED, now, generation);
            End::AwaitChange
        }
        Ending::Created { id, port } => {
            status.provider_id = Some(id);
            status.port = Some(i32::from(port));
            status.created_at = Some(now);
            status::mark_creating(status, now, generation);
            status::health_unknown(status, now);
            End::RequeueAfter(REQUEUE_NOW)
        }
        Ending::Replacing { why, requested } => {
            status::mark_replacing(status, why, requested, now, generation);
            // The pass that submits the delete turns the old verdict
            // Unknown; nothing is probed while the instance goes.
            if requested {
                status::health_unknown(status, now);
            }
            End::RequeueAfter(DELETION_POLL)
        }
        Ending::Provisioning => {
            // An instance created before the operator recorded creates
            // gets its whole startup timeout from here.
            status.created_at.get_or_insert(now);
            status::mark_creating(status, now, generation);
            status::health_unknown(status, now);
            End::RequeueAfter(PROVISIONING_POLL)
        }
        Ending::Running {
            ip,
            health,
            recycle,
        } => {
            status::mark_running(status, &ip, &health, now, generation);
            super::replace::settle_running(status, now);
            let end = End::RequeueAfter(RUNNING_RESYNC);
            match recycle {
                Some(r) => super::recycle::after_running(r, status, end, now),
                None => end,
            }
        }
        Ending::Held { provider, held } => {
            End::NotBefore(crate::controller::throttle::limiter::mark_held_create(
                status, provider, held, now, generation,
            ))
        }
        Ending::CircuitOpen => {
            super::recycle::mark_circuit_open(status, now, generation);
            status::health_unknown(status, now);
            End::RequeueAfter(super::recycle::CIRCUIT_RETRY)
        }
        Ending::External { host: None, .. } => {
            status::mark_invalid(status, ENDPOINT_REQUIRED, now, generation);
            End::AwaitChange
        }
        Ending::External {
            host: Some(host),
            health,
        } => {
            status::mark_external(status, host, &health, now);
            End::AwaitChange
        }
        Ending::ExternalNotAllowed { message } => {
            let refusal = (REASON_EXTERNAL_NOT_ALLOWED, message.as_str());
            status::mark_external_refused(status, refusal, now, generation);
            End::AwaitChange
        }
        // The Secret may appear or gain its label: looked for again.
        Ending::ExternalCredentialsUnavailable { message } => {
            let refusal = (REASON_CREDENTIALS_UNAVAILABLE, message.as_str());
            status::mark_external_refused(status, refusal, now, generation);
            End::RequeueAfter(CREDENTIALS_RETRY)
        }
        Ending::CleanupRequested => {
            status.delete_requested_at = Some(now);
            End::RequeueAfter(DELETION_POLL)
        }
        Ending::CleanupPending => End::RequeueAfter(DELETION_POLL),
    }
}

/// A failed provider call on the managed path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure<'a> {
    /// The call that failed.
    pub op: Op,
    /// Its class.
    pub class: ErrorClass,
    /// What went wrong, in plain words.
    pub message: &'a str,
}

/// What a failed provider call on the managed path comes to. Only a
/// Permanent create latches (`Provisioned=False/PermanentError` at this
/// generation, no requeue): that is a spec or placement the provider
/// refuses, and only an edit fixes it. A `get` or `delete` of an instance
/// that exists never latches: a Permanent one, like every Unavailable
/// call, is `ProviderUnavailable`, retried slowly ([`unavailable_retry`]),
/// and a serving Proxy keeps serving by its health. A quota or rate limit
/// is retried after [`QUOTA_RETRY`]; the rest go to backoff.
pub fn managed_failure(
    failure: &Failure<'_>,
    health: &Health,
    status: &mut ProxyStatus,
    now: DateTime<Utc>,
    generation: Option<i64>,
) -> Result<End, Backoff> {
    match failure.class {
        ErrorClass::Permanent if failure.op == Op::Create => {
            status::mark_permanent(status, failure.message, now, generation);
            Ok(End::AwaitChange)
        }
        ErrorClass::Permanent | ErrorClass::Unavailable => {
            let retry = unavailable_retry(status, now);
            status::mark_unavailable(status, failure.message, health, now, generation);
            Ok(End::RequeueAfter(retry))
        }
        ErrorClass::QuotaExceeded => {
            status::mark_quota(status, failure.message, now, generation);
            Ok(End::RequeueAfter(QUOTA_RETRY))
        }
        ErrorClass::NotFound | ErrorClass::Transient => Err(Backoff),
    }
}

/// How long to wait before asking an unavailable provider again: as long
/// as it has been unavailable (by the `ProviderUnavailable` condition's
/// transition time in `status`), between [`UNAVAILABLE_RETRY_MIN`] and
/// [`UNAVAILABLE_RETRY_MAX`]; so a blip is retried within a minute and a
/// long outage costs a call per Proxy every few minutes.
pub fn unavailable_retry(status: &ProxyStatus, now: DateTime<Utc>) -> Duration {
    let since = condition::find(&status.conditions, PROVISIONED)
        .filter(|c| c.reason == REASON_PROVIDER_UNAVAILABLE)
        .and_then(|c| {
            now.signed_duration_since(c.last_transition_time)
                .to_std()
                .ok()
        })
        .unwrap_or(Duration::ZERO);
    since.clamp(UNAVAILABLE_RETRY_MIN, UNAVAILABLE_RETRY_MAX)
}

/// What a failed provider call on the deletion path comes to: a quota or
/// rate limit, or a provider that refuses the operator's credentials, is
/// retried after [`QUOTA_RETRY`]; the rest go to backoff (the status is
/// left alone: the Proxy is going).
pub fn delete_failure(class: ErrorClass) -> Result<End, Backoff> {
    match class {
        ErrorClass::QuotaExceeded | ErrorClass::Unavailable => Ok(End::RequeueAfter(QUOTA_RETRY)),
        ErrorClass::NotFound | ErrorClass::Transient | ErrorClass::Permanent => Err(Backoff),
    }
}

/// Whether `Provisioned=False/PermanentError` was set at this generation.
pub fn is_latched(status: &ProxyStatus, generation: Option<i64>) -> bool {
    condition::find(&status.conditions, PROVISIONED).is_some_and(|c| {
        c.status == ConditionStatus::False
            && c.reason == REASON_PERMANENT_ERROR
            && c.observed_generation == generation
    })
}

/// The delay before retrying a Proxy after its `failures`-th failure in a
/// row: 5 ms doubling up to 1000 s (the controller-runtime defaults).
pub fn backoff(failures: u32) -> Duration {
    let ms = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(30));
    Duration::from_millis(ms.min(1_000_000))
}

#[cfg(test)]
#[path = "end_tests.rs"]
mod tests;
