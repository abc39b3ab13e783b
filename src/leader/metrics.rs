//! Leadership series: whether this replica runs leader-only work, and why
//! it stepped down.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::decide::StepDown;
use crate::metrics::Registrar;

/// Labels of the step-down counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    /// `lost` or `deadline` ([`StepDown::as_str`]).
    reason: String,
}

impl StepDown {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StepDown::Lost => "lost",
            StepDown::DeadlinePassed => "deadline",
        }
    }
}

/// Series written by the election and the composition root.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetrics {
    leading: Gauge,
    step_downs: Family<ReasonLabel, Counter>,
}

impl LeaderMetrics {
    /// The families, registered in `registry`; both step-down reasons
    /// start at zero.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = LeaderMetrics::default();
        registry.register(
            "proxy_operator_leader",
            "1 while this replica runs the leader-only work (controller, GC, health engine, provider checks), else 0",
            m.leading.clone(),
        );
        registry.register(
            "proxy_operator_leader_step_downs",
            "Times this replica stepped down, by reason (lost: another replica holds the Lease; deadline: no renewal within the renew deadline)",
            m.step_downs.clone(),
        );
        for why in [StepDown::Lost, StepDown::DeadlinePassed] {
            let _ = m.step_downs.get_or_create(&ReasonLabel {
                reason: why.as_str().to_string(),
            });
        }
        m
    }

    /// Leader-only work runs (`true`) or has stopped.
    pub fn set_leading(&self, leading: bool) {
        self.leading.set(i64::from(leading));
    }

    /// Counts one step-down.
    pub fn stepped_down(&self, why: StepDown) {
        self.step_downs
            .get_or_create(&ReasonLabel {
                reason: why.as_str().to_string(),
            })
            .inc();
    }
}
