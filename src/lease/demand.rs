//! What crawlers asked of each autoscaled ProxyPool: acquires naming the
//! pool (`pool=NAME`), and how many of them were refused. The lease API
//! counts here; the pool controller reads the counts as demand and says
//! how a refusal is answered: a pool at zero answers `503` with a
//! Retry-After while it comes back, a pool that can grow tells the crawler
//! to ask again soon (docs/pools.md).
//!
//! Only pools the controller registered are counted, so a crawler naming
//! pools that do not exist grows nothing here. A refusal is demand only
//! when a new Proxy of the pool (its [`Shape`], from the template) could
//! satisfy the acquire's filters, and one client's refusals count once per
//! [`CLIENT_WINDOW`]: asking for what the pool cannot make, or asking the
//! same thing a thousand times, grows nothing more.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A registration not refreshed this long is dropped: the controller
/// looks at every autoscaled pool at least every few seconds, so only a
/// deleted pool (or a lost leadership) lets one age this far.
pub const FORGET_AFTER: Duration = Duration::from_secs(120);

/// One client's refusals naming a pool count as one within this long.
/// The controller looks at an autoscaled pool every 3 s and grows it on
/// any refusal seen since its last look, so one client's retry loop
/// (Retry-After is at most a few seconds while a pool grows) moves a pool
/// at most one step per window; distinct clients count each.
pub const CLIENT_WINDOW: Duration = Duration::from_secs(10);

/// What a new Proxy of a pool would be, as the lease filters see it: its
/// template's provider, placement, attributes and labels, the pool's
/// namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// `spec.provider`.
    pub provider: Option<String>,
    /// `spec.placement.zone`, when set.
    pub zone: Option<String>,
    /// `spec.placement.region`, when set.
    pub region: Option<String>,
    /// The pool's namespace (its Proxies').
    pub namespace: String,
    /// The pool's name (its Proxies' pool label).
    pub pool: String,
    /// `spec.attributes`.
    pub attributes: BTreeMap<String, String>,
    /// The labels (the template's and the pool label).
    pub labels: BTreeMap<String, String>,
}

/// How one acquire naming a pool is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// Not at all: a refusal no new Proxy of the pool could have served.
    Not,
    /// As asked (a grant, or a refusal of a client counted within the
    /// window): activity, no growth.
    Asked,
    /// As asked and refused: unmet demand.
    Refused,
}

/// How an acquire is counted: `refused` or granted, whether a new Proxy of
/// the pool `could` satisfy it, when this client's refusal was last
/// counted. Pure.
pub fn count(refused: bool, could: bool, last: Option<Instant>, now: Instant) -> Count {
    if !refused {
        return Count::Asked;
    }
    if !could {
        return Count::Not;
    }
    match last {
        Some(t) if now.saturating_duration_since(t) < CLIENT_WINDOW => Count::Asked,
        _ => Count::Refused,
    }
}

/// The counts of one pool, as the controller reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// Acquires that named the pool, since the registration.
    pub asked: u64,
    /// Of those, refused (no proxy, no capacity, the pool at zero).
    pub refused: u64,
}

/// How an acquire naming a pool is answered when it is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Answer {
    /// As any refusal (`409`, Retry-After until a lease ends).
    #[default]
    Plain,
    /// The pool grows for it: `409` with a Retry-After of at most this.
    Growing(Duration),
    /// The pool is at zero or has no Ready proxy yet: `503
    /// pool_scaling_up` with this Retry-After.
    Waking(Duration),
}

impl Answer {
    /// The more urgent of two answers (waking over growing over plain;
    /// the shorter wait of two alike).
    fn or(self, other: Answer) -> Answer {
        use Answer::*;
        match (self, other) {
            (Waking(a), Waking(b)) => Waking(a.min(b)),
            (Waking(a), _) | (_, Waking(a)) => Waking(a),
            (Growing(a), Growing(b)) => Growing(a.min(b)),
            (Growing(a), _) | (_, Growing(a)) => Growing(a),
            (Plain, Plain) => Plain,
        }
    }
}

#[derive(Debug)]
struct Entry {
    namespace: Box<str>,
    counts: Asked,
    answer: Answer,
    shape: Shape,
    /// By client (a token name): when its refusal was last counted.
    clients: HashMap<Box<str>, Instant>,
    seen: Instant,
}

