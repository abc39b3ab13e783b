//! What this replica remembers of each session: the upstream it last
//! used, until `ttl` passes without a connection (pure: time is passed
//! in). A session whose upstream is still usable stays on it, even when a
//! proxy that joined since would now win its rendezvous: a crawler's
//! session keeps its address for as long as it lives. Bounded: past the
//! cap, new sessions are routed but not remembered. Shared: once the
//! table is half full, a client that holds a quarter of it gets no new
//! session remembered, so one client (one token) can take at most half
//! the table from the others.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lease::ProxyKey;

/// A remembered session.
#[derive(Debug, Clone)]
struct Pin {
    proxy: ProxyKey,
    until: Instant,
}

/// Sessions by (client, id).
#[derive(Debug)]
pub struct Sessions {
    pins: HashMap<(Arc<str>, String), Pin>,
    /// Sessions remembered, by client.
    held: HashMap<Arc<str>, usize>,
    max: usize,
}

/// Where a session's connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The upstream.
    pub proxy: ProxyKey,
    /// The session used another upstream before this one.
    pub moved: bool,
}

impl Sessions {
    /// A table of at most `max` sessions.
    pub fn new(max: usize) -> Self {
        Sessions {
            pins: HashMap::new(),
            held: HashMap::new(),
            max,
        }
    }

    /// Whether a new session of `client` is remembered: the table has
    /// room, and the client holds less than a quarter of it or the table
    /// is less than half full.
    fn room_for(&self, client: &Arc<str>) -> bool {
        let held = self.held.get(client).copied().unwrap_or(0);
        let len = self.pins.len();
        len < self.max && (held < self.max / 4 || len < self.max / 2)
    }

    /// Sessions remembered.
    pub fn len(&self) -> usize {
        self.pins.len()
    }

    /// The upstream the session last used, while it lives.
    pub fn pinned(&self, client: &Arc<str>, id: &str, now: Instant) -> Option<&ProxyKey> {
        self.pins
            .get(&(client.clone(), id.to_string()))
            .filter(|p| p.until > now)
            .map(|p| &p.proxy)
    }

    /// The session's connection goes to `proxy` at `now`; it lives `ttl`
    /// longer. Says whether that moved it.
    pub fn used(
        &mut self,
        client: &Arc<str>,
        id: &str,
        proxy: &ProxyKey,
        ttl: Duration,
        now: Instant,
    ) -> Route {
        let until = now + ttl;
        let key = (client.clone(), id.to_string());
        let moved = match self.pins.get_mut(&key) {
            Some(pin) => {
                let moved = pin.until > now && pin.proxy != *proxy;
                pin.proxy = proxy.clone();
                pin.until = until;
                moved
            }
            None => {
                if !self.room_for(client) {
                    self.sweep(now);
                }
                if self.room_for(client) {
                    *self.held.entry(client.clone()).or_default() += 1;
                    self.pins.insert(
                        key,
                        Pin {
                            proxy: proxy.clone(),
                            until,
                        },
                    );
                }
                false
            }
        };
        Route {
            proxy: proxy.clone(),
            moved,
        }
    }

    /// Forgets the sessions whose time ran out; how many.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let before = self.pins.len();
        let held = &mut self.held;
        self.pins.retain(|(client, _), p| {
            let keep = p.until > now;
            if !keep {
                if let Some(n) = held.get_mut(client) {
                    *n = n.saturating_sub(1);
                }
            }
            keep
        });
        held.retain(|_, n| *n > 0);
        before - self.pins.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a panic is its failure report
    use super::*;

    fn key(n: &str) -> ProxyKey {
        ProxyKey {
            namespace: "crawl".into(),
            name: n.into(),
        }
    }

