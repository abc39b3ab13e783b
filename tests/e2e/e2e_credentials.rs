//! Issue 33: no open proxies. A Proxy on the kubernetes provider gets its
//! own credentials Secret; its Squid Pod (the host's Squid, in the Pod's
//! network namespace) answers 407 to a request without them, from the host
//! and from a Pod in another namespace, and 204 with the credentials its
//! lease hands out (real curl both ways). The operator's own probes
//! authenticate (the Proxy turns Ready). A deleted credentials Secret is
//! put back with new credentials, which the Pod takes. `auth.mode: None`
//! keeps a proxy open to the cluster's private ranges, as before. An
//! External Proxy naming a missing credentials Secret says so.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::{api_call, curl_status, eventually, phase, Ground, Operator};

use std::net::SocketAddr;
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

const TOKEN: &str = "creds-token";

/// An HTTP server on `ip` answering every request `204 No Content` (what
/// the default probe URL answers), for as long as the test's runtime.
async fn no_content_target(ip: std::net::IpAddr) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = c
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    addr
}

/// Runs curl in a Pod of `ground`'s namespace (the node agent runs it with
/// the host's curl in the Pod's own network namespace) and returns the
/// status it printed.
async fn curl_from_pod(ground: &Ground, proxy: &str, target: SocketAddr) -> String {
    let pods: Api<Pod> = ground.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "crawler"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "curl",
                "image": egress_proxies_operator::config::DEFAULT_SQUID_IMAGE,
                "command": ["/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                    "--max-time", "10", "-x", proxy, format!("http://{target}/")],
            }],
        },
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    let node = eventually("the crawler Pod done", Duration::from_secs(60), || async {
        let p = pods.get("crawler").await.ok()?;
        let done = matches!(
            p.status?.phase.as_deref(),
            Some("Succeeded") | Some("Failed")
        );
        done.then_some(p.spec?.node_name?)
    })
    .await;
    // The node agent's layout: <nodes>/<node>/pods/<ns>_<name>_<uid>/<container>.log.
    let nodes = &support::cluster().info().expect("a local cluster").pods_dir;
    let log = nodes
        .join(node)
        .join("pods")
        .join(format!("{}_crawler_{uid}", ground.ns))
        .join("curl.log");
    std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()))
}

