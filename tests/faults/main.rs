//! The fault suite (`make test-faults`): the real operator binary against
//! the real API server of this binary's own test cluster, with faults
//! injected into it. A fault such as a frozen API server would break any
//! other test sharing the cluster, so these tests live in their own binary
//! and take [`EXCLUSIVE`] for the whole test.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "../gcp_standin/mod.rs"]
mod gcp_standin;
#[cfg(feature = "kvm")]
#[path = "../kvm_support/mod.rs"]
mod kvm_support;
#[path = "../support/mod.rs"]
mod support;

mod apiserver_restart;
mod crash_points;
mod credentials;
mod leader_freeze;
mod watch_cut;

/// Held by every fault test: one fault at a time on the shared cluster.
pub static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
