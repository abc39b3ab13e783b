//! The operator's side of `POST /v1/leases/{id}/replace`: a crawler's ask
//! becomes the `crawl.example.com/replace` annotation on its proxy's Proxy
//! (the reconcile then drains and replaces it under the provider's
//! budget, as for a user's `kubectl annotate`), unless the provider's
//! circuit breaker is open.

use std::sync::{Arc, Mutex};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::constants::REPLACE_ANNOTATION;
use crate::api::Proxy;
use crate::discovery::Replacer;
use crate::fleet::Fleet;
use crate::lease::ProxyKey;
use crate::provider::error::plain_message;

/// Writes the replace annotation; consults the fleet view of the term in
/// force (none before the first term, or on a replica that does not lead:
/// lease calls reach the leader, whose term is in force).
pub struct ProxyReplacer {
    client: Client,
    fleet: Mutex<Option<Arc<Fleet>>>,
}

impl ProxyReplacer {
    /// A replacer writing through `client`.
    pub fn new(client: Client) -> Self {
        ProxyReplacer {
            client,
            fleet: Mutex::new(None),
        }
    }

    /// The fleet view of the term now in force.
    pub fn set_fleet(&self, fleet: Arc<Fleet>) {
        *self.fleet.lock().unwrap_or_else(|p| p.into_inner()) = Some(fleet);
    }
}

#[async_trait::async_trait]
impl Replacer for ProxyReplacer {
    fn held(&self, provider: &str) -> Option<String> {
        let fleet = self
            .fleet
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        fleet.breaker_open(provider, chrono::Utc::now()).then(|| {
            format!(
                "provider {provider}'s circuit breaker is open (too many of its proxies failed at once): it replaces nothing until it closes; the lease is kept"
            )
        })
    }

    async fn request(&self, key: &ProxyKey, value: &str) -> Result<(), String> {
        let api: Api<Proxy> = Api::namespaced(self.client.clone(), &key.namespace);
        let patch = json!({ "metadata": { "annotations": { REPLACE_ANNOTATION: value } } });
        api.patch(&key.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| plain_message(&e))
    }
}
