//! Open connections counted per key (per upstream, per client): each
//! count is held by a [`Place`], which gives it back when dropped, so a
//! connection that ends any way at all (answered, cut, panicked) leaves
//! the counts right. Keys with no connection are removed: the maps hold
//! only what is open.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

/// Connections open, by key.
pub struct Counts<K: Hash + Eq>(Arc<Mutex<HashMap<K, u32>>>);

impl<K: Hash + Eq> Default for Counts<K> {
    fn default() -> Self {
        Counts(Arc::default())
    }
}

/// One open connection's place in its key's count.
pub struct Place<K: Hash + Eq> {
    counts: Arc<Mutex<HashMap<K, u32>>>,
    key: K,
}

/// A place in an upstream's count.
pub type Slot = Place<crate::lease::ProxyKey>;

/// A place in a client's count.
pub type ClientSlot = Place<Arc<str>>;

fn lock<K>(m: &Mutex<HashMap<K, u32>>) -> MutexGuard<'_, HashMap<K, u32>> {
    // Counters only: a panic mid-update loses at most one count.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: Hash + Eq> Drop for Place<K> {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        if let Some(n) = c.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(&self.key);
            }
        }
    }
}

impl<K: Hash + Eq + Clone> Counts<K> {
    /// Counts one more connection of `key`.
    pub fn take(&self, key: &K) -> Place<K> {
        *lock(&self.0).entry(key.clone()).or_default() += 1;
        self.place(key)
    }

    /// Counts one more connection of `key` unless it holds `cap`.
    pub fn take_below(&self, key: &K, cap: u32) -> Option<Place<K>> {
        let mut c = lock(&self.0);
        let n = c.entry(key.clone()).or_default();
        if *n >= cap {
            if *n == 0 {
                c.remove(key);
            }
            return None;
        }
        *n += 1;
        drop(c);
        Some(self.place(key))
    }

    fn place(&self, key: &K) -> Place<K> {
        Place {
            counts: self.0.clone(),
            key: key.clone(),
        }
    }

    /// Connections of `key`.
    pub fn of(&self, key: &K) -> u32 {
        lock(&self.0).get(key).copied().unwrap_or(0)
    }

    /// Connections of every key.
    pub fn total(&self) -> usize {
        lock(&self.0).values().map(|&n| n as usize).sum()
    }

    /// The counts, held, for a pass over many keys under one lock.
    pub fn held(&self) -> MutexGuard<'_, HashMap<K, u32>> {
        lock(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_gives_its_count_back_and_a_cap_holds() {
        let c: Counts<&'static str> = Counts::default();
        let a = c.take(&"a");
        let b = c.take_below(&"a", 2).expect("below the cap");
        assert!(c.take_below(&"a", 2).is_none(), "at the cap");
        assert_eq!((c.of(&"a"), c.total()), (2, 2));
        drop(a);
        assert_eq!(c.of(&"a"), 1);
        drop(b);
        assert_eq!((c.of(&"a"), c.total()), (0, 0));
        assert!(c.held().is_empty(), "a key with nothing open is gone");
        assert!(c.take_below(&"z", 0).is_none());
        assert!(c.held().is_empty(), "a refused key leaves nothing behind");
    }
}
