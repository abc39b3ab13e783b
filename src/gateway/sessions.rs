//! What this replica remembers of each session: the upstream it last
//! used, until `ttl` passes without a connection (pure: time is passed
//! in). A session whose upstream is still usable stays on it, even when a
//! proxy that joined since would now win its rendezvous: a crawler's
//! session keeps its address for as long as it lives. Bounded: past the
//! cap, new sessions are routed but not remembered.

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
            max,
        }
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
                if self.pins.len() >= self.max {
                    self.sweep(now);
                }
                if self.pins.len() < self.max {
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
        self.pins.retain(|_, p| p.until > now);
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
        let (c, t0) = (Arc::<str>::from("a"), Instant::now());
        let ttl = Duration::from_secs(60);
        let mut s = Sessions::new(2);
        s.used(&c, "s1", &key("p1"), ttl, t0);
        s.used(&c, "s2", &key("p1"), ttl, t0);
        let r = s.used(&c, "s3", &key("p2"), ttl, t0);
        assert_eq!(r.proxy, key("p2"));
        assert_eq!((s.len(), s.pinned(&c, "s3", t0)), (2, None));
        // Once one expired, a new session takes its place.
        s.used(&c, "s1", &key("p1"), ttl, t0 + ttl / 2);
        s.used(&c, "s4", &key("p2"), ttl, t0 + ttl);
        assert_eq!(s.pinned(&c, "s4", t0 + ttl), Some(&key("p2")));
        assert_eq!(s.pinned(&c, "s2", t0 + ttl), None);
    }
}
