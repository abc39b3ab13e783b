//! Real kubectl against the in-process test API server (skipped without kubectl).

mod common;

use common::*;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use test_apiserver::TestApiServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const KUBECTL: &str = "/usr/bin/kubectl";

fn have_kubectl() -> bool {
    if Path::new(KUBECTL).exists() {
        return true;
    }
    println!("SKIP: {KUBECTL} is absent");
    false
}

const P1: &str = "apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: p1, namespace: default}
spec: {provider: kubernetes, port: 3128}
";

struct Kubectl<'a> {
    srv: &'a TestApiServer,
    cache: tempfile::TempDir,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl<'a> Kubectl<'a> {
    fn new(srv: &'a TestApiServer) -> Self {
        Kubectl {
            srv,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    fn cmd(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(KUBECTL);
        c.env("KUBECONFIG", self.srv.kubeconfig_path())
            .env("HOME", self.cache.path())
            .arg(format!("--cache-dir={}", self.cache.path().display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    /// Run kubectl (bounded at 30s), feeding `stdin`.
    async fn run(&self, args: &[&str], stdin: &str) -> Out {
        let mut child = self.cmd(args).spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).await.unwrap();
        drop(input);
        let out = within(30, &format!("kubectl {args:?}"), child.wait_with_output())
            .await
            .unwrap();
        let o = Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        println!("$ kubectl {}\n{}{}", args.join(" "), o.stdout, o.stderr);
        o
    }
}

fn words(s: &str) -> Vec<Vec<String>> {
    s.lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_get_delete() {
    if !have_kubectl() {
        return;
    }
    let srv = server().await;
    let k = Kubectl::new(&srv);
    let o = k.run(&["apply", "-f", "-"], P1).await;
    assert!(
        o.ok && o.stdout.contains("proxy.crawl.example.com/p1 created"),
        "{}",
        o.stderr
    );
    let o = k.run(&["apply", "-f", "-"], P1).await;
    assert!(o.ok && o.stdout.contains("unchanged"), "{}", o.stderr);
    let changed = P1.replace("3128", "3129");
    let o = k.run(&["apply", "-f", "-"], &changed).await;
    assert!(o.ok && o.stdout.contains("configured"), "{}", o.stderr);
    let o = k
        .run(
            &["apply", "--server-side", "-f", "-"],
            &P1.replace("p1", "p2"),
        )
        .await;
    assert!(
        o.ok && o.stdout.contains("serverside-applied"),
        "{}",
        o.stderr
    );
    let o = k.run(&["apply", "--server-side", "-f", "-"], P1).await;
    assert!(o.ok, "{}", o.stderr);
    let o = k.run(&["get", "px"], "").await;
    assert!(o.ok, "{}", o.stderr);
    let rows = words(&o.stdout);
    assert_eq!(
        rows[0],
        ["NAME", "MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "AGE"]
    );
    assert_eq!(rows[1][..3], ["p1", "Managed", "kubernetes"]);
    assert_eq!(rows.len(), 3);
    // Status columns, including the condition filter.
    let api = proxies(&srv.client());
    let st = json!({"status": {"phase": "Ready", "ip": "127.0.0.5", "conditions": [
        {"type": "Healthy", "status": "True", "reason": "ProbeOk", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status("p1", &PatchParams::default(), &Patch::Merge(st))
        .await
        .unwrap();
    let o = k.run(&["get", "px", "p1", "--no-headers"], "").await;
    assert_eq!(
        words(&o.stdout)[0][..5],
        ["p1", "Managed", "kubernetes", "Ready", "127.0.0.5"]
    );
    assert_eq!(words(&o.stdout)[0][5], "True");
    let o = k.run(&["get", "px", "-A", "-o", "name"], "").await;
    assert_eq!(o.stdout.lines().count(), 2, "{}", o.stdout);
    let o = k
        .run(
            &[
                "get",
                "proxies.crawl.example.com",
                "p1",
                "-o",
                "jsonpath={.spec.port}",
            ],
            "",
        )
        .await;
    assert_eq!(o.stdout, "3128");
    // ProviderHealth: cluster-scoped, printer columns.
    let o = k.run(&["get", "ph"], "").await;
    assert!(
        o.ok && o.stderr.contains("No resources found"),
        "{}",
        o.stderr
    );
    let ph = "apiVersion: crawl.example.com/v1alpha1\nkind: ProviderHealth\nmetadata: {name: kubernetes}\n";
    let o = k.run(&["apply", "-f", "-"], ph).await;
    assert!(o.ok, "{}", o.stderr);
    let o = k.run(&["get", "ph"], "").await;
    assert_eq!(
        words(&o.stdout)[0],
        ["NAME", "TYPE", "READY", "TARGETS", "LAST", "CHECK", "AGE"]
    );
    assert_eq!(words(&o.stdout)[1][0], "kubernetes");
    // Delete.
    let o = k.run(&["delete", "px", "p2"], "").await;
    assert!(o.ok && o.stdout.contains("\"p2\" deleted"), "{}", o.stderr);
    let o = k.run(&["get", "px", "p2"], "").await;
    assert!(!o.ok && o.stderr.contains("NotFound"), "{}", o.stderr);
    // Built-ins.
    // (Imperative `kubectl create configmap` sends protobuf, which is not supported.)
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm1}\ndata: {a: b}\n";
    let o = k.run(&["apply", "-f", "-"], cm).await;
    assert!(o.ok, "{}", o.stderr);
    let o = k.run(&["get", "cm,ns"], "").await;
    assert!(
        o.ok && o.stdout.contains("cm1") && o.stdout.contains("kube-system"),
        "{}",
        o.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_rejects_invalid_proxies() {
    if !have_kubectl() {
        return;
    }
    let srv = server().await;
    let k = Kubectl::new(&srv);
    for server_side in [false, true] {
        let mut args = vec!["apply", "-f", "-"];
        if server_side {
            args.push("--server-side");
        }
        let o = k.run(&args, &P1.replace("3128", "70000")).await;
        assert!(!o.ok, "{}", o.stdout);
        assert!(o.stderr.contains("spec.port"), "{}", o.stderr);
        assert!(
            o.stderr.contains("less than or equal to 65535"),
            "{}",
            o.stderr
        );
        let o = k
            .run(&args, &P1.replace("port: 3128", "port: 3128, mode: Bogus"))
            .await;
        assert!(!o.ok, "{}", o.stdout);
        assert!(
            o.stderr.contains("spec.mode") && o.stderr.contains("Bogus"),
            "{}",
            o.stderr
        );
    }
    let o = k.run(&["apply", "-f", "-"], P1).await;
    assert!(o.ok, "{}", o.stderr);
    let o = k
        .run(&["apply", "-f", "-"], &P1.replace("kubernetes", "gcp"))
        .await;
    assert!(
        !o.ok && o.stderr.contains("spec.provider is immutable"),
        "{}",
        o.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_finalizer_keeps_object_until_removed() {
    if !have_kubectl() {
        return;
    }
    let srv = server().await;
    let k = Kubectl::new(&srv);
    let with_fin = P1.replace(
        "metadata: {name: p1, namespace: default}",
        "metadata: {name: p1, namespace: default, finalizers: [crawl.example.com/cleanup]}",
    );
    assert!(k.run(&["apply", "-f", "-"], &with_fin).await.ok);
    let o = k.run(&["delete", "px", "p1", "--wait=false"], "").await;
    assert!(o.ok, "{}", o.stderr);
    let o = k
        .run(
            &[
                "get",
                "px",
                "p1",
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
            "",
        )
        .await;
    assert!(o.ok && o.stdout.ends_with('Z'), "{} {}", o.stdout, o.stderr);
    let o = k
        .run(
            &[
                "patch",
                "px",
                "p1",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ],
            "",
        )
        .await;
    assert!(o.ok, "{}", o.stderr);
    let o = k.run(&["get", "px", "p1"], "").await;
    assert!(!o.ok && o.stderr.contains("NotFound"), "{}", o.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_prints_changes() {
    if !have_kubectl() {
        return;
    }
    let srv = server().await;
    let k = Kubectl::new(&srv);
    assert!(k.run(&["apply", "-f", "-"], P1).await.ok);
    let mut child = k.cmd(&["get", "px", "-w"]).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    within(15, "the initial row", async {
        while let Some(l) = lines.next_line().await.unwrap() {
            seen.push(l.clone());
            if l.starts_with("p1 ") {
                break;
            }
        }
    })
    .await;
    let api = proxies(&srv.client());
    let st = json!({"status": {"phase": "Provisioning"}});
    api.patch_status("p1", &PatchParams::default(), &Patch::Merge(st))
        .await
        .unwrap();
    within(15, "a row with the new phase", async {
        while let Some(l) = lines.next_line().await.unwrap() {
            seen.push(l.clone());
            if l.starts_with("p1 ") && l.contains("Provisioning") {
                break;
            }
        }
    })
    .await;
    println!("{}", seen.join("\n"));
    assert!(seen[0].starts_with("NAME"), "{seen:?}");
    child.start_kill().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
}
