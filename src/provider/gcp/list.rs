//! Listing: every managed instance of the project in one aggregated list,
//! page by page, with the zones that could not be read.

use std::time::Instant;

use google_cloud_compute_v1::model;
use tracing::{debug, warn};

use super::build::{self, MANAGED_FILTER};
use super::{GcpProvider, MAX_LIST_PAGES};
use crate::provider::{Listing, Op, ProviderError};

impl GcpProvider {
    pub(super) async fn list_all(&self) -> Result<Listing, ProviderError> {
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::List, "", "client", e))?;
        let mut listing = Listing::default();
        let mut ports = super::firewall::PortsInUse::new();
        let mut token = String::new();
        for page in 0.. {
            if page >= MAX_LIST_PAGES {
                return Err(self.permanent(
                    Op::List,
                    "",
                    format!("aggregated list did not end after {MAX_LIST_PAGES} pages"),
                ));
            }
            let mut b = c
                .instances
                .aggregated_list()
                .set_project(self.project())
                .set_filter(MANAGED_FILTER);
            if !token.is_empty() {
                b = b.set_page_token(token.clone());
            }
            self.wire_request::<()>("instances.aggregatedList", &token, None);
            let t = Instant::now();
            let res = b.send().await;
            self.wire_response("instances.aggregatedList", t, &res);
            let resp = res.map_err(|e| self.fail(Op::List, "", "instances.aggregatedList", e))?;
            collect_page(&resp, &mut listing, &mut ports);
            match resp.next_page_token.as_deref() {
                Some(next) if !next.is_empty() => {
                    if next == token {
                        return Err(self.permanent(
                            Op::List,
                            "",
                            "aggregated list returned the same page token twice",
                        ));
                    }
                    token = next.to_string();
                }
                _ => break,
            }
        }
        // A listing missing zones could miss the instances that need a
        // rule: the firewall sweep waits for a whole one.
        if listing.unread_scopes.is_empty() {
            *super::operations::lock(&self.inner.ports_seen) = Some((Instant::now(), ports));
        }
        listing.unread_scopes.sort();
        listing.unread_scopes.dedup();
        if !listing.unread_scopes.is_empty() {
            warn!(provider = %self.inner.name, unread = ?listing.unread_scopes, "instances listed without some zones");
        }
        debug!(provider = %self.inner.name, filter = MANAGED_FILTER, count = listing.instances.len(), "instances listed");
        Ok(listing)
    }
}

/// Adds one aggregated-list page to `listing` (managed instances, and the
/// zones that reported themselves unreachable) and to `ports` (the ports
/// its instances serve on, for the firewall sweep).
fn collect_page(
    resp: &model::InstanceAggregatedList,
    listing: &mut Listing,
    ports: &mut super::firewall::PortsInUse,
) {
    for u in &resp.unreachables {
        listing.unread_scopes.push(u.clone());
    }
    let mut scopes: Vec<_> = resp.items.iter().collect();
    scopes.sort_by(|a, b| a.0.cmp(b.0));
    for (scope, list) in scopes {
        if let Some(w) = &list.warning {
            let code = w.code.as_ref().and_then(|c| c.name()).unwrap_or("");
            if code == "UNREACHABLE" {
                listing.unread_scopes.push(scope.clone());
            }
        }
        for inst in &list.instances {
            if !build::is_managed(inst) {
                continue;
            }
            super::firewall::note_instance(ports, inst);
            let Some(name) = inst.name.as_deref() else {
                continue;
            };
            let zone = inst
                .zone
                .as_deref()
                .map(build::last_segment)
                .unwrap_or_else(|| build::last_segment(scope));
            listing
                .instances
                .push(build::to_instance(build::format_id(zone, name), inst));
        }
    }
}
