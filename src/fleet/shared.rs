//! The controller's side of fleet policy ([`crate::fleet`]): the shared
//! fleet view (refreshed from the Proxy cache at most once a second) the
//! plan's gates ask, the breaker before a dead instance is replaced and
//! the recycle step of a running Proxy. Decisions are the fleet module's,
//! and what they mean for a Proxy's status is the plan's
//! (`plan::recycle`); this file only gathers their inputs.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use tokio::sync::watch;

use crate::api::{Proxy, ProxyStatus};
use crate::fleet::breaker::Report;
use crate::fleet::cap;
use crate::fleet::{
    leases_end, mark_replacing, recycle_step_with_surge, summarize, BreakerPolicy, DrainInput,
    FleetState, MaxUnavailable, RecyclePolicy, RecycleStep, Transition,
};
use crate::lease::{HeldUntil, LeaseStore, ProxyKey};

/// How often the view is rebuilt from the cache at most.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// How long a drain started here counts as draining before the cache
/// shows it (so two passes never both take the last budget slot).
const PENDING_FOR: Duration = Duration::from_secs(60);
/// Transitions kept for the ProviderHealth writer at most; without a
/// writer (provider checks off) nobody takes them, and the oldest go.
const KEEP_TRANSITIONS: usize = 64;

/// A breaker transition of one provider, and when it was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The provider's configured name.
    pub provider: String,
    /// What changed.
    pub transition: Transition,
    /// When.
    pub at: DateTime<Utc>,
}

/// Where a drain learns which leases a proxy holds.
enum Leases {
    /// Not told (tests): wait for the longest lease TTL.
    Unknown,
    /// The discovery API is off: none.
    NoApi,
    /// This replica's lease table.
    Table(Arc<LeaseStore>),
}

/// The fleet view every reconcile consults.
pub struct Fleet {
    cache: Option<Store<Proxy>>,
    max_lease_ttl: Duration,
    /// The leader's lease table: a drain ends once the proxy's leases do.
    leases: Leases,
    inner: Mutex<Inner>,
    /// Counts transitions, so the ProviderHealth writer wakes on each.
    changed: watch::Sender<u64>,
}

struct Inner {
    state: FleetState,
    refreshed: Option<DateTime<Utc>>,
    /// Drains started by this process, by key, not yet seen in the cache.
    pending: HashMap<String, DateTime<Utc>>,
    /// Surges started by this process, by key, not yet seen in the cache.
    pending_surge: HashMap<String, DateTime<Utc>>,
    /// Replaces decided by this process, by key, while the cache may
    /// still show the Proxy Ready (see [`mark_replacing`]).
    replacing: BTreeMap<String, DateTime<Utc>>,
    /// Transitions not yet taken by the ProviderHealth writer.
    transitions: Vec<Seen>,
    /// Creates admitted under `maxInstances` the cache does not show yet.
    creating: cap::Reserved,
}

impl Fleet {
    /// A view over `cache`, with each provider's budget; leases run at
    /// most `max_lease_ttl` (the drain bound where holders are unknown).
    pub fn new(
        cache: Option<Store<Proxy>>,
        budgets: BTreeMap<String, MaxUnavailable>,
        max_lease_ttl: Duration,
    ) -> Self {
        Fleet {
            cache,
            max_lease_ttl,
            leases: Leases::Unknown,
            inner: Mutex::new(Inner {
                state: FleetState::new(BreakerPolicy::default(), budgets),
                refreshed: None,
                pending: HashMap::new(),
                pending_surge: HashMap::new(),
                replacing: BTreeMap::new(),
                transitions: Vec::new(),
                creating: cap::Reserved::new(),
            }),
            changed: watch::channel(0).0,
        }
    }

    /// Each provider's breaker policy (`circuitBreaker` in its entry).
    pub fn with_breaker_policies(mut self, policies: BTreeMap<String, BreakerPolicy>) -> Self {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        inner.state = std::mem::take(&mut inner.state).with_breaker_policies(policies);
        self
    }

    /// Each provider's `maxSurge` (absent: none).
    pub fn with_surges(mut self, surges: BTreeMap<String, MaxUnavailable>) -> Self {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        inner.state = std::mem::take(&mut inner.state).with_surges(surges);
        self
    }

    /// Drains end as the leases `leases` holds on the proxy do (this
    /// replica's lease table, which every lease call reaches while it
    /// leads), instead of after the longest lease TTL; `None`: the
    /// discovery API is off, so no lease is ever held.
    pub fn with_leases(mut self, leases: Option<Arc<LeaseStore>>) -> Self {
        self.leases = match leases {
            Some(store) => Leases::Table(store),
            None => Leases::NoApi,
        };
        self
    }

    /// Ticks once per breaker transition (see [`Fleet::take_transitions`]).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The transitions since the last call, oldest first.
    pub fn take_transitions(&self) -> Vec<Seen> {
        std::mem::take(&mut self.lock().transitions)
    }

