//! Until when this replica may answer as the leader. Another replica takes
//! the Lease only once it has seen no renewal for a whole lease duration,
//! and the leader steps down when no renewal succeeded within its renew
//! deadline, which is shorter; but a process paused (SIGSTOP, a frozen VM,
//! a stalled node) past both resumes with its leader-only tasks still
//! believing they lead until its campaign runs again. The fence closes at
//! the renew deadline by the monotonic clock, which runs on while the
//! process is paused: a resumed leader whose deadline passed answers no
//! lease call, whatever its tasks believe, until a renewal opens it again.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// See the module documentation. Cheap to clone; clones share the state.
#[derive(Clone, Debug)]
pub struct Fence(Arc<Mutex<Holds>>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holds {
    /// Without an election: this replica is the only one.
    Always,
    /// Open until then.
    Until(Instant),
    /// Closed: not leading.
    Closed,
}

impl Default for Fence {
    /// Closed until a campaign opens it.
    fn default() -> Self {
        Fence(Arc::new(Mutex::new(Holds::Closed)))
    }
}

impl Fence {
    /// Open for good: a replica without an election.
    pub fn always() -> Self {
        Fence(Arc::new(Mutex::new(Holds::Always)))
    }

    fn set(&self, h: Holds) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// Open until `deadline` (the leader's renew deadline); `None` closes.
    pub fn open_until(&self, deadline: Option<Instant>) {
        self.set(deadline.map_or(Holds::Closed, Holds::Until));
    }

    /// Whether this replica may answer as the leader now.
    pub fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }

    /// Whether it may at `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        match *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Holds::Always => true,
            Holds::Until(d) => now < d,
            Holds::Closed => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_fence_closes_at_the_deadline_whatever_the_tasks_believe() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let f = Fence::default();
        assert!(!f.holds_at(t0), "closed until a campaign opens it");
        f.open_until(Some(t0 + s(3)));
        let seen = f.clone();
        assert!(seen.holds_at(t0 + s(2)), "clones share the state");
        // A pause past the deadline: nothing ran meanwhile.
        assert!(!seen.holds_at(t0 + s(3)), "at the renew deadline");
        assert!(!seen.holds_at(t0 + s(60)), "long past it");
        f.open_until(Some(t0 + s(63)));
        assert!(seen.holds_at(t0 + s(60)), "a renewal opens it again");
        f.open_until(None);
        assert!(!seen.holds_at(t0 + s(60)), "a step-down closes it");
        assert!(
            Fence::always().holds_at(t0 + s(3600)),
            "without an election"
        );
    }
}
