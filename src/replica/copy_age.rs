//! How old this replica's copy of the leader's lease table is: a follower
//! or a gateway process whose leader stopped answering keeps a copy that
//! ages. Past [`COPY_STALE_AFTER`] the copy says so (a gauge, a `/readyz`
//! detail) and the gateway stops excluding proxies by the exclusive leases
//! in it: a lease it shows may have ended long ago, and a proxy withheld
//! for nothing is a proxy lost to every crawler of the gateway.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a copy is trusted without an answer from the leader: several
/// long polls (one second each, two more to time out).
pub const COPY_STALE_AFTER: Duration = Duration::from_secs(10);

/// Where this replica's copy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyState {
    /// This replica leads: its table is the truth.
    Leading,
    /// No answer from a leader yet.
    None,
    /// The leader last answered this long ago.
    Aged(Duration),
}

/// Whether a copy in state `c` is too old to exclude proxies by.
pub fn stale(c: CopyState) -> bool {
    match c {
        CopyState::Leading => false,
        CopyState::None => true,
        CopyState::Aged(age) => age > COPY_STALE_AFTER,
    }
}

/// The `/readyz` detail of a copy in state `c`, when it is stale.
pub fn detail(c: CopyState) -> Option<String> {
    match c {
        _ if !stale(c) => None,
        CopyState::Aged(age) => Some(format!(
            "the copy of the leader's lease table is {} s old (the leader does not answer): \
             the gateway does not withhold proxies by the leases in it",
            age.as_secs()
        )),
        _ => Some(
            "no copy of the leader's lease table yet: the gateway does not withhold proxies \
             by leases"
                .to_string(),
        ),
    }
}

/// When the leader last answered this replica's copy.
#[derive(Debug, Default)]
pub struct CopyAge(Mutex<Last>);

#[derive(Debug, Default, Clone, Copy)]
enum Last {
    #[default]
    Never,
    Leading,
    At(Instant),
}

impl CopyAge {
    fn set(&self, last: Last) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = last;
    }

    /// The leader answered (a table, a delta, or nothing changed).
    pub fn answered(&self, at: Instant) {
        self.set(Last::At(at));
    }

    /// This replica leads.
    pub fn leading(&self) {
        self.set(Last::Leading);
    }

    /// The copy's state at `now`.
    pub fn at(&self, now: Instant) -> CopyState {
        match *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Last::Never => CopyState::None,
            Last::Leading => CopyState::Leading,
            Last::At(t) => CopyState::Aged(now.saturating_duration_since(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_stale_past_its_bound_and_never_while_leading() {
        let t0 = Instant::now();
        let cases = [
            (Last::Leading, 0, false),
            (Last::Never, 0, true),
            (Last::At(t0), 0, false),
            (Last::At(t0), 10, false),
            (Last::At(t0), 11, true),
        ];
        for (last, secs, want) in cases {
            let age = CopyAge::default();
            age.set(last);
            let c = age.at(t0 + Duration::from_secs(secs));
            assert_eq!(stale(c), want, "{last:?} at +{secs} s");
            assert_eq!(detail(c).is_some(), want, "{last:?} at +{secs} s");
        }
        let old = detail(CopyState::Aged(Duration::from_secs(42))).unwrap();
        assert!(old.contains("42 s old"), "{old}");
    }
}
