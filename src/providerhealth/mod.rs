//! The provider health monitor (provider-health.md): runs every configured
//! provider's [`Checker`](crate::provider::Checker) on a schedule under one
//! round timeout, keeps the latest results as a snapshot (for the gauges),
//! logs transitions, and tells the ProviderHealth controller ([`writer`])
//! that a new round is in.

pub mod circuit;
pub mod metrics;
pub mod status;
pub mod writer;

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tracing::{debug, info, warn, Instrument};

use crate::controller::plan::{jitter, Random, SystemRandom};
use crate::provider::registry::CheckerEntry;
use crate::provider::TargetStatus;
use status::{Seen, Transition};

/// One provider's latest check.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    /// Configured provider name (the object's name).
    pub provider: String,
    /// Provider type: kubernetes, gcp or kvm.
    pub provider_type: String,
    /// Whether the provider has a check at all.
    pub supported: bool,
    /// One verdict per target, in the checker's order.
    pub targets: Vec<TargetStatus>,
    /// When this provider's check returned (or was abandoned).
    pub checked_at: DateTime<Utc>,
}

/// The latest results in config order; empty before the first round.
#[derive(Clone, Default)]
pub struct Snapshot(Arc<RwLock<Vec<CheckResult>>>);

impl Snapshot {
    /// An independent copy of the latest results.
    pub fn get(&self) -> Vec<CheckResult> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The latest result of one provider.
    pub fn of(&self, provider: &str) -> Option<CheckResult> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|r| r.provider == provider)
            .cloned()
    }

    fn set(&self, results: Vec<CheckResult>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = results;
    }
}

/// Reason given to every target of a check that overran the round.
pub const REASON_TIMEOUT: &str = "Timeout";
/// Target name used for an abandoned check that never reported targets.
pub const SYNTHETIC_TARGET: &str = "check";

/// Runs the checks.
pub struct Monitor {
    entries: Vec<CheckerEntry>,
    interval: Duration,
    timeout: Duration,
    snapshot: Snapshot,
    rounds: watch::Sender<u64>,
    seen: Seen,
}

impl Monitor {
    /// A monitor over `entries` (config order); `timeout` is the round
    /// timeout already defaulted.
    pub fn new(entries: Vec<CheckerEntry>, interval: Duration, timeout: Duration) -> Self {
        Monitor {
            entries,
            interval,
            timeout,
            snapshot: Snapshot::default(),
            rounds: watch::channel(0).0,
            seen: Seen::new(),
        }
    }

    /// The snapshot handle (shared with the gauges and the writer).
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot.clone()
    }

    /// Ticks once per finished round.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.rounds.subscribe()
    }

    /// Runs a round at once, then one per interval, until `shutdown`.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            // Each next round a little early, by a random share, so the
            // checks of replicas or providers do not stay in lockstep.
            ticker.reset_after(jitter(self.interval, SystemRandom.unit()));
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.round() => {}
            }
        }
    }

    /// One round: every check concurrently, each abandoned at the round
    /// timeout with its targets reported `Timeout`.
    pub async fn round(&mut self) {
        let span = tracing::info_span!(
            parent: None,
            "providerhealth.check",
            otel.kind = "internal",
            providerhealth.providers = tracing::field::Empty,
            providerhealth.targets_not_ready = tracing::field::Empty,
        );
        let results = self.check_all().instrument(span.clone()).await;
        let not_ready: usize = results
            .iter()
            .map(|r| r.targets.iter().filter(|t| !t.ready).count())
            .sum();
        span.record("providerhealth.providers", results.len() as i64);
        span.record("providerhealth.targets_not_ready", not_ready as i64);
        self.snapshot.set(results.clone());
        let _enter = span.enter();
        for r in &results {
            self.log_transitions(r);
        }
        drop(_enter);
        self.rounds.send_modify(|n| *n = n.wrapping_add(1));
    }

    async fn check_all(&self) -> Vec<CheckResult> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let handles: Vec<_> = self
            .entries
            .iter()
            .map(|e| {
                e.checker
                    .clone()
                    .map(|c| tokio::spawn(async move { c.check().await }.in_current_span()))
            })
            .collect();
        let previous = self.snapshot.get();
        let mut results = Vec::with_capacity(self.entries.len());
        for (entry, handle) in self.entries.iter().zip(handles) {
            let targets = match handle {
                None => Vec::new(),
                Some(mut h) => match tokio::time::timeout_at(deadline, &mut h).await {
                    Ok(Ok(targets)) => targets,
                    Ok(Err(e)) => {
                        let message = crate::provider::error::plain_message(&e);
                        warn!(provider = %entry.name, error = %message, "WARNING: provider check failed to run");
                        abandoned(&previous, &entry.name, "CheckFailed", &message)
                    }
                    Err(_) => {
                        // Dropping is the cancellation signal; a check that
                        // ignores it finishes in the background, unwaited.
                        h.abort();
                        abandoned(
                            &previous,
                            &entry.name,
                            REASON_TIMEOUT,
                            &format!(
                                "the check did not finish within {}",
                                humantime::format_duration(self.timeout)
                            ),
                        )
                    }
                },
            };
            results.push(CheckResult {
                provider: entry.name.clone(),
                provider_type: entry.provider_type.as_str().to_string(),
                supported: entry.checker.is_some(),
                targets,
                checked_at: Utc::now(),
            });
        }
        results
    }

    fn log_transitions(&mut self, r: &CheckResult) {
        for t in &r.targets {
            let latency_ms = t.latency.as_millis() as u64;
            match status::transition(&mut self.seen, &r.provider, &t.name, t.ready, &t.reason) {
                Some(Transition::Down) => info!(
                    provider = %r.provider,
                    target = %t.name,
                    address = %t.address,
                    reason = %t.reason,
                    message = %t.message,
                    "WARNING: provider target not ready"
                ),
                Some(Transition::Up) => info!(
                    provider = %r.provider,
                    target = %t.name,
                    address = %t.address,
                    reason = %t.reason,
                    latency_ms,
                    "Provider target ready"
                ),
                Some(Transition::FirstUp) => debug!(
                    provider = %r.provider,
                    target = %t.name,
                    address = %t.address,
                    reason = %t.reason,
                    latency_ms,
                    "Provider target ready"
                ),
                None => {}
            }
        }
    }
}

