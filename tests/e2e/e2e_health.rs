//! System test of the health engine and the discovery/lease API: the real
//! operator binary against the real test cluster, whose node agent runs
//! each Pod as a real Squid in its own network namespace on the 10.216
//! bridge; probes go through it to a target on the host's bridge address.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::{api_call as call, condition, eventually, phase, proxy, Ground, Operator};

use std::net::SocketAddr;
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TOKEN: &str = "s3cret-test-token";

/// Accepts connections and never answers.
async fn sink() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = l.accept().await {
            held.push(c);
        }
    });
    addr
}

fn healthy(p: &Proxy) -> Option<(String, String)> {
    condition(p, "Healthy").map(|c| (c.status.as_str().to_string(), c.reason.clone()))
}

/// The operator with the kubernetes provider, probing `target`, serving the
/// token-protected API on `api`, plus `extra` flags.
fn probing_operator(
    ground: &Ground,
    dir: &std::path::Path,
    target: SocketAddr,
    api: SocketAddr,
    extra: &[&str],
) -> Operator {
    let mut cmd = ground.operator(
        dir,
        &support::kubernetes_reaching("kubernetes", "", target.ip()),
    );
    cmd.args(["--discovery-bind-address", &api.to_string()])
        .args(["--default-probe-url", &format!("http://{target}/")])
        .args(["--default-probe-expected-status", "200"])
        .args(extra)
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("LOG_LEVEL", "info");
    Operator::spawn(cmd, &dir.join("operator.log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_proxies_are_listed_and_leased_sick_ones_never() {
    support::require_squid_pods();
    let ground = support::ground("health-leases").await;
    let ns = ground.ns.clone();
    // Squid in a Pod fetches the target: it listens on the bridge.
    let target = support::http_target_on(ground.host_ip()).await;
    let sink = sink().await;
    let dir = tempfile::tempdir().unwrap();
    let api_addr: SocketAddr = support::loopback();
    let metrics_addr: SocketAddr = support::loopback();
    let _op = probing_operator(
        &ground,
        dir.path(),
        target,
        api_addr,
        &[
            "--metrics-bind-address",
            &metrics_addr.to_string(),
            "--per-proxy-metrics",
        ],
    );
    let proxies: Api<Proxy> = ground.proxies();
    proxies
        .create(
            &PostParams::default(),
            &proxy(
                "good",
                json!({"provider": "kubernetes", "port": 3128, "attributes": {"geo": "home"}}),
            ),
        )
        .await
        .unwrap();
    proxies
        .create(
            &PostParams::default(),
            &proxy(
                "sink",
                json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": sink.port()},
                    "attributes": {"geo": "home"}, "healthCheck": {"timeoutSeconds": 1}}),
            ),
        )
        .await
        .unwrap();

    let started = std::time::Instant::now();
    let good = eventually(
        "good Ready and Healthy",
        Duration::from_secs(90),
        || async {
            let p = proxies.get("good").await.ok()?;
            (phase(&p) == Some("Ready") && healthy(&p)?.0 == "True").then_some(p)
        },
    )
    .await;
    println!("good Ready after {:?}", started.elapsed());
    let text = ground.kubectl(&["get", "px", "good"]);
    let row = text
        .lines()
        .find(|l| l.starts_with("good"))
        .unwrap_or_default()
        .to_string();
    assert!(
        row.contains("Ready") && row.contains("True"),
        "kubectl get px: {text}"
    );
    let st = good.status.clone().unwrap();
    assert_eq!(healthy(&good).unwrap().1, "ProbeSucceeded");
    assert!(
        st.latency_millis.is_some() && st.last_probe_time.is_some(),
        "{st:?}"
    );
    let ip = st.ip.clone().unwrap();
    let sick = eventually("sink Healthy=False", Duration::from_secs(30), || async {
        let p = proxies.get("sink").await.ok()?;
        (healthy(&p)?.0 == "False").then_some(p)
    })
    .await;
    assert_eq!(phase(&sick), Some("Running"));
    assert_eq!(healthy(&sick).unwrap().1, "ProbeFailed");

    // Auth.
    for token in [None, Some("wrong")] {
        let (s, v) = call(api_addr, "GET", "/v1/proxies", token, vec![]).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (401, Some("unauthorized"))
        );
    }
    assert_eq!(call(api_addr, "GET", "/healthz", None, vec![]).await.0, 200);

    // Only the healthy proxy is listed.
    let (s, list) = call(
        api_addr,
        "GET",
        "/v1/proxies?attr=geo:home",
        Some(TOKEN),
        vec![],
    )
    .await;
    assert_eq!(s, 200, "{list}");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["name"], "good");
    assert_eq!(items[0]["ip"], ip.as_str());
    assert_eq!(items[0]["port"], 3128);

    // Bad requests are JSON 4xx.
    let big = vec![b' '; 64 * 1024 + 10];
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "malformed_json"),
        (
            br#"{"ttlSeconds": 60, "colour": "red"}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (br#"{"ttlSeconds": -5}"#.to_vec(), 400, "invalid_ttl"),
        (br#"{"ttlSeconds": 86400000}"#.to_vec(), 400, "invalid_ttl"),
        (big, 413, "payload_too_large"),
    ];
    for (body, want, code) in cases {
        let (s, v) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), body).await;
        assert_eq!((s, v["error"]["code"].as_str()), (want, Some(code)), "{v}");
    }

    // A lease lands on the healthy proxy; the sick one is never leased.
    let (s, lease) = call(
        api_addr,
        "POST",
        "/v1/leases",
        Some(TOKEN),
        br#"{"ttlSeconds": 120, "filters": {"attributes": {"geo": "home"}}}"#.to_vec(),
    )
    .await;
    assert_eq!(s, 201, "{lease}");
    assert_eq!(lease["proxy"]["name"], "good");
    let (s, v) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("no_capacity")),
        "{v}"
    );

    // The leased proxy carries a request to the local server, with the
    // credentials the lease hands out (issue 33).
    let paddr = format!(
        "{}:{}",
        lease["proxy"]["ip"].as_str().unwrap(),
        lease["proxy"]["port"]
    );
    let pair = format!(
        "{}:{}",
        lease["proxy"]["username"].as_str().unwrap(),
        lease["proxy"]["password"].as_str().unwrap()
    );
    let auth = data_encoding::BASE64.encode(pair.as_bytes());
    let mut c = tokio::net::TcpStream::connect(&paddr).await.unwrap();
    c.write_all(
        format!("GET http://{target}/page HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut resp = String::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut resp))
        .await
        .unwrap()
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("hello from target"), "{resp}");

    // Released once; again, it names no live lease: 404. Then the proxy
    // can be leased again.
    let id = lease["id"].as_str().unwrap();
    for want in [204, 404] {
        let (s, _) = call(
            api_addr,
            "DELETE",
            &format!("/v1/leases/{id}"),
            Some(TOKEN),
            vec![],
        )
        .await;
        assert_eq!(s, want);
    }
    let (s, _) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![]).await;
    assert_eq!(s, 201);

    // Fleet-wide probe series by provider and namespace; with
    // --per-proxy-metrics, per-proxy ones too, which go away with the Proxy.
    let scrape = || async {
        let (_, v) = call(metrics_addr, "GET", "/metrics", None, vec![]).await;
        v.as_str().unwrap_or_default().to_string()
    };
    let text = scrape().await;
    for series in [
        format!("proxy_operator_healthcheck_duration_seconds_count{{provider=\"kubernetes\",proxy_namespace=\"{ns}\"}}"),
        format!("proxy_operator_healthcheck_failures_total{{provider=\"\",proxy_namespace=\"{ns}\",reason=\"timeout\"}}"),
        format!("proxy_operator_proxy_healthcheck_duration_seconds_count{{proxy=\"{ns}/good\"}}"),
        format!("proxy_operator_proxy_healthcheck_failures_total{{proxy=\"{ns}/sink\",reason=\"timeout\"}}"),
    ] {
        assert!(text.contains(&series), "{series} missing: {text}");
    }
    assert!(text.contains("proxy_operator_leases_active 1"), "{text}");
    proxies
        .delete("sink", &DeleteParams::default())
        .await
        .unwrap();
    eventually("sink series removed", Duration::from_secs(15), || async {
        (!scrape().await.contains(&format!("{ns}/sink"))).then_some(())
    })
    .await;
    let (s, doc) = call(api_addr, "GET", "/openapi.json", None, vec![]).await;
    assert_eq!(s, 200);
    assert!(doc["paths"]["/v1/leases"].is_object());
}

