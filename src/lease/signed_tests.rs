use chrono::TimeZone;

use super::*;
use crate::lease::keyring::Phase;

fn key(b: u8) -> LeaseKey {
    LeaseKey::from_bytes(&[b; KEY_LEN]).unwrap()
}

fn claims() -> Claims {
    Claims {
        proxy: ProxyKey {
            namespace: "crawl".into(),
            name: "p-1".into(),
        },
        client: "team-a".into(),
        expires_ms: Utc
            .with_ymd_and_hms(2025, 1, 1, 0, 5, 0)
            .unwrap()
            .timestamp_millis(),
        nonce: [7; NONCE_LEN],
    }
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap()
}

/// Flips one bit of the decoded id at `at` (from the end when negative)
/// and encodes it again.
fn flip(id: &str, at: isize) -> String {
    let mut raw = data_encoding::BASE64URL_NOPAD
        .decode(id.strip_prefix(VERSION).unwrap().as_bytes())
        .unwrap();
    let i = if at < 0 {
        raw.len() - at.unsigned_abs()
    } else {
        at.unsigned_abs()
    };
    raw[i] ^= 1;
    format!("{VERSION}{}", data_encoding::BASE64URL_NOPAD.encode(&raw))
}

#[test]
fn encode_then_verify() {
    let id = encode(&key(1), &claims());
    struct Case {
        name: &'static str,
        id: String,
        key: LeaseKey,
        now: DateTime<Utc>,
        want: Result<Claims, IdError>,
    }
    let cases = [
        Case {
            name: "round trip",
            id: id.clone(),
            key: key(1),
            now: now(),
            want: Ok(claims()),
        },
        Case {
            name: "expiry in the payload altered",
            id: flip(&id, 7),
            key: key(1),
            now: now(),
            want: Err(IdError::Tag),
        },
        Case {
            name: "client name altered",
            id: flip(&id, -(TAG_LEN as isize) - 1),
            key: key(1),
            now: now(),
            want: Err(IdError::Tag),
        },
        Case {
            name: "tag altered",
            id: flip(&id, -1),
            key: key(1),
            now: now(),
            want: Err(IdError::Tag),
        },
        Case {
            name: "signed with another key",
            id: id.clone(),
            key: key(2),
            now: now(),
            want: Err(IdError::Tag),
        },
        Case {
            name: "expired",
            id: id.clone(),
            key: key(1),
            now: claims().expires_at(),
            want: Err(IdError::Expired),
        },
        Case {
            name: "wrong version",
            id: id.replacen("v1.", "v2.", 1),
            key: key(1),
            now: now(),
            want: Err(IdError::Version),
        },
        Case {
            name: "an unsigned id of an older operator",
            id: "l-abcdefghijklmnopqrstuvwxyz".into(),
            key: key(1),
            now: now(),
            want: Err(IdError::Version),
        },
        Case {
            name: "not base64url",
            id: "v1.***".into(),
            key: key(1),
            now: now(),
            want: Err(IdError::Malformed),
        },
        Case {
            name: "shorter than a tag",
            id: "v1.AAAA".into(),
            key: key(1),
            now: now(),
            want: Err(IdError::Malformed),
        },
    ];
    for c in cases {
        assert_eq!(verify(&c.key, &c.id, c.now), c.want, "{}", c.name);
    }
}

#[test]
fn ids_are_url_safe_and_differ_by_nonce() {
    let a = encode(&key(1), &claims());
    let mut other = claims();
    other.nonce = random_bytes();
    let b = encode(&key(1), &other);
    assert_ne!(a, b);
    for id in [&a, &b] {
        assert!(
            id.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c)),
            "{id}"
        );
    }
    assert_ne!(claims().slot(), other.slot());
}

#[test]
fn short_keys_are_refused() {
    assert_eq!(LeaseKey::from_bytes(&[0; 16]).unwrap_err(), KeyTooShort(16));
    assert!(LeaseKey::from_bytes(&[0; KEY_LEN]).is_ok());
}

/// Issue 52: through a rotation, every replica takes what any other may
/// have signed, whichever phase each is in; once the grace is over, the
/// old key signs nothing that is taken.
#[test]
fn a_rotation_takes_both_keys_until_its_grace_ends_and_then_only_the_next() {
    let (old, new) = ([1; KEY_LEN], [2; KEY_LEN]);
    let at = |phase| LeaseKey::rotating(&old, Some(&new), phase).unwrap();
    let (before, announced, grace, done) = (
        key(1),
        at(Phase::Announced),
        at(Phase::Grace),
        at(Phase::Done),
    );
    assert_eq!(before.id(), announced.id(), "announcing signs as before");
    assert_eq!(grace.id(), key(2).id(), "from rotate-at the next key signs");
    let signed_by = |k: &LeaseKey| (encode(k, &claims()), seal(k, "p", b"d"));
    // (signer, checker, taken)
    let cases = [
        (&before, &announced, true),
        (&announced, &grace, true),
        (&grace, &announced, true),
        (&before, &grace, true),
        (&grace, &done, true),
        (&announced, &done, false),
        (&before, &done, false),
        (&done, &before, false),
    ];
    for (i, (signer, checker, taken)) in cases.into_iter().enumerate() {
        let (id, tag) = signed_by(signer);
        assert_eq!(verify(checker, &id, now()).is_ok(), taken, "case {i}: id");
        assert_eq!(sealed(checker, "p", b"d", &tag), taken, "case {i}: seal");
    }
    // A reload reaches every clone at once.
    let held = before.clone();
    before.adopt(&done);
    assert_eq!(held.id(), key(2).id());
    assert!(verify(&held, &encode(&key(1), &claims()), now()).is_err());
}
