//! In-sync followers (docs/architecture.md, "In-sync followers"): the
//! leader answers a grant or a renewal only once every follower it has
//! published as in sync holds a copy of its table that includes it, so a
//! follower it named can take over after a crash and grant at once: no
//! lease a crawler was told of is missing from its copy.
//!
//! A follower's long poll of the leader's table (`feed.rs`) names the copy
//! it holds; that is its confirmation. A follower joins the set once it
//! has confirmed a copy at least as new as the table when it was first
//! waited for; one that does not confirm within [`CONFIRM_WAIT`], or stops
//! asking, is dropped, and grants go on without it only once the Lease no
//! longer names it. The set is published on the election Lease, sealed
//! with the shared lease key, with the feed (this leader's term) it holds
//! for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::lease::signed::{seal, sealed};
use crate::lease::{LeaseKey, LeaseStore};

/// The in-sync followers on the election Lease: `<feed> <id>,<id>…`.
pub const SYNCED_ANNOTATION: &str = "crawl.example.com/lease-synced-replicas";
/// Its seal under the shared lease key.
pub const SYNCED_SEAL_ANNOTATION: &str = "crawl.example.com/lease-synced-replicas-seal";

/// How long a grant waits for a follower's confirmation before the
/// follower is dropped from the set.
pub const CONFIRM_WAIT: Duration = Duration::from_millis(500);

/// A follower that has asked nothing for this long is dropped at the
/// leader's next write (a long poll of the table asks at least every second).
pub const STALE: Duration = Duration::from_secs(3);

/// How long a dropped follower is not waited for again, however it asks:
/// one that could not keep up must not stall grants again at once.
pub const REJOIN_AFTER: Duration = Duration::from_secs(10);

/// How long a direct grant or renewal may wait for confirmations in all
/// (a forwarded one has the forward's deadline).
pub const CONFIRM_LIMIT: Duration = Duration::from_secs(2);

const PURPOSE: &str = "lease-synced-replicas";

/// What a follower last asked.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The version of this feed its copy holds; `None`: none of this feed.
    holds: Option<u64>,
    at: Instant,
}

/// A follower grants wait for.
#[derive(Debug, Clone, Copy)]
struct Member {
    /// The table's version when it was first waited for: it is in sync
    /// once it holds that.
    since: u64,
    /// To be left out of the next write, then no longer waited for.
    dropping: bool,
}

/// The followers of one feed, and which of them grants wait for. Pure:
/// times and versions are arguments.
#[derive(Debug, Default)]
pub struct Members {
    feed: String,
    seen: BTreeMap<String, Seen>,
    required: BTreeMap<String, Member>,
    /// What the Lease names now.
    named: BTreeSet<String>,
    /// Followers no longer waited for, and since when.
    dropped: BTreeMap<String, Instant>,
}

impl Members {
    /// No follower yet, for `feed`.
    pub fn new(feed: &str) -> Self {
        Members {
            feed: feed.to_string(),
            ..Default::default()
        }
    }

    /// Follower `who` asked at `now`, holding version `holds` of this
    /// feed (`None`: another feed's copy, or none).
    pub fn saw(&mut self, who: &str, holds: Option<u64>, now: Instant) {
        self.seen.insert(who.to_string(), Seen { holds, at: now });
    }

    /// The followers grants wait for that do not hold version `v` yet.
    pub fn lagging(&self, v: u64) -> Vec<String> {
        self.required
            .keys()
            .filter(|who| {
                self.seen
                    .get(*who)
                    .and_then(|s| s.holds)
                    .is_none_or(|h| h < v)
            })
            .cloned()
            .collect()
    }

    /// Marks `who` to be left out of the next write; how many were not
    /// marked before.
    pub fn drop_members(&mut self, who: &[String]) -> usize {
        let mut n = 0;
        for w in who {
            if let Some(m) = self.required.get_mut(w) {
                n += usize::from(!m.dropping);
                m.dropping = true;
            }
        }
        n
    }

