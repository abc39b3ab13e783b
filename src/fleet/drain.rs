//! Drain before replace: a Proxy chosen for recycling first stops getting
//! new leases; the leases it holds run to their expiry or to the drain
//! timeout, whichever comes first; only then is its instance replaced.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What a draining Proxy does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// Not draining yet: record `Draining` with the start time now.
    Start,
    /// Leases are still held: come back at `until` (the last expiry or the
    /// timeout, whichever is sooner) or when a lease ends.
    Wait {
        /// When the drain ends at the latest.
        until: DateTime<Utc>,
    },
    /// Replace the instance now.
    Replace(DrainDone),
}

/// Why a drain is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainDone {
    /// No lease is held on the proxy.
    NoLeases,
    /// Every lease held when the drain began has run out (leases of a
    /// draining proxy cannot be renewed).
    LeasesExpired,
    /// The drain timeout passed with leases possibly still held.
    TimedOut,
}

/// What the drain decision looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainInput {
    /// When the drain began (status), `None` if not yet.
    pub draining_since: Option<DateTime<Utc>>,
    /// The latest time a lease held on the proxy can run to; `None` when
    /// none is held. Where the holders are not known (leases live in every
    /// replica's memory), it is [`unseen_leases_end`]: a draining proxy's
    /// leases are not renewed once the replicas see the drain.
    pub leases_end: Option<DateTime<Utc>>,
    /// `spec.recycle.drainTimeout`.
    pub timeout: Duration,
    /// Now.
    pub now: DateTime<Utc>,
}

/// How long after a drain begins a replica's discovery API may still grant
/// or renew a lease on the proxy: `drainingSince` reaches each replica's
/// Proxy cache only once the status write has landed and its watch has
/// delivered it.
pub const DRAIN_NOTICE: Duration = Duration::from_secs(5);

/// The latest end of a lease on a proxy draining since `since` when its
/// holders are unknown (leases live in every replica's memory): a lease
/// granted or renewed before the replicas noticed the drain runs at most
/// `longest_ttl` from then, and none is renewed after.
pub fn unseen_leases_end(
    since: Option<DateTime<Utc>>,
    longest_ttl: Duration,
) -> Option<DateTime<Utc>> {
    let reach = chrono::Duration::from_std(longest_ttl.saturating_add(DRAIN_NOTICE))
        .unwrap_or(chrono::Duration::MAX);
    since.map(|t| {
        t.checked_add_signed(reach)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    })
}

/// The latest end of a lease on a proxy draining since `since`, from the
/// leader's lease table when it knows every lease (`held`: the latest end
/// of those on the proxy): every lease call goes to the leader, so once
/// the replicas have seen the drain ([`DRAIN_NOTICE`]) no lease is granted
/// or renewed on it and the table's is final. Without a known table, the
/// bound of [`unseen_leases_end`].
pub fn leases_end(
    since: Option<DateTime<Utc>>,
    held: crate::lease::HeldUntil,
    longest_ttl: Duration,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let crate::lease::HeldUntil::Known(end) = held else {
        return unseen_leases_end(since, longest_ttl);
    };
    let notice = unseen_leases_end(since, Duration::ZERO)?;
    match end {
        None if now >= notice => None,
        end => Some(end.map_or(notice, |e| e.max(notice))),
    }
}

/// The next step of a drain.
pub fn next_drain_step(input: &DrainInput) -> DrainStep {
    let Some(since) = input.draining_since else {
        return DrainStep::Start;
    };
    let Some(leases_end) = input.leases_end else {
        return DrainStep::Replace(DrainDone::NoLeases);
    };
    let timeout = chrono::Duration::from_std(input.timeout).unwrap_or(chrono::Duration::MAX);
    let deadline = since
        .checked_add_signed(timeout)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if leases_end <= input.now && leases_end <= deadline {
        return DrainStep::Replace(DrainDone::LeasesExpired);
    }
    if input.now >= deadline {
        return DrainStep::Replace(DrainDone::TimedOut);
    }
    DrainStep::Wait {
        until: leases_end.min(deadline),
    }
}

#[cfg(test)]
#[path = "drain_tests.rs"]
mod tests;
