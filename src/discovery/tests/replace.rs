//! `POST /v1/leases/{id}/replace`: the lease ends, its proxy is marked
//! and another is leased, within the breaker and the per-client limits.

use super::*;

/// A replacer that records what it was asked, its breaker open or not.
#[derive(Default)]
struct Recorded {
    open: std::sync::atomic::AtomicBool,
    asked: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl Replacer for Recorded {
    fn held(&self, provider: &str) -> Option<String> {
        self.open
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| format!("provider {provider}'s circuit breaker is open"))
    }

    async fn request(&self, key: &crate::lease::ProxyKey, value: &str) -> Result<(), String> {
        self.asked
            .lock()
            .unwrap()
            .push((key.to_string(), value.to_string()));
        Ok(())
    }
}

async fn replacing(replacer: Arc<Recorded>) -> Api {
    let tokens = [("crawler-a", "t0k"), ("crawler-b", "other")];
    let limits = (ClientLimits::default(), crate::server::DISCOVERY_LIMITS);
    let with = (Some(replacer as Arc<dyn Replacer>), None);
    Api::start_replacing(&tokens, 1, limits, Forwarder::alone(), with).await
}

#[tokio::test]
async fn a_replace_ends_the_lease_marks_the_proxy_and_leases_another() {
    let replacer = Arc::new(Recorded::default());
    let api = replacing(replacer.clone()).await;
    let (st, old) = api.json("POST", "/v1/leases", json!({})).await;
    assert_eq!(st, 201, "{old}");
    let id = old["id"].as_str().unwrap();
    let old_proxy = old["proxy"]["name"].as_str().unwrap().to_string();

    // Another client's id is unknown to this one: nothing is done.
    let path = format!("/v1/leases/{id}/replace");
    let (st, body) = api.call("POST", &path, Some("other"), None).await;
    assert_eq!((st, code(&body)), (404, "unknown_lease"), "{body}");
    assert!(replacer.asked.lock().unwrap().is_empty());

    let (st, new) = api.json("POST", &path, json!({})).await;
    assert_eq!(st, 201, "{new}");
    assert_ne!(new["proxy"]["name"], old_proxy.as_str(), "another proxy");
    assert_ne!(new["id"], old["id"]);
    let asked = replacer.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].0, format!("ns/{old_proxy}"));
    assert!(
        asked[0].1.contains("crawler-a"),
        "names the client: {asked:?}"
    );
    let (st, body) = api
        .call("GET", &format!("/v1/leases/{id}"), Some("t0k"), None)
        .await;
    assert_eq!(
        (st, code(&body)),
        (404, "unknown_lease"),
        "the old lease ended"
    );
    let (st, body) = api.json("POST", &path, json!({})).await;
    assert_eq!(
        (st, code(&body)),
        (404, "unknown_lease"),
        "a second replace of it"
    );
    assert!(api
        .metrics
        .encode()
        .unwrap()
        .contains("event=\"replace_requested\"} 1"));
    api.stop().await;
}

#[tokio::test]
async fn a_replace_answers_409_while_the_breaker_is_open_and_keeps_the_lease() {
    let replacer = Arc::new(Recorded::default());
    replacer
        .open
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let api = replacing(replacer.clone()).await;
    let (_, lease) = api.json("POST", "/v1/leases", json!({})).await;
    let id = lease["id"].as_str().unwrap();
    let (st, body) = api
        .json("POST", &format!("/v1/leases/{id}/replace"), json!({}))
        .await;
    assert_eq!((st, code(&body)), (409, "circuit_open"), "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("kubernetes"));
    assert_eq!(api.last_retry_after(), "30");
    assert!(replacer.asked.lock().unwrap().is_empty());
    let (st, _) = api
        .call("GET", &format!("/v1/leases/{id}"), Some("t0k"), None)
        .await;
    assert_eq!(st, 200, "the lease is kept");
    api.stop().await;
}

#[tokio::test]
async fn replaces_are_limited_per_client_and_409_when_no_other_proxy_is_free() {
    let replacer = Arc::new(Recorded::default());
    let api = replacing(replacer.clone()).await;
    let mut answers = Vec::new();
    for _ in 0..REPLACES_PER_WINDOW + 1 {
        // Two proxies, one lease each: release whatever the last replace
        // gave, lease again, replace that.
        api.leases.sweep();
        let (st, lease) = api.json("POST", "/v1/leases", json!({})).await;
        assert_eq!(st, 201, "{lease}");
        let id = lease["id"].as_str().unwrap().to_string();
        let (st, body) = api
            .json("POST", &format!("/v1/leases/{id}/replace"), json!({}))
            .await;
        answers.push((st, code(&body).to_string()));
        if let Some(new) = body["id"].as_str() {
            api.call("DELETE", &format!("/v1/leases/{new}"), Some("t0k"), None)
                .await;
        }
    }
    assert!(
        answers[..REPLACES_PER_WINDOW]
            .iter()
            .all(|(st, _)| *st == 201),
        "{answers:?}"
    );
    assert_eq!(
        answers[REPLACES_PER_WINDOW],
        (429, "rate_limited".to_string()),
        "the eleventh within a minute"
    );
    assert_eq!(replacer.asked.lock().unwrap().len(), REPLACES_PER_WINDOW);

    // crawler-a still holds the lease its eleventh ask kept; crawler-b
    // takes the other proxy and asks to replace it: the ask goes through,
    // but no other proxy is free: 409 no_capacity.
    let (st, mine) = api
        .call("POST", "/v1/leases", Some("other"), Some(b"{}".to_vec()))
        .await;
    assert_eq!(st, 201, "{mine}");
    let id = mine["id"].as_str().unwrap();
    let (st, body) = api
        .call(
            "POST",
            &format!("/v1/leases/{id}/replace"),
            Some("other"),
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!((st, code(&body)), (409, "no_capacity"), "{body}");
    api.leases.sweep();
    api.stop().await;
}
