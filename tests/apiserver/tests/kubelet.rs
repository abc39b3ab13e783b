//! The kubelet runs real squid for Pods with SQUID_CONF (skipped without squid).

mod common;

use common::within;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use test_apiserver::{Options, TestApiServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn have_squid() -> bool {
    if Path::new(test_apiserver::kubelet::SQUID).exists() {
        return true;
    }
    println!("SKIP: {} is absent", test_apiserver::kubelet::SQUID);
    false
}

/// A one-route HTTP origin on 127.0.0.1 answering `body`.
async fn origin(body: &'static str) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    addr
}

fn pod(name: &str, conf: Option<&str>) -> Pod {
    let mut c = json!({"name": "squid", "image": "squid", "ports": [{"containerPort": 3128}]});
    if let Some(conf) = conf {
        c["env"] = json!([{"name": "SQUID_CONF", "value": conf}]);
    }
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"containers": [c]}}))
    .unwrap()
}

/// Whether any process's command line mentions `needle`.
fn process_running(needle: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // Zombies (state Z) are not running.
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'));
        !zombie && String::from_utf8_lossy(&cmd).contains(needle)
    })
}

async fn get_through_proxy(proxy: SocketAddr, target: SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let req = format!(
        "GET http://{target}/hello HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_runs_squid_for_pods_with_squid_conf() {
    if !have_squid() {
        return;
    }
    let srv = TestApiServer::start(Options {
        kubelet: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(srv.client());
    pods.create(&PostParams::default(), &pod("idle", None))
        .await
        .unwrap();
    let conf = "http_port 3128\nhttp_access allow all\n";
    pods.create(&PostParams::default(), &pod("sq", Some(conf)))
        .await
        .unwrap();
    let running = within(30, "pod Running", async {
        loop {
            let p = pods.get("sq").await.unwrap();
            let st = p.status.clone().unwrap_or_default();
            if st.phase.as_deref() == Some("Running") {
                return p;
            }
            assert_ne!(st.phase.as_deref(), Some("Failed"), "{st:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let st = running.status.unwrap();
    let ip = st.pod_ip.clone().unwrap();
    assert!(ip.starts_with("127.0.0.") && ip != "127.0.0.1", "{ip}");
    assert_eq!(st.pod_ips.unwrap()[0].ip, ip);
    let ready = st
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
    assert!(st.container_statuses.unwrap()[0].ready);

    let target = origin("hello-through-squid").await;
    let proxy: SocketAddr = format!("{ip}:3128").parse().unwrap();
    let resp = within(
        15,
        "a response through squid",
        get_through_proxy(proxy, target),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("hello-through-squid"), "{resp}");

    // A Pod without SQUID_CONF stays Pending.
    let idle = pods.get("idle").await.unwrap();
    assert_eq!(idle.status.unwrap().phase.as_deref(), Some("Pending"));

    let service = format!("tk{}n", std::process::id());
    assert!(process_running(&service));
    pods.delete("sq", &DeleteParams::default()).await.unwrap();
    within(15, "squid gone and port closed", async {
        loop {
            let closed = tokio::net::TcpStream::connect(proxy).await.is_err();
            if closed && !process_running(&service) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    // Shutdown kills the rest.
    pods.create(&PostParams::default(), &pod("sq2", Some(conf)))
        .await
        .unwrap();
    within(30, "second pod Running", async {
        loop {
            let p = pods.get("sq2").await.unwrap();
            if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(process_running(&service));
    srv.shutdown().await;
    within(10, "no squid after shutdown", async {
        while process_running(&service) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}
