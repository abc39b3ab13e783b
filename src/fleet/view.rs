//! The per-provider fleet view the controller consults: built from the
//! Proxy cache (phase, health condition, drain mark), it feeds each
//! provider's [`Breaker`] and decides which Proxies may start recycling
//! under the provider's budget. Pure: the caller passes the Proxies and the
//! time; the shell holds it behind a lock.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use super::{
    admit_fair, admit_surge, next_drain_step, replace_pending, wants_recycle, Breaker,
    BreakerPolicy, Candidate, DrainDone, DrainInput, DrainStep, FleetCounts, MaxUnavailable,
    Member, RecycleInput, RecyclePolicy, RecycleReason, Transition,
};
use crate::api::condition::find;
use crate::api::proxy::conditions::{HEALTHY, PROVISIONED, UP_TO_DATE};
use crate::api::{ConditionStatus, Proxy, ProxyMode, ProxyPhase};

/// What the view takes from one Managed Proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// namespace/name.
    pub key: String,
    /// `spec.provider`.
    pub provider: String,
    /// Phase Ready.
    pub ready: bool,
    /// This process is replacing its instance (stopped or gone) while the
    /// cache may still show it Ready (see [`mark_replacing`]).
    pub replacing: bool,
    /// `status.drainingSince` is set: a recycle runs.
    pub draining: bool,
    /// `status.surge` is set: its replacement is being created while it
    /// serves (the provider's `maxSurge`).
    pub surging: bool,
    /// Why it wants recycling now, if it does.
    pub wants: Option<RecycleReason>,
    /// When its instance came up (Provisioned turned True).
    pub created_at: Option<DateTime<Utc>>,
}

/// When a condition of `p` last turned to `status`, if it is so now.
fn since(p: &Proxy, type_: &str, status: ConditionStatus) -> Option<DateTime<Utc>> {
    let st = p.status.as_ref()?;
    find(&st.conditions, type_)
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time)
}

/// The summary of a Managed Proxy that is not being deleted. A
/// `spec.recycle` that does not parse counts as off (the CRD's pattern
/// refuses most such values first).
pub fn summarize(p: &Proxy, now: DateTime<Utc>) -> Option<Summary> {
    if p.spec.mode != ProxyMode::Managed || p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let st = p.status.clone().unwrap_or_default();
    // A surge replacement takes over with Provisioned still True since the
    // old instance came up: its own creation time is the later one.
    let created_at =
        since(p, PROVISIONED, ConditionStatus::True).map(|t| st.created_at.map_or(t, |c| c.max(t)));
    let policy = RecyclePolicy::of(p.spec.recycle.as_ref()).unwrap_or_default();
    let wants = wants_recycle(&RecycleInput {
        policy,
        instance_created_at: created_at,
        unhealthy_since: since(p, HEALTHY, ConditionStatus::False),
        now,
    });
    // The reconcile marks a running instance whose spec changed; unhealthy
    // still goes first.
    let outdated = since(p, UP_TO_DATE, ConditionStatus::False).map(|_| RecycleReason::SpecChanged);
    let requested = replace_pending(p).map(|_| RecycleReason::Requested);
    let wants = [wants, outdated, requested].into_iter().flatten().min();
    Some(Summary {
        key: format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
        provider: p.spec.provider.clone().unwrap_or_default(),
        ready: st.phase == Some(ProxyPhase::Ready),
        replacing: false,
        draining: st.draining_since.is_some(),
        surging: st.surge.is_some(),
        wants,
        created_at,
    })
}

impl Summary {
    /// Ready and not being replaced: what counts as serving.
    pub fn serving(&self) -> bool {
        self.ready && !self.replacing
    }
}

/// Marks the Proxies this process is about to replace (their instance is
/// stopped or gone) while the cache still shows them Ready: a reconcile
/// decides from a view up to a second old and before the health write
/// reaches the cache, so Proxies failing together would each be replaced
/// before the breaker counts any of them. A marked Proxy counts as Ready
/// until now and lost now, even one the view had not yet seen Ready. A
/// mark ends once the cache shows the Proxy not Ready, or after `hold`;
/// `replacing` keeps only the marks still needed.
pub fn mark_replacing(
    summaries: &mut [Summary],
    replacing: &mut BTreeMap<String, DateTime<Utc>>,
    now: DateTime<Utc>,
    hold: chrono::Duration,
) {
    let mut keep = BTreeMap::new();
    for s in summaries.iter_mut() {
        let Some(at) = replacing.get(&s.key) else {
            continue;
        };
        if s.ready && now.signed_duration_since(*at) < hold {
            s.replacing = true;
            keep.insert(s.key.clone(), *at);
        }
    }
    *replacing = keep;
}

