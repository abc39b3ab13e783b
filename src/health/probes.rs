//! The engine's decisions, without I/O or a runtime: [`Probes`] keeps the
//! probe targets in step with the Proxy set, says what is due at a given
//! `now` (milliseconds on the engine's monotonic clock, passed in), and
//! folds each result through the thresholds into a verdict to publish.
//! The engine (`engine.rs`) only runs what it is told and publishes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use url::Url;

use super::fairness::Fairness;
use super::latency_writes::LatencyWrites;
use super::probe::{Depth, ProbeResult};
use super::schedule::Schedule;
use super::threshold::{self, Change};
use crate::api::health::HealthReport;
use crate::proxy_ids::{ProxyId, ProxyIds};

pub use super::spec::{
    probe_spec, Defaults, ProbeSpec, DEFAULT_INTERVAL, DEFAULT_TIMEOUT, SYNC_EVERY, WALK_EVERY,
};

pub use crate::proxy_ids::key_of;
pub(super) use crate::proxy_ids::write_key;

/// The namespace part of a [`key_of`] key.
pub(super) fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(ns, _)| ns)
}

/// A Proxy whose published verdict must go, found by [`Probes::sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// `namespace/name`.
    pub key: String,
    /// The Proxy left the set (its metric series go too); otherwise its
    /// UID or target changed and it starts over.
    pub gone: bool,
}

/// A status-affecting result: what to publish for a Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The UID the verdict belongs to.
    pub uid: String,
    /// Why it affects status.
    pub change: Change,
    /// What the reconciler folds into the status.
    pub report: HealthReport,
}

impl Verdict {
    /// Whether the verdict itself is new (a first result or a flip), not
    /// only its latency: what the engine logs.
    pub fn is_news(&self) -> bool {
        self.change != Change::Latency
    }
}

/// What one probe result amounts to ([`Probes::complete`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folded {
    /// The Proxy was pruned while its probe ran: nothing to record.
    Gone,
    /// The probe was of an older UID or target: nothing to record.
    Stale,
    /// Recorded; the status stays as it is.
    Quiet,
    /// Recorded, and the status must change.
    Publish(Verdict),
}

/// One probed Proxy, at its slot of the process's Proxy ids.
#[derive(Debug)]
pub(super) struct Target {
    /// The id the engine holds (its generation tells a reused slot).
    pub(super) id: ProxyId,
    /// `namespace/name`, the ids' own string, shared with the engine's
    /// snapshot and probes.
    pub(super) key: Arc<str>,
    pub(super) spec: Arc<ProbeSpec>,
    /// The resourceVersion the spec was taken from: an unchanged Proxy
    /// with unchanged credentials is not converted again at a sync.
    pub(super) version: Option<Box<str>>,
    /// Probes since the last full one that passed, and its latency, when
    /// its probes may be light ([`Depth::next`]); `None`: the next probe
    /// is full.
    pub(super) light: Option<(u32, u64)>,
    /// `None` before its first result.
    pub(super) state: Option<threshold::State>,
    /// The last sync that saw it in the Proxy set.
    pub(super) seen: u64,
}

/// The health engine's state machine: targets, schedule and thresholds.
/// Each Proxy is found by its id in the process's table of Proxy ids
/// ([`crate::proxy_ids`], shared with the Proxy store): its key is that
/// table's one string and everything else about it (spec, thresholds,
/// schedule) is a row of flat tables by the id's slot, so 10,000 Proxies
/// cost no map of the engine's own.
#[derive(Debug)]
pub struct Probes {
    pub(super) defaults: Defaults,
    pub(super) sched: Schedule<u32>,
    pub(super) ids: ProxyIds,
    /// By slot; `None`: the engine holds no id there.
    pub(super) targets: Vec<Option<Target>>,
    /// Rows that are `Some`.
    pub(super) live: usize,
    pub(super) syncs: u64,
    /// The last walk of the whole cache.
    pub(super) last_sync: Option<u64>,
    /// A walk was asked for ([`Probes::ask_walk`]).
    pub(super) walk_asked: bool,
    /// Shares of the probe slots per namespace.
    pub(super) fair: Fairness,
    /// Targets per namespace (its length is what [`Fairness`] shares by).
    pub(super) namespaces: HashMap<Box<str>, u32>,
    /// Probes a second the targets ask for.
    pub(super) rate: f64,
    /// The budget of latency-only status writes.
    pub(super) latency_writes: LatencyWrites,
}