    /// Before a write of the Lease at `now`, the table at `version`:
    /// followers asking with a copy of this feed start being waited for;
    /// those silent for [`STALE`] are dropped; returns the followers to
    /// name as in sync.
    pub fn plan(&mut self, version: u64, now: Instant) -> BTreeSet<String> {
        // Forget followers long gone (bounded memory across restarts).
        let required = &self.required;
        self.seen
            .retain(|who, s| required.contains_key(who) || now - s.at < STALE * 10);
        self.dropped.retain(|_, at| now - *at < REJOIN_AFTER);
        for (who, s) in &self.seen {
            if s.holds.is_some() && now - s.at < STALE && !self.dropped.contains_key(who) {
                self.required.entry(who.clone()).or_insert(Member {
                    since: version,
                    dropping: false,
                });
            }
        }
        let mut named = BTreeSet::new();
        for (who, m) in &mut self.required {
            let seen = self.seen.get(who);
            if seen.is_none_or(|s| now - s.at >= STALE) {
                m.dropping = true;
            }
            let holds = seen.and_then(|s| s.holds);
            if !m.dropping && holds.is_some_and(|h| h >= m.since) {
                named.insert(who.clone());
            }
        }
        named
    }

    /// `named` is on the Lease now: followers being dropped that it does
    /// not name are no longer waited for. Returns those that joined the
    /// set and those no longer waited for.
    pub fn written(&mut self, named: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
        let joined = named.difference(&self.named).cloned().collect();
        self.named = named.clone();
        let gone: Vec<String> = self
            .required
            .iter()
            .filter(|(who, m)| m.dropping && !named.contains(*who))
            .map(|(who, _)| who.clone())
            .collect();
        for who in &gone {
            self.required.remove(who);
            self.dropped.insert(who.clone(), Instant::now());
        }
        (joined, gone)
    }
}

/// The annotations naming `named` as in sync with `feed`.
pub fn annotations(
    key: &LeaseKey,
    feed: &str,
    named: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let ids: Vec<&str> = named.iter().map(String::as_str).collect();
    let value = format!("{feed} {}", ids.join(","));
    let tag = data_encoding::BASE64URL_NOPAD.encode(&seal(key, PURPOSE, value.as_bytes()));
    BTreeMap::from([
        (SYNCED_ANNOTATION.to_string(), value),
        (SYNCED_SEAL_ANNOTATION.to_string(), tag),
    ])
}

/// Whether a follower `me` whose copy came from feed `copied` holds every
/// lease the leader that wrote `read` confirmed: that leader sealed a set
/// naming it, for that feed.
pub fn in_sync(
    read: &BTreeMap<String, String>,
    key: &LeaseKey,
    me: &str,
    copied: Option<&str>,
) -> bool {
    let (Some(value), Some(tag), Some(copied)) = (
        read.get(SYNCED_ANNOTATION),
        read.get(SYNCED_SEAL_ANNOTATION),
        copied,
    ) else {
        return false;
    };
    let genuine = data_encoding::BASE64URL_NOPAD
        .decode(tag.as_bytes())
        .is_ok_and(|t| sealed(key, PURPOSE, value.as_bytes(), &t));
    let Some((feed, ids)) = value.split_once(' ') else {
        return false;
    };
    genuine && feed == copied && ids.split(',').any(|id| id == me)
}

/// The leader's side, shared by the feed, the lease handlers and the
/// election's publisher.
pub struct Replicas {
    store: Arc<LeaseStore>,
    /// This replica's election identity.
    me: String,
    /// Tells a feed of this process from another's with the same term.
    nonce: String,
    /// The term they follow, and them.
    members: Mutex<(Option<u64>, Members)>,
    /// Bumped when a follower asks or the set shrinks: waiting grants look again.
    asked: watch::Sender<u64>,
    /// Asks the election for a write now (a follower to drop).
    write_now: Arc<Notify>,
    /// How old this replica's copy of the leader's table is.
    copy: super::copy_age::CopyAge,
}

