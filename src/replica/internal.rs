//! Trust between replicas (docs/architecture.md, "Replicas trust only each
//! other"): everything one replica acts on from another is sealed with the
//! shared lease key. The leader seals the discovery URL it publishes on
//! its election Lease, so a follower forwards only to a URL a replica of
//! this installation published; a follower signs every forwarded call
//! (method, path, client, time, request key, deadline, body) instead of
//! passing the crawler's token on, so the token never leaves the replica
//! that received it and a captured signature is good for that one request
//! for a minute at most. Pure: time is an argument.

use sha2::{Digest as _, Sha256};

use crate::lease::signed::{seal, sealed};
use crate::lease::LeaseKey;

/// The signed forward: `v1.<unix ms>.<seal>`. Its presence marks a
/// forwarded call (a replica that does not lead answers 503 rather than
/// forward it again).
pub const FORWARD_HEADER: &str = "x-egress-forward";
/// The client the follower authenticated (the name of its token).
pub const CLIENT_HEADER: &str = "x-egress-client";
/// The follower's request key: a retry of one forwarded acquire carries
/// the same key and gets the same lease.
pub const REQUEST_KEY_HEADER: &str = "x-egress-request-key";
/// Milliseconds the leader has to answer, from when it reads the call: a
/// grant later than that is not made (the follower has given up by then).
pub const DEADLINE_HEADER: &str = "x-egress-deadline-ms";
/// The seal of the discovery URL on the election Lease.
pub const URL_SEAL_ANNOTATION: &str = "crawl.example.com/discovery-url-seal";
/// The same URL's seal with the gateway key, which gateway processes check
/// (they do not hold the lease key).
pub const GATEWAY_URL_SEAL_ANNOTATION: &str = "crawl.example.com/discovery-url-gateway-seal";

/// How far a forward's time may be from the leader's clock.
pub const MAX_SKEW_MS: i64 = 60_000;

const URL_PURPOSE: &str = "discovery-url";
const FORWARD_PURPOSE: &str = "forward";
const ANSWER_PURPOSE: &str = "replica-answer";

/// The leader's seal on its answer to a signed call: over the call's own
/// signature (its [`FORWARD_HEADER`] value), the status and the body, with
/// the key the call was signed with. A follower takes an answer only with
/// it, so neither a party on the path nor one that learned the leader's
/// URL can hand it a table (or an old answer to another call) of its own.
pub const ANSWER_HEADER: &str = "x-egress-answer-seal";

fn answer_digest(ask: &str, status: u16, body: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(ask.as_bytes());
    h.update([0]);
    h.update(status.to_be_bytes());
    h.update(body);
    h.finalize().into()
}

/// The seal of an answer with `status` and `body` to the call signed `ask`.
pub fn seal_answer(key: &LeaseKey, ask: &str, status: u16, body: &[u8]) -> String {
    let digest = answer_digest(ask, status, body);
    data_encoding::BASE64URL_NOPAD.encode(&seal(key, ANSWER_PURPOSE, &digest))
}

/// The text of header `name` in `headers`; empty when absent or not text.
pub fn header_text<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// Whether an answer (`status`, `headers`, `body`) to the call signed
/// `ask` carries the leader's [`ANSWER_HEADER`] for it under `key`.
pub fn answer_checks(
    key: &LeaseKey,
    ask: &str,
    (status, headers, body): (u16, &axum::http::HeaderMap, &[u8]),
) -> bool {
    answer_sealed(
        key,
        ask,
        (status, body),
        header_text(headers, ANSWER_HEADER),
    )
}

/// Whether `published` seals that answer under `key`.
pub fn answer_sealed(
    key: &LeaseKey,
    ask: &str,
    (status, body): (u16, &[u8]),
    published: &str,
) -> bool {
    let digest = answer_digest(ask, status, body);
    data_encoding::BASE64URL_NOPAD
        .decode(published.as_bytes())
        .is_ok_and(|tag| sealed(key, ANSWER_PURPOSE, &digest, &tag))
}

/// The seal of `url` for one term of the election Lease: its holder and
/// its `leaseTransitions`, as published. Bound to the term, a seal copied
/// onto the Lease in another term (a replayed one) does not check.
pub fn seal_url(key: &LeaseKey, url: &str, (holder, transitions): (&str, i32)) -> String {
    let sealed = url_message(url, holder, transitions);
    data_encoding::BASE64URL_NOPAD.encode(&seal(key, URL_PURPOSE, &sealed))
}

