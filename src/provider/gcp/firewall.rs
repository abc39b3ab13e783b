//! The firewall rules the provider keeps when `gcp.firewall` is set: one
//! per installation and port, admitting `allowedSourceRanges` over TCP to
//! the instances carrying `networkTag`. A create makes sure its port's rule
//! exists (once per port, creates waiting on one another so two Proxies on
//! one port make one insert); GC's sweep deletes the rules of ports no
//! instance of the installation serves on any more, orphans included.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use google_cloud_compute_v1::model;
use sha2::{Digest, Sha256};
use tracing::{debug, info};

use super::build::{self, LABEL_INSTALLATION, LABEL_PORT};
use super::operations::lock;
use super::{classify, GcpProvider};
use crate::config::{FirewallConfig, GcpConfig};
use crate::provider::{CreateRequest, Op, ProviderError};

/// Every rule name the provider makes starts with this.
pub const RULE_PREFIX: &str = "proxy-operator-fw-";

/// How long a port's rule counts as needed after a create ensured it,
/// whatever a listing says: an instance just inserted may not be listed
/// yet. A listing older than this is not acted on either.
pub const ENSURED_GRACE: Duration = Duration::from_secs(60);

/// How long a create trusts that its port's rule exists without asking.
const TRUSTED_FOR: Duration = Duration::from_secs(30);

/// The rule of `installation` and `port`: the prefix, the port and 16
/// base32 characters of SHA-256 of the installation (its name is at most
/// 63 characters, as GCE wants; the installation id may itself be 63).
pub fn rule_name(installation: &str, port: u16) -> String {
    let digest = Sha256::digest(installation.as_bytes());
    let tag = data_encoding::BASE32_NOPAD
        .encode(&digest[..10])
        .to_ascii_lowercase();
    format!("{RULE_PREFIX}{port}-{tag}")
}

/// The port a rule of `installation` is for, if `name` is one of its rules.
pub fn port_of(name: &str, installation: &str) -> Option<u16> {
    let rest = name.strip_prefix(RULE_PREFIX)?;
    let (port, _) = rest.split_once('-')?;
    let port: u16 = port.parse().ok()?;
    (rule_name(installation, port) == name).then_some(port)
}

/// The rule resource for `port`. Pure: tested field by field.
pub fn build_rule(
    cfg: &GcpConfig,
    fw: &FirewallConfig,
    installation: &str,
    port: u16,
) -> model::Firewall {
    model::Firewall::new()
        .set_name(rule_name(installation, port))
        .set_description(format!(
            "egress-proxies-operator: proxies on port {port} of installation {installation}"
        ))
        .set_network(build::network_url(&cfg.network))
        .set_direction(model::firewall::Direction::Ingress)
        .set_source_ranges(
            fw.allowed_source_ranges
                .iter()
                .map(|r| r.trim().to_string()),
        )
        .set_target_tags([cfg.network_tag.clone()])
        .set_allowed([model::firewall::Allowed::new()
            .set_ip_protocol("tcp")
            .set_ports([port.to_string()])])
}

/// Which ports the instances of each installation serve on, from one
/// listing; an installation with an instance that has no port label (made
/// before the label existed) is `None`: every port may be in use.
pub type PortsInUse = BTreeMap<String, Option<BTreeSet<u16>>>;

/// Adds one listed instance to `ports`.
pub fn note_instance(ports: &mut PortsInUse, inst: &model::Instance) {
    let Some(installation) = inst.labels.get(LABEL_INSTALLATION) else {
        return;
    };
    let port = inst
        .labels
        .get(LABEL_PORT)
        .and_then(|p| p.parse::<u16>().ok());
    let entry = ports
        .entry(installation.clone())
        .or_insert_with(|| Some(BTreeSet::new()));
    match (entry.as_mut(), port) {
        (Some(set), Some(p)) => {
            set.insert(p);
        }
        (Some(_), None) => *entry = None,
        (None, _) => {}
    }
}

/// The rules of `installation` to delete: those whose port no instance
/// serves on, and no create ensured within [`ENSURED_GRACE`].
pub fn unneeded(
    rules: &[String],
    installation: &str,
    in_use: Option<&Option<BTreeSet<u16>>>,
    recently_ensured: &BTreeSet<u16>,
) -> Vec<String> {
    let used = match in_use {
        Some(None) => return Vec::new(),
        Some(Some(set)) => set.clone(),
        None => BTreeSet::new(),
    };
    rules
        .iter()
        .filter(|name| {
            port_of(name, installation)
                .is_some_and(|p| !used.contains(&p) && !recently_ensured.contains(&p))
        })
        .cloned()
        .collect()
}

