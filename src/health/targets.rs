//! How [`Probes`] keeps its targets in step with the Proxy set: a walk
//! of the whole cache ([`Probes::sync`]) or one Proxy a watch event named
//! ([`Probes::sync_one`]); both intern new Proxies, start changed ones
//! over and drop gone ones, keeping the probe rate and the per-namespace
//! counts the pool and the fairness shares are sized from.

use std::sync::Arc;

use super::probes::{
    key_of, namespace_of, probe_spec, spread, write_key, Dropped, ProbeSpec, Probes, Target,
};
use crate::api::Proxy;
use crate::proxy_ids::Holder;

/// What [`Probes::upsert`] made of a Proxy.
enum Upsert {
    /// Probed, as it was or anew.
    Kept(u32),
    /// Probed, but its UID or target changed: it starts over.
    Restarted(u32),
    /// Nothing to probe now.
    Nothing,
}

impl Probes {
    /// Takes `key` into the targets, probed with `spec` taken from the
    /// Proxy at `version`, holding its id; its slot.
    fn insert(&mut self, key: &str, spec: Arc<ProbeSpec>, version: Option<Box<str>>) -> u32 {
        let (id, key) = self.ids.hold(key, Holder::Engine);
        let target = Target {
            id,
            key,
            spec,
            version,
            light: None,
            state: None,
            seen: self.syncs,
        };
        let slot = id.slot();
        if self.targets.len() <= slot {
            self.targets.resize_with(slot + 1, || None);
        }
        // The row is empty: a row of another id would hold its slot (the
        // engine's hold keeps it from being given again), and one of this
        // id is what `upsert` looked for before inserting.
        let slot32 = u32::try_from(slot).unwrap_or(u32::MAX);
        self.live += 1;
        self.targets[slot] = Some(target);
        self.count(slot32, true);
        slot32
    }

    /// Takes the target at `slot` out of the set (its key found it) and
    /// lets go of its id; the dropped verdict to withdraw.
    fn remove(&mut self, slot: u32) -> Option<Dropped> {
        self.count(slot, false);
        let t = self.targets.get_mut(slot as usize)?.take()?;
        self.live -= 1;
        self.ids.release(t.id, Holder::Engine);
        self.sched.remove(&slot);
        Some(Dropped {
            key: t.key.to_string(),
            gone: true,
        })
    }

    /// Counts target `id` in (or out of) the rate and its namespace.
    fn count(&mut self, id: u32, add: bool) {
        let Some(Some(t)) = self.targets.get(id as usize) else {
            return;
        };
        let per_second = 1.0 / t.spec.interval.as_secs_f64().max(0.001);
        let ns = namespace_of(&t.key);
        if add {
            self.rate += per_second;
            // Looked up first: a walk recounts every target, and `entry`
            // would copy the namespace for each.
            match self.namespaces.get_mut(ns) {
                Some(n) => *n += 1,
                None => {
                    self.namespaces.insert(Box::from(ns), 1);
                }
            }
        } else {
            self.rate = (self.rate - per_second).max(0.0);
            if let Some(n) = self.namespaces.get_mut(ns) {
                *n -= 1;
                if *n == 0 {
                    self.namespaces.remove(ns);
                }
            }
        }
    }

