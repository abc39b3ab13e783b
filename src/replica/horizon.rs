//! The leader's lease horizon on its election Lease: what this replica's
//! lease store may hand out, published at every renew write; on taking
//! over, the previous leader's hand-over (`super::handover`) is imported,
//! or, when there is none, its horizon opens the recovery window
//! (`lease::recovery`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tracing::{info, warn};

use super::handover::{HandOver, Pointer, HANDOVER_ANNOTATION};
use crate::leader::Publisher;
use crate::lease::{LeaseKey, LeaseStore, Snapshot, HORIZON_ANNOTATION};
use crate::replica::members::{in_sync, Replicas};

/// How long waiting for the discovery API to stop may take at shutdown.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing the hand-over may take: a few Secret writes, which an
/// API server under load has been seen to take over 5 s for (CI; the next
/// leader then waited out a 300 s recovery window). A stop's bounds still
/// fit the Pod's 30 s grace period (5 + 5 + 12 + 2 s).
const HANDOVER_WRITE_TIMEOUT: Duration = Duration::from_secs(12);

/// The horizon again, in milliseconds after the write that carries it: a
/// successor counts it from when it first saw that write, by its own
/// clock, so clock skew between replicas cannot shorten the window.
/// [`HORIZON_ANNOTATION`] (RFC 3339, the leader's clock) is for people.
pub const HORIZON_MS_ANNOTATION: &str = "crawl.example.com/lease-horizon-ms";

/// Publishes the horizon of `store`, `margin` (two retry periods) past the
/// latest expiry it may hand out before its next write.
pub struct Horizon {
    /// The discovery API's store.
    pub store: Arc<LeaseStore>,
    /// Two retry periods.
    pub margin: Duration,
    /// Loads a previous leader's hand-over (`None`: ids are signed with a
    /// key of this process, which no other process could have sealed).
    handover: Option<Arc<HandOver>>,
    /// The value this replica last wrote.
    last: Mutex<Option<String>>,
    /// The horizon of the write in flight.
    computed: Mutex<Option<DateTime<Utc>>>,
    /// A hand-over loaded for the next take-over write.
    loaded: Mutex<Option<Snapshot>>,
    /// What the write that takes the Lease over, in flight, starts with.
    pending: Mutex<Option<TakeOver>>,
    /// The followers grants wait for, and the key their set is sealed
    /// with (`None`: a key of this process, which no follower shares).
    sync: Option<(Arc<Replicas>, LeaseKey)>,
    /// The in-sync set of the write in flight.
    named: Mutex<Option<BTreeSet<String>>>,
}

