//! One test binary for in process tests (linking dominates CI time, so
//! related files share a binary, and a cluster when they need one).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "../gcp_standin/mod.rs"]
mod gcp_standin;
#[path = "../support/mod.rs"]
mod support;

mod api_docs;
mod check_config_cli;
mod crds;
mod gcp_provider;
mod grafana_dashboard;
mod health_probe;
mod image;
mod log_filter;
mod metrics_cardinality;
mod metrics_docs;
mod prometheus_rules;
mod provider_decorators;
mod providers_config;
