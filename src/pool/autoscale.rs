//! A pool's size from its crawlers' demand (`spec.autoscale`): pure, and
//! tested by tables (`autoscale_tests.rs`). The controller feeds it what a
//! pass saw and writes the size it answers (docs/pools.md#autoscaling).
//!
//! - **Up** at once, when more than the target share of the Ready Proxies
//!   hold a lease (to the size that would bring it under), or when
//!   acquires naming the pool were refused for want of a proxy (to twice
//!   the Ready count: the supply in place is taken and more is asked
//!   for). A step adds at most the provider's create burst, and is sized
//!   from the Proxies that are Ready, so Proxies still coming up are not
//!   asked for again.
//! - **Down** only after the stabilization window, to the largest size
//!   wanted within it (as a HorizontalPodAutoscaler does), never below
//!   `minReplicas`.
//! - **To zero** after `scaleToZeroAfter` without a lease or an acquire
//!   naming the pool while a Proxy of it was Ready; the next acquire
//!   brings it back to `minReplicas` (at least 1).

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::api::Autoscale;
use crate::lease::demand::Asked;

/// `minReplicas` when unset.
pub const DEFAULT_MIN: i32 = 1;
/// `targetUtilization` when unset, in percent.
pub const DEFAULT_TARGET: i32 = 80;
/// `scaleDownStabilization` when unset.
pub const DEFAULT_STABILIZATION: Duration = Duration::from_secs(300);
/// The longest `scaleDownStabilization` and `scaleToZeroAfter` accepted.
pub const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// `spec.autoscale`, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The fewest Proxies while in use.
    pub min: i32,
    /// The most Proxies.
    pub max: i32,
    /// The leased share of Ready Proxies aimed at, in percent.
    pub target: i32,
    /// How long demand stays low before the pool shrinks.
    pub stabilization: Duration,
    /// Idle this long: zero.
    pub to_zero_after: Option<Duration>,
}

fn window(
    key: &str,
    value: Option<&str>,
    default: Option<Duration>,
) -> Result<Option<Duration>, String> {
    let Some(v) = value else {
        return Ok(default);
    };
    match humantime::parse_duration(v.trim()) {
        Ok(d) if d <= MAX_WINDOW => Ok(Some(d)),
        Ok(_) => Err(format!("spec.autoscale.{key} {v:?} is longer than 24h")),
        Err(_) => Err(format!(
            "spec.autoscale.{key} {v:?} is not a duration such as 30s, 5m or 1h"
        )),
    }
}

impl Policy {
    /// The policy of `spec.autoscale`; the error names the field and the
    /// value (the API server's validation refuses most of these first).
    pub fn of(a: &Autoscale) -> Result<Policy, String> {
        let min = a.min_replicas.unwrap_or(DEFAULT_MIN);
        if !(0..=crate::api::pool::MAX_REPLICAS).contains(&min) {
            return Err(format!(
                "spec.autoscale.minReplicas {min} is not within 0..=1000"
            ));
        }
        if !(1..=crate::api::pool::MAX_REPLICAS).contains(&a.max_replicas) {
            return Err(format!(
                "spec.autoscale.maxReplicas {} is not within 1..=1000",
                a.max_replicas
            ));
        }
        if min > a.max_replicas {
            return Err(format!(
                "spec.autoscale.minReplicas {min} exceeds maxReplicas {}",
                a.max_replicas
            ));
        }
        let target = a.target_utilization.unwrap_or(DEFAULT_TARGET);
        if !(1..=100).contains(&target) {
            return Err(format!(
                "spec.autoscale.targetUtilization {target} is not within 1..=100"
            ));
        }
        let stabilization = window(
            "scaleDownStabilization",
            a.scale_down_stabilization.as_deref(),
            Some(DEFAULT_STABILIZATION),
        )?
        .unwrap_or(DEFAULT_STABILIZATION);
        let to_zero_after = window("scaleToZeroAfter", a.scale_to_zero_after.as_deref(), None)?;
        Ok(Policy {
            min,
            max: a.max_replicas,
            target,
            stabilization,
            to_zero_after,
        })
    }
}

/// What one pass of the controller saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// When.
    pub now: DateTime<Utc>,
    /// `spec.replicas` now.
    pub replicas: i32,
    /// Kept Proxies that are Ready.
    pub ready: i32,
    /// Kept Proxies holding a lease.
    pub leased: i32,
    /// The lease API's counts for the pool (they only grow).
    pub asked: Asked,
    /// The most Proxies one step adds (the provider's create burst).
    pub max_step: i32,
}

