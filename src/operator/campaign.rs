//! Leadership in terms: the campaign, leader-only work for each term this
//! replica leads, what it publishes on the Lease while it leads, and the
//! hand-over at the end.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Operator, StartError, RELEASE_TIMEOUT, SHUTDOWN_GRACE};
use crate::api::constants::{DISCOVERY_URL_ANNOTATION, LEADER_ELECTION_ID};
use crate::leader;
use crate::provider::error::plain_message;
use crate::proxy_store::ProxyStore;

impl Operator {
    /// With `--leader-elect`: campaigns, and runs leader-only work for each
    /// term this replica leads. On a step-down the work is stopped (given
    /// half of the gap between the renew deadline and the lease duration,
    /// then abandoned) before the campaign resumes, so it never runs on two
    /// replicas at once. Returns when `stop` fires, after releasing the
    /// Lease if it leads.
    pub(super) async fn lead_in_terms(
        &self,
        timing: leader::Timing,
        (observed, fence): (tokio::sync::watch::Sender<leader::Observed>, leader::Fence),
        stop: &CancellationToken,
        proxies: ProxyStore,
        installation_id: String,
        publisher: Arc<leader::WithFixed>,
    ) -> Result<(), StartError> {
        let namespace = &self.settings.operator_namespace;
        let identity = leader_identity();
        let candidate = leader::Candidate {
            identity: identity.clone(),
            observed,
            fence,
        };
        let campaign = leader::campaign(
            self.client.clone(),
            namespace,
            LEADER_ELECTION_ID,
            candidate,
            timing,
            self.metrics.leader.clone(),
            publisher.clone(),
        );
        let mut leading = campaign.leading.clone();
        let step_down_grace = timing.lease_duration.saturating_sub(timing.renew_deadline) / 2;
        loop {
            info!(identity = %identity, lease = LEADER_ELECTION_ID, namespace = %namespace, "Waiting to become the leader");
            tokio::select! {
                won = leading.wait_for(|l| *l) => if won.is_err() {
                    campaign.stop().await;
                    return Err(StartError::LeaderElection);
                },
                _ = stop.cancelled() => {
                    campaign.stop().await;
                    return Ok(());
                }
            }
            let term = stop.child_token();
            let grace = std::sync::Mutex::new(SHUTDOWN_GRACE);
            let work = self.lead_one_term(&term, &grace, proxies.clone(), installation_id.clone());
            tokio::pin!(work);
            self.metrics.leader.set_leading(true);
            tokio::select! {
                // The term's work ends only once the term is cancelled,
                // which here only `stop` does.
                _ = &mut work => {
                    self.metrics.leader.set_leading(false);
                    self.release(campaign, &identity, &*publisher).await;
                    return Ok(());
                }
                lost = leading.wait_for(|l| !*l) => {
                    let campaign_ended = lost.is_err();
                    *grace.lock().unwrap_or_else(|p| p.into_inner()) = step_down_grace;
                    term.cancel();
                    work.await;
                    self.metrics.leader.set_leading(false);
                    // A replica that does not lead exports no provider or
                    // create-limit gauges.
                    self.metrics.provider_health.set_targets(Vec::new);
                    self.metrics.throttle.set_limiters(Vec::new);
                    warn!(identity = %identity, "Stopped leader-only work (controller, GC, health engine, provider checks); still serving the discovery API; campaigning again");
                    if campaign_ended {
                        return Err(StartError::LeaderElection);
                    }
                    campaign.rejoin();
                }
                _ = stop.cancelled() => {
                    work.await;
                    self.metrics.leader.set_leading(false);
                    self.release(campaign, &identity, &*publisher).await;
                    return Ok(());
                }
            }
        }
    }

    /// Where this replica's discovery API is reached, sealed with the
    /// lease key and, for the gateway processes, with the gateway key, for
    /// each term of the Lease while it leads.
    pub(super) fn discovery_annotations(
        &self,
        keys: Option<&super::runnables::Keys>,
    ) -> leader::ForTerm {
        use crate::replica::internal::{
            seal_url, GATEWAY_URL_SEAL_ANNOTATION, URL_SEAL_ANNOTATION,
        };
        let s = &self.settings;
        let (Some(url), Some(keys)) = (s.discovery_advertise.clone(), keys.cloned()) else {
            if s.discovery_bind.is_some() {
                warn!("No --discovery-advertise-url and no POD_IP: while this replica leads, the others cannot forward lease calls to it and answer 503");
            }
            return Box::new(|_| Default::default());
        };
        Box::new(move |term| {
            let term = (term.holder.as_str(), term.transitions);
            let mut published = std::collections::BTreeMap::from([
                (DISCOVERY_URL_ANNOTATION.to_string(), url.clone()),
                (
                    URL_SEAL_ANNOTATION.to_string(),
                    seal_url(&keys.own, &url, term),
                ),
            ]);
            if let Some(g) = &keys.gateway {
                let seal = seal_url(g, &url, term);
                published.insert(GATEWAY_URL_SEAL_ANNOTATION.to_string(), seal);
            }
            published
        })
    }

    /// Leader-only work has stopped: hand the Lease over now rather than
    /// make the next leader wait out its duration, with what `publisher`
    /// writes for the next leader (the lease table's hand-over).
    async fn release(
        &self,
        campaign: leader::Campaign,
        identity: &str,
        publisher: &dyn leader::Publisher,
    ) {
        campaign.stop().await;
        let annotations = publisher.releasing().await;
        let release = leader::release(
            self.client.clone(),
            (&self.settings.operator_namespace, LEADER_ELECTION_ID),
            identity,
            annotations,
        );
        match tokio::time::timeout(RELEASE_TIMEOUT, release).await {
            Ok(Ok(true)) => info!(lease = LEADER_ELECTION_ID, "Released the leader lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                warn!(error = %plain_message(&e), "Could not release the leader lease; it expires by itself")
            }
            Err(_) => warn!("Releasing the leader lease timed out; it expires by itself"),
        }
    }
}

/// A unique candidate name: the Pod name (HOSTNAME in a Pod) and the pid.
pub(crate) fn leader_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "egress-proxies-operator".to_string());
    format!("{host}_{}", std::process::id())
}
