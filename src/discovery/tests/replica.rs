//! The discovery API across replicas: forwards to the leader, the
//! follower's copy of its table, in-sync grants, and what a gateway
//! replica tells the leader.

use super::*;
use crate::replica::internal;

#[test]
fn forward_decision() {
    struct Case {
        name: &'static str,
        leader: Leader,
        forwarded: bool,
        want: Route,
    }
    let at = || Leader::At("http://10.0.0.7:8090".into());
    let cases = [
        Case {
            name: "the leader serves",
            leader: Leader::Me,
            forwarded: false,
            want: Route::Local,
        },
        Case {
            name: "the leader serves what a follower forwarded",
            leader: Leader::Me,
            forwarded: true,
            want: Route::Local,
        },
        Case {
            name: "a follower that knows the leader forwards",
            leader: at(),
            forwarded: false,
            want: Route::Forward("http://10.0.0.7:8090".into()),
        },
        Case {
            name: "a forwarded call at a replica that no longer leads stops here",
            leader: at(),
            forwarded: true,
            want: Route::Unavailable(Unavailable::NotLeader),
        },
        Case {
            name: "no leader known",
            leader: Leader::Unknown,
            forwarded: false,
            want: Route::Unavailable(Unavailable::NoLeader),
        },
        Case {
            name: "no leader known, forwarded",
            leader: Leader::Unknown,
            forwarded: true,
            want: Route::Unavailable(Unavailable::NoLeader),
        },
        Case {
            name: "a URL without a valid seal gets nothing",
            leader: Leader::Unverified,
            forwarded: false,
            want: Route::Unavailable(Unavailable::Unverified),
        },
    ];
    for c in cases {
        assert_eq!(route(&c.leader, c.forwarded), c.want, "{}", c.name);
    }
}

#[tokio::test]
async fn a_follower_relays_lease_calls_to_the_leader_s_one_table() {
    let leader = Api::start_routed(1, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(1, Leader::At(url), FORWARD_TIMEOUT).await;
    // Two healthy proxies, one lease each: two grants in all, wherever asked.
    let (s1, first) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s1, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let (s2, _) = leader.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s2, 201);
    let (s3, full) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s3, code(&full)), (409, "no_capacity"), "{full}");
    assert!(
        follower.last_retry_after().parse::<u64>().unwrap() >= 1,
        "the leader's Retry-After is relayed"
    );
    // The lease lives in the leader's table: read there, renewed, reported
    // and released through the follower.
    let path = format!("/v1/leases/{id}");
    assert_eq!(leader.call("GET", &path, Some("t0k"), None).await.0, 200);
    let (renewed, body) = follower
        .json("POST", &format!("{path}/renew"), json!({"ttlSeconds": 60}))
        .await;
    assert_eq!((renewed, body["ttlSeconds"].as_u64()), (200, Some(60)));
    let report = json!({"result": "ok"});
    assert_eq!(
        follower
            .json("POST", &format!("{path}/report"), report)
            .await
            .0,
        204
    );
    assert_eq!(
        follower.call("DELETE", &path, Some("t0k"), None).await.0,
        204
    );
    assert_eq!(leader.call("GET", &path, Some("t0k"), None).await.0, 404);
    // The follower checks the token itself, and the leader does again.
    assert_eq!(
        follower
            .call("POST", "/v1/leases", Some("bad"), None)
            .await
            .0,
        401
    );
    // An oversized body is the follower's own 413, not forwarded.
    let big = vec![b' '; BODY_LIMIT + 1];
    let (status, body) = follower
        .call("POST", "/v1/leases", Some("t0k"), Some(big))
        .await;
    assert_eq!((status, code(&body)), (413, "payload_too_large"), "{body}");
    let text = follower.metrics.encode().unwrap();
    assert!(
        text.contains(r#"proxy_operator_discovery_forwarded_total{outcome="relayed"} 5"#),
        "{text}"
    );
    follower.stop().await;
    leader.stop().await;
}

