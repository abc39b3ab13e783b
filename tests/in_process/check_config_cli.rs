//! `--check-config` as a new user meets it: the real binary, a file on disk,
//! an exit code and a message naming the offending key or value, fast, and
//! with no cluster anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use support::free_port;

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `--check-config` on `doc` with a kubeconfig whose server is a
/// listener of the test's that counts connections: the check must need no
/// cluster, so it must dial none. Returns the exit code, stdout, stderr,
/// the time taken (printed, not judged) and the connections it made.
fn run(doc: &str) -> (i32, String, String, Duration, usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    server.set_nonblocking(true).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user:\n    token: t\n",
            server.local_addr().unwrap()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = support::operator(dir.path(), doc, &kubeconfig)
        .arg("--check-config")
        .output()
        .unwrap();
    let took = started.elapsed();
    let mut dialled = 0;
    while server.accept().is_ok() {
        dialled += 1;
    }
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
        dialled,
    )
}

#[test]
fn broken_files_exit_1_naming_the_problem() {
    let cases = [
        (
            "typo'd key",
            "providers:\n  - name: gcp-eu\n    type: gcp\n    gcp:\n      projcet: my-project\n",
            vec!["providers[0] \"gcp-eu\"", "projcet"],
        ),
        ("unknown type", "providers:\n  - name: aws\n    type: aws\n", vec!["providers[0] \"aws\"", "unknown provider type \"aws\""]),
        (
            "duplicate name",
            "providers:\n  - name: kubernetes\n    type: kubernetes\n  - name: kubernetes\n    type: kubernetes\n",
            vec!["providers[1] \"kubernetes\"", "duplicate provider name"],
        ),
        ("invalid name", "providers:\n  - name: GCP_EU\n    type: kubernetes\n", vec!["\"GCP_EU\"", "DNS-1123"]),
        (
            "gcp without project",
            "providers:\n  - name: gcp-eu\n    type: gcp\n    gcp:\n      networkTag: egress\n",
            vec!["providers[0] \"gcp-eu\"", "gcp.project is required"],
        ),
        ("not YAML", "providers: [\n", vec!["providers"]),
    ];
    for (what, doc, parts) in cases {
        let (code, _out, err, took, dialled) = run(doc);
        assert_eq!(code, 1, "{what}: exit code, stderr: {err}");
        for p in parts {
            assert!(err.contains(p), "{what}: stderr {err:?} lacks {p:?}");
        }
        assert_eq!(dialled, 0, "{what}: the check dialled the cluster");
        println!("{what}: {took:?}: {}", err.trim());
    }
}

#[test]
fn a_valid_file_exits_0_and_lists_the_providers() {
    let doc = "providers:\n  - name: kubernetes\n    type: kubernetes\n  - name: gcp-eu\n    type: gcp\n    gcp: {project: p}\n";
    let (code, out, err, _, dialled) = run(doc);
    assert_eq!(dialled, 0, "the check dialled the cluster");
    assert_eq!(code, 0, "stderr: {err}");
    assert!(
        out.contains("valid, 2 provider(s): kubernetes (kubernetes), gcp-eu (gcp)"),
        "{out}"
    );
}

#[test]
fn missing_file_and_missing_flag_are_clear() {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .args([
            "--check-config",
            "--providers-config",
            "/nonexistent/providers.yaml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot read providers config /nonexistent/providers.yaml"));

    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--providers-config is required"));
}

