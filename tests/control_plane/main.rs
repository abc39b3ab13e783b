//! One test binary for control plane tests (linking dominates CI time, so
//! related files share a binary, and a cluster when they need one).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

#[path = "../gcp_standin/mod.rs"]
mod gcp_standin;
#[path = "../lease_load/mod.rs"]
mod lease_load;
#[path = "../support/mod.rs"]
mod support;

mod client_reports;
mod cluster_kubectl;
mod connection_fairness;
mod crawler_example;
mod discovery_tokens;
mod e2e_breaker_gcp;
mod e2e_create_limits;
mod e2e_events_gcp;
mod e2e_fleet_gcp;
mod e2e_gateway;
mod e2e_gcp;
mod e2e_gcp_firewall;
mod e2e_gcp_listing;
mod e2e_gcp_unavailable;
mod e2e_leader;
mod e2e_lease_failover;
mod e2e_pool_autoscale;
mod e2e_pool_gcp;
mod e2e_reload;
mod e2e_replace_gcp;
mod e2e_startup_gcp;
mod e2e_surge_crash_gcp;
mod field_limits;
mod gateway_edge;
mod gc_sweep;
mod idle_memory;
mod leader_leases;
mod leader_pause;
mod lease_handover;
mod lease_key_fallback;
mod lease_key_rotation;
mod lease_logs;
mod manifests;
mod metrics_auth;
mod otlp_grpc;
mod oversized_heads;
mod providerhealth_writer;
mod released_flood;
mod replica_trust;
mod scale_small;
mod secret_sentinel;
mod status_writes;
mod sticky_leases;
