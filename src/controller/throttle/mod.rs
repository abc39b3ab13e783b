//! The create limiters every reconcile shares: one
//! [`CreateLimiter`](crate::controller::throttle::limiter::CreateLimiter) per
//! configured provider, with that provider's `createsPerMinute` and
//! `maxCreatesInFlight`, behind one lock. The decisions are the plan's
//! ([`limiter`]); this only
//! keeps their state and counts what they held back.

pub mod limiter;
pub mod metrics;

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::config::{CreateLimits, ProvidersConfig};
use crate::controller::throttle::limiter::{Admission, CreateGate, CreateLimiter, Gauges, Held};
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

/// The create gate of the Proxy `uid` on `provider` at `now`, asked in
/// order: the hold after its last create was refused with a slow retry
/// (until then, whatever started this pass), the provider's
/// `maxInstances` (a create it holds takes no token from the bucket),
/// then the provider's create limits (a token taken when it may go).
/// `own`: the instances the Proxy keeps while this one is created (its
/// current one, for a surge replacement), counted under `maxInstances`.
pub fn create_gate(
    ctx: &crate::controller::Context,
    provider: &str,
    (uid, own): (&str, usize),
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> CreateGate {
    if let Some(wait) = ctx.create_wait(uid, generation, now) {
        return CreateGate::Held(Held::Refused { wait });
    }
    let limits = ctx.throttle.limits(provider);
    if let Some(max) = limits.max_instances {
        if let Err(held) = ctx.fleet.admit_create(provider, uid, (max, own), now) {
            return CreateGate::Held(Held::InstanceLimit { max, held });
        }
    }
    match ctx.throttle.admit(provider, uid, now) {
        Admission::Go => CreateGate::Go,
        Admission::Wait { hold, until } => CreateGate::Held(Held::Throttled {
            hold,
            until,
            limits,
        }),
    }
}