#[tokio::test]
async fn a_follower_without_a_reachable_leader_answers_503_with_retry_after() {
    // A port nobody listens on: bound, then closed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    // A leader that accepts connections and never answers.
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = format!("http://{}", mute.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((c, _)) = mute.accept().await {
            open.push(c);
        }
    });
    struct Case {
        name: &'static str,
        leader: Leader,
        signed: bool,
        outcome: &'static str,
    }
    let cases = [
        Case {
            name: "no leader known",
            leader: Leader::Unknown,
            signed: false,
            outcome: "no_leader",
        },
        Case {
            name: "the leader's port is closed",
            leader: Leader::At(gone),
            signed: false,
            outcome: "unreachable",
        },
        Case {
            name: "the leader does not answer",
            leader: Leader::At(silent),
            signed: false,
            outcome: "timeout",
        },
        Case {
            name: "forwarded here, but this replica does not lead",
            leader: Leader::At("http://127.0.0.1:9".into()),
            signed: true,
            outcome: "not_leader",
        },
        Case {
            name: "the Lease names a URL nobody sealed",
            leader: Leader::Unverified,
            signed: false,
            outcome: "unverified",
        },
    ];
    for c in cases {
        let api = Api::start_routed(1, c.leader, Duration::from_millis(300)).await;
        // A call another replica forwarded, signed with the shared key.
        let f = internal::Forward {
            method: "POST",
            path: "/v1/leases",
            client: "default",
            request_key: "",
            deadline_ms: "",
            body: b"",
        };
        let signed =
            internal::sign_forward(&shared_key(), &f, chrono::Utc::now().timestamp_millis());
        let headers = [
            (internal::FORWARD_HEADER, signed.as_str()),
            (internal::CLIENT_HEADER, "default"),
        ];
        let headers: &[(&str, &str)] = if c.signed { &headers } else { &[] };
        let (status, body) = api
            .call_with("POST", "/v1/leases", Some("t0k"), headers, None)
            .await;
        assert_eq!(
            (status, code(&body)),
            (503, "leader_unavailable"),
            "{}: {body}",
            c.name
        );
        assert_eq!(api.last_retry_after(), "3", "{}", c.name);
        assert!(
            !body["error"]["message"].as_str().unwrap().contains('{'),
            "{}: plain words: {body}",
            c.name
        );
        // The listing is this replica's own.
        assert_eq!(
            api.call("GET", "/v1/proxies", Some("t0k"), None).await.0,
            200
        );
        let text = api.metrics.encode().unwrap();
        let want = format!(
            r#"proxy_operator_discovery_forwarded_total{{outcome="{}"}} 1"#,
            c.outcome
        );
        assert!(text.contains(&want), "{}: {text}", c.name);
        api.stop().await;
    }
    held.abort();
}

