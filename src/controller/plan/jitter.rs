//! Jitter for every requeue delay, so Proxies that failed or were created
//! together do not come back in lockstep. The spread is taken off the
//! delay, never added, so a documented delay is also its upper bound;
//! only a held create's next try ([`End::NotBefore`]) is spread after
//! it, since coming back before it would only be told to wait again.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use super::end::End;

/// The share of a delay that jitter may take off.
pub const JITTER_SHARE: f64 = 0.2;

/// A source of numbers in `[0, 1)`: the system's in the operator, a fixed
/// one in tests.
pub trait Random: Send + Sync {
    /// The next number in `[0, 1)`.
    fn unit(&self) -> f64;
}

/// Always the same number: deterministic jitter for tests.
#[derive(Clone, Copy, Debug)]
pub struct Fixed(pub f64);

impl Random for Fixed {
    fn unit(&self) -> f64 {
        self.0
    }
}

/// Numbers from the process's randomly keyed hasher: each call builds a
/// freshly keyed one, which is plenty for spreading requeues and needs no
/// generator state or dependency.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemRandom;

impl Random for SystemRandom {
    fn unit(&self) -> f64 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0);
        // The top 53 bits make an exact f64 in [0, 1).
        (h.finish() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `delay` less up to [`JITTER_SHARE`] of it, by `unit` (clamped to
/// `[0, 1]`; anything else counts as 0).
pub fn jitter(delay: Duration, unit: f64) -> Duration {
    let u = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // Whole nanoseconds off, rounded down, so equal inputs give equal
    // delays on every platform.
    let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
    let off = (nanos as f64 * JITTER_SHARE * u).floor() as u64;
    delay.saturating_sub(Duration::from_nanos(off))
}

/// An ending with its delay jittered.
pub fn jittered(end: End, unit: f64) -> End {
    match end {
        End::AwaitChange => End::AwaitChange,
        End::RequeueAfter(d) => End::RequeueAfter(jitter(d, unit)),
        End::NotBefore(d) => {
            End::RequeueAfter(crate::controller::throttle::limiter::spread_after(d, unit))
        }
    }
}

#[cfg(test)]
#[path = "jitter_tests.rs"]
mod tests;
