//! Reconcile triggers: the engine names the Proxies whose health status
//! changed; the Proxy controller reads them as a stream.

use std::collections::HashSet;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::api::Proxy;

/// How many status notifications may wait for the controller; beyond it
/// they are kept in a set and retried.
pub const NOTIFY_CAPACITY: usize = 1024;

/// Delivers "reconcile this Proxy" to the controller without losing any:
/// when the channel is full the Proxy is remembered and retried.
pub struct Notifier {
    tx: mpsc::Sender<ObjectRef<Proxy>>,
    pending: HashSet<(String, String)>,
}

impl Notifier {
    /// A notifier and the receiving end for the controller.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<ObjectRef<Proxy>>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Notifier {
                tx,
                pending: HashSet::new(),
            },
            rx,
        )
    }

    /// Asks for a reconcile of `namespace/name`.
    pub fn notify(&mut self, namespace: &str, name: &str) {
        let r = ObjectRef::new(name).within(namespace);
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(r) {
            self.pending
                .insert((namespace.to_string(), name.to_string()));
        }
    }

    /// Retries what could not be delivered; returns how many still wait.
    pub fn flush(&mut self) -> usize {
        let mut keep = HashSet::new();
        for (ns, name) in self.pending.drain() {
            let r = ObjectRef::new(&name).within(&ns);
            if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(r) {
                keep.insert((ns, name));
            }
        }
        self.pending = keep;
        self.pending.len()
    }
}

/// The controller's end of the notifications as a stream.
pub fn trigger_stream(
    rx: mpsc::Receiver<ObjectRef<Proxy>>,
) -> impl futures::Stream<Item = ObjectRef<Proxy>> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_channel_loses_no_notification() {
        let (mut n, mut rx) = Notifier::channel(1);
        n.notify("ns", "a");
        n.notify("ns", "b");
        n.notify("ns", "b");
        assert_eq!(n.flush(), 1);
        assert_eq!(rx.recv().await.unwrap().name, "a");
        assert_eq!(n.flush(), 0);
        assert_eq!(rx.recv().await.unwrap().name, "b");
    }
}
