//! When the discovery listing is rebuilt (docs/architecture.md, "A
//! listing at rest" and "A listing off the request path"): by a request
//! ([`fresh`]) or by the refresher ([`due`]), from its age and whether the
//! Proxies and credentials it was built from changed. Pure: the clock is
//! the listing's own `Instant`.

use std::time::{Duration, Instant};

/// How long the eligible-proxy listing is reused before it is rebuilt from
/// the cache (the cache itself lags the API server by about as much).
pub const LISTING_MAX_AGE: Duration = Duration::from_millis(250);

/// How long a listing is reused while neither the Proxies nor the
/// credentials changed (what can change without them, a write of this
/// process ceasing to outrank the watch, is caught at this age).
pub const LISTING_UNCHANGED_MAX_AGE: Duration = Duration::from_secs(5);

/// How often a refresher looks whether the listing is stale.
pub const REFRESH_EVERY: Duration = Duration::from_millis(50);

/// How soon after its last build a refresher rebuilds the listing of a
/// source that counted a change: a Proxy turned Ready is offered within
/// about this, and a fleet that keeps changing costs at most ten
/// rebuilds a second.
pub const REFRESH_MIN_AGE: Duration = Duration::from_millis(100);

/// Whether a refresher rebuilds a listing built `at` from `built` while
/// the source is at `now`: a changed source after [`REFRESH_MIN_AGE`],
/// one that counts no changes after [`LISTING_MAX_AGE`], an unchanged one
/// after [`LISTING_UNCHANGED_MAX_AGE`].
pub(super) fn due(at: Instant, built: Option<Stamp>, now: Option<Stamp>) -> bool {
    let age = at.elapsed();
    match now {
        Some(_) if built == now => age >= LISTING_UNCHANGED_MAX_AGE,
        Some(_) => age >= REFRESH_MIN_AGE,
        None => age >= LISTING_MAX_AGE,
    }
}

/// Whether a listing built `at` from `built` may still serve while the
/// source is at `now`: younger than [`LISTING_MAX_AGE`], or built from
/// what the source still holds and younger than
/// [`LISTING_UNCHANGED_MAX_AGE`].
pub(super) fn fresh(at: Instant, built: Option<Stamp>, now: Option<Stamp>) -> bool {
    let unchanged = now.is_some() && built == now;
    at.elapsed() < LISTING_MAX_AGE || (unchanged && at.elapsed() < LISTING_UNCHANGED_MAX_AGE)
}

/// The versions of what a listing is built from: the Proxy source's and
/// the credentials'.
pub(super) type Stamp = (u64, u64);