/// The targets reported for a check that did not return: every target the
/// provider had last time, or one synthetic target.
pub fn abandoned(
    previous: &[CheckResult],
    provider: &str,
    reason: &str,
    message: &str,
) -> Vec<TargetStatus> {
    let known: Vec<(String, String)> = previous
        .iter()
        .find(|r| r.provider == provider)
        .map(|r| {
            r.targets
                .iter()
                .map(|t| (t.name.clone(), t.address.clone()))
                .collect()
        })
        .unwrap_or_default();
    let names = if known.is_empty() {
        vec![(SYNTHETIC_TARGET.to_string(), String::new())]
    } else {
        known
    };
    names
        .into_iter()
        .map(|(name, address)| TargetStatus {
            name,
            address,
            ready: false,
            reason: reason.to_string(),
            message: message.to_string(),
            latency: Duration::ZERO,
            details: Default::default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::registry::ProviderType;
    use crate::provider::Checker;
    use async_trait::async_trait;

    struct Fixed(bool);
    #[async_trait]
    impl Checker for Fixed {
        async fn check(&self) -> Vec<TargetStatus> {
            vec![TargetStatus {
                name: "apiserver".into(),
                ready: self.0,
                reason: if self.0 { "Reachable" } else { "Unreachable" }.into(),
                ..Default::default()
            }]
        }
    }

    /// Never returns, like a checker stuck on a dead link.
    struct Hung;
    #[async_trait]
    impl Checker for Hung {
        async fn check(&self) -> Vec<TargetStatus> {
            futures::future::pending::<()>().await;
            Vec::new()
        }
    }

    fn entry(name: &str, c: Option<Arc<dyn Checker>>) -> CheckerEntry {
        CheckerEntry {
            name: name.into(),
            provider_type: ProviderType::Kubernetes,
            checker: c,
        }
    }

    #[tokio::test]
    async fn a_hung_check_is_abandoned_and_reads_timeout() {
        let mut m = Monitor::new(
            vec![
                entry("hung", Some(Arc::new(Hung))),
                entry("fast", Some(Arc::new(Fixed(true)))),
                entry("none", None),
            ],
            Duration::from_secs(3600),
            Duration::from_millis(50),
        );
        let mut rounds = m.subscribe();
        let started = std::time::Instant::now();
        m.round().await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(rounds.has_changed().unwrap());
        rounds.mark_unchanged();
        let snap = m.snapshot().get();
        assert_eq!(snap.len(), 3);
        assert_eq!(snap[0].targets.len(), 1);
        assert_eq!(snap[0].targets[0].name, SYNTHETIC_TARGET);
        assert_eq!(snap[0].targets[0].reason, "Timeout");
        assert!(!snap[0].targets[0].ready);
        assert!(snap[1].targets[0].ready);
        assert!(!snap[2].supported && snap[2].targets.is_empty());
    }

    #[test]
    fn abandoned_keeps_known_target_names() {
        let prev = vec![CheckResult {
            provider: "kvm".into(),
            provider_type: "kvm".into(),
            supported: true,
            targets: vec![
                TargetStatus {
                    name: "nas1".into(),
                    address: "10.0.0.1:22".into(),
                    ready: true,
                    ..Default::default()
                },
                TargetStatus {
                    name: "nas2".into(),
                    ..Default::default()
                },
            ],
            checked_at: status::at(0),
        }];
        let t = abandoned(&prev, "kvm", "Timeout", "late");
        assert_eq!(
            t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["nas1", "nas2"]
        );
        assert!(t.iter().all(|t| !t.ready && t.reason == "Timeout"));
        assert_eq!(t[0].address, "10.0.0.1:22");
        assert_eq!(
            abandoned(&prev, "other", "Timeout", "late")[0].name,
            "check"
        );
    }
}
