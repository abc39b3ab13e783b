//! One small number per Proxy for the whole process (issue 34). The Proxy
//! store holds an id for each Proxy from the watch event that brings it in
//! until the one that takes it out; a reader that keeps per-Proxy state
//! (the health engine) holds the same id for as long as it keeps that
//! state, and keeps it in a table by [`ProxyId::slot`] instead of a map
//! keyed by its own copy of `namespace/name`. The key string is made once
//! and shared by every holder.
//!
//! A slot is freed only when no holder is left, and is given again with
//! a new generation: an id kept past its Proxy (a probe result arriving
//! late, a reader that missed events) never names another Proxy.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The key of a Proxy in the process: `namespace/name`.
pub fn key_of(namespace: &str, name: &str) -> String {
    let mut key = String::new();
    write_key(&mut key, namespace, name);
    key
}

/// Writes the [`key_of`] key into `buf` (cleared first), so a caller
/// looking up many keys reuses one buffer.
pub fn write_key(buf: &mut String, namespace: &str, name: &str) {
    buf.clear();
    buf.push_str(namespace);
    buf.push('/');
    buf.push_str(name);
}

/// The namespace and name of a [`key_of`] key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or((key, ""))
}

/// A Proxy's number in this process: its slot in the holders' tables and
/// the generation of that slot (8 bytes, compared without hashing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyId {
    slot: u32,
    generation: u32,
}

impl ProxyId {
    /// The index of the Proxy's row in a table by id; a row must also
    /// keep the whole id, since the slot is given again once freed.
    pub fn slot(self) -> usize {
        self.slot as usize
    }
}

/// Who holds an id. Holding is per holder, not counted: holding twice
/// and releasing once lets go, so an update seen twice cannot leak an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The Proxy store, while the Proxy is in it.
    Store,
    /// The health engine, while it probes the Proxy.
    Engine,
}

impl Holder {
    fn bit(self) -> u8 {
        match self {
            Holder::Store => 1,
            Holder::Engine => 2,
        }
    }
}

#[derive(Debug)]
struct Slot {
    /// `None`: free (listed in `free`).
    key: Option<Arc<str>>,
    generation: u32,
    holders: u8,
}

#[derive(Debug, Default)]
struct Table {
    by_key: HashMap<Arc<str>, u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Table {
    fn id(&self, slot: u32) -> ProxyId {
        let generation = self.slots.get(slot as usize).map_or(0, |s| s.generation);
        ProxyId { slot, generation }
    }

    fn live(&self, id: ProxyId) -> Option<&Slot> {
        self.slots
            .get(id.slot())
            .filter(|s| s.generation == id.generation && s.key.is_some())
    }
}

/// The process's table of Proxy ids, shared by cloning.
#[derive(Clone, Debug, Default)]
pub struct ProxyIds(Arc<RwLock<Table>>);

impl ProxyIds {
    /// An empty table (each test, or a reader with no store, has its own).
    pub fn new() -> Self {
        Self::default()
    }

