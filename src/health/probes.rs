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
use crate::api::Proxy;

pub use super::spec::{
    probe_spec, Defaults, ProbeSpec, DEFAULT_INTERVAL, DEFAULT_TIMEOUT, SYNC_EVERY, WALK_EVERY,
};

/// The key of a Proxy in the engine: `namespace/name`.
pub fn key_of(namespace: &str, name: &str) -> String {
    let mut key = String::new();
    write_key(&mut key, namespace, name);
    key
}

/// Writes the [`key_of`] key into `buf` (cleared first), so a caller
/// looking up many keys reuses one buffer.
fn write_key(buf: &mut String, namespace: &str, name: &str) {
    buf.clear();
    buf.push_str(namespace);
    buf.push('/');
    buf.push_str(name);
}

/// The namespace part of a [`key_of`] key.
fn namespace_of(key: &str) -> &str {
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

/// One probed Proxy, at its interned id.
#[derive(Debug)]
struct Target {
    /// `namespace/name`, shared with the engine's snapshot and probes.
    key: Arc<str>,
    spec: Arc<ProbeSpec>,
    /// The resourceVersion the spec was taken from: an unchanged Proxy
    /// with unchanged credentials is not converted again at a sync.
    version: Option<Box<str>>,
    /// Probes since the last full one that passed, and its latency, when
    /// its probes may be light ([`Depth::next`]); `None`: the next probe
    /// is full.
    light: Option<(u32, u64)>,
    /// `None` before its first result.
    state: Option<threshold::State>,
    /// The last sync that saw it in the Proxy set.
    seen: u64,
}

/// The health engine's state machine: targets, schedule and thresholds.
/// Each Proxy is interned once: its key is one shared string and
/// everything else about it (spec, thresholds, schedule) is found by a
/// small integer id, so 10,000 Proxies cost one map of keys and flat
/// tables instead of six maps each holding a copy of every key.
#[derive(Debug)]
pub struct Probes {
    defaults: Defaults,
    sched: Schedule<u32>,
    ids: HashMap<Arc<str>, u32>,
    /// By id; `None`: free (listed in `free`).
    targets: Vec<Option<Target>>,
    free: Vec<u32>,
    syncs: u64,
    /// The last walk of the whole cache.
    last_sync: Option<u64>,
    /// A walk was asked for ([`Probes::ask_walk`]).
    walk_asked: bool,
    /// Shares of the probe slots per namespace.
    fair: Fairness,
    /// Targets per namespace (its length is what [`Fairness`] shares by).
    namespaces: HashMap<Box<str>, u32>,
    /// Probes a second the targets ask for.
    rate: f64,
    /// The budget of latency-only status writes.
    latency_writes: LatencyWrites,
}

const SYNC_MS: u64 = SYNC_EVERY.as_millis() as u64;
const WALK_MS: u64 = WALK_EVERY.as_millis() as u64;

/// What [`Probes::upsert`] made of a Proxy.
enum Upsert {
    /// Probed, as it was or anew.
    Kept(u32),
    /// Probed, but its UID or target changed: it starts over.
    Restarted(u32),
    /// Nothing to probe now.
    Nothing,
}

impl Probes {
    /// Nothing probed yet; Proxies are probed with `defaults` unless they
    /// say otherwise.
    pub fn new(defaults: Defaults) -> Self {
        Probes {
            defaults,
            sched: Schedule::default(),
            ids: HashMap::new(),
            targets: Vec::new(),
            free: Vec::new(),
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

    fn target(&self, key: &str) -> Option<(u32, &Target)> {
        let id = *self.ids.get(key)?;
        Some((id, self.targets.get(id as usize)?.as_ref()?))
    }

    fn target_mut(&mut self, key: &str) -> Option<(u32, &mut Target)> {
        let id = *self.ids.get(key)?;
        Some((id, self.targets.get_mut(id as usize)?.as_mut()?))
    }

    /// Interns a new target; its id.
    fn insert(&mut self, target: Target) -> u32 {
        let key = target.key.clone();
        let id = match self.free.pop() {
            Some(id) => {
                self.targets[id as usize] = Some(target);
                id
            }
            None => {
                self.targets.push(Some(target));
                // More Proxies than u32 ids is far beyond any fleet a
                // process holds (each costs hundreds of bytes).
                u32::try_from(self.targets.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.ids.insert(key, id);
        self.count(id, true);
        id
    }

    /// Takes target `id` out of the set (the key found it); the dropped
    /// verdict to withdraw.
    fn remove(&mut self, id: u32) -> Option<Dropped> {
        self.count(id, false);
        let t = self.targets.get_mut(id as usize)?.take()?;
        self.ids.remove(&t.key);
        self.sched.remove(&id);
        self.free.push(id);
        Some(Dropped {
            key: t.key.to_string(),
            gone: true,
        })
    }

    /// Counts target `id` in (or out of) the rate and its namespace.
    fn count(&mut self, id: u32, add: bool) {
        let Some(Some(t)) = self.targets.get(id as usize) else {
            return;
        };
        let per_second = 1.0 / t.spec.interval.as_secs_f64().max(0.001);
        let ns = namespace_of(&t.key);
        if add {
            self.rate += per_second;
            *self.namespaces.entry(Box::from(ns)).or_default() += 1;
        } else {
            self.rate = (self.rate - per_second).max(0.0);
            if let Some(n) = self.namespaces.get_mut(ns) {
                *n -= 1;
                if *n == 0 {
                    self.namespaces.remove(ns);
                }
            }
        }
    }

    /// Brings the targets in step with `proxies` (the whole cache): new
    /// Proxies are seeded (spread over their first interval), changed
    /// ones (UID or target) start over, gone ones are pruned. Returns the
    /// Proxies whose published verdict must go.
    pub fn sync<'a>(
        &mut self,
        proxies: impl IntoIterator<Item = &'a Proxy>,
        now: u64,
    ) -> Vec<Dropped> {
        self.last_sync = Some(now);
        self.walk_asked = false;
        self.syncs += 1;
        let syncs = self.syncs;
        let mut dropped = Vec::new();
        // One buffer for every key looked up: a steady fleet's sync
        // allocates nothing per Proxy.
        let mut key = String::new();
        for p in proxies {
            let namespace = p.metadata.namespace.as_deref().unwrap_or_default();
            write_key(
                &mut key,
                namespace,
                p.metadata.name.as_deref().unwrap_or_default(),
            );
            let id = match self.upsert(&key, namespace, p, now) {
                Upsert::Kept(id) => id,
                Upsert::Restarted(id) => {
                    dropped.push(Dropped {
                        key: key.clone(),
                        gone: false,
                    });
                    id
                }
                // Not seen: pruned below.
                Upsert::Nothing => continue,
            };
            if let Some(Some(t)) = self.targets.get_mut(id as usize) {
                t.seen = syncs;
            }
        }
        let unseen: Vec<u32> = (0..self.targets.len())
            .filter(|&i| matches!(&self.targets[i], Some(t) if t.seen != syncs))
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        dropped.extend(unseen.into_iter().filter_map(|id| self.remove(id)));
        // Counted anew: the running sums of [`Probes::sync_one`] drift by
        // float rounding.
        self.rate = 0.0;
        self.namespaces.clear();
        for id in 0..self.targets.len() {
            self.count(u32::try_from(id).unwrap_or(u32::MAX), true);
        }
        dropped
    }

    /// Brings the target of `namespace/name` in step with `proxy`, its
    /// object in the cache now (`None`: gone), as a watch event asks.
    /// Returns the verdict that must go, if any.
    pub fn sync_one(
        &mut self,
        (namespace, name): (&str, &str),
        proxy: Option<&Proxy>,
        now: u64,
    ) -> Option<Dropped> {
        let key = key_of(namespace, name);
        let upserted = proxy.map(|p| self.upsert(&key, namespace, p, now));
        match upserted {
            Some(Upsert::Kept(_)) => None,
            Some(Upsert::Restarted(_)) => Some(Dropped { key, gone: false }),
            Some(Upsert::Nothing) | None => {
                let id = *self.ids.get(key.as_str())?;
                self.remove(id)
            }
        }
    }

    /// Takes `p` (at `key`, in `namespace`) into the targets: a new
    /// target, a changed one, or as it was.
    fn upsert(&mut self, key: &str, namespace: &str, p: &Proxy, now: u64) -> Upsert {
        if self.unchanged(key, namespace, p) {
            if let Some((id, _)) = self.target(key) {
                return Upsert::Kept(id);
            }
        }
        let Some(spec) = probe_spec(p, &self.defaults) else {
            return Upsert::Nothing;
        };
        let version = p.metadata.resource_version.as_deref().map(Box::from);
        let interval = spec.interval.as_millis() as u64;
        let Some((id, old)) = self.target_mut(key) else {
            let shared: Arc<str> = Arc::from(key);
            let id = self.insert(Target {
                key: shared,
                spec: Arc::new(spec),
                version,
                light: None,
                state: None,
                seen: self.syncs,
            });
            self.sched.upsert(&id, interval, now, spread(key, interval));
            return Upsert::Kept(id);
        };
        old.version = version;
        if old.spec.uid == spec.uid && old.spec.target == spec.target {
            if *old.spec != spec {
                let new = Arc::new(spec);
                // Its interval may change the rate.
                self.count(id, false);
                if let Some(Some(t)) = self.targets.get_mut(id as usize) {
                    t.spec = new;
                }
                self.count(id, true);
                self.sched.upsert(&id, interval, now, 0);
            }
            return Upsert::Kept(id);
        }
        self.count(id, false);
        if let Some(Some(t)) = self.targets.get_mut(id as usize) {
            t.spec = Arc::new(spec);
            t.state = None;
            t.light = None;
        }
        self.count(id, true);
        self.sched.remove(&id);
        self.sched.upsert(&id, interval, now, spread(key, interval));
        Upsert::Restarted(id)
    }

    /// Whether `p` is as its target was taken: the same resourceVersion
    /// and the same credentials at hand (the operator's defaults do not
    /// change while it runs).
    fn unchanged(&self, key: &str, namespace: &str, p: &Proxy) -> bool {
        let (Some((_, old)), Some(v)) = (self.target(key), &p.metadata.resource_version) else {
            return false;
        };
        if old.version.as_deref() != Some(v.as_str()) {
            return false;
        }
        let credentials = crate::credentials::secret_of(p)
            .and_then(|name| self.defaults.credentials.get(namespace, name));
        credentials == old.spec.target.credentials
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
        let Some(&id) = self.ids.get(key) else {
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
        let Some(id) = self.ids.get(key).copied() else {
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
        self.ids.len()
    }

    /// Whether no Proxy is probed.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
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
fn spread(key: &str, interval_ms: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish() % interval_ms.max(1)
}

#[cfg(test)]
#[path = "probes_tests.rs"]
pub(crate) mod tests;
