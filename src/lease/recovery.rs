//! The recovery window of a new leader. It cannot know the leases nobody
//! has presented yet, so it grants nothing new until the latest expiry the
//! previous leader may have handed out: the horizon that leader published
//! on its coordination Lease. A leader never hands out an expiry past the
//! horizon it last published (it clamps), so the horizon a successor reads
//! always covers every live lease (docs/architecture.md).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::bounds::later;
use super::{AcquireError, LeaseStore, ProxyKey};

/// The annotation on the leader-election Lease that carries the horizon,
/// RFC 3339 with milliseconds.
pub const HORIZON_ANNOTATION: &str = "crawl.example.com/lease-horizon";

/// Until when a proxy's leases are held, as far as a store knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldUntil {
    /// The latest end of its live leases (`None`: none held).
    Known(Option<DateTime<Utc>>),
    /// A recovery window runs: leases this store never saw may be held.
    Unknown,
}

/// What the store knows about horizons.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    /// New grants wait until then (the previous leader's horizon).
    until: Option<DateTime<Utc>>,
    /// Set once this store leads with an election: expiries are then
    /// bounded by `published`.
    bounded: bool,
    /// The horizon last written to the Lease.
    published: Option<DateTime<Utc>>,
    /// The longest TTL asked for recently (grants and renewals) and when:
    /// it counts for as long as a lease of that TTL could run.
    longest: Option<(Duration, DateTime<Utc>)>,
}

/// The horizon to publish at `now`: every expiry handed out so far
/// (`latest_end`), any a grant of up to `longest` may hand out before the
/// next write, and the window still running, plus `margin` (two retry
/// periods: a write may come late by one and land one later).
pub fn horizon(
    now: DateTime<Utc>,
    latest_end: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    longest: Duration,
    margin: Duration,
) -> DateTime<Utc> {
    let covered = [latest_end, until, Some(later(now, longest))]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(now);
    later(covered, margin)
}

/// The end of the window of a leader taking over at `now` from one that
/// published `previous`: no window without a horizon (first start) or once
/// it passed, and never longer than `max_ttl` (no lease granted before the
/// take-over can end later than that).
pub fn window_end(
    now: DateTime<Utc>,
    previous: Option<DateTime<Utc>>,
    max_ttl: Duration,
) -> Option<DateTime<Utc>> {
    previous
        .filter(|h| *h > now)
        .map(|h| h.min(later(now, max_ttl)))
}

/// Whether a new lease may be granted at `now`, and until when it may run
/// when asked to end at `wanted`: `Err(wait)` inside the window, or when
/// the published horizon leaves less than a second; otherwise `wanted`
/// clamped to the published horizon when bounded.
pub fn grant_end(
    now: DateTime<Utc>,
    wanted: DateTime<Utc>,
    until: Option<DateTime<Utc>>,
    bounded: bool,
    published: Option<DateTime<Utc>>,
) -> Result<DateTime<Utc>, Duration> {
    if let Some(u) = until.filter(|u| *u > now) {
        return Err(ceil_secs(u - now));
    }
    if !bounded {
        return Ok(wanted);
    }
    match published {
        Some(h) if h - now >= chrono::TimeDelta::seconds(1) => Ok(wanted.min(h)),
        // Nothing published yet, or the horizon is about to pass (the
        // leader cannot write): the next write comes within a retry period.
        _ => Err(Duration::from_secs(1)),
    }
}

/// Whole seconds, rounded up, at least one.
fn ceil_secs(d: chrono::TimeDelta) -> Duration {
    let ms = u64::try_from(d.num_milliseconds()).unwrap_or(0);
    Duration::from_secs(ms.div_ceil(1000).max(1))
}

impl Recovery {
    /// The longest TTL asked for within its own length before `now`.
    fn recent(&self, now: DateTime<Utc>) -> Duration {
        match self.longest {
            Some((ttl, at)) if later(at, ttl) > now => ttl,
            _ => Duration::ZERO,
        }
    }

    /// Counts `ttl`, granted at `now`, for as long as a lease of it could
    /// run. Only a granted TTL counts: one asked for and refused never
    /// stretches the next leader's window.
    pub(super) fn note(&mut self, now: DateTime<Utc>, ttl: Duration) {
        if ttl >= self.recent(now) {
            self.longest = Some((ttl, now));
        }
    }

    /// Milliseconds left of the window, if one runs.
    pub(super) fn window_left(&self, now: DateTime<Utc>) -> Option<u64> {
        let left = (self.until? - now).num_milliseconds();
        u64::try_from(left).ok().filter(|l| *l > 0)
    }

    /// No window (a copy brings the leader's).
    pub(super) fn clear_window(&mut self) {
        self.until = None;
    }

    /// Grants wait until `end` at least (an imported window).
    pub(super) fn extend_window(&mut self, end: DateTime<Utc>) {
        self.until = self.until.max(Some(end));
    }

