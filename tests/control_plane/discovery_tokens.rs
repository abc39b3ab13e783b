//! Named discovery tokens from a Secret, edited while the real operator
//! binary serves the API on the real API server: new clients get in, removed
//! ones and old values get 401, and a broken edit is refused while the last
//! good set stays in force, all without a restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};

use crate::support::{self, api_call, eventually, Operator};

const SECRET: &str = "discovery-tokens";
const WAIT: Duration = Duration::from_secs(30);

fn secret(keys: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            ..Default::default()
        },
        string_data: Some(
            keys.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

/// The status of listing proxies with `token`.
async fn status(api: SocketAddr, token: &str) -> u16 {
    api_call(api, "GET", "/v1/proxies", Some(token), vec![])
        .await
        .0
}

/// Waits until every (token, status) pair holds at once.
async fn until(api: SocketAddr, what: &str, want: &[(&str, u16)]) {
    eventually(what, WAIT, || async {
        for (token, code) in want {
            if status(api, token).await != *code {
                return None;
            }
        }
        Some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_secret_edits_take_effect_without_a_restart() {
    let ground = support::ground_without_pods("tokens").await;
    let secrets = ground.api::<Secret>();
    let api: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret(&[("crawler-a", "token-a-1"), ("crawler-b", "token-b-1")]),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ground.operator(dir.path(), "providers: []\n");
    cmd.args(["--discovery-bind-address", &api.to_string()])
        .args(["--metrics-bind-address", &metrics.to_string()])
        .args(["--discovery-tokens-secret", SECRET])
        // The request lines are DEBUG; this is the directive the
        // configuration reference gives for them.
        .env("LOG_LEVEL", "info,egress_proxies_operator::discovery=debug");
    let log = dir.path().join("operator.log");
    let _op = Operator::spawn(cmd, &log);
    eventually("the discovery API listening", WAIT, || async {
        tokio::net::TcpStream::connect(api).await.ok()
    })
    .await;

    until(
        api,
        "both clients of the Secret admitted",
        &[("token-a-1", 200), ("token-b-1", 200), ("made-up", 401)],
    )
    .await;

    let replace = |keys: &'static [(&'static str, &'static str)]| {
        let secrets = secrets.clone();
        async move {
            let mut s = secrets.get(SECRET).await.unwrap();
            s.data = None;
            s.string_data = secret(keys).string_data;
            secrets
                .replace(SECRET, &PostParams::default(), &s)
                .await
                .unwrap();
        }
    };
    replace(&[
        ("crawler-a", "token-a-1"),
        ("crawler-b", "token-b-1"),
        ("crawler-c", "token-c-1"),
    ])
    .await;
    until(
        api,
        "a third client added",
        &[("token-a-1", 200), ("token-b-1", 200), ("token-c-1", 200)],
    )
    .await;

    replace(&[("crawler-a", "token-a-1"), ("crawler-c", "token-c-1")]).await;
    until(
        api,
        "crawler-b removed",
        &[("token-b-1", 401), ("token-a-1", 200), ("token-c-1", 200)],
    )
    .await;

    replace(&[("crawler-a", "token-a-2"), ("crawler-c", "token-c-1")]).await;
    until(
        api,
        "crawler-a's token changed",
        &[("token-a-1", 401), ("token-a-2", 200), ("token-c-1", 200)],
    )
    .await;

    // Broken: an empty value and a key that is no client name. Refused
    // whole: the last good set answers as before.
    replace(&[
        ("crawler-a", "token-a-3"),
        ("crawler-c", ""),
        ("Crawler_D", "token-d-1"),
    ])
    .await;
    eventually("the broken edit refused and counted", WAIT, || async {
        let n = support::leader::scraped(
            metrics,
            "proxy_operator_discovery_token_reload_failures_total",
        )
        .await?;
        (n >= 1.0).then_some(())
    })
    .await;
    for (token, code) in [
        ("token-a-2", 200),
        ("token-c-1", 200),
        ("token-a-3", 401),
        ("token-d-1", 401),
    ] {
        assert_eq!(
            status(api, token).await,
            code,
            "{token} after the broken edit"
        );
    }
    let successful = support::leader::scraped(
        metrics,
        "proxy_operator_discovery_tokens_last_reload_successful",
    )
    .await;
    assert_eq!(successful, Some(0.0));

    // Fixed: in force again.
    replace(&[("crawler-a", "token-a-3"), ("crawler-c", "token-c-1")]).await;
    until(
        api,
        "the fixed edit in force",
        &[("token-a-3", 200), ("token-a-2", 401), ("token-c-1", 200)],
    )
    .await;

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("Discovery tokens reloaded"),
        "reloads are logged: {text}"
    );
    let refusal = text
        .lines()
        .find(|l| l.contains("Refused the discovery tokens Secret"))
        .unwrap_or_else(|| panic!("no refusal logged: {text}"));
    assert!(
        refusal.contains("crawler-c") || refusal.contains("Crawler_D"),
        "the refusal names the key: {refusal}"
    );
    // The token's name is the client in the request log.
    assert!(
        text.lines()
            .any(|l| l.contains("/v1/proxies") && l.contains("crawler-c")),
        "request lines name the client: {text}"
    );
    for secret in [
        "token-a-1",
        "token-a-2",
        "token-a-3",
        "token-b-1",
        "token-c-1",
        "token-d-1",
    ] {
        assert!(!text.contains(secret), "a token reached the log");
    }
}
