//! The per-provider circuit breaker: when more than `threshold_percent` of
//! the proxies that were Ready within `window` have turned unhealthy or
//! disappeared within it, the provider's fleet is failing as a whole (an
//! outage, a bad image, a network cut), and replacing or recycling would
//! only amplify it. While open, nothing on the provider is replaced or
//! recycled; what exists is kept.
//!
//! A state machine fed by observations of the provider's Proxies
//! ([`Breaker::observe`]); it keeps, per proxy, when it was last seen Ready
//! and when it was lost (went from Ready to not Ready, or vanished). It
//! trips only with at least `min_fleet` proxies Ready within the window, so
//! 1 of 1 or 2 of 2 failing is an ordinary replace, not an outage.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Default share of lost proxies that opens the breaker (more than this).
pub const DEFAULT_THRESHOLD_PERCENT: u32 = 50;
/// Default window over which losses are counted.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);
/// Default fewest proxies Ready within the window for the breaker to trip.
pub const DEFAULT_MIN_FLEET: usize = 3;

/// When the breaker opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Opens when lost / Ready-in-window exceeds this percent.
    pub threshold_percent: u32,
    /// How far back a Ready sighting or a loss counts.
    pub window: Duration,
    /// Fewest proxies Ready within the window for it to trip.
    pub min_fleet: usize,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            threshold_percent: DEFAULT_THRESHOLD_PERCENT,
            window: DEFAULT_WINDOW,
            min_fleet: DEFAULT_MIN_FLEET,
        }
    }
}

/// One Proxy of the provider as observed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its namespace/name.
    pub key: String,
    /// Whether it is Ready (its probes pass).
    pub ready: bool,
    /// Shown Ready, but its instance is stopped or gone and being
    /// replaced: Ready until now, lost now.
    pub replacing: bool,
}

impl Member {
    /// A member called `key`.
    pub fn new(key: impl Into<String>, ready: bool) -> Self {
        Member {
            key: key.into(),
            ready,
            replacing: false,
        }
    }

    /// A member shown Ready whose instance is being replaced.
    pub fn replacing(key: impl Into<String>) -> Self {
        Member {
            key: key.into(),
            ready: false,
            replacing: true,
        }
    }
}

/// What an observation changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// The breaker opened: `lost` of `seen` Ready proxies were lost.
    Opened {
        /// Proxies lost within the window.
        lost: usize,
        /// Proxies Ready within the window.
        seen: usize,
    },
    /// The share fell back to the threshold or below.
    Closed,
    /// An operator reset it; losses before the reset are forgotten.
    Reset,
}

/// What a breaker says about itself, for the ProviderHealth status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// When it opened, while open.
    pub open_since: Option<DateTime<Utc>>,
    /// Proxies lost within the window (or since it opened).
    pub lost: usize,
    /// Proxies Ready within the window.
    pub seen: usize,
    /// The policy it trips by.
    pub policy: BreakerPolicy,
}

impl Report {
    /// A closed breaker of `policy` that has seen nothing.
    pub fn closed(policy: BreakerPolicy) -> Self {
        Report {
            open_since: None,
            lost: 0,
            seen: 0,
            policy,
        }
    }
}

/// Per-proxy memory: last seen Ready, and when it was lost since.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Track {
    last_ready: Option<DateTime<Utc>>,
    lost_at: Option<DateTime<Utc>>,
}

/// The breaker of one provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Breaker {
    policy: BreakerPolicy,
    tracks: BTreeMap<String, Track>,
    opened_at: Option<DateTime<Utc>>,
}

impl Breaker {
    /// A closed breaker with no history.
    pub fn new(policy: BreakerPolicy) -> Self {
        Breaker {
            policy,
            tracks: BTreeMap::new(),
            opened_at: None,
        }
    }

    /// Whether it is open (replacing and recycling blocked).
    pub fn is_open(&self) -> bool {
        self.opened_at.is_some()
    }

    /// When it opened, while open.
    pub fn opened_at(&self) -> Option<DateTime<Utc>> {
        self.opened_at
    }

    /// Its state and share now.
    pub fn report(&self) -> Report {
        let (lost, seen) = self.share();
        Report {
            open_since: self.opened_at,
            lost,
            seen,
            policy: self.policy,
        }
    }

    /// (lost, seen): proxies lost within the window (or since it opened),
    /// of those Ready within it.
    pub fn share(&self) -> (usize, usize) {
        let seen = self
            .tracks
            .values()
            .filter(|t| t.last_ready.is_some())
            .count();
        let lost = self.tracks.values().filter(|t| t.lost_at.is_some()).count();
        (lost, seen)
    }

    /// Folds in the provider's Proxies as observed at `now` and reports a
    /// transition, if any. A Proxy absent from `members` was deleted and is
    /// forgotten; an instance that vanished shows as a Proxy not Ready.
    pub fn observe(&mut self, now: DateTime<Utc>, members: &[Member]) -> Option<Transition> {
        let mut present = BTreeMap::new();
        for m in members {
            present.insert(m.key.as_str(), m);
        }
        self.tracks
            .retain(|key, _| present.contains_key(key.as_str()));
        for (key, m) in &present {
            let t = self.tracks.entry((*key).to_string()).or_default();
            if m.replacing {
                // Counted even when no earlier view saw it Ready: it was
                // Ready up to this replace.
                if t.lost_at.is_none() {
                    t.last_ready = Some(now);
                    t.lost_at = Some(now);
                }
            } else if m.ready {
                t.last_ready = Some(now);
                t.lost_at = None;
            } else if t.last_ready.is_some() && t.lost_at.is_none() {
                t.lost_at = Some(now);
            }
        }
        if !self.is_open() {
            self.expire_before(self.window_start(now));
        }
        self.evaluate(now)
    }

    /// An operator's reset: closes the breaker and forgets every loss so
    /// far; proxies lost before it no longer count.
    pub fn reset(&mut self) -> Option<Transition> {
        for t in self.tracks.values_mut() {
            if t.lost_at.is_some() {
                t.lost_at = None;
                t.last_ready = None;
            }
        }
        self.opened_at.take().map(|_| Transition::Reset)
    }

    fn evaluate(&mut self, now: DateTime<Utc>) -> Option<Transition> {
        let (lost, seen) = self.share();
        let over = seen >= self.policy.min_fleet
            && lost * 100 > self.policy.threshold_percent as usize * seen;
        match (self.is_open(), over) {
            (false, true) => {
                self.opened_at = Some(now);
                Some(Transition::Opened { lost, seen })
            }
            (true, false) => {
                self.opened_at = None;
                Some(Transition::Closed)
            }
            _ => None,
        }
    }

    fn window_start(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let w = chrono::Duration::from_std(self.policy.window).unwrap_or(chrono::Duration::MAX);
        now.checked_sub_signed(w)
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// Losses older than the window no longer count (the proxy counts
    /// again once it is Ready again). Not while open: then only a proxy
    /// coming back, a deleted Proxy or a reset lowers the share, so the
    /// breaker does not close just because the outage lasted long.
    fn expire_before(&mut self, since: DateTime<Utc>) {
        for t in self.tracks.values_mut() {
            if t.lost_at.is_some_and(|l| l < since) {
                t.lost_at = None;
                t.last_ready = None;
            }
        }
    }
}

#[cfg(test)]
#[path = "breaker_tests.rs"]
mod tests;
