//! One client's reports are that client's (issue "The crawler-facing edge
//! holds"): through the real binary on the real test cluster, with three
//! named tokens and two External Proxies on loopback Squids. Client A's
//! report that proxy X is blocked on a site withholds X from A on that
//! site only; B still gets X for the site; once C, a second distinct
//! client, reports the same, X is withheld from everyone on that site.
//! Then 10,000 site reports from A leave the store at A's cap, as
//! `/metrics` shows.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kube::api::PostParams;
use serde_json::{json, Value};

use crate::oversized_heads::status_kib;
use crate::support::{self, api_call, eventually, leader::scraped, phase, squid, Operator};

const SITE: &str = "shop.example";
/// `MAX_SITE_REPORTS_PER_CLIENT`, as docs/api.md states it.
const PER_CLIENT: f64 = 1_000.0;

/// An acquire for `client` of the proxy named `x` or `y` (its attribute),
/// for `site`: the status and the lease.
async fn acquire(api: SocketAddr, client: &str, which: &str, site: &str) -> (u16, Value) {
    let body = json!({"ttlSeconds": 60, "site": site, "filters": {"attributes": {"which": which}}});
    api_call(
        api,
        "POST",
        "/v1/leases",
        Some(&format!("token-{client}")),
        body.to_string().into_bytes(),
    )
    .await
}

async fn call(api: SocketAddr, client: &str, method: &str, path: &str, body: Value) -> u16 {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let token = format!("token-{client}");
    api_call(api, method, path, Some(&token), bytes).await.0
}

/// `client` leases `which` (for any site), reports it blocked on `site`
/// and releases it.
async fn report(api: SocketAddr, client: &str, which: &str, site: &str) {
    let (s, lease) = acquire(api, client, which, "elsewhere.example").await;
    assert_eq!(s, 201, "{client} leases {which}: {lease}");
    let id = lease["id"].as_str().unwrap();
    let blocked = json!({"result": "blocked", "site": site});
    let s = call(
        api,
        client,
        "POST",
        &format!("/v1/leases/{id}/report"),
        blocked,
    )
    .await;
    assert!(s == 200 || s == 204, "{client}'s report: {s}");
    release(api, client, id).await;
}

/// `client` releases its lease `id`.
async fn release(api: SocketAddr, client: &str, id: &str) {
    let s = call(
        api,
        client,
        "DELETE",
        &format!("/v1/leases/{id}"),
        Value::Null,
    )
    .await;
    assert_eq!(s, 204);
}