/// Whether `published` is `url`'s seal under `key` for the term of
/// `holder` and `transitions`.
pub fn url_sealed(
    key: &LeaseKey,
    url: &str,
    (holder, transitions): (&str, i32),
    published: &str,
) -> bool {
    let message = url_message(url, holder, transitions);
    data_encoding::BASE64URL_NOPAD
        .decode(published.as_bytes())
        .is_ok_and(|tag| sealed(key, URL_PURPOSE, &message, &tag))
}

/// What a URL seal covers: lengths first, so no two terms share a message.
fn url_message(url: &str, holder: &str, transitions: i32) -> Vec<u8> {
    format!("{}:{holder}\n{transitions}\n{url}", holder.len()).into_bytes()
}

/// What a forward's signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Forward<'a> {
    /// HTTP method.
    pub method: &'a str,
    /// Path and query.
    pub path: &'a str,
    /// The client the follower authenticated.
    pub client: &'a str,
    /// The request key ("" when none).
    pub request_key: &'a str,
    /// The deadline header's value ("" when none).
    pub deadline_ms: &'a str,
    /// The body.
    pub body: &'a [u8],
}

impl Forward<'_> {
    fn message(&self, at_ms: i64) -> Vec<u8> {
        let mut m = Vec::with_capacity(160);
        for part in [
            self.method,
            self.path,
            self.client,
            self.request_key,
            self.deadline_ms,
        ] {
            m.extend_from_slice(part.as_bytes());
            m.push(b'\n');
        }
        m.extend_from_slice(at_ms.to_string().as_bytes());
        m.push(b'\n');
        m.extend_from_slice(&Sha256::digest(self.body));
        m
    }
}

/// The [`FORWARD_HEADER`] value of `f` sent at `now_ms`.
pub fn sign_forward(key: &LeaseKey, f: &Forward<'_>, now_ms: i64) -> String {
    let tag = seal(key, FORWARD_PURPOSE, &f.message(now_ms));
    format!(
        "v1.{now_ms}.{}",
        data_encoding::BASE64URL_NOPAD.encode(&tag)
    )
}

/// Why a forwarded call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForwardRefused {
    /// Not `v1.<ms>.<seal>`.
    #[error("malformed forward signature")]
    Malformed,
    /// Signed too long ago or too far ahead: a replay, or clocks apart.
    #[error("forward signed {0} ms away from this replica's clock")]
    Stale(i64),
    /// Not signed with this installation's lease key, or altered.
    #[error("forward signature does not match")]
    Seal,
    /// This replica has no shared key to check with.
    #[error("this replica checks no forwards (it has no shared lease key)")]
    NoKey,
}

