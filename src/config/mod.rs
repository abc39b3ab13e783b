//! The providers config file (`--providers-config`): named provider
//! entries with strict parsing and load-time validation. Every error names
//! the entry (index and name), the key and the reason, and all entries are
//! checked before anything dials a backend.

mod fleet;
mod gcp;
mod kubernetes;
mod kvm;
mod limits;
mod provider_type;
pub mod reload;
mod validate;

use std::fmt;
use std::path::Path;

use serde::Deserialize;

pub use gcp::{
    allowed, default_allowed_ports, FirewallConfig, GcpConfig, PortEntry, DEFAULT_ALLOWED_PORTS,
};
pub use kubernetes::{DestinationRules, Destinations, DEFAULT_DENIED, NEVER_REACHED};
pub use kvm::{DomainType, Firmware, ImageFormat, KvmConfig, KvmHost, KvmImage, MachineType};
pub use limits::{
    CreateLimits, DEFAULT_CREATES_PER_MINUTE, DEFAULT_MAX_CREATES_IN_FLIGHT,
    DEFAULT_STARTUP_TIMEOUT, MAX_CREATES_PER_MINUTE, MAX_MAX_CREATES_IN_FLIGHT,
    MIN_STARTUP_TIMEOUT,
};
pub use provider_type::ProviderType;
pub use validate::http_url;

/// The whole providers file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProvidersConfig {
    /// Entries in file order.
    pub providers: Vec<ProviderConfig>,
}

/// One named provider.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfig {
    /// The name Proxies refer to in `spec.provider`; a DNS-1123 label.
    pub name: String,
    /// The backend type.
    pub provider_type: ProviderType,
    /// The type's settings.
    pub settings: ProviderSettings,
    /// `createsPerMinute` and `maxCreatesInFlight` (every type).
    pub limits: CreateLimits,
    /// `maxUnavailable`: how many of the provider's proxies may be
    /// recycled at once (default 1).
    pub max_unavailable: crate::fleet::MaxUnavailable,
    /// `maxSurge`: how many replacements of serving proxies may be created
    /// before the instances they replace go (default 0: they drain first).
    pub max_surge: crate::fleet::MaxUnavailable,
    /// `circuitBreaker`: when the provider's breaker opens (default more
    /// than 50% of 3 or more Ready proxies lost within 5 minutes).
    pub circuit_breaker: crate::fleet::BreakerPolicy,
}

/// Per-type settings: exactly the block that matches the type.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderSettings {
    /// `kubernetes:` (optional block).
    Kubernetes(KubernetesConfig),
    /// `gcp:`.
    Gcp(GcpConfig),
    /// `kvm:`.
    Kvm(KvmConfig),
}

impl ProviderSettings {
    /// The destination rules of the block: what the kubernetes provider's
    /// Pods, and the built-in setup of VMs, refuse to reach.
    pub fn destinations(&self) -> &Destinations {
        match self {
            ProviderSettings::Kubernetes(k) => &k.destinations,
            ProviderSettings::Gcp(g) => &g.destinations,
            ProviderSettings::Kvm(k) => &k.destinations,
        }
    }
}

/// The `kubernetes` block.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesConfig {
    /// Container image of the Squid Pod.
    #[serde(default = "default_squid_image")]
    pub image: String,
    /// Which addresses the Squid refuses to reach.
    #[serde(default)]
    pub destinations: Destinations,
}

/// Image of the Squid Pod when the block does not name one.
pub const DEFAULT_SQUID_IMAGE: &str = "ubuntu/squid:6.6-24.04_edge";

fn default_squid_image() -> String {
    DEFAULT_SQUID_IMAGE.to_string()
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            image: default_squid_image(),
            destinations: Destinations::default(),
        }
    }
}

/// Why a providers file was refused: every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// One message per problem, each naming where it is.
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("\n"))
    }
}

impl ConfigError {
    fn one(msg: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![msg.into()],
        }
    }
}

/// Error loading the file itself.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read providers config {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid config.
    #[error("invalid providers config {path}:\n{source}")]
    Invalid {
        /// The path given.
        path: String,
        /// What is wrong.
        source: ConfigError,
    },
}

impl ProvidersConfig {
    /// Reads and validates a providers file.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_slice(&bytes).map_err(|source| LoadError::Invalid {
            path: shown,
            source,
        })
    }

    /// Parses and validates a providers document.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ConfigError> {
        validate::parse(bytes)
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// Configured names in file order.
    pub fn names(&self) -> Vec<&str> {
        self.providers.iter().map(|p| p.name.as_str()).collect()
    }
}
