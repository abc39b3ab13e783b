//! Rotating the lease key (issue 52, docs/operations.md): two replicas on
//! the real test cluster, one External Proxy on a real Squid. The test
//! writes `next` and `rotate-at` into the key Secret as the operations
//! guide says. Crawler calls through the follower (forwards signed with
//! the follower's keys, checked by the leader's) are answered throughout;
//! from `rotate-at` new ids are signed with the next key while ids signed
//! with the old one are still taken; after the grace (`--max-lease-ttl`)
//! a replica folds the Secret to the next key alone, and the old key signs
//! nothing that is taken any more.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use egress_proxies_operator::lease::signed::{encode, open, random_bytes, KEY_LEN};
use egress_proxies_operator::lease::LeaseKey;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

use crate::support::leader::{self, holder, TOKEN};
use crate::support::{self, api_call, eventually, squid};

const SECRET: &str = "egress-proxies-operator-lease-key";
/// The grace: every id the old key signed before `rotate-at` has ended.
const MAX_TTL: u64 = 20;

async fn call(api: SocketAddr, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = match body {
        Value::Null => vec![],
        b => b.to_string().into_bytes(),
    };
    let (s, v) = api_call(api, method, path, Some(TOKEN), body).await;
    // Forwards signed with either replica's keys are taken all along.
    assert!(
        [200, 201, 204, 404, 409].contains(&s),
        "{method} {path}: {s} {v}"
    );
    (s, v)
}

fn key_in(s: &Secret, data_key: &str) -> Option<Vec<u8>> {
    Some(s.data.as_ref()?.get(data_key)?.0.clone())
}

/// `id`'s claims signed again with `key`: the same lease, as a replica
/// holding only `key` would have signed it.
fn signed_with(key: &LeaseKey, id: &str, by: &LeaseKey) -> String {
    encode(key, &open(by, id).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_lease_key_signs_new_ids_takes_old_ones_through_its_grace_and_then_folds() {
    squid::require();
    let ground = support::ground_without_pods("rotate").await;
    let dir = tempfile::tempdir().unwrap();
    let target = support::http_target().await;
    let port = support::free_port();
    let _squid = squid::start(Ipv4Addr::LOCALHOST, port, "rotate", "http_access allow me").await;
    let (api_a, api_b) = (support::loopback(), support::loopback());
    let max_ttl = format!("{MAX_TTL}s");
    let flags = [
        "--max-leases-per-proxy",
        "10",
        "--max-lease-ttl",
        &max_ttl,
        "--default-lease-ttl",
        "10s",
    ];
    let serving = |name: &str, api: SocketAddr| {
        let timing = ["15s", "10s"];
        leader::serving_replica_for(
            &ground,
            dir.path(),
            name,
            (api, target),
            (&flags, &[]),
            timing,
        )
    };
    let leases_api: Api<Lease> = ground.api();
    let a = serving("a", api_a);
    eventually("a to lead", Duration::from_secs(30), || async {
        holder(&leases_api).await.filter(|h| h.starts_with("a_"))
    })
    .await;
    let b = serving("b", api_b);
    leader::campaigning(&dir.path().join("b.log")).await;
    leader::ready_and_listed(&ground, "sq-1", port, api_a).await;
    let acquire = || async {
        eventually("a lease through b", Duration::from_secs(30), || async {
            let (s, v) = call(api_b, "POST", "/v1/leases", json!({"ttlSeconds": MAX_TTL})).await;
            (s == 201).then(|| v["id"].as_str().unwrap().to_string())
        })
        .await
    };

    let secrets: Api<Secret> = ground.api();
    let old =
        LeaseKey::from_bytes(&key_in(&secrets.get(SECRET).await.unwrap(), "key").unwrap()).unwrap();
    let first = acquire().await;
    assert!(
        open(&old, &first).is_ok(),
        "signed with the key the Secret holds"
    );

    // The rotation, as docs/operations.md writes it: a next key, and when
    // it signs (past one reload of every replica).
    let next_bytes = random_bytes::<KEY_LEN>().to_vec();
    let next = LeaseKey::from_bytes(&next_bytes).unwrap();
    let rotate_at = chrono::Utc::now().timestamp() + 12;
    let patch = json!({"data": {
        "next": ByteString(next_bytes.clone()),
        "rotate-at": ByteString(rotate_at.to_string().into_bytes()),
    }});
    secrets
        .patch(SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let patched = Instant::now();

    // Leases keep coming through b, and from rotate-at on with the next key.
    let second = eventually(
        "an id signed with the next key",
        Duration::from_secs(45),
        || async {
            let got = acquire().await;
            call(api_b, "DELETE", &format!("/v1/leases/{got}"), Value::Null).await;
            open(&next, &got).is_ok().then_some(got)
        },
    )
    .await;
    println!(
        "ids signed with the next key {:?} after the patch",
        patched.elapsed()
    );
    assert!(open(&old, &second).is_err(), "the next key alone signs");
    // In the grace, a live lease's id signed with the old key (as a
    // replica signed it before rotate-at) is taken, through the follower
    // too, and renews into an id of the next key.
    let second = acquire().await;
    let as_old = signed_with(&old, &second, &next);
    for api in [api_a, api_b] {
        let (s, v) = call(api, "GET", &format!("/v1/leases/{as_old}"), Value::Null).await;
        assert_eq!(s, 200, "the old key is taken in the grace: {v}");
    }
    let (s, v) = call(
        api_b,
        "POST",
        &format!("/v1/leases/{as_old}/renew"),
        json!({}),
    )
    .await;
    assert_eq!(s, 200, "an id of the old key renews in the grace: {v}");
    let second = v["id"].as_str().unwrap().to_string();
    assert!(
        open(&next, &second).is_ok(),
        "a renewal signs with the next key"
    );

    // After the grace a replica folds the Secret: the next key alone.
    eventually(
        "the Secret folded",
        Duration::from_secs(MAX_TTL + 45),
        || async {
            // The lease is kept alive meanwhile.
            call(
                api_b,
                "POST",
                &format!("/v1/leases/{second}/renew"),
                json!({}),
            )
            .await;
            let s = secrets.get(SECRET).await.ok()?;
            (key_in(&s, "key")? == next_bytes
                && key_in(&s, "next").is_none()
                && key_in(&s, "rotate-at").is_none())
            .then_some(())
        },
    )
    .await;
    println!("folded {:?} after the patch", patched.elapsed());
    let (s, v) = call(
        api_b,
        "POST",
        &format!("/v1/leases/{second}/renew"),
        json!({}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let live = v["id"].as_str().unwrap().to_string();
    let as_old = signed_with(&old, &live, &next);
    for api in [api_a, api_b] {
        let (s, _) = call(api, "GET", &format!("/v1/leases/{live}"), Value::Null).await;
        assert_eq!(s, 200, "the lease itself is live");
        let (s, v) = call(api, "GET", &format!("/v1/leases/{as_old}"), Value::Null).await;
        assert_eq!(
            s, 404,
            "the old key signs nothing taken after the grace: {v}"
        );
    }
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap_or_default();
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap_or_default();
    let logs = format!("{a_log}{b_log}");
    assert!(logs.contains("Folded the finished rotation of the lease signing key"));
    for k in [
        &next_bytes,
        &key_in(&secrets.get(SECRET).await.unwrap(), "key").unwrap(),
    ] {
        let b64 = data_encoding::BASE64.encode(k);
        assert!(!logs.contains(&b64[..20]), "a key reached a log");
    }
    drop((a, b));
}
