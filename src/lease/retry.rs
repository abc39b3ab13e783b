//! When a refused acquire is worth asking again: the `Retry-After` of a
//! 409, so crawlers wait as long as the refusal will last instead of
//! polling.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::index::Listed;
#[cfg(test)]
use super::Lease;
use super::{AcquireError, Candidates, LeaseStore, ProxyKey};

/// The hint when no lease end bounds the wait: no healthy proxy matches
/// (one may pass its probes any second), or only cooldowns block.
pub const RETRY_DEFAULT: Duration = Duration::from_secs(5);
/// The longest hint: past it a crawler should look again anyway.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait until the first of `leases` (in order of their end) that
/// `frees` says would make room ends: whole seconds, rounded up, between
/// 1 s and [`RETRY_MAX`]; [`RETRY_DEFAULT`] when none would.
#[cfg(test)] // the store asks its indexes for the end ([`wait_until`])
pub fn retry_hint<'a>(
    now: DateTime<Utc>,
    mut leases: impl Iterator<Item = &'a Lease>,
    frees: impl Fn(&Lease) -> bool,
) -> Duration {
    wait_until(now, leases.find(|l| frees(l)).map(|l| l.expires_at))
}

/// The wait until `end`: whole seconds, rounded up, between 1 s and
/// [`RETRY_MAX`]; [`RETRY_DEFAULT`] without an end.
pub fn wait_until(now: DateTime<Utc>, end: Option<DateTime<Utc>>) -> Duration {
    let Some(end) = end else {
        return RETRY_DEFAULT;
    };
    let ms = end.signed_duration_since(now).num_milliseconds().max(0);
    let secs = u64::try_from(ms).unwrap_or(0).div_ceil(1000);
    Duration::from_secs(secs).clamp(Duration::from_secs(1), RETRY_MAX)
}

impl LeaseStore {
    /// How long the caller refused with `e` for the proxies `eligible` as
    /// `client` should wait: until a lease on one of them ends (no
    /// capacity), or one of its own ends (client limit).
    pub fn retry_after<K: std::borrow::Borrow<ProxyKey>>(
        &self,
        eligible: &[K],
        client: &str,
        e: &AcquireError,
    ) -> Duration {
        let set = Listed(eligible.iter().map(|k| k.borrow()).collect());
        self.retry_after_among(&set, client, e)
    }

    /// [`LeaseStore::retry_after`] for the candidates `c` of
    /// [`LeaseStore::acquire_among`]: from the indexes, O(log n) plus the
    /// proxies skipped (or O(candidates) when they are few), never a walk
    /// over the leases.
    pub fn retry_after_among(
        &self,
        c: &dyn Candidates,
        client: &str,
        e: &AcquireError,
    ) -> Duration {
        let now = self.clock.now();
        let st = self.lock();
        match e {
            AcquireError::NoProxy => RETRY_DEFAULT,
            AcquireError::NoCapacity { .. } => wait_until(now, st.soonest_end(c)),
            AcquireError::ClientLimit { .. } => wait_until(now, st.clients.first_end(client)),
            AcquireError::Recovering { wait } => *wait,
            AcquireError::TableFull { .. } => {
                let lease = st.ends.first().map(|(end, _)| *end);
                let first = lease.into_iter().chain(st.released.first_end()).min();
                wait_until(now, first.map(super::state::at))
            }
        }
    }
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
