//! Writes each configured provider's `ProviderHealth` object from the
//! monitor's snapshot. A kube-runtime controller on the objects is
//! triggered by every finished round and by any change to an object
//! (including its deletion), so an edited or deleted object is restored
//! within seconds.
//!
//! ProviderHealth objects are cluster-scoped, so two installations in one
//! cluster (or the operators of parallel tests) see each other's. Each
//! object carries its installation's id as a label, and an installation
//! watches, restores and cleans up only its own (and unlabelled objects of
//! versions before the label, which it adopts).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;

use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::circuit;
use super::status::build_status;
use super::Snapshot;
use crate::api::constants::{
    INSTALLATION_MARK, MANAGED_BY_LABEL, OPERATOR_NAME, RESET_CIRCUIT_BREAKER_ANNOTATION,
};
use crate::api::ProviderHealth;
use crate::controller::metrics::ReconcileMetrics;
use crate::controller::plan::{jitter, Random, SystemRandom};
use crate::controller::status_patch::merge_diff;
use crate::events::Events;
use crate::fleet::Fleet;
use crate::provider::error::plain_message;

/// Controller label of the reconcile metrics.
pub const CONTROLLER: &str = "providerhealth";
/// How soon a failed write is retried.
pub const RETRY: Duration = Duration::from_secs(5);

fn selector() -> String {
    format!("{MANAGED_BY_LABEL}={OPERATOR_NAME}")
}

/// The objects of one installation.
fn own_selector(installation: &str) -> String {
    format!("{},{INSTALLATION_MARK}={installation}", selector())
}

/// Whether a labelled object belongs to `installation`: it carries its id,
/// or no id at all (written before objects were labelled with one).
pub fn is_own(obj: &ProviderHealth, installation: &str) -> bool {
    match obj.labels().get(INSTALLATION_MARK) {
        Some(id) => id == installation,
        None => true,
    }
}

/// A write of one object failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the object failed.
    #[error("reading ProviderHealth {0}: {msg}", msg = plain_message(.1))]
    Read(String, #[source] kube::Error),
    /// Replacing an object written without an installation label failed.
    #[error("replacing ProviderHealth {0} (it has no installation label): {msg}", msg = plain_message(.1))]
    Replace(String, #[source] kube::Error),
    /// Creating the object failed.
    #[error("creating ProviderHealth {0}: {msg}", msg = plain_message(.1))]
    Create(String, #[source] kube::Error),
    /// Patching the status failed.
    #[error("patching ProviderHealth {0} status: {msg}", msg = plain_message(.1))]
    Patch(String, #[source] kube::Error),
    /// Removing the reset annotation failed (the breaker was not reset).
    #[error("removing the {RESET_CIRCUIT_BREAKER_ANNOTATION} annotation from ProviderHealth {0}: {msg}", msg = plain_message(.1))]
    Unannotate(String, #[source] kube::Error),
}

/// What the writer's reconciles share.
pub struct Writer {
    client: Client,
    snapshot: Snapshot,
    configured: BTreeSet<String>,
    installation: String,
    metrics: Option<ReconcileMetrics>,
    breakers: Option<Arc<Fleet>>,
    events: Events,
}

impl Writer {
    /// A writer for the `configured` provider names of `installation`.
    pub fn new(
        client: Client,
        snapshot: Snapshot,
        configured: BTreeSet<String>,
        installation: &str,
        metrics: Option<ReconcileMetrics>,
    ) -> Self {
        Writer {
            events: Events::new(client.clone()),
            client,
            snapshot,
            configured,
            installation: installation.to_string(),
            metrics,
            breakers: None,
        }
    }

    /// Records through `events` (the process's one recorder) instead of
    /// a recorder of its own.
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = events;
        self
    }

    /// Reports the circuit breakers of `fleet` (the leader's fleet view):
    /// the `Replacing` condition, an Event per transition, and the reset
    /// annotation.
    pub fn with_breakers(mut self, fleet: Arc<Fleet>) -> Self {
        self.breakers = Some(fleet);
        self
    }

    /// Creates the object if missing and patches its status from the latest
    /// result; no-op before the provider's first result or for a name that
    /// is not configured.
    pub async fn publish(&self, name: &str) -> Result<(), Error> {
        if !self.configured.contains(name) {
            return Ok(());
        }
        let Some(result) = self.snapshot.of(name) else {
            return Ok(());
        };
        let api: Api<ProviderHealth> = Api::all(self.client.clone());
        let current = match api
            .get_opt(name)
            .await
            .map_err(|e| Error::Read(name.into(), e))?
        {
            Some(o) => o,
            None => {
                let obj = new_object(name, &self.installation);
                match api.create(&PostParams::default(), &obj).await {
                    Ok(o) => {
                        info!(provider = %name, "Created ProviderHealth");
                        o
                    }
                    // Created concurrently: read what is there.
                    Err(kube::Error::Api(s)) if s.code == 409 => api
                        .get(name)
                        .await
                        .map_err(|e| Error::Read(name.into(), e))?,
                    Err(e) => return Err(Error::Create(name.into(), e)),
                }
            }
        };
        if !current.labels().contains_key(INSTALLATION_MARK) {
            // Written before objects carried an installation: replace it
            // with a labelled one. The watch sees only labelled objects,
            // and the next trigger recreates it, with the verbs the writer
            // always had (no patch of metadata).
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::Replace(name.into(), e)),
            }
            info!(provider = %name, "Replacing a ProviderHealth written without an installation label");
            return Box::pin(self.publish(name)).await;
        }
        let mut new = build_status(current.status.as_ref(), &result);
        if let Some(fleet) = &self.breakers {
            new.conditions =
                circuit::with_replacing(new.conditions, &fleet.report(name), Utc::now());
        }
        if current.status.as_ref() == Some(&new) {
            return Ok(());
        }
        let old =
            serde_json::to_value(current.status.clone().unwrap_or_default()).unwrap_or_default();
        let Some(diff) = serde_json::to_value(&new)
            .ok()
            .and_then(|n| merge_diff(&old, &n))
        else {
            return Ok(());
        };
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": diff })),
        )
        .await
        .map_err(|e| Error::Patch(name.into(), e))?;
        debug!(provider = %name, "Wrote ProviderHealth status");
        Ok(())
    }

    async fn publish_counted(&self, name: &str) -> Result<(), Error> {
        let started = Instant::now();
        let res = self.publish(name).await;
        if let Some(m) = &self.metrics {
            m.observe(CONTROLLER, res.is_ok(), started.elapsed());
        }
        if let Err(e) = &res {
            error!(provider = %name, error = %plain_message(e), "Writing provider health");
        }
        res
    }
}