#[test]
fn help_explains_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--providers-config",
        "--check-config",
        "--metrics-bind-address",
        "--metrics-secure",
        "--metrics-cert-dir",
        "--health-probe-bind-address",
        "--leader-elect",
        "--proxy-namespace",
        "--max-concurrent-reconciles",
        "--installation-id",
        "--health-workers",
        "--default-probe-url",
        "--probe-ca-file",
        "--discovery-bind-address",
        "--max-lease-ttl",
        "--lease-cooldown",
        "--gc-interval",
        "--gc-min-age",
        "--gc-max-deletes-per-sweep",
        "--provider-check-interval",
        "--provider-check-timeout",
        "--gcp-wire-log-full-payloads",
        "--trace-health-probes",
        "--log-format",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn sigterm_stops_the_operator_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (probe_port, metrics_port) = (free_port(), free_port());
    // A cluster that refuses connections: the operator must keep running
    // (retrying its watches) and still stop promptly on SIGTERM.
    let mut cmd = refused_operator(dir.path());
    cmd.args([
        "--health-probe-bind-address",
        &format!("127.0.0.1:{probe_port}"),
    ])
    .args([
        "--metrics-bind-address",
        &format!("127.0.0.1:{metrics_port}"),
    ]);
    let log = dir.path().join("operator.log");
    // Killed on drop, so a failed assertion leaves nothing running.
    let mut op = support::Operator::spawn(cmd, &log);
    // Every replica serves the probes and the metrics registry, even with
    // the API server unreachable: alive, but not ready, since its Proxy
    // cache cannot sync. The signal handler is installed before the
    // servers start, so once they answer SIGTERM is graceful.
    wait_until_listening(probe_port, &log);
    let (status, body) = http_get(probe_port, "/healthz");
    assert_eq!((status.as_str(), body.trim()), ("200", "ok"), "/healthz");
    let (status, body) = http_get(probe_port, "/readyz");
    assert_eq!(
        (status.as_str(), body.trim()),
        ("503", "the Proxy cache has not synced yet"),
        "/readyz before the cache synced"
    );
    wait_until_listening(metrics_port, &log);
    let (status, body) = http_get(metrics_port, "/metrics");
    assert_eq!(status, "200");
    assert!(body.contains("# TYPE proxy_operator_"), "{body}");
    let killed = Command::new("kill")
        .args(["-TERM", &op.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = op.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            panic!("operator did not stop within 10s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit {status:?}: {err}");
    assert!(err.contains("Loaded providers config"), "{err}");
    assert!(err.contains("Shutting down"), "{err}");
}

#[test]
fn secure_metrics_answer_401_without_a_token_and_503_while_the_api_server_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let mut cmd = refused_operator(dir.path());
    cmd.arg("--metrics-secure=true").args([
        "--metrics-bind-address",
        &format!("127.0.0.1:{metrics_port}"),
    ]);
    let log = dir.path().join("operator.log");
    let _op = support::Operator::spawn(cmd, &log);
    wait_until_listening(metrics_port, &log);
    let addr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    let token = "sentinel-scrape-token-4711";

    let (status, body) = support::https_get(addr, "/metrics", None);
    assert_eq!(status, 401, "no token: {body}");
    assert!(body.contains("bearer token"), "{body}");
    // The token cannot be checked: 503 with the reason, every time (an
    // unreachable API server is never cached as a verdict).
    for _ in 0..2 {
        let (status, body) = support::https_get(addr, "/metrics", Some(token));
        assert_eq!(status, 503, "API server unreachable: {body}");
        assert!(body.contains("cannot check the token"), "{body}");
        assert!(!body.contains("proxy_operator_"), "no metrics leak: {body}");
    }
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("Cannot authorize a metrics scrape"), "{err}");
    assert!(!err.contains(token), "the token is never logged: {err}");
}

/// The operator with one kubernetes provider, aimed at a cluster where
/// nothing listens.
fn refused_operator(dir: &std::path::Path) -> Command {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, refused_kubeconfig("127.0.0.1:1")).unwrap();
    let mut cmd = support::operator(
        dir,
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
        &kubeconfig,
    );
    cmd.args(["--installation-id", "test"]);
    cmd
}

/// A kubeconfig whose only cluster is `addr`, where nothing listens.
fn refused_kubeconfig(addr: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: refused
  cluster:
    server: http://{addr}
contexts:
- name: refused
  context:
    cluster: refused
    user: refused
    namespace: default
current-context: refused
users:
- name: refused
  user:
    token: unused
preferences: {{}}
"
    )
}

/// A minimal HTTP/1.0 GET: (status code, body).
/// Waits (at most 20 s) until something accepts on `port`.
fn wait_until_listening(port: u16, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port} after 20 s: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn the_discovery_api_refuses_to_start_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let doc = "providers:\n  - name: kubernetes\n    type: kubernetes\n";
    let port = free_port();
    // support::operator turns the API off; turn it on, with no token.
    let out = support::operator(dir.path(), doc, &dir.path().join("absent"))
        .args(["--discovery-bind-address", &format!("127.0.0.1:{port}")])
        .env_remove("DISCOVERY_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(
        err.contains("DISCOVERY_TOKEN is not set")
            && err.contains("--allow-unauthenticated-discovery"),
        "{err}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing may listen on the discovery port"
    );
}

#[test]
fn a_misspelt_crash_point_stops_the_start_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let doc = "providers:\n  - name: kubernetes\n    type: kubernetes\n";
    for (value, says) in [
        ("after-lunch", "unknown crash point \"after-lunch\""),
        (
            "after-create:0",
            "the count after ':' must be a whole number",
        ),
    ] {
        let out = support::operator(dir.path(), doc, &dir.path().join("absent"))
            .env("PROXY_OPERATOR_CRASH_AT", value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {err}");
        assert!(
            err.contains("PROXY_OPERATOR_CRASH_AT") && err.contains(says),
            "{value}: {err}"
        );
    }
}

/// `--version` names the release and the commit the binary was built from
/// (the checkout's HEAD here: the test binary and the operator are built
/// from the same tree), as a bug report should quote them.
#[test]
fn version_names_the_release_and_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs (the suite needs a checkout)");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert_eq!(head.len(), 12, "a commit: {head:?}");
    assert_eq!(
        printed,
        format!(
            "egress-proxies-operator {} (commit {head})",
            env!("CARGO_PKG_VERSION")
        )
    );
}
