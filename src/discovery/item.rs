//! A Proxy as the discovery API lists it: which Proxies are listed (pure),
//! with the credentials they take, and the same item as any client may
//! see it (no password).

use kube::ResourceExt;

use super::model::ProxyItem;
use crate::api::condition::ConditionStatus;
use crate::api::proxy::conditions::HEALTHY;
use crate::api::{Proxy, ProxyMode, ProxyPhase};
use crate::credentials::{CredentialsCache, Sensitive};
use crate::tenancy::ExternalNamespaces;

/// A listed Proxy, or `None` when it is not eligible: being deleted, not
/// Ready, draining for a recycle (no new leases, no renewals), Healthy not
/// True, without an address, or External in a namespace `external` does
/// not allow (whatever its status says: whoever may write it could claim
/// Ready), or taking credentials `credentials` does not hold (yet).
pub fn item_of(
    p: &Proxy,
    external: &ExternalNamespaces,
    credentials: &CredentialsCache,
) -> Option<ProxyItem> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if p.spec.mode == ProxyMode::External && !external.allows(&p.namespace().unwrap_or_default()) {
        return None;
    }
    let st = p.status.as_ref()?;
    // Draining, or about to (a replace was asked, its pool scaled it
    // down): no new leases, no renewals.
    if st.phase != Some(ProxyPhase::Ready)
        || st.draining_since.is_some()
        || crate::fleet::replace_pending(p).is_some()
        || p.annotations()
            .contains_key(crate::api::constants::SCALE_DOWN_ANNOTATION)
    {
        return None;
    }
    let healthy = st
        .conditions
        .iter()
        .any(|c| c.type_ == HEALTHY && c.status == ConditionStatus::True);
    if !healthy {
        return None;
    }
    let ip = st.ip.clone().filter(|ip| !ip.is_empty())?;
    let port = match p.spec.mode {
        // The port its instance serves on, which a changed spec.port
        // reaches only once the instance is rolled.
        ProxyMode::Managed => p.status.as_ref().and_then(|s| s.port).or(p.spec.port),
        ProxyMode::External => p.spec.endpoint.as_ref().map(|e| e.port),
    }
    .and_then(|p| u16::try_from(p).ok())
    .filter(|p| *p > 0)?;
    let placement = p.spec.placement.clone().unwrap_or_default();
    let non_empty = |s: String| (!s.is_empty()).then_some(s);
    let host = url_host(&ip);
    let namespace = p.namespace().unwrap_or_default();
    let creds = match crate::credentials::secret_of(p) {
        Some(secret) => Some(credentials.get(&namespace, secret)?),
        None => None,
    };
    Some(ProxyItem {
        name: p.name_any(),
        url: match &creds {
            Some(c) => c.url(&host, port),
            None => Sensitive::new(format!("http://{host}:{port}")),
        },
        username: creds.as_ref().map(|c| c.username.clone()),
        password: creds.as_ref().map(|c| c.password()),
        namespace,
        ip,
        port,
        mode: match p.spec.mode {
            ProxyMode::Managed => "Managed".into(),
            ProxyMode::External => "External".into(),
        },
        provider: p.spec.provider.clone().filter(|s| !s.is_empty()),
        zone: non_empty(placement.zone),
        region: non_empty(placement.region),
        pool: p.labels().get(crate::api::constants::POOL_LABEL).cloned(),
        attributes: p.spec.attributes.clone(),
        labels: p.labels().clone(),
        latency_millis: st.latency_millis,
    })
}

/// `ip` as a URL's host (an IPv6 address in brackets).
fn url_host(ip: &str) -> String {
    match ip.contains(':') {
        true => format!("[{ip}]"),
        false => ip.to_string(),
    }
}

impl ProxyItem {
    /// This proxy as `GET /v1/proxies` shows it to any client: its
    /// username but no password, and a URL without credentials. The
    /// password goes only to the client a lease names (and to the
    /// gateway, which holds the listing itself).
    pub fn without_password(&self) -> ProxyItem {
        ProxyItem {
            url: Sensitive::new(format!("http://{}:{}", url_host(&self.ip), self.port)),
            password: None,
            ..self.clone()
        }
    }
}
