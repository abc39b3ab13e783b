//! The leader's lease horizon on its election Lease: what this replica's
//! lease store may hand out, published at every renew write; on taking
//! over, the previous leader's horizon opens the recovery window
//! (`lease::recovery`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tracing::{info, warn};

use crate::leader::Publisher;
use crate::lease::{LeaseStore, HORIZON_ANNOTATION};

/// Publishes the horizon of `store`, `margin` (two retry periods) past the
/// latest expiry it may hand out before its next write.
pub struct Horizon {
    /// The discovery API's store.
    pub store: Arc<LeaseStore>,
    /// Two retry periods.
    pub margin: Duration,
    /// The value this replica last wrote.
    last: Mutex<Option<String>>,
    /// The previous leader's horizon, while a write that takes the Lease
    /// over is in flight.
    pending: Mutex<Option<Option<DateTime<Utc>>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values: a panic elsewhere cannot leave them half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Horizon {
    /// Publishes `store`'s horizon with `margin`.
    pub fn new(store: Arc<LeaseStore>, margin: Duration) -> Self {
        Horizon {
            store,
            margin,
            last: Mutex::new(None),
            pending: Mutex::new(None),
        }
    }
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

impl Publisher for Horizon {
    fn annotations(
        &self,
        read: &BTreeMap<String, String>,
        taking_over: bool,
    ) -> BTreeMap<String, String> {
        let read = read.get(HORIZON_ANNOTATION);
        let ours = read.is_some() && *lock(&self.last) == read.cloned();
        // Still the value this replica wrote: nobody led in between (a
        // leader grants nothing before its first write), so this store
        // knows every lease and needs no window.
        let mut h = self.store.horizon(self.margin);
        let mut pending = lock(&self.pending);
        *pending = None;
        if taking_over && !ours {
            // The window opens only once this write wins: a candidate
            // that loses the race keeps serving as it did.
            let previous = parse(read);
            h = self.store.take_over_horizon(previous, self.margin);
            *pending = Some(previous);
        }
        BTreeMap::from([(
            HORIZON_ANNOTATION.to_string(),
            h.to_rfc3339_opts(SecondsFormat::Millis, true),
        )])
    }

    fn written(&self, written: &BTreeMap<String, String>) {
        if let Some(previous) = lock(&self.pending).take() {
            self.store.take_over(previous);
            if let Some(until) = self.store.recovering_until() {
                info!(until = %until.to_rfc3339_opts(SecondsFormat::Secs, true), "Recovering the previous leader's leases: new grants wait until then");
            }
        }
        if let Some(h) = parse(written.get(HORIZON_ANNOTATION)) {
            self.store.published(h);
        }
        *lock(&self.last) = written.get(HORIZON_ANNOTATION).cloned();
    }
}

/// Publishes nothing (the discovery API is off).
pub struct Nothing;

impl Publisher for Nothing {
    fn annotations(&self, _: &BTreeMap<String, String>, _: bool) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn written(&self, _: &BTreeMap<String, String>) {}
}

#[cfg(test)]
#[path = "horizon_tests.rs"]
mod tests;