const SYNC_MS: u64 = SYNC_EVERY.as_millis() as u64;
const WALK_MS: u64 = WALK_EVERY.as_millis() as u64;

impl Probes {
    /// Nothing probed yet; Proxies are probed with `defaults` unless they
    /// say otherwise.
    pub fn new(defaults: Defaults) -> Self {
        Probes {
            defaults,
            sched: Schedule::default(),
            ids: ProxyIds::new(),
            targets: Vec::new(),
            live: 0,
            syncs: 0,
            last_sync: None,
            walk_asked: false,
            fair: Fairness::new(usize::MAX),
            namespaces: HashMap::new(),
            rate: 0.0,
            latency_writes: LatencyWrites::default(),
        }
    }

    /// The same, sharing `slots` probe slots fairly across namespaces
    /// ([`Fairness`]).
    pub fn with_slots(self, slots: usize) -> Self {
        Probes {
            fair: Fairness::new(slots),
            ..self
        }
    }

    /// The same, numbering Proxies in `ids` (the Proxy store's), before
    /// any is probed.
    pub fn sharing(self, ids: ProxyIds) -> Self {
        Probes { ids, ..self }
    }

    /// Shares `slots` probe slots from now on.
    pub fn set_slots(&mut self, slots: usize) {
        self.fair.set_capacity(slots);
    }

    /// Probes a second the targets ask for.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether a walk of the whole cache ([`Probes::sync`]) is due: at
    /// once, then once asked for ([`Probes::ask_walk`]) but at most every
    /// [`SYNC_EVERY`], and every [`WALK_EVERY`] in any case. Between
    /// walks the watch's events keep the targets in step
    /// ([`Probes::sync_one`]).
    pub fn sync_due(&self, now: u64) -> bool {
        self.last_sync
            .is_none_or(|t| now >= t + WALK_MS || (self.walk_asked && now >= t + SYNC_MS))
    }

    /// Asks for a walk of the whole cache: a relist, a follower that
    /// missed events, or credentials that changed under unchanged Proxies.
    pub fn ask_walk(&mut self) {
        self.walk_asked = true;
    }

    /// Walks of the whole cache so far.
    pub fn walks(&self) -> u64 {
        self.syncs
    }

    /// The slot and row of `key`'s target.
    pub(super) fn target(&self, key: &str) -> Option<(u32, &Target)> {
        let id = self.ids.get(key)?;
        let t = self.targets.get(id.slot())?.as_ref()?;
        (t.id == id).then_some((u32::try_from(id.slot()).ok()?, t))
    }

    pub(super) fn target_mut(&mut self, key: &str) -> Option<(u32, &mut Target)> {
        let id = self.ids.get(key)?;
        let t = self.targets.get_mut(id.slot())?.as_mut()?;
        (t.id == id).then_some((u32::try_from(id.slot()).ok()?, t))
    }

    /// Up to `limit` probes due at `now`, each marked in flight until
    /// [`Probes::complete`] (or [`Probes::requeue`]), and how deep each is.
    pub fn due(&mut self, now: u64, limit: usize) -> Vec<(Arc<str>, Arc<ProbeSpec>, Depth)> {
        let (fair, namespaces, targets) = (&mut self.fair, self.namespaces.len(), &self.targets);
        let key_at = |id: &u32| targets.get(*id as usize).and_then(Option::as_ref);
        self.sched
            .pop_due_where(now, limit, |id| {
                let Some(t) = key_at(id) else {
                    return true;
                };
                let ns = namespace_of(&t.key);
                let admitted = fair.admit(ns, namespaces);
                if admitted {
                    fair.start(ns);
                }
                admitted
            })
            .into_iter()
            .filter_map(|id| {
                let t = key_at(&id)?;
                let since = t.light.map(|l| l.0);
                let d = Depth::next(t.spec.wire.is_tunnel(), since, self.defaults.full_every);
                Some((t.key.clone(), t.spec.clone(), d))
            })
            .collect()
    }

