//! One test binary for e2e tests (linking dominates CI time, so
//! related files share a binary, and a cluster when they need one).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "../support/mod.rs"]
mod support;

mod e2e_breaker;
mod e2e_crash;
mod e2e_credentials;
mod e2e_events;
mod e2e_fleet;
mod e2e_gc_health;
mod e2e_health;
mod e2e_kubernetes;
mod e2e_kubernetes_limits;
mod e2e_status_tools;
/// In-process scenarios of the reconciler on the fake provider, on this
/// binary's cluster.
mod reconcile_scenarios;
/// Recycle policy on an injected clock.
mod recycle_policy;
/// Their harness.
mod scenario;