    /// `provider`'s breaker as of the last refresh.
    pub fn report(&self, provider: &str) -> Report {
        self.lock().state.report(provider)
    }

    fn record(&self, inner: &mut Inner, provider: &str, transition: Transition, at: DateTime<Utc>) {
        log_transition(provider, transition);
        if inner.transitions.len() >= KEEP_TRANSITIONS {
            inner.transitions.remove(0);
        }
        inner.transitions.push(Seen {
            provider: provider.to_string(),
            transition,
            at,
        });
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rebuilds the view from the cache unless that happened within a second.
    fn refresh(&self, inner: &mut Inner, now: DateTime<Utc>) {
        let Some(cache) = &self.cache else {
            return;
        };
        let fresh = inner.refreshed.is_some_and(|t| {
            now.signed_duration_since(t)
                .to_std()
                .is_ok_and(|d| d < REFRESH_EVERY)
        });
        if fresh {
            return;
        }
        inner.refreshed = Some(now);
        let pending_for = chrono::Duration::from_std(PENDING_FOR).unwrap_or(chrono::Duration::MAX);
        let mut summaries: Vec<_> = cache
            .state()
            .iter()
            .filter_map(|p| summarize(p, now))
            .collect();
        for s in summaries.iter_mut() {
            let seen = s.draining;
            s.draining |= still_pending(&mut inner.pending, &s.key, seen, now, pending_for);
            // A surge may come and go between two refreshes: one that no
            // longer wants a new instance is done.
            let seen = s.surging || s.wants.is_none();
            s.surging |= still_pending(&mut inner.pending_surge, &s.key, seen, now, pending_for);
        }
        mark_replacing(&mut summaries, &mut inner.replacing, now, pending_for);
        for (provider, t) in inner.state.refresh(now, &summaries) {
            self.record(inner, &provider, t, now);
        }
    }

    /// Refreshes the view every [`REFRESH_EVERY`] until `stop`, so the
    /// breaker sees every Proxy's latest status even when no reconcile
    /// asks after it (a pass reads the cache before its own status write,
    /// and the passes after a write may all fall within one second).
    pub async fn keep_fresh(self: Arc<Self>, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let mut ticks = tokio::time::interval(REFRESH_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = ticks.tick() => {
                    let mut inner = self.lock();
                    self.refresh(&mut inner, Utc::now());
                }
            }
        }
    }

    /// Whether the Proxy `key` (its UID) may create an instance on
    /// `provider`, which may hold `max` (`maxInstances`): `Err` with the
    /// instances it holds when not; when it may, the create counts until
    /// the cache shows its instance. `own` counts the instances the Proxy
    /// keeps meanwhile (its current one, for a surge replacement). Without
    /// a cache (tests) it may.
    pub fn admit_create(
        &self,
        provider: &str,
        key: &str,
        (max, own): (u32, usize),
        now: DateTime<Utc>,
    ) -> Result<(), usize> {
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        let proxies = cache.state();
        let seen = proxies.iter().map(|p| cap::Seen {
            key: p.metadata.uid.as_deref().unwrap_or_default(),
            provider: p.spec.provider.as_deref().unwrap_or_default(),
            instances: p.status.as_ref().map_or(0, instances_of),
        });
        let mut inner = self.lock();
        let held = cap::held(seen, &mut inner.creating, provider, key, now) + own;
        if held >= max as usize {
            return Err(held);
        }
        inner
            .creating
            .insert(key.to_string(), (provider.to_string(), now));
        Ok(())
    }

    /// Whether `provider`'s breaker is open (refreshing first).
    pub fn breaker_open(&self, provider: &str, now: DateTime<Utc>) -> bool {
        let mut inner = self.lock();
        self.refresh(&mut inner, now);
        inner.state.breaker_open(provider)
    }

    /// Whether the Proxy `key` on `provider` may replace its stopped or
    /// vanished instance: its loss is counted first, with a fresh view, so
    /// Proxies failing within one second open the breaker once enough of
    /// them are lost instead of all being replaced.
    pub fn admit_replace(&self, provider: &str, key: &str, now: DateTime<Utc>) -> bool {
        let mut inner = self.lock();
        inner.replacing.insert(key.to_string(), now);
        inner.refreshed = None;
        self.refresh(&mut inner, now);
        let admitted = !inner.state.breaker_open(provider);
        let r = inner.state.report(provider);
        tracing::debug!(
            provider,
            proxy = key,
            lost = r.lost,
            seen = r.seen,
            admitted,
            "Replace asked of the circuit breaker"
        );
        admitted
    }

    /// An operator's reset of `provider`'s breaker: losses so far are
    /// forgotten. Recorded as a [`Transition::Reset`] whether or not it
    /// was open, so the reset is reported either way.
    pub fn reset(&self, provider: &str, now: DateTime<Utc>) {
        let mut inner = self.lock();
        inner.state.reset(provider);
        self.record(&mut inner, provider, Transition::Reset, now);
    }

