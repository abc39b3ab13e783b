//! The upstream of one new connection: chosen within the caps on
//! connections per client and per upstream (`counts.rs` keeps them),
//! passing over the upstreams that just failed a connection (until the
//! health engine's verdict catches up).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::choose::{rendezvous, two_choices};
use super::counts::{ClientSlot, Counts, Slot};
use super::fleet::{Fleet, Upstream};
use super::sessions::Sessions;
use super::username::Wanted;
use super::Settings;
use crate::discovery::Filter;
use crate::lease::ProxyKey;

/// What one authenticated request asks.
pub(super) struct Ask {
    pub(super) client: Arc<str>,
    pub(super) wanted: Wanted,
    pub(super) filter: Filter,
}

/// How long an upstream that failed a connection is passed over.
pub const SUSPECT_FOR: Duration = Duration::from_secs(15);

/// The gateway's shared state.
pub struct Gateway {
    pub(super) fleet: Arc<dyn Fleet>,
    pub(super) settings: Settings,
    pub(super) metrics: super::metrics::GatewayMetrics,
    sessions: Mutex<Sessions>,
    /// Open connections per upstream.
    load: Counts<ProxyKey>,
    /// Open connections per client.
    clients: Counts<Arc<str>>,
    /// Upstreams that failed a connection, and until when they are
    /// passed over.
    suspects: Mutex<HashMap<ProxyKey, Instant>>,
    /// Random draws for rotation: a per-process random seed, stepped.
    seed: u64,
    draws: AtomicU64,
}

