//! A new user's first minutes with the real test cluster and its own
//! (pinned) kubectl: version, plain objects, the operator's CRDs and
//! samples applied client- and server-side, explain, printer columns,
//! watch, delete, RBAC questions, and the real server's validation. No
//! Pods run here, so the cluster has no node agent.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// kubectl with `args` in namespace `ns` (when given), `stdin` fed in.
fn kubectl(ns: Option<&str>, args: &[&str], stdin: &str) -> Out {
    let mut cmd = control_plane().kubectl();
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let o = Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!("$ kubectl {}\n{}{}", args.join(" "), o.stdout, o.stderr);
    o
}

fn ok(ns: Option<&str>, args: &[&str]) -> String {
    let o = kubectl(ns, args, "");
    assert!(o.ok, "kubectl {} failed: {}", args.join(" "), o.stderr);
    o.stdout
}

async fn namespace(prefix: &str) -> String {
    let c = control_plane();
    install_crds(c);
    c.namespace(&c.client().await, prefix).await
}

/// The header cells of a `kubectl get` table.
fn header(table: &str) -> Vec<String> {
    let first = table.lines().next().unwrap_or_default();
    first
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn version_shows_the_pinned_server() {
    let out = ok(None, &["version"]);
    assert!(out.contains("Server Version: v1.37.2"), "{out}");
    assert!(out.contains("Client Version: v1.37.2"), "{out}");
}

#[tokio::test]
async fn a_configmap_round_trips() {
    let ns = namespace("cm").await;
    ok(
        Some(&ns),
        &["create", "configmap", "x", "--from-literal=a=b"],
    );
    let a = ok(
        Some(&ns),
        &["get", "configmap", "x", "-o", "jsonpath={.data.a}"],
    );
    assert_eq!(a, "b");
}

#[tokio::test]
async fn the_crds_apply_client_and_server_side() {
    // Client-side apply over the server-side install: both must be
    // accepted by the real CRD validation (the ProviderHealth schema once
    // was not).
    let _ = namespace("crds").await;
    for mode in [
        &["apply", "-k", "crds"][..],
        &["apply", "--server-side", "--force-conflicts", "-k", "crds"],
    ] {
        let out = ok(None, mode);
        assert!(out.contains("proxies.crawl.example.com"), "{out}");
        assert!(out.contains("providerhealths.crawl.example.com"), "{out}");
    }
    let est = ok(
        None,
        &[
            "get",
            "crd",
            "providerhealths.crawl.example.com",
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}",
        ],
    );
    assert_eq!(est, "True");
}

