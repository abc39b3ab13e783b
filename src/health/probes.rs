//! The engine's decisions, without I/O or a runtime: [`Probes`] keeps the
//! probe targets in step with the Proxy set, says what is due at a given
//! `now` (milliseconds on the engine's monotonic clock, passed in), and
//! folds each result through the thresholds into a verdict to publish.
//! The engine (`engine.rs`) only runs what it is told and publishes.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use url::Url;

use super::fairness::Fairness;
use super::latency_writes::LatencyWrites;
use super::probe::{Depth, ProbeResult};
use super::schedule::Schedule;
use super::threshold::{self, Change};
use crate::api::health::HealthReport;
use crate::api::Proxy;

pub use super::spec::{
    probe_spec, Defaults, ProbeSpec, DEFAULT_INTERVAL, DEFAULT_TIMEOUT, SYNC_EVERY,
};

/// The key of a Proxy in the engine: `namespace/name`.
pub fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
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

/// The health engine's state machine: targets, schedule and thresholds.
#[derive(Debug)]
pub struct Probes {
    defaults: Defaults,
    sched: Schedule<String>,
    targets: HashMap<String, Arc<ProbeSpec>>,
    /// The resourceVersion each target was taken from: an unchanged Proxy
    /// with unchanged credentials is not converted again at a sync.
    versions: HashMap<String, String>,
    /// Probes since the last full one that passed, and its latency, per
    /// Proxy whose probes may be light ([`Depth::next`]); absent: the next probe
    /// is full.
    light: HashMap<String, (u32, u64)>,
    states: HashMap<String, threshold::State>,
    last_sync: Option<u64>,
    /// Shares of the probe slots per namespace.
    fair: Fairness,
    /// Namespaces with proxies to probe.
    namespaces: usize,
    /// Probes a second the targets ask for.
    rate: f64,
    /// The budget of latency-only status writes.
    latency_writes: LatencyWrites,
}

const SYNC_MS: u64 = SYNC_EVERY.as_millis() as u64;

impl Probes {
    /// Nothing probed yet; Proxies are probed with `defaults` unless they
    /// say otherwise.
    pub fn new(defaults: Defaults) -> Self {
        Probes {
            defaults,
            sched: Schedule::default(),
            targets: HashMap::new(),
            versions: HashMap::new(),
            light: HashMap::new(),
            states: HashMap::new(),
            last_sync: None,
            fair: Fairness::new(usize::MAX),
            namespaces: 0,
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

    /// Probes a second the targets ask for (as of the last sync).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether [`Probes::sync`] is due (at once, then every [`SYNC_EVERY`]).
    pub fn sync_due(&self, now: u64) -> bool {
        self.last_sync.is_none_or(|t| now >= t + SYNC_MS)
    }

    /// Brings the targets in step with `proxies` (the cache's contents):
    /// new Proxies are seeded (spread over their first interval), changed
    /// ones (UID or target) start over, gone ones are pruned. Returns the
    /// Proxies whose published verdict must go.
    pub fn sync<'a>(
        &mut self,
        proxies: impl IntoIterator<Item = &'a Proxy>,
        now: u64,
    ) -> Vec<Dropped> {
        self.last_sync = Some(now);
        let mut dropped = Vec::new();
        let mut seen = HashSet::new();
        for p in proxies {
            let namespace = p.namespace().unwrap_or_default();
            let key = key_of(&namespace, &p.name_any());
            if self.unchanged(&key, &namespace, p) {
                seen.insert(key);
                continue;
            }
            let Some(spec) = probe_spec(p, &self.defaults) else {
                continue;
            };
            match &p.metadata.resource_version {
                Some(v) => self.versions.insert(key.clone(), v.clone()),
                None => self.versions.remove(&key),
            };
            seen.insert(key.clone());
            let interval = spec.interval.as_millis() as u64;
            match self.targets.get(&key) {
                Some(old) if old.uid == spec.uid && old.target == spec.target => {
                    if **old != spec {
                        self.sched.upsert(&key, interval, now, 0);
                        self.targets.insert(key, Arc::new(spec));
                    }
                }
                old => {
                    if old.is_some() {
                        self.states.remove(&key);
                        self.light.remove(&key);
                        self.sched.remove(&key);
                        dropped.push(Dropped {
                            key: key.clone(),
                            gone: false,
                        });
                    }
                    self.sched
                        .upsert(&key, interval, now, spread(&key, interval));
                    self.targets.insert(key, Arc::new(spec));
                }
            }
        }
        let gone: Vec<String> = self
            .targets
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.targets.remove(&key);
            self.versions.remove(&key);
            self.states.remove(&key);
            self.light.remove(&key);
            self.sched.remove(&key);
            dropped.push(Dropped { key, gone: true });
        }
        self.rate = self
            .targets
            .values()
            .map(|t| 1.0 / t.interval.as_secs_f64().max(0.001))
            .sum();
        self.namespaces = self
            .targets
            .keys()
            .map(|k| namespace_of(k))
            .collect::<HashSet<_>>()
            .len();
        dropped
    }

