//! The named tokens the API accepts, replaceable while it serves (the
//! tokens Secret is watched): each request reads the set in force when it
//! arrives. Only SHA-256 digests are kept, so no token sits in memory
//! longer than it takes to hash it.

use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Client names and the SHA-256 of their tokens.
type Digests = Arc<Vec<(Arc<str>, [u8; 32])>>;

/// The tokens in force, and whether a token is required at all.
#[derive(Debug)]
pub struct TokenSet {
    /// Fixed at startup: an API that needs tokens keeps needing them, even
    /// while the set is empty (every request then gets 401: fail closed).
    required: bool,
    current: RwLock<Digests>,
}

impl TokenSet {
    /// `tokens` as (client name, token); `required` even when it is empty.
    pub fn new(tokens: &[(String, String)], required: bool) -> Self {
        TokenSet {
            required: required || tokens.iter().any(|(_, t)| !t.is_empty()),
            current: RwLock::new(digests(tokens)),
        }
    }

    /// Whether a request needs a token.
    pub fn required(&self) -> bool {
        self.required
    }

    /// Puts `tokens` in force for every request from now on; whether
    /// that changed anything (a watch's relist repeats the same set).
    pub fn replace(&self, tokens: &[(String, String)]) -> bool {
        let next = digests(tokens);
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        let changed = *current != next;
        *current = next;
        changed
    }

    /// The client names in force, in order.
    pub fn clients(&self) -> Vec<Arc<str>> {
        self.snapshot().iter().map(|(n, _)| n.clone()).collect()
    }

    /// The client whose token is `given`. Every token is compared, in
    /// constant time on digests, so the time taken does not tell which
    /// matched; an empty token matches nothing.
    pub fn client_of(&self, given: &str) -> Option<Arc<str>> {
        let got: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        let mut found = None;
        for (name, want) in self.snapshot().iter() {
            if bool::from(got.ct_eq(want)) {
                found = Some(name.clone());
            }
        }
        found.filter(|_| !given.is_empty())
    }

    fn snapshot(&self) -> Digests {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn digests(tokens: &[(String, String)]) -> Digests {
    Arc::new(
        tokens
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .map(|(n, t)| (Arc::from(n.as_str()), Sha256::digest(t.as_bytes()).into()))
            .collect(),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Owned (client, token) pairs.
    pub(crate) fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn a_replaced_set_answers_from_the_next_request_on() {
        let set = TokenSet::new(&pairs(&[("a", "ta"), ("b", "tb")]), false);
        assert!(set.required());
        assert_eq!(set.client_of("ta").as_deref(), Some("a"));
        assert!(set.replace(&pairs(&[("a", "ta2"), ("c", "tc")])));
        assert!(
            !set.replace(&pairs(&[("a", "ta2"), ("c", "tc")])),
            "the same set again"
        );
        assert_eq!(set.client_of("ta"), None, "the old value of a");
        assert_eq!(set.client_of("tb"), None, "b removed");
        assert_eq!(set.client_of("ta2").as_deref(), Some("a"));
        assert_eq!(set.client_of("tc").as_deref(), Some("c"));
        assert_eq!(set.client_of(""), None);
        assert_eq!(set.clients(), vec![Arc::from("a"), Arc::from("c")]);
    }

    #[test]
    fn a_required_set_stays_required_when_emptied() {
        let open = TokenSet::new(&[], false);
        assert!(!open.required());
        let closed = TokenSet::new(&[], true);
        assert!(closed.required());
        assert_eq!(closed.client_of("anything"), None);
    }
}
