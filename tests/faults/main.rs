//! The fault suite (`make test-faults`): the real operator binary against
//! the real API server of this binary's own test clusters (control plane
//! only; with running Pods for the kubernetes credentials test), with
//! faults injected into them or into the operator. A fault such as a
//! frozen or killed API server would break any other test sharing the
//! cluster, so these tests live in their own binary and take
//! [`EXCLUSIVE`] for the whole test. Each prints a table row of what was
//! injected and measured (docs/reliability.md holds the latest).
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
