//! The provider contract: the only code that knows a backend implements
//! [`Provider`]; everything above it branches on [`ErrorClass`] and
//! [`InstanceState`] alone. See docs/providers.md for the rules.

pub mod decorators;
pub mod error;
pub mod fake;
#[cfg(feature = "gcp")]
pub mod gcp;
pub mod kubernetes;
#[cfg(feature = "kvm")]
pub mod kvm;
pub mod listed;
pub mod metrics;
pub mod naming;
pub mod registry;
pub mod slot;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{Placement, Proxy};
pub use error::{class_of, BoxError, ErrorClass, Op, ProviderError, Tagged};

/// Cloud-init user-data. Its `Debug` prints only the byte count, so a
/// request can be logged without leaking secrets the document may hold.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct UserData(String);

impl UserData {
    /// Wraps resolved cloud-init text.
    pub fn new(text: impl Into<String>) -> Self {
        UserData(text.into())
    }
    /// The document, for the backend call that delivers it. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// Size in bytes, which is what logs and spans may carry.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether there is no user-data.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserData(<{} bytes>)", self.0.len())
    }
}

/// What the reconciler asks a provider to build.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateRequest {
    /// Deterministic instance name from the Proxy UID ([`naming::name_from_uid`]).
    pub name: String,
    /// The owning Proxy's UID, written as the backend's UID mark.
    pub uid: String,
    /// The Proxy's namespace.
    pub namespace: String,
    /// The Proxy's name.
    pub proxy_name: String,
    /// `spec.placement`, all-empty when absent.
    pub placement: Placement,
    /// Resolved cloud-init text.
    pub cloud_init: UserData,
    /// `spec.port`.
    pub port: u16,
    /// This installation's identity, written as the installation mark so GC
    /// never touches another cluster's instances.
    pub installation_id: String,
    /// The credentials the instance must ask for; `None`: it asks for none.
    pub credentials: Option<InstanceCredentials>,
}

/// An instance's credentials and the Secret (in the Proxy's namespace, named
/// as the instance) that holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceCredentials {
    /// The Secret's name; its keys are `username`, `password`, `htpasswd`.
    pub secret_name: String,
    /// What it holds.
    pub credentials: crate::credentials::Credentials,
}

/// Lifecycle state of an instance as the reconciler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Exists but not usable yet (booting, no address, undeterminable).
    Provisioning,
    /// Usable; only ever reported with a non-empty IP.
    Running,
    /// Will not recover by itself (also every unknown backend state).
    Stopped,
    /// Gone for good or going (will not recover by itself).
    Terminated,
}

impl InstanceState {
    /// The capitalised name used in logs and status messages.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Provisioning => "Provisioning",
            InstanceState::Running => "Running",
            InstanceState::Stopped => "Stopped",
            InstanceState::Terminated => "Terminated",
        }
    }
}

/// An instance as read back from the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The providerID (self-contained: it holds the location).
    pub id: String,
    /// Address clients and probes connect to; empty while unknown.
    pub ip: String,
    /// Lifecycle state.
    pub state: InstanceState,
    /// Owning Proxy UID from the backend's mark; empty when unmarked.
    pub uid: String,
    /// Installation identity from the backend's mark; empty when unmarked.
    pub installation_id: String,
    /// Creation time from the backend; `None` when unknown or unparseable.
    pub created_at: Option<DateTime<Utc>>,
}

impl Instance {
    /// An instance with only an ID and a state; marks and times unknown.
    pub fn new(id: impl Into<String>, state: InstanceState) -> Self {
        Instance {
            id: id.into(),
            ip: String::new(),
            state,
            uid: String::new(),
            installation_id: String::new(),
            created_at: None,
        }
    }
}

/// The result of ListByTag: the managed instances that could be read, and
/// the scopes (zones, hosts) that could not. Instances from unread scopes are
/// simply absent, which is safe for GC: it never deletes what is not listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Instances carrying the managed mark.
    pub instances: Vec<Instance>,
    /// Scopes left out, with why, for logs and metrics.
    pub unread_scopes: Vec<String>,
}

/// What a provider's own observation (a watch, a periodic listing) says of
/// one instance, without a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// Held by a running watch: the instance as it is now.
    Current(Instance),
    /// In the newest listing, which started at `listed_at`: the instance
    /// as it was then (the reconciler takes it only for an instance that
    /// was already running before that).
    Listed {
        /// The instance as listed.
        instance: Instance,
        /// When the listing started.
        listed_at: DateTime<Utc>,
    },
    /// The observation cannot answer (not started, not synced, or the
    /// instance is absent from it): ask `get`. Absence alone never means
    /// gone, since an instance created a moment ago may not be seen yet.
    Unknown,
}

