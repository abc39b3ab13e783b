//! The disruption budget of a provider (`maxUnavailable` in its providers
//! entry, a count or a percent, default 1): at most that many of the
//! provider's proxies are being recycled at once, and recycling for age
//! waits while fewer than the budget's Ready proxies are left.
//!
//! Recycling an unhealthy proxy does not lower availability (it serves
//! nothing already), so it is bounded by the number being recycled alone;
//! recycling a healthy one for age is bounded by everything unavailable
//! (recycling, draining, or simply not Ready).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};

use super::RecycleReason;

/// `maxUnavailable`: a count, or a percent of the provider's Managed
/// Proxies (rounded up, as a PodDisruptionBudget does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// At most this many.
    Count(u32),
    /// At most this percent (0 to 100).
    Percent(u32),
}

/// The default budget: one at a time.
pub const DEFAULT_MAX_UNAVAILABLE: MaxUnavailable = MaxUnavailable::Count(1);

impl Default for MaxUnavailable {
    fn default() -> Self {
        DEFAULT_MAX_UNAVAILABLE
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnavailable::Count(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl MaxUnavailable {
    /// Parses `3` or `"25%"`; the message names what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let bad = || format!("{text:?} must be a count such as 2 or a percent such as 25%");
        if let Some(p) = t.strip_suffix('%') {
            let p: u32 = p.trim().parse().map_err(|_| bad())?;
            if p > 100 {
                return Err(format!("{text:?} is more than 100%"));
            }
            Ok(MaxUnavailable::Percent(p))
        } else {
            t.parse().map(MaxUnavailable::Count).map_err(|_| bad())
        }
    }

    /// How many of a fleet of `size` may be unavailable.
    pub fn allowance(self, size: usize) -> usize {
        match self {
            MaxUnavailable::Count(n) => n as usize,
            MaxUnavailable::Percent(p) => (size * p as usize).div_ceil(100),
        }
    }
}

/// The provider's Managed Proxies, counted now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FleetCounts {
    /// Every Managed Proxy of the provider.
    pub size: usize,
    /// Of those, Ready and not draining.
    pub ready: usize,
    /// Of those, being recycled (draining, or replaced after a drain).
    pub recycling: usize,
}

/// A Proxy that wants recycling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its namespace/name.
    pub key: String,
    /// Why.
    pub reason: RecycleReason,
    /// Its instance's creation time (oldest go first).
    pub created_at: Option<DateTime<Utc>>,
    /// Ready and not draining: replacing it takes a proxy out of the pool.
    pub serving: bool,
}

/// Which candidates may start recycling now, in order: unhealthy first,
/// then oldest first, then by name. Nothing starts while `breaker_open`.
pub fn admit(
    budget: MaxUnavailable,
    counts: FleetCounts,
    breaker_open: bool,
    candidates: Vec<Candidate>,
) -> Vec<String> {
    admit_fair(budget, counts, breaker_open, candidates, &BTreeMap::new())
}

/// The namespace of a `namespace/name` key.
fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

/// Orders `candidates` as [`admit_fair`] admits them: by reason, then by
/// namespaces taking turns (a namespace's n-th candidate, counting the
/// recycles it already has running in `busy`, comes after every other
/// namespace's (n-1)-th), then oldest first, then by name.
fn fair_order(candidates: &mut Vec<Candidate>, busy: &BTreeMap<String, usize>) {
    candidates.sort_by(|a, b| {
        (a.reason, a.created_at.is_none(), a.created_at, &a.key).cmp(&(
            b.reason,
            b.created_at.is_none(),
            b.created_at,
            &b.key,
        ))
    });
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ranked: Vec<(RecycleReason, usize, usize)> = Vec::with_capacity(candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        let ns = namespace_of(&c.key);
        let n = seen
            .entry(ns)
            .or_insert_with(|| busy.get(ns).copied().unwrap_or(0));
        ranked.push((c.reason, *n, i));
        *n += 1;
    }
    ranked.sort();
    let mut taken: Vec<Option<Candidate>> =
        std::mem::take(candidates).into_iter().map(Some).collect();
    *candidates = ranked
        .into_iter()
        .filter_map(|(_, _, i)| taken.get_mut(i).and_then(Option::take))
        .collect();
}

/// [`admit`], with the budget shared fairly across namespaces: `busy`
/// counts the recycles each namespace has running, so one tenant's
/// Proxies (one that fails for ever among them) never hold every slot
/// while another's wait.
pub fn admit_fair(
    budget: MaxUnavailable,
    counts: FleetCounts,
    breaker_open: bool,
    mut candidates: Vec<Candidate>,
    busy: &BTreeMap<String, usize>,
) -> Vec<String> {
    if breaker_open {
        return Vec::new();
    }
    let allowance = budget.allowance(counts.size);
    fair_order(&mut candidates, busy);
    let mut recycling = counts.recycling;
    let mut unavailable = counts
        .size
        .saturating_sub(counts.ready)
        .max(counts.recycling);
    let mut out = Vec::new();
    for c in candidates {
        // A Ready proxy leaves the pool; an unhealthy one had already. A
        // changed spec rolls a serving proxy like an old one, and one that
        // serves nothing (its new spec may be the fix) like an unhealthy one.
        let leaves_pool = match c.reason {
            RecycleReason::Unhealthy => false,
            RecycleReason::SpecChanged | RecycleReason::Requested => c.serving,
            RecycleReason::MaxAge => true,
        };
        let fits = recycling < allowance && (!leaves_pool || unavailable < allowance);
        if !fits {
            continue;
        }
        recycling += 1;
        if leaves_pool {
            unavailable += 1;
        }
        out.push(c.key);
    }
    out
}

/// Which of `candidates` may start a surge replacement now: at most
/// `free` (the provider's `maxSurge` less the surges running), in the
/// order [`admit_fair`] uses; none while `breaker_open`.
pub fn admit_surge(
    free: usize,
    breaker_open: bool,
    mut candidates: Vec<Candidate>,
    busy: &BTreeMap<String, usize>,
) -> Vec<String> {
    if breaker_open {
        return Vec::new();
    }
    fair_order(&mut candidates, busy);
    candidates.into_iter().take(free).map(|c| c.key).collect()
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
