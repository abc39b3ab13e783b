//! Who gets a connection to the gateway, before any byte of it is read:
//! the first layer a connection passes. Every crawler of the cluster
//! reaches the gateway, and a connection costs the gateway before its
//! sender has proved anything, so:
//!
//! - connections are bounded in total and per source address (at most
//!   half the total, so one address always leaves room for others);
//! - a connection that has not signed in yet waits, its bytes unread in
//!   the kernel, for one of a few sign-in places of its address and of
//!   the gateway, and gives its place back at its first signed-in
//!   request: one address cannot keep others' requests from being read;
//! - an address that keeps failing to sign in spends a budget; once it is
//!   spent, its new connections are closed as they are accepted until it
//!   refills. A `407` also closes its connection (`Connection: close`).
//!
//! A connection's places move with it into its tunnel, so a tunnel counts
//! as the connection it was.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Sign-in places per source address: connections of one address whose
/// first request is being read at once.
pub const SIGNING_IN_PER_ADDRESS: usize = 64;

/// Sign-in places of the whole gateway.
pub const SIGNING_IN: usize = 512;

/// Failed sign-ins an address may make in a burst.
pub const FAILED_BURST: f64 = 64.0;

/// Failed sign-ins an address is allowed again per second.
pub const FAILED_PER_SECOND: f64 = 2.0;

/// Addresses whose counts are kept; past it, the address with no open
/// connection and a full budget are forgotten first, then (a flood of
/// addresses) the table closes connections of addresses it cannot count.
const MAX_ADDRESSES: usize = 65_536;

/// The bounds, from the gateway's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at once, tunnels included.
    pub max_connections: usize,
    /// Connections of one address (0: only the half-of-total bound).
    pub max_per_address: usize,
}

impl Bounds {
    /// The cap one address is held to: its own, and never more than
    /// half of the total, so another address always gets in.
    pub fn per_address(&self) -> usize {
        let half = (self.max_connections / 2).max(1);
        match self.max_per_address {
            0 => half,
            n => n.min(half),
        }
    }
}

/// What an address holds.
#[derive(Debug)]
struct Address {
    open: usize,
    signing_in: Arc<Semaphore>,
    /// Failed sign-ins it may still make, and when that was counted.
    budget: f64,
    counted: Instant,
}

impl Address {
    fn new(now: Instant) -> Self {
        Address {
            open: 0,
            signing_in: Arc::new(Semaphore::new(SIGNING_IN_PER_ADDRESS)),
            budget: FAILED_BURST,
            counted: now,
        }
    }

    /// The budget refilled up to `now`.
    fn refill(&mut self, now: Instant) {
        let gained = now.saturating_duration_since(self.counted).as_secs_f64() * FAILED_PER_SECOND;
        self.budget = (self.budget + gained).min(FAILED_BURST);
        self.counted = now;
    }

    /// Whether nothing would be lost by forgetting it: no connection
    /// open, and its budget full again by `now`.
    fn idle(&self, now: Instant) -> bool {
        let gained = now.saturating_duration_since(self.counted).as_secs_f64() * FAILED_PER_SECOND;
        self.open == 0 && self.budget + gained >= FAILED_BURST
    }
}

/// The gateway's admission state.
pub struct Admission {
    bounds: Bounds,
    total: Arc<Semaphore>,
    signing_in: Arc<Semaphore>,
    addresses: Mutex<HashMap<IpAddr, Address>>,
}

/// Why a connection was closed as it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The gateway holds its cap of connections.
    Full,
    /// The address holds its cap.
    AddressFull,
    /// The address spent its budget of failed sign-ins.
    TooManyFailures,
}

impl Closed {
    /// The word for logs and metrics.
    pub fn word(self) -> &'static str {
        match self {
            Closed::Full => "gateway_full",
            Closed::AddressFull => "address_full",
            Closed::TooManyFailures => "failed_sign_ins",
        }
    }
}