fn secret_text(s: &Secret, key: &str) -> String {
    String::from_utf8(s.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_proxy_asks_for_the_credentials_its_lease_hands_out() {
    support::require_squid_pods();
    let ground = support::ground("creds").await;
    let other = support::ground("creds-other").await;
    let target = no_content_target(ground.host_ip()).await;
    let page = format!("http://{target}/");
    let api: SocketAddr = support::loopback();
    let dir = tempfile::tempdir().unwrap();
    let providers = support::kubernetes_reaching("kubernetes", "", target.ip());
    let mut cmd = ground.discovery_operator(dir.path(), &providers, api, TOKEN);
    cmd.args(["--default-probe-url", &page])
        .args(["--default-probe-expected-status", "204"]);
    let _op = Operator::spawn(cmd, &dir.path().join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    let secrets: Api<Secret> = ground.api();
    for (name, spec) in [
        (
            "guarded",
            json!({"provider": "kubernetes", "port": 3128, "attributes": {"which": "guarded"}}),
        ),
        (
            "open",
            json!({"provider": "kubernetes", "port": 3128, "auth": {"mode": "None"}}),
        ),
    ] {
        proxies
            .create(&PostParams::default(), &support::proxy(name, spec))
            .await
            .unwrap();
    }
    // Ready: the operator's probes went through with the credentials.
    let ready = |name: &'static str| {
        let proxies = proxies.clone();
        async move {
            eventually(
                &format!("{name} Ready"),
                Duration::from_secs(90),
                || async {
                    let p = proxies.get(name).await.ok()?;
                    (phase(&p) == Some("Ready")).then_some(p)
                },
            )
            .await
        }
    };
    let guarded = ready("guarded").await;
    let open = ready("open").await;
    let st = guarded.status.clone().unwrap();
    let secret_name = st
        .credentials_secret
        .clone()
        .expect("status names the Secret");
    let secret = secrets.get(&secret_name).await.unwrap();
    let owner = &secret.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Proxy", "guarded")
    );
    let (user, password) = (
        secret_text(&secret, "username"),
        secret_text(&secret, "password"),
    );
    assert!(password.len() >= 32, "a long random password");
    assert_eq!(open.status.as_ref().unwrap().credentials_secret, None);
    let address = format!("{}:{}", st.ip.unwrap(), st.port.unwrap());

    // The lease hands out the credentials, in the URL and apart.
    let (code, lease) = api_call(
        api,
        "POST",
        "/v1/leases",
        Some(TOKEN),
        json!({"ttlSeconds": 60, "filters": {"attributes": {"which": "guarded"}}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(code, 201, "{lease}");
    let leased = &lease["proxy"];
    assert_eq!(leased["name"], "guarded");
    // The list shows every token the proxy, never its password.
    let listed = lease_for(api, "guarded").await;
    assert_eq!(listed["url"], Value::from(format!("http://{address}")));
    assert_eq!(listed["username"], Value::from(user.clone()));
    assert!(listed.get("password").is_none(), "{listed}");
    assert_eq!(leased["username"], Value::from(user.clone()));
    assert_eq!(leased["password"], Value::from(password.clone()));
    let url = leased["url"].as_str().unwrap().to_string();
    assert_eq!(url, format!("http://{user}:{password}@{address}"));

    // Real curl: 407 without credentials or with a wrong password, 204
    // with the lease's.
    assert_eq!(curl_status(&format!("http://{address}"), &page), "407");
    assert_eq!(
        curl_status(&format!("http://{user}:wrong@{address}"), &page),
        "407"
    );
    assert_eq!(curl_status(&url, &page), "204");
    // A Pod in another namespace without them: 407.
    assert_eq!(
        curl_from_pod(&other, &format!("http://{address}"), target).await,
        "407"
    );
    // The open proxy takes anyone in the cluster's private ranges.
    let o = open.status.unwrap();
    let open_address = format!("{}:{}", o.ip.unwrap(), o.port.unwrap());
    assert_eq!(curl_status(&format!("http://{open_address}"), &page), "204");
    let open_item = lease_for(api, "open").await;
    assert!(open_item.get("password").is_none(), "{open_item}");

    // The Secret deleted: the next reconcile (an edit triggers one) puts
    // it back with new credentials, and the Pod's mounted copy takes them.
    secrets
        .delete(&secret_name, &DeleteParams::default())
        .await
        .unwrap();
    proxies
        .patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"attributes": {"edited": "yes"}}})),
        )
        .await
        .unwrap();
    let renewed = eventually("the Secret back", Duration::from_secs(60), || async {
        let s = secrets.get_opt(&secret_name).await.ok()??;
        (secret_text(&s, "password") != password).then_some(s)
    })
    .await;
    let new_url = format!(
        "http://{}:{}@{address}",
        secret_text(&renewed, "username"),
        secret_text(&renewed, "password")
    );
    eventually(
        "the new credentials work",
        Duration::from_secs(90),
        || async { (curl_status(&new_url, &page) == "204").then_some(()) },
    )
    .await;

    // An External Proxy naming a credentials Secret that does not exist
    // says so in its status, naming the field and the Secret; once the
    // labelled Secret exists, that condition goes.
    let external = json!({"mode": "External", "endpoint": {"host": "proxy.example.net", "port": 3128},
        "auth": {"secretRef": {"name": "ext-creds"}}});
    proxies
        .create(&PostParams::default(), &support::proxy("ext", external))
        .await
        .unwrap();
    let refused = eventually(
        "the External Proxy refused",
        Duration::from_secs(30),
        || async {
            let p = proxies.get("ext").await.ok()?;
            let c = support::condition(&p, "Provisioned")?;
            (c.reason == "CredentialsUnavailable").then(|| c.message.clone())
        },
    )
    .await;
    assert!(
        refused.contains("spec.auth.secretRef") && refused.contains("\"ext-creds\""),
        "{refused}"
    );
    let labelled: Secret = serde_json::from_value(json!({
        "metadata": {"name": "ext-creds", "labels": {"crawl.example.com/proxy-credentials": "true"}},
        "stringData": {"username": "crawler", "password": "from-the-vendor"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &labelled)
        .await
        .unwrap();
    eventually("the refusal gone", Duration::from_secs(60), || async {
        let p = proxies.get("ext").await.ok()?;
        let reason = support::condition(&p, "Provisioned").map(|c| c.reason.clone());
        (reason.as_deref() != Some("CredentialsUnavailable")).then_some(())
    })
    .await;
    drop(dir);
}

/// The discovery API's item for Proxy `name` (from `GET /v1/proxies`).
async fn lease_for(api: SocketAddr, name: &str) -> Value {
    let (code, list) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), Vec::new()).await;
    assert_eq!(code, 200, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}
