//! This process's lease table as a gateway beside the discovery API uses
//! it (docs/architecture.md, "The gateway"): which proxies a client's
//! connections may use by its leases and cooldowns, a cooldown held here
//! at once and queued for the leader, a failed upstream queued for the
//! leader's health engine. The gateway stands on this, not on the
//! discovery API's state.

use std::sync::Arc;

use super::members::Replicas;
use super::outbox::Tell;
use super::to_leader::Teller;
use crate::lease::{LeaseStore, ProxyKey};

/// The table (in the teller), its members (the copy's age) and the way
/// to the leader.
#[derive(Clone)]
pub struct LeaseService {
    pub teller: Teller,
    pub replicas: Arc<Replicas>,
}

impl LeaseService {
    /// The lease store the API grants from.
    pub fn store(&self) -> &Arc<LeaseStore> {
        &self.teller.leases
    }

    /// Whether the exclusive leases in this replica's table may withhold
    /// proxies: it leads, or its copy of the leader's is recent
    /// (`copy_age.rs`).
    pub fn leases_exclude(&self) -> bool {
        let copy = self.replicas.copy().at(std::time::Instant::now());
        !super::copy_age::stale(copy)
    }

    /// Whether `client`'s gateway connections (to `site`, when known) may
    /// use each of `keys` now, in order.
    pub fn lets_use_all(&self, client: &str, keys: &[&ProxyKey], site: Option<&str>) -> Vec<bool> {
        // A stale copy of the leader's table withholds nothing by its
        // leases; cooldowns still count (this process records its own).
        let by_leases = self.leases_exclude();
        self.store()
            .lets_gateway_use_all(client, keys, (site, by_leases))
    }

    /// `key` is banned by `site` (or failed `client` everywhere): held
    /// here before the next choice, and at the leader without holding up
    /// the answer to the crawler, through the bounded queue.
    pub fn cool_down(&self, client: &Arc<str>, key: &ProxyKey, site: Option<&str>) {
        self.store().cool_down(key, client, site);
        self.teller.tell(Tell::Cooldown {
            proxy: key.clone(),
            client: client.clone(),
            site: site.map(str::to_string),
        });
    }

    /// `key` failed a connection: queued for the leader's health engine.
    pub fn failed(&self, key: &ProxyKey) {
        self.teller.tell(Tell::Failed(key.clone()));
    }
}
