//! egress-proxies-operator: turns `Proxy` objects into forward proxies on
//! Kubernetes, GCP or KVM, probes them, and leases healthy ones to crawlers.

/// The commit the binary was built from (`src/build.rs`; `unknown` outside a
/// checkout unless `EPO_COMMIT` was set for the build).
pub const COMMIT: &str = env!("EPO_COMMIT");
/// What `--version` prints after the name: the release and the commit.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EPO_COMMIT"),
    ")"
);

pub mod api;
pub mod cli;
pub mod config;
pub mod controller;
pub mod crashpoint;
pub mod credentials;
pub mod discovery;
pub mod events;
pub mod fleet;
pub mod gateway;
pub mod gc;
pub mod health;
pub mod http;
pub mod leader;
pub mod lease;
pub mod metrics;
pub mod metrics_auth;
pub mod operator;
pub mod paged;
pub mod pool;
pub mod provider;
pub mod providerhealth;
pub mod proxy_ids;
pub mod proxy_store;
pub mod replica;
pub mod server;
pub mod telemetry;
pub mod tenancy;
pub mod tls;
