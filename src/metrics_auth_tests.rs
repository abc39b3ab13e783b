use super::*;

#[test]
fn bearer_table() {
    struct Case {
        name: &'static str,
        header: Option<&'static str>,
        want: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "no header",
            header: None,
            want: None,
        },
        Case {
            name: "a bearer token",
            header: Some("Bearer abc.def"),
            want: Some("abc.def"),
        },
        Case {
            name: "the scheme in any letter case, spaces trimmed",
            header: Some(" bearer   abc "),
            want: Some("abc"),
        },
        Case {
            name: "basic auth is not a bearer token",
            header: Some("Basic dXNlcjpwYXNz"),
            want: None,
        },
        Case {
            name: "an empty token",
            header: Some("Bearer "),
            want: None,
        },
        Case {
            name: "a scheme alone",
            header: Some("Bearer"),
            want: None,
        },
    ];
    for c in cases {
        assert_eq!(bearer(c.header), c.want, "{}", c.name);
    }
}

#[test]
fn refusal_table() {
    struct Case {
        name: &'static str,
        outcome: Result<Verdict, Unavailable>,
        want: Option<StatusCode>,
        says: &'static str,
    }
    let cases = [
        Case {
            name: "allowed goes through",
            outcome: Ok(Verdict::Allowed),
            want: None,
            says: "",
        },
        Case {
            name: "no or a bad token",
            outcome: Ok(Verdict::Unauthenticated),
            want: Some(StatusCode::UNAUTHORIZED),
            says: "bearer token",
        },
        Case {
            name: "a user without the role, named",
            outcome: Ok(Verdict::Forbidden {
                user: "system:serviceaccount:ns:other".into(),
            }),
            want: Some(StatusCode::FORBIDDEN),
            says: "system:serviceaccount:ns:other may not get /metrics",
        },
        Case {
            name: "the API server unreachable, with its message",
            outcome: Err(Unavailable("connection refused".into())),
            want: Some(StatusCode::SERVICE_UNAVAILABLE),
            says: "connection refused",
        },
    ];
    for c in cases {
        let got = refusal(&c.outcome);
        assert_eq!(got.as_ref().map(|(s, _)| *s), c.want, "{}", c.name);
        let text = got.map(|(_, t)| t).unwrap_or_default();
        assert!(text.contains(c.says), "{}: {text}", c.name);
    }
}

#[test]
fn cache_keeps_verdicts_for_the_ttl_and_stays_bounded() {
    let t0 = Instant::now();
    let ttl = Duration::from_secs(60);
    let mut cache = Cache::new(ttl, 3);
    let key = |i: u8| [i; 32];
    cache.put(key(1), Verdict::Allowed, t0);
    assert_eq!(cache.get(&key(1), t0 + ttl / 2), Some(Verdict::Allowed));
    assert_eq!(cache.get(&key(1), t0 + ttl), None, "expired at the ttl");
    assert_eq!(cache.get(&key(2), t0), None, "never seen");

    // Full: the oldest goes when none has expired.
    cache.put(
        key(2),
        Verdict::Unauthenticated,
        t0 + Duration::from_secs(1),
    );
    cache.put(
        key(3),
        Verdict::Unauthenticated,
        t0 + Duration::from_secs(2),
    );
    let now = t0 + Duration::from_secs(3);
    cache.put(key(4), Verdict::Allowed, now);
    assert_eq!(cache.len(), 3);
    assert_eq!(cache.get(&key(1), now), None, "the oldest was dropped");
    assert_eq!(cache.get(&key(4), now), Some(Verdict::Allowed));

    // Full: every expired entry goes first.
    let later = t0 + Duration::from_secs(62);
    cache.put(key(5), Verdict::Allowed, later);
    assert_eq!(cache.len(), 2, "keys 2 and 3 expired and were dropped");
    assert_eq!(cache.get(&key(4), later), Some(Verdict::Allowed));

    // Replacing a key of a full cache drops nothing else.
    let mut full = Cache::new(ttl, 2);
    full.put(key(1), Verdict::Allowed, t0);
    full.put(key(2), Verdict::Allowed, t0);
    full.put(key(2), Verdict::Unauthenticated, t0);
    assert_eq!(full.len(), 2);
}

#[test]
fn server_config_reads_a_cert_dir_and_names_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = server_config(Some(dir.path())).unwrap_err().to_string();
    assert!(
        missing.contains("--metrics-cert-dir") && missing.contains(CERT_FILE),
        "{missing}"
    );

    let made = rcgen::generate_simple_self_signed(vec!["metrics.example".to_string()]).unwrap();
    std::fs::write(dir.path().join(CERT_FILE), made.cert.pem()).unwrap();
    std::fs::write(dir.path().join(KEY_FILE), "not a key").unwrap();
    let bad_key = server_config(Some(dir.path())).unwrap_err().to_string();
    assert!(bad_key.contains(KEY_FILE), "{bad_key}");

    std::fs::write(dir.path().join(KEY_FILE), made.signing_key.serialize_pem()).unwrap();
    assert!(server_config(Some(dir.path())).is_ok());
    assert!(server_config(None).is_ok(), "self-signed");
}
