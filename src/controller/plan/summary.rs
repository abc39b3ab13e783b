//! The summary a pass leaves for tools that know no Proxy (kstatus,
//! `kubectl wait --for=condition=Ready`, Argo CD, Flux): a `Ready`
//! condition that follows the phase, and the generation acted on.

use chrono::{DateTime, Utc};

use crate::api::condition::{self, Condition, ConditionStatus};
use crate::api::proxy::conditions::{
    HEALTHY, PROVISIONED, READY, REASON_AWAITING_VERDICT, REASON_PENDING, REASON_PROXY_READY,
};
use crate::api::{ProxyPhase, ProxyStatus};

/// What the `Ready` condition says for `status`: True exactly when the
/// phase is Ready (the one Ready decision, [`super::phase::ready`], made
/// it so); otherwise False with the reason and message of the condition
/// that blocks it: `Healthy` for a serving Proxy, `Provisioned` while it
/// is built, held back or failed.
pub fn ready_condition(status: &ProxyStatus) -> (ConditionStatus, String, String) {
    let blocking = |type_: &str| {
        condition::find(&status.conditions, type_)
            .filter(|c| c.status != ConditionStatus::True)
            .map(|c| (ConditionStatus::False, c.reason.clone(), c.message.clone()))
    };
    let fallback = |reason: &str, message: &str| {
        (
            ConditionStatus::False,
            reason.to_string(),
            message.to_string(),
        )
    };
    match status.phase {
        Some(ProxyPhase::Ready) => (
            ConditionStatus::True,
            REASON_PROXY_READY.to_string(),
            "probes pass through the proxy; it is advertised and leased".to_string(),
        ),
        Some(ProxyPhase::Running) => blocking(HEALTHY)
            .or_else(|| blocking(PROVISIONED))
            .unwrap_or_else(|| {
                fallback(
                    REASON_AWAITING_VERDICT,
                    "no probe verdict through the proxy yet",
                )
            }),
        Some(ProxyPhase::Provisioning | ProxyPhase::Failed) | None => blocking(PROVISIONED)
            .or_else(|| blocking(HEALTHY))
            .unwrap_or_else(|| fallback(REASON_PENDING, "the operator has not acted on it yet")),
    }
}

/// Sets the `Ready` condition from the rest of `status`, and records
/// `generation` as acted on: on the status, and on every condition but
/// `Provisioned`, whose generation is the operator's latch (a
/// PermanentError at the current generation) and is set by its builders.
pub fn summarize(status: &mut ProxyStatus, generation: Option<i64>, now: DateTime<Utc>) {
    let (s, reason, message) = ready_condition(status);
    condition::set(
        &mut status.conditions,
        Condition::new(READY, s, &reason, message, now),
    );
    for c in status
        .conditions
        .iter_mut()
        .filter(|c| c.type_ != PROVISIONED)
    {
        c.observed_generation = generation;
    }
    status.observed_generation = generation;
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