/// Why no upstream was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoUpstream {
    /// No eligible proxy matches the username's filters.
    #[error("no healthy proxy matches {0}")]
    NoneMatch(String),
    /// Some match, but every one is leased exclusively, cooling down,
    /// failed just now or at the gateway's per-upstream cap.
    #[error(
        "all {0} healthy proxies matching {1} are leased exclusively, cooling down, \
         failing or at the gateway's connection cap"
    )]
    AllBusy(usize, String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain values: a panic mid-update leaves them usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An upstream chosen for a connection.
#[derive(Debug)]
pub struct Chosen {
    pub upstream: Upstream,
    /// The session used another upstream before.
    pub moved: bool,
}

impl Gateway {
    /// A gateway over `fleet` within `settings`, counting in `metrics`.
    pub fn new(
        fleet: Arc<dyn Fleet>,
        settings: Settings,
        metrics: super::metrics::GatewayMetrics,
    ) -> Self {
        Gateway {
            fleet,
            sessions: Mutex::new(Sessions::new(settings.max_sessions)),
            settings,
            metrics,
            load: Counts::default(),
            clients: Counts::default(),
            suspects: Mutex::default(),
            seed: RandomState::new().hash_one(0u8),
            draws: AtomicU64::new(0),
        }
    }

    /// Counts a connection of `client`; none when it holds its cap.
    pub fn admit(&self, client: &Arc<str>) -> Option<ClientSlot> {
        self.clients
            .take_below(client, self.settings.max_per_client)
    }

    /// Counts a connection through `key`.
    pub fn occupy(&self, key: &ProxyKey) -> Slot {
        self.load.take(key)
    }

    /// `key` failed a connection with `e`: said, counted, and the upstream
    /// suspected (the connection is tried on another).
    pub fn failed(&self, key: &ProxyKey, e: &super::upstream::UpstreamError) {
        tracing::warn!(upstream = %key, error = %e, "A gateway upstream failed; trying another");
        self.metrics.upstream_error(e.class());
        self.suspect(key);
    }

    /// `key` failed a connection: probed by the health engine at once,
    /// and passed over for [`SUSPECT_FOR`] unless the suspects already
    /// make up their bounded share of the fleet (then the probe alone
    /// decides: a fault of the gateway's own path, or a burst that is
    /// not the upstreams', never takes the whole fleet out).
    pub fn suspect(&self, key: &ProxyKey) {
        self.fleet.failed(key);
        let now = Instant::now();
        let eligible = self.fleet.upstreams(&Filter::default()).len();
        let cap = suspect_cap(eligible, self.settings.max_suspect_percent);
        let mut s = lock(&self.suspects);
        s.retain(|_, until| *until > now);
        if !s.contains_key(key) && s.len() >= cap {
            tracing::debug!(upstream = %key, suspects = s.len(), "Gateway suspects at their share of the fleet; leaving this one to its probe");
            return;
        }
        s.insert(key.clone(), now + SUSPECT_FOR);
    }

    fn draw(&self, n: usize) -> usize {
        let step = self.draws.fetch_add(1, Ordering::Relaxed);
        let r = super::choose::weight(self.seed, step);
        // n is at least 1 here (two_choices draws only from a non-empty set).
        (r % n.max(1) as u64) as usize
    }

    /// Whether this request is one of those traced.
    pub fn traced(&self) -> bool {
        sampled(self.draw(PER_MILLION), self.settings.traced_per_million)
    }

    /// The upstream for a new connection of `client` to `site` asking
    /// `wanted` (its filter compiled as `filter`), other than `avoid`.
    pub fn choose(
        &self,
        (client, site): (&Arc<str>, Option<&str>),
        wanted: &Wanted,
        filter: &Filter,
        avoid: Option<&ProxyKey>,
    ) -> Result<Chosen, NoUpstream> {
        let matching = self.fleet.upstreams(filter);
        let asked = || describe(wanted);
        if matching.is_empty() {
            return Err(NoUpstream::NoneMatch(asked()));
        }
        let now = Instant::now();
        let usable = self.usable((client, site), avoid);
        let busy = || NoUpstream::AllBusy(matching.len(), asked());
        let Some(id) = &wanted.session else {
            // Rotation draws by index: no walk over the matches. `i` is
            // below `len`, which is not 0, so `get` finds it (and `all`,
            // holding every match, is not empty).
            let at = |i| matching.get(i).unwrap_or(&matching.all[0]);
            let load = |u: &Upstream| self.load_of(&u.key);
            let all = || self.usable_all((client, site), avoid, matching.iter());
            let i = two_choices(
                (matching.len(), at),
                |n| self.draw(n),
                load,
                (|u: &Upstream| usable(&u), all),
            )
            .ok_or_else(busy)?;
            return Ok(Chosen {
                upstream: at(i).clone(),
                moved: false,
            });
        };
        // A session's rendezvous ranks every match.
        let candidates = matching.list();
        let pinned = lock(&self.sessions).pinned(client, id, now).cloned();
        let kept = pinned.and_then(|p| candidates.iter().position(|c| c.key == p));
        let i = match kept.filter(|&i| usable(&candidates[i])) {
            Some(i) => i,
            None => {
                let h = super::choose::stable_hash(&[client, id]);
                let all =
                    |cs: &[&Upstream]| self.usable_all((client, site), avoid, cs.iter().copied());
                rendezvous(h, &candidates, |u| u.hash, &usable, all).ok_or_else(busy)?
            }
        };
        let ttl = wanted.ttl.unwrap_or(self.settings.session_ttl);
        let route = lock(&self.sessions).used(client, id, &candidates[i].key, ttl, now);
        if route.moved {
            self.metrics.session_moved();
        }
        Ok(Chosen {
            upstream: (*candidates[i]).clone(),
            moved: route.moved,
        })
    }

    /// Upstream connections open (tunnels and kept connections).
    pub fn upstream_connections(&self) -> usize {
        self.load.total()
    }

    fn load_of(&self, key: &ProxyKey) -> u32 {
        self.load.of(key)
    }

    /// Whether an upstream may take a new connection of `client` to
    /// `site` now: not `avoid`, not failing, below the per-upstream cap,
    /// and free of exclusive leases and cooldowns.
    fn usable<'a>(
        &'a self,
        (client, site): (&'a str, Option<&'a str>),
        avoid: Option<&'a ProxyKey>,
    ) -> impl Fn(&&Upstream) -> bool + 'a {
        let now = Instant::now();
        let suspects: Vec<ProxyKey> = lock(&self.suspects)
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(k, _)| k.clone())
            .collect();
        move |u: &&Upstream| {
            Some(&u.key) != avoid
                && !suspects.contains(&u.key)
                && self.load_of(&u.key) < self.settings.max_per_upstream
                && self.fleet.shared(client, &u.key, site)
        }
    }

    /// [`Gateway::usable`] of each of `upstreams`, in order, in one pass:
    /// the suspects, the loads and the lease store each looked at once.
    fn usable_all<'u>(
        &self,
        (client, site): (&str, Option<&str>),
        avoid: Option<&ProxyKey>,
        upstreams: impl Iterator<Item = &'u Upstream>,
    ) -> Vec<bool> {
        let now = Instant::now();
        let keys: Vec<&ProxyKey> = upstreams.map(|u| &u.key).collect();
        let shared = self.fleet.shared_all(client, &keys, site);
        let suspects = lock(&self.suspects);
        let load = self.load.held();
        let max = self.settings.max_per_upstream;
        keys.iter()
            .zip(shared)
            .map(|(k, shared)| {
                shared
                    && Some(*k) != avoid
                    && suspects.get(*k).is_none_or(|until| *until <= now)
                    && load.get(*k).copied().unwrap_or(0) < max
            })
            .collect()
    }

    /// The upstream a new connection of `client`'s session `id` to `site`
    /// would get here, asking `filter`, without remembering the session:
    /// the rendezvous winner among the usable matches.
    fn session_upstream(
        &self,
        (client, site): (&Arc<str>, Option<&str>),
        id: &str,
        filter: &Filter,
    ) -> Option<ProxyKey> {
        let matching = self.fleet.upstreams(filter);
        let candidates = matching.list();
        let h = super::choose::stable_hash(&[client, id]);
        let usable = self.usable((client, site), None);
        let all = |cs: &[&Upstream]| self.usable_all((client, site), None, cs.iter().copied());
        rendezvous(h, &candidates, |u| u.hash, &usable, all).map(|i| candidates[i].key.clone())
    }

    /// Whether a connection through `key` may go on serving `client`'s
    /// requests asking `filter`: still eligible and matching, usable by
    /// the gateway, and not failing.
    pub fn still_usable(
        &self,
        (client, site): (&Arc<str>, Option<&str>),
        filter: &Filter,
        key: &ProxyKey,
    ) -> bool {
        let now = Instant::now();
        let failing = lock(&self.suspects)
            .get(key)
            .is_some_and(|until| *until > now);
        !failing
            && self.fleet.shared(client, key, site)
            && self.fleet.upstreams(filter).iter().any(|u| u.key == *key)
    }

    /// The site of a target, as cooldowns key it: its host name.
    pub fn site_of(authority: Option<&http::uri::Authority>) -> Option<String> {
        authority.map(|a| a.host().trim_matches(['[', ']']).to_ascii_lowercase())
    }

    /// Forgets expired sessions.
    pub fn sweep(&self) -> usize {
        let mut sessions = lock(&self.sessions);
        let gone = sessions.sweep(Instant::now());
        self.metrics.set_sessions(sessions.len());
        gone
    }
}