#[tokio::test]
async fn a_lease_belongs_to_the_client_that_holds_it() {
    let api = Api::start_clients(
        &[("alice", "tok-a"), ("bob", "tok-b")],
        10,
        ClientLimits::default(),
    )
    .await;
    let (s, lease) = api
        .call("POST", "/v1/leases", Some("tok-a"), Some(b"{}".to_vec()))
        .await;
    assert_eq!(s, 201, "{lease}");
    let id = lease["id"].as_str().unwrap();
    let path = format!("/v1/leases/{id}");
    // Bob, holding the id, meets it as an unknown lease everywhere.
    for (method, p, body) in [
        ("GET", path.clone(), None),
        ("POST", format!("{path}/renew"), Some(b"{}".to_vec())),
        (
            "POST",
            format!("{path}/report"),
            Some(br#"{"result": "failed"}"#.to_vec()),
        ),
        ("DELETE", path.clone(), None),
    ] {
        let (s, v) = api.call(method, &p, Some("tok-b"), body).await;
        assert_eq!(
            (s, code(&v)),
            (404, "unknown_lease"),
            "bob's {method} {p}: {v}"
        );
    }
    // As for an id that never was: nothing tells bob it exists.
    let (s, v) = api
        .call("DELETE", "/v1/leases/v1.AAAA", Some("tok-b"), None)
        .await;
    assert_eq!((s, code(&v)), (404, "unknown_lease"), "{v}");
    // Alice still holds it, renews it and may end it.
    let (s, v) = api.call("GET", &path, Some("tok-a"), None).await;
    assert_eq!(s, 200, "alice still holds her lease: {v}");
    let (s, v) = api
        .call(
            "POST",
            &format!("{path}/renew"),
            Some("tok-a"),
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = api.call("DELETE", &path, Some("tok-a"), None).await;
    assert_eq!(s, 204);
    let (s, v) = api.call("GET", &path, Some("tok-a"), None).await;
    assert_eq!((s, code(&v)), (404, "unknown_lease"), "{v}");
}

/// A request head, read up to the blank line.
async fn read_head(c: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).await.unwrap() == 1 {
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The headers of a signed forward of `body` to `path` for `client`.
fn forward_headers(
    key: &LeaseKey,
    path: &'static str,
    client: &'static str,
    request_key: &'static str,
    deadline_ms: &'static str,
    body: &'static [u8],
) -> Vec<(&'static str, String)> {
    let f = internal::Forward {
        method: "POST",
        path,
        client,
        request_key,
        deadline_ms,
        body,
    };
    let now = chrono::Utc::now().timestamp_millis();
    vec![
        (
            internal::FORWARD_HEADER,
            internal::sign_forward(key, &f, now),
        ),
        (internal::CLIENT_HEADER, client.to_string()),
        (internal::REQUEST_KEY_HEADER, request_key.to_string()),
        (internal::DEADLINE_HEADER, deadline_ms.to_string()),
    ]
}

fn as_pairs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Issue 52: an answer at the leader's address without the leader's seal
/// for the call (a stand-in that learned the address) is not relayed to
/// the crawler: 503, counted `unsealed`.
#[tokio::test]
async fn an_unsealed_answer_from_the_leaders_address_is_not_relayed() {
    let stand_in = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", stand_in.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = stand_in.accept().await else {
                return;
            };
            let _ = read_head(&mut c).await;
            use tokio::io::AsyncWriteExt;
            let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
            let _ = c.write_all(answer.as_bytes()).await;
        }
    });
    let follower = Api::start_routed(1, Leader::At(url), FORWARD_TIMEOUT).await;
    let (s, v) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s, code(&v)), (503, "leader_unavailable"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("seal"),
        "{v}"
    );
    follower.stop().await;
}

#[tokio::test]
async fn a_forward_is_signed_for_the_client_and_never_carries_the_crawlers_token() {
    // A leader that records what it is sent.
    let recorder = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", recorder.local_addr().unwrap());
    let seen = tokio::spawn(async move {
        loop {
            let (mut c, _) = recorder.accept().await.unwrap();
            let head = read_head(&mut c).await;
            use tokio::io::AsyncWriteExt;
            // Sealed for the call, as the leader seals its answers.
            let ask = head
                .lines()
                .find_map(|l| l.strip_prefix("x-egress-forward: "))
                .unwrap_or_default();
            let seal = internal::seal_answer(&shared_key(), ask.trim(), 409, b"{}");
            let answer = format!("HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\n{}: {seal}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}", internal::ANSWER_HEADER);
            c.write_all(answer.as_bytes()).await.unwrap();
            // The follower's copy of the lease table asks too.
            if head.starts_with("POST") {
                return head;
            }
        }
    });
    let follower = Api::start_routed(1, Leader::At(url), FORWARD_TIMEOUT).await;
    let (s, _) = follower.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s, 409, "the leader's answer is relayed");
    let head = seen.await.unwrap().to_ascii_lowercase();
    assert!(
        !head.contains("t0k"),
        "the crawler's token stays here: {head}"
    );
    assert!(!head.contains("authorization"), "{head}");
    for h in [
        "x-egress-forward: v1.",
        "x-egress-client: default",
        "x-egress-request-key: ",
        "x-egress-deadline-ms: ",
    ] {
        assert!(head.contains(h), "{h} in {head}");
    }
    follower.stop().await;
}