/// A bare Pod that the node agent runs as a real Squid with `conf` (the
/// way the kubernetes provider's Pods run it: the conf from `SQUID_CONF`
/// written to an emptyDir /tmp); returns the Pod's IP.
async fn squid_pod(pods: &Api<Pod>, name: &str, conf: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [{"name": "squid",
                "image": egress_proxies_operator::config::DEFAULT_SQUID_IMAGE,
                "command": ["/bin/sh", "-c",
                    "printf '%s' \"$SQUID_CONF\" > /tmp/squid.conf && exec squid -N -f /tmp/squid.conf"],
                "ports": [{"containerPort": 3128}],
                "env": [{"name": "SQUID_CONF", "value": conf}],
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
            "volumes": [{"name": "tmp", "emptyDir": {}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually(
        &format!("{name} Running"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(name).await.ok()?;
            let st = p.status?;
            (st.phase.as_deref() == Some("Running")).then_some(st.pod_ip?)
        },
    )
    .await
}

/// Sick proxies (a Squid that denies all egress, a TCP sink) are never
/// listed or leased and come back once fixed; a reported lease cools its
/// proxy down, and a lease expires by its TTL, in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sick_proxies_recover_and_leases_cool_down_and_expire() {
    support::require_squid_pods();
    let ground = support::ground("health-sick").await;
    let target = support::http_target_on(ground.host_ip()).await;
    let sink = sink().await;
    let dir = tempfile::tempdir().unwrap();
    let api_addr: SocketAddr = support::loopback();
    // The Squid Pods below are External Proxies on the Pods' network, a
    // private range denied by default: opened, as an office's would be.
    let pods_net = format!("{}/16", ground.host_ip());
    let _op = probing_operator(
        &ground,
        dir.path(),
        target,
        api_addr,
        &["--lease-cooldown", "2s", "--probe-allow-cidrs", &pods_net],
    );
    let proxies: Api<Proxy> = ground.proxies();
    let pods: Api<Pod> = ground.api();

    // The provider's own Squid config, once denying all egress and once as
    // it is with the probe target allowed (the host's bridge address is
    // private, denied by default).
    let conf = egress_proxies_operator::provider::kubernetes::squid_conf(
        3128,
        &egress_proxies_operator::config::Destinations {
            allow: vec![target.ip().to_string()],
            ..Default::default()
        }
        .rules()
        .unwrap(),
        false,
    );
    let denying = squid_pod(
        &pods,
        "squid-deny",
        &format!("http_access deny all\n{conf}"),
    )
    .await;
    let working = squid_pod(&pods, "squid-ok", &conf).await;
    let external = |host: &str, port: u16| json!({"mode": "External", "endpoint": {"host": host, "port": port}, "healthCheck": {"timeoutSeconds": 1}});
    proxies
        .create(
            &PostParams::default(),
            &proxy("deny", external(&denying, 3128)),
        )
        .await
        .unwrap();
    proxies
        .create(
            &PostParams::default(),
            &proxy("sink", external("127.0.0.1", sink.port())),
        )
        .await
        .unwrap();
    for name in ["deny", "sink"] {
        eventually(
            &format!("{name} Healthy=False"),
            Duration::from_secs(30),
            || async { (healthy(&proxies.get(name).await.ok()?)?.0 == "False").then_some(()) },
        )
        .await;
    }
    let (s, list) = call(api_addr, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
    assert_eq!(s, 200);
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        0,
        "sick proxies are not listed: {list}"
    );
    let (s, v) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![]).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("no_proxy")),
        "{v}"
    );

    // Fixing them brings them back.
    for name in ["deny", "sink"] {
        proxies
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"endpoint": {"host": working, "port": 3128}}})),
            )
            .await
            .unwrap();
    }
    for name in ["deny", "sink"] {
        eventually(
            &format!("{name} Ready after the fix"),
            Duration::from_secs(30),
            || async {
                let p = proxies.get(name).await.ok()?;
                (phase(&p) == Some("Ready") && healthy(&p)?.0 == "True").then_some(())
            },
        )
        .await;
    }
    proxies
        .delete("sink", &DeleteParams::default())
        .await
        .unwrap();
    eventually("one proxy listed", Duration::from_secs(15), || async {
        let (_, list) = call(api_addr, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
        (list["items"].as_array()?.len() == 1).then_some(())
    })
    .await;

    // Report -> cooldown -> 409 -> leasable again once it runs out.
    let (s, lease) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![]).await;
    assert_eq!(s, 201, "{lease}");
    let id = lease["id"].as_str().unwrap().to_string();
    let (s, v) = call(
        api_addr,
        "POST",
        &format!("/v1/leases/{id}/report"),
        Some(TOKEN),
        br#"{"result": "blocked"}"#.to_vec(),
    )
    .await;
    assert!(s < 300, "report: {s} {v}");
    assert_eq!(
        call(
            api_addr,
            "DELETE",
            &format!("/v1/leases/{id}"),
            Some(TOKEN),
            vec![]
        )
        .await
        .0,
        204
    );
    let (s, v) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![]).await;
    assert_eq!(s, 409, "cooling down: {v}");
    let (s, lease) = eventually(
        "leasable after the cooldown",
        Duration::from_secs(15),
        || async {
            let r = call(
                api_addr,
                "POST",
                "/v1/leases",
                Some(TOKEN),
                br#"{"ttlSeconds": 1}"#.to_vec(),
            )
            .await;
            (r.0 == 201).then_some(r)
        },
    )
    .await;
    assert_eq!((s, lease["proxy"]["name"].as_str()), (201, Some("deny")));

    // The 1 s lease is never released: it expires and frees the capacity.
    let (s, v) = call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![]).await;
    assert_eq!(s, 409, "held until it expires: {v}");
    eventually("the lease expired", Duration::from_secs(15), || async {
        (call(api_addr, "POST", "/v1/leases", Some(TOKEN), vec![])
            .await
            .0
            == 201)
            .then_some(())
    })
    .await;
}

