//! What a gateway has to tell the leader (`to_leader.rs`), queued: one
//! bounded queue per process, delivered by one task, the same message
//! waiting once however often it is queued. A site banning every
//! connection, or a crawler reporting in a loop, then costs at most
//! [`MAX_WAITING`] small entries and one call at a time to the leader,
//! never a task or a connection per event.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::lease::ProxyKey;

/// Messages waiting at most; past it a new one is dropped (and counted):
/// the cooldown still holds in this replica's copy, and a failed upstream
/// is still found by its next probe.
pub const MAX_WAITING: usize = 1_024;

/// One message for the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tell {
    /// A cooldown for `client`: of `site`, or everywhere.
    Cooldown {
        proxy: ProxyKey,
        client: Arc<str>,
        site: Option<String>,
    },
    /// An upstream failed a connection.
    Failed(ProxyKey),
}

/// Where a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// Waits for the deliverer.
    Added,
    /// The same message already waits.
    Coalesced,
    /// The queue is full.
    Dropped,
}

/// The messages waiting, oldest first. Pure: the deliverer takes them.
#[derive(Debug, Default)]
pub struct Waiting {
    queue: VecDeque<Tell>,
}

impl Waiting {
    /// Queues `t` unless the same waits already or the queue is full.
    pub fn push(&mut self, t: Tell, cap: usize) -> Queued {
        if self.queue.contains(&t) {
            return Queued::Coalesced;
        }
        if self.queue.len() >= cap {
            return Queued::Dropped;
        }
        self.queue.push_back(t);
        Queued::Added
    }

    /// The oldest message.
    pub fn pop(&mut self) -> Option<Tell> {
        self.queue.pop_front()
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// The process's queue, and the deliverer's wake-up.
#[derive(Debug, Default)]
pub struct Outbox {
    waiting: Mutex<Waiting>,
    wake: Notify,
}

impl Outbox {
    /// Queues `t` for the deliverer.
    pub fn push(&self, t: Tell) -> Queued {
        let q = self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(t, MAX_WAITING);
        if q == Queued::Added {
            self.wake.notify_one();
        }
        q
    }

    /// The next message, waiting for one.
    pub async fn next(&self) -> Tell {
        loop {
            let wake = self.wake.notified();
            if let Some(t) = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).pop() {
                return t;
            }
            wake.await;
        }
    }

    /// Messages waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cooldown(proxy: &str, site: Option<&str>) -> Tell {
        Tell::Cooldown {
            proxy: ProxyKey {
                namespace: "ns".into(),
                name: proxy.into(),
            },
            client: Arc::from("team-x"),
            site: site.map(String::from),
        }
    }

    #[test]
    fn the_same_message_waits_once_and_the_queue_is_bounded() {
        let failed = |p: &str| {
            Tell::Failed(ProxyKey {
                namespace: "ns".into(),
                name: p.into(),
            })
        };
        let mut w = Waiting::default();
        let cases = [
            (cooldown("a", Some("shop")), Queued::Added),
            (cooldown("a", Some("shop")), Queued::Coalesced),
            (cooldown("a", Some("news")), Queued::Added),
            (cooldown("a", None), Queued::Added),
            (failed("a"), Queued::Added),
            (failed("a"), Queued::Coalesced),
            // Full at 4.
            (failed("b"), Queued::Dropped),
            (cooldown("a", None), Queued::Coalesced),
        ];
        for (i, (t, want)) in cases.into_iter().enumerate() {
            assert_eq!(w.push(t, 4), want, "message {i}");
        }
        assert_eq!(w.pop(), Some(cooldown("a", Some("shop"))), "oldest first");
        assert_eq!(w.push(failed("b"), 4), Queued::Added, "room again");
        assert_eq!(w.len(), 4);
    }

    #[tokio::test]
    async fn the_deliverer_gets_what_was_queued_in_order() {
        let o = Arc::new(Outbox::default());
        let taker = {
            let o = o.clone();
            tokio::spawn(async move { (o.next().await, o.next().await) })
        };
        tokio::task::yield_now().await;
        assert_eq!(o.push(cooldown("a", None)), Queued::Added);
        assert_eq!(o.push(cooldown("b", None)), Queued::Added);
        let (first, second) = taker.await.unwrap();
        assert_eq!((first, second), (cooldown("a", None), cooldown("b", None)));
        assert_eq!(o.waiting(), 0);
    }
}
