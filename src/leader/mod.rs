//! Leader election on a coordination.k8s.io Lease, the way client-go does
//! it: read the Lease, decide (pure, [`decide`]), write with the read
//! resourceVersion so that of two candidates only one write succeeds
//! ([`lease`]). Expiry is judged by the local monotonic clock: another
//! holder's Lease is taken only once its record has not changed for a
//! whole lease duration, so wall-clock skew between replicas is harmless.
//!
//! Every attempt is bounded: a leader's by what is left of its renew
//! deadline, a candidate's by the renew deadline. A leader whose deadline
//! passes steps down however its call ends, and campaigns again once the
//! composition root has stopped its leader-only work
//! ([`Campaign::rejoin`]).
//!
//! While it leads, a replica publishes annotations on the Lease (where its
//! discovery API is reached); every replica reports what it last saw of
//! the leadership on a channel ([`Observed`]), so followers know where to
//! send what only the leader serves.
//!
//! kube-lease-manager was considered; it relies on server-side-apply field
//! ownership conflicts for mutual exclusion, which the optimistic
//! concurrency of a plain update provides with fewer moving parts.

pub mod decide;
mod fence;
pub mod lease;
pub mod metrics;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::Client;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use self::decide::{after_attempt, attempt_bound, Outcome, Step, StepDown};
pub use self::decide::{Decision, Record, Seen};
pub use self::fence::Fence;
pub use self::lease::{release, Observed, Published, Term};
pub use self::metrics::LeaderMetrics;
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