#[tokio::test]
async fn a_forwarded_acquire_sent_again_gets_the_same_lease_and_a_late_one_gets_none() {
    let leader = Api::start_routed(5, Leader::Me, FORWARD_TIMEOUT).await;
    let active = || async {
        let text = leader.metrics.encode().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("proxy_operator_leases_active "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    let send = |h: Vec<(&'static str, String)>| {
        let leader = &leader;
        async move {
            leader
                .call_with(
                    "POST",
                    "/v1/leases",
                    None,
                    &as_pairs(&h),
                    Some(b"{}".to_vec()),
                )
                .await
        }
    };
    let key = shared_key();
    let rk1 = || forward_headers(&key, "/v1/leases", "default", "rk-1", "1500", b"{}");
    let (s1, first) = send(rk1()).await;
    assert_eq!(s1, 201, "a signed forward needs no token: {first}");
    // The answer was lost; the follower sends the same call again (signed
    // anew, with the same request key).
    let (s2, again) = send(rk1()).await;
    assert_eq!((s2, &again["id"]), (201, &first["id"]), "{again}");
    assert_eq!(active().await, 1.0, "one lease, not two");
    // Another client's call under the same key is its own.
    let (s3, other) = send(forward_headers(
        &key,
        "/v1/leases",
        "team-b",
        "rk-1",
        "1500",
        b"{}",
    ))
    .await;
    assert_eq!(s3, 201, "{other}");
    assert_ne!(other["id"], first["id"]);
    // Past its deadline (the follower answered 503 already): nothing.
    let (s4, late) = send(forward_headers(
        &key,
        "/v1/leases",
        "default",
        "rk-2",
        "0",
        b"{}",
    ))
    .await;
    assert_eq!((s4, code(&late)), (503, "leader_unavailable"), "{late}");
    assert_eq!(active().await, 2.0, "nothing granted that nobody holds");
    // Signed with another installation's key, or for another body: 401.
    let other_key = LeaseKey::from_bytes(&[3; crate::lease::signed::KEY_LEN]).unwrap();
    let (s5, v) = send(forward_headers(
        &other_key,
        "/v1/leases",
        "default",
        "rk-3",
        "1500",
        b"{}",
    ))
    .await;
    assert_eq!((s5, code(&v)), (401, "unauthorized"), "{v}");
    let (s6, v) = send(forward_headers(
        &key,
        "/v1/leases",
        "default",
        "rk-4",
        "1500",
        br#"{"ttlSeconds":5}"#,
    ))
    .await;
    assert_eq!((s6, code(&v)), (401, "unauthorized"), "{v}");
    assert_eq!(active().await, 2.0);
    leader.stop().await;
}

#[tokio::test]
async fn a_follower_keeps_a_copy_of_the_leaders_table_and_crawlers_cannot_read_it() {
    let leader = Api::start_routed(5, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(5, Leader::At(url), FORWARD_TIMEOUT).await;
    for _ in 0..2 {
        let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
        assert_eq!(s, 201, "{v}");
    }
    let active = |api: &Api| {
        let text = api.metrics.encode().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("proxy_operator_leases_active "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while active(&follower) != Some(2.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower's copy: {:?}",
            active(&follower)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A release at the leader reaches the copy too.
    let (_, v) = leader.json("POST", "/v1/leases", json!({})).await;
    let path = format!("/v1/leases/{}", v["id"].as_str().unwrap());
    assert_eq!(leader.call("DELETE", &path, Some("t0k"), None).await.0, 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while active(&follower) != Some(2.0) || active(&leader) != Some(2.0) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The table is for replicas: a crawler's token meets an unknown route.
    let (s, v) = leader.call("GET", feed::FEED_PATH, Some("t0k"), None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    follower.stop().await;
    leader.stop().await;
}

#[tokio::test]
async fn a_gateway_key_forwards_and_follows_but_is_never_a_replica_in_sync() {
    let gateway_key = LeaseKey::from_bytes(&[7; crate::lease::signed::KEY_LEN]).unwrap();
    let stranger_key = LeaseKey::from_bytes(&[5; crate::lease::signed::KEY_LEN]).unwrap();
    let leader = Api::start_keyed(
        5,
        (Leader::Me, FORWARD_TIMEOUT),
        (shared_key(), Some(gateway_key.clone())),
    )
    .await;
    let url = format!("http://{}", leader.addr);
    let gateway = Api::start_keyed(
        5,
        (Leader::At(url.clone()), FORWARD_TIMEOUT),
        (gateway_key, None),
    )
    .await;
    let stranger = Api::start_keyed(
        5,
        (Leader::At(url.clone()), FORWARD_TIMEOUT),
        (stranger_key, None),
    )
    .await;
    let manager = Api::start_keyed(
        5,
        (Leader::At(url.clone()), FORWARD_TIMEOUT),
        (shared_key(), None),
    )
    .await;
    // A lease call a gateway forwards is the leader's to answer.
    let (s, v) = gateway.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(leader.leases.active(), 1);
    // One signed with any other key is refused.
    let (s, v) = stranger.json("POST", "/v1/leases", json!({})).await;
    assert_ne!(s, 201, "{v}");
    assert_eq!(leader.leases.active(), 1);
    // Asking for the table naming itself, a gateway is still an observer;
    // a manager replica joins the followers grants wait for.
    let ask = |who: &str| format!("{}?replica={who}", feed::FEED_PATH);
    let fed =
        crate::replica::copy::ask_leader_bytes(&gateway.state.forward, &url, &ask("gw-1"), 1 << 20)
            .await
            .unwrap()
            .map(|b| feed::Fed::decode(&b).unwrap());
    assert!(fed.is_some_and(|f| f.state.leases.len() == 1));
    let fed = crate::replica::copy::ask_leader_bytes(
        &manager.state.forward,
        &url,
        &ask("mgr-1"),
        1 << 20,
    )
    .await
    .unwrap();
    assert!(fed.is_some());
    let refused =
        crate::replica::copy::ask_leader_bytes(&stranger.state.forward, &url, &ask("x-1"), 1 << 20)
            .await;
    assert!(refused.is_err(), "{refused:?}");
    // Each Api also follows the leader in the background, naming itself:
    // once the manager's and the gateway's copies hold the lease, the
    // manager is named in sync, the gateway never.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let named = loop {
        let (_, named) = leader.replicas.publish(&shared_key(), false);
        let copied = gateway.leases.active() == 1 && manager.leases.active() == 1;
        if copied && named.contains(manager.replicas.me()) {
            break named;
        }
        assert!(tokio::time::Instant::now() < deadline, "{named:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for not in [gateway.replicas.me(), "gw-1", stranger.replicas.me()] {
        assert!(!named.contains(not), "{not} in {named:?}");
    }
    for api in [gateway, stranger, manager, leader] {
        api.stop().await;
    }
}

#[tokio::test]
async fn a_gateway_copies_the_leaders_credentials_and_keeps_them_without_a_leader() {
    use crate::credentials::Credentials;
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::watcher::Event;
    let leader = Api::start_routed(5, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let gateway = Api::start_routed(5, Leader::At(url), FORWARD_TIMEOUT).await;
    // The credentials are for replicas: a crawler's token meets an
    // unknown route.
    let path = credentials_feed::CREDENTIALS_PATH;
    let (s, v) = leader.call("GET", path, Some("t0k"), None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // The leader's watch listed one credentials Secret.
    let at_leader = leader.state.credentials.clone();
    let mut writer = at_leader.take_writer().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds-a", "namespace": "ns",
            "labels": {"crawl.example.com/proxy-credentials": "true"}},
        "data": {"username": "dXNlci1h", "password": "cGFzcy1h"}}))
    .unwrap();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitApply(secret));
    writer.apply_watcher_event(&Event::InitDone);
    at_leader
        .change_counter()
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    // A gateway process (an observer) asks for them, signed.
    let copy = gateway.state.credentials.clone();
    assert!(!copy.synced(), "nothing before the first copy");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let observer = gateway.state.clone().as_observer();
    let follow = tokio::spawn(credentials_feed::follow_credentials(
        (observer.forward.clone(), observer.credentials.clone()),
        observer.observer,
        async move {
            let _ = stopped.await;
        },
    ));
    let has = |name: &str, user: &str, pass: &str| {
        copy.get("ns", name) == Some(Credentials::new(user, pass))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !has("creds-a", "user-a", "pass-a") {
        assert!(tokio::time::Instant::now() < deadline, "no copy in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the leader writes next reaches the copy.
    at_leader.wrote("ns", "creds-b", &Credentials::new("user-b", "pass-b"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !has("creds-b", "user-b", "pass-b") {
        assert!(tokio::time::Instant::now() < deadline, "no change in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without a leader, the gateway keeps what it has.
    leader.stop().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(has("creds-a", "user-a", "pass-a") && has("creds-b", "user-b", "pass-b"));
    let _ = stop.send(());
    follow.await.unwrap();
    gateway.stop().await;
}

#[tokio::test]
async fn a_grant_is_answered_only_once_the_in_sync_follower_holds_it() {
    let began = std::time::Instant::now();
    let leader = Api::start_routed(50, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(50, Leader::At(url), FORWARD_TIMEOUT).await;
    let me = follower.replicas.me().to_string();
    // The leader's election writes: until one names the follower in sync.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, named) = leader.replicas.publish(&shared_key(), false);
        leader.replicas.written(&named);
        if named.contains(&me) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never in sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 1..=20 {
        let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(
            follower.leases.active(),
            i,
            "the follower's copy holds grant {i} when the crawler hears of it"
        );
    }
    let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
    let path = format!("/v1/leases/{}/renew", v["id"].as_str().unwrap());
    assert_eq!(s, 201);
    let (s, v) = leader
        .json("POST", &path, json!({"ttlSeconds": 3000}))
        .await;
    assert_eq!(s, 200, "{v}");
    let copied = follower.leases.export();
    assert!(
        copied.leases.iter().any(|l| l.3 > 2_900_000),
        "the renewal is in the copy when answered"
    );
    // The follower was sent the table whole once, on joining, and after
    // that only what changed.
    let text = leader.metrics.encode().unwrap();
    let answers = |kind: &str| {
        let series = format!("proxy_operator_lease_feed_answers_total{{kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    assert!(answers("delta") >= 22, "{text}");
    assert!(answers("whole") <= 2, "{text}");
    // The follower dated each delta it took: how many changes behind and
    // how long after the oldest of them was made.
    let mine = follower.metrics.encode().unwrap();
    let value = |series: &str| {
        mine.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |n| n.trim().parse::<f64>().unwrap())
    };
    let deltas = value("proxy_operator_lease_copy_lag_seconds_count");
    assert!(deltas >= 22.0, "{mine}");
    assert_eq!(
        value("proxy_operator_lease_copy_behind_changes_count"),
        deltas
    );
    // Every grant and the renewal is one change at least.
    assert!(value("proxy_operator_lease_copy_behind_changes_sum") >= 22.0);
    // No change is dated before the test made it.
    let worst = value("proxy_operator_lease_copy_lag_seconds_sum");
    assert!(
        worst <= began.elapsed().as_secs_f64() * deltas,
        "lags of {worst} s over {deltas} deltas"
    );
    // The follower goes silent: with nobody writing the Lease, a grant
    // waits for it and is refused, and nothing stays granted.
    follower.stop().await;
    let before = leader.leases.active();
    let started = std::time::Instant::now();
    let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
    assert_eq!((s, code(&v)), (503, "leader_unavailable"), "{v}");
    assert!(started.elapsed() >= crate::replica::members::CONFIRM_LIMIT);
    assert_eq!(leader.leases.active(), before, "nothing granted");
    // Once a write leaves the follower out, grants go on without it.
    let r = leader.replicas.clone();
    let election = tokio::spawn(async move {
        r.write_now().notified().await;
        let (_, named) = r.publish(&shared_key(), false);
        r.written(&named);
        named
    });
    let (s, v) = leader.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(s, 201, "{v}");
    assert!(election.await.unwrap().is_empty(), "the follower is out");
    leader.stop().await;
}

/// A leading replica and one that follows it (forwards and table copies).
async fn leader_and_follower() -> (Api, Api) {
    let leader = Api::start_routed(50, Leader::Me, FORWARD_TIMEOUT).await;
    let url = format!("http://{}", leader.addr);
    let follower = Api::start_routed(50, Leader::At(url), FORWARD_TIMEOUT).await;
    (leader, follower)
}

#[tokio::test]
async fn a_flood_of_gateway_cooldowns_waits_bounded_and_reaches_the_leader_one_call_at_a_time() {
    use crate::replica::outbox::{Tell, MAX_WAITING};
    // A leader that takes connections and never answers.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut c, _)) = l.accept().await {
            let head = read_head(&mut c).await;
            if head.starts_with("POST /internal/v1/cooldowns") {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            held.push(c);
        }
    });
    let follower = Api::start_routed(50, Leader::At(url), FORWARD_TIMEOUT).await;
    let me: Arc<str> = "default".into();
    let teller = follower.state.teller();
    for i in 0..10_000 {
        let site = format!("site-{i}.example");
        teller.tell(Tell::Cooldown {
            proxy: test_proxy_key("a"),
            client: me.clone(),
            site: Some(site),
        });
    }
    assert!(follower.state.outbox.waiting() <= MAX_WAITING);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(sent, 1, "one call at a time, not a task per event");
    let text = follower.metrics.encode().unwrap();
    let dropped = text
        .lines()
        .find_map(|l| l.strip_prefix("proxy_operator_gateway_leader_messages_dropped_total "))
        .map_or(0.0, |n| n.trim().parse::<f64>().unwrap());
    assert!(dropped >= (10_000 - MAX_WAITING - 1) as f64, "{text}");
    follower.stop().await;
}

#[tokio::test]
async fn a_followers_cooldown_is_held_by_the_leader_and_its_route_is_for_replicas_only() {
    let (leader, follower) = leader_and_follower().await;
    let key = test_proxy_key;
    let (a, b, c) = (key("a"), key("b"), key("sick"));
    let me: Arc<str> = "default".into();
    assert!(leader.leases.lets_gateway_use("default", &a, None));
    follower.state.cool_down(&a, &me, None).await;
    follower
        .state
        .cool_down(&b, &me, Some("shop.example"))
        .await;
    let held = |l: &LeaseStore| {
        !l.lets_gateway_use("default", &a, None)
            && l.lets_gateway_use("default", &c, None)
            && !l.lets_gateway_use("default", &b, Some("shop.example"))
            && l.lets_gateway_use("default", &b, Some("news.example"))
    };
    // The leader has them once the follower's call returned; the
    // follower's copy, taken from the leader's table, keeps them.
    assert!(held(&leader.leases), "the leader holds both cooldowns");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !held(&follower.leases) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower's copy lost them"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Sent by a replica only: a crawler's token meets an unknown route.
    let body = br#"{"namespace": "ns", "name": "b"}"#.to_vec();
    let (s, v) = leader
        .call("POST", "/internal/v1/cooldowns", Some("t0k"), Some(body))
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    assert!(leader.leases.lets_gateway_use("default", &b, None));
    follower.stop().await;
    leader.stop().await;
}

#[tokio::test]
async fn an_upstream_a_followers_gateway_saw_fail_reaches_the_leaders_health_engine() {
    let (leader, follower) = leader_and_follower().await;
    let key = test_proxy_key;
    let hints = |api: &Api| api.state.hints.as_ref().unwrap().take();
    follower.state.teller().upstream_failed(&key("a")).await;
    assert_eq!(hints(&leader), ["ns/a"], "sent to the leader");
    assert!(hints(&follower).is_empty(), "a follower runs no engine");
    leader.state.teller().upstream_failed(&key("b")).await;
    assert_eq!(hints(&leader), ["ns/b"], "the leader's own gateway");
    // Sent by a replica only: a crawler's token meets an unknown route.
    let body = br#"{"namespace": "ns", "name": "a"}"#.to_vec();
    let (s, v) = leader
        .call("POST", "/internal/v1/failed", Some("t0k"), Some(body))
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    assert!(hints(&leader).is_empty());
    follower.stop().await;
    leader.stop().await;
}
