//! Fair shares of the probe slots across namespaces. A namespace full of
//! tarpits (endpoints that accept and never answer) holds each slot for a
//! whole probe timeout; without shares it would take every slot and delay
//! everyone else's verdicts. Work-conserving: a namespace may go past its
//! share while more than a quarter of the slots are free, so one big
//! namespace alone still gets the whole pool. Pure; the engine counts.

use std::collections::HashMap;

/// In-flight probes per namespace against the pool size.
#[derive(Debug, Clone)]
pub struct Fairness {
    capacity: usize,
    in_flight: HashMap<String, usize>,
    total: usize,
}

impl Fairness {
    /// Nothing in flight; `capacity` slots (at least 1).
    pub fn new(capacity: usize) -> Self {
        Fairness {
            capacity: capacity.max(1),
            in_flight: HashMap::new(),
            total: 0,
        }
    }

    /// `capacity` slots (at least 1) from now on; probes in flight stay.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    /// Whether a probe of `namespace` may start now, with `namespaces`
    /// namespaces having proxies to probe: yes while a slot is free and
    /// the namespace is under its share (the pool divided evenly), or more
    /// than a quarter of the pool is still free.
    pub fn admit(&self, namespace: &str, namespaces: usize) -> bool {
        let free = self.capacity.saturating_sub(self.total);
        if free == 0 {
            return false;
        }
        let share = (self.capacity / namespaces.max(1)).max(1);
        let mine = self.in_flight.get(namespace).copied().unwrap_or(0);
        mine < share || free > self.capacity / 4
    }

    /// A probe of `namespace` started.
    pub fn start(&mut self, namespace: &str) {
        self.total += 1;
        *self.in_flight.entry(namespace.to_string()).or_default() += 1;
    }

    /// A probe of `namespace` ended.
    pub fn finish(&mut self, namespace: &str) {
        if let Some(n) = self.in_flight.get_mut(namespace) {
            *n -= 1;
            self.total -= 1;
            if *n == 0 {
                self.in_flight.remove(namespace);
            }
        }
    }

    /// Probes in flight.
    pub fn in_flight(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        capacity: usize,
        /// (namespace, probes in flight)
        busy: &'static [(&'static str, usize)],
        namespaces: usize,
        asks: &'static str,
        admitted: bool,
    }

    #[test]
    fn shares_of_the_pool() {
        let cases = [
            Case {
                name: "an empty pool admits anyone",
                capacity: 8,
                busy: &[],
                namespaces: 2,
                asks: "a",
                admitted: true,
            },
            Case {
                name: "a full pool admits nobody",
                capacity: 8,
                busy: &[("a", 4), ("b", 4)],
                namespaces: 2,
                asks: "b",
                admitted: false,
            },
            Case {
                name: "one namespace alone may use the whole pool",
                capacity: 8,
                busy: &[("a", 7)],
                namespaces: 1,
                asks: "a",
                admitted: true,
            },
            Case {
                name: "past its share while more than a quarter is free",
                capacity: 8,
                busy: &[("tarpit", 5)],
                namespaces: 2,
                asks: "tarpit",
                admitted: true,
            },
            Case {
                name: "past its share, the last quarter is kept for the others",
                capacity: 8,
                busy: &[("tarpit", 6)],
                namespaces: 2,
                asks: "tarpit",
                admitted: false,
            },
            Case {
                name: "under its share, the last quarter is open",
                capacity: 8,
                busy: &[("tarpit", 6)],
                namespaces: 2,
                asks: "crawl",
                admitted: true,
            },
            Case {
                name: "the last slot goes to a namespace under its share",
                capacity: 8,
                busy: &[("tarpit", 6), ("crawl", 1)],
                namespaces: 2,
                asks: "crawl",
                admitted: true,
            },
            Case {
                name: "more namespaces than slots: a share is one slot",
                capacity: 4,
                busy: &[("a", 3)],
                namespaces: 5,
                asks: "a",
                admitted: false,
            },
        ];
        for c in cases {
            let mut f = Fairness::new(c.capacity);
            for (ns, n) in c.busy {
                for _ in 0..*n {
                    f.start(ns);
                }
            }
            assert_eq!(f.admit(c.asks, c.namespaces), c.admitted, "{}", c.name);
        }
    }

    #[test]
    fn finishing_gives_the_slot_back() {
        let mut f = Fairness::new(1);
        f.start("a");
        assert!(!f.admit("b", 2));
        f.finish("a");
        assert_eq!(f.in_flight(), 0);
        assert!(f.admit("b", 2));
        // A finish that matches no start changes nothing.
        f.finish("zzz");
        assert_eq!(f.in_flight(), 0);
    }
}
