//! The create limiters every reconcile shares: one
//! [`CreateLimiter`](crate::controller::plan::throttle::CreateLimiter) per
//! configured provider, with that provider's `createsPerMinute` and
//! `maxCreatesInFlight`, behind one lock. The decisions are the plan's
//! ([`plan::throttle`](crate::controller::plan::throttle)); this only
//! keeps their state and counts what they held back.

pub mod metrics;

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::config::{CreateLimits, ProvidersConfig};
use crate::controller::plan::throttle::{Admission, CreateLimiter, Gauges};
pub use metrics::ThrottleMetrics;

/// Every provider's create limiter. A provider that is not configured
/// (a test's context) gets the default limits.
#[derive(Debug, Default)]
pub struct Throttle {
    limits: BTreeMap<String, CreateLimits>,
    limiters: Mutex<BTreeMap<String, CreateLimiter>>,
    metrics: Option<ThrottleMetrics>,
}

impl Throttle {
    /// The limiters of every provider in `config`, full.
    pub fn new(config: &ProvidersConfig) -> Self {
        Throttle {
            limits: config
                .providers
                .iter()
                .map(|p| (p.name.clone(), p.limits))
                .collect(),
            ..Default::default()
        }
    }

    /// Counts held creates into `metrics`.
    pub fn with_metrics(mut self, metrics: ThrottleMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The limits of `provider`.
    pub fn limits(&self, provider: &str) -> CreateLimits {
        self.limits.get(provider).copied().unwrap_or_default()
    }

    fn with<R>(&self, provider: &str, f: impl FnOnce(&mut CreateLimiter) -> R) -> R {
        let mut all = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(provider.to_string()).or_default())
    }

    /// `f` on `provider`'s limiter if it has one (one is made by the first
    /// create or provisioning instance, so a name no Proxy creates on, such
    /// as an unconfigured one, never gets a limiter).
    fn with_existing(&self, provider: &str, f: impl FnOnce(&mut CreateLimiter)) {
        let mut all = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = all.get_mut(provider) {
            f(l);
        }
    }

    /// May the create of Proxy `key` on `provider` go at `now`? A held one
    /// is counted.
    pub fn admit(&self, provider: &str, key: &str, now: DateTime<Utc>) -> Admission {
        let limits = self.limits(provider);
        let admission = self.with(provider, |l| l.admit(&limits, key, now));
        if let Admission::Wait { hold, .. } = admission {
            self.held(provider, hold.metric_label());
        }
        admission
    }

    /// A create of `provider` held back for `reason` (a metric label).
    pub fn held(&self, provider: &str, reason: &str) {
        if let Some(m) = &self.metrics {
            m.held(provider, reason);
        }
    }

    /// See [`CreateLimiter::settle`].
    pub fn settle(&self, provider: &str, key: &str, provisioning: bool, now: DateTime<Utc>) {
        if provisioning {
            self.with(provider, |l| l.settle(key, true, now));
        } else {
            self.with_existing(provider, |l| l.settle(key, false, now));
        }
    }

    /// See [`CreateLimiter::create_failed`].
    pub fn create_failed(&self, provider: &str, key: &str) {
        self.with_existing(provider, |l| l.create_failed(key));
    }

    /// See [`CreateLimiter::forget`].
    pub fn forget(&self, provider: &str, key: &str) {
        self.with_existing(provider, |l| l.forget(key));
    }

    /// Every configured provider's gauges at `now`, in name order.
    pub fn gauges(&self, now: DateTime<Utc>) -> Vec<(String, Gauges)> {
        let all = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        self.limits
            .iter()
            .map(|(name, limits)| {
                let g = all
                    .get(name)
                    .map(|l| l.gauges(limits, now))
                    .unwrap_or_else(|| CreateLimiter::default().gauges(limits, now));
                (name.clone(), g)
            })
            .collect()
    }
}

/// Why a pass holds its create back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The provider's create limits, until then.
    Throttled {
        /// What holds it.
        hold: crate::controller::plan::throttle::Hold,
        /// The next try.
        until: DateTime<Utc>,
    },
    /// Replace backoff, until then.
    ReplaceBackoff {
        /// The next try.
        until: DateTime<Utc>,
    },
    /// The provider holds `held` instances, its `maxInstances` `max`.
    InstanceLimit {
        /// The cap.
        max: u32,
        /// Instances held.
        held: usize,
    },
}

/// Asks `provider`'s limiter whether the create of the Proxy `key` may go
/// now: `None` when it may (a token taken), or the pass's ending (see
/// [`hold`]) when it is held.
pub fn admit_or_hold(
    ctx: &crate::controller::Context,
    provider: &str,
    key: &str,
    status: &mut crate::api::ProxyStatus,
    now: DateTime<Utc>,
    generation: Option<i64>,
) -> Option<kube::runtime::controller::Action> {
    // The cap first: a create it holds takes no token from the bucket.
    if let Some(max) = ctx.throttle.limits(provider).max_instances {
        if let Err(held) = ctx.fleet.admit_create(provider, key, max, now) {
            let held = Held::InstanceLimit { max, held };
            return Some(hold(ctx, provider, held, status, now, generation));
        }
    }
    match ctx.throttle.admit(provider, key, now) {
        Admission::Go => None,
        Admission::Wait { hold: h, until } => {
            let held = Held::Throttled { hold: h, until };
            Some(hold(ctx, provider, held, status, now, generation))
        }
    }
}

/// Ends a pass whose create is held: its status says why and until when,
/// the hold is counted, and the Proxy comes back at that time (never
/// before, with a spread after it), not on every poll.
pub fn hold(
    ctx: &crate::controller::Context,
    provider: &str,
    held: Held,
    status: &mut crate::api::ProxyStatus,
    now: DateTime<Utc>,
    generation: Option<i64>,
) -> kube::runtime::controller::Action {
    use crate::controller::plan::{replace, throttle};
    let until = match held {
        Held::Throttled { hold, until } => {
            let limits = ctx.throttle.limits(provider);
            throttle::mark_create_throttled(
                status, provider, &limits, hold, until, now, generation,
            );
            until
        }
        Held::ReplaceBackoff { until } => {
            ctx.throttle.held(provider, "replace_backoff");
            replace::mark_replace_backoff(status, until, now, generation);
            until
        }
        Held::InstanceLimit { max, held } => {
            ctx.throttle.held(provider, "instance_limit");
            throttle::mark_instance_limit(status, provider, (max, held), now, generation);
            now + chrono::Duration::from_std(throttle::INSTANCE_LIMIT_RETRY).unwrap_or_default()
        }
    };
    kube::runtime::controller::Action::requeue(throttle::held_requeue(
        until,
        now,
        ctx.random.unit(),
    ))
}