/// What the leader writes on the Lease besides the election record (the
/// lease horizon, `lease::recovery`, and the discovery URL through
/// [`WithFixed`]), asked at every write.
#[async_trait::async_trait]
pub trait Publisher: Send + Sync {
    /// Before a write that takes the Lease over: what `read` (the previous
    /// leader's annotations) names may be fetched now (a hand-over).
    async fn prepare(&self, _read: &BTreeMap<String, String>) {}
    /// The annotations to write now. `read` are those on the Lease as read;
    /// `taking_over`: this write takes the Lease from another holder (or
    /// none), so `read` is what the previous leader published, and the
    /// record read has been unchanged, as this replica saw it, for the
    /// given time (its own monotonic clock, so skew cannot shorten it).
    fn annotations(
        &self,
        read: &BTreeMap<String, String>,
        taking_over: Option<Duration>,
    ) -> BTreeMap<String, String>;
    /// Annotations bound to the term the write is in (its holder and
    /// `leaseTransitions`), written next to [`Publisher::annotations`].
    fn sealed_for(&self, _term: &Term) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    /// `written` is on the Lease now.
    fn written(&self, written: &BTreeMap<String, String>);
    /// The annotations of the write that gives the Lease up at shutdown,
    /// once leader-only work has stopped (a hand-over).
    async fn releasing(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    /// Woken when what it publishes must be written before the next
    /// retry (a follower leaves the in-sync set).
    fn write_now(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// The annotations a term's writes carry.
pub type ForTerm = Box<dyn Fn(&Term) -> BTreeMap<String, String> + Send + Sync>;

/// What every write carries for its term (the discovery URL followers
/// forward to, sealed for the term) next to what `inner` publishes.
pub struct WithFixed {
    /// The annotations for a term.
    pub fixed: ForTerm,
    /// Asked at every write, told what was written.
    pub inner: Arc<dyn Publisher>,
}

#[async_trait::async_trait]
impl Publisher for WithFixed {
    async fn prepare(&self, read: &BTreeMap<String, String>) {
        self.inner.prepare(read).await;
    }

    fn annotations(
        &self,
        read: &BTreeMap<String, String>,
        taking_over: Option<Duration>,
    ) -> BTreeMap<String, String> {
        self.inner.annotations(read, taking_over)
    }

    fn sealed_for(&self, term: &Term) -> BTreeMap<String, String> {
        let mut all = self.inner.sealed_for(term);
        all.extend((self.fixed)(term));
        all
    }

    fn written(&self, written: &BTreeMap<String, String>) {
        self.inner.written(written);
    }

    async fn releasing(&self) -> BTreeMap<String, String> {
        self.inner.releasing().await
    }

    fn write_now(&self) -> Option<Arc<Notify>> {
        self.inner.write_now()
    }
}

/// A running campaign.
pub struct Campaign {
    /// `true` while leading; see [`campaign`].
    pub leading: watch::Receiver<bool>,
    rejoin: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Campaign {
    /// After a step-down: leader-only work has stopped, campaign again.
    pub fn rejoin(&self) {
        self.rejoin.notify_one();
    }

    /// Stops campaigning (no more renewals) and waits for the task to end.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Follows the Lease `name` in `namespace` without ever campaigning (the
/// gateway): after each read, every retry period, `observed` says who
/// leads; a failed read keeps what it said. Returns when `stop` fires.
pub async fn observe(
    client: Client,
    namespace: &str,
    name: &str,
    timing: Timing,
    observed: watch::Sender<Observed>,
    stop: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let mut seen: Option<Seen> = None;
    tokio::pin!(stop);
    loop {
        let read = lease::read_only(&api, name, timing, &mut seen);
        match tokio::time::timeout(timing.renew_deadline, read).await {
            Ok(Ok(found)) => {
                observed.send_if_modified(|o| {
                    let changed = *o != found;
                    match (&found, changed) {
                        (_, false) => {}
                        (Observed::Other(_), true) => info!(lease = %name, "Following the leader"),
                        (_, true) => warn!(lease = %name, "No live leader"),
                    }
                    *o = found;
                    changed
                });
            }
            Ok(Err(e)) => {
                warn!(lease = %name, error = %plain_message(&e), "Cannot read the leader Lease")
            }
            Err(_) => {
                warn!(lease = %name, limit = ?timing.renew_deadline, "Reading the leader Lease did not answer in time")
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(timing.retry_period) => {}
        }
    }
}

/// Who a candidate is.
pub struct Candidate {
    /// The unique identity written as the holder.
    pub identity: String,
    /// Told what each attempt found out (kept as it is when an attempt
    /// fails).
    pub observed: watch::Sender<Observed>,
    /// Opened until the renew deadline while leading, closed on a
    /// step-down.
    pub fence: Fence,
}

/// Campaigns for the Lease `name` in `namespace` as `me`. The returned
/// channel turns `true` once this replica leads. When it steps down (the
/// Lease is another's, or no renewal succeeded within the renew deadline)
/// it turns `false` and the campaign pauses until [`Campaign::rejoin`]:
/// the caller stops leader-only work first, so it never runs on two
/// replicas at once.
pub fn campaign(
    client: Client,
    namespace: &str,
    name: &str,
    candidate: Candidate,
    timing: Timing,
    metrics: LeaderMetrics,
    publisher: Arc<dyn Publisher>,
) -> Campaign {
    let Candidate {
        identity: me,
        observed,
        fence,
    } = candidate;
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let name = name.to_string();
    let (tx, rx) = watch::channel(false);
    let rejoin = Arc::new(Notify::new());
    let resume = rejoin.clone();
    let task = tokio::spawn(async move {
        let mut seen: Option<Seen> = None;
        // While leading: when leader-only work must stop unless renewed.
        let mut deadline: Option<Instant> = None;
        loop {
            let started = Instant::now();
            let bound = attempt_bound(deadline, started, timing.renew_deadline);
            let outcome = if bound.is_zero() {
                Outcome::Failed
            } else {
                let attempt = lease::try_once(&api, &name, &me, timing, &mut seen, &*publisher);
                match tokio::time::timeout(bound, attempt).await {
                    Ok(Ok(found)) => {
                        let held = found == Observed::Me;
                        observed.send_if_modified(|o| {
                            let changed = *o != found;
                            *o = found;
                            changed
                        });
                        if held {
                            Outcome::Held
                        } else {
                            Outcome::Lost
                        }
                    }
                    Ok(Err(e)) => {
                        warn!(identity = %me, error = %plain_message(&e), "Leader election request failed");
                        Outcome::Failed
                    }
                    Err(_) => {
                        warn!(identity = %me, limit = ?bound, "Leader election request did not answer in time");
                        Outcome::Failed
                    }
                }
            };
            let now = Instant::now();
            match deadline {
                None if outcome == Outcome::Held => {
                    deadline = Some(started + timing.renew_deadline);
                    fence.open_until(deadline);
                    info!(identity = %me, lease = %name, "Became the leader");
                    let _ = tx.send(true);
                }
                None => {}
                Some(d) => match after_attempt(outcome, started, now, d, timing.renew_deadline) {
                    Step::Lead { deadline: next } => {
                        deadline = Some(next);
                        fence.open_until(deadline);
                    }
                    Step::StepDown(why) => {
                        fence.open_until(None);
                        metrics.stepped_down(why);
                        match why {
                            StepDown::Lost => {
                                warn!(identity = %me, lease = %name, "Lost the leader lease to another replica; stepping down")
                            }
                            StepDown::DeadlinePassed => {
                                warn!(identity = %me, lease = %name, renew_deadline = ?timing.renew_deadline, "Could not renew the leader lease in time; stepping down")
                            }
                        }
                        deadline = None;
                        // Not ours to serve any more, whatever the last
                        // write said; the next attempt tells who leads.
                        observed.send_replace(Observed::Nobody);
                        let _ = tx.send(false);
                        // Campaign again only once leader-only work stopped.
                        resume.notified().await;
                        continue;
                    }
                },
            }
            if tx.is_closed() {
                return;
            }
            let pause = match deadline {
                Some(d) => timing.retry_period.min(d.saturating_duration_since(now)),
                None => timing.retry_period,
            };
            match publisher.write_now().filter(|_| deadline.is_some()) {
                Some(nudge) => tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = nudge.notified() => {}
                },
                None => tokio::time::sleep(pause).await,
            }
        }
    });
    Campaign {
        leading: rx,
        rejoin,
        task,
    }
}
