//! Which shared keys sign and which are still taken, through a rotation
//! (docs/operations.md, "Rotating the lease key"). The key Secret holds
//! `key`, and during a rotation `next` and `rotate-at` (unix seconds):
//!
//! - before `rotate-at`, `key` signs and both are taken: every replica
//!   learns `next` (each reads the Secret every [`RELOAD_EVERY`]) before
//!   any signs with it;
//! - from `rotate-at` for the grace (the longest lease TTL), `next` signs
//!   and both are taken: an id signed with `key` just before `rotate-at`
//!   lives on until it expires;
//! - after the grace, only `next` is taken, and a manager folds the Secret
//!   to `key` = `next`, ready for the next rotation.

use std::time::Duration;

use ring::hmac;

/// How often a process reads the key Secret again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Names a key in logs without telling anything of it: the first four
/// bytes of an HMAC of a fixed text under the key, in hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; 4]);

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&data_encoding::HEXLOWER.encode(&self.0))
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// One key and its id.
#[derive(Clone)]
pub(super) struct Entry {
    pub(super) id: KeyId,
    pub(super) key: hmac::Key,
}

impl Entry {
    pub(super) fn new(bytes: &[u8]) -> Self {
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let tag = hmac::sign(&key, b"egress-proxies-operator key id");
        let mut id = [0; 4];
        id.copy_from_slice(&tag.as_ref()[..4]);
        Entry { id: KeyId(id), key }
    }
}

/// The keys in use at one moment: `signing` signs and is taken; each of
/// `also` is taken too.
#[derive(Clone)]
pub(super) struct Ring {
    pub(super) signing: Entry,
    pub(super) also: Vec<Entry>,
}

impl Ring {
    pub(super) fn one(entry: Entry) -> Self {
        Ring {
            signing: entry,
            also: Vec::new(),
        }
    }

    /// Every key taken, the signing one first.
    pub(super) fn taken(&self) -> impl Iterator<Item = &Entry> {
        std::iter::once(&self.signing).chain(&self.also)
    }
}

/// Where a rotation stands at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No rotation: `key` alone.
    Settled,
    /// Before `rotate-at`: `key` signs, `next` is taken too.
    Announced,
    /// From `rotate-at` for the grace: `next` signs, `key` is taken too.
    Grace,
    /// Past the grace: `next` alone; the Secret may be folded.
    Done,
}

/// The phase of a rotation at `rotate_at` (unix seconds) at `now` (unix
/// seconds), with `grace`.
pub fn phase(rotate_at: Option<i64>, now: i64, grace: Duration) -> Phase {
    let Some(at) = rotate_at else {
        return Phase::Settled;
    };
    let grace = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
    if now < at {
        Phase::Announced
    } else if now < at.saturating_add(grace) {
        Phase::Grace
    } else {
        Phase::Done
    }
}

/// The ring of `key` and `next` in `phase`.
pub(super) fn ring_of(key: Entry, next: Option<Entry>, phase: Phase) -> Ring {
    match (next, phase) {
        (None, _) | (Some(_), Phase::Settled) => Ring::one(key),
        (Some(next), Phase::Announced) => Ring {
            signing: key,
            also: vec![next],
        },
        (Some(next), Phase::Grace) => Ring {
            signing: next,
            also: vec![key],
        },
        (Some(next), Phase::Done) => Ring::one(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotation_announces_then_signs_with_the_next_key_and_ends_after_the_grace() {
        let grace = Duration::from_secs(3600);
        let cases = [
            (None, 0, Phase::Settled),
            (Some(100), 99, Phase::Announced),
            (Some(100), 100, Phase::Grace),
            (Some(100), 3699, Phase::Grace),
            (Some(100), 3700, Phase::Done),
            (Some(i64::MAX), 0, Phase::Announced),
            (Some(i64::MAX - 10), i64::MAX - 5, Phase::Grace),
        ];
        for (at, now, want) in cases {
            assert_eq!(phase(at, now, grace), want, "{at:?} {now}");
        }
    }

    #[test]
    fn each_phase_signs_with_one_key_and_takes_what_may_still_be_presented() {
        let (k, n) = (Entry::new(&[1; 32]), Entry::new(&[2; 32]));
        let ids = |r: &Ring| {
            (
                r.signing.id,
                r.also.iter().map(|e| e.id).collect::<Vec<_>>(),
            )
        };
        let cases = [
            (None, Phase::Grace, (k.id, vec![])),
            (Some(n.clone()), Phase::Settled, (k.id, vec![])),
            (Some(n.clone()), Phase::Announced, (k.id, vec![n.id])),
            (Some(n.clone()), Phase::Grace, (n.id, vec![k.id])),
            (Some(n.clone()), Phase::Done, (n.id, vec![])),
        ];
        for (next, phase, want) in cases {
            assert_eq!(ids(&ring_of(k.clone(), next, phase)), want, "{phase:?}");
        }
    }

    #[test]
    fn an_id_names_its_key_and_tells_nothing_of_it() {
        let (a, b) = (Entry::new(&[1; 32]), Entry::new(&[2; 32]));
        assert_ne!(a.id, b.id);
        assert_eq!(a.id, Entry::new(&[1; 32]).id);
        assert_eq!(a.id.to_string().len(), 8);
    }
}
