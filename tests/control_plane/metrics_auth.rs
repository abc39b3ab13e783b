//! Secure `/metrics` on the real API server, as a cluster runs it: the
//! operator under its shipped RBAC (a token of its ServiceAccount), serving
//! HTTPS with a self-signed certificate; a ServiceAccount bound to the
//! shipped metrics-reader ClusterRole scrapes, any other token gets 403, no
//! token or a made-up one 401; repeat scrapes cost no API call.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{self, eventually, Operator};
use support::shipped::{apply_rbac, token_kubeconfig};

const NS: &str = "egress-proxies-operator-system";
const SA: &str = "egress-proxies-operator-controller-manager";
const READER_ROLE: &str = "egress-proxies-operator-metrics-reader";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_reader_token_scrapes_and_any_other_token_gets_403() {
    let ground = support::ground_without_pods("metrics-auth").await;
    let c = ground.cluster;
    let docs = support::kustomize("config/default");
    apply_rbac(c, &docs);
    let manager = c.kubectl_ok(&["create", "token", SA, "-n", NS]);
    for sa in ["reader", "other"] {
        ground.kubectl(&["create", "serviceaccount", sa]);
    }
    c.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &format!("{}-metrics-reader", ground.ns),
        &format!("--clusterrole={READER_ROLE}"),
        &format!("--serviceaccount={}:reader", ground.ns),
    ]);
    let reader = ground.kubectl(&["create", "token", "reader"]);
    let other = ground.kubectl(&["create", "token", "other"]);

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("manager.kubeconfig");
    std::fs::write(&kubeconfig, token_kubeconfig(c, manager.trim())).unwrap();
    let addr: SocketAddr = support::loopback();
    let mut cmd = ground.operator(
        dir.path(),
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
    );
    // The default, restated: support::operator serves plain metrics.
    cmd.args(["--metrics-secure=true", "--metrics-bind-address"])
        .arg(addr.to_string())
        .env("KUBECONFIG", &kubeconfig);
    let log = dir.path().join("operator.log");
    let _op = Operator::spawn(cmd, &log);

    let (_, body) = eventually(
        "a metrics-reader token scraping /metrics",
        Duration::from_secs(60),
        || async {
            let (status, body) = support::https_get(addr, "/metrics", Some(reader.trim()));
            (status == 200).then_some((status, body))
        },
    )
    .await;
    assert!(body.contains("# TYPE proxy_operator_"), "{body}");
    // Scraped again and again with the same token: served from the verdict
    // cache, no further TokenReview (the audit log has every request).
    let manager_user = format!("system:serviceaccount:{NS}:{SA}");
    let reviews = || {
        c.audit_events()
            .iter()
            .filter(|e| {
                e["user"]["username"] == manager_user.as_str()
                    && e["objectRef"]["resource"] == "tokenreviews"
            })
            .count()
    };
    let before = reviews();
    assert!(
        before > 0,
        "the first scrape was reviewed by the API server"
    );
    for _ in 0..5 {
        let (status, _) = support::https_get(addr, "/metrics", Some(reader.trim()));
        assert_eq!(status, 200);
    }
    println!(
        "TokenReview audit events for 5 more scrapes with one token: {}",
        reviews() - before
    );
    assert_eq!(
        reviews(),
        before,
        "repeat scrapes are answered from the cache"
    );

    let (status, body) = support::https_get(addr, "/metrics", Some(other.trim()));
    assert_eq!(status, 403, "{body}");
    let who = format!("system:serviceaccount:{}:other", ground.ns);
    assert!(body.contains(&who), "the refusal names the user: {body}");
    assert!(!body.contains("proxy_operator_"), "{body}");

    for token in [None, Some("made-up-token")] {
        let (status, body) = support::https_get(addr, "/metrics", token);
        assert_eq!(status, 401, "{token:?}: {body}");
        assert!(!body.contains("proxy_operator_"), "{body}");
    }

    let text = std::fs::read_to_string(&log).unwrap();
    for secret in [reader.trim(), other.trim(), manager.trim()] {
        assert!(!text.contains(secret), "a token reached the log");
    }
}
