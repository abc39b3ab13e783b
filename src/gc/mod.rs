//! Orphan GC (operator.md §5): deletes instances of this installation whose
//! Proxy is gone. The decisions are pure ([`select`]); this module lists,
//! deletes and logs.

pub mod metrics;
pub mod select;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use tracing::{debug, error, info, warn, Instrument};

use crate::api::{ProviderHealth, Proxy};
use crate::controller::plan::{jitter, Random, SystemRandom};
use crate::events::Events;
use crate::paged;
use crate::provider::error::plain_message;
use crate::provider::registry::Registry;
pub use metrics::{GcMetrics, SweepResult};
pub use select::{Rules, Verdict};

/// GC settings from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Time between sweeps; the first sweep runs one interval after start.
    pub interval: Duration,
    /// Instances younger than this are kept.
    pub min_age: Duration,
    /// Deletes per sweep, across providers.
    pub max_deletes: u32,
    /// This installation's identity.
    pub installation_id: String,
}

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Whether the sweep ran (false when the Proxy list failed).
    pub ran: bool,
    /// Instances deleted.
    pub deleted: u32,
    /// Providers whose list failed.
    pub failed_providers: Vec<String>,
    /// Whether the sweep stopped early because it ran past half of
    /// `--gc-min-age`.
    pub aborted: bool,
}

/// The GC runnable.
pub struct Gc {
    client: Client,
    registry: Registry,
    settings: Settings,
    metrics: GcMetrics,
    first_seen: HashMap<String, DateTime<Utc>>,
    events: Option<Events>,
}

impl Gc {
    /// A collector writing its series into `metrics`; nothing runs until
    /// [`Gc::run`].
    pub fn new(client: Client, registry: Registry, settings: Settings, metrics: GcMetrics) -> Self {
        Gc {
            client,
            registry,
            settings,
            metrics,
            first_seen: HashMap::new(),
            events: None,
        }
    }