/// How many upstreams may be suspected at once: `percent` of the
/// `eligible` ones, rounded down, and always at least one (so a fleet of
/// one can still pass over its failing upstream), as Envoy's outlier
/// detection bounds ejections with `max_ejection_percent`.
fn suspect_cap(eligible: usize, percent: u32) -> usize {
    (eligible.saturating_mul(percent as usize) / 100).max(1)
}

/// The draws a sampling decision is made from.
const PER_MILLION: usize = 1_000_000;

/// Whether a draw from `0..PER_MILLION` falls in the traced share.
fn sampled(draw: usize, per_million: u32) -> bool {
    draw < per_million as usize
}

/// The filters a username asked, as its reasons name them.
fn describe(w: &Wanted) -> String {
    let f = &w.filters;
    let parts: Vec<String> = [
        ("pool", &f.pool),
        ("provider", &f.provider),
        ("zone", &f.zone),
        ("region", &f.region),
        ("ns", &f.namespace),
        ("label", &f.label_selector),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v:?}")))
    .collect();
    if parts.is_empty() {
        "this username".to_string()
    } else {
        parts.join(", ")
    }
}

impl crate::discovery::GatewaySessions for Gateway {
    fn upstream_of(
        &self,
        client: &Arc<str>,
        id: &str,
        (username, site): (Option<&str>, Option<&str>),
    ) -> Result<Option<ProxyKey>, String> {
        let pinned = lock(&self.sessions)
            .pinned(client, id, Instant::now())
            .cloned();
        let (None, Some(user)) = (&pinned, username) else {
            return Ok(pinned);
        };
        let wanted = super::username::parse(user, client, self.settings.max_session_ttl)?;
        if wanted.session.as_deref() != Some(id) {
            return Err(format!("the username does not name session {id:?}"));
        }
        let filter = Filter::new(wanted.filters)?;
        Ok(self.session_upstream((client, site), id, &filter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspects_are_bounded_by_a_share_of_the_fleet_and_at_least_one() {
        let cases = [
            (0, 10, 1),
            (1, 10, 1),
            (3, 10, 1),
            (3, 34, 1),
            (3, 67, 2),
            (10, 10, 1),
            (20, 10, 2),
            (1000, 10, 100),
            (1000, 100, 1000),
            (1000, 0, 1),
        ];
        for (eligible, percent, want) in cases {
            assert_eq!(
                suspect_cap(eligible, percent),
                want,
                "{eligible} eligible at {percent}%"
            );
        }
    }

    #[test]
    fn the_traced_share_of_draws_is_the_ratio() {
        let top = PER_MILLION - 1;
        let cases = [
            (0, 0, false),
            (0, top, false),
            (1_000_000, 0, true),
            (1_000_000, top, true),
            (10_000, 9_999, true),
            (10_000, 10_000, false),
        ];
        for (per_million, draw, want) in cases {
            assert_eq!(
                sampled(draw, per_million),
                want,
                "{per_million} per million, draw {draw}"
            );
        }
        let traced = (0..PER_MILLION).filter(|&d| sampled(d, 10_000)).count();
        assert_eq!(traced, 10_000, "1% of the draws");
    }
}
