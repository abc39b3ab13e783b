//! Every reconcile decision, as pure functions of (Proxy, what was
//! observed, now). The shell in `reconcile.rs` gathers observations, asks
//! for the next step, performs it, and asks again; nothing here does I/O.
//!
//! - [`path`]: which path a Proxy takes (managed, External, deletion).
//! - [`managed`]: the next step of the managed path.
//! - [`delete`]: the next step of the deletion path.
//! - [`end`]: how a pass ends (what goes into the status, and when to
//!   come back), including what each error class comes to.
//! - [`phase`]: the one function that derives a Proxy's phase, and the
//!   Ready decision.
//! - [`status`]: the status builders the ends use.
//! - [`summary`]: the `Ready` condition and observed generation tools read.
//! - [`events`]: which Kubernetes Events a pass records (transitions only).
//! - [`jitter`]: the spread taken off every requeue delay.
//! - [`replace`]: the backoff between re-creates of an instance that
//!   keeps dying, kept in the status.
//! - [`throttle`]: whether a create may go now (the provider's create
//!   limits).
//! - [`surge`]: a surge replacement (created and probed before the old
//!   instance goes) and the retiring instance it leaves.
//! - [`written`]: whether a pass starts from the status it read or from
//!   the one the last pass wrote (read your own writes).

pub mod delete;
pub mod end;
pub mod events;
pub mod hold;
pub mod jitter;
pub mod managed;
pub mod phase;
pub mod recycle;
pub mod replace;
pub mod status;
pub mod summary;
pub mod surge;
pub mod written;

use chrono::{DateTime, Utc};

use crate::api::condition::{self, ConditionStatus};
use crate::api::proxy::conditions::PROVISIONED;
use crate::api::{ProxyMode, ProxyStatus};
use crate::provider::error::plain_message;
use crate::provider::{ErrorClass, Instance, InstanceState, Observation, Op, ProviderError};

pub use delete::{next_delete_step, DeleteInput, DeleteStep, ReleaseReason};
pub use end::{
    backoff, delete_failure, end, is_latched, managed_failure, unavailable_retry, Backoff, End,
    Ending, Failure, CLOUD_INIT_RETRY, DELETE_RESUBMIT_AFTER, DELETE_RESUBMIT_GOING_AFTER,
    DELETION_POLL, PROVISIONING_POLL, QUOTA_RETRY, REQUEUE_NOW, RUNNING_RESYNC,
    UNAVAILABLE_RETRY_MAX, UNAVAILABLE_RETRY_MIN,
};
pub use jitter::{jitter, jittered, Fixed, Random, SystemRandom};
pub use managed::{create_port, next_managed_step, Gates, ManagedInput, ReplaceCause, Step};
pub use phase::{phase, ready, Stage};
pub use status::{Health, REASON_AWAITING_PROBE, REASON_PROBE_FAILED, REASON_PROBE_SUCCEEDED};
pub use summary::summarize;

/// The outcome of `Provider::get`, reduced to what the decisions need.
#[derive(Clone, Debug, PartialEq)]
pub enum GetOutcome {
    /// The instance exists.
    Found(Instance),
    /// The instance is gone.
    NotFound,
    /// The call failed with this class and message.
    Failed(ErrorClass, String),
    /// The get reported that the instance's asynchronous create failed
    /// (a provider whose create returns once submitted), with this class
    /// and message: a create's failure, which may latch, where a failing
    /// get never does.
    CreateFailed(ErrorClass, String),
}

impl GetOutcome {
    /// What the provider's observation answers without a `get`, given the
    /// status the pass started from: a watch's instance always; a
    /// listing's only when it started after the instance was last seen to
    /// turn Running (`Provisioned=True`), since an older listing may show
    /// the incarnation a replacement deleted, under the same ID, and after
    /// any delete this Proxy requested; nothing otherwise (then `get` is
    /// called, and only it may say NotFound).
    pub fn observed(o: Observation, status: &ProxyStatus) -> Option<Self> {
        match o {
            Observation::Current(i) => Some(GetOutcome::Found(i)),
            Observation::Listed {
                instance,
                listed_at,
            } => condition::find(&status.conditions, PROVISIONED)
                .filter(|c| c.status == ConditionStatus::True)
                .filter(|c| c.last_transition_time < listed_at)
                .filter(|_| status.delete_requested_at.is_none_or(|d| d < listed_at))
                .map(|_| GetOutcome::Found(instance)),
            Observation::Unknown => None,
        }
    }

    /// What a `get` came to: NotFound is an answer, not a failure.
    pub fn of(res: Result<Instance, ProviderError>) -> Self {
        match res {
            Ok(i) => GetOutcome::Found(i),
            Err(e) if e.class() == ErrorClass::NotFound => GetOutcome::NotFound,
            Err(e) if e.op() == Op::Create => {
                GetOutcome::CreateFailed(e.class(), plain_message(&e))
            }
            Err(e) => GetOutcome::Failed(e.class(), plain_message(&e)),
        }
    }
}

/// Which path a reconcile takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The Proxy is being deleted: clean up, then release the finalizer.
    Delete,
    /// An External Proxy: no instance, only its endpoint and health.
    External,
    /// A Managed Proxy: its instance is created, watched and replaced.
    Managed,
}

/// The path of a Proxy: deletion wins over the mode.
pub fn path(deleting: bool, mode: ProxyMode) -> Path {
    match (deleting, mode) {
        (true, _) => Path::Delete,
        (false, ProxyMode::External) => Path::External,
        (false, ProxyMode::Managed) => Path::Managed,
    }
}

/// Whether a delete requested at `at` is still to be waited for at `now`
/// rather than resubmitted: within [`DELETE_RESUBMIT_AFTER`] of the
/// request; and while the instance, in `state`, shows it is going (Stopped
/// or Terminated: the provider is carrying the delete out, which may take
/// minutes), within [`DELETE_RESUBMIT_GOING_AFTER`]. So a slow delete is
/// asked for once, and one that was lost is asked for again.
pub(crate) fn delete_pending(
    at: Option<DateTime<Utc>>,
    state: InstanceState,
    now: DateTime<Utc>,
) -> bool {
    let wait = match state {
        InstanceState::Stopped | InstanceState::Terminated => DELETE_RESUBMIT_GOING_AFTER,
        InstanceState::Provisioning | InstanceState::Running => DELETE_RESUBMIT_AFTER,
    };
    at.is_some_and(|t| {
        now.signed_duration_since(t)
            .to_std()
            .map(|age| age < wait)
            // A request time in the future (clock skew) counts as recent.
            .unwrap_or(true)
    })
}

/// [`delete_pending`] for an instance that still runs (a recycle's).
pub(crate) fn recently_requested(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    delete_pending(at, InstanceState::Running, now)
}

#[cfg(test)]
mod tests;
