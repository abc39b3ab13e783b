//! How the listing is rebuilt and the sweep learns of deleted Proxies:
//! from the Proxy store's events where the source announces them (the
//! changed Proxies merged into the listing in force, the deleted ones
//! forgotten one by one), by a walk of every Proxy otherwise.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::changes::Touched;
use super::freshness::Stamp;
use super::item::item_of;
use super::listing::{Entry, Listing, ListingData};
use super::state::{ApiState, Held};
use crate::api::Proxy;
use crate::lease::ProxyKey;

/// What a rebuild starts from.
enum Since {
    /// Every Proxy: the first build, a relist, missed changes, changed
    /// credentials, a source that announces nothing, or the safety net.
    Walk,
    /// The Proxies changed since the listing in force, sorted.
    Touched(BTreeSet<Touched>),
}

/// How often a listing patched from events is built from every Proxy
/// anyway: what no event announces (a credentials lookup that changes by
/// itself when this process's write stops outranking the watch) is in
/// the listing within this.
pub const LISTING_WALK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl ApiState {
    /// A new listing from the source, under the rebuild flag (taken by the
    /// caller when `current` exists).
    pub(super) fn rebuild(&self, current: Held, stamp: Option<Stamp>) -> Listing {
        // Built outside the lock so readers never wait for a rebuild; the
        // flag is cleared however this ends.
        struct Clear<'a>(&'a AtomicBool);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _clear = Clear(&self.rebuilding);
        let fresh = self.generations.fetch_add(1, Ordering::AcqRel) + 1;
        let previous = current.as_ref().map(|(_, _, l)| l);
        let credentials = self.credentials.version();
        // Patched where the announced changes fall while the credentials
        // are as the listing in force was stamped with.
        let built_with = current.as_ref().and_then(|(_, s, _)| *s).map(|s| s.1);
        let since = self.since(previous.is_some() && built_with == Some(credentials));
        let items = match (since, previous) {
            (Since::Touched(touched), Some(l)) => self.patched(l, touched, credentials),
            _ => self.walked(previous, credentials),
        };
        // The same proxies as the listing it replaces (a rebuild under
        // this request's flag, so no other rebuild ran since): the store
        // already holds that set under its generation, which the new
        // listing keeps, and nothing is merged under the store's lock.
        let same = current.as_ref().map(|(_, _, l)| l).filter(|l| {
            l.len() == items.len()
                && l.iter().zip(&items).all(|(a, b)| a.key == b.key)
                // Not when the store's table was replaced since (a
                // follower's copy): it must be told the set again.
                && self.leases.eligible_generation() == Some(l.generation())
        });
        let generation = match same {
            Some(l) => l.generation(),
            None => {
                // Keys are unique (namespace/name), so the sorted keys are
                // the store's form of the set. Told before the listing is
                // published: a request holding an older listing is then
                // checked against it.
                self.leases
                    .set_eligible(fresh, items.iter().map(|e| e.key.clone()).collect());
                fresh
            }
        };
        let items = Arc::new(ListingData::new(generation, items));
        let mut held = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        // Two first builds may race: the newer listing stays (a rebuild of
        // the same set keeps the generation it replaces).
        if held
            .as_ref()
            .is_none_or(|(_, _, l)| l.generation() <= generation)
        {
            *held = Some((Instant::now(), stamp, items.clone()));
        }
        items
    }

    /// What this rebuild starts from, taking the changes announced since
    /// the last; `patchable`: a listing in force that only Proxy changes
    /// made stale.
    fn since(&self, patchable: bool) -> Since {
        let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        c.drain();
        let touched = std::mem::take(&mut c.touched);
        let walk = !patchable
            || c.listing_walk
            || c.follow.is_none()
            || c.walked.is_none_or(|at| at.elapsed() >= LISTING_WALK_EVERY);
        if walk {
            // The walk shows what the drained changes announced.
            c.listing_walk = false;
            c.walked = Some(Instant::now());
            c.walks += 1;
            Since::Walk
        } else {
            Since::Touched(touched)
        }
    }

    /// Walks of the whole source so far (tests).
    #[cfg(test)]
    pub(super) fn walks(&self) -> u64 {
        self.changes.lock().unwrap_or_else(|p| p.into_inner()).walks
    }

    /// The entry of `p` made from `credentials`: `previous`'s while its
    /// Proxy and the credentials are as when it was made.
    fn entry_of(
        &self,
        p: &Proxy,
        previous: Option<&ListingData>,
        credentials: u64,
    ) -> Option<Arc<Entry>> {
        let rv = p.metadata.resource_version.as_deref();
        let kept = previous.and_then(|l| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let name = p.metadata.name.as_deref().unwrap_or_default();
            l.entry(ns, name).filter(|e| e.made_from(rv, credentials))
        });
        match kept {
            Some(e) => Some(e.clone()),
            None => item_of(p, &self.external, &self.credentials)
                .map(|i| Arc::new(Entry::new(i, rv, credentials))),
        }
    }

    /// The listing's entries from every Proxy of the source, sorted. An
    /// entry whose Proxy and credentials are as when the listing in force
    /// made it is reused as it is: a rebuild during churn makes only the
    /// entries of the Proxies that changed.
    fn walked(&self, previous: Option<&Listing>, credentials: u64) -> Vec<Arc<Entry>> {
        let mut items: Vec<Arc<Entry>> = self
            .source
            .proxies()
            .iter()
            .filter_map(|p| self.entry_of(p, previous.map(|l| &**l), credentials))
            .collect();
        items.sort_by(|a, b| a.key.cmp(&b.key));
        items
    }

    /// `previous`'s entries with those of the `touched` Proxies (sorted)
    /// made again from the source as it is now: a merge of two sorted
    /// runs, no walk of the source, no sort.
    fn patched(
        &self,
        previous: &ListingData,
        touched: BTreeSet<Touched>,
        credentials: u64,
    ) -> Vec<Arc<Entry>> {
        let made: Vec<(Touched, Option<Arc<Entry>>)> = touched
            .into_iter()
            .map(|(ns, name)| {
                let entry = self
                    .source
                    .get(&ns, &name)
                    .and_then(|p| self.entry_of(&p, Some(previous), credentials));
                ((ns, name), entry)
            })
            .collect();
        let mut items = Vec::with_capacity(previous.len() + made.len());
        let mut made = made.into_iter().peekable();
        for e in previous.iter() {
            let at = (e.key.namespace.as_str(), e.key.name.as_str());
            // The touched Proxies up to this entry: theirs (or none)
            // stand; one at this entry replaces it.
            let mut replaced = false;
            while let Some(((ns, name), _)) = made.peek() {
                let order = (ns.as_str(), name.as_str()).cmp(&at);
                if order == std::cmp::Ordering::Greater {
                    break;
                }
                replaced = order == std::cmp::Ordering::Equal;
                items.extend(made.next().and_then(|(_, entry)| entry));
                if replaced {
                    break;
                }
            }
            if !replaced {
                items.push(e.clone());
            }
        }
        items.extend(made.filter_map(|(_, entry)| entry));
        items
    }

    /// Makes the lease store forget the sticky keys and cooldowns of
    /// deleted Proxies, when the source changed since `seen` (updated) or
    /// does not count its changes: no walk over every Proxy, under the
    /// store's lock, while the fleet stands still.
    /// A source that announces its changes is walked only the first time,
    /// after a relist or missed changes: otherwise the announced deletes
    /// are forgotten one by one.
    pub(crate) fn forget_deleted(&self, seen: &mut Option<u64>) {
        let version = self.source.version();
        if version.is_some() && version == *seen {
            return;
        }
        // Read before the walk: a change during it is seen next time.
        *seen = version;
        let gone = {
            let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            c.drain();
            let gone = std::mem::take(&mut c.gone);
            if c.sweep_walk || c.follow.is_none() {
                c.sweep_walk = false;
                c.walks += 1;
                None
            } else {
                Some(gone)
            }
        };
        let Some(gone) = gone else {
            self.leases.retain_proxies(&self.present());
            return;
        };
        // Made again since its delete: not gone.
        let gone: std::collections::HashSet<ProxyKey> = gone
            .into_iter()
            .filter(|(ns, name)| self.source.get(ns, name).is_none())
            .map(|(namespace, name)| ProxyKey { namespace, name })
            .collect();
        if !gone.is_empty() {
            self.leases.forget_proxies(&gone);
        }
    }

    /// Every Proxy the source knows, as lease-store keys (the sweep
    /// forgets the leases and cooldowns of the others).
    pub(super) fn present(&self) -> std::collections::HashSet<ProxyKey> {
        self.source
            .proxies()
            .iter()
            .map(|p| ProxyKey {
                namespace: kube::ResourceExt::namespace(p.as_ref()).unwrap_or_default(),
                name: kube::ResourceExt::name_any(p.as_ref()),
            })
            .collect()
    }
}