    #[test]
    fn a_session_is_remembered_for_its_ttl_after_its_last_use() {
        let (c, t0) = (Arc::<str>::from("a"), Instant::now());
        let ttl = Duration::from_secs(60);
        let mut s = Sessions::new(10);
        assert_eq!(s.pinned(&c, "s1", t0), None);
        assert!(!s.used(&c, "s1", &key("p1"), ttl, t0).moved);
        assert_eq!(s.pinned(&c, "s1", t0 + ttl / 2), Some(&key("p1")));
        // Used again at half its life: it lives a whole ttl from then.
        assert!(!s.used(&c, "s1", &key("p1"), ttl, t0 + ttl / 2).moved);
        assert_eq!(s.pinned(&c, "s1", t0 + ttl), Some(&key("p1")));
        // Another client's session of the same id is another session.
        assert_eq!(s.pinned(&Arc::from("b"), "s1", t0), None);
        // Moved while alive: said so.
        assert!(s.used(&c, "s1", &key("p2"), ttl, t0 + ttl).moved);
        // Expired, then used elsewhere: a new session, not a move.
        let later = t0 + ttl * 3;
        assert_eq!(s.pinned(&c, "s1", later), None);
        assert!(!s.used(&c, "s1", &key("p3"), ttl, later).moved);
        assert_eq!(s.sweep(later + ttl), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn past_its_cap_the_table_routes_without_remembering() {
        let t0 = Instant::now();
        let c = |n: &str| Arc::<str>::from(n);
        let ttl = Duration::from_secs(60);
        let mut s = Sessions::new(4);
        for (who, at) in [("a", t0), ("b", t0), ("c", t0), ("d", t0 + ttl / 2)] {
            s.used(&c(who), "s1", &key("p1"), ttl, at);
        }
        let r = s.used(&c("e"), "s1", &key("p2"), ttl, t0);
        assert_eq!(r.proxy, key("p2"));
        assert_eq!((s.len(), s.pinned(&c("e"), "s1", t0)), (4, None));
        // Once some expired, a new session takes a place.
        s.used(&c("e"), "s2", &key("p2"), ttl, t0 + ttl);
        assert_eq!(s.pinned(&c("e"), "s2", t0 + ttl), Some(&key("p2")));
        assert_eq!(s.pinned(&c("a"), "s1", t0 + ttl), None);
        assert_eq!(s.pinned(&c("d"), "s1", t0 + ttl), Some(&key("p1")));
    }

    #[test]
    fn one_client_takes_at_most_half_the_table_from_the_others() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        let mut s = Sessions::new(100);
        let c = |n: &str| Arc::<str>::from(n);
        let fill = |s: &mut Sessions, who: &str, n: usize| {
            for i in 0..n {
                s.used(&c(who), &format!("{who}{i}"), &key("p1"), ttl, t0);
            }
        };
        // Alone, a client fills half the table, then nothing more of it
        // is kept.
        fill(&mut s, "flood", 1000);
        assert_eq!(s.len(), 50);
        assert_eq!(s.pinned(&c("flood"), "flood49", t0), Some(&key("p1")));
        assert_eq!(s.pinned(&c("flood"), "flood50", t0), None);
        // Past half, every other client still gets a quarter.
        fill(&mut s, "other", 1000);
        assert_eq!(s.len(), 75);
        assert_eq!(s.pinned(&c("other"), "other24", t0), Some(&key("p1")));
        assert_eq!(s.pinned(&c("other"), "other25", t0), None);
        fill(&mut s, "third", 1000);
        assert_eq!(s.len(), 100);
        // Full: the next client waits for room, as before.
        fill(&mut s, "fourth", 1);
        assert_eq!(s.pinned(&c("fourth"), "fourth0", t0), None);
        // Expired sessions give their client's share back.
        assert_eq!(s.sweep(t0 + ttl * 2), 100);
        assert!(s.held.is_empty(), "counts of clients with none are dropped");
        s.used(&c("fourth"), "f", &key("p3"), ttl, t0 + ttl * 2);
        assert_eq!(s.pinned(&c("fourth"), "f", t0 + ttl * 2), Some(&key("p3")));
    }
}