    /// The longest TTL counted and the milliseconds left of its count.
    pub(super) fn longest_left(&self, now: DateTime<Utc>) -> Option<(u64, u64)> {
        let (ttl, at) = self.longest?;
        let left = (later(at, ttl) - now).num_milliseconds();
        let left = u64::try_from(left).ok().filter(|l| *l > 0)?;
        Some((u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX), left))
    }

    /// Counts `ttl` for `left_ms` more (a hand-over's count).
    pub(super) fn count_longest(&mut self, now: DateTime<Utc>, ttl: Duration, left_ms: u64) {
        if ttl < self.recent(now) {
            return;
        }
        let left = chrono::Duration::milliseconds(i64::try_from(left_ms).unwrap_or(i64::MAX));
        let ttl_c = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX);
        let at = now
            .checked_add_signed(left)
            .and_then(|end| end.checked_sub_signed(ttl_c))
            .unwrap_or(now);
        self.longest = Some((ttl, at));
    }

    /// The end of a lease granted at `now` for `ttl`, or how long to wait;
    /// the TTL is counted only once the grant is made ([`Self::note`]).
    pub(super) fn grant(
        &mut self,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<DateTime<Utc>, AcquireError> {
        grant_end(
            now,
            later(now, ttl),
            self.until,
            self.bounded,
            self.published,
        )
        .map_err(|wait| AcquireError::Recovering { wait })
    }

    /// The end of a lease renewed at `now` for `ttl` that ended at `old`:
    /// clamped to the published horizon, never earlier than it was.
    pub(super) fn renewal(
        &mut self,
        now: DateTime<Utc>,
        ttl: Duration,
        old: DateTime<Utc>,
    ) -> DateTime<Utc> {
        self.note(now, ttl);
        let wanted = later(now, ttl);
        match (self.bounded, self.published) {
            (false, _) => wanted,
            (true, Some(h)) => wanted.min(h).max(old),
            (true, None) => old,
        }
    }
}

impl LeaseStore {
    /// This replica now leads, taking over from one that published
    /// `previous` (`None`: no horizon on the Lease, e.g. a first start).
    /// Grants wait for the window; expiries stay within what is published.
    pub fn take_over(&self, previous: Option<DateTime<Utc>>) {
        let now = self.clock.now();
        let mut st = self.lock();
        self.term.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *self.copied.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let r = &mut st.recovery;
        r.until = window_end(now, previous, self.config.max_ttl);
        r.bounded = true;
        r.published = None;
        // Crawlers that ask for no TTL get the default: count it from the
        // start, so their first leases are not clamped short.
        r.longest = Some((self.config.default_ttl, now));
    }

    /// This replica now leads, and its warm copy of the previous leader's
    /// table holds every lease that leader confirmed (the replicas it
    /// published as in sync, `replica::members`): grants start at once,
    /// unless the copy brought that leader's own window.
    pub fn take_over_warm(&self) {
        let now = self.clock.now();
        let mut st = self.lock();
        self.term.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *self.copied.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let r = &mut st.recovery;
        r.until = r.until.filter(|u| *u > now);
        r.bounded = true;
        r.published = None;
        r.longest = r.longest.max(Some((self.config.default_ttl, now)));
    }

    /// The horizon to publish now, `margin` past the latest expiry this
    /// store may hand out before its next write: a grant of the default
    /// TTL can come at any moment (without it counted, a horizon less than
    /// a second ahead would refuse every grant, and nothing would ever be
    /// granted to count), a longer TTL once one was granted.
    pub fn horizon(&self, margin: Duration) -> DateTime<Utc> {
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let latest = st.latest_end();
        let r = &st.recovery;
        let longest = r
            .recent(now)
            .max(self.config.default_ttl)
            .min(self.config.max_ttl);
        horizon(now, latest, r.until, longest, margin)
    }

    /// The horizon to publish with the write that takes over from a
    /// leader that published `previous`: what [`Self::horizon`] will say
    /// once [`Self::take_over`] ran (the window and the default TTL
    /// counted), so the leases renewed right after the take-over are not
    /// cut short.
    pub fn take_over_horizon(
        &self,
        previous: Option<DateTime<Utc>>,
        margin: Duration,
    ) -> DateTime<Utc> {
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let latest = st.latest_end();
        let until = window_end(now, previous, self.config.max_ttl);
        let longest = st
            .recovery
            .recent(now)
            .max(self.config.default_ttl)
            .min(self.config.max_ttl);
        horizon(now, latest, until, longest, margin)
    }

    /// `h` is on the Lease now: expiries up to it may be handed out.
    pub fn published(&self, h: DateTime<Utc>) {
        self.lock().recovery.published = Some(h);
    }

    /// Until when leases are held on `proxy`: known when no recovery
    /// window runs (during one, leases a previous leader granted may still
    /// be presented). A draining proxy's drain ends with it
    /// (`fleet::drain`).
    pub fn held_until(&self, proxy: &ProxyKey) -> HeldUntil {
        let now = self.clock.now();
        let mut st = self.lock();
        if st.recovery.until.is_some_and(|u| u > now) {
            return HeldUntil::Unknown;
        }
        st.expire_leases(now);
        HeldUntil::Known(st.proxies.get(proxy).and_then(|p| p.ends.last()))
    }

    /// When new grants may start, while the window runs.
    pub fn recovering_until(&self) -> Option<DateTime<Utc>> {
        let now = self.clock.now();
        self.lock().recovery.until.filter(|u| *u > now)
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
