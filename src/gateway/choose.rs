//! Which upstream a new connection goes to (pure). A session goes to the
//! proxy of highest rendezvous weight for `(session, proxy)`: every
//! gateway replica computes the same answer from the same eligible set,
//! with no shared state, and a proxy that leaves moves only the sessions
//! it held. Without a session, the less loaded of two random choices.

/// A stable 64-bit hash (FNV-1a, then a finalizer): the same on every
/// replica, build and platform, unlike the standard library's hasher.
pub fn stable_hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

/// SplitMix64's finalizer: spreads every input bit over the output.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An upstream's stable hash, from its namespace and name.
pub fn upstream_hash(key: &crate::lease::ProxyKey) -> u64 {
    stable_hash(&[&key.namespace, &key.name])
}

/// The weight of a proxy (its stable hash) for a session (its hash).
pub fn weight(session: u64, proxy: u64) -> u64 {
    mix(session ^ mix(proxy))
}

/// The session's proxy: of the `candidates` (by stable hash) that may
/// take it, the one of highest weight. The winner is asked first, alone
/// (`one`: most often it is usable, and that costs one look); when it is
/// not, every candidate is asked at once (`all`, one pass under one lock)
/// and the best usable one taken: O(candidates) either way.
pub fn rendezvous<T>(
    session: u64,
    candidates: &[T],
    hash: impl Fn(&T) -> u64,
    one: impl FnOnce(&T) -> bool,
    all: impl FnOnce(&[T]) -> Vec<bool>,
) -> Option<usize> {
    let rank = |i: &usize| {
        (
            weight(session, hash(&candidates[*i])),
            std::cmp::Reverse(*i),
        )
    };
    let best = (0..candidates.len()).max_by_key(rank)?;
    if one(&candidates[best]) {
        return Some(best);
    }
    let usable = all(candidates);
    (0..candidates.len())
        .filter(|&i| i != best && usable.get(i).copied().unwrap_or(false))
        .max_by_key(rank)
}

/// A new rotating connection's proxy: of two candidates drawn at random
/// (`draw(n)` gives an index below `n`), the one `load` says is less
/// loaded; candidates `one` refuses are drawn again, a few times; when
/// none of those draws is usable, every candidate is asked at once
/// (`all`, by index, one pass) and the first usable from a random start
/// taken, so a usable one is never missed and a full fleet costs
/// O(candidates), not a look per candidate.
///
/// The `n` candidates are reached by index (`at`), so a draw costs no walk
/// over a large fleet.
pub fn two_choices<'a, T: 'a>(
    (n, at): (usize, impl Fn(usize) -> &'a T),
    mut draw: impl FnMut(usize) -> usize,
    load: impl Fn(&T) -> u32,
    (mut one, all): (impl FnMut(&T) -> bool, impl FnOnce() -> Vec<bool>),
) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let mut pick = |draw: &mut dyn FnMut(usize) -> usize| {
        (0..DRAWS).map(|_| draw(n) % n).find(|&i| one(at(i)))
    };
    let first = pick(&mut draw);
    let second = pick(&mut draw);
    match (first, second) {
        (Some(a), Some(b)) => Some(if load(at(b)) < load(at(a)) { b } else { a }),
        (Some(a), None) | (None, Some(a)) => Some(a),
        (None, None) => {
            let usable = all();
            let start = draw(n) % n;
            (0..n)
                .map(|k| (start + k) % n)
                .find(|&i| usable.get(i).copied().unwrap_or(false))
        }
    }
}

/// Random draws for each of the two choices before every candidate is
/// asked at once.
const DRAWS: usize = 4;

#[cfg(test)]
#[path = "choose_tests.rs"]
mod tests;