/// The Proxies whose instances a provider's observation saw change.
pub type Changes = futures::stream::BoxStream<'static, ObjectRef<Proxy>>;

/// One compute backend. Implementations must be safe for concurrent use
/// (reconciles, a GC sweep and a health round call at once) and must return
/// errors built with [`ProviderError`], classified at this edge.
///
/// Cancellation: dropping a returned future must abandon the call without
/// disturbing other calls in flight.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The configured name (what `spec.provider` refers to).
    fn name(&self) -> &str;

    /// The provider's type.
    fn provider_type(&self) -> registry::ProviderType;

    /// Creates the instance named `req.name`, or returns the ID of the one
    /// that already exists under that name (after checking it carries
    /// `req.uid`). Should return once the request is submitted.
    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError>;

    /// Reads the instance: always a backend call (the reconciler asks
    /// [`Provider::observed`] first). `NotFound` only when it is really
    /// gone, never while a delete is in progress.
    async fn get(&self, id: &str) -> Result<Instance, ProviderError>;

    /// Deletes the instance and everything create made. Idempotent.
    async fn delete(&self, id: &str) -> Result<(), ProviderError>;

    /// Every instance carrying the managed mark, for orphan GC, which reads
    /// IDs, marks and creation times only: a provider may list less (the
    /// kubernetes provider lists Pod metadata, leaving `ip` and `state`).
    async fn list_by_tag(&self) -> Result<Listing, ProviderError>;

    /// Deletes what the provider shares between the instances of
    /// `installation_id` (gcp: the firewall rule of a port) that none of
    /// them needs any more, by what its last `list_by_tag` saw; returns
    /// what it deleted. GC calls it after each listing.
    async fn collect_shared(&self, _installation_id: &str) -> Result<Vec<String>, ProviderError> {
        Ok(Vec::new())
    }

    /// The instance as the provider's observation last saw it; the
    /// reconciler asks this before `get`, which it calls only on
    /// [`Observation::Unknown`]. No I/O.
    fn observed(&self, _id: &str) -> Observation {
        Observation::Unknown
    }

    /// Starts the provider's observation of the instances of Proxies in
    /// `namespace` (all when `None`): polling the returned stream keeps it
    /// filled and yields the Proxies whose instances changed (found in
    /// `proxies` by the instance's UID mark, when the backend has no owner
    /// reference); dropping it ends the observation, so it lives exactly
    /// as long as the controller that polls it. `None` when the provider
    /// observes nothing.
    fn observe(&self, _namespace: Option<&str>, _proxies: &Store<Proxy>) -> Option<Changes> {
        None
    }

    /// The provider's health check, if it has one. Decorators deliberately
    /// do not forward this: checks are never counted or traced as calls.
    fn checker(&self) -> Option<Arc<dyn Checker>> {
        None
    }
}

/// The verdict for one target of a provider health check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetStatus {
    /// Target name within the provider (a host, `apiserver`, a project).
    pub name: String,
    /// Where the check connected.
    pub address: String,
    /// Whether the check passed.
    pub ready: bool,
    /// `Reachable` when ready, otherwise a CamelCase reason.
    pub reason: String,
    /// Detail, usually the error text.
    pub message: String,
    /// How long this target's check took.
    pub latency: Duration,
    /// Provider-specific facts.
    pub details: std::collections::BTreeMap<String, String>,
}

/// A provider's health check: one verdict per target, never an error.
#[async_trait]
pub trait Checker: Send + Sync {
    /// Checks every target. Must return promptly once dropped or timed out,
    /// and must not disturb reconciles sharing a connection.
    async fn check(&self) -> Vec<TargetStatus>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_debug_never_shows_content() {
        let req = CreateRequest {
            cloud_init: UserData::new("#cloud-config\npassword: SENTINEL-SECRET\n"),
            ..Default::default()
        };
        let shown = format!("{req:?}");
        assert!(!shown.contains("SENTINEL-SECRET"), "{shown}");
        assert!(shown.contains("<40 bytes>"), "{shown}");
        assert_eq!(req.cloud_init.expose().len(), req.cloud_init.len());
    }
}
