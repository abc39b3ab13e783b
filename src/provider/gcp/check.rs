//! The provider health check: one single-page aggregated list, no retries,
//! bounded by the check timeout.

use std::error::Error as StdError;
use std::time::Instant;

use async_trait::async_trait;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};
use tracing::debug;

use super::build::MANAGED_FILTER;
use super::{classify, GcpProvider, CHECK_ADDRESS};
use crate::provider::{Checker, TargetStatus};

#[async_trait]
impl Checker for GcpProvider {
    async fn check(&self) -> Vec<TargetStatus> {
        let started = Instant::now();
        let project = self.project().to_string();
        let run = async {
            let c = self
                .clients()
                .await
                .map_err(|e| -> Box<dyn StdError + Send + Sync> { Box::new(e) })?;
            c.instances
                .aggregated_list()
                .set_project(self.project())
                .set_filter(MANAGED_FILTER)
                .set_max_results(1_u32)
                // One page, one request: a refused connection reads as
                // Unreachable now, not as Timeout after retries.
                .with_retry_policy(Aip194Strict.with_attempt_limit(1))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| -> Box<dyn StdError + Send + Sync> { Box::new(e) })
        };
        let (ready, reason, message) = match tokio::time::timeout(
            self.inner.opts.check_timeout,
            run,
        )
        .await
        {
            Ok(Ok(())) => (true, "Reachable", String::new()),
            Ok(Err(e)) => {
                debug!(provider = %self.inner.name, op = "check", detail = %classify::describe(e.as_ref()), "gcp api call failed");
                (false, classify::check_reason(e.as_ref()), e.to_string())
            }
            Err(elapsed) => (false, "Timeout", format!("check did not finish: {elapsed}")),
        };
        vec![TargetStatus {
            name: project,
            address: CHECK_ADDRESS.to_string(),
            ready,
            reason: reason.to_string(),
            message,
            latency: started.elapsed(),
            details: Default::default(),
        }]
    }
}