    /// Every configured provider and whether its breaker is open.
    pub fn states(&self) -> Vec<(String, bool)> {
        let inner = self.lock();
        inner
            .state
            .providers()
            .into_iter()
            .map(|p| {
                let open = inner.state.breaker_open(&p);
                (p, open)
            })
            .collect()
    }

    /// Providers whose breaker is open, with when it opened and the share.
    pub fn open(&self) -> Vec<(String, DateTime<Utc>, usize, usize)> {
        let inner = self.lock();
        inner
            .state
            .open_providers()
            .into_iter()
            .filter_map(|p| {
                let (t, lost, seen) = inner.state.open_since(&p)?;
                Some((p, t, lost, seen))
            })
            .collect()
    }

    /// The recycle step of the running Proxy `proxy` at `now`.
    pub fn step(&self, proxy: &Proxy, status: &ProxyStatus, now: DateTime<Utc>) -> RecycleStep {
        let provider = proxy.spec.provider.clone().unwrap_or_default();
        let key = format!(
            "{}/{}",
            proxy.namespace().unwrap_or_default(),
            proxy.name_any()
        );
        let policy = RecyclePolicy::of(proxy.spec.recycle.as_ref()).unwrap_or_default();
        let mut inner = self.lock();
        self.refresh(&mut inner, now);
        let busy = inner.pending.contains_key(&key) || inner.pending_surge.contains_key(&key);
        let admitted = inner.state.admitted(&provider, &key) && !busy;
        let surge = inner.state.surge_admitted(&provider, &key) && !busy;
        let drain = self.drain_input(proxy, status.draining_since, policy, now);
        let open = inner.state.breaker_open(&provider);
        let step = recycle_step_with_surge(admitted, surge, open, &drain);
        match step {
            RecycleStep::StartDrain => {
                inner.pending.insert(key, now);
            }
            RecycleStep::StartSurge => {
                inner.pending_surge.insert(key, now);
            }
            _ => {}
        }
        step
    }

    /// Where the drain of `proxy` begun at `since` stands at `now`: the
    /// drain of its retiring instance after a surge replacement took over.
    /// Every lease on the Proxy counts, those taken on the new instance
    /// too (the lease table does not say which instance a lease got), so
    /// a busy Proxy's old instance goes at its drain timeout.
    pub fn retire_step(
        &self,
        proxy: &Proxy,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> crate::fleet::DrainStep {
        let policy = RecyclePolicy::of(proxy.spec.recycle.as_ref()).unwrap_or_default();
        crate::fleet::next_drain_step(&self.drain_input(proxy, Some(since), policy, now))
    }

    fn drain_input(
        &self,
        proxy: &Proxy,
        since: Option<DateTime<Utc>>,
        policy: RecyclePolicy,
        now: DateTime<Utc>,
    ) -> DrainInput {
        let held = match &self.leases {
            Leases::Table(store) => store.held_until(&ProxyKey {
                namespace: proxy.namespace().unwrap_or_default(),
                name: proxy.name_any(),
            }),
            Leases::NoApi => HeldUntil::Known(None),
            Leases::Unknown => HeldUntil::Unknown,
        };
        DrainInput {
            draining_since: since,
            leases_end: leases_end(since, held, self.max_lease_ttl, now),
            timeout: policy.drain_timeout,
            now,
        }
    }
}

/// Whether a start this process made for `key` (`pending`) still counts:
/// until the cache has `seen` it, for `pending_for` at most.
fn still_pending(
    pending: &mut HashMap<String, DateTime<Utc>>,
    key: &str,
    seen: bool,
    now: DateTime<Utc>,
    pending_for: chrono::Duration,
) -> bool {
    match pending.get(key) {
        Some(t) if !seen && now.signed_duration_since(*t) < pending_for => true,
        Some(_) => {
            pending.remove(key);
            false
        }
        None => false,
    }
}

/// The instances `status` records: its current one, a surge replacement
/// (counted from its decision, before the create) and a retiring one.
pub fn instances_of(status: &ProxyStatus) -> usize {
    let current = status
        .provider_id
        .as_deref()
        .is_some_and(|id| !id.is_empty());
    usize::from(current)
        + usize::from(status.surge.is_some())
        + usize::from(status.retiring.is_some())
}

fn log_transition(provider: &str, t: Transition) {
    match t {
        Transition::Opened { lost, seen } => tracing::warn!(
            provider,
            lost,
            seen,
            "Circuit breaker open: too many of the provider's proxies failed at once; not replacing or recycling on it until it closes"
        ),
        Transition::Closed => tracing::info!(provider, "Circuit breaker closed"),
        Transition::Reset => tracing::info!(provider, "Circuit breaker reset by an operator"),
    }
}
