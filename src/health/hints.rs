//! Proxies someone saw fail between probes (the gateway, when an upstream
//! refuses a connection): the engine probes each at once, a full probe,
//! instead of at its next turn. The probe decides, as always: a hint never
//! counts as a failure by itself, so a mistaken one costs one probe.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Hints held at most between two looks of the engine; past it new ones
/// are dropped (the proxies' own probes still come).
pub const MAX_HINTS: usize = 10_000;

/// Shared by whoever hints and the engine (of any term of leadership).
#[derive(Clone, Debug, Default)]
pub struct Hints(Arc<Mutex<HashSet<String>>>);

impl Hints {
    /// The Proxy `namespace/name` failed a connection just now.
    pub fn failed(&self, namespace: &str, name: &str) {
        let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if h.len() < MAX_HINTS {
            h.insert(super::probes::key_of(namespace, name));
        }
    }

    /// The hints since the last take.
    pub fn take(&self) -> Vec<String> {
        let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        h.drain().collect()
    }
}