    /// `key` was seen failing: probed at `now`, fully (not the light
    /// CONNECT-only probe). Whether it was due later.
    pub fn expedite(&mut self, key: &str, now: u64) -> bool {
        let Some((id, _)) = self.target(key) else {
            return false;
        };
        if !self.sched.expedite(&id, now) {
            return false;
        }
        if let Some(Some(t)) = self.targets.get_mut(id as usize) {
            t.light = None;
        }
        true
    }

    /// A due probe that could not be started: rescheduled as if it had
    /// run at `now`, so the Proxy is not lost.
    pub fn requeue(&mut self, key: &str, now: u64) {
        self.fair.finish(namespace_of(key));
        if let Some((id, _)) = self.target(key) {
            self.sched.complete(&id, now, now);
        }
    }

    /// How long the engine may sleep at `now` with `free` workers: until
    /// the next probe is due, at most [`SYNC_EVERY`].
    pub fn wait(&mut self, now: u64, free: usize) -> Duration {
        let ms = if free == 0 {
            SYNC_MS
        } else {
            self.sched
                .next_due()
                .map_or(SYNC_MS, |d| d.saturating_sub(now))
                .min(SYNC_MS)
        };
        Duration::from_millis(ms)
    }

    /// Folds the `result` of the probe of `key` with `spec` that started at
    /// `started` and ended at `now` (wall clock `at`): schedules its next
    /// probe and, unless the target changed meanwhile, runs the thresholds.
    pub fn complete(
        &mut self,
        key: &str,
        (spec, depth): (&ProbeSpec, Depth),
        started: u64,
        now: u64,
        at: DateTime<Utc>,
        result: &ProbeResult,
    ) -> Folded {
        self.fair.finish(namespace_of(key));
        let Some((id, _)) = self.target(key) else {
            return Folded::Gone;
        };
        self.sched.complete(&id, started, now);
        let Some(current) = self.targets.get_mut(id as usize).and_then(Option::as_mut) else {
            return Folded::Gone;
        };
        if current.spec.uid != spec.uid || current.spec.target != spec.target {
            return Folded::Stale;
        }
        let mut latency_ms = u64::try_from(result.latency.as_millis()).unwrap_or(u64::MAX);
        match (result.ok, depth) {
            (true, Depth::Full) => current.light = Some((0, latency_ms)),
            (true, Depth::Connect) => {
                // A CONNECT alone is quicker than the fetch: the latency
                // reported stays the last full fetch's.
                if let Some((n, full)) = current.light.as_mut() {
                    *n += 1;
                    latency_ms = *full;
                }
            }
            (false, _) => current.light = None,
        }
        let state = current.state.unwrap_or_default();
        let (mut next, mut change) =
            threshold::fold(state, result.ok, latency_ms, current.spec.thresholds);
        if change == Some(Change::Latency) && !self.latency_writes.allow(state.written_ms, now) {
            // Not written: the status keeps the latency it shows.
            next.reported_latency_ms = state.reported_latency_ms;
            change = None;
        }
        if change.is_some() {
            next.written_ms = Some(now);
        }
        current.state = Some(next);
        let Some(change) = change else {
            return Folded::Quiet;
        };
        let healthy = next.healthy == Some(true);
        let message = if healthy {
            format!(
                "probe of {} through the proxy passed",
                redact(&current.spec.target.url)
            )
        } else {
            result
                .error
                .as_ref()
                .map_or_else(|| "probe failed".into(), ToString::to_string)
        };
        Folded::Publish(Verdict {
            uid: current.spec.uid.clone(),
            change,
            report: HealthReport {
                healthy,
                latency_ms,
                probed_at: at,
                message,
            },
        })
    }

    /// The threshold state of `key` (`None` before its first result).
    pub fn state(&self, key: &str) -> Option<threshold::State> {
        self.target(key)?.1.state
    }

    /// How many Proxies are probed.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no Proxy is probed.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

/// The URL without credentials, query or fragment (for messages).
fn redact(u: &Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// A stable offset in `0..interval` so a fleet seeded at once is spread
/// over the first interval instead of probed in one burst.
pub(super) fn spread(key: &str, interval_ms: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish() % interval_ms.max(1)
}

#[cfg(test)]
#[path = "probes_tests.rs"]
pub(crate) mod tests;