/// How a term starts once its take-over write wins.
enum TakeOver {
    /// With the previous leader's state, or with the window until its
    /// horizon when the state does not import.
    HandOver(Box<Snapshot>, Option<DateTime<Utc>>),
    /// With the window until the previous leader's horizon.
    Window(Option<DateTime<Utc>>),
    /// With this replica's copy of the previous leader's table, which
    /// that leader named in sync: at once.
    Warm,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values: a panic elsewhere cannot leave them half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Horizon {
    /// Publishes `store`'s horizon with `margin`; takes over through
    /// `handover` when the previous leader wrote one.
    pub fn new(store: Arc<LeaseStore>, margin: Duration, handover: Option<Arc<HandOver>>) -> Self {
        Horizon {
            store,
            margin,
            handover,
            last: Mutex::new(None),
            computed: Mutex::new(None),
            loaded: Mutex::new(None),
            pending: Mutex::new(None),
            sync: None,
            named: Mutex::new(None),
        }
    }

    /// Publishes the in-sync followers of `replicas`, sealed with `key`
    /// (the shared lease key), and takes over warm when the previous
    /// leader named this replica.
    pub fn with_replicas(mut self, replicas: Arc<Replicas>, key: LeaseKey) -> Self {
        self.sync = Some((replicas, key));
        self
    }
}

/// The previous leader's horizon by this replica's clock at `now`, from
/// what it published (`read`) and how long this replica has seen that
/// write unchanged: the relative form when present, else (an older
/// version) the leader's own date.
pub fn previous_horizon(
    read: &BTreeMap<String, String>,
    unchanged_for: Duration,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    if let Some(v) = read.get(HORIZON_MS_ANNOTATION) {
        match v.parse::<i64>() {
            Ok(ms) => {
                let seen = now - chrono::Duration::from_std(unchanged_for).unwrap_or_default();
                return Some(seen + chrono::Duration::milliseconds(ms));
            }
            Err(e) => {
                warn!(annotation = HORIZON_MS_ANNOTATION, value = %v, error = %e, "Ignoring an unreadable lease horizon on the leader Lease")
            }
        }
    }
    parse(read.get(HORIZON_ANNOTATION))
}

fn parse(v: Option<&String>) -> Option<DateTime<Utc>> {
    let v = v?;
    match DateTime::parse_from_rfc3339(v) {
        Ok(t) => Some(t.with_timezone(&Utc)),
        Err(e) => {
            warn!(annotation = HORIZON_ANNOTATION, value = %v, error = %e, "Ignoring an unreadable lease horizon on the leader Lease");
            None
        }
    }
}

/// `h` as published at `now`: the date, and the milliseconds after now,
/// rounded up.
fn published(h: DateTime<Utc>, now: DateTime<Utc>) -> [(String, String); 2] {
    let us = (h - now).num_microseconds().unwrap_or(i64::MAX).max(0);
    let ms = us.saturating_add(999) / 1000;
    [
        (
            HORIZON_ANNOTATION.to_string(),
            h.to_rfc3339_opts(SecondsFormat::Millis, true),
        ),
        (HORIZON_MS_ANNOTATION.to_string(), ms.to_string()),
    ]
}

#[async_trait::async_trait]
impl Publisher for Horizon {
    async fn prepare(&self, read: &BTreeMap<String, String>) {
        *lock(&self.loaded) = None;
        let (Some(h), Some(v)) = (&self.handover, read.get(HANDOVER_ANNOTATION)) else {
            return;
        };
        let loaded = match Pointer::parse(v) {
            Ok(None) => return,
            Ok(Some(p)) => h.load(&p).await,
            Err(e) => Err(e),
        };
        match loaded {
            Ok(s) => *lock(&self.loaded) = Some(s),
            Err(e) => {
                warn!(error = %e, "Cannot load the previous leader's hand-over; new grants wait for its recovery window instead")
            }
        }
    }

    fn annotations(
        &self,
        read: &BTreeMap<String, String>,
        taking_over: Option<Duration>,
    ) -> BTreeMap<String, String> {
        let now = self.store.now();
        let ours = read
            .get(HORIZON_ANNOTATION)
            .is_some_and(|v| lock(&self.last).as_ref() == Some(v));
        // Still the value this replica wrote: nobody led in between (a
        // leader grants nothing before its first write), so this store
        // knows every lease and needs no window.
        let mut h = self.store.horizon(self.margin);
        let mut out = BTreeMap::new();
        let mut pending = lock(&self.pending);
        *pending = None;
        if let Some(unchanged_for) = taking_over.filter(|_| !ours) {
            // The window, or the hand-over, starts only once this write
            // wins: a candidate that loses the race keeps serving as it did.
            let previous = previous_horizon(read, unchanged_for, now);
            h = self.store.take_over_horizon(previous, self.margin);
            // A warm copy shortens the window only when the previous
            // leader named this replica in sync: then every lease it
            // confirmed is in the copy. Otherwise leases granted after the
            // last copy are unknown, and a new grant could take their
            // slots (docs/architecture.md, "In-sync followers").
            let warm = self.sync.as_ref().is_some_and(|(r, key)| {
                in_sync(read, key, r.me(), self.store.copied_from().as_deref())
            });
            *pending = Some(match lock(&self.loaded).take() {
                Some(s) => TakeOver::HandOver(Box::new(s), previous),
                None if warm => TakeOver::Warm,
                None => TakeOver::Window(previous),
            });
            // Taken: a later successor must not load it again.
            out.insert(HANDOVER_ANNOTATION.to_string(), String::new());
        }
        *lock(&self.computed) = Some(h);
        out.extend(published(h, now));
        if let Some((r, key)) = &self.sync {
            let (annotations, named) = r.publish(key, pending.is_some());
            out.extend(annotations);
            *lock(&self.named) = Some(named);
        }
        out
    }

