//! The statuses the last passes wrote, by Proxy UID, kept only until the
//! controller's cache shows them ([`plan::written`](super::plan::written)
//! decides which status a pass starts from).

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};

use super::plan::written::{base, Base, TRUST_READ_AFTER};
use crate::api::ProxyStatus;

/// The last written status of each Proxy the cache may not show yet.
#[derive(Debug, Default)]
pub struct Written(Mutex<HashMap<String, (ProxyStatus, DateTime<Utc>)>>);

impl Written {
    /// The status a pass of `uid` starts from: `read`, or the last write
    /// when the cache has not caught up with it. A write the read shows
    /// (or one given up on) is forgotten.
    pub fn base(&self, uid: &str, read: ProxyStatus, now: DateTime<Utc>) -> ProxyStatus {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let written = all.get(uid).map(|(s, at)| (s, *at));
        match base(&read, written, now) {
            Base::Written => all.get(uid).map(|(s, _)| s.clone()).unwrap_or(read),
            Base::Read => {
                all.remove(uid);
                read
            }
        }
    }

    /// A pass of `uid` wrote `status` at `now`. Writes older than
    /// [`TRUST_READ_AFTER`] are dropped here, so Proxies that went away
    /// leave nothing behind.
    pub fn wrote(&self, uid: &str, status: &ProxyStatus, now: DateTime<Utc>) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let since = now - TimeDelta::from_std(TRUST_READ_AFTER).unwrap_or(TimeDelta::MAX);
        all.retain(|_, (_, at)| *at > since);
        all.insert(uid.to_string(), (status.clone(), now));
    }
}