    /// Records each provider's collected orphans as an Event on its
    /// ProviderHealth through `events` (the process's one recorder).
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = Some(events);
        self
    }

    /// Sweeps every interval until `shutdown` resolves; an interval of 0
    /// turns GC off.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        if self.settings.interval.is_zero() {
            info!("Orphan GC is off (--gc-interval=0)");
            return;
        }
        info!(
            interval = ?self.settings.interval,
            minAge = ?self.settings.min_age,
            maxDeletes = self.settings.max_deletes,
            "Starting orphan GC"
        );
        let names: Vec<&str> = self.registry.providers().map(|(n, _)| n).collect();
        self.metrics.start(&names);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                // Jittered, so sweeps of replicas started together (and
                // the API list calls they make) do not line up.
                _ = tokio::time::sleep(jitter(self.settings.interval, SystemRandom.unit())) => {}
            }
            self.sweep().await;
        }
    }

    /// One pass over every configured provider.
    pub async fn sweep(&mut self) -> SweepReport {
        let span = tracing::info_span!(
            parent: None,
            "gc.sweep",
            otel.kind = "internal",
            gc.providers = tracing::field::Empty,
            gc.deleted = tracing::field::Empty,
        );
        let report = self.sweep_inner().instrument(span.clone()).await;
        span.record("gc.deleted", i64::from(report.deleted));
        report
    }

    async fn sweep_inner(&mut self) -> SweepReport {
        let mut report = SweepReport::default();
        let started = tokio::time::Instant::now();
        let providers: Vec<_> = self
            .registry
            .providers()
            .map(|(n, p)| (n.to_string(), p.clone()))
            .collect();
        tracing::Span::current().record("gc.providers", providers.len() as i64);

        // Every provider's instances are listed before the live Proxy set:
        // an instance listed here was created after its Proxy, so that
        // Proxy is in the set read afterwards unless it is really gone. The
        // other order lets a Proxy created mid-sweep look orphaned.
        let mut listings = Vec::with_capacity(providers.len());
        for (name, provider) in providers {
            match provider.list_by_tag().await {
                Ok(listing) => listings.push((name, provider, listing, Utc::now())),
                Err(e) => {
                    error!(provider = %name, error = %plain_message(&e), "Listing instances failed; skipping this provider");
                    self.metrics.sweep(&name, SweepResult::Error);
                    report.failed_providers.push(name);
                }
            }
        }

        // Cluster-wide and uncached, so a Proxy in a namespace this replica
        // does not watch is never mistaken for gone. Only UIDs are needed:
        // metadata, in pages.
        let proxies: Api<Proxy> = Api::all(self.client.clone());
        let live: HashSet<String> = match paged::list_metadata(&proxies, &ListParams::default())
            .await
        {
            Ok(items) => items.into_iter().filter_map(|p| p.metadata.uid).collect(),
            Err(e) => {
                error!(error = %plain_message(&e), "Listing Proxies failed; skipping this GC sweep");
                for (name, ..) in &listings {
                    self.metrics.sweep(name, SweepResult::Error);
                }
                return report;
            }
        };
        report.ran = true;

        let mut budget = self.settings.max_deletes;
        let mut listings = listings.into_iter();
        while let Some((name, provider, listing, now)) = listings.next() {
            if select::overran(started.elapsed(), self.settings.min_age) {
                self.abort(&name, listings.map(|(n, ..)| n), started.elapsed());
                report.aborted = true;
                return report;
            }
            if !listing.unread_scopes.is_empty() {
                warn!(provider = %name, unread = ?listing.unread_scopes, "WARNING: some scopes could not be listed; their instances are not collected");
            }
            select::track_first_seen(&mut self.first_seen, &name, &listing.instances, now);
            let first_seen = select::first_seen_of(&self.first_seen, &name);
            let rules = Rules {
                installation_id: &self.settings.installation_id,
                live: &live,
                now,
                min_age: self.settings.min_age,
                first_seen: &first_seen,
            };
            let verdicts = select::select(&listing.instances, &rules, &mut budget);
            let mut collected = Vec::new();
            for (inst, v) in listing.instances.iter().zip(verdicts) {
                match v {
                    Verdict::Delete
                        if select::overran(started.elapsed(), self.settings.min_age) =>
                    {
                        // What was listed is too old to act on; the rest
                        // of this provider and the providers after it wait
                        // for the next sweep.
                        self.abort(&name, listings.map(|(n, ..)| n), started.elapsed());
                        report.aborted = true;
                        return report;
                    }
                    Verdict::Delete => match provider.delete(&inst.id).await {
                        Ok(()) => {
                            report.deleted += 1;
                            collected.push(inst.id.clone());
                            self.metrics.deleted(&name);
                            info!(provider = %name, providerID = %inst.id, uid = %inst.uid, "Deleted orphaned instance");
                        }
                        Err(e) => {
                            self.metrics.delete_failed(&name);
                            error!(provider = %name, providerID = %inst.id, uid = %inst.uid, error = %plain_message(&e), "Deleting orphaned instance failed");
                        }
                    },
                    Verdict::OverBudget => {
                        warn!(provider = %name, providerID = %inst.id, uid = %inst.uid, max = self.settings.max_deletes, "WARNING: GC delete budget for this sweep used up; orphan kept until the next sweep");
                    }
                    other => {
                        debug!(provider = %name, providerID = %inst.id, verdict = ?other, "GC keeps instance");
                    }
                }
            }
            self.metrics.sweep(&name, SweepResult::Ok);
            self.record_collected(&name, &collected).await;
            // What the provider shares between instances (gcp firewall
            // rules), by the listing just read.
            match provider
                .collect_shared(&self.settings.installation_id)
                .await
            {
                Ok(gone) if !gone.is_empty() => {
                    info!(provider = %name, deleted = ?gone, "Deleted shared objects no instance needs");
                }
                Ok(_) => {}
                Err(e) => {
                    error!(provider = %name, error = %plain_message(&e), "Collecting shared objects failed");
                }
            }
        }
        report
    }

    /// An `OrphansCollected` Event on the ProviderHealth of `provider`,
    /// best effort.
    async fn record_collected(&self, provider: &str, ids: &[String]) {
        let (Some(events), Some(note)) = (&self.events, select::collected_note(ids)) else {
            return;
        };
        let api: Api<ProviderHealth> = Api::all(self.client.clone());
        let regarding = match api.get_opt(provider).await {
            Ok(Some(obj)) => obj.object_ref(&()),
            // A sweep may beat the ProviderHealth writer's first publish:
            // the Event still names the object, by name alone.
            Ok(None) => ProviderHealth::new(provider).object_ref(&()),
            Err(e) => {
                warn!(provider = %provider, error = %plain_message(&e), "Reading ProviderHealth to record an Event");
                return;
            }
        };
        events.record(&regarding, note).await;
    }

    /// Ends a sweep that ran past half of `--gc-min-age`: `current` and the
    /// providers not reached count `aborted`.
    fn abort(&self, current: &str, rest: impl Iterator<Item = String>, elapsed: Duration) {
        warn!(
            provider = %current,
            elapsed = ?elapsed,
            minAge = ?self.settings.min_age,
            "WARNING: GC sweep ran past half of --gc-min-age; stopping it so that no decision rests on a stale listing"
        );
        self.metrics.sweep(current, SweepResult::Aborted);
        for name in rest {
            self.metrics.sweep(&name, SweepResult::Aborted);
        }
    }
}