    /// Brings the targets in step with `proxies` (the whole cache): new
    /// Proxies are seeded (spread over their first interval), changed
    /// ones (UID or target) start over, gone ones are pruned. Returns the
    /// Proxies whose published verdict must go.
    pub fn sync<'a>(
        &mut self,
        proxies: impl IntoIterator<Item = &'a Proxy>,
        now: u64,
    ) -> Vec<Dropped> {
        self.last_sync = Some(now);
        self.walk_asked = false;
        self.syncs += 1;
        let syncs = self.syncs;
        let mut dropped = Vec::new();
        // One buffer for every key looked up: a steady fleet's sync
        // allocates nothing per Proxy.
        let mut key = String::new();
        for p in proxies {
            let namespace = p.metadata.namespace.as_deref().unwrap_or_default();
            write_key(
                &mut key,
                namespace,
                p.metadata.name.as_deref().unwrap_or_default(),
            );
            let id = match self.upsert(&key, namespace, p, now) {
                Upsert::Kept(id) => id,
                Upsert::Restarted(id) => {
                    dropped.push(Dropped {
                        key: key.clone(),
                        gone: false,
                    });
                    id
                }
                // Not seen: pruned below.
                Upsert::Nothing => continue,
            };
            if let Some(Some(t)) = self.targets.get_mut(id as usize) {
                t.seen = syncs;
            }
        }
        let unseen: Vec<u32> = (0..self.targets.len())
            .filter(|&i| matches!(&self.targets[i], Some(t) if t.seen != syncs))
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        dropped.extend(unseen.into_iter().filter_map(|id| self.remove(id)));
        // Counted anew: the running sums of [`Probes::sync_one`] drift by
        // float rounding.
        self.rate = 0.0;
        self.namespaces.clear();
        for id in 0..self.targets.len() {
            self.count(u32::try_from(id).unwrap_or(u32::MAX), true);
        }
        dropped
    }

    /// Brings the target of `namespace/name` in step with `proxy`, its
    /// object in the cache now (`None`: gone), as a watch event asks.
    /// Returns the verdict that must go, if any.
    pub fn sync_one(
        &mut self,
        (namespace, name): (&str, &str),
        proxy: Option<&Proxy>,
        now: u64,
    ) -> Option<Dropped> {
        let key = key_of(namespace, name);
        let upserted = proxy.map(|p| self.upsert(&key, namespace, p, now));
        match upserted {
            Some(Upsert::Kept(_)) => None,
            Some(Upsert::Restarted(_)) => Some(Dropped { key, gone: false }),
            Some(Upsert::Nothing) | None => {
                let (slot, _) = self.target(&key)?;
                self.remove(slot)
            }
        }
    }

    /// Takes `p` (at `key`, in `namespace`) into the targets: a new
    /// target, a changed one, or as it was.
    fn upsert(&mut self, key: &str, namespace: &str, p: &Proxy, now: u64) -> Upsert {
        if self.unchanged(key, namespace, p) {
            if let Some((id, _)) = self.target(key) {
                return Upsert::Kept(id);
            }
        }
        let Some(spec) = probe_spec(p, &self.defaults) else {
            return Upsert::Nothing;
        };
        let version = p.metadata.resource_version.as_deref().map(Box::from);
        let interval = spec.interval.as_millis() as u64;
        let Some((id, old)) = self.target_mut(key) else {
            let id = self.insert(key, Arc::new(spec), version);
            self.sched.upsert(&id, interval, now, spread(key, interval));
            return Upsert::Kept(id);
        };
        old.version = version;
        if old.spec.uid == spec.uid && old.spec.target == spec.target {
            if *old.spec != spec {
                let new = Arc::new(spec);
                // Its interval may change the rate.
                self.count(id, false);
                if let Some(Some(t)) = self.targets.get_mut(id as usize) {
                    t.spec = new;
                }
                self.count(id, true);
                self.sched.upsert(&id, interval, now, 0);
            }
            return Upsert::Kept(id);
        }
        self.count(id, false);
        if let Some(Some(t)) = self.targets.get_mut(id as usize) {
            t.spec = Arc::new(spec);
            t.state = None;
            t.light = None;
        }
        self.count(id, true);
        self.sched.remove(&id);
        self.sched.upsert(&id, interval, now, spread(key, interval));
        Upsert::Restarted(id)
    }

    /// Whether `p` is as its target was taken: the same resourceVersion
    /// and the same credentials at hand (the operator's defaults do not
    /// change while it runs).
    fn unchanged(&self, key: &str, namespace: &str, p: &Proxy) -> bool {
        let (Some((_, old)), Some(v)) = (self.target(key), &p.metadata.resource_version) else {
            return false;
        };
        if old.version.as_deref() != Some(v.as_str()) {
            return false;
        }
        let credentials = crate::credentials::secret_of(p)
            .and_then(|name| self.defaults.credentials.get(namespace, name));
        credentials == old.spec.target.credentials
    }
}
