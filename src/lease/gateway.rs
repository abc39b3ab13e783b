//! What the gateway asks of the lease store: whether a proxy is free of
//! exclusive leases and cooldowns for a connection, and cooldowns from
//! outside a lease (site bans, session reports), the same as a lease
//! report's.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::bounds::{digest, later};
use super::state::State;
use super::{LeaseStore, ProxyKey, Touched};

impl LeaseStore {
    /// Whether the gateway may send `client`'s new connections through
    /// `key`: no exclusive lease holds it (with one lease per proxy, a
    /// lease is exclusive) and no report cooled it down for `client`.
    pub fn lets_gateway_use(&self, client: &str, key: &ProxyKey, site: Option<&str>) -> bool {
        self.lets_gateway_use_all(client, &[key], (site, true))
            .first()
            .copied()
            .unwrap_or(false)
    }

    /// [`LeaseStore::lets_gateway_use`] for each of `keys`, in order,
    /// under one hold of the store's lock; exclusive leases withhold a
    /// proxy only `by_leases` (not from a stale copy of the leader's).
    pub fn lets_gateway_use_all(
        &self,
        client: &str,
        keys: &[&ProxyKey],
        (site, by_leases): (Option<&str>, bool),
    ) -> Vec<bool> {
        let site = site.map(digest);
        let now = self.clock.now();
        let mut st = self.lock();
        st.expire_leases(now);
        let exclusive = by_leases && self.config.max_leases_per_proxy <= 1;
        keys.iter()
            .map(|key| {
                let held = exclusive && st.proxies.get(*key).is_some_and(|p| p.active() > 0);
                !held && !st.cooldowns.blocks(key, site.as_ref(), client, now)
            })
            .collect()
    }

    /// Clients' site reports held, in all and from `client` (the
    /// per-client bound's figures, `/metrics`).
    pub fn site_reports(&self, client: &str) -> (usize, usize) {
        let st = self.lock();
        (
            st.cooldowns.site_reports(),
            st.cooldowns.site_reports_of(client),
        )
    }

    /// A bad outcome of `proxy` seen outside a lease (the gateway's bans
    /// and session reports): the cooldown a lease report would give, for
    /// `site` when given, else for every site; for `client` (and for every
    /// client once enough distinct clients reported it).
    pub fn cool_down(&self, proxy: &ProxyKey, client: &Arc<str>, site: Option<&str>) {
        let now = self.clock.now();
        let until = later(now, self.config.cooldown);
        let mut st = self.lock();
        cool(&mut st, proxy, client, site, until);
        // The cooldowns' own copy of the key: a log of reports holds no
        // copy of its own per entry.
        let key = st.cooldowns.key(proxy);
        self.changed(&mut st, [Touched::Cooling(key)]);
    }
}

/// Puts `proxy` in cooldown until `until`, for `site` when given, else
/// for every site: for `client`, and for everyone once enough distinct
/// clients reported the same.
pub(super) fn cool(
    st: &mut State,
    proxy: &ProxyKey,
    client: &Arc<str>,
    site: Option<&str>,
    until: DateTime<Utc>,
) {
    match site {
        // Bounded: past the caps the site cooldown is not kept.
        Some(s) => {
            let _ = st.cooldowns.put_site(proxy, s, client, until);
        }
        None => st.cooldowns.put_global(proxy, client, until),
    }
}