    fn written(&self, written: &BTreeMap<String, String>) {
        match lock(&self.pending).take() {
            None => {}
            Some(TakeOver::Window(previous)) => self.open_window(previous),
            Some(TakeOver::Warm) => {
                self.store.take_over_warm();
                let until = self.store.recovering_until();
                info!(known_leases = self.store.active(), window_until = ?until.map(|u| u.to_rfc3339_opts(SecondsFormat::Secs, true)), "Took over with this replica's copy of the previous leader's table, in sync with every lease it confirmed; granting at once");
            }
            Some(TakeOver::HandOver(s, previous)) => {
                self.store.take_over(None);
                match self.store.import(&s) {
                    Ok(()) => {
                        info!(leases = s.leases.len(), sticky_keys = s.sticky.len(), cooldowns = s.global.len() + s.sites.len() + s.site_reports.len(), "Took over the previous leader's leases, cooldowns and sticky keys from its hand-over; granting at once")
                    }
                    Err(e) => {
                        warn!(error = %e, "Cannot take in the previous leader's hand-over; new grants wait for its recovery window instead");
                        self.open_window(previous);
                    }
                }
            }
        }
        if let Some(h) = lock(&self.computed).take() {
            self.store.published(h);
        }
        if let (Some((r, _)), Some(named)) = (&self.sync, lock(&self.named).take()) {
            r.written(&named);
        }
        *lock(&self.last) = written.get(HORIZON_ANNOTATION).cloned();
    }

    fn write_now(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.sync.as_ref().map(|(r, _)| r.write_now())
    }

    async fn releasing(&self) -> BTreeMap<String, String> {
        let Some(h) = &self.handover else {
            return BTreeMap::new();
        };
        self.hand_over(h)
            .await
            .map(|v| BTreeMap::from([(HANDOVER_ANNOTATION.to_string(), v)]))
            .unwrap_or_default()
    }
}

impl Horizon {
    /// Writes the hand-over once the discovery API stopped serving (so
    /// nothing changes the table after), bounded by [`HANDOVER_TIMEOUT`]
    /// and [`HANDOVER_WRITE_TIMEOUT`].
    async fn hand_over(&self, h: &HandOver) -> Option<String> {
        if tokio::time::timeout(HANDOVER_TIMEOUT, h.served.cancelled())
            .await
            .is_err()
        {
            warn!("The discovery API is still serving; writing the lease hand-over anyway");
        }
        match tokio::time::timeout(HANDOVER_WRITE_TIMEOUT, h.write()).await {
            Ok(Ok((value, w))) => {
                info!(
                    leases = w.leases,
                    released = w.released,
                    bytes = w.bytes,
                    secrets = w.chunks,
                    "Wrote the lease table for the next leader"
                );
                Some(value)
            }
            Ok(Err(e)) => {
                warn!(error = %e, "Cannot write the lease hand-over; the next leader waits for the recovery window instead");
                None
            }
            Err(_) => {
                warn!(limit = ?HANDOVER_WRITE_TIMEOUT, "Writing the lease hand-over timed out; the next leader waits for the recovery window instead");
                None
            }
        }
    }

    fn open_window(&self, previous: Option<DateTime<Utc>>) {
        self.store.take_over(previous);
        let leases = self.store.active();
        if let Some(until) = self.store.recovering_until() {
            info!(until = %until.to_rfc3339_opts(SecondsFormat::Secs, true), known_leases = leases, "Recovering the previous leader's leases: new grants wait until then");
        }
    }
}

/// Publishes nothing (the discovery API is off).
pub struct Nothing;

#[async_trait::async_trait]
impl Publisher for Nothing {
    fn annotations(
        &self,
        _: &BTreeMap<String, String>,
        _: Option<Duration>,
    ) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn written(&self, _: &BTreeMap<String, String>) {}
}

#[cfg(test)]
#[path = "horizon_tests.rs"]
mod tests;
