//! What the engine probes for one Proxy ([`probe_spec`]), from its spec
//! and status and the operator's defaults. Pure.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use url::Url;

use super::probe::{ProbeTarget, Wire};
use super::threshold::Thresholds;
use crate::api::{Proxy, ProxyMode, ProxyPhase};
use crate::credentials::CredentialsCache;
use crate::tenancy::{ExternalNamespaces, ProbeDenylist};

/// Operator-wide probe defaults (flags).
#[derive(Debug, Clone)]
pub struct Defaults {
    /// `--default-probe-url`.
    pub url: Url,
    /// `--default-probe-expected-status`.
    pub expected_status: u16,
    /// `--external-proxy-namespaces`: External Proxies elsewhere are never
    /// probed.
    pub external: Arc<ExternalNamespaces>,
    /// `--probe-deny-cidrs`: what an External endpoint must not resolve to.
    pub deny: Arc<ProbeDenylist>,
    /// The credentials Secrets the probes authenticate with.
    pub credentials: Arc<CredentialsCache>,
    /// `--probe-full-every`: of a healthy proxy with an https probe URL,
    /// every this many probes is the full fetch, the others check only
    /// that the CONNECT is accepted (1: every probe is full).
    pub full_every: u32,
}

/// Default seconds between probes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default probe timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest time between two walks of the whole Proxy cache, and the
/// engine's longest sleep.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);
/// How often the whole Proxy cache is walked when nothing asks for it:
/// the watch's events keep the schedule in step between walks, so this
/// only bounds how long a change no event announced (a credentials
/// lookup that changed by itself) can go unseen.
pub const WALK_EVERY: Duration = Duration::from_secs(60);
/// What the engine probes for one Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The Proxy's UID when the spec was taken.
    pub uid: String,
    /// `spec.provider`, empty for an External Proxy: a label of the
    /// fleet-wide probe series.
    pub provider: String,
    /// Where and what.
    pub target: ProbeTarget,
    /// What the probes send, built from `target` once.
    pub wire: Arc<Wire>,
    /// Time between probes.
    pub interval: Duration,
    /// Flip thresholds.
    pub thresholds: Thresholds,
}

fn positive(v: Option<i32>, default: u64) -> u64 {
    v.and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// What to probe for a Proxy, or `None` when it has nothing to probe:
/// being deleted, a Managed Proxy without a running instance (phase Running
/// or Ready with an IP), an External Proxy in a namespace not allowed to
/// have one, or an invalid endpoint or URL. An External target carries the
/// destination denylist, checked when its address is resolved.
pub fn probe_spec(p: &Proxy, d: &Defaults) -> Option<ProbeSpec> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let namespace = p.namespace().unwrap_or_default();
    let (host, port, deny) = match p.spec.mode {
        ProxyMode::External => {
            if !d.external.allows(&namespace) {
                return None;
            }
            let ep = p.spec.endpoint.as_ref()?;
            (ep.host.clone(), ep.port, Some(d.deny.clone()))
        }
        ProxyMode::Managed => {
            let st = p.status.as_ref()?;
            if !matches!(st.phase, Some(ProxyPhase::Running | ProxyPhase::Ready)) {
                return None;
            }
            (
                st.ip.clone().filter(|ip| !ip.is_empty())?,
                // Its instance's own port (a changed spec.port rolls).
                st.port.or(p.spec.port)?,
                None,
            )
        }
    };
    let port = u16::try_from(port).ok().filter(|p| *p > 0)?;
    // A proxy that takes credentials is probed only with them: without,
    // it would answer 407 and be taken for broken (until the Secret is
    // cached, or while it is missing, it is not probed at all).
    let credentials = match crate::credentials::secret_of(p) {
        Some(name) => Some(d.credentials.get(&namespace, name)?),
        None => None,
    };
    let hc = p.spec.health_check.clone().unwrap_or_default();
    let url = match &hc.url {
        Some(u) => Url::parse(u).ok()?,
        None => d.url.clone(),
    };
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    let expected_status = hc
        .expected_status
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(d.expected_status);
    let target = ProbeTarget {
        proxy_host: host,
        proxy_port: port,
        deny,
        url,
        expected_status,
        timeout: Duration::from_secs(positive(hc.timeout_seconds, DEFAULT_TIMEOUT.as_secs())),
        credentials,
    };
    Some(ProbeSpec {
        uid: p.uid().unwrap_or_default(),
        provider: p.spec.provider.clone().unwrap_or_default(),
        wire: Arc::new(Wire::of(&target)),
        target,
        interval: Duration::from_secs(positive(hc.interval_seconds, DEFAULT_INTERVAL.as_secs())),
        thresholds: Thresholds {
            success: positive(hc.success_threshold, 2).min(1000) as u32,
            failure: positive(hc.failure_threshold, 3).min(1000) as u32,
        },
    })
}