/// Whether `client` gets `which` for `site` (releasing it at once).
async fn gets(api: SocketAddr, client: &str, which: &str, site: &str) -> bool {
    let (s, lease) = acquire(api, client, which, site).await;
    if s == 201 {
        release(api, client, lease["id"].as_str().unwrap()).await;
        return true;
    }
    assert_eq!(s, 409, "refused as any acquire: {lease}");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_a_s_report_on_a_site_does_not_stop_client_b_and_10000_reports_stay_bounded() {
    squid::require();
    let ground = support::ground_without_pods("reports").await;
    let target = support::http_target().await;
    let (port_x, _squid_x) = squid::on_loopback("reportsx").await;
    let (port_y, _squid_y) = squid::on_loopback("reportsy").await;
    let api = support::loopback();
    let metrics = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::create_dir(&tokens).unwrap();
    for c in ["crawler-a", "crawler-b", "crawler-c"] {
        std::fs::write(tokens.join(c), format!("token-{c}")).unwrap();
    }
    let mut cmd = ground.operator(dir.path(), "providers: []\n");
    cmd.args(["--discovery-bind-address", &api.to_string()])
        .args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--discovery-tokens-dir", tokens.to_str().unwrap()])
        .args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"]);
    let op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let rss = || status_kib(op.0.id(), "VmRSS:");
    let proxies = ground.proxies();
    for (name, which, port) in [("sq-x", "x", port_x), ("sq-y", "y", port_y)] {
        let p = support::proxy(
            name,
            json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port},
                   "attributes": {"which": which}}),
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually("both Proxies Ready", Duration::from_secs(60), || async {
        for name in ["sq-x", "sq-y"] {
            let p = proxies.get(name).await.ok()?;
            (phase(&p) == Some("Ready")).then_some(())?;
        }
        Some(())
    })
    .await;
    eventually("both listed", Duration::from_secs(30), || async {
        let (s, v) = api_call(
            api,
            "GET",
            "/v1/proxies",
            Some("token-crawler-a"),
            Vec::new(),
        )
        .await;
        (s == 200 && v["items"].as_array()?.len() == 2).then_some(())
    })
    .await;
    let (a, b, c) = ("crawler-a", "crawler-b", "crawler-c");

    // A says X is blocked on the site: withheld from A there, only.
    report(api, a, "x", SITE).await;
    assert!(!gets(api, a, "x", SITE).await, "A's own word holds for A");
    assert!(
        gets(api, a, "x", "other.example").await,
        "on other sites A still gets X"
    );
    assert!(
        gets(api, b, "x", SITE).await,
        "B still gets X, the only proxy it asks for"
    );
    println!("client A reported sq-x blocked on {SITE}: A refused it there, B granted it");

    // C, a second distinct client, agrees: X is withheld from everyone.
    report(api, c, "x", SITE).await;
    assert!(
        !gets(api, b, "x", SITE).await,
        "two clients agreed: B is refused too"
    );
    assert!(
        gets(api, b, "x", "other.example").await,
        "for that site only"
    );
    println!("client C agreed: sq-x withheld from B on {SITE} as well");

    // 10,000 site reports from A over both proxies (past the 1,000 per
    // proxy would allow 2,000): the store keeps A's 1,000 newest.
    let before = rss();
    let mut leases = Vec::new();
    for which in ["x", "y"] {
        let (s, lease) = acquire(api, a, which, "elsewhere.example").await;
        assert_eq!(s, 201, "{lease}");
        leases.push(lease["id"].as_str().unwrap().to_string());
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..4usize {
        let leases = leases.clone();
        tasks.push(tokio::spawn(async move {
            for i in (worker..10_000).step_by(4) {
                let id = &leases[i % 2];
                let body = json!({"result": "blocked", "site": format!("site-{i}.example")});
                let s = call(
                    api,
                    "crawler-a",
                    "POST",
                    &format!("/v1/leases/{id}/report"),
                    body,
                )
                .await;
                assert!(s == 200 || s == 204, "report {i}: {s}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let took = started.elapsed();
    for id in &leases {
        let s = call(
            api,
            "crawler-a",
            "DELETE",
            &format!("/v1/leases/{id}"),
            Value::Null,
        )
        .await;
        assert_eq!(s, 204);
    }
    let held = scraped(metrics, "proxy_operator_lease_site_cooldowns")
        .await
        .unwrap();
    let after = rss();
    println!(
        "10,000 site reports from A in {took:?}: proxy_operator_lease_site_cooldowns {held} \
         (A's cap {PER_CLIENT} + the agreed entry), operator RSS {} -> {} KiB",
        before, after
    );
    // A's 1,000 newest, plus sq-x on the site A and C agreed on (A's own
    // report on it was its oldest, so it made room; C's stays).
    assert!(held <= PER_CLIENT + 1.0, "bounded by A's cap: {held}");
    assert!(
        after.saturating_sub(before) <= 32 * 1024,
        "RSS grew by at most 32 MiB: {before} -> {after} KiB"
    );
    assert!(held >= PER_CLIENT, "A's newest reports are kept: {held}");
    assert!(
        !gets(api, a, "y", "site-9999.example").await,
        "A's newest report holds"
    );
    assert!(
        gets(api, a, "x", "site-0.example").await,
        "A's oldest made room"
    );
    assert!(
        gets(api, b, "y", "site-9999.example").await,
        "and it is A's alone"
    );
}