#[tokio::test]
async fn every_sample_applies_client_and_server_side_and_lists_with_its_columns() {
    let ns = namespace("samples").await;
    let client_side = ok(Some(&ns), &["apply", "-k", "config/samples"]);
    for name in [
        "proxy-kubernetes-sample",
        "proxy-gcp-sample",
        "proxy-kvm-sample",
        "proxy-external-sample",
        "pool-gcp-sample",
    ] {
        assert!(
            client_side.contains(name),
            "{name} not applied: {client_side}"
        );
    }
    let server_side = ok(
        Some(&ns),
        &["apply", "--server-side", "-k", "config/samples"],
    );
    assert!(server_side.contains("serverside-applied"), "{server_side}");

    let table = ok(Some(&ns), &["get", "px"]);
    assert_eq!(
        header(&table),
        ["NAME", "MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "REASON", "AGE"],
        "{table}"
    );
    assert_eq!(
        table.lines().count(),
        5,
        "four samples and a header: {table}"
    );
    let ext = table
        .lines()
        .find(|l| l.starts_with("proxy-external-sample"))
        .unwrap();
    assert!(ext.contains("External"), "{ext}");

    let ph = kubectl(None, &["get", "ph"], "");
    assert!(ph.ok, "{}", ph.stderr);
    // No operator runs here, so there may be no rows; with rows the header
    // shows the printer columns.
    if !ph.stdout.is_empty() {
        assert_eq!(
            header(&ph.stdout),
            ["NAME", "TYPE", "READY", "TARGETS", "LAST CHECK", "AGE"]
        );
    }
    let columns = ok(
        None,
        &[
            "get",
            "crd",
            "providerhealths.crawl.example.com",
            "-o",
            "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
        ],
    );
    assert_eq!(columns, "Type Ready Targets Last Check Age");
}

#[tokio::test]
async fn explain_describes_the_spec() {
    let _ = namespace("explain").await;
    // Explain reads the published OpenAPI, which lags the CRD by a moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let o = kubectl(None, &["explain", "proxy.spec"], "");
        if o.ok && o.stdout.contains("provider") {
            break o.stdout;
        }
        assert!(
            Instant::now() < deadline,
            "explain never described proxy.spec: {}",
            o.stderr
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for field in ["provider", "port", "mode"] {
        assert!(out.contains(field), "{field} not explained: {out}");
    }
    assert!(out.contains("KIND:") && out.contains("Proxy"), "{out}");
}

#[tokio::test]
async fn get_watch_shows_a_change_and_delete_removes() {
    let ns = namespace("watch").await;
    ok(
        Some(&ns),
        &["apply", "-f", "config/samples/proxy_external.yaml"],
    );
    let mut watch = control_plane()
        .kubectl()
        .args(["-n", &ns, "get", "px", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => continue,
                Err(_) => panic!("kubectl get -w never printed {what}"),
            }
        }
    };
    wait_for("ADDED");
    ok(Some(&ns), &["delete", "px", "proxy-external-sample"]);
    let line = wait_for("DELETED");
    assert!(line.contains("proxy-external-sample"), "{line}");
    let _ = watch.kill();
    let _ = watch.wait();
    let gone = kubectl(Some(&ns), &["get", "px", "proxy-external-sample"], "");
    assert!(
        !gone.ok && gone.stderr.contains("NotFound"),
        "{}",
        gone.stderr
    );
}

#[tokio::test]
async fn auth_can_i_follows_the_shipped_viewer_role() {
    let ns = namespace("rbac").await;
    let sa = format!("--as=system:serviceaccount:{ns}:default");
    let ask = |verb: &str| {
        kubectl(
            Some(&ns),
            &["auth", "can-i", verb, "proxies.crawl.example.com", &sa],
            "",
        )
        .stdout
        .trim()
        .to_string()
    };
    assert_eq!(ask("list"), "no");
    ok(None, &["apply", "-f", "config/rbac/proxy_viewer_role.yaml"]);
    ok(
        Some(&ns),
        &[
            "create",
            "rolebinding",
            "viewer",
            "--clusterrole=proxy-viewer-role",
            &format!("--serviceaccount={ns}:default"),
        ],
    );
    assert_eq!(ask("list"), "yes");
    assert_eq!(ask("watch"), "yes");
    assert_eq!(ask("delete"), "no");
}

#[tokio::test]
async fn the_builtin_view_and_edit_roles_take_in_the_shipped_roles() {
    let ns = namespace("aggregate").await;
    let sa = format!("--as=system:serviceaccount:{ns}:default");
    // `resource` may end in ` status`: the subresource.
    let ask = |verb: &str, resource: &str| {
        let mut args = vec!["auth", "can-i", verb, &sa];
        match resource.split_once(' ') {
            Some((kind, sub)) => args.extend([kind, "--subresource", sub]),
            None => args.push(resource),
        }
        kubectl(Some(&ns), &args, "").stdout.trim().to_string()
    };
    // Bound to the built-in `view` role only: what it grants on Proxies
    // comes from the aggregation labels on the shipped roles.
    ok(
        Some(&ns),
        &[
            "create",
            "rolebinding",
            "builtin-view",
            "--clusterrole=view",
            &format!("--serviceaccount={ns}:default"),
        ],
    );
    for f in [
        "config/rbac/proxy_viewer_role.yaml",
        "config/rbac/proxy_editor_role.yaml",
        "config/rbac/providerhealth_viewer_role.yaml",
    ] {
        ok(None, &["apply", "-f", f]);
    }
    // The controller-manager's aggregation controller folds them in.
    eventually(
        "view lets the user get proxies",
        Duration::from_secs(60),
        || async { (ask("get", "proxies.crawl.example.com") == "yes").then_some(()) },
    )
    .await;
    assert_eq!(ask("list", "providerhealths.crawl.example.com"), "yes");
    assert_eq!(
        ask("create", "proxies.crawl.example.com"),
        "no",
        "view never writes"
    );
    assert_eq!(ask("patch", "proxies.crawl.example.com status"), "no");
    assert_eq!(ask("get", "proxies.crawl.example.com status"), "yes");

    ok(
        Some(&ns),
        &[
            "create",
            "rolebinding",
            "builtin-edit",
            "--clusterrole=edit",
            &format!("--serviceaccount={ns}:default"),
        ],
    );
    assert_eq!(ask("create", "proxies.crawl.example.com"), "yes");
    assert_eq!(ask("delete", "proxies.crawl.example.com"), "yes");
    assert_eq!(
        ask("patch", "proxies.crawl.example.com status"),
        "no",
        "status stays the operator's"
    );
}

#[tokio::test]
async fn the_real_validation_refuses_a_port_out_of_range_naming_the_field() {
    let ns = namespace("invalid").await;
    let bad = "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: bad}\nspec: {provider: kubernetes, port: 99999}\n";
    for args in [
        &["apply", "-f", "-"][..],
        &["apply", "--server-side", "-f", "-"],
    ] {
        let o = kubectl(Some(&ns), args, bad);
        assert!(!o.ok, "a port of 99999 must be refused");
        assert!(o.stderr.contains("spec.port"), "{}", o.stderr);
        assert!(o.stderr.contains("65535"), "{}", o.stderr);
    }
    let none = kubectl(Some(&ns), &["get", "px", "bad"], "");
    assert!(!none.ok, "nothing may be stored");
}

/// Every CEL rule of the Proxy CRD (the ProviderHealth CRD has none: its
/// bounds are plain schema) refuses its bad object on the real API server,
/// with the field and the rule's message in kubectl's error, and stores
/// nothing: a create leaves no object, an update leaves the old spec.
#[tokio::test]
async fn every_cel_rule_refuses_its_bad_object_naming_the_field() {
    let ns = namespace("cel").await;
    let proxy = |name: &str, spec: &str| {
        format!("apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}}}\nspec: {spec}\n")
    };
    // (what, the object first stored if any, the bad object, the field, the message)
    let cases: [(&str, Option<&str>, &str, &str, &str); 8] = [
        (
            "External without an endpoint",
            None,
            "{mode: External}",
            "spec.endpoint",
            "spec.endpoint is required when spec.mode is External",
        ),
        (
            "Managed without a provider",
            None,
            "{mode: Managed, port: 3128}",
            "spec.provider",
            "spec.provider is required when spec.mode is Managed",
        ),
        (
            "Managed with an empty provider",
            None,
            "{mode: Managed, provider: '', port: 3128}",
            "spec.provider",
            "spec.provider is required when spec.mode is Managed",
        ),
        (
            "Managed without a port",
            None,
            "{mode: Managed, provider: kubernetes}",
            "spec.port",
            "spec.port is required when spec.mode is Managed",
        ),
        (
            "cloudInit with both inline and secretRef",
            None,
            "{provider: kubernetes, port: 3128, cloudInit: {inline: x, secretRef: {name: s}}}",
            "spec.cloudInit",
            "exactly one of cloudInit.inline, cloudInit.secretRef or cloudInit.builtin must be set",
        ),
        (
            "cloudInit with both inline and builtin",
            None,
            "{provider: kubernetes, port: 3128, cloudInit: {inline: x, builtin: squid}}",
            "spec.cloudInit",
            "exactly one of cloudInit.inline, cloudInit.secretRef or cloudInit.builtin must be set",
        ),
        (
            "mode changed",
            Some("{mode: External, endpoint: {host: 127.0.0.1, port: 3128}}"),
            "{mode: Managed, provider: kubernetes, port: 3128}",
            "spec.mode",
            "spec.mode is immutable",
        ),
        (
            "provider changed",
            Some("{provider: gcp-a, port: 3128}"),
            "{provider: gcp-b, port: 3128}",
            "spec.provider",
            "spec.provider is immutable",
        ),
    ];
    for (i, (what, first, bad, field, message)) in cases.into_iter().enumerate() {
        let name = format!("cel-{i}");
        if let Some(first) = first {
            let o = kubectl(Some(&ns), &["apply", "-f", "-"], &proxy(&name, first));
            assert!(o.ok, "{what}: the first object is valid: {}", o.stderr);
        }
        let o = kubectl(Some(&ns), &["apply", "-f", "-"], &proxy(&name, bad));
        assert!(!o.ok, "{what}: must be refused");
        assert!(
            o.stderr.contains(field),
            "{what}: the error names {field}: {}",
            o.stderr
        );
        assert!(
            o.stderr.contains(message),
            "{what}: the error says {message:?}: {}",
            o.stderr
        );
        println!("{what}: {}", o.stderr.trim());
        let stored = kubectl(
            Some(&ns),
            &["get", "px", &name, "-o", "jsonpath={.spec}"],
            "",
        );
        match first {
            None => assert!(
                !stored.ok,
                "{what}: nothing may be stored: {}",
                stored.stdout
            ),
            Some(first) => {
                assert!(stored.ok, "{what}: {}", stored.stderr);
                let kept: serde_json::Value = serde_json::from_str(&stored.stdout).unwrap();
                let old: serde_json::Value = serde_norway::from_str(first).unwrap();
                for (key, value) in old.as_object().unwrap() {
                    assert_eq!(&kept[key], value, "{what}: the old spec stays: {kept}");
                }
            }
        }
    }
}