impl Replicas {
    /// The replicas of `store`'s table, this one being `me`.
    pub fn new(store: Arc<LeaseStore>, me: &str) -> Self {
        Replicas {
            store,
            me: me.to_string(),
            nonce: crate::lease::random_id().chars().take(12).collect(),
            members: Mutex::new((None, Members::default())),
            asked: watch::Sender::new(0),
            write_now: Arc::new(Notify::new()),
            copy: Default::default(),
        }
    }

    /// How old this replica's copy of the leader's table is.
    pub fn copy(&self) -> &super::copy_age::CopyAge {
        &self.copy
    }

    /// This replica's election identity.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The feed this replica serves: its process and term.
    pub fn feed(&self) -> String {
        format!("{}.{}", self.nonce, self.store.term())
    }

    /// Woken when a follower must be dropped: the election writes then
    /// instead of at its next retry.
    pub fn write_now(&self) -> Arc<Notify> {
        self.write_now.clone()
    }

    /// `f` on the followers of the current term, under their lock.
    /// Compared by term number, so a grant's wait formats nothing.
    fn with_members<R>(&self, f: impl FnOnce(&mut Members) -> R) -> R {
        let term = self.store.term();
        // Plain values: a panic elsewhere cannot leave them half-written.
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if m.0 != Some(term) {
            // A new term: nobody holds its copy yet.
            *m = (Some(term), Members::new(&self.feed()));
        }
        f(&mut m.1)
    }

    /// Follower `who` asks, holding version `holds` of `feed`.
    pub fn saw(&self, who: &str, feed: Option<&str>, holds: Option<u64>) {
        self.with_members(|m| {
            let ours = feed == Some(m.feed.as_str());
            m.saw(who, holds.filter(|_| ours), Instant::now());
        });
        self.asked.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Waits until every follower grants wait for holds version `v`,
    /// until `deadline`; whether they do. A follower that has not after
    /// [`CONFIRM_WAIT`] is dropped (through a write of the Lease).
    pub async fn confirmed(&self, v: u64, deadline: Instant) -> bool {
        let drop_at = Instant::now() + CONFIRM_WAIT;
        let mut asked = self.asked.subscribe();
        loop {
            asked.borrow_and_update();
            let lagging = self.with_members(|m| m.lagging(v));
            if lagging.is_empty() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if now >= drop_at && self.with_members(|m| m.drop_members(&lagging)) > 0 {
                warn!(replicas = %lagging.join(","), waited = ?CONFIRM_WAIT, "Followers did not confirm the lease table in time; dropping them from the in-sync set");
                self.write_now.notify_one();
            }
            let wake = if now >= drop_at {
                deadline
            } else {
                drop_at.min(deadline)
            };
            let _ = tokio::time::timeout_at(wake, asked.changed()).await;
        }
    }

    /// The annotations of a write now; the set it names goes to
    /// [`Self::written`] once the write succeeds. A take-over write names
    /// nobody: no follower holds the new term's copy yet.
    pub fn publish(
        &self,
        key: &LeaseKey,
        taking_over: bool,
    ) -> (BTreeMap<String, String>, BTreeSet<String>) {
        self.with_members(|m| {
            let named = if taking_over {
                BTreeSet::new()
            } else {
                // Read under the members' lock: a grant made after this
                // waits for the followers it adds.
                m.plan(self.store.version(), Instant::now())
            };
            (annotations(key, &m.feed, &named), named)
        })
    }

    /// `named` is on the Lease.
    pub fn written(&self, named: &BTreeSet<String>) {
        let (joined, gone) = self.with_members(|m| m.written(named));
        if !joined.is_empty() {
            info!(replicas = %joined.join(","), "Followers are in sync: each holds every lease confirmed, and can take over at once");
        }
        if !gone.is_empty() {
            info!(replicas = %gone.join(","), "Followers are out of the in-sync set; grants no longer wait for them");
            self.asked.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
#[path = "members_tests.rs"]
mod tests;
