//! The election's decisions, pure: what a candidate does with the Lease it
//! read, and what a leader does after a renew attempt. Time is the local
//! monotonic clock only; the holder's `renewTime` is compared for equality,
//! never with this replica's wall clock, so clock skew between replicas
//! cannot make a follower take a live Lease (client-go does the same).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// The election record of a Lease. Its times are the holder's wall clock:
/// only a change of the record tells that the holder is alive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Current holder, if any.
    pub holder: Option<String>,
    /// The holder's last renewal, by its own clock.
    pub renew_time: Option<Timestamp>,
    /// When the holder acquired it, by its own clock.
    pub acquire_time: Option<Timestamp>,
    /// The holder's lease duration.
    pub duration: Option<Duration>,
    /// How often the Lease changed hands.
    pub transitions: Option<i32>,
}

/// A record and the local monotonic instant it was first seen as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// What the Lease said.
    pub record: Record,
    /// When this replica first read the record unchanged since.
    pub at: Instant,
}

/// What to do with the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free, or not renewed for a whole lease duration: take it.
    Acquire,
    /// Someone else holds a live lease.
    Follow {
        /// The leader.
        leader: String,
    },
}

/// The decision of candidate `me` on reading `record` at `now`, given what
/// it saw before (`last`), and what it has seen now. Another holder's
/// Lease counts as expired once `record` has stayed the same for the
/// holder's duration (`default_duration` if it wrote none) of local time.
pub fn decide(
    record: &Record,
    last: Option<&Seen>,
    me: &str,
    now: Instant,
    default_duration: Duration,
) -> (Decision, Seen) {
    let at = match last {
        Some(seen) if seen.record == *record => seen.at,
        _ => now,
    };
    let decision = match record.holder.as_deref() {
        Some(h) if h == me => Decision::Renew,
        Some(h) if !h.is_empty() => {
            let duration = record.duration.unwrap_or(default_duration);
            if now.saturating_duration_since(at) >= duration {
                Decision::Acquire
            } else {
                Decision::Follow {
                    leader: h.to_string(),
                }
            }
        }
        _ => Decision::Acquire,
    };
    let seen = Seen {
        record: record.clone(),
        at,
    };
    (decision, seen)
}

/// How one attempt to acquire or renew ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// We hold the Lease now.
    Held,
    /// Another replica holds it, or our write conflicted.
    Lost,
    /// The request failed or ran out of time.
    Failed,
}

/// Why a leader steps down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepDown {
    /// Another replica holds the Lease (or wrote it before us).
    Lost,
    /// No renewal succeeded within the renew deadline.
    DeadlinePassed,
}

/// What the leader does after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep leading; renew before `deadline`.
    Lead {
        /// When leader-only work must have stopped unless renewed.
        deadline: Instant,
    },
    /// Stop leader-only work now.
    StepDown(StepDown),
}

/// Pure: the leader's step after an attempt that `started` and ended at
/// `now` with `outcome`, while its renew `deadline` was as given. A
/// renewal counts from when its attempt started (the Lease in the API
/// server cannot be older than that), so the leader always stops before a
/// follower, which counts from when it saw the record change, can take
/// over. Once the deadline has passed the leader steps down however the
/// call ended.
pub fn after_attempt(
    outcome: Outcome,
    started: Instant,
    now: Instant,
    deadline: Instant,
    renew_deadline: Duration,
) -> Step {
    if now >= deadline {
        return Step::StepDown(StepDown::DeadlinePassed);
    }
    match outcome {
        Outcome::Held => Step::Lead {
            deadline: started + renew_deadline,
        },
        Outcome::Lost => Step::StepDown(StepDown::Lost),
        Outcome::Failed => Step::Lead { deadline },
    }
}

/// How long the next attempt may take: a leader's is bounded by what is
/// left of its renew deadline, a candidate's by the renew deadline.
pub fn attempt_bound(
    deadline: Option<Instant>,
    now: Instant,
    renew_deadline: Duration,
) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(now),
        None => renew_deadline,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
