//! Whether a create may go to its provider now: the provider's token
//! bucket (`createsPerMinute`) and its cap on creates in flight
//! (`maxCreatesInFlight`). Pure: the shell keeps one [`CreateLimiter`] per
//! provider, shared by every reconcile, and asks it with the clock.
//!
//! The bucket is kept as a generic cell rate algorithm: one instant, the
//! time at which the bucket would be full again, instead of a token count
//! refilled by a timer. A create that finds no token is not just refused:
//! its Proxy gets the next free slot (a reservation under its key, booked
//! on a second clock of the same rate) and is told when it comes; so N
//! Proxies applied at once each come back about once, at their own slot,
//! instead of all retrying for every new token. The bucket itself is
//! advanced only by the creates it lets go, so the rate holds for the
//! creates however late a Proxy comes back.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};

use crate::api::proxy::conditions::{REASON_CREATE_THROTTLED, REASON_INSTANCE_LIMIT};
use crate::api::ProxyStatus;
use crate::config::CreateLimits;
use crate::controller::plan::status;

/// How often a create held back by the in-flight cap asks again: an
/// in-flight create ends, at the soonest, at its instance's next
/// provisioning poll.
pub const IN_FLIGHT_RETRY: Duration = Duration::from_secs(10);
/// A create counts as in flight for at most this long: an entry whose
/// Proxy never came back (deleted, or its pass failed) stops holding
/// others back.
pub const IN_FLIGHT_EXPIRY: Duration = Duration::from_secs(30 * 60);
/// A reservation whose slot passed this long ago without its Proxy coming
/// back is dropped (its token is spent).
pub const RESERVATION_EXPIRY: Duration = Duration::from_secs(10 * 60);
/// The most a held create's requeue is spread beyond its slot.
pub const MAX_SPREAD: Duration = Duration::from_secs(5);

/// What holds a create back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// No token: the provider's `createsPerMinute`.
    Rate,
    /// The provider's `maxCreatesInFlight` creates are in flight.
    InFlight,
}

impl Hold {
    /// The bounded `reason` label of the throttle counter.
    pub fn metric_label(self) -> &'static str {
        match self {
            Hold::Rate => "rate",
            Hold::InFlight => "in_flight",
        }
    }
}

/// The answer to "may this create go now?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Yes: a token was taken and the create counts as in flight.
    Go,
    /// Not before `until`.
    Wait {
        /// When to ask again.
        until: DateTime<Utc>,
        /// Why.
        hold: Hold,
    },
}

/// What the limiter holds at a moment, for the gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gauges {
    /// Tokens a create could take now (0 to the burst).
    pub tokens: u32,
    /// Creates in flight.
    pub in_flight: u32,
    /// Proxies holding a reservation for a later slot.
    pub waiting: u32,
}

/// One provider's bucket, reservations and creates in flight.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateLimiter {
    /// When the bucket would be full again (`None`: it is full): advanced
    /// by every create let go, so the creates themselves keep the rate,
    /// however late a Proxy comes back for its slot.
    full_at: Option<DateTime<Utc>>,
    /// The same for the slots handed out: where the queue of waiting
    /// Proxies ends.
    booked_to: Option<DateTime<Utc>>,
    /// Slots handed out, by Proxy key.
    reservations: BTreeMap<String, DateTime<Utc>>,
    /// Creates in flight, by Proxy key, with when they were let go.
    in_flight: BTreeMap<String, DateTime<Utc>>,
}

/// The time one token takes to come back, rounded up so that the rate is
/// never above the configured one.
fn interval(limits: &CreateLimits) -> TimeDelta {
    let per_minute = u64::from(limits.creates_per_minute.max(1));
    let nanos = 60_000_000_000u64.div_ceil(per_minute);
    TimeDelta::nanoseconds(i64::try_from(nanos).unwrap_or(i64::MAX))
}

/// How far ahead of the present the bucket may be booked and still let a
/// create go at once: the burst less one interval.
fn tolerance(limits: &CreateLimits) -> TimeDelta {
    interval(limits) * i32::try_from(limits.burst().saturating_sub(1)).unwrap_or(i32::MAX)
}

fn std_to_delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// One cell rate step on `tat` at `now`: the earliest time a create fits,
/// and the new `tat` once it has.
fn step(
    limits: &CreateLimits,
    tat: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let booked = tat.map_or(now, |t| t.max(now));
    (booked - tolerance(limits), booked + interval(limits))
}