    /// Whether `p` is as its target was taken: the same resourceVersion
    /// and the same credentials at hand (the operator's defaults do not
    /// change while it runs).
    fn unchanged(&self, key: &str, namespace: &str, p: &Proxy) -> bool {
        let (Some(old), Some(v)) = (self.targets.get(key), &p.metadata.resource_version) else {
            return false;
        };
        if self.versions.get(key) != Some(v) {
            return false;
        }
        let credentials = crate::credentials::secret_of(p)
            .and_then(|name| self.defaults.credentials.get(namespace, name));
        credentials == old.target.credentials
    }

    /// Up to `limit` probes due at `now`, each marked in flight until
    /// [`Probes::complete`] (or [`Probes::requeue`]), and how deep each is.
    pub fn due(&mut self, now: u64, limit: usize) -> Vec<(String, Arc<ProbeSpec>, Depth)> {
        let (fair, namespaces) = (&mut self.fair, self.namespaces);
        self.sched
            .pop_due_where(now, limit, |key| {
                let ns = namespace_of(key);
                let admitted = fair.admit(ns, namespaces);
                if admitted {
                    fair.start(ns);
                }
                admitted
            })
            .into_iter()
            .filter_map(|key| {
                let spec = self.targets.get(&key)?.clone();
                let since = self.light.get(&key).map(|l| l.0);
                let d = Depth::next(spec.wire.is_tunnel(), since, self.defaults.full_every);
                Some((key, spec, d))
            })
            .collect()
    }

    /// `key` was seen failing: probed at `now`, fully (not the light
    /// CONNECT-only probe). Whether it was due later.
    pub fn expedite(&mut self, key: &str, now: u64) -> bool {
        let moved = self.sched.expedite(&key.to_string(), now);
        if moved {
            self.light.remove(key);
        }
        moved
    }

    /// A due probe that could not be started: rescheduled as if it had
    /// run at `now`, so the Proxy is not lost.
    pub fn requeue(&mut self, key: &str, now: u64) {
        self.fair.finish(namespace_of(key));
        self.sched.complete(&key.to_string(), now, now);
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
        self.sched.complete(&key.to_string(), started, now);
        let Some(current) = self.targets.get(key) else {
            return Folded::Gone;
        };
        if current.uid != spec.uid || current.target != spec.target {
            return Folded::Stale;
        }
        let mut latency_ms = u64::try_from(result.latency.as_millis()).unwrap_or(u64::MAX);
        match (result.ok, depth) {
            (true, Depth::Full) => {
                self.light.insert(key.to_string(), (0, latency_ms));
            }
            (true, Depth::Connect) => {
                // A CONNECT alone is quicker than the fetch: the latency
                // reported stays the last full fetch's.
                if let Some((n, full)) = self.light.get_mut(key) {
                    *n += 1;
                    latency_ms = *full;
                }
            }
            (false, _) => {
                self.light.remove(key);
            }
        }
        let state = self.states.entry(key.to_string()).or_default();
        let (mut next, mut change) =
            threshold::fold(*state, result.ok, latency_ms, current.thresholds);
        if change == Some(Change::Latency) && !self.latency_writes.allow(state.written_ms, now) {
            // Not written: the status keeps the latency it shows.
            next.reported_latency_ms = state.reported_latency_ms;
            change = None;
        }
        if change.is_some() {
            next.written_ms = Some(now);
        }
        *state = next;
        let Some(change) = change else {
            return Folded::Quiet;
        };
        let healthy = next.healthy == Some(true);
        let message = if healthy {
            format!(
                "probe of {} through the proxy passed",
                redact(&current.target.url)
            )
        } else {
            result
                .error
                .as_ref()
                .map_or_else(|| "probe failed".into(), ToString::to_string)
        };
        Folded::Publish(Verdict {
            uid: current.uid.clone(),
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
        self.states.get(key).copied()
    }

    /// How many Proxies are probed.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether no Proxy is probed.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
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
