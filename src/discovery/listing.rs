//! The listing of eligible proxies a lease request chooses from, and per
//! listing the proxies each recently asked filter matches, so an acquire
//! does not filter the whole listing (docs/architecture.md, "The lease
//! index").

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use super::model::{Filter, Filters, ProxyItem};
use crate::lease::{Candidates, ProxyKey};

/// Distinct filters whose matches one listing keeps; past it the least
/// recently asked is dropped.
pub const MAX_CACHED_FILTERS: usize = 64;

/// One eligible proxy of a listing: its lease-store key and its entry,
/// with what they were made from, so the next listing reuses the same
/// entry while its Proxy and the credentials stay as they were.
#[derive(Debug)]
pub struct Entry {
    /// The lease store's key of the proxy.
    pub key: ProxyKey,
    /// What crawlers are told of it.
    pub item: ProxyItem,
    /// The Proxy's resourceVersion and the credentials' version it was
    /// made from; `None`: never reused (a source without versions).
    made_from: Option<(String, u64)>,
}

impl Entry {
    /// An entry made from a Proxy at `resource_version` with the
    /// credentials at `credentials` (their version).
    pub fn new(item: ProxyItem, resource_version: Option<&str>, credentials: u64) -> Self {
        Entry {
            key: item.key(),
            made_from: resource_version.map(|rv| (rv.to_string(), credentials)),
            item,
        }
    }

    /// Whether it was made from the Proxy at `resource_version` with the
    /// credentials at `credentials`.
    pub fn made_from(&self, resource_version: Option<&str>, credentials: u64) -> bool {
        match (&self.made_from, resource_version) {
            (Some((rv, c)), Some(now)) => rv == now && *c == credentials,
            _ => false,
        }
    }
}

/// Eligible proxies sorted by namespace/name, of one generation (the
/// lease store is told the same set with it).
#[derive(Debug)]
pub struct ListingData {
    generation: u64,
    items: Vec<Arc<Entry>>,
    matches: Mutex<FilterCache>,
}

#[derive(Debug, Default)]
struct FilterCache {
    /// Filter → (last asked, positions in the listing of its matches).
    by: HashMap<Filters, (u64, Arc<[u32]>)>,
    tick: u64,
}

impl Deref for ListingData {
    type Target = [Arc<Entry>];
    fn deref(&self) -> &Self::Target {
        &self.items
    }
}

impl ListingData {
    /// A listing of `items` (sorted by key) numbered `generation`.
    pub fn new(generation: u64, items: Vec<Arc<Entry>>) -> Self {
        ListingData {
            generation,
            items,
            matches: Mutex::new(FilterCache::default()),
        }
    }

    /// Its generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The entry of `key`.
    pub fn get(&self, key: &ProxyKey) -> Option<&ProxyItem> {
        self.items
            .binary_search_by(|e| e.key.cmp(key))
            .ok()
            .map(|i| &self.items[i].item)
    }

    /// The entry of the proxy `namespace/name`, found without making a key.
    pub fn entry(&self, namespace: &str, name: &str) -> Option<&Arc<Entry>> {
        self.items
            .binary_search_by(|e| {
                (e.key.namespace.as_str(), e.key.name.as_str()).cmp(&(namespace, name))
            })
            .ok()
            .map(|i| &self.items[i])
    }

    /// The proxies matching `f`: every one for no filter; else the
    /// positions of the matches, computed once per filter and listing.
    pub fn members(&self, f: &Filter) -> Members<'_> {
        if f.is_empty() {
            return Members {
                listing: self,
                subset: None,
            };
        }
        let mut cache = self.matches.lock().unwrap_or_else(|p| p.into_inner());
        cache.tick += 1;
        let tick = cache.tick;
        if let Some((asked, subset)) = cache.by.get_mut(f.filters()) {
            *asked = tick;
            let subset = subset.clone();
            return Members {
                listing: self,
                subset: Some(subset),
            };
        }
        // Computed under the lock: a burst of one new filter filters the
        // listing once, not once per request.
        let subset: Arc<[u32]> = self
            .items
            .iter()
            .enumerate()
            .filter(|(_, e)| f.matches(&e.item))
            // A listing holds fewer than 2^32 proxies (the API server's
            // object count is far below).
            .map(|(n, _)| u32::try_from(n).unwrap_or(u32::MAX))
            .collect();
        if cache.by.len() >= MAX_CACHED_FILTERS {
            let oldest = cache
                .by
                .iter()
                .min_by_key(|(_, (asked, _))| *asked)
                .map(|(f, _)| f.clone());
            if let Some(o) = oldest {
                cache.by.remove(&o);
            }
        }
        cache.by.insert(f.filters().clone(), (tick, subset.clone()));
        Members {
            listing: self,
            subset: Some(subset),
        }
    }
}

impl ListingData {
    /// The positions of the entries matching `f`, ascending; `None`:
    /// every entry (no filter).
    pub fn positions(&self, f: &Filter) -> Option<Arc<[u32]>> {
        self.members(f).subset
    }
}

/// The proxies of a listing one request may lease.
pub struct Members<'a> {
    listing: &'a ListingData,
    /// Positions in the listing, ascending; `None`: all of it.
    subset: Option<Arc<[u32]>>,
}

impl Members<'_> {
    fn key(&self, pos: u32) -> Option<&ProxyKey> {
        self.listing.items.get(pos as usize).map(|e| &e.key)
    }
}

impl Candidates for Members<'_> {
    fn len(&self) -> usize {
        self.subset
            .as_ref()
            .map_or(self.listing.items.len(), |s| s.len())
    }

    fn whole(&self) -> Option<u64> {
        self.subset.is_none().then_some(self.listing.generation)
    }

    fn contains(&self, key: &ProxyKey) -> bool {
        match &self.subset {
            None => self.listing.get(key).is_some(),
            Some(s) => s
                .binary_search_by(|&p| {
                    self.key(p)
                        .map_or(std::cmp::Ordering::Greater, |k| k.cmp(key))
                })
                .is_ok(),
        }
    }

    fn keys(&self) -> Box<dyn Iterator<Item = &ProxyKey> + '_> {
        match &self.subset {
            None => Box::new(self.listing.items.iter().map(|e| &e.key)),
            Some(s) => Box::new(s.iter().filter_map(|&p| self.key(p))),
        }
    }
}

/// A listing as handlers share it.
pub type Listing = Arc<ListingData>;