impl GcpProvider {
    /// Refuses a create that would be an open proxy on the internet: no
    /// credentials behind a rule that admits every address.
    pub(super) fn refuse_open(&self, req: &CreateRequest) -> Result<(), ProviderError> {
        let Some(fw) = &self.inner.cfg.firewall else {
            return Ok(());
        };
        if req.credentials.is_none() && fw.admits_everyone() {
            return Err(self.permanent(
                Op::Create,
                "",
                format!(
                    "spec.auth.mode None on provider {:?}, whose gcp.firewall.allowedSourceRanges admit every address: the proxy would be open to the internet; keep credentials (spec.auth.mode Basic) or narrow the ranges",
                    self.inner.name
                ),
            ));
        }
        Ok(())
    }

    /// Makes sure the rule for `req`'s port exists (when the provider
    /// manages the firewall). Creates wait on one another here, so one
    /// port's rule is inserted once.
    pub(super) async fn ensure_rule(&self, req: &CreateRequest) -> Result<(), ProviderError> {
        let Some(fw) = &self.inner.cfg.firewall else {
            return Ok(());
        };
        let _one_at_a_time = self.inner.firewall_lock.lock().await;
        let fresh = lock(&self.inner.ensured)
            .get(&req.port)
            .is_some_and(|at| at.elapsed() < TRUSTED_FOR);
        if fresh {
            return Ok(());
        }
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::Create, "", "client", e))?;
        let name = rule_name(&req.installation_id, req.port);
        self.wire_request::<()>("firewalls.get", &name, None);
        let t = Instant::now();
        let got = c
            .firewalls
            .get()
            .set_project(self.project())
            .set_firewall(&name)
            .send()
            .await;
        self.wire_response("firewalls.get", t, &got);
        match got {
            Ok(_) => {}
            Err(e) if classify::http_status(&e) == Some(404) => {
                let body = build_rule(&self.inner.cfg, fw, &req.installation_id, req.port);
                self.wire_request("firewalls.insert", &name, Some(&body));
                let t = Instant::now();
                let res = c
                    .firewalls
                    .insert()
                    .set_project(self.project())
                    .set_body(body)
                    .send()
                    .await;
                self.wire_response("firewalls.insert", t, &res);
                match res {
                    Ok(_) => {
                        info!(provider = %self.inner.name, rule = %name, port = req.port, "Firewall rule created")
                    }
                    Err(e) if classify::http_status(&e) == Some(409) => {}
                    Err(e) => return Err(self.fail(Op::Create, "", "firewalls.insert", e)),
                }
            }
            Err(e) => return Err(self.fail(Op::Create, "", "firewalls.get", e)),
        }
        lock(&self.inner.ensured).insert(req.port, Instant::now());
        Ok(())
    }

    /// Deletes the rules of `installation` no instance needs, from the
    /// ports the last listing saw (none when it is older than the grace:
    /// nothing is deleted on stale knowledge). Returns their names.
    pub(super) async fn sweep_rules(
        &self,
        installation: &str,
    ) -> Result<Vec<String>, ProviderError> {
        if self.inner.cfg.firewall.is_none() {
            return Ok(Vec::new());
        }
        let Some(in_use) = lock(&self.inner.ports_seen)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < ENSURED_GRACE)
            .map(|(_, ports)| ports.get(installation).cloned())
        else {
            return Ok(Vec::new());
        };
        let recent: BTreeSet<u16> = lock(&self.inner.ensured)
            .iter()
            .filter(|(_, at)| at.elapsed() < ENSURED_GRACE)
            .map(|(p, _)| *p)
            .collect();
        let c = self
            .clients()
            .await
            .map_err(|e| self.fail(Op::List, "", "client", e))?;
        let filter = format!("name eq {RULE_PREFIX}.*");
        self.wire_request::<()>("firewalls.list", &filter, None);
        let t = Instant::now();
        let res = c
            .firewalls
            .list()
            .set_project(self.project())
            .set_filter(filter)
            .send()
            .await;
        self.wire_response("firewalls.list", t, &res);
        let listed = res.map_err(|e| self.fail(Op::List, "", "firewalls.list", e))?;
        let names: Vec<String> = listed.items.iter().filter_map(|f| f.name.clone()).collect();
        let doomed = unneeded(&names, installation, in_use.as_ref(), &recent);
        for name in &doomed {
            self.wire_request::<()>("firewalls.delete", name, None);
            let t = Instant::now();
            let res = c
                .firewalls
                .delete()
                .set_project(self.project())
                .set_firewall(name)
                .send()
                .await;
            self.wire_response("firewalls.delete", t, &res);
            match res {
                Ok(_) => {
                    info!(provider = %self.inner.name, rule = %name, "Firewall rule deleted: no instance serves on its port")
                }
                Err(e) if classify::http_status(&e) == Some(404) => {}
                Err(e) => return Err(self.fail(Op::Delete, name, "firewalls.delete", e)),
            }
            if let Some(port) = port_of(name, installation) {
                lock(&self.inner.ensured).remove(&port);
            }
        }
        debug!(provider = %self.inner.name, rules = names.len(), deleted = doomed.len(), "firewall rules swept");
        Ok(doomed)
    }
}

#[cfg(test)]
#[path = "firewall_tests.rs"]
mod tests;