/// A "proxy" that counts the connections it gets and answers each request
/// 200: healthy as soon as it is probed.
async fn counting_proxy() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = support::read_head(&mut c).await;
                let _ = c
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (addr, count)
}

/// Issue 17: an External Proxy in a namespace `--external-proxy-namespaces`
/// does not list says so in its status (the field, the namespace, the
/// flag), is never dialled and never offered by the discovery API; the
/// same Proxy under an operator that allows its namespace (the default:
/// the operator's own) is probed, Ready and listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_proxy_in_a_namespace_not_allowed_is_never_dialled_nor_listed() {
    use std::sync::atomic::Ordering;
    let ground = support::ground("ext-allow").await;
    let (endpoint, dialled) = counting_proxy().await;
    let dir = tempfile::tempdir().unwrap();
    let api_addr: SocketAddr = support::loopback();
    let op = probing_operator(
        &ground,
        dir.path(),
        endpoint,
        api_addr,
        &["--external-proxy-namespaces", "crawl-only"],
    );
    let proxies: Api<Proxy> = ground.proxies();
    proxies
        .create(
            &PostParams::default(),
            &proxy(
                "outsider",
                json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": endpoint.port()}}),
            ),
        )
        .await
        .unwrap();
    let refused = eventually(
        "outsider refused in its status",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("outsider").await.ok()?;
            let c = condition(&p, "Provisioned")?;
            (c.reason == "ExternalNotAllowed").then_some((p.clone(), c.message.clone()))
        },
    )
    .await;
    let (p, message) = refused;
    assert_eq!(phase(&p), Some("Failed"));
    assert!(
        message.starts_with("spec.mode:")
            && message.contains(&format!("{:?}", ground.ns))
            && message.contains("--external-proxy-namespaces allows: crawl-only"),
        "{message}"
    );
    assert_eq!(p.status.as_ref().and_then(|s| s.ip.clone()), None);
    // Nothing announces "not probed", so give the engine several of its
    // 1 s sync-and-probe rounds to do it wrongly.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (s, list) = call(api_addr, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
        assert_eq!(
            (s, list["items"].as_array().map(Vec::len)),
            (200, Some(0)),
            "{list}"
        );
    }
    assert_eq!(
        dialled.load(Ordering::SeqCst),
        0,
        "the refused endpoint was dialled"
    );
    drop(op);

    // The default allowlist is the operator's namespace, this one.
    let _op = probing_operator(&ground, dir.path(), endpoint, api_addr, &[]);
    let listed = eventually(
        "outsider listed once allowed",
        Duration::from_secs(60),
        || async {
            // The new operator's API may not listen yet.
            tokio::net::TcpStream::connect(api_addr).await.ok()?;
            let (s, list) = call(api_addr, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
            (s == 200 && list["items"].as_array().is_some_and(|i| i.len() == 1)).then_some(list)
        },
    )
    .await;
    assert_eq!(listed["items"][0]["name"], "outsider");
    assert!(dialled.load(Ordering::SeqCst) > 0);
    let p = proxies.get("outsider").await.unwrap();
    assert_eq!(phase(&p), Some("Ready"));
    assert!(
        condition(&p, "Provisioned").is_none(),
        "the refusal is gone"
    );
}
