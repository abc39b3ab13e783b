//! `spec.auth`: who may use a proxy.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How clients authenticate to the proxy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyAuth {
    /// `Basic` (the default): the proxy asks for a username and password
    /// (a Managed Proxy's are generated per instance into a Secret the
    /// Proxy owns, and handed out with its leases). `None`: no
    /// credentials; guard the network yourself. Changing it replaces the
    /// instance.
    #[serde(default)]
    pub mode: AuthMode,
    /// External Proxies only: a Secret in the Proxy's namespace with keys
    /// `username` and `password`, labelled
    /// `crawl.example.com/proxy-credentials: "true"` (the operator reads
    /// only labelled Secrets). Probes and leases use them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretName>,
}

/// A Secret in the Proxy's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretName {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Whether the proxy asks for credentials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AuthMode {
    /// Username and password (HTTP Basic, `Proxy-Authorization`).
    #[default]
    Basic,
    /// None: any client that can reach it may use it.
    None,
}

impl ProxyAuth {
    /// The mode of an optional `spec.auth` (absent: `Basic`).
    pub fn mode_of(auth: Option<&ProxyAuth>) -> AuthMode {
        auth.map(|a| a.mode).unwrap_or_default()
    }
}

/// A cloud-init the operator writes itself (`spec.cloudInit.builtin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Builtin {
    /// Squid from the image's packages, configured as the kubernetes
    /// provider's Pods are, asking for the Proxy's credentials.
    Squid,
}