impl CreateLimiter {
    /// May the create of the Proxy `key` go at `now`? The in-flight cap
    /// is asked first, so a Proxy waiting for it holds no slot. A Proxy
    /// without a slot gets the next one; once its slot has come, it goes
    /// if the bucket has a token, taking it and counting the create as in
    /// flight. Otherwise it is told when to ask again.
    pub fn admit(&mut self, limits: &CreateLimits, key: &str, now: DateTime<Utc>) -> Admission {
        self.prune(now);
        // Creating again means its earlier create is over.
        self.in_flight.remove(key);
        if self.in_flight_count() >= limits.max_creates_in_flight {
            return Admission::Wait {
                until: now + std_to_delta(IN_FLIGHT_RETRY),
                hold: Hold::InFlight,
            };
        }
        let slot = match self.reservations.get(key) {
            Some(slot) => *slot,
            None => {
                let (slot, booked_to) = step(limits, self.booked_to, now);
                self.booked_to = Some(booked_to);
                self.reservations.insert(key.to_string(), slot);
                slot
            }
        };
        if slot > now {
            return Admission::Wait {
                until: slot,
                hold: Hold::Rate,
            };
        }
        let (fits_at, full_at) = step(limits, self.full_at, now);
        if fits_at > now {
            return Admission::Wait {
                until: fits_at,
                hold: Hold::Rate,
            };
        }
        self.full_at = Some(full_at);
        self.reservations.remove(key);
        self.in_flight.insert(key.to_string(), now);
        Admission::Go
    }

    /// A pass of `key` ended: still `provisioning` (a create submitted, or
    /// an instance booting) keeps or puts it in flight (so a restarted
    /// operator counts the creates an earlier one submitted); anything
    /// else (running, gone, failed for good) ends it.
    pub fn settle(&mut self, key: &str, provisioning: bool, now: DateTime<Utc>) {
        if provisioning {
            self.in_flight.entry(key.to_string()).or_insert(now);
        } else {
            self.in_flight.remove(key);
        }
    }

    /// The create of `key` was refused: it is not in flight.
    pub fn create_failed(&mut self, key: &str) {
        self.in_flight.remove(key);
    }

    /// `key` is being deleted: its reservation and in-flight create go.
    pub fn forget(&mut self, key: &str) {
        self.in_flight.remove(key);
        self.reservations.remove(key);
    }

    /// What the gauges show at `now`.
    pub fn gauges(&self, limits: &CreateLimits, now: DateTime<Utc>) -> Gauges {
        // As many creates fit at once as whole intervals lie between where
        // the bucket is booked to and the furthest a create may book it.
        let booked = self.full_at.map_or(now, |t| t.max(now));
        let headroom = (now + tolerance(limits) - booked)
            .num_nanoseconds()
            .unwrap_or(i64::MAX);
        let step = interval(limits)
            .num_nanoseconds()
            .unwrap_or(i64::MAX)
            .max(1);
        let tokens = if headroom < 0 {
            0
        } else {
            u32::try_from(headroom / step + 1)
                .unwrap_or(u32::MAX)
                .min(limits.burst())
        };
        Gauges {
            tokens,
            in_flight: self.in_flight_count(),
            waiting: u32::try_from(self.reservations.len()).unwrap_or(u32::MAX),
        }
    }

    fn in_flight_count(&self) -> u32 {
        u32::try_from(self.in_flight.len()).unwrap_or(u32::MAX)
    }

    fn prune(&mut self, now: DateTime<Utc>) {
        let in_flight_since = now - std_to_delta(IN_FLIGHT_EXPIRY);
        self.in_flight.retain(|_, at| *at > in_flight_since);
        let slot_since = now - std_to_delta(RESERVATION_EXPIRY);
        self.reservations.retain(|_, slot| *slot > slot_since);
    }
}

/// The requeue of a create held until `until`: never before it (a Proxy
/// that came back early would only be told to wait again), plus a random
/// part (`unit` in `[0, 1)`) of up to a fifth of the wait, at most
/// [`MAX_SPREAD`], so Proxies held together do not come back in lockstep.
pub fn held_requeue(until: DateTime<Utc>, now: DateTime<Utc>, unit: f64) -> Duration {
    spread_after((until - now).to_std().unwrap_or(Duration::ZERO), unit)
}