    // A holder that panicked left the table whole: every change below is
    // made in full before anything can panic, so a poisoned lock is used.
    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of `key` for `by` (made if no one holds it), and the shared
    /// key string.
    pub fn hold(&self, key: &str, by: Holder) -> (ProxyId, Arc<str>) {
        let mut t = self.write();
        if let Some(&slot) = t.by_key.get(key) {
            let s = &mut t.slots[slot as usize];
            s.holders |= by.bit();
            let shared = s.key.clone().unwrap_or_else(|| Arc::from(key));
            return (t.id(slot), shared);
        }
        let shared: Arc<str> = Arc::from(key);
        let slot = match t.free.pop() {
            Some(slot) => {
                let s = &mut t.slots[slot as usize];
                s.key = Some(shared.clone());
                s.holders = by.bit();
                slot
            }
            None => {
                t.slots.push(Slot {
                    key: Some(shared.clone()),
                    generation: 0,
                    holders: by.bit(),
                });
                // More Proxies than u32 slots is far beyond any fleet a
                // process holds (each costs hundreds of bytes).
                u32::try_from(t.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        t.by_key.insert(shared.clone(), slot);
        (t.id(slot), shared)
    }

    /// `by` lets go of `id`; the slot is freed once no one holds it. An
    /// id of an older generation is no longer `by`'s to release.
    pub fn release(&self, id: ProxyId, by: Holder) {
        let mut t = self.write();
        let Some(s) = t.slots.get_mut(id.slot()) else {
            return;
        };
        if s.generation != id.generation || s.key.is_none() {
            return;
        }
        s.holders &= !by.bit();
        if s.holders != 0 {
            return;
        }
        let key = s.key.take();
        s.generation = s.generation.wrapping_add(1);
        if let Some(k) = key {
            t.by_key.remove(&k);
        }
        t.free.push(id.slot);
    }

    /// The id of `key`, if anyone holds it.
    pub fn get(&self, key: &str) -> Option<ProxyId> {
        let t = self.read();
        t.by_key.get(key).map(|&slot| t.id(slot))
    }

    /// The key `id` names, while it is held.
    pub fn key(&self, id: ProxyId) -> Option<Arc<str>> {
        self.read().live(id).and_then(|s| s.key.clone())
    }

    /// Whether `by` holds `id`.
    pub fn held(&self, id: ProxyId, by: Holder) -> bool {
        self.read()
            .live(id)
            .is_some_and(|s| s.holders & by.bit() != 0)
    }

    /// Every id `by` holds, with its key.
    pub fn held_by(&self, by: Holder) -> Vec<(ProxyId, Arc<str>)> {
        let t = self.read();
        t.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.holders & by.bit() != 0)
            .filter_map(|(i, s)| Some((t.id(u32::try_from(i).ok()?), s.key.clone()?)))
            .collect()
    }

    /// Ids held now.
    pub fn len(&self) -> usize {
        self.read().by_key.len()
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows a table by slot needs (the highest slot given, plus one).
    pub fn capacity(&self) -> usize {
        self.read().slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_shared_by_its_holders_and_freed_only_when_the_last_lets_go() {
        let ids = ProxyIds::new();
        let (a, key) = ids.hold("ns/a", Holder::Store);
        let (again, shared) = ids.hold("ns/a", Holder::Engine);
        assert_eq!(a, again, "one id per key, whoever holds it");
        assert!(Arc::ptr_eq(&key, &shared), "one key string, shared");
        // Holding twice is holding once.
        ids.hold("ns/a", Holder::Store);
        ids.release(a, Holder::Store);
        assert_eq!(ids.key(a).as_deref(), Some("ns/a"), "the engine holds it");
        assert!(!ids.held(a, Holder::Store));
        assert!(ids.held(a, Holder::Engine));
        ids.release(a, Holder::Engine);
        assert_eq!(ids.key(a), None);
        assert_eq!(ids.get("ns/a"), None);
        assert!(ids.is_empty());
    }

    #[test]
    fn a_freed_slot_is_given_again_under_a_new_generation_that_old_ids_do_not_reach() {
        let ids = ProxyIds::new();
        let (a, _) = ids.hold("ns/a", Holder::Store);
        ids.release(a, Holder::Store);
        let (b, _) = ids.hold("ns/b", Holder::Store);
        assert_eq!(a.slot(), b.slot(), "the slot is reused: tables stay small");
        assert_ne!(a, b);
        assert_eq!(ids.key(a), None, "the old id names nothing");
        assert_eq!(ids.key(b).as_deref(), Some("ns/b"));
        // A late release under the old id does not free the new Proxy.
        ids.release(a, Holder::Store);
        assert_eq!(ids.get("ns/b"), Some(b));
        assert_eq!(ids.capacity(), 1);
        // The same name coming back is a new id too.
        let (c, _) = ids.hold("ns/c", Holder::Engine);
        assert_eq!(ids.held_by(Holder::Store), vec![(b, Arc::from("ns/b"))]);
        assert_eq!(ids.held_by(Holder::Engine), vec![(c, Arc::from("ns/c"))]);
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn keys_split_back_into_namespace_and_name() {
        let mut buf = String::from("left over");
        write_key(&mut buf, "crawl", "p-1");
        assert_eq!(buf, "crawl/p-1");
        assert_eq!(split_key(&buf), ("crawl", "p-1"));
        assert_eq!(key_of("a", "b"), "a/b");
    }
}
