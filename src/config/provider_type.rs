//! The one list of provider types. It belongs to the configuration (the
//! providers file names them); the provider registry dispatches on it.

use std::fmt;

/// Every provider type the operator knows. Config validation, the
/// registry's constructor dispatch and the docs all derive from this enum,
/// so a type cannot be accepted by one and unknown to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProviderType {
    /// Squid Pods in the cluster.
    Kubernetes,
    /// Compute Engine VMs.
    Gcp,
    /// libvirt VMs on hypervisors reached over SSH.
    Kvm,
}

impl ProviderType {
    /// All types, in documentation order.
    pub const ALL: [ProviderType; 3] = [
        ProviderType::Kubernetes,
        ProviderType::Gcp,
        ProviderType::Kvm,
    ];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderType::Kubernetes => "kubernetes",
            ProviderType::Gcp => "gcp",
            ProviderType::Kvm => "kvm",
        }
    }

    /// Parses the config spelling (exact, lowercase).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for ProviderType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
