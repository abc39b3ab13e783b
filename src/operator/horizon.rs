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
    pub last: Mutex<Option<String>>,
}

impl Horizon {
    /// Publishes `store`'s horizon with `margin`.
    pub fn new(store: Arc<LeaseStore>, margin: Duration) -> Self {
        Horizon {
            store,
            margin,
            last: Mutex::new(None),
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
        let ours =
            read.is_some() && *self.last.lock().unwrap_or_else(|p| p.into_inner()) == read.cloned();
        // Still the value this replica wrote: nobody led in between (a
        // leader grants nothing before its first write), so this store
        // knows every lease and needs no window.
        if taking_over && !ours {
            let previous = parse(read);
            self.store.take_over(previous);
            if let Some(until) = self.store.recovering_until() {
                info!(until = %until.to_rfc3339_opts(SecondsFormat::Secs, true), "Recovering the previous leader's leases: new grants wait until then");
            }
        }
        let h = self.store.horizon(self.margin);
        BTreeMap::from([(
            HORIZON_ANNOTATION.to_string(),
            h.to_rfc3339_opts(SecondsFormat::Millis, true),
        )])
    }

    fn written(&self, written: &BTreeMap<String, String>) {
        if let Some(h) = parse(written.get(HORIZON_ANNOTATION)) {
            self.store.published(h);
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
            written.get(HORIZON_ANNOTATION).cloned();
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
