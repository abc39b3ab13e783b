//! A host's slots (issue 17): blocking libvirt calls and image transfers
//! draw from separate semaphores, so slow transfers never take every
//! libvirt slot, and every wait for a slot is bounded, so a wedged host
//! makes its callers fail Transient ("host busy") instead of parking
//! reconcile workers forever.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::conn::LinkError;

/// Concurrent blocking libvirt calls per host.
pub const BLOCKING_PER_HOST: usize = 4;
/// Concurrent image uploads (HTTP to libvirt streams) per host; these do
/// not count against [`BLOCKING_PER_HOST`].
pub const TRANSFERS_PER_HOST: usize = 2;

/// Which pool of slots a call draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// A bounded libvirt conversation.
    Call,
    /// An image transfer, paced by the HTTP side.
    Transfer,
}

impl SlotKind {
    fn word(self) -> &'static str {
        match self {
            SlotKind::Call => "libvirt call",
            SlotKind::Transfer => "image transfer",
        }
    }
}

/// One host's slots, shared by every operation on it.
#[derive(Clone, Debug)]
pub struct Slots {
    host: String,
    calls: Arc<Semaphore>,
    transfers: Arc<Semaphore>,
}

impl Slots {
    /// Slots for `host` with the given sizes.
    pub fn new(host: &str, calls: usize, transfers: usize) -> Self {
        Slots {
            host: host.to_string(),
            calls: Arc::new(Semaphore::new(calls)),
            transfers: Arc::new(Semaphore::new(transfers)),
        }
    }

    /// Waits at most `limit` for a slot of `kind`; past it, a
    /// [`LinkError::Busy`] naming the host.
    pub async fn acquire(
        &self,
        kind: SlotKind,
        limit: Duration,
    ) -> Result<OwnedSemaphorePermit, LinkError> {
        let sem = match kind {
            SlotKind::Call => &self.calls,
            SlotKind::Transfer => &self.transfers,
        };
        match tokio::time::timeout(limit, sem.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(LinkError::Aborted(e.to_string())),
            Err(_) => Err(LinkError::Busy {
                host: self.host.clone(),
                slot: kind.word(),
                waited: limit,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_full_host_fails_busy_instead_of_waiting_forever() {
        let s = Slots::new("hv1", 1, 1);
        let _held = s.acquire(SlotKind::Call, SHORT).await.unwrap();
        let err = s.acquire(SlotKind::Call, SHORT).await.unwrap_err();
        assert!(matches!(err, LinkError::Busy { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("host hv1 is busy"), "{msg}");
        assert!(msg.contains("libvirt call"), "{msg}");
        assert_eq!(
            super::super::classify::classify(&err),
            crate::provider::ErrorClass::Transient
        );
    }

    #[tokio::test]
    async fn transfers_do_not_take_libvirt_slots() {
        let s = Slots::new("hv1", 1, 2);
        let _t1 = s.acquire(SlotKind::Transfer, SHORT).await.unwrap();
        let _t2 = s.acquire(SlotKind::Transfer, SHORT).await.unwrap();
        let err = s.acquire(SlotKind::Transfer, SHORT).await.unwrap_err();
        assert!(err.to_string().contains("image transfer"), "{err}");
        // Every transfer slot taken; a libvirt call still gets one.
        let _call = s.acquire(SlotKind::Call, SHORT).await.unwrap();
    }

    #[tokio::test]
    async fn a_released_slot_is_taken_by_a_waiter() {
        let s = Slots::new("hv1", 1, 1);
        let held = s.acquire(SlotKind::Call, SHORT).await.unwrap();
        let s2 = s.clone();
        let waiter =
            tokio::spawn(async move { s2.acquire(SlotKind::Call, Duration::from_secs(60)).await });
        drop(held);
        let _got = waiter.await.unwrap().unwrap();
    }
}
