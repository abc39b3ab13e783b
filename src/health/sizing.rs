//! How many probes the engine keeps in flight: enough for the fleet's
//! probe rate at the latency the probes show (Little's law, doubled for
//! bursts and the slow tail), never fewer than [`MIN_SLOTS`], never more
//! than `--health-workers`, the memory bound (a probe in flight holds a
//! socket, its buffers and, in a TLS handshake, some tens of KiB). Pure.

use std::time::Duration;

/// The pool never shrinks below this: a small fleet still gets its
/// probes of tarpits (that hold a slot a whole timeout) and of good
/// proxies side by side.
pub const MIN_SLOTS: usize = 32;

/// The latency assumed before any probe finished: a cold start sizes the
/// pool for remote proxies rather than for loopback.
const START_MS: f64 = 250.0;

/// Slots for `rate` probes a second taking `latency_ms` each on average,
/// between [`MIN_SLOTS`] (or `max`, when lower) and `max`.
pub fn pool_size(rate: f64, latency_ms: f64, max: usize) -> usize {
    let max = max.max(1);
    let need = (rate.max(0.0) * latency_ms.max(0.0) / 1000.0 * 2.0).ceil();
    // Saturates: f64 to usize casts clamp (NaN to 0).
    let need = need as usize;
    need.max(MIN_SLOTS).min(max)
}

/// The probes' mean latency, as a moving average (each new probe weighs
/// 1/16): a timeout counts its whole duration, which is what it held a
/// slot for.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    mean_ms: f64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { mean_ms: START_MS }
    }
}

impl Latency {
    /// One probe took `d`.
    pub fn observe(&mut self, d: Duration) {
        self.mean_ms += (d.as_secs_f64() * 1000.0 - self.mean_ms) / 16.0;
    }

    /// The mean, in milliseconds.
    pub fn mean_ms(&self) -> f64 {
        self.mean_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_follows_the_fleet_and_its_latency() {
        let cases = [
            // rate/s, latency ms, max, slots
            (0.0, 250.0, 1024, MIN_SLOTS),
            (10.0, 5.0, 1024, MIN_SLOTS),
            // 10,000 proxies a second on loopback (5 ms): 100.
            (10_000.0, 5.0, 1024, 100),
            // Remote proxies at 200 ms: 4,000, held to the memory bound.
            (10_000.0, 200.0, 1024, 1024),
            (2_000.0, 100.0, 1024, 400),
            // A bound lower than the floor wins.
            (10_000.0, 5.0, 4, 4),
            (f64::NAN, 5.0, 64, MIN_SLOTS),
            (1e300, 1e300, 64, 64),
        ];
        for (rate, ms, max, want) in cases {
            assert_eq!(
                pool_size(rate, ms, max),
                want,
                "{rate}/s at {ms} ms, max {max}"
            );
        }
    }

    #[test]
    fn the_mean_moves_towards_what_probes_take() {
        let mut l = Latency::default();
        assert_eq!(l.mean_ms(), START_MS);
        for _ in 0..200 {
            l.observe(Duration::from_millis(4));
        }
        assert!((l.mean_ms() - 4.0).abs() < 0.1, "{}", l.mean_ms());
        // One timeout of 5 s moves it, but not all the way.
        l.observe(Duration::from_secs(5));
        assert!(
            l.mean_ms() > 300.0 && l.mean_ms() < 400.0,
            "{}",
            l.mean_ms()
        );
    }
}
