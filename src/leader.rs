//! Leader election on a coordination.k8s.io Lease, the way client-go does
//! it: read the Lease, decide (pure), write with the read resourceVersion
//! so that of two candidates only one write succeeds (409 for the other).
//!
//! kube-lease-manager was considered; it relies on server-side-apply field
//! ownership conflicts for mutual exclusion, which the optimistic
//! concurrency of a plain update provides with fewer moving parts.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::provider::error::plain_message;

/// Election timing.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long a Lease lasts without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps failing to renew before it steps down.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

/// What the Lease says, reduced to what the decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Current holder, if any.
    pub holder: Option<String>,
    /// Last renewal.
    pub renewed: Option<DateTime<Utc>>,
    /// The holder's lease duration.
    pub duration: Option<Duration>,
}

/// What to do with the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it.
    Acquire,
    /// Someone else holds a live lease.
    Follow {
        /// The leader.
        leader: String,
    },
}

/// Pure: the decision for candidate `me` at `now`.
pub fn decide(
    observed: &Observed,
    me: &str,
    now: DateTime<Utc>,
    default_duration: Duration,
) -> Decision {
    match &observed.holder {
        Some(h) if h == me => Decision::Renew,
        Some(h) if !h.is_empty() => {
            let duration = observed.duration.unwrap_or(default_duration);
            let expired = observed.renewed.is_none_or(|r| {
                now.signed_duration_since(r)
                    .to_std()
                    .map(|age| age >= duration)
                    .unwrap_or(false)
            });
            if expired {
                Decision::Acquire
            } else {
                Decision::Follow { leader: h.clone() }
            }
        }
        _ => Decision::Acquire,
    }
}

fn observe(lease: &Lease) -> Observed {
    let spec = lease.spec.clone().unwrap_or_default();
    Observed {
        holder: spec.holder_identity,
        renewed: spec.renew_time.and_then(|t| {
            DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().unsigned_abs())
        }),
        duration: spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs),
    }
}

/// One attempt: `Ok(true)` when we hold the Lease afterwards.
async fn try_once(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    timing: Timing,
) -> Result<bool, kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let seconds = i32::try_from(timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let existing = api.get_opt(name).await?;
    let Some(mut lease) = existing else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
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
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let decision = decide(&observe(&lease), me, Utc::now(), timing.lease_duration);
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    match decision {
        Decision::Follow { .. } => return Ok(false),
        Decision::Renew => {}
        Decision::Acquire => {
            spec.holder_identity = Some(me.to_string());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(seconds);
    // The read resourceVersion rides along: a concurrent writer makes this 409.
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up if `me` holds it, the way client-go's
/// `ReleaseOnCancel` does: no holder and a one-second duration, so a
/// follower takes over at its next attempt instead of after a full lease
/// duration. Call it only once leader-only work has stopped.
pub async fn release(
    client: Client,
    namespace: &str,
    name: &str,
    me: &str,
) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let Some(mut lease) = api.get_opt(name).await? else {
        return Ok(false);
    };
    if observe(&lease).holder.as_deref() != Some(me) {
        return Ok(false);
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(now));
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        // Someone else wrote it in between: it is not ours to release.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// A running campaign.
pub struct Campaign {
    /// `true` while leading; see [`campaign`].
    pub leading: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Campaign {
    /// Stops campaigning (no more renewals) and waits for the task to end.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Campaigns for the Lease `name` in `namespace` as `me`. The returned
/// channel turns `true` once this replica leads; if it then fails to renew
/// for `renew_deadline` it turns `false` (and never back: a replica that
/// lost the lead must restart, so no leader-only work runs twice).
pub fn campaign(
    client: Client,
    namespace: &str,
    name: &str,
    me: String,
    timing: Timing,
) -> Campaign {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let name = name.to_string();
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut leading = false;
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            match try_once(&api, &name, &me, timing).await {
                Ok(true) => {
                    last_renewal = tokio::time::Instant::now();
                    if !leading {
                        leading = true;
                        info!(identity = %me, lease = %name, "Became the leader");
                        let _ = tx.send(true);
                    }
                }
                Ok(false) if leading => {
                    warn!(identity = %me, lease = %name, "Lost the leader lease");
                    let _ = tx.send(false);
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    warn!(identity = %me, error = %plain_message(&e), "Leader election request failed");
                    if leading && last_renewal.elapsed() >= timing.renew_deadline {
                        warn!(identity = %me, "Could not renew the leader lease in time; stepping down");
                        let _ = tx.send(false);
                        return;
                    }
                }
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(timing.retry_period).await;
        }
    });
    Campaign { leading: rx, task }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn decision_table() {
        let d15 = Duration::from_secs(15);
        let held = |who: &str, renewed: i64, dur: Option<u64>| Observed {
            holder: Some(who.into()),
            renewed: Some(t(renewed)),
            duration: dur.map(Duration::from_secs),
        };
        struct Case {
            name: &'static str,
            observed: Observed,
            want: Decision,
        }
        let cases = [
            Case {
                name: "no lease holder",
                observed: Observed::default(),
                want: Decision::Acquire,
            },
            Case {
                name: "empty holder",
                observed: Observed {
                    holder: Some(String::new()),
                    ..Default::default()
                },
                want: Decision::Acquire,
            },
            Case {
                name: "ours",
                observed: held("me", -100, Some(15)),
                want: Decision::Renew,
            },
            Case {
                name: "another, fresh",
                observed: held("b", -5, Some(15)),
                want: Decision::Follow { leader: "b".into() },
            },
            Case {
                name: "another, expired",
                observed: held("b", -15, Some(15)),
                want: Decision::Acquire,
            },
            Case {
                name: "another, their longer duration counts",
                observed: held("b", -20, Some(30)),
                want: Decision::Follow { leader: "b".into() },
            },
            Case {
                name: "another, no duration: ours counts",
                observed: held("b", -16, None),
                want: Decision::Acquire,
            },
            Case {
                name: "another, never renewed",
                observed: Observed {
                    holder: Some("b".into()),
                    ..Default::default()
                },
                want: Decision::Acquire,
            },
            Case {
                name: "another, renewed in the future (skew)",
                observed: held("b", 30, Some(15)),
                want: Decision::Follow { leader: "b".into() },
            },
        ];
        for c in cases {
            assert_eq!(decide(&c.observed, "me", t(0), d15), c.want, "{}", c.name);
        }
    }
}
