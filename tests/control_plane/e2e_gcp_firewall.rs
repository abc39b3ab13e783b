//! Issue 33: the gcp provider manages the firewall. With `gcp.firewall`
//! set, two Proxies on one port make exactly one firewall rule at the
//! Compute stand-in (the configured source ranges, the instances' network
//! tag, TCP on that port), a Proxy with `auth.mode: None` behind ranges that
//! admit everyone is refused naming the field, and once the last Proxy on
//! the port is gone, GC's sweep deletes the rule. The real operator binary,
//! the real test API server (no nodes), the real Compute client.
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::gcp_standin;
use crate::support;

use support::{eventually, phase, Operator};

use std::time::Duration;

use crate::e2e_create_limits::{gcp_proxy, reason};
use egress_proxies_operator::api::Proxy;
use gcp_standin::StandIn;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_port_make_one_rule_which_goes_with_the_last() {
    let ground = support::ground_without_pods("gcp-fw").await;
    let standin = StandIn::start_for(Duration::from_secs(300)).await;
    standin.with(|st| st.running_after_gets = 1);
    let dir = tempfile::tempdir().unwrap();
    let providers = format!(
        "{}      firewall:\n        allowedSourceRanges: [\"203.0.113.0/24\", \"0.0.0.0/0\"]\n",
        standin.providers_yaml()
    );
    let mut cmd = ground.operator(dir.path(), &providers);
    // GC sweeps often, and collects nothing young: only the rule is at
    // stake here.
    cmd.args(["--gc-interval", "2s", "--provider-list-interval", "2s"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    for n in ["a", "b"] {
        proxies
            .create(&PostParams::default(), &gcp_proxy(n))
            .await
            .unwrap();
    }
    eventually("both Running", Duration::from_secs(60), || async {
        let list = proxies.list(&Default::default()).await.ok()?;
        (list.items.len() == 2 && list.items.iter().all(|p| phase(p) == Some("Running")))
            .then_some(())
    })
    .await;
    assert_eq!(standin.calls_of("fw.insert"), 1, "one rule for one port");
    let rules = standin.firewalls();
    assert_eq!(rules.len(), 1, "{rules:?}");
    let rule = &rules[0];
    assert_eq!(rule["sourceRanges"], json!(["203.0.113.0/24", "0.0.0.0/0"]));
    assert_eq!(rule["targetTags"], json!(["egress-proxy"]));
    assert_eq!(rule["direction"], "INGRESS");
    assert_eq!(
        rule["allowed"],
        json!([{"IPProtocol": "tcp", "ports": ["3128"]}])
    );
    println!("the rule: {rule}");

    // No credentials behind ranges that admit everyone: refused, naming
    // the field, before any insert.
    let mut open = gcp_proxy("open");
    open.spec.auth = Some(serde_json::from_value(json!({"mode": "None"})).unwrap());
    proxies.create(&PostParams::default(), &open).await.unwrap();
    let refused = eventually(
        "the open Proxy refused",
        Duration::from_secs(30),
        || async {
            let p = proxies.get("open").await.ok()?;
            (reason(&p).as_deref() == Some("PermanentError")).then(|| {
                support::condition(&p, "Provisioned")
                    .map(|c| c.message.clone())
                    .unwrap_or_default()
            })
        },
    )
    .await;
    assert!(
        refused.contains("spec.auth.mode None") && refused.contains("allowedSourceRanges"),
        "{refused}"
    );
    assert_eq!(
        standin.calls_of("insert"),
        2,
        "the open Proxy made no instance"
    );

    // The rule stays while one Proxy is left on the port, and goes with
    // the last.
    for n in ["open", "a"] {
        proxies.delete(n, &DeleteParams::default()).await.unwrap();
    }
    eventually("a gone", Duration::from_secs(60), || async {
        proxies.get_opt("a").await.ok()?.is_none().then_some(())
    })
    .await;
    let listings = standin.calls("list", "").len();
    eventually(
        "two sweeps after a went",
        Duration::from_secs(30),
        || async { (standin.calls("list", "").len() >= listings + 2).then_some(()) },
    )
    .await;
    assert_eq!(standin.calls_of("fw.delete"), 0, "b still serves on 3128");
    proxies.delete("b", &DeleteParams::default()).await.unwrap();
    eventually("the rule deleted", Duration::from_secs(60), || async {
        (standin.calls_of("fw.delete") == 1 && standin.firewalls().is_empty()).then_some(())
    })
    .await;
    assert_eq!(standin.calls_of("fw.insert"), 1);
    drop(dir);
}
