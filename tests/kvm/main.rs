//! One test binary for kvm tests (linking dominates CI time, so
//! related files share a binary, and a cluster when they need one).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "../gcp_standin/mod.rs"]
mod gcp_standin;
#[path = "../kvm_support/mod.rs"]
mod kvm_support;
#[path = "../support/mod.rs"]
mod support;

mod e2e_image;
mod e2e_kvm;
mod e2e_kvm_guest;
mod e2e_samples_kvm;
mod kvm_cancel;
mod kvm_failures;
mod kvm_guest_cloud_config;
mod kvm_harness;
mod kvm_helper;
mod kvm_image_cache;
mod kvm_lifecycle;