/// The counts of the registered pools, by pool name (crawlers name a pool
/// with or without its namespace).
#[derive(Debug, Default)]
pub struct PoolDemand {
    pools: Mutex<HashMap<Box<str>, Vec<Entry>>>,
}

impl PoolDemand {
    fn map(&self) -> MutexGuard<'_, HashMap<Box<str>, Vec<Entry>>> {
        // A poisoned map only means a panic between two plain map calls.
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers (or refreshes) the pool `namespace/name`, whose new
    /// Proxies are `shape`: its acquires are counted from now on, and
    /// refused ones get `answer`. Registrations older than
    /// [`FORGET_AFTER`] are dropped on the way, and clients' windows that
    /// ended.
    pub fn register(
        &self,
        namespace: &str,
        name: &str,
        answer: Answer,
        shape: Shape,
        now: Instant,
    ) {
        let mut m = self.map();
        m.retain(|_, entries| {
            entries.retain(|e| now.saturating_duration_since(e.seen) < FORGET_AFTER);
            !entries.is_empty()
        });
        let entries = m.entry(name.into()).or_default();
        match entries.iter_mut().find(|e| &*e.namespace == namespace) {
            Some(e) => {
                e.answer = answer;
                e.shape = shape;
                e.seen = now;
                e.clients
                    .retain(|_, t| now.saturating_duration_since(*t) < CLIENT_WINDOW);
            }
            None => entries.push(Entry {
                namespace: namespace.into(),
                counts: Asked::default(),
                answer,
                shape,
                clients: HashMap::new(),
                seen: now,
            }),
        }
    }

