//! Whether one Managed Proxy wants a new instance: it stayed unhealthy for
//! `spec.recycle.unhealthyFor`, or its instance is older than
//! `spec.recycle.maxAge` (a new instance, so a new egress IP). Both are off
//! by default. Whether it may start now is the budget's and the breaker's
//! call ([`super::budget`], [`super::breaker`]).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::RecycleSpec;

/// Default time a drain may take before the instance is replaced anyway.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The shortest `unhealthyFor`: a shorter one counts as this. A probe
/// needs a few failures in a row to call a proxy unhealthy; a recycle
/// seconds after that would replace on a brief hiccup of the probe target
/// as readily as on a broken instance, and spend the provider's shared
/// create budget doing it.
pub const MIN_UNHEALTHY_FOR: Duration = Duration::from_secs(30);

/// The shortest startup timeout (a provider's `startupTimeout`, a Proxy's
/// `spec.recycle.startupTimeout`): shorter would replace instances that
/// are merely slow to boot.
pub const MIN_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a Proxy is recycled; the API spelling is the status reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RecycleReason {
    /// It stayed unhealthy for `unhealthyFor`.
    Unhealthy,
    /// A crawler (the lease API) or a user (`crawl.example.com/replace`)
    /// asked for a new instance.
    Requested,
    /// Its instance runs with an older spec or cloud-init.
    SpecChanged,
    /// Its instance is older than `maxAge`.
    MaxAge,
}

impl RecycleReason {
    /// The reason on the Proxy's `Recycling` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            RecycleReason::Unhealthy => "RecycleUnhealthy",
            RecycleReason::Requested => "RecycleRequested",
            RecycleReason::SpecChanged => "RecycleSpecChanged",
            RecycleReason::MaxAge => "RecycleMaxAge",
        }
    }
}

/// `spec.recycle` with the durations parsed and defaults applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecyclePolicy {
    /// Replace after this long unhealthy; `None` is off.
    pub unhealthy_for: Option<Duration>,
    /// Replace an instance older than this; `None` is off.
    pub max_age: Option<Duration>,
    /// How long a drain waits for leases before replacing anyway.
    pub drain_timeout: Duration,
    /// How long a new instance may take to run with an address; `None`:
    /// the provider's `startupTimeout`.
    pub startup_timeout: Option<Duration>,
}

/// A `spec.recycle` duration that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("spec.recycle.{key} {value:?} is not a duration such as 30m, 12h or 7d")]
pub struct DurationError {
    /// The key: unhealthyFor, maxAge or drainTimeout.
    pub key: &'static str,
    /// The text given.
    pub value: String,
}

/// Parses a duration such as `90s`, `30m`, `12h`, `7d` or `1h30m`; zero
/// is refused (it would recycle on every pass).
pub fn parse_duration(key: &'static str, value: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        key,
        value: value.to_string(),
    };
    match humantime::parse_duration(value.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(err()),
    }
}

impl RecyclePolicy {
    /// The policy of `spec.recycle` (absent: everything off).
    pub fn of(spec: Option<&RecycleSpec>) -> Result<Self, DurationError> {
        let Some(spec) = spec else {
            return Ok(RecyclePolicy {
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                ..RecyclePolicy::default()
            });
        };
        let opt =
            |key, v: &Option<String>| v.as_deref().map(|v| parse_duration(key, v)).transpose();
        Ok(RecyclePolicy {
            unhealthy_for: opt("unhealthyFor", &spec.unhealthy_for)?
                .map(|d| d.max(MIN_UNHEALTHY_FOR)),
            max_age: opt("maxAge", &spec.max_age)?,
            drain_timeout: opt("drainTimeout", &spec.drain_timeout)?
                .unwrap_or(DEFAULT_DRAIN_TIMEOUT),
            startup_timeout: opt("startupTimeout", &spec.startup_timeout)?
                .map(|d| d.max(MIN_STARTUP_TIMEOUT)),
        })
    }
}

/// What one Proxy's recycle decision looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecycleInput {
    /// The Proxy's policy.
    pub policy: RecyclePolicy,
    /// When its current instance was created (the provider's time, else
    /// when the operator recorded it); `None` when unknown.
    pub instance_created_at: Option<DateTime<Utc>>,
    /// Since when it has been unhealthy (its Healthy=False transition);
    /// `None` while healthy or not yet probed.
    pub unhealthy_since: Option<DateTime<Utc>>,
    /// Now.
    pub now: DateTime<Utc>,
}

fn at_least(since: Option<DateTime<Utc>>, now: DateTime<Utc>, d: Option<Duration>) -> bool {
    match (since, d) {
        (Some(since), Some(d)) => now
            .signed_duration_since(since)
            .to_std()
            .is_ok_and(|elapsed| elapsed >= d),
        _ => false,
    }
}

/// The value of `crawl.example.com/replace` on the Managed Proxy `p`
/// when it asks for a replacement not acted on yet (not the one in
/// `status.replaceHandled`). An External Proxy has no instance of ours to
/// replace: the annotation means nothing there.
pub fn replace_pending(p: &crate::api::Proxy) -> Option<&str> {
    if p.spec.mode != crate::api::ProxyMode::Managed {
        return None;
    }
    let asked = p
        .metadata
        .annotations
        .as_ref()?
        .get(crate::api::constants::REPLACE_ANNOTATION)?;
    let handled = p.status.as_ref().and_then(|s| s.replace_handled.as_deref());
    (!asked.trim().is_empty() && handled != Some(asked.as_str())).then_some(asked.as_str())
}

/// Whether the Proxy wants recycling, and why. Unhealthy wins over age:
/// it is the more urgent of the two.
pub fn wants_recycle(input: &RecycleInput) -> Option<RecycleReason> {
    let p = &input.policy;
    if at_least(input.unhealthy_since, input.now, p.unhealthy_for) {
        Some(RecycleReason::Unhealthy)
    } else if at_least(input.instance_created_at, input.now, p.max_age) {
        Some(RecycleReason::MaxAge)
    } else {
        None
    }
}

#[cfg(test)]
#[path = "recycle_tests.rs"]
mod tests;
