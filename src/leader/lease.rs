//! The Lease's reads and writes: one attempt to acquire or renew, and the
//! hand-over at shutdown. Every write carries the resourceVersion it read,
//! so of two candidates only one write succeeds (409 for the other).
//!
//! The leader publishes annotations on the Lease in the same writes that
//! acquire and renew it (where its discovery API is reached, for one), so
//! followers learn them from the reads they make anyway.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::time::Instant;

use super::decide::{decide, Decision, Record, Seen};
use super::Timing;

/// What one attempt found out about the leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// This replica holds the Lease.
    Me,
    /// Another replica holds a live Lease: what it publishes, in which term.
    Other(Published),
    /// No live holder is known (free, expired, or taken by another just
    /// now and not read yet).
    Nobody,
}

/// One term of the election Lease: its holder and its `leaseTransitions`
/// (a new holder adds one). What the leader seals is bound to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Term {
    /// `holderIdentity`.
    pub holder: String,
    /// `leaseTransitions`.
    pub transitions: i32,
}

/// What another replica's live Lease says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// The annotations it publishes.
    pub annotations: BTreeMap<String, String>,
    /// The term they were written in.
    pub term: Term,
}

impl Published {
    /// What `lease` publishes.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Published {
            annotations: lease.metadata.annotations.clone().unwrap_or_default(),
            term: Term {
                holder: spec
                    .and_then(|s| s.holder_identity.clone())
                    .unwrap_or_default(),
                transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            },
        }
    }
}

/// The election record of `lease`.
pub fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity,
        renew_time: spec.renew_time.map(|t| t.0),
        acquire_time: spec.acquire_time.map(|t| t.0),
        duration: spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(std::time::Duration::from_secs),
        transitions: spec.lease_transitions,
    }
}

/// One attempt: [`Observed::Me`] when we hold the Lease afterwards, with
/// what `publisher` gives on it. `seen` is what this replica saw of the Lease before;
/// it is updated with what the attempt read.
pub async fn try_once(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    timing: Timing,
    seen: &mut Option<Seen>,
    publisher: &dyn super::Publisher,
) -> Result<Observed, kube::Error> {
    let seconds = i32::try_from(timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let existing = api.get_opt(name).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let Some(mut lease) = existing else {
        let mut published = publisher.annotations(&Default::default(), Some(Duration::ZERO));
        published.extend(publisher.sealed_for(&Term {
            holder: me.to_string(),
            transitions: 0,
        }));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations: Some(published.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.to_string()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        let res = api.create(&PostParams::default(), &lease).await;
        return written(res, publisher, &published);
    };
    let (decision, observed) = decide(
        &record_of(&lease),
        seen.as_ref(),
        me,
        Instant::now(),
        timing.lease_duration,
    );
    let unchanged_for = observed.at.elapsed();
    *seen = Some(observed);
    if let Decision::Follow { .. } = decision {
        return Ok(Observed::Other(Published::of(&lease)));
    }
    let read = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    let taking_over = (decision == Decision::Acquire).then_some(unchanged_for);
    if taking_over.is_some() {
        publisher.prepare(read).await;
    }
    let mut published = publisher.annotations(read, taking_over);
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    match decision {
        Decision::Follow { .. } | Decision::Renew => {}
        Decision::Acquire => {
            spec.holder_identity = Some(me.to_string());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
    }
    // Sealed for the term this write is in, once it is known.
    published.extend(publisher.sealed_for(&Term {
        holder: me.to_string(),
        transitions: spec.lease_transitions.unwrap_or(0),
    }));
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .extend(published.clone());
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(seconds);
    // The read resourceVersion rides along: a concurrent writer makes this 409.
    let res = api.replace(name, &PostParams::default(), &lease).await;
    written(res, publisher, &published)
}

/// Who leads, from one read of the Lease by a process that never
/// campaigns (the gateway): it follows a live holder, and sees nobody
/// when the Lease is absent, free or not renewed for its duration.
pub async fn read_only(
    api: &Api<Lease>,
    name: &str,
    timing: Timing,
    seen: &mut Option<Seen>,
) -> Result<Observed, kube::Error> {
    let Some(lease) = api.get_opt(name).await? else {
        return Ok(Observed::Nobody);
    };
    Ok(observed_by_observer(&lease, seen, Instant::now(), timing))
}

/// [`read_only`]'s decision, pure. The observer decides as a candidate
/// with no identity would; an empty holder is a free Lease.
pub fn observed_by_observer(
    lease: &Lease,
    seen: &mut Option<Seen>,
    now: Instant,
    timing: Timing,
) -> Observed {
    let (decision, observed) = decide(
        &record_of(lease),
        seen.as_ref(),
        "",
        now,
        timing.lease_duration,
    );
    *seen = Some(observed);
    match decision {
        Decision::Follow { .. } => Observed::Other(Published::of(lease)),
        Decision::Renew | Decision::Acquire => Observed::Nobody,
    }
}

/// A write's result: ours (the publisher hears what is on the Lease now),
/// or another candidate's write came first (409; who that is shows at the
/// next read).
fn written(
    res: Result<Lease, kube::Error>,
    publisher: &dyn super::Publisher,
    published: &BTreeMap<String, String>,
) -> Result<Observed, kube::Error> {
    match res {
        Ok(_) => {
            publisher.written(published);
            Ok(Observed::Me)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Observed::Nobody),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up if `me` holds it, the way client-go's
/// `ReleaseOnCancel` does: no holder and a one-second duration, so a
/// follower takes over at its next attempt instead of after a full lease
/// duration; `annotations` are written in the same update (a hand-over).
/// Call it only once leader-only work has stopped.
///
/// A conflict is read again: the campaign's last renew, cut off when it
/// stopped, may still land after this read and make the write stale; only
/// another holder on the Lease means it is not ours to release.
pub async fn release(
    client: Client,
    (namespace, name): (&str, &str),
    me: &str,
    annotations: BTreeMap<String, String>,
) -> Result<bool, kube::Error> {
    const ATTEMPTS: usize = 4;
    let api: Api<Lease> = Api::namespaced(client, namespace);
    for _ in 0..ATTEMPTS {
        let Some(mut lease) = api.get_opt(name).await? else {
            return Ok(false);
        };
        if record_of(&lease).holder.as_deref() != Some(me) {
            return Ok(false);
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend(annotations.clone());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(now));
        match api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}