/// `wait` plus up to a fifth of it (at most [`MAX_SPREAD`]) by `unit`:
/// never before the wait, spread after it.
pub fn spread_after(wait: Duration, unit: f64) -> Duration {
    let u = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let spread = (wait / 5).min(MAX_SPREAD);
    // At least a millisecond: a zero requeue would be a busy loop.
    (wait + spread.mul_f64(u)).max(Duration::from_millis(1))
}

/// The create of a Proxy on `provider` waits until `until` for `hold`:
/// `Provisioned=False/CreateThrottled` naming the provider's limit and
/// the next try. The phase is Provisioning (there is no instance).
pub fn mark_create_throttled(
    status: &mut ProxyStatus,
    provider: &str,
    limits: &CreateLimits,
    hold: Hold,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    let next = until.to_rfc3339_opts(SecondsFormat::Secs, true);
    let message = match hold {
        Hold::Rate => format!(
            "provider {provider:?} allows {} creates a minute (createsPerMinute): this create waits its turn, next try at {next}",
            limits.creates_per_minute
        ),
        Hold::InFlight => format!(
            "provider {provider:?} has {} creates in flight, its maxCreatesInFlight: next try at {next}",
            limits.max_creates_in_flight
        ),
    };
    status::mark_held(status, REASON_CREATE_THROTTLED, &message, now, generation);
}

/// How often a create held by `maxInstances` looks again.
pub const INSTANCE_LIMIT_RETRY: Duration = Duration::from_secs(15);

/// The create of a Proxy on `provider` waits because the provider holds
/// `held` instances, its `maxInstances` being `max`:
/// `Provisioned=False/InstanceLimit` naming the cap.
pub fn mark_instance_limit(
    status: &mut ProxyStatus,
    provider: &str,
    (max, held): (u32, usize),
    now: DateTime<Utc>,
    generation: Option<i64>,
) {
    let message = format!(
        "provider {provider:?} holds {held} instances, its maxInstances is {max}: this create waits until one of them goes"
    );
    status::mark_held(status, REASON_INSTANCE_LIMIT, &message, now, generation);
}

/// Why a create waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The provider's create limits, until then.
    Throttled {
        /// What holds it.
        hold: Hold,
        /// The next try.
        until: DateTime<Utc>,
        /// The provider's limits, which the status names.
        limits: CreateLimits,
    },
    /// The instance was replaced repeatedly ([`super::replace`]): not
    /// before then.
    ReplaceBackoff {
        /// The next try.
        until: DateTime<Utc>,
    },
    /// The provider holds `held` instances, its `maxInstances` `max`.
    InstanceLimit {
        /// The cap.
        max: u32,
        /// Instances held.
        held: usize,
    },
    /// The provider refused this Proxy's last create with a slow retry
    /// ([`super::hold`]): not for this long, whatever starts the pass.
    Refused {
        /// How much longer.
        wait: Duration,
    },
}

impl Held {
    /// The `reason` label the throttle counter counts this hold under,
    /// where the pass counts it (the bucket counts its own holds).
    pub fn counted_as(self) -> Option<&'static str> {
        match self {
            Held::ReplaceBackoff { .. } => Some("replace_backoff"),
            Held::InstanceLimit { .. } => Some("instance_limit"),
            Held::Throttled { .. } | Held::Refused { .. } => None,
        }
    }
}

/// The create gate's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateGate {
    /// The create may go (a token was taken).
    Go,
    /// It waits.
    Held(Held),
}

/// Writes why the create of a Proxy on `provider` waits, and says how
/// long: never before the next try, spread a little after it.
pub fn mark_held_create(
    status: &mut ProxyStatus,
    provider: &str,
    held: Held,
    now: DateTime<Utc>,
    generation: Option<i64>,
) -> Duration {
    let until = match held {
        Held::Throttled {
            hold,
            until,
            limits,
        } => {
            mark_create_throttled(status, provider, &limits, hold, until, now, generation);
            until
        }
        Held::ReplaceBackoff { until } => {
            crate::controller::plan::replace::mark_replace_backoff(status, until, now, generation);
            until
        }
        Held::InstanceLimit { max, held } => {
            mark_instance_limit(status, provider, (max, held), now, generation);
            return INSTANCE_LIMIT_RETRY;
        }
        // The refusal's own condition stays as it was written.
        Held::Refused { wait } => return wait,
    };
    (until - now).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
#[path = "limiter_tests.rs"]
mod tests;