/// An admitted connection's places in the counts, given back when
/// dropped (by the connection, or by the tunnel it became).
pub struct Places {
    _total: OwnedSemaphorePermit,
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Places {
    fn drop(&mut self) {
        let mut m = self.admission.lock();
        if let Some(a) = m.get_mut(&self.ip) {
            a.open = a.open.saturating_sub(1);
        }
    }
}

/// A connection's sign-in places, held until its first request signs in.
pub struct SigningIn(
    #[allow(dead_code)] // held for its drop
    (OwnedSemaphorePermit, OwnedSemaphorePermit),
);

impl Admission {
    /// Admission within `bounds`.
    pub fn new(bounds: Bounds) -> Arc<Self> {
        Arc::new(Admission {
            bounds,
            total: Arc::new(Semaphore::new(bounds.max_connections)),
            signing_in: Arc::new(Semaphore::new(SIGNING_IN)),
            addresses: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Address>> {
        // Counts only: a panic mid-update loses at most one count.
        self.addresses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections open (tunnels included).
    pub fn open(&self) -> usize {
        self.bounds.max_connections - self.total.available_permits()
    }

    /// A new connection from `ip`: its places, or why it is closed.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Places, Closed> {
        let ip = ip.to_canonical();
        let now = Instant::now();
        let mut m = self.lock();
        if !m.contains_key(&ip) && m.len() >= MAX_ADDRESSES {
            m.retain(|_, a| !a.idle(now));
            if m.len() >= MAX_ADDRESSES {
                return Err(Closed::Full);
            }
        }
        let a = m.entry(ip).or_insert_with(|| Address::new(now));
        a.refill(now);
        if a.budget < 1.0 {
            return Err(Closed::TooManyFailures);
        }
        if a.open >= self.bounds.per_address() {
            return Err(Closed::AddressFull);
        }
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Closed::Full)?;
        a.open += 1;
        Ok(Places {
            _total: total,
            admission: self.clone(),
            ip,
        })
    }

    /// Waits (up to `limit`) for a sign-in place of `ip` and one of the
    /// gateway; none: the connection is closed unread.
    pub async fn signing_in(&self, ip: IpAddr, limit: Duration) -> Option<SigningIn> {
        let own = self.lock().get(&ip.to_canonical())?.signing_in.clone();
        let wait = async {
            let mine = own.acquire_owned().await.ok()?;
            let all = self.signing_in.clone().acquire_owned().await.ok()?;
            Some(SigningIn((mine, all)))
        };
        tokio::time::timeout(limit, wait).await.ok().flatten()
    }

    /// `ip` failed to sign in: one spent from its budget.
    pub fn failed_sign_in(&self, ip: IpAddr) {
        let now = Instant::now();
        if let Some(a) = self.lock().get_mut(&ip.to_canonical()) {
            a.refill(now);
            a.budget = (a.budget - 1.0).max(0.0);
        }
    }

    /// Forgets the addresses with nothing open and a full budget.
    pub fn sweep(&self) {
        let now = Instant::now();
        self.lock().retain(|_, a| !a.idle(now));
    }
}

/// One client connection's standing: its address, its places in the
/// counts (moved into its tunnel, if it opens one), and its sign-in
/// places until its first signed-in request.
pub(super) struct Conn {
    pub(super) ip: std::net::IpAddr,
    pub(super) admission: Arc<Admission>,
    places: std::sync::Mutex<Option<Places>>,
    signing_in: std::sync::Mutex<Option<SigningIn>>,
}

impl Conn {
    /// A connection from `ip`, holding `places` and its sign-in places.
    pub(super) fn new(
        ip: std::net::IpAddr,
        admission: Arc<Admission>,
        (places, signing_in): (Places, SigningIn),
    ) -> Self {
        Conn {
            ip,
            admission,
            places: std::sync::Mutex::new(Some(places)),
            signing_in: std::sync::Mutex::new(Some(signing_in)),
        }
    }

    /// The connection's places, taken by the tunnel it became.
    pub(super) fn take_places(&self) -> Option<Places> {
        self.places.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// A request of it signed in: its sign-in places go back.
    pub(super) fn signed_in(&self) {
        drop(
            self.signing_in
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a panic is its failure report
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_address_is_held_to_its_cap_and_to_half_the_gateway() {
        let cases = [
            (1000, 0, 500),
            (1000, 512, 500),
            (10_000, 512, 512),
            (10_000, 0, 5000),
            (1, 0, 1),
            (2, 1, 1),
        ];
        for (max_connections, max_per_address, want) in cases {
            let b = Bounds {
                max_connections,
                max_per_address,
            };
            assert_eq!(b.per_address(), want, "{b:?}");
        }
    }

    #[tokio::test]
    async fn an_address_at_its_cap_leaves_room_for_another() {
        let a = Admission::new(Bounds {
            max_connections: 4,
            max_per_address: 0,
        });
        let held: Vec<Places> = (0..2).map(|_| a.admit(ip(2)).unwrap()).collect();
        assert_eq!(a.admit(ip(2)).err(), Some(Closed::AddressFull));
        let other = a.admit(ip(1)).unwrap();
        assert_eq!(a.open(), 3);
        drop(held);
        assert_eq!(a.open(), 1);
        assert!(a.admit(ip(2)).is_ok(), "its places came back");
        drop(other);
    }

    #[tokio::test]
    async fn failed_sign_ins_spend_a_budget_that_closes_the_address_then_refills() {
        let a = Admission::new(Bounds {
            max_connections: 100,
            max_per_address: 0,
        });
        for _ in 0..FAILED_BURST as usize {
            let _p = a.admit(ip(2)).unwrap();
            a.failed_sign_in(ip(2));
        }
        assert_eq!(a.admit(ip(2)).err(), Some(Closed::TooManyFailures));
        assert!(a.admit(ip(1)).is_ok(), "another address is not charged");
        // The budget refills at FAILED_PER_SECOND.
        {
            let mut m = a.lock();
            let back = Duration::from_secs_f64(1.0 / FAILED_PER_SECOND);
            m.get_mut(&ip(2)).unwrap().counted -= back;
        }
        assert!(a.admit(ip(2)).is_ok());
    }

    #[tokio::test]
    async fn sign_in_places_of_one_address_run_out_without_touching_another() {
        let a = Admission::new(Bounds {
            max_connections: 1000,
            max_per_address: 0,
        });
        let mut held = Vec::new();
        for _ in 0..SIGNING_IN_PER_ADDRESS {
            let p = a.admit(ip(2)).unwrap();
            let s = a
                .signing_in(ip(2), Duration::from_millis(10))
                .await
                .unwrap();
            held.push((p, s));
        }
        let _late = a.admit(ip(2)).unwrap();
        let waited = a.signing_in(ip(2), Duration::from_millis(50)).await;
        assert!(waited.is_none(), "the address's places are all taken");
        let _p = a.admit(ip(1)).unwrap();
        assert!(a
            .signing_in(ip(1), Duration::from_millis(10))
            .await
            .is_some());
        held.pop();
        assert!(
            a.signing_in(ip(2), Duration::from_millis(10))
                .await
                .is_some(),
            "a place given back is taken"
        );
    }

    #[test]
    fn the_sweep_forgets_only_addresses_with_nothing_to_remember() {
        let a = Admission::new(Bounds {
            max_connections: 10,
            max_per_address: 0,
        });
        let open = a.admit(ip(1)).unwrap();
        drop(a.admit(ip(2)).unwrap());
        drop(a.admit(ip(3)).unwrap());
        a.failed_sign_in(ip(3));
        a.sweep();
        let mut kept: Vec<IpAddr> = a.lock().keys().copied().collect();
        kept.sort();
        assert_eq!(kept, [ip(1), ip(3)]);
        drop(open);
    }
}
