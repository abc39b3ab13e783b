//! Creates that outlive their `create` call (kvm.md §11 gap 2): the first
//! download of an image on a host can take minutes, which must not hold a
//! reconcile worker. `get` reports such a create as Provisioning, reports
//! its failure once, and `delete` cancels it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::provider::ProviderError;

/// How a background create stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Running,
    Done,
    Failed,
}

/// What a background create left to report.
#[derive(Debug)]
pub enum Outcome {
    Running,
    Done,
    Failed(ProviderError),
}

/// What `get` reports for a create still running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provisioning {
    pub uid: String,
    pub installation: String,
    pub started: DateTime<Utc>,
}

struct Job {
    info: Provisioning,
    state: watch::Receiver<JobState>,
    /// Set by the task before it reports `Failed`.
    error: Arc<Mutex<Option<ProviderError>>>,
    task: JoinHandle<()>,
}

/// The background creates of one provider, by domain name.
#[derive(Default)]
pub struct Jobs {
    jobs: Mutex<HashMap<String, Job>>,
}

impl Jobs {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Job>> {
        // A poisoned map only means a panic between two plain map calls.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns the future `work()` makes as the job of `name`, unless one
    /// already runs for it; returns a receiver of the job's state.
    pub fn start<W, F>(
        &self,
        name: &str,
        uid: &str,
        installation: &str,
        work: W,
    ) -> watch::Receiver<JobState>
    where
        W: FnOnce() -> F,
        F: Future<Output = Result<(), ProviderError>> + Send + 'static,
    {
        let mut m = self.map();
        if let Some(job) = m.get(name) {
            return job.state.clone();
        }
        let (tx, rx) = watch::channel(JobState::Running);
        let error = Arc::new(Mutex::new(None));
        let slot = error.clone();
        let work = work();
        let task = tokio::spawn(async move {
            let state = match work.await {
                Ok(()) => JobState::Done,
                Err(e) => {
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    JobState::Failed
                }
            };
            let _ = tx.send(state);
        });
        m.insert(
            name.to_string(),
            Job {
                info: Provisioning {
                    uid: uid.to_string(),
                    installation: installation.to_string(),
                    started: Utc::now(),
                },
                state: rx.clone(),
                error,
                task,
            },
        );
        rx
    }

    /// The state of the job of `name`, if any; a finished one is forgotten
    /// as it is reported.
    pub fn take_finished(&self, name: &str) -> Option<Outcome> {
        let mut m = self.map();
        let state = *m.get(name)?.state.borrow();
        match state {
            JobState::Running => Some(Outcome::Running),
            JobState::Done => {
                m.remove(name);
                Some(Outcome::Done)
            }
            JobState::Failed => {
                let job = m.remove(name)?;
                let error = job.error.lock().unwrap_or_else(|p| p.into_inner()).take();
                Some(error.map_or(Outcome::Done, Outcome::Failed))
            }
        }
    }

    /// What the job of `name` was started for, while it is known.
    pub fn provisioning(&self, name: &str) -> Option<Provisioning> {
        self.map().get(name).map(|j| j.info.clone())
    }

    /// Forgets the job of `name` without stopping it.
    pub fn forget(&self, name: &str) {
        self.map().remove(name);
    }

    /// Stops the job of `name` and waits until it is gone; whether there
    /// was one.
    pub async fn cancel(&self, name: &str) -> bool {
        let job = self.map().remove(name);
        match job {
            Some(job) => {
                job.task.abort();
                let _ = job.task.await;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
#[path = "pending_tests.rs"]
mod tests;