    /// Stops counting for `namespace/name` (the pool is gone or no longer
    /// autoscaled).
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut m = self.map();
        if let Some(entries) = m.get_mut(name) {
            entries.retain(|e| &*e.namespace != namespace);
            if entries.is_empty() {
                m.remove(name);
            }
        }
    }

    /// Counts `client`'s acquire naming pool `name` (in `namespace` when
    /// the crawler said which), [`count`] deciding how: `could` says
    /// whether a new Proxy of that shape satisfies its filters. For a
    /// refused one (`refused`) the answer, plain unless the pool could
    /// grow for it.
    pub fn asked(
        &self,
        (namespace, name): (Option<&str>, &str),
        client: &str,
        refused: bool,
        could: impl Fn(&Shape) -> bool,
        now: Instant,
    ) -> Answer {
        let mut m = self.map();
        let Some(entries) = m.get_mut(name) else {
            return Answer::Plain;
        };
        let mut answer = Answer::Plain;
        for e in entries
            .iter_mut()
            .filter(|e| namespace.is_none_or(|ns| ns == &*e.namespace))
        {
            let fits = !refused || could(&e.shape);
            match count(refused, fits, e.clients.get(client).copied(), now) {
                Count::Not => continue,
                Count::Asked => e.counts.asked += 1,
                Count::Refused => {
                    e.counts.asked += 1;
                    e.counts.refused += 1;
                    e.clients.insert(client.into(), now);
                }
            }
            if refused {
                answer = answer.or(e.answer);
            }
        }
        answer
    }

    /// The counts of `namespace/name` (zero when not registered).
    pub fn read(&self, namespace: &str, name: &str) -> Asked {
        self.map()
            .get(name)
            .and_then(|v| v.iter().find(|e| &*e.namespace == namespace))
            .map(|e| e.counts)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal (or grant) by a client of its own: counted whole.
    fn ask(d: &PoolDemand, ns: Option<&str>, name: &str, refused: bool) -> Answer {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let client = format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed));
        d.asked((ns, name), &client, refused, |_| true, Instant::now())
    }

    #[test]
    fn only_registered_pools_are_counted_by_namespace_when_named() {
        let d = PoolDemand::default();
        let t = Instant::now();
        let (soon, later) = (Duration::from_secs(3), Duration::from_secs(7));
        assert_eq!(ask(&d, None, "eu", true), Answer::Plain, "not registered");
        d.register("a", "eu", Answer::Growing(soon), Shape::default(), t);
        d.register("b", "eu", Answer::Waking(later), Shape::default(), t);
        assert_eq!(ask(&d, Some("a"), "eu", true), Answer::Growing(soon));
        assert_eq!(
            d.read("a", "eu"),
            Asked {
                asked: 1,
                refused: 1
            }
        );
        assert_eq!(d.read("b", "eu"), Asked::default());
        // Without a namespace the crawler may get either: both count, and
        // the pool coming back from zero decides the answer.
        assert_eq!(ask(&d, None, "eu", true), Answer::Waking(later));
        assert_eq!(
            ask(&d, None, "eu", false),
            Answer::Plain,
            "a grant is no refusal"
        );
        assert_eq!(
            d.read("a", "eu"),
            Asked {
                asked: 3,
                refused: 2
            }
        );
        assert_eq!(
            d.read("b", "eu"),
            Asked {
                asked: 2,
                refused: 1
            }
        );
        assert_eq!(d.read("a", "us"), Asked::default());
        d.register("c", "us", Answer::Plain, Shape::default(), t);
        assert_eq!(
            ask(&d, None, "us", true),
            Answer::Plain,
            "at its max: as any refusal"
        );
    }

    #[test]
    fn a_registration_not_refreshed_is_forgotten() {
        let d = PoolDemand::default();
        let t = Instant::now();
        d.register("a", "old", Answer::Plain, Shape::default(), t);
        d.register("a", "kept", Answer::Plain, Shape::default(), t);
        ask(&d, None, "old", true);
        let later = t + FORGET_AFTER;
        d.register("a", "kept", Answer::Plain, Shape::default(), later);
        assert_eq!(d.read("a", "old"), Asked::default(), "dropped on the way");
        d.forget("a", "kept");
        ask(&d, None, "kept", true);
        assert_eq!(
            d.read("a", "kept"),
            Asked::default(),
            "not counted once forgotten"
        );
    }

    fn shape() -> Shape {
        Shape {
            provider: Some("kubernetes".into()),
            zone: Some("z1".into()),
            namespace: "crawl".into(),
            pool: "eu".into(),
            ..Shape::default()
        }
    }

    #[test]
    fn only_what_a_new_proxy_could_serve_counts_and_once_per_client_per_window() {
        let t = Instant::now();
        let soon = t + CLIENT_WINDOW / 2;
        let after = t + CLIENT_WINDOW;
        struct Case {
            name: &'static str,
            refused: bool,
            could: bool,
            last: Option<Instant>,
            now: Instant,
            want: Count,
        }
        let cases = [
            Case {
                name: "a grant is use",
                refused: false,
                could: false,
                last: None,
                now: t,
                want: Count::Asked,
            },
            Case {
                name: "a refusal a new proxy could serve",
                refused: true,
                could: true,
                last: None,
                now: t,
                want: Count::Refused,
            },
            Case {
                name: "a refusal no new proxy could serve",
                refused: true,
                could: false,
                last: None,
                now: t,
                want: Count::Not,
            },
            Case {
                name: "the same client within the window",
                refused: true,
                could: true,
                last: Some(t),
                now: soon,
                want: Count::Asked,
            },
            Case {
                name: "the same client after the window",
                refused: true,
                could: true,
                last: Some(t),
                now: after,
                want: Count::Refused,
            },
        ];
        for c in cases {
            assert_eq!(
                count(c.refused, c.could, c.last, c.now),
                c.want,
                "{}",
                c.name
            );
        }

        // Through the map: a thousand impossible asks count nothing and
        // are answered as any refusal.
        let d = PoolDemand::default();
        let grow = Answer::Growing(Duration::from_secs(3));
        d.register("crawl", "eu", grow, shape(), t);
        let zone = |z: &'static str| move |s: &Shape| s.zone.as_deref() == Some(z);
        for _ in 0..1_000 {
            assert_eq!(
                d.asked((None, "eu"), "a", true, zone("nowhere"), t),
                Answer::Plain
            );
        }
        assert_eq!(d.read("crawl", "eu"), Asked::default());
        // A possible one counts once per client per window.
        for _ in 0..1_000 {
            assert_eq!(d.asked((None, "eu"), "a", true, zone("z1"), soon), grow);
        }
        d.asked((None, "eu"), "b", true, zone("z1"), soon);
        assert_eq!(
            d.read("crawl", "eu"),
            Asked {
                asked: 1_001,
                refused: 2
            }
        );
        d.asked((None, "eu"), "a", true, zone("z1"), soon + CLIENT_WINDOW);
        assert_eq!(d.read("crawl", "eu").refused, 3);
    }
}
