//! Fleet policy per provider, as pure decisions (issue 18, items 3 and 4):
//! when to stop replacing because too much failed at once, which Proxies to
//! recycle and when, how many at a time, and when a draining Proxy may lose
//! its instance. Nothing here does I/O; the controller feeds it what the
//! Proxy cache and the health verdicts say.
//!
//! - [`breaker`]: the per-provider circuit breaker (share of Ready proxies
//!   lost within a window).
//! - [`recycle`]: whether one Proxy wants a new instance (unhealthy too
//!   long, too old) and the `spec.recycle` durations.
//! - [`budget`]: the disruption budget (`maxUnavailable`) and which of the
//!   wanting Proxies may start now.
//! - [`cap`]: `maxInstances`, how many instances a provider may hold.
//! - [`drain`]: drain before replace (no new leases, existing leases run to
//!   expiry or the drain timeout).
//! - [`view`]: the per-provider state these make up, from the Proxies.
//! - [`shared`]: that state behind a lock, refreshed from the Proxy cache,
//!   as every reconcile (the plan's gates), the lease API and the
//!   ProviderHealth writer consult it.

pub mod breaker;
pub mod budget;
pub mod cap;
pub mod drain;
pub mod recycle;

pub use breaker::{Breaker, BreakerPolicy, Member, Transition};
pub use budget::{admit, admit_fair, admit_surge, Candidate, FleetCounts, MaxUnavailable};
pub use drain::{
    leases_end, next_drain_step, unseen_leases_end, DrainDone, DrainInput, DrainStep, DRAIN_NOTICE,
};
pub use recycle::{
    parse_duration, replace_pending, wants_recycle, DurationError, RecycleInput, RecyclePolicy,
    RecycleReason, DEFAULT_DRAIN_TIMEOUT, MIN_STARTUP_TIMEOUT, MIN_UNHEALTHY_FOR,
};
pub mod shared;
pub mod view;

pub use shared::{Fleet, Seen};
pub use view::{
    mark_replacing, recycle_step, recycle_step_with_surge, summarize, FleetState, RecycleStep,
    Summary,
};
