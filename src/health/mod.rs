//! The proxy health engine (operator.md §3.1): probes every Proxy through
//! itself and tells the reconciler when a verdict or a material latency
//! changes.
//!
//! - [`probe`]: one probe (CONNECT + TLS, or a forward request).
//! - [`error`]: [`ProbeError`], why a probe failed, with a bounded reason.
//! - [`probes`]: [`Probes`], the pure state machine: targets from the
//!   Proxy set, what is due at `now`, results folded into verdicts.
//! - [`spec`]: what is probed for a Proxy, from its spec and the defaults.
//! - [`threshold`]: pure verdict folding and the status-affecting rule.
//! - [`schedule`]: pure min-heap schedule of next-due times.
//! - [`sizing`]: how many probes are in flight, from the fleet's rate and
//!   the probes' latency.
//! - [`dns`]: proxy host names resolved once per TTL.
//! - [`notify`]: the reconcile trigger channel to the Proxy controller.
//! - [`pause`]: the benchmark's switch that holds the probes.
//! - [`engine`]: the runnable tying them to the Proxy cache and the pool.

pub mod check;
pub mod dns;
pub mod engine;
pub mod error;
pub mod fairness;
pub mod hints;
pub mod latency_writes;
pub mod metrics;
pub mod notify;
pub mod pause;
pub mod probe;
pub mod probes;
pub mod schedule;
pub mod sizing;
pub mod spec;
mod targets;
pub mod threshold;

pub use engine::Engine;
pub use error::ProbeError;
pub use hints::Hints;
pub use notify::{trigger_stream, Notifier, NOTIFY_CAPACITY};
pub use pause::Pause;
pub use probes::{Defaults, Probes};