/// Checks `header` for `f` at `now_ms`.
pub fn verify_forward(
    key: Option<&LeaseKey>,
    header: &str,
    f: &Forward<'_>,
    now_ms: i64,
) -> Result<(), ForwardRefused> {
    let key = key.ok_or(ForwardRefused::NoKey)?;
    let rest = header
        .strip_prefix("v1.")
        .ok_or(ForwardRefused::Malformed)?;
    let (at, tag) = rest.split_once('.').ok_or(ForwardRefused::Malformed)?;
    let at: i64 = at.parse().map_err(|_| ForwardRefused::Malformed)?;
    let tag = data_encoding::BASE64URL_NOPAD
        .decode(tag.as_bytes())
        .map_err(|_| ForwardRefused::Malformed)?;
    let skew = now_ms.saturating_sub(at);
    if skew.abs() > MAX_SKEW_MS {
        return Err(ForwardRefused::Stale(skew));
    }
    if !sealed(key, FORWARD_PURPOSE, &f.message(at), &tag) {
        return Err(ForwardRefused::Seal);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_taken_only_as_sealed_for_its_own_call() {
        let key = LeaseKey::from_bytes(&[1; crate::lease::signed::KEY_LEN]).unwrap();
        let other = LeaseKey::from_bytes(&[2; crate::lease::signed::KEY_LEN]).unwrap();
        let (ask, body) = ("v1.1000.abc", br#"{"version":3}"#.as_slice());
        let seal = seal_answer(&key, ask, 200, body);
        assert!(answer_sealed(&key, ask, (200, body), &seal));
        for (name, ok) in [
            (
                "another body",
                answer_sealed(&key, ask, (200, br#"{"version":4}"#), &seal),
            ),
            (
                "another status",
                answer_sealed(&key, ask, (304, body), &seal),
            ),
            (
                "another call's",
                answer_sealed(&key, "v1.1001.abc", (200, body), &seal),
            ),
            (
                "another key",
                answer_sealed(&other, ask, (200, body), &seal),
            ),
            ("no seal", answer_sealed(&key, ask, (200, body), "")),
            ("garbage", answer_sealed(&key, ask, (200, body), "!!")),
        ] {
            assert!(!ok, "{name}");
        }
    }
    use crate::lease::signed::KEY_LEN;

    fn key(b: u8) -> LeaseKey {
        LeaseKey::from_bytes(&[b; KEY_LEN]).unwrap()
    }

    const F: Forward<'static> = Forward {
        method: "POST",
        path: "/v1/leases",
        client: "team-a",
        request_key: "rk-1",
        deadline_ms: "1500",
        body: br#"{"ttlSeconds":60}"#,
    };

    #[test]
    fn a_forward_checks_only_as_signed_under_the_shared_key_and_fresh() {
        let now = 1_800_000_000_000;
        let h = sign_forward(&key(1), &F, now);
        assert_eq!(verify_forward(Some(&key(1)), &h, &F, now + 500), Ok(()));
        let cases = [
            (
                "another installation's key",
                Some(key(2)),
                h.clone(),
                F,
                now,
                ForwardRefused::Seal,
            ),
            (
                "no shared key here",
                None,
                h.clone(),
                F,
                now,
                ForwardRefused::NoKey,
            ),
            (
                "another client",
                Some(key(1)),
                h.clone(),
                Forward {
                    client: "team-b",
                    ..F
                },
                now,
                ForwardRefused::Seal,
            ),
            (
                "another path",
                Some(key(1)),
                h.clone(),
                Forward {
                    path: "/v1/leases/x",
                    ..F
                },
                now,
                ForwardRefused::Seal,
            ),
            (
                "another body",
                Some(key(1)),
                h.clone(),
                Forward { body: b"{}", ..F },
                now,
                ForwardRefused::Seal,
            ),
            (
                "another request key",
                Some(key(1)),
                h.clone(),
                Forward {
                    request_key: "rk-2",
                    ..F
                },
                now,
                ForwardRefused::Seal,
            ),
            (
                "a longer deadline",
                Some(key(1)),
                h.clone(),
                Forward {
                    deadline_ms: "9000",
                    ..F
                },
                now,
                ForwardRefused::Seal,
            ),
            (
                "replayed two minutes on",
                Some(key(1)),
                h.clone(),
                F,
                now + 120_000,
                ForwardRefused::Stale(120_000),
            ),
            (
                "the crawler's bearer token instead",
                Some(key(1)),
                "Bearer s3cret".into(),
                F,
                now,
                ForwardRefused::Malformed,
            ),
            (
                "no seal",
                Some(key(1)),
                format!("v1.{now}."),
                F,
                now,
                ForwardRefused::Seal,
            ),
        ];
        for (name, k, header, f, at, want) in cases {
            assert_eq!(
                verify_forward(k.as_ref(), &header, &f, at),
                Err(want),
                "{name}"
            );
        }
    }

    #[test]
    fn a_url_is_trusted_only_with_its_seal_for_its_term() {
        let url = "http://10.0.0.7:8090";
        let term = ("a_1", 4);
        let s = seal_url(&key(1), url, term);
        assert!(url_sealed(&key(1), url, term, &s));
        let refused = [
            (key(2), url, term, s.as_str(), "another installation"),
            (key(1), "http://10.6.6.6:8090", term, &s, "another URL"),
            (key(1), url, ("b_2", 4), &s, "another holder"),
            (
                key(1),
                url,
                ("a_1", 5),
                &s,
                "a later term of the same holder",
            ),
            (key(1), url, ("a_", 14), &s, "the same bytes cut elsewhere"),
            (key(1), url, term, "", "none"),
            (key(1), url, term, "!!", "malformed"),
        ];
        for (k, u, t, seal, why) in refused {
            assert!(!url_sealed(&k, u, t, seal), "{why}");
        }
    }
}