/// What the autoscaler remembers of a pool between passes (in memory: a
/// new leader starts afresh, so it shrinks nothing before a whole window
/// has passed under it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// The sizes wanted within the stabilization window, oldest first.
    wanted: VecDeque<(DateTime<Utc>, i32)>,
    /// The first pass.
    since: Option<DateTime<Utc>>,
    /// The last pass that saw a lease or an acquire naming the pool.
    active: Option<DateTime<Utc>>,
    /// The counts at the last pass.
    counted: Asked,
}

/// A change of `spec.replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The new size.
    pub replicas: i32,
    /// CamelCase, as `status.lastScale.reason` shows it.
    pub reason: &'static str,
    /// The figures behind it, in plain words.
    pub message: String,
}

fn decision(replicas: i32, reason: &'static str, message: String) -> Option<Decision> {
    Some(Decision {
        replicas,
        reason,
        message,
    })
}

fn words(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn since(now: DateTime<Utc>, then: DateTime<Utc>) -> Duration {
    (now - then).to_std().unwrap_or(Duration::ZERO)
}

/// The size `s` asks for under `p`, if it differs from `s.replicas`;
/// `h` carries what the next pass needs.
pub fn decide(p: &Policy, s: &Seen, h: &mut History) -> Option<Decision> {
    let now = s.now;
    // The counts restart when the registration does (a new leader).
    let asked = s.asked.asked.saturating_sub(h.counted.asked);
    let refused = s.asked.refused.saturating_sub(h.counted.refused);
    h.counted = s.asked;
    let first = *h.since.get_or_insert(now);
    // A pool with no Ready Proxy (coming back from zero, or failing) is
    // not idle: nobody could have used it.
    if s.leased > 0 || asked > 0 || s.ready == 0 || h.active.is_none() {
        h.active = Some(now);
    }
    let active = h.active.unwrap_or(now);

    if s.replicas == 0 {
        let back = p.min.max(1).min(p.max);
        if asked > 0 {
            h.wanted.clear();
            return decision(
                back,
                "Wake",
                format!("{asked} acquires named the pool while it was at zero"),
            );
        }
        if p.to_zero_after.is_none() && p.min > 0 {
            return decision(p.min, "Bounds", format!("minReplicas is {}", p.min));
        }
        return None;
    }
    if let Some(z) = p.to_zero_after.filter(|z| since(now, active) >= *z) {
        h.wanted.clear();
        return decision(
            0,
            "Idle",
            format!("no lease and no acquire naming the pool for {}", words(z)),
        );
    }
    if s.replicas > p.max {
        return decision(p.max, "Bounds", format!("maxReplicas is {}", p.max));
    }
    if s.replicas < p.min {
        return decision(p.min, "Bounds", format!("minReplicas is {}", p.min));
    }

    // Rounded up: 3 leased at 80% want 4, not 3.
    let target = i64::from(p.target.max(1));
    let by_use = (i64::from(s.leased.max(0)) * 100 + target - 1) / target;
    let by_use = i32::try_from(by_use).unwrap_or(i32::MAX);
    let load = format!(
        "{} of {} Ready Proxies leased (target {}%)",
        s.leased, s.ready, p.target
    );
    let (mut want, mut reason, mut message) = (by_use, "Demand", load.clone());
    let doubled = s.ready.saturating_add(s.ready.max(1));
    if refused > 0 && doubled >= want {
        (want, reason) = (doubled, "Refusals");
        message =
            format!("{refused} acquires naming the pool were refused for want of a proxy; {load}");
    }
    let want = want.clamp(p.min, p.max);
    let horizon = TimeDelta::from_std(p.stabilization).unwrap_or(TimeDelta::MAX);
    h.wanted.push_back((now, want));
    while h.wanted.front().is_some_and(|(t, _)| *t < now - horizon) {
        h.wanted.pop_front();
    }

    if want > s.replicas {
        let to = want.min(s.replicas.saturating_add(s.max_step.max(1)));
        return decision(to, reason, message);
    }
    if want < s.replicas && since(now, first) >= p.stabilization {
        let floor = h.wanted.iter().map(|(_, w)| *w).max().unwrap_or(want);
        if floor < s.replicas {
            return decision(
                floor,
                "LowDemand",
                format!(
                    "at most {floor} Proxies were wanted over the last {}; {load}",
                    words(p.stabilization)
                ),
            );
        }
    }
    None
}

#[cfg(test)]
#[path = "autoscale_tests.rs"]
mod tests;
