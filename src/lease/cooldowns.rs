//! Cooldowns from reports, bounded (see [`super::bounds`] for the caps
//! and digests they share with sticky keys): a proxy withheld from the
//! reporting client, for every site or for one, and from every client
//! once enough distinct clients agree. Pure: time is an argument.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::bounds::*;
use super::ProxyKey;

/// Site cooldowns one client's reports keep at most. A crawler reports
/// the sites that ban it as it meets them; a thousand bans live at once
/// (within one cooldown) is far past what an honest crawler sees, and
/// keeps one client's share to 2% of [`MAX_COOLDOWN_SITES`]. Past it, the
/// client's report ending first makes room: its newest word counts, and
/// a crawler has no new error to handle (docs/api.md, "Reports").
pub const MAX_SITE_REPORTS_PER_CLIENT: usize = 1_000;

/// Reports on one proxy (for every site, or for one), by client: until
/// when. A client's own live report withholds the proxy from that client;
/// live reports from `min` distinct clients withhold it from everyone.
type Reports = Vec<(Arc<str>, DateTime<Utc>)>;

/// What recording a report did to a [`Reports`] list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Recorded {
    /// The client had reported: its end was `(was, now)`.
    Extended(DateTime<Utc>, DateTime<Utc>),
    /// A new entry.
    Added,
    /// The list was full: this client's report (ending then) made room.
    Replaced(Arc<str>, DateTime<Utc>),
}

/// Records `client`'s report until `until` in a list held to `min`
/// entries (a quorum needs no more).
fn record(reports: &mut Reports, client: &Arc<str>, until: DateTime<Utc>, min: usize) -> Recorded {
    if let Some((_, t)) = reports.iter_mut().find(|(who, _)| who == client) {
        let was = *t;
        *t = was.max(until);
        return Recorded::Extended(was, *t);
    }
    if reports.len() < min {
        reports.push((client.clone(), until));
        return Recorded::Added;
    }
    match reports.iter_mut().min_by_key(|(_, t)| *t) {
        // Full: `min` reports are held; the one ending first makes room
        // (a quorum of live reports stays a quorum).
        Some(first) => {
            let (who, t) = std::mem::replace(first, (client.clone(), until));
            Recorded::Replaced(who, t)
        }
        // `min` is at least 1, so a full list is never empty.
        None => {
            reports.push((client.clone(), until));
            Recorded::Added
        }
    }
}

/// Whether `reports` withhold the proxy from `client` at `now`: its own
/// live report, or live reports from `min` distinct clients.
fn withheld(reports: &Reports, client: &str, min: usize, now: DateTime<Utc>) -> bool {
    let live = || reports.iter().filter(|(_, t)| *t > now);
    live().count() >= min || live().any(|(who, _)| who.as_ref() == client)
}

/// When live reports from `min` distinct clients stop agreeing: the
/// `min`-th latest end among the live ones.
fn quorum_until(reports: &Reports, min: usize, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let mut ends: Vec<DateTime<Utc>> = reports
        .iter()
        .map(|(_, t)| *t)
        .filter(|t| *t > now)
        .collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends.get(min.checked_sub(1)?).copied()
}

/// One site's cooldown of one proxy.
#[derive(Debug, Default)]
struct SiteCooldown {
    /// Withheld from every client until then, whoever reported it: a
    /// hand-over's fleet-wide entry (a snapshot's `sites`).
    everyone: Option<DateTime<Utc>>,
    /// The clients' own reports for the site.
    reports: Reports,
}

impl SiteCooldown {
    fn is_empty(&self) -> bool {
        self.everyone.is_none() && self.reports.is_empty()
    }
}

/// Cooldowns of one proxy.
#[derive(Debug, Default)]
struct ProxyCooldown {
    /// Reports for every site. At most `min_clients` entries.
    global: Reports,
    /// Per site.
    sites: HashMap<KeyDigest, SiteCooldown>,
}