/// One provider's breaker and its Proxies admitted to start recycling.
#[derive(Clone, Debug, Default)]
struct ProviderFleet {
    breaker: Breaker,
    admitted: BTreeSet<String>,
    /// Admitted to a surge replacement (created before the old one goes).
    surge: BTreeSet<String>,
}

/// Every provider's fleet state.
#[derive(Clone, Debug, Default)]
pub struct FleetState {
    policy: BreakerPolicy,
    policies: BTreeMap<String, BreakerPolicy>,
    budgets: BTreeMap<String, MaxUnavailable>,
    /// Each provider's `maxSurge` (absent: 0, no surge).
    surges: BTreeMap<String, MaxUnavailable>,
    providers: BTreeMap<String, ProviderFleet>,
}

impl FleetState {
    /// A state with each provider's budget (absent ones get the default).
    pub fn new(policy: BreakerPolicy, budgets: BTreeMap<String, MaxUnavailable>) -> Self {
        FleetState {
            policy,
            policies: BTreeMap::new(),
            budgets,
            surges: BTreeMap::new(),
            providers: BTreeMap::new(),
        }
    }

    /// Each provider's `maxSurge`: how many replacements may be created
    /// before the instances they replace go (absent: none).
    pub fn with_surges(mut self, surges: BTreeMap<String, MaxUnavailable>) -> Self {
        self.surges = surges;
        self
    }

    /// Each provider's own breaker policy (absent ones get the one given
    /// to [`FleetState::new`]).
    pub fn with_breaker_policies(mut self, policies: BTreeMap<String, BreakerPolicy>) -> Self {
        self.policies = policies;
        self
    }

    fn policy_of(&self, provider: &str) -> BreakerPolicy {
        self.policies.get(provider).copied().unwrap_or(self.policy)
    }

    /// `provider`'s breaker: open or not, since when, and its share.
    pub fn report(&self, provider: &str) -> super::breaker::Report {
        self.providers.get(provider).map_or_else(
            || super::breaker::Report::closed(self.policy_of(provider)),
            |f| f.breaker.report(),
        )
    }

    /// Folds in every Managed Proxy at `now`; returns the breaker
    /// transitions, per provider.
    pub fn refresh(&mut self, now: DateTime<Utc>, all: &[Summary]) -> Vec<(String, Transition)> {
        let mut by_provider: BTreeMap<&str, Vec<&Summary>> = BTreeMap::new();
        for s in all {
            by_provider.entry(s.provider.as_str()).or_default().push(s);
        }
        for name in self.budgets.keys() {
            by_provider.entry(name.as_str()).or_default();
        }
        let mut transitions = Vec::new();
        for (name, proxies) in by_provider {
            let policy = self.policy_of(name);
            let fleet = self
                .providers
                .entry(name.to_string())
                .or_insert_with(|| ProviderFleet {
                    breaker: Breaker::new(policy),
                    ..ProviderFleet::default()
                });
            // A Proxy being recycled leaves on purpose: not a loss.
            let members: Vec<Member> = proxies
                .iter()
                .filter(|s| !s.draining)
                .map(|s| {
                    if s.replacing {
                        Member::replacing(s.key.clone())
                    } else {
                        Member::new(s.key.clone(), s.ready)
                    }
                })
                .collect();
            if let Some(t) = fleet.breaker.observe(now, &members) {
                transitions.push((name.to_string(), t));
            }
            let counts = FleetCounts {
                size: proxies.len(),
                ready: proxies
                    .iter()
                    .filter(|s| s.serving() && !s.draining)
                    .count(),
                recycling: proxies.iter().filter(|s| s.draining).count(),
            };
            let candidates: Vec<Candidate> = proxies
                .iter()
                .filter(|s| !s.draining && !s.surging)
                .filter_map(|s| {
                    s.wants.map(|reason| Candidate {
                        key: s.key.clone(),
                        reason,
                        created_at: s.created_at,
                        serving: s.serving(),
                    })
                })
                .collect();
            let busy = per_namespace(&proxies, |s| s.draining);
            let budget = self.budgets.get(name).copied().unwrap_or_default();
            let open = fleet.breaker.is_open();
            let surge = self
                .surges
                .get(name)
                .map_or(0, |m| m.allowance(proxies.len()));
            let (surged, drained) = split_surge(surge, candidates);
            let surging = per_namespace(&proxies, |s| s.surging);
            let free = surge.saturating_sub(surging.values().sum());
            fleet.surge = admit_surge(free, open, surged, &surging)
                .into_iter()
                .collect();
            fleet.admitted = admit_fair(budget, counts, open, drained, &busy)
                .into_iter()
                .collect();
        }
        transitions
    }

