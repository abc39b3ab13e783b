//! The side steps of a managed pass ([`plan::surge`]): a surge
//! replacement created, probed and taking over, and the retiring instance
//! it leaves deleted once drained. Each step performs one call and adds
//! what it learned to the pass's observations.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use tracing::{info, warn};

use super::credentials::forget;
use super::look::look;
use super::writes::record_hash;
use super::{create_request, Error};
use crate::api::{Proxy, ProxyStatus};
use crate::controller::context::Context;
use crate::controller::plan::surge::{self, SideObs, SideStep};
use crate::controller::plan::GetOutcome;
use crate::controller::throttle::create_gate;
use crate::fleet::shared::instances_of;
use crate::provider::error::plain_message;
use crate::provider::{ErrorClass, Provider, UserData};

/// What a side step works with.
pub(super) struct Side<'a> {
    pub proxy: &'a Proxy,
    pub ctx: &'a Context,
    pub provider: Arc<dyn Provider>,
    pub provider_name: &'a str,
    /// The resolved cloud-init and its spec hash.
    pub user_data: &'a UserData,
    pub hash: &'a str,
}

impl Side<'_> {
    /// Performs `step`: the status and the observations take what it
    /// learned; the main instance's `get` is replaced when the surge
    /// instance takes over, and `recorded` (the spec-hash annotation)
    /// with it.
    pub(super) async fn perform(
        &self,
        step: SideStep,
        status: &mut ProxyStatus,
        obs: &mut SideObs,
        (recorded, get): (&mut Option<String>, &mut Option<GetOutcome>),
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let uid = self.proxy.uid().unwrap_or_default();
        let surge_id = || {
            status
                .surge
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default()
        };
        match step {
            SideStep::AskCreate => {
                // The Proxy keeps its current instance meanwhile.
                let own = instances_of(status).saturating_sub(1);
                let generation = self.proxy.metadata.generation;
                let gate = create_gate(self.ctx, self.provider_name, (&uid, own), generation, now);
                obs.create = Some(gate);
            }
            SideStep::Create { serial, port } => {
                let installation = (self.ctx.installation_id.as_str(), serial);
                let creds = super::credentials::ensure(self.ctx, self.proxy, serial).await?;
                let secret = creds.as_ref().map(|c| c.secret_name.clone());
                let rules = self.ctx.registry.destinations(self.provider_name);
                let data = (self.user_data, creds);
                let req = create_request(self.proxy, installation, (port, &rules), data)?;
                match self.provider.create(&req).await {
                    Ok(id) => {
                        crate::crashpoint::hit(crate::crashpoint::AFTER_SURGE_CREATE);
                        info!(providerID = %id, serial, "Surge replacement created: it takes over once it passes its probe");
                        surge::created(status, (id, secret), self.hash, port, now);
                    }
                    Err(e) => {
                        self.ctx.throttle.create_failed(self.provider_name, &uid);
                        self.failed(status, obs, "creating", &plain_message(&e), now);
                    }
                }
            }
            SideStep::Get => {
                obs.surge = Some(look(self.provider.as_ref(), &surge_id(), status).await);
            }
            SideStep::Probe { ip } => {
                let port = status.surge.as_ref().and_then(|s| s.port);
                let port = port.and_then(|p| u16::try_from(p).ok()).unwrap_or(0);
                let res = match &self.ctx.checker {
                    Some(c) => c.check(self.proxy, &ip, port).await,
                    None => Ok(()),
                };
                if let Err(why) = &res {
                    self.note(status, &format!("probing it at {ip}:{port}"), why, now);
                }
                obs.probe = Some(res.is_ok());
            }
            SideStep::TakeOver { ip } => {
                let hash = Some(self.hash.to_string());
                record_hash(self.proxy, &self.ctx.client, recorded, &hash).await?;
                let old = status.provider_id.clone().unwrap_or_default();
                info!(providerID = %surge_id(), replaced = %old, ip = %ip, "Surge replacement took over; the replaced instance drains");
                surge::take_over(status, &ip, now);
                *get = obs.surge.take();
            }
            SideStep::GiveUp { why } => match self.provider.delete(&surge_id()).await {
                Ok(()) => {
                    info!(providerID = %surge_id(), reason = ?why, "Giving up a surge replacement");
                    surge::giving_up(status, now);
                    obs.surge = None;
                }
                Err(e) if e.class() == ErrorClass::NotFound => self.forget_surge(status).await,
                Err(e) => self.failed(status, obs, "deleting", &plain_message(&e), now),
            },
            SideStep::Forget => self.forget_surge(status).await,
            SideStep::AskDrain => {
                if let Some(r) = &status.retiring {
                    obs.drain = Some(self.ctx.fleet.retire_step(self.proxy, r.since, now));
                }
            }
            SideStep::GetRetiring => {
                let id = retiring_id(status);
                obs.retiring = Some(GetOutcome::of(self.provider.get(&id).await));
            }
            SideStep::DeleteRetiring => {
                let id = retiring_id(status);
                match self.provider.delete(&id).await {
                    Ok(()) => {
                        info!(providerID = %id, "Deleting the retired instance");
                        surge::retire_requested(status, now);
                        obs.retiring = None;
                    }
                    Err(e) if e.class() == ErrorClass::NotFound => {
                        forget(self.ctx, self.proxy, retiring_secret(status).as_deref()).await;
                        surge::retired(status)
                    }
                    Err(e) => {
                        let why = plain_message(&e);
                        warn!(providerID = %id, error = %why, "Cannot delete the retired instance; retrying");
                        obs.failed = true;
                    }
                }
            }
            SideStep::Retired => {
                forget(self.ctx, self.proxy, retiring_secret(status).as_deref()).await;
                surge::retired(status)
            }
        }
        Ok(())
    }

    /// The surge is gone: its credentials Secret goes, and it is forgotten.
    async fn forget_surge(&self, status: &mut ProxyStatus) {
        let secret = status
            .surge
            .as_ref()
            .and_then(|s| s.credentials_secret.clone());
        forget(self.ctx, self.proxy, secret.as_deref()).await;
        surge::forget(status)
    }

    /// A surge step failed: the Proxy says so, and the side steps rest
    /// until the next pass.
    fn failed(
        &self,
        status: &mut ProxyStatus,
        obs: &mut SideObs,
        what: &str,
        why: &str,
        now: DateTime<Utc>,
    ) {
        self.note(status, what, why, now);
        obs.failed = true;
    }

    /// A surge step failed: the Proxy says so.
    fn note(&self, status: &mut ProxyStatus, what: &str, why: &str, now: DateTime<Utc>) {
        warn!(proxy = %self.proxy.name_any(), error = %why, "Surge replacement: {what} failed; retrying");
        surge::failed(status, what, why, now);
    }
}

/// The retiring instance's provider ID (empty when none is recorded).
fn retiring_id(status: &ProxyStatus) -> String {
    status
        .retiring
        .as_ref()
        .map(|r| r.provider_id.clone())
        .unwrap_or_default()
}

/// The credentials Secret of the retiring instance.
fn retiring_secret(status: &ProxyStatus) -> Option<String> {
    status
        .retiring
        .as_ref()
        .and_then(|r| r.credentials_secret.clone())
}
