//! What a gateway in this process takes of the discovery API
//! (docs/architecture.md, "The gateway"): the listing in force, the
//! token lookup and the lease table as the replicas' lease service. The
//! gateway holds these, never the API's state, so it stands beside the
//! API on one listing and one lease store.

use std::sync::Arc;

use super::state::{ApiState, Listing};
use super::tokens::TokenSet;
use crate::replica::lease_service::LeaseService;

/// The parts of the API a gateway reads and tells.
#[derive(Clone)]
pub struct GatewayParts {
    /// The listing of eligible proxies in force (the gateway's
    /// upstreams): a new one, another `Arc`, each time it is rebuilt.
    pub listing: Arc<dyn Fn() -> Listing + Send + Sync>,
    /// The tokens the API's bearer auth checks: the set in force, which
    /// the tokens Secret's watcher replaces in place.
    pub tokens: Arc<TokenSet>,
    /// The lease store, whether its exclusive leases count, and the way
    /// to the leader.
    pub leases: LeaseService,
}

impl ApiState {
    /// What a gateway beside this API takes of it: built once the state
    /// is (its forwarder, members and hints are the gateway's too).
    pub fn gateway_parts(&self) -> GatewayParts {
        let state = self.clone();
        GatewayParts {
            listing: Arc::new(move || state.listing()),
            tokens: self.tokens.clone(),
            leases: LeaseService {
                teller: self.teller(),
                replicas: self.replicas.clone(),
            },
        }
    }
}