impl Writer {
    /// The annotation on `obj` asks for a reset: the annotation is removed
    /// first (so one annotation resets once, even across a restart), then
    /// the breaker is reset; the fleet view reports the reset as a
    /// transition (Event `CircuitReset`).
    async fn reset_if_asked(&self, obj: &ProviderHealth) -> Result<(), Error> {
        let (Some(fleet), Some(value)) = (
            &self.breakers,
            obj.annotations().get(RESET_CIRCUIT_BREAKER_ANNOTATION),
        ) else {
            return Ok(());
        };
        let name = obj.name_any();
        let api: Api<ProviderHealth> = Api::all(self.client.clone());
        let unannotate =
            json!({"metadata": {"annotations": {RESET_CIRCUIT_BREAKER_ANNOTATION: null}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(unannotate))
            .await
            .map_err(|e| Error::Unannotate(name.clone(), e))?;
        info!(provider = %name, annotation = RESET_CIRCUIT_BREAKER_ANNOTATION, %value, "Resetting the circuit breaker as the annotation asks");
        fleet.reset(&name, Utc::now());
        Ok(())
    }

    /// Writes the status and records an Event for every breaker
    /// transition the fleet view has seen since the last call.
    async fn report_transitions(&self) {
        let Some(fleet) = &self.breakers else {
            return;
        };
        let api: Api<ProviderHealth> = Api::all(self.client.clone());
        for seen in fleet.take_transitions() {
            let name = seen.provider.as_str();
            if !self.configured.contains(name) {
                continue;
            }
            let note = circuit::transition_note(name, seen.transition, &fleet.report(name));
            let span = info_span!("providerhealth.circuit", provider = %name, reason = note.reason);
            async {
                let _ = self.publish_counted(name).await;
                match api.get_opt(name).await {
                    Ok(Some(obj)) => self.events.record(&obj.object_ref(&()), note).await,
                    Ok(None) => debug!("No ProviderHealth yet to record the Event on"),
                    Err(e) => warn!(error = %plain_message(&e), "Reading ProviderHealth to record an Event"),
                }
            }
            .instrument(span)
            .await;
        }
    }
}

/// Resolves when `rx` sees a change; never when there is none to watch.
async fn changed(rx: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// The object `publish` creates for provider `name`: labelled, no status.
pub fn new_object(name: &str, installation: &str) -> ProviderHealth {
    let mut obj = ProviderHealth::new(name);
    obj.metadata.labels = Some(
        [
            (MANAGED_BY_LABEL.into(), OPERATOR_NAME.into()),
            (INSTALLATION_MARK.into(), installation.into()),
        ]
        .into(),
    );
    obj
}

async fn reconcile(obj: Arc<ProviderHealth>, w: Arc<Writer>) -> Result<Action, Error> {
    w.reset_if_asked(&obj).await?;
    w.publish_counted(&obj.name_any()).await?;
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<ProviderHealth>, _e: &Error, _w: Arc<Writer>) -> Action {
    Action::requeue(jitter(RETRY, SystemRandom.unit()))
}

/// Runs the controller until `shutdown`. `rounds` ticks after every round.
pub async fn run(
    writer: Writer,
    rounds: watch::Receiver<u64>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<ProviderHealth> = Api::all(writer.client.clone());
    let wc = watcher::Config::default().labels(&own_selector(&writer.installation));
    let writer = Arc::new(writer);
    // Each finished round writes every configured object (creating missing
    // ones); the controller below restores objects changed in between. A
    // breaker transition is written (and its Event recorded) at once.
    let per_round = {
        let w = writer.clone();
        let mut rx = rounds;
        let mut breakers = w.breakers.as_ref().map(|f| f.subscribe());
        async move {
            loop {
                tokio::select! {
                    round = rx.changed() => {
                        if round.is_err() {
                            break;
                        }
                        for name in &w.configured {
                            let _ = w.publish_counted(name).await;
                        }
                    }
                    () = changed(&mut breakers) => w.report_transitions().await,
                }
            }
        }
    };
    let w = writer.clone();
    let controller = Controller::new(api.clone(), wc.clone())
        // Deletions too: the main watch only reports applied objects.
        .watches(api, wc, |o: ProviderHealth| {
            Some(ObjectRef::<ProviderHealth>::new(&o.name_any()))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, writer)
        .for_each(move |res| {
            let w = w.clone();
            async move {
                match res {
                    Ok(_) => {}
                    // Missing from the cache: not created yet, or deleted.
                    Err(controller::Error::ObjectNotFound(r)) => {
                        let _ = w.publish_counted(&r.name).await;
                    }
                    Err(controller::Error::ReconcilerFailed(..)) => {}
                    Err(e) => warn!(error = %plain_message(&e), "ProviderHealth controller error"),
                }
            }
        });
    // The round loop ends with the monitor; the controller on shutdown.
    tokio::join!(per_round, controller);
}

/// Deletes every labelled object of `installation` ([`is_own`]) whose name
/// is not in `keep` (all of them when `keep` is empty). Objects without the
/// managed-by label, and other installations' objects, are never touched.
pub async fn cleanup(client: &Client, installation: &str, keep: &BTreeSet<String>) {
    let api: Api<ProviderHealth> = Api::all(client.clone());
    let list = match api.list(&ListParams::default().labels(&selector())).await {
        Ok(l) => l,
        Err(e) => {
            error!(error = %plain_message(&e), "Listing provider health objects; stale ones stay until the next start");
            return;
        }
    };
    for obj in list.items {
        let name = obj.name_any();
        if keep.contains(&name) || !is_own(&obj, installation) {
            continue;
        }
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(%name, "Deleted provider health of an unconfigured provider"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                error!(%name, error = %plain_message(&e), "Deleting provider health of an unconfigured provider")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-apiserver refuses a create whose body has no apiVersion/kind
    /// (`Object 'Kind' is missing`): the body must carry them.
    #[test]
    fn the_created_object_carries_its_api_version_and_kind() {
        let body = serde_json::to_value(new_object("gcp-eu", "inst-1")).unwrap();
        assert_eq!(body["apiVersion"], "crawl.example.com/v1alpha1");
        assert_eq!(body["kind"], "ProviderHealth");
        assert_eq!(body["metadata"]["name"], "gcp-eu");
        assert_eq!(
            body["metadata"]["labels"][MANAGED_BY_LABEL], OPERATOR_NAME,
            "{body}"
        );
        assert_eq!(body["metadata"]["labels"][INSTALLATION_MARK], "inst-1");
        assert!(body.get("status").is_none(), "{body}");
        // The group and version match the CRD's.
        let crd = crate::api::crd::provider_health_crd();
        assert_eq!(
            body["apiVersion"],
            format!("{}/{}", crd.spec.group, crd.spec.versions[0].name)
        );
        assert_eq!(body["kind"], crd.spec.names.kind);
    }

    /// A default-built object (no constructor) serializes its type too, and
    /// reads back unchanged.
    #[test]
    fn any_provider_health_round_trips_with_its_type() {
        let mut obj = ProviderHealth::default();
        obj.metadata.name = Some("kvm-home".into());
        obj.status = Some(crate::api::ProviderHealthStatus {
            type_: Some("kvm".into()),
            ..Default::default()
        });
        let body = serde_json::to_value(&obj).unwrap();
        assert_eq!(body["apiVersion"], "crawl.example.com/v1alpha1");
        assert_eq!(body["kind"], "ProviderHealth");
        assert_eq!(body["status"]["type"], "kvm");
        let back: ProviderHealth = serde_json::from_value(body).unwrap();
        assert_eq!(back, obj);
    }

    #[test]
    fn an_installation_owns_its_objects_and_unlabelled_ones() {
        struct Case {
            name: &'static str,
            label: Option<&'static str>,
            own: bool,
        }
        for c in [
            Case {
                name: "ours",
                label: Some("inst-1"),
                own: true,
            },
            Case {
                name: "another installation's",
                label: Some("inst-2"),
                own: false,
            },
            Case {
                name: "from before the label",
                label: None,
                own: true,
            },
        ] {
            let mut obj = new_object("p", "x");
            let labels = obj.metadata.labels.get_or_insert_with(Default::default);
            labels.remove(INSTALLATION_MARK);
            if let Some(l) = c.label {
                labels.insert(INSTALLATION_MARK.into(), l.into());
            }
            assert_eq!(is_own(&obj, "inst-1"), c.own, "{}", c.name);
        }
    }
}
