#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::time::Duration;

use super::*;

const MAX: Duration = Duration::from_secs(24 * 3600);

fn ok(username: &str) -> Wanted {
    parse(username, "crawler-a", MAX).unwrap_or_else(|e| panic!("{username}: {e}"))
}

#[test]
fn parameters_after_the_client_name_choose_the_session_and_the_proxies() {
    let table: [(&str, Wanted); 6] = [
        ("crawler-a", Wanted::default()),
        (
            "crawler-a-session-s81",
            Wanted {
                session: Some("s81".into()),
                ..Wanted::default()
            },
        ),
        (
            "crawler-a-session-s81-pool-eu-ttl-30",
            Wanted {
                session: Some("s81".into()),
                ttl: Some(Duration::from_secs(30 * 60)),
                filters: Filters {
                    pool: Some("eu".into()),
                    ..Filters::default()
                },
            },
        ),
        // Values run to the next parameter name, so they may hold '-'.
        (
            "crawler-a-zone-europe-west1-b-provider-gcp-eu",
            Wanted {
                filters: Filters {
                    zone: Some("europe-west1-b".into()),
                    provider: Some("gcp-eu".into()),
                    ..Filters::default()
                },
                ..Wanted::default()
            },
        ),
        (
            "crawler-a-ns-crawl-region-europe-west1",
            Wanted {
                filters: Filters {
                    namespace: Some("crawl".into()),
                    region: Some("europe-west1".into()),
                    ..Filters::default()
                },
                ..Wanted::default()
            },
        ),
        (
            "crawler-a-label-tier=gold-label-example.com/team=a-b",
            Wanted {
                filters: Filters {
                    label_selector: Some("tier=gold,example.com/team=a-b".into()),
                    ..Filters::default()
                },
                ..Wanted::default()
            },
        ),
    ];
    for (username, want) in table {
        assert_eq!(ok(username), want, "{username}");
    }
}

#[test]
fn a_malformed_username_says_what_is_wrong() {
    let long = format!("crawler-a-session-{}", "x".repeat(65));
    let table: [(&str, &str); 13] = [
        ("crawler-b", "must be the client name \"crawler-a\""),
        ("crawler-ab", "must be the client name"),
        ("", "must be the client name"),
        ("crawler-a-", "unknown parameter \"\""),
        (
            "crawler-a-sesion-x",
            "unknown parameter \"sesion\" (known: session, ttl",
        ),
        ("crawler-a-session", "parameter \"session\" needs a value"),
        (
            "crawler-a-pool-session-x",
            "parameter \"pool\" needs a value",
        ),
        (
            "crawler-a-session-a_b",
            "session id \"a_b\" must be 1 to 64 letters and digits",
        ),
        (&long, "must be 1 to 64 letters and digits"),
        (
            "crawler-a-session-a-ttl-0",
            "ttl \"0\" must be a whole number of minutes from 1 to 1440",
        ),
        ("crawler-a-session-a-ttl-1441", "from 1 to 1440"),
        ("crawler-a-ttl-5", "ttl applies to a session"),
        (
            "crawler-a-pool-a-pool-b",
            "parameter \"pool\" is given twice",
        ),
    ];
    for (username, want) in table {
        let err = parse(username, "crawler-a", MAX).expect_err(username);
        assert!(err.contains(want), "{username}: {err:?} lacks {want:?}");
    }
    for bad in [
        "crawler-a-label-tier",
        "crawler-a-label-=x",
        "crawler-a-label-a b=c",
    ] {
        let err = parse(bad, "crawler-a", MAX).expect_err(bad);
        assert!(err.starts_with("label filter"), "{bad}: {err}");
    }
}
