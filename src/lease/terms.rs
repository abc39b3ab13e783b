//! What callers give the store: its limits from the flags, an acquire's
//! request, a report's outcome.

use std::sync::Arc;
use std::time::Duration;

/// Store limits, from the flags.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// Leases one proxy may hold at once; 0 turns leasing off (every acquire
    /// is refused with [`super::AcquireError::NoCapacity`]).
    pub max_leases_per_proxy: u32,
    /// TTL when the client asks for none.
    pub default_ttl: Duration,
    /// Longest TTL a client may ask for.
    pub max_ttl: Duration,
    /// How long a reported proxy is withheld.
    pub cooldown: Duration,
}

/// A client's report on a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The proxy worked.
    Ok,
    /// The site blocked the proxy.
    Blocked,
    /// The proxy failed (connect errors, timeouts).
    Failed,
}

impl Outcome {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Blocked => "blocked",
            Outcome::Failed => "failed",
        }
    }
}

/// What an acquire asks for, besides the eligible proxies.
#[derive(Debug, Clone, Default)]
pub struct AcquireRequest {
    /// Validated TTL ([`super::LeaseStore::ttl`]).
    pub ttl: Duration,
    /// Same key, same proxy while it stays eligible and has capacity.
    pub sticky_key: Option<String>,
    /// Site to be crawled: proxies cooling down for it are skipped.
    pub site: Option<String>,
    /// The caller: the name of its token.
    pub client: Arc<str>,
}

/// Limits per client (per token name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Leases one client may hold at once; 0: no limit.
    pub max_leases: u32,
    /// Distinct clients whose global reports withhold a proxy from every
    /// client; a client's own report always withholds it from itself.
    pub global_cooldown_min_clients: usize,
}

impl Default for ClientLimits {
    /// No per-client cap; one report puts a proxy in global cooldown (the
    /// behaviour with one token).
    fn default() -> Self {
        ClientLimits {
            max_leases: 0,
            global_cooldown_min_clients: 1,
        }
    }
}
