//! System test of the status that generic tools read (kstatus): the real
//! operator binary, a real Squid Pod on the test cluster, and the pinned
//! kubectl's `wait`, `-o wide` and category listing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::{condition, eventually, proxy, Ground};

use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// kubectl in the test's namespace, run off the test's runtime threads
/// (the probe target is served on them).
async fn kubectl(ground: &Ground, args: &[&str]) -> Out {
    let mut cmd = tokio::process::Command::from(ground.cluster.kubectl());
    let out = cmd
        .args(["-n", &ground.ns])
        .args(args)
        .output()
        .await
        .expect("kubectl runs");
    let o = Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!("$ kubectl {}\n{}{}", args.join(" "), o.stdout, o.stderr);
    o
}

fn header(table: &str) -> Vec<String> {
    let line = table.lines().next().unwrap_or_default();
    // Column names may hold one space ("PROVIDER ID"); columns are
    // separated by at least two.
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

fn ready(p: &Proxy) -> Option<(String, String, String, Option<i64>)> {
    condition(p, "Ready").map(|c| {
        (
            c.status.as_str().to_string(),
            c.reason.clone(),
            c.message.clone(),
            c.observed_generation,
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_wait_get_wide_and_the_category_read_the_status() {
    support::require_squid_pods();
    let ground = support::ground("status-tools").await;
    let target = support::http_target_on(ground.host_ip()).await;
    let dir = tempfile::tempdir().unwrap();
    let _op = ground.probing_operator(dir.path(), target);

    let proxies = ground.proxies();
    proxies
        .create(
            &PostParams::default(),
            &proxy("served", json!({"provider": "kubernetes", "port": 3128})),
        )
        .await
        .unwrap();
    // A provider the operator does not have: it can never be Ready.
    proxies
        .create(
            &PostParams::default(),
            &proxy("orphan", json!({"provider": "nowhere", "port": 3128})),
        )
        .await
        .unwrap();

    let started = std::time::Instant::now();
    let waited = kubectl(
        &ground,
        &[
            "wait",
            "--for=condition=Ready",
            "proxy/served",
            "--timeout=180s",
        ],
    )
    .await;
    assert!(waited.ok, "kubectl wait: {}", waited.stderr);
    assert!(waited.stdout.contains("condition met"), "{}", waited.stdout);
    println!("served Ready (kubectl wait) after {:?}", started.elapsed());
    let served = proxies.get("served").await.unwrap();
    let st = served.status.clone().unwrap();
    assert_eq!(st.phase.map(|p| p.as_str()), Some("Ready"));
    let (s, reason, _, generation) = ready(&served).unwrap();
    assert_eq!((s.as_str(), reason.as_str()), ("True", "ProxyReady"));
    assert_eq!(generation, served.metadata.generation);
    assert_eq!(st.observed_generation, served.metadata.generation);

    // `-o wide` adds zone, provider id, latency and the Ready reason.
    let wide = kubectl(&ground, &["get", "px", "-o", "wide"]).await;
    assert!(wide.ok, "{}", wide.stderr);
    assert_eq!(
        header(&wide.stdout),
        [
            "NAME",
            "MODE",
            "PROVIDER",
            "PHASE",
            "IP",
            "HEALTHY",
            "REASON",
            "AGE",
            "ZONE",
            "PROVIDER ID",
            "LATENCY",
            "READY REASON"
        ],
        "{}",
        wide.stdout
    );
    let row = wide
        .stdout
        .lines()
        .find(|l| l.starts_with("served "))
        .unwrap();
    let id = st.provider_id.clone().unwrap();
    assert!(row.contains(&id), "provider id {id} in {row}");
    assert!(row.ends_with("ProxyReady"), "{row}");
    let plain = kubectl(&ground, &["get", "px"]).await;
    assert!(!plain.stdout.contains("PROVIDER ID"), "{}", plain.stdout);

    // The category lists Proxies with other kinds of the project.
    let category = kubectl(&ground, &["get", "egress-proxies", "-o", "name"]).await;
    assert!(category.ok, "{}", category.stderr);
    for name in ["served", "orphan"] {
        assert!(
            category
                .stdout
                .lines()
                .any(|l| l == format!("proxy.crawl.example.com/{name}")),
            "{name}: {}",
            category.stdout
        );
    }

    // A spec edit: the status catches up with the new generation.
    let edited = proxies
        .patch(
            "served",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"attributes": {"geo": "home"}}})),
        )
        .await
        .unwrap();
    let generation = edited.metadata.generation;
    assert!(generation > served.metadata.generation);
    let caught_up = eventually(
        "observedGeneration catches up",
        Duration::from_secs(60),
        || async {
            let p = proxies.get("served").await.ok()?;
            (p.status.as_ref()?.observed_generation == generation).then_some(p)
        },
    )
    .await;
    assert_eq!(ready(&caught_up).unwrap().3, generation);
    let waited = kubectl(
        &ground,
        &[
            "wait",
            "--for=jsonpath={.status.observedGeneration}=2",
            "proxy/served",
            "--timeout=5s",
        ],
    )
    .await;
    assert_eq!(generation, Some(2));
    assert!(waited.ok, "{}", waited.stderr);

    // The one that can never be Ready: kubectl wait times out, and the
    // condition says why.
    let waited = kubectl(
        &ground,
        &[
            "wait",
            "--for=condition=Ready",
            "proxy/orphan",
            "--timeout=10s",
        ],
    )
    .await;
    assert!(!waited.ok, "{}", waited.stdout);
    assert!(waited.stderr.contains("timed out"), "{}", waited.stderr);
    let orphan = proxies.get("orphan").await.unwrap();
    let (s, reason, message, _) = ready(&orphan).unwrap();
    assert_eq!((s.as_str(), reason.as_str()), ("False", "PermanentError"));
    assert!(message.contains("\"nowhere\""), "{message}");
    let wide = kubectl(&ground, &["get", "px", "orphan", "-o", "wide"]).await;
    assert!(wide.stdout.contains("PermanentError"), "{}", wide.stdout);
}
