//! The managed path: what to do next for a Proxy whose instance the
//! operator creates, watches and replaces.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::end::is_latched;
use super::surge::{next_side_step, SideInput, SideObs, SideStep};
use super::{delete_pending, replace, GetOutcome};
use crate::api::ProxyStatus;
use crate::controller::throttle::limiter::{CreateGate, Held};
use crate::fleet::RecycleStep;
use crate::provider::{ErrorClass, InstanceState};

/// What the managed path knows at a decision point.
#[derive(Clone, Debug)]
pub struct ManagedInput<'a> {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Whether our finalizer is on the object.
    pub has_finalizer: bool,
    /// The status as it stands in memory (after earlier steps of this pass).
    pub status: &'a ProxyStatus,
    /// Whether `spec.provider` names a configured provider.
    pub provider_configured: bool,
    /// The `spec-hash` annotation.
    pub recorded_hash: Option<&'a str>,
    /// The hash of the current spec; `None` until cloud-init is resolved.
    pub spec_hash: Option<&'a str>,
    /// The result of `get(providerID)` in this pass, once made.
    pub get: Option<&'a GetOutcome>,
    /// The clock.
    pub now: DateTime<Utc>,
    /// How long a new instance may take to run with an address.
    pub startup_timeout: Duration,
    /// `spec.port`.
    pub port: Option<i32>,
    /// The shared gates' answers, each asked only once the plan needs it.
    pub gates: Gates,
    /// What was observed of a surge replacement and a retiring instance.
    pub side: &'a SideObs,
}

/// The answers of the gates every Proxy of a provider shares. The plan
/// asks for one (an `Ask…` step) when it needs it; the shell asks the gate
/// and hands the answer back, so every ending comes out of the plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gates {
    /// The circuit breaker: may a dead instance (stopped, vanished, past
    /// its startup timeout) be replaced now?
    pub replace: Option<bool>,
    /// The fleet's recycle step for the running instance.
    pub recycle: Option<RecycleStep>,
    /// The create gate: the hold after a refused create, the provider's
    /// `maxInstances`, then its create limits (in that order, so a create
    /// any of them holds takes no token from the bucket).
    pub create: Option<CreateGate>,
}

/// The next step of the managed path.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Add the finalizer (object update) and end the pass.
    AddFinalizer,
    /// Permanently failed at this generation: no provider call, no requeue.
    Latched,
    /// The provider is not configured: report it and stop (re-evaluated on
    /// the next pass, e.g. after a restart with a new config).
    ProviderNotConfigured,
    /// Resolve cloud-init and compute the spec hash.
    ResolveCloudInit,
    /// Nothing recorded yet: record the hash if needed, then create an
    /// instance serving on `port`.
    Create {
        /// The port it serves on.
        port: u16,
    },
    /// A create is due but the spec has no usable port.
    NoPort,
    /// Ask the create gate whether the create may go now.
    AskCreate,
    /// The create waits: the instance was replaced repeatedly
    /// ([`super::replace`]), or the gate holds it.
    Held(Held),
    /// Record the current hash without replacing (adopted instance).
    RecordHash,
    /// Ask the provider for the instance.
    Get,
    /// Ask the provider to delete the instance, then poll again.
    Delete {
        /// Why: the spec changed, or the instance stopped.
        why: ReplaceCause,
    },
    /// The old instance is still going away; poll again later.
    WaitForDeletion {
        /// Why it is being deleted.
        why: ReplaceCause,
    },
    /// The old instance is gone: record the new hash, clear the ID and IP,
    /// then create.
    ClearAndCreate,
    /// The instance is still being built; poll again later.
    WaitProvisioning,
    /// The instance runs with this IP.
    Running {
        /// The address.
        ip: String,
        /// It runs an older spec or cloud-init: it serves until the
        /// provider's budget lets it be drained and replaced (the fleet's
        /// recycle, reason [`crate::fleet::RecycleReason::SpecChanged`]).
        outdated: bool,
        /// What the fleet says of its recycle.
        recycle: RecycleStep,
    },
    /// Ask the circuit breaker whether the dead instance may be replaced.
    AskReplace,
    /// The breaker is open: the dead instance is not replaced until it
    /// closes.
    CircuitOpen,
    /// Ask the fleet what the running instance's recycle does now.
    AskRecycle,
    /// The drain is over: delete the instance, then poll again.
    DeleteDrained {
        /// Why: its changed spec, or its recycle.
        why: ReplaceCause,
    },
    /// The get reported the instance's asynchronous create failed.
    CreateFailed {
        /// The class.
        class: ErrorClass,
        /// The message (names the field and value for Permanent).
        message: String,
    },
    /// A step of a surge replacement or of a retiring instance, taken
    /// before the current instance's own.
    Side(SideStep),
    /// The last call failed with this class.
    Failed {
        /// The class.
        class: ErrorClass,
        /// The message (names the field and value for Permanent).
        message: String,
    },
}

/// Why an instance is being replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplaceCause {
    /// Placement, cloud-init or port changed.
    SpecChanged,
    /// The instance is Stopped or Terminated.
    Stopped(InstanceState),
    /// `spec.recycle` asked for a new instance and the drain is over.
    Recycled,
    /// The instance was not running with an address this long after its
    /// create.
    StartupTimedOut {
        /// The startup timeout it missed.
        after: Duration,
    },
}

impl ReplaceCause {
    /// Why a drained instance is replaced: its spec changed (`outdated`),
    /// else `spec.recycle` chose it.
    pub fn of_drain(outdated: bool) -> Self {
        if outdated {
            ReplaceCause::SpecChanged
        } else {
            ReplaceCause::Recycled
        }
    }
}

