//! One probe through an address the schedule does not probe yet: a surge
//! replacement's, before it takes over from the Proxy's current instance
//! (the engine probes one address per Proxy, the one in its status).

use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;

use super::probe::probe;
use super::probes::{probe_spec, Defaults};
use crate::api::{Proxy, ProxyPhase};

/// Time between the probes of one check.
const BETWEEN: Duration = Duration::from_millis(500);

/// Probes a Proxy's instances as the engine would (its health check, or
/// the operator's defaults), at an address given.
pub struct Checker {
    defaults: Defaults,
    tls: Arc<ClientConfig>,
}

impl Checker {
    /// A checker with the operator's probe defaults and TLS roots.
    pub fn new(defaults: Defaults, tls: Arc<ClientConfig>) -> Self {
        Checker { defaults, tls }
    }

    /// Whether `proxy`'s health check passes through its surge instance at
    /// `ip:port` (with that instance's credentials) as many
    /// times in a row as its success threshold asks; `Err` says why not,
    /// in plain words.
    pub async fn check(&self, proxy: &Proxy, ip: &str, port: u16) -> Result<(), String> {
        let mut at = proxy.clone();
        let st = at.status.get_or_insert_with(Default::default);
        st.phase = Some(ProxyPhase::Ready);
        st.ip = Some(ip.to_string());
        st.port = Some(i32::from(port));
        st.credentials_secret = proxy
            .status
            .as_ref()
            .and_then(|s| s.surge.as_ref())
            .and_then(|s| s.credentials_secret.clone());
        let Some(spec) = probe_spec(&at, &self.defaults) else {
            return Err("the Proxy's health check has no usable URL".into());
        };
        for n in 0..spec.thresholds.success.max(1) {
            if n > 0 {
                tokio::time::sleep(BETWEEN).await;
            }
            let res = probe(&spec.target, &self.tls).await;
            if let Some(e) = res.error {
                return Err(e.to_string());
            }
        }
        Ok(())
    }
}