    /// Whether `provider`'s breaker is open.
    pub fn breaker_open(&self, provider: &str) -> bool {
        self.providers
            .get(provider)
            .is_some_and(|f| f.breaker.is_open())
    }

    /// When `provider`'s breaker opened and its share (lost, seen), while open.
    pub fn open_since(&self, provider: &str) -> Option<(DateTime<Utc>, usize, usize)> {
        let f = self.providers.get(provider)?;
        let (lost, seen) = f.breaker.share();
        f.breaker.opened_at().map(|t| (t, lost, seen))
    }

    /// Whether the Proxy `key` of `provider` may start a recycle now.
    pub fn admitted(&self, provider: &str, key: &str) -> bool {
        self.providers
            .get(provider)
            .is_some_and(|f| f.admitted.contains(key))
    }

    /// Whether the Proxy `key` of `provider` may start a surge replacement.
    pub fn surge_admitted(&self, provider: &str, key: &str) -> bool {
        self.providers
            .get(provider)
            .is_some_and(|f| f.surge.contains(key))
    }

    /// An operator reset of `provider`'s breaker.
    pub fn reset(&mut self, provider: &str) -> Option<Transition> {
        self.providers.get_mut(provider)?.breaker.reset()
    }

    /// Names of the configured providers (those given a budget).
    pub fn providers(&self) -> Vec<String> {
        self.budgets.keys().cloned().collect()
    }

    /// Names of the providers whose breaker is open.
    pub fn open_providers(&self) -> Vec<String> {
        self.providers
            .iter()
            .filter(|(_, f)| f.breaker.is_open())
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// What a running Managed Proxy does about recycling this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecycleStep {
    /// Nothing: it serves as usual.
    Serve,
    /// Start draining now (record `drainingSince`).
    StartDrain,
    /// Create the replacement first (record `status.surge`): the instance
    /// serves until the replacement passes its probe, then drains.
    StartSurge,
    /// Draining: come back at `until`.
    Drain {
        /// When to look again at the latest.
        until: DateTime<Utc>,
    },
    /// The drain is over: replace the instance.
    Replace(DrainDone),
    /// The drain is over but the provider's breaker is open: keep the
    /// instance (out of the pool) until it closes.
    HoldCircuitOpen,
}

/// How many of `proxies` are `busy`, by namespace.
fn per_namespace(proxies: &[&Summary], busy: impl Fn(&Summary) -> bool) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = BTreeMap::new();
    for s in proxies.iter().filter(|s| busy(s)) {
        let ns = s.key.split_once('/').map_or("", |(ns, _)| ns);
        *out.entry(ns.to_string()).or_default() += 1;
    }
    out
}

/// Splits recycle candidates into those replaced surge-first and those
/// drained first: with a surge allowance, a serving proxy whose spec
/// changed or that grew old always waits for a surge slot (so a roll
/// never lowers the Ready count); an unhealthy one serves nothing, and one
/// a crawler asked to replace must leave the pool at once, so both drain.
fn split_surge(allowance: usize, candidates: Vec<Candidate>) -> (Vec<Candidate>, Vec<Candidate>) {
    candidates.into_iter().partition(|c| {
        allowance > 0
            && c.serving
            && matches!(c.reason, RecycleReason::SpecChanged | RecycleReason::MaxAge)
    })
}

/// [`recycle_step`] for a Proxy the view may also have admitted to a
/// surge replacement (`surge`): one not draining starts its surge, unless
/// the breaker is open.
pub fn recycle_step_with_surge(
    admitted: bool,
    surge: bool,
    breaker_open: bool,
    drain: &DrainInput,
) -> RecycleStep {
    if surge && !breaker_open && drain.draining_since.is_none() {
        return RecycleStep::StartSurge;
    }
    recycle_step(admitted, breaker_open, drain)
}

/// The recycle step of one running Proxy: `admitted` by the view,
/// `drain` its drain state, `breaker_open` its provider's breaker.
pub fn recycle_step(admitted: bool, breaker_open: bool, drain: &DrainInput) -> RecycleStep {
    if drain.draining_since.is_none() {
        return if admitted && !breaker_open {
            RecycleStep::StartDrain
        } else {
            RecycleStep::Serve
        };
    }
    match next_drain_step(drain) {
        // Not reached: draining_since is set.
        DrainStep::Start => RecycleStep::StartDrain,
        DrainStep::Wait { until } => RecycleStep::Drain { until },
        DrainStep::Replace(_) if breaker_open => RecycleStep::HoldCircuitOpen,
        DrainStep::Replace(done) => RecycleStep::Replace(done),
    }
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
