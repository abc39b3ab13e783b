//! The one list of provider types, and the registry that builds every
//! configured provider (all or nothing), keeps the checkers of the
//! undecorated providers, and hands out decorated providers by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::decorators::{MetricsProvider, TracingProvider};
use super::metrics::ProviderMetrics;
use super::{Checker, Provider};
use crate::config::{DestinationRules, Destinations, ProviderConfig, ProvidersConfig};

pub use crate::config::ProviderType;

/// A constructor failed; the message names the provider.
#[derive(Debug, thiserror::Error)]
#[error("provider {name:?} ({provider_type}): {message}")]
pub struct BuildError {
    /// Configured name.
    pub name: String,
    /// Its type.
    pub provider_type: ProviderType,
    /// Why it could not be built (a config problem; constructors never dial).
    pub message: String,
}

/// A configured provider's health check, taken from the undecorated provider.
#[derive(Clone)]
pub struct CheckerEntry {
    /// Configured name.
    pub name: String,
    /// Its type.
    pub provider_type: ProviderType,
    /// The check, or `None` when the type has none ("checks not implemented").
    pub checker: Option<Arc<dyn Checker>>,
}

/// Every configured provider, decorated, plus the checkers of the
/// undecorated ones in config order.
#[derive(Clone, Default)]
pub struct Registry {
    providers: BTreeMap<String, Arc<dyn Provider>>,
    checkers: Vec<CheckerEntry>,
    /// Each provider's destination rules (`<type>.destinations`).
    destinations: BTreeMap<String, DestinationRules>,
}

impl Registry {
    /// Builds every entry with `construct`, all or nothing, and wraps each
    /// as tracing(metrics(provider)). `construct` must not dial backends.
    pub fn build<F>(
        config: &ProvidersConfig,
        metrics: &ProviderMetrics,
        construct: F,
    ) -> Result<Self, BuildError>
    where
        F: Fn(&ProviderConfig) -> Result<Arc<dyn Provider>, String>,
    {
        let mut reg = Registry::default();
        for entry in &config.providers {
            let raw = construct(entry).map_err(|message| BuildError {
                name: entry.name.clone(),
                provider_type: entry.provider_type,
                message,
            })?;
            reg.checkers.push(CheckerEntry {
                name: entry.name.clone(),
                provider_type: entry.provider_type,
                checker: raw.checker(),
            });
            let decorated: Arc<dyn Provider> = Arc::new(TracingProvider::new(Arc::new(
                MetricsProvider::new(raw, metrics.clone()),
            )));
            reg.providers.insert(entry.name.clone(), decorated);
            reg.destinations.insert(
                entry.name.clone(),
                DestinationRules::of(entry.settings.destinations()),
            );
        }
        Ok(reg)
    }

    /// Wraps each decorated provider without a watch of its own (gcp, kvm)
    /// in an observation by one listing every `interval`
    /// ([`super::listed`]), each wait shortened by `spread`; `None` leaves
    /// them to a `get` per check.
    pub fn observed_by_listing(
        mut self,
        interval: Option<std::time::Duration>,
        spread: super::listed::Spread,
    ) -> Self {
        let Some(interval) = interval else {
            return self;
        };
        for provider in self.providers.values_mut() {
            if matches!(
                provider.provider_type(),
                ProviderType::Gcp | ProviderType::Kvm
            ) {
                *provider = Arc::new(super::listed::Listed::new(
                    provider.clone(),
                    interval,
                    spread,
                ));
            }
        }
        self
    }

    /// The decorated provider called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        self.providers.get(name).cloned()
    }

    /// Whether `name` is configured.
    pub fn contains(&self, name: &str) -> bool {
        self.providers.contains_key(name)
    }

    /// Decorated providers by name.
    pub fn providers(&self) -> impl Iterator<Item = (&str, &Arc<dyn Provider>)> {
        self.providers.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The destination rules of provider `name` (the default denials when
    /// it is not configured).
    pub fn destinations(&self, name: &str) -> DestinationRules {
        self.destinations
            .get(name)
            .cloned()
            .unwrap_or_else(|| DestinationRules::of(&Destinations::default()))
    }

    /// Health checks in config order.
    pub fn checkers(&self) -> &[CheckerEntry] {
        &self.checkers
    }
}

/// What constructors may use. Constructors never dial.
#[derive(Clone)]
pub struct Deps {
    /// The operator's Kubernetes client.
    pub client: kube::Client,
    /// The API server URL of that client, for the kubernetes check.
    pub api_url: String,
    /// `--gcp-wire-log-full-payloads`.
    pub gcp_wire_log_full_payloads: bool,
    /// `--provider-list-interval`: how often providers without a watch are
    /// listed to observe them; `None` when off.
    pub list_interval: Option<std::time::Duration>,
}

/// Builds the provider for one config entry: the single dispatch over
/// [`ProviderType`]s, exhaustive so a new type cannot be forgotten.
pub fn construct(entry: &ProviderConfig, deps: &Deps) -> Result<Arc<dyn Provider>, String> {
    use crate::config::ProviderSettings;
    match &entry.settings {
        ProviderSettings::Kubernetes(cfg) => {
            Ok(Arc::new(super::kubernetes::KubernetesProvider::new(
                &entry.name,
                cfg,
                deps.client.clone(),
                &deps.api_url,
            )))
        }
        #[cfg(feature = "gcp")]
        ProviderSettings::Gcp(cfg) => {
            let opts = super::gcp::GcpOptions {
                wire_log_full_payloads: deps.gcp_wire_log_full_payloads,
                ..Default::default()
            };
            Ok(Arc::new(super::gcp::GcpProvider::new(
                &entry.name,
                cfg,
                opts,
            )?))
        }
        #[cfg(not(feature = "gcp"))]
        ProviderSettings::Gcp(_) => {
            Err("this build has no gcp provider (built without the gcp feature)".into())
        }
        #[cfg(feature = "kvm")]
        ProviderSettings::Kvm(cfg) => Ok(Arc::new(super::kvm::KvmProvider::new(&entry.name, cfg)?)),
        #[cfg(not(feature = "kvm"))]
        ProviderSettings::Kvm(_) => {
            Err("this build has no kvm provider (built without the kvm feature)".into())
        }
    }
}
