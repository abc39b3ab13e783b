//! The budget of latency-only status writes. Verdicts (a first result, a
//! flip) always reach the status; a healthy proxy whose latency merely
//! moved is written at most once per [`MIN_INTERVAL_MS`], and the whole
//! fleet shares [`PER_SECOND`] such writes a second. Without the shared
//! budget, latency jitter across 10,000 proxies (a busy machine, a slow
//! path) would turn into status patches that grow with the fleet. Pure:
//! the caller passes the time.

/// Shortest time between two latency-only writes of one proxy.
pub const MIN_INTERVAL_MS: u64 = 60_000;
/// Latency-only writes per second across the fleet.
pub const PER_SECOND: f64 = 2.0;
/// Writes that may go at once after a quiet spell.
pub const BURST: f64 = 20.0;

/// A token bucket of latency-only writes.
#[derive(Debug, Clone)]
pub struct LatencyWrites {
    tokens: f64,
    refilled_ms: Option<u64>,
}

impl Default for LatencyWrites {
    fn default() -> Self {
        LatencyWrites {
            tokens: BURST,
            refilled_ms: None,
        }
    }
}

impl LatencyWrites {
    /// Whether a latency-only write of a proxy last written at
    /// `last_write_ms` may go at `now_ms`; takes a token when it may.
    pub fn allow(&mut self, last_write_ms: Option<u64>, now_ms: u64) -> bool {
        if last_write_ms.is_some_and(|t| now_ms < t.saturating_add(MIN_INTERVAL_MS)) {
            return false;
        }
        let since = self.refilled_ms.map_or(0, |t| now_ms.saturating_sub(t));
        self.refilled_ms = Some(now_ms);
        self.tokens = (self.tokens + since as f64 / 1000.0 * PER_SECOND).min(BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_write_per_proxy_per_interval() {
        struct Case {
            name: &'static str,
            last: Option<u64>,
            now: u64,
            allowed: bool,
        }
        let cases = [
            Case {
                name: "never written",
                last: None,
                now: 5,
                allowed: true,
            },
            Case {
                name: "written a second ago",
                last: Some(MIN_INTERVAL_MS),
                now: MIN_INTERVAL_MS + 1_000,
                allowed: false,
            },
            Case {
                name: "written one interval ago",
                last: Some(1_000),
                now: 1_000 + MIN_INTERVAL_MS,
                allowed: true,
            },
        ];
        for c in cases {
            let mut b = LatencyWrites::default();
            assert_eq!(b.allow(c.last, c.now), c.allowed, "{}", c.name);
        }
    }

    #[test]
    fn the_fleet_shares_a_bucket() {
        let mut b = LatencyWrites::default();
        let now = 10 * MIN_INTERVAL_MS;
        // A burst, then nothing until the bucket refills.
        let burst = (0..100).filter(|_| b.allow(None, now)).count();
        assert_eq!(burst, BURST as usize);
        assert!(!b.allow(None, now + 100));
        // Ten seconds later: ten seconds' worth.
        let later = (0..100).filter(|_| b.allow(None, now + 10_000)).count();
        assert_eq!(later, (10.0 * PER_SECOND) as usize);
    }
}