/// The next step of the managed path.
pub fn next_managed_step(input: &ManagedInput<'_>) -> Step {
    gated(input, ungated(input))
}

/// `step` through the gates it needs: a dead instance is replaced only
/// while the breaker lets it (a changed spec goes either way: the new
/// spec may be the fix); a running instance serves, drains or goes as the
/// fleet's recycle says.
fn gated(input: &ManagedInput<'_>, step: Step) -> Step {
    let dead = matches!(
        step,
        Step::Delete {
            why: ReplaceCause::Stopped(_) | ReplaceCause::StartupTimedOut { .. }
        } | Step::ClearAndCreate
    );
    if dead && input.recorded_hash == input.spec_hash {
        return match input.gates.replace {
            None => Step::AskReplace,
            Some(true) => step,
            Some(false) => Step::CircuitOpen,
        };
    }
    let Step::Running { ip, outdated, .. } = step else {
        return step;
    };
    let why = ReplaceCause::of_drain(outdated);
    match input.gates.recycle {
        None => Step::AskRecycle,
        Some(RecycleStep::Replace(_))
            if !super::recently_requested(input.status.delete_requested_at, input.now) =>
        {
            Step::DeleteDrained { why }
        }
        Some(RecycleStep::Replace(_)) => Step::WaitForDeletion { why },
        Some(recycle) => Step::Running {
            ip,
            outdated,
            recycle,
        },
    }
}

/// The next step before the gates.
fn ungated(input: &ManagedInput<'_>) -> Step {
    if !input.has_finalizer {
        return Step::AddFinalizer;
    }
    if is_latched(input.status, input.generation) {
        return Step::Latched;
    }
    if !input.provider_configured {
        return Step::ProviderNotConfigured;
    }
    let Some(spec_hash) = input.spec_hash else {
        return Step::ResolveCloudInit;
    };
    if let Some(side) = next_side_step(&SideInput {
        status: input.status,
        spec_hash,
        port: create_port(input.port),
        startup_timeout: input.startup_timeout,
        obs: input.side,
        now: input.now,
    }) {
        return Step::Side(side);
    }
    let provider_id = input.status.provider_id.as_deref().unwrap_or("");
    if provider_id.is_empty() {
        return create(input);
    }
    let hash_matches = input.recorded_hash == Some(spec_hash);
    let Some(get) = input.get else {
        if input.recorded_hash.is_none() {
            return Step::RecordHash;
        }
        return Step::Get;
    };
    match get {
        GetOutcome::Failed(class, message) => Step::Failed {
            class: *class,
            message: message.clone(),
        },
        GetOutcome::CreateFailed(class, message) => Step::CreateFailed {
            class: *class,
            message: message.clone(),
        },
        GetOutcome::NotFound => Step::ClearAndCreate,
        // A serving instance rolls through the budget, drained first; one
        // that serves nothing, or whose delete was just asked, goes now.
        GetOutcome::Found(inst)
            if !hash_matches
                && inst.state == InstanceState::Running
                && !inst.ip.is_empty()
                && !delete_pending(input.status.delete_requested_at, inst.state, input.now) =>
        {
            Step::Running {
                ip: inst.ip.clone(),
                outdated: true,
                recycle: RecycleStep::Serve,
            }
        }
        GetOutcome::Found(inst) if !hash_matches => {
            delete_or_wait(input, inst.state, ReplaceCause::SpecChanged)
        }
        GetOutcome::Found(inst) => match inst.state {
            InstanceState::Running if !inst.ip.is_empty() => Step::Running {
                ip: inst.ip.clone(),
                outdated: false,
                recycle: RecycleStep::Serve,
            },
            // Running without an address (a VM whose NIC never came up,
            // or a provider breaking its contract) is still starting.
            InstanceState::Provisioning | InstanceState::Running => starting(input, inst.state),
            s @ (InstanceState::Stopped | InstanceState::Terminated) => {
                delete_or_wait(input, s, ReplaceCause::Stopped(s))
            }
        },
    }
}

/// No instance: create one, unless the replace back-off, a port missing
/// or the create gate holds it.
fn create(input: &ManagedInput<'_>) -> Step {
    if let Some(until) = replace::backoff_until(input.status).filter(|u| *u > input.now) {
        return Step::Held(Held::ReplaceBackoff { until });
    }
    let Some(port) = create_port(input.port) else {
        return Step::NoPort;
    };
    match input.gates.create {
        None => Step::AskCreate,
        Some(CreateGate::Go) => Step::Create { port },
        Some(CreateGate::Held(held)) => Step::Held(held),
    }
}

/// An instance not yet running with an address: wait for it, or replace
/// it once its startup timeout has passed since its create.
fn starting(input: &ManagedInput<'_>, state: InstanceState) -> Step {
    let timeout = TimeDelta::from_std(input.startup_timeout).unwrap_or(TimeDelta::MAX);
    match input.status.created_at {
        Some(created) if input.now.signed_duration_since(created) >= timeout => {
            let why = ReplaceCause::StartupTimedOut {
                after: input.startup_timeout,
            };
            delete_or_wait(input, state, why)
        }
        _ => Step::WaitProvisioning,
    }
}

fn delete_or_wait(input: &ManagedInput<'_>, state: InstanceState, why: ReplaceCause) -> Step {
    if delete_pending(input.status.delete_requested_at, state, input.now) {
        Step::WaitForDeletion { why }
    } else {
        Step::Delete { why }
    }
}

/// The port a create asks for: `spec.port` when it is 1-65535; `None`
/// when validation was bypassed and there is nothing to create.
pub fn create_port(port: Option<i32>) -> Option<u16> {
    port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0)
}

#[cfg(test)]
#[path = "managed_tests.rs"]
mod tests;