fn live_one<'a>(
    proxy: &'a ProxyKey,
    c: &'a ProxyCooldown,
    min: usize,
    now: DateTime<Utc>,
) -> LiveCooldown<'a> {
    let global = c
        .global
        .iter()
        .filter(|(_, t)| *t > now)
        .map(|(who, t)| (who, *t))
        .collect();
    let mut sites = Vec::new();
    let mut site_reports = Vec::new();
    for (d, s) in &c.sites {
        let everyone = s.everyone.filter(|t| *t > now);
        if let Some(t) = everyone.max(quorum_until(&s.reports, min, now)) {
            sites.push((d, t));
        }
        site_reports.extend(
            s.reports
                .iter()
                .filter(|(_, t)| *t > now)
                .map(|(who, t)| (d, who, *t)),
        );
    }
    LiveCooldown {
        proxy,
        global,
        sites,
        site_reports,
    }
}

impl ProxyCooldown {
    fn is_empty(&self) -> bool {
        self.global.is_empty() && self.sites.is_empty()
    }
}

/// A client's site reports, ending first first: (end, proxy, site).
type ByClient = BTreeSet<(DateTime<Utc>, Arc<ProxyKey>, KeyDigest)>;

/// One proxy's cooldowns live at some moment, for a hand-over.
#[derive(Debug)]
pub struct LiveCooldown<'a> {
    /// The proxy.
    pub proxy: &'a ProxyKey,
    /// Reports for every site: (client, end).
    pub global: Vec<(&'a Arc<str>, DateTime<Utc>)>,
    /// Sites withheld from every client: (site, end).
    pub sites: Vec<(&'a KeyDigest, DateTime<Utc>)>,
    /// Clients' own site reports: (site, client, end).
    pub site_reports: Vec<(&'a KeyDigest, &'a Arc<str>, DateTime<Utc>)>,
}

/// Per-proxy cooldowns, globally or per site, each from clients' reports.
#[derive(Debug)]
pub struct Cooldowns {
    caps: Caps,
    per_client: usize,
    min_clients: usize,
    /// Keyed by one shared copy of each proxy's key, which the clients'
    /// ledgers point to (a report costs 8 bytes of key, not a copy).
    proxies: HashMap<Arc<ProxyKey>, ProxyCooldown>,
    /// Site entries held (proxy and site).
    sites: usize,
    /// Every site report, by client: the per-client bound's ledger.
    by_client: HashMap<Arc<str>, ByClient>,
}

impl Cooldowns {
    /// No cooldowns; a report withholds a proxy from its client, and from
    /// everyone once `min_clients` distinct clients reported it (at least
    /// 1). One client keeps at most `per_client` site reports.
    pub fn new(caps: Caps, per_client: usize, min_clients: usize) -> Self {
        Cooldowns {
            caps,
            per_client: per_client.max(1),
            min_clients: min_clients.max(1),
            proxies: HashMap::new(),
            sites: 0,
            by_client: HashMap::new(),
        }
    }

    /// Whether any proxy has a cooldown entry (live or not yet swept).
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// Site entries held (a proxy and a site each).
    pub fn sites(&self) -> usize {
        self.sites
    }

    /// Clients' site reports held, in all.
    pub fn site_reports(&self) -> usize {
        self.by_client.values().map(BTreeSet::len).sum()
    }

    /// Site reports held from `client`.
    pub fn site_reports_of(&self, client: &str) -> usize {
        self.by_client.get(client).map_or(0, BTreeSet::len)
    }

    /// Whether `proxy` is withheld from `client` at `now`: for every site
    /// or for `site`, each by the client's own report or by enough
    /// clients' reports.
    pub fn blocks(
        &self,
        proxy: &ProxyKey,
        site: Option<&KeyDigest>,
        client: &str,
        now: DateTime<Utc>,
    ) -> bool {
        let Some(c) = self.proxies.get(proxy) else {
            return false;
        };
        let min = self.min_clients;
        withheld(&c.global, client, min, now)
            || site.and_then(|s| c.sites.get(s)).is_some_and(|s| {
                s.everyone.is_some_and(|t| t > now) || withheld(&s.reports, client, min, now)
            })
    }

    /// Records `client`'s report that `proxy` fails for every site, until
    /// `until` (or later).
    pub fn put_global(&mut self, proxy: &ProxyKey, client: &Arc<str>, until: DateTime<Utc>) {
        let key = self.key(proxy);
        let c = self.proxies.entry(key).or_default();
        record(&mut c.global, client, until, self.min_clients);
    }

    /// Records `client`'s report that `proxy` fails for `site`, until
    /// `until` (or later).
    pub fn put_site(
        &mut self,
        proxy: &ProxyKey,
        site: &str,
        client: &Arc<str>,
        until: DateTime<Utc>,
    ) -> Result<(), Full> {
        self.put_site_digest(proxy, digest(site), client, until)
    }

    /// [`Cooldowns::put_site`] for a site already digested (a hand-over).
    pub fn put_site_digest(
        &mut self,
        proxy: &ProxyKey,
        d: KeyDigest,
        client: &Arc<str>,
        until: DateTime<Utc>,
    ) -> Result<(), Full> {
        let existing = self.proxies.get(proxy).and_then(|c| c.sites.get(&d));
        let reported = existing.is_some_and(|s| s.reports.iter().any(|(who, _)| who == client));
        if existing.is_none() {
            self.room_for_site(proxy)?;
        }
        if !reported && self.site_reports_of(client) >= self.per_client {
            self.drop_first_of(client);
        }
        let min = self.min_clients;
        let mut added = false;
        let key = self.key(proxy);
        let s = self
            .proxies
            .entry(key.clone())
            .or_default()
            .sites
            .entry(d)
            .or_insert_with(|| {
                added = true;
                SiteCooldown::default()
            });
        let recorded = record(&mut s.reports, client, until, min);
        if added {
            self.sites += 1;
        }
        let ledger = self.by_client.entry(client.clone()).or_default();
        match recorded {
            Recorded::Extended(was, now) => {
                ledger.remove(&(was, key.clone(), d));
                ledger.insert((now, key, d));
            }
            Recorded::Added => {
                ledger.insert((until, key, d));
            }
            Recorded::Replaced(who, t) => {
                ledger.insert((until, key.clone(), d));
                self.unledger(&who, &(t, key, d));
            }
        }
        Ok(())
    }

    /// Withholds `proxy` from every client for `site` until `until` (or
    /// later): a hand-over's fleet-wide entry.
    pub fn put_site_everyone(
        &mut self,
        proxy: &ProxyKey,
        d: KeyDigest,
        until: DateTime<Utc>,
    ) -> Result<(), Full> {
        if let Some(s) = self
            .proxies
            .get_mut(proxy)
            .and_then(|c| c.sites.get_mut(&d))
        {
            s.everyone = Some(s.everyone.map_or(until, |t| t.max(until)));
            return Ok(());
        }
        self.room_for_site(proxy)?;
        let s = SiteCooldown {
            everyone: Some(until),
            reports: Vec::new(),
        };
        let key = self.key(proxy);
        self.proxies.entry(key).or_default().sites.insert(d, s);
        self.sites += 1;
        Ok(())
    }

    /// The shared key of `proxy`: the one held, or a new one.
    pub(super) fn key(&self, proxy: &ProxyKey) -> Arc<ProxyKey> {
        match self.proxies.get_key_value(proxy) {
            Some((k, _)) => k.clone(),
            None => Arc::new(proxy.clone()),
        }
    }

    /// Whether a new site entry for `proxy` fits the caps.
    fn room_for_site(&self, proxy: &ProxyKey) -> Result<(), Full> {
        if self.sites >= self.caps.total {
            return Err(Full::Total);
        }
        let held = self.proxies.get(proxy).map_or(0, |c| c.sites.len());
        if held >= self.caps.per_proxy {
            return Err(Full::PerProxy);
        }
        Ok(())
    }

    /// Forgets `client`'s site report ending first (its oldest).
    fn drop_first_of(&mut self, client: &Arc<str>) {
        let Some((t, proxy, d)) = self.by_client.get_mut(client).and_then(BTreeSet::pop_first)
        else {
            return;
        };
        if self.by_client.get(client).is_some_and(BTreeSet::is_empty) {
            self.by_client.remove(client);
        }
        let Some(c) = self.proxies.get_mut(proxy.as_ref()) else {
            return;
        };
        if let Some(s) = c.sites.get_mut(&d) {
            s.reports.retain(|(who, end)| !(who == client && *end == t));
            if s.is_empty() {
                c.sites.remove(&d);
                self.sites = self.sites.saturating_sub(1);
            }
        }
        if c.is_empty() {
            self.proxies.remove(proxy.as_ref());
        }
    }

    fn unledger(&mut self, client: &Arc<str>, entry: &(DateTime<Utc>, Arc<ProxyKey>, KeyDigest)) {
        if let Some(l) = self.by_client.get_mut(client) {
            l.remove(entry);
            if l.is_empty() {
                self.by_client.remove(client);
            }
        }
    }

    /// Every cooldown live at `now`, per proxy. A site withheld from
    /// everyone is listed as such (until its quorum or hand-over entry
    /// ends) besides the reports that make it so: an importer that knows
    /// only fleet-wide site entries still withholds it from everyone.
    pub fn live(&self, now: DateTime<Utc>) -> impl Iterator<Item = LiveCooldown<'_>> {
        let min = self.min_clients;
        self.proxies
            .iter()
            .map(move |(p, c)| live_one(p, c, min, now))
    }

    /// The cooldowns of `proxy` live at `now`, if it has any entry.
    pub fn live_of(&self, proxy: &ProxyKey, now: DateTime<Utc>) -> Option<LiveCooldown<'_>> {
        let (p, c) = self.proxies.get_key_value(proxy)?;
        Some(live_one(p, c, self.min_clients, now))
    }

    /// Removes cooldowns that ended by `now`.
    pub fn sweep(&mut self, now: DateTime<Utc>) {
        self.proxies.retain(|_, c| {
            c.global.retain(|(_, t)| *t > now);
            c.sites.retain(|_, s| {
                s.everyone = s.everyone.filter(|t| *t > now);
                s.reports.retain(|(_, t)| *t > now);
                !s.is_empty()
            });
            !c.is_empty()
        });
        self.by_client.retain(|_, l| {
            l.retain(|(t, _, _)| *t > now);
            !l.is_empty()
        });
        self.recount();
    }

    fn recount(&mut self) {
        self.sites = self.proxies.values().map(|c| c.sites.len()).sum();
    }

    /// Forgets the cooldowns of proxies not in `present`.
    pub fn retain_proxies(&mut self, present: &HashSet<ProxyKey>) {
        self.proxies.retain(|k, _| present.contains(k.as_ref()));
        self.by_client.retain(|_, l| {
            l.retain(|(_, p, _)| present.contains(p.as_ref()));
            !l.is_empty()
        });
        self.recount();
    }

    /// Forgets the cooldowns of the proxies in `gone`; no pass over the
    /// clients' reports unless one of them had a site entry.
    pub fn forget_proxies(&mut self, gone: &HashSet<ProxyKey>) {
        let mut had_sites = false;
        for k in gone {
            if let Some(c) = self.proxies.remove(k) {
                had_sites |= !c.sites.is_empty();
                self.sites = self.sites.saturating_sub(c.sites.len());
            }
        }
        if had_sites {
            self.by_client.retain(|_, l| {
                l.retain(|(_, p, _)| !gone.contains(p.as_ref()));
                !l.is_empty()
            });
        }
    }
}
