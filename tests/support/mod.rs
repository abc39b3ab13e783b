//! Shared by the tests that run the real operator binary.
#![allow(dead_code)]

pub mod breaker;
pub mod crawler;
pub mod leader;
pub mod ledger;
pub mod recycle;
pub mod shipped;
pub mod squid;

use std::path::Path;
use std::process::Command;

/// The sample value of `series` (name and labels exactly as exported) in
/// the Prometheus text exposition, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let value = l.strip_prefix(series)?.strip_prefix(' ')?;
        value.parse().ok()
    })
}

/// The body of a plain-HTTP `/metrics` scrape of `addr`, if it answered.
pub async fn scrape(addr: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8(buf).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

/// The operator binary with `providers` written to `dir/providers.yaml`,
/// talking to the cluster in `kubeconfig` (never an in-cluster one), with
/// its probe and discovery servers off so parallel tests share no port, and
/// `/metrics` (when a test turns it on) plain HTTP for any scraper; a later
/// `--metrics-secure=true` makes it HTTPS with token checks.
pub fn operator(dir: &Path, providers: &str, kubeconfig: &Path) -> Command {
    let path = dir.join("providers.yaml");
    std::fs::write(&path, providers).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
    cmd.arg("--providers-config")
        .arg(&path)
        .args(["--probe-deny-cidrs", &deny_but_loopback()])
        .args([
            "--health-probe-bind-address",
            "0",
            "--discovery-bind-address",
            "0",
            "--metrics-secure=false",
        ])
        .env("KUBECONFIG", kubeconfig)
        // Its scratch files (the kvm provider's socket directories) go
        // with the test's directory, even when the test SIGKILLs it.
        .env("TMPDIR", dir)
        .env_remove("KUBERNETES_SERVICE_HOST");
    cmd
}

/// The default `--probe-deny-cidrs` less loopback: the tests' External
/// Proxies are real Squids on 127.0.0.x, which the default refuses.
pub fn deny_but_loopback() -> String {
    egress_proxies_operator::tenancy::DEFAULT_PROBE_DENY
        .split(',')
        .filter(|c| !c.starts_with("127.") && *c != "::1/128")
        .collect::<Vec<_>>()
        .join(",")
}

/// A providers file of one kubernetes provider named `name`, with `keys`
/// (entry keys, indented four spaces, each line ending in a newline), whose
/// Squid Pods may reach `target`: the tests' probe targets listen on the
/// cluster bridge, a private address the Pods refuse by default.
pub fn kubernetes_reaching(name: &str, keys: &str, target: std::net::IpAddr) -> String {
    format!(
        "providers:\n  - name: {name}\n    type: kubernetes\n{keys}    kubernetes:\n      destinations:\n        allow: [\"{target}\"]\n"
    )
}

/// An OTLP/HTTP trace receiver on 127.0.0.1: the body of every export to
/// `/v1/traces` (protobuf) goes to `on_export`, and is answered empty.
/// Served on the test's runtime, so it stops with the test. Returns the
/// endpoint for `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub async fn otlp_receiver<F>(on_export: F) -> String
where
    F: Fn(axum::body::Bytes) + Clone + Send + Sync + 'static,
{
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            on_export(body);
            async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// `GET https://{addr}{path}` with curl, as a scraper does: any certificate
/// accepted (the operator's is self-signed), `token` as the bearer token.
/// Returns the status (0: no HTTP answer) and the body.
pub fn https_get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd
        .arg(format!("https://{addr}{path}"))
        .output()
        .unwrap_or_else(|e| panic!("curl is required (apt-get install curl): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A running operator process, killed when dropped so no test leaves it
/// running.
pub struct Operator(pub std::process::Child);

impl Operator {
    /// Starts `cmd` with its log (stderr) in `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Operator {
        let file = std::fs::File::create(log).unwrap();
        Operator(
            cmd.stdout(std::process::Stdio::null())
                .stderr(file)
                .spawn()
                .unwrap(),
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits up to 120 s for the process, armed with a crash point, to
    /// abort at `point`: ended by SIGABRT, its log (`log`) naming the
    /// point; panics with the log otherwise.
    pub async fn aborted_at(&mut self, log: &Path, point: &str) {
        use std::os::unix::process::ExitStatusExt;
        let text = || std::fs::read_to_string(log).unwrap_or_default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not abort at {point} within 120 s:\n{}",
                log.display(),
                text()
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        let text = text();
        assert_eq!(status.signal(), Some(6), "ended by {status}:\n{text}");
        assert!(
            text.contains(&format!("Crash point {point} reached")),
            "crashed elsewhere than {point}:\n{text}"
        );
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` every 200 ms until it yields a value; panics naming `what`
/// after `timeout`.
pub async fn eventually<F, Fut, T>(what: &str, timeout: std::time::Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The Events of `events` regarding an object called `name`.
pub async fn events_regarding(
    events: &kube::Api<k8s_openapi::api::events::v1::Event>,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// The note of the first Event with `reason` regarding `name`.
pub async fn event_note(
    events: &kube::Api<k8s_openapi::api::events::v1::Event>,
    name: &str,
    reason: &str,
) -> Option<String> {
    events_regarding(events, name)
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
}

/// The series documented in the table of docs/metrics.md: every row whose
/// first cell is a backticked `proxy_operator_*` name, mapped to its type
/// cell (`counter`, `gauge`, `histogram`).
pub fn documented_metrics() -> std::collections::BTreeMap<String, String> {
    let text = repo_file("docs/metrics.md");
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        let mut cells = line.split('|').map(str::trim);
        // A table row starts with `|`: the first piece is empty.
        if cells.next() != Some("") {
            continue;
        }
        let (Some(name), Some(kind)) = (cells.next(), cells.next()) else {
            continue;
        };
        let Some(name) = name
            .strip_prefix('`')
            .and_then(|n| n.strip_suffix('`'))
            .filter(|n| n.starts_with("proxy_operator_") || n.starts_with("process_"))
        else {
            continue;
        };
        let previous = out.insert(name.to_string(), kind.to_string());
        assert!(previous.is_none(), "{name} is in docs/metrics.md twice");
    }
    out
}

/// Every `proxy_operator_*` and `process_*` metric name in a PromQL
/// expression, in order of appearance.
pub fn metric_names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    let next = |s: &str| {
        ["proxy_operator_", "process_"]
            .iter()
            .filter_map(|p| s.find(p))
            .min()
    };
    while let Some(at) = next(rest) {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        if boundary {
            names.push(tail[..len].to_string());
        }
        rest = &tail[len..];
    }
    names
}

/// The documented series a PromQL metric name refers to: the name itself,
/// or for `_bucket`, `_count` and `_sum` the documented histogram.
pub fn resolve_metric<'a>(
    name: &str,
    documented: &'a std::collections::BTreeMap<String, String>,
) -> Option<&'a str> {
    if let Some((n, _)) = documented.get_key_value(name) {
        return Some(n);
    }
    ["_bucket", "_count", "_sum"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        let (n, kind) = documented.get_key_value(base)?;
        (kind == "histogram").then_some(n.as_str())
    })
}

/// Runs `promtool` with `args`; panics when it is not installed (CI
/// installs it: Debian package `prometheus`), never skips.
pub fn promtool<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    match Command::new("promtool").args(args).output() {
        Ok(out) => out,
        Err(e) => panic!(
            "cannot run promtool ({e}): install it (Debian/Ubuntu: apt-get install prometheus)"
        ),
    }
}

/// Runs `promtool` with `args`, panics with its output unless it
/// succeeds, and returns that output.
pub fn promtool_ok<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    let out = promtool(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        shown.join(" ")
    );
    text
}

/// The text of `rel`, a path relative to the repository root.
pub fn repo_file(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `rel` parsed as YAML.
pub fn repo_yaml(rel: &str) -> serde_norway::Value {
    serde_norway::from_str(&repo_file(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

/// A port that was free a moment ago on 127.0.0.1, below the ephemeral
/// range so no outgoing connection can be given it meanwhile.
pub fn free_port() -> u16 {
    test_cluster::process::free_port().expect("a free loopback port")
}

/// A free address on 127.0.0.1, for a server a test starts.
/// Sends `sig` (`-STOP`, `-CONT`, `-TERM`…) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

pub fn loopback() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize <dir>` (dir relative to the repository), one JSON
/// value per rendered object, with the pinned kubectl (`make test-cluster`).
pub fn kustomize(dir: &str) -> Vec<serde_json::Value> {
    let out = Command::new(test_cluster::bin("kubectl"))
        .args(["kustomize", dir])
        .current_dir(repo())
        .output()
        .expect("kubectl runs (CI installs it)");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect()
}

/// `config/default` with its commented-out line `#- ../components/<name>`
/// switched on, as its comment tells a user to, rendered. Panics when
/// config/default has no such line (the docs would then be wrong).
pub fn kustomize_default_with(component: &str) -> Vec<serde_json::Value> {
    let commented = format!("#- ../components/{component}");
    let text = repo_file("config/default/kustomization.yaml");
    assert!(
        text.lines().any(|l| l == commented),
        "config/default/kustomization.yaml has no line {commented:?} to uncomment"
    );
    kustomize_default_as(&text.replace(&commented, &commented[1..]), component)
}

/// `text` rendered in place of config/default's kustomization.yaml: from a
/// directory under target/ (kustomize reads plain files only inside the
/// kustomization's directory, so config/default's are copied there), with
/// its `../` paths rebased onto config/default.
pub fn kustomize_default_as(text: &str, prefix: &str) -> Vec<serde_json::Value> {
    let scratch = repo().join("target");
    std::fs::create_dir_all(&scratch).unwrap();
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&scratch)
        .unwrap();
    let rel = dir.path().strip_prefix(repo()).unwrap();
    let up = "../".repeat(rel.components().count());
    let default = repo().join("config/default");
    let mut out = String::new();
    for line in text.lines() {
        match line.strip_prefix("- ") {
            Some(path) if path.starts_with("../") => {
                out.push_str(&format!("- {up}config/default/{path}\n"));
                continue;
            }
            Some(file) if default.join(file).is_file() => {
                std::fs::copy(default.join(file), dir.path().join(file)).unwrap();
            }
            _ => {}
        }
        out.push_str(line);
        out.push('\n');
    }
    std::fs::write(dir.path().join("kustomization.yaml"), out).unwrap();
    kustomize(rel.to_str().unwrap())
}

/// The rendered object of `kind` named `name`.
pub fn object<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

/// The RBAC rules bound to ServiceAccount `ns/sa` in rendered manifests:
/// (rules of bound ClusterRoles, rules of Roles bound per namespace).
pub fn rules_of(
    docs: &[serde_json::Value],
    ns: &str,
    sa: &str,
) -> (
    Vec<k8s_openapi::api::rbac::v1::PolicyRule>,
    Vec<(String, Vec<k8s_openapi::api::rbac::v1::PolicyRule>)>,
) {
    let binds_sa = |b: &serde_json::Value| {
        b["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns)
    };
    let rules = |kind: &str,
                 name: &str,
                 in_ns: Option<&str>|
     -> Vec<k8s_openapi::api::rbac::v1::PolicyRule> {
        let role = docs
            .iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && in_ns.is_none_or(|n| d["metadata"]["namespace"] == n)
            })
            .unwrap_or_else(|| panic!("a binding names {kind} {name}, which is not rendered"));
        serde_json::from_value(role["rules"].clone()).unwrap()
    };
    let mut cluster = Vec::new();
    let mut namespaced = Vec::new();
    for b in docs.iter().filter(|d| binds_sa(d)) {
        let role_kind = b["roleRef"]["kind"].as_str().unwrap();
        let role_name = b["roleRef"]["name"].as_str().unwrap();
        match b["kind"].as_str() {
            Some("ClusterRoleBinding") => cluster.extend(rules(role_kind, role_name, None)),
            Some("RoleBinding") => {
                let bns = b["metadata"]["namespace"].as_str().unwrap().to_string();
                let r = if role_kind == "Role" {
                    rules("Role", role_name, Some(&bns))
                } else {
                    rules("ClusterRole", role_name, None)
                };
                namespaced.push((bns, r));
            }
            _ => {}
        }
    }
    (cluster, namespaced)
}

/// An HTTP server on 127.0.0.1 answering 200 "hello from target" to every
/// request: the probe target of system tests (there is no internet here).
/// It lives as long as the test's runtime.
pub async fn http_target() -> std::net::SocketAddr {
    http_target_on(std::net::Ipv4Addr::LOCALHOST.into()).await
}

/// [`http_target`] on `ip`: the test cluster's `host_ip()` for a target
/// that Pods (Squid in a Pod, the operator as a Pod) must reach.
pub async fn http_target_on(ip: std::net::IpAddr) -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                read_head(&mut c).await;
                let _ = c
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\nConnection: close\r\n\r\nhello from target")
                    .await;
            });
        }
    });
    addr
}

/// The status curl reports for `url` through `proxy` (a proxy URL, with or
/// without credentials): real curl, as a crawler runs it.
pub fn curl_status(proxy: &str, url: &str) -> String {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .args(["-x", proxy, url])
        .output()
        .unwrap_or_else(|e| panic!("curl is required (apt-get install curl): {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Proxy named `name` with `spec`, in no namespace: `Api::namespaced`
/// puts it in the test's.
pub fn proxy(name: &str, spec: serde_json::Value) -> egress_proxies_operator::api::Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// A Proxy on the kubernetes provider, port 3128.
pub fn kube_proxy(name: &str) -> egress_proxies_operator::api::Proxy {
    proxy(
        name,
        serde_json::json!({"provider": "kubernetes", "port": 3128}),
    )
}

/// The Proxy's phase, as its wire string.
pub fn phase(p: &egress_proxies_operator::api::Proxy) -> Option<&'static str> {
    p.status.as_ref()?.phase.map(|ph| ph.as_str())
}

/// The Proxy's condition of `type_`.
pub fn condition<'a>(
    p: &'a egress_proxies_operator::api::Proxy,
    type_: &str,
) -> Option<&'a egress_proxies_operator::api::Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Whether Squid is installed (the test kubelet runs it for Pods).
pub fn squid_present() -> bool {
    Path::new("/usr/sbin/squid").exists()
}

/// Fails the test with the reason (never skips) when Squid is missing: the
/// node agent runs it for every Squid Pod.
pub fn require_squid_pods() {
    assert!(
        squid_present(),
        "/usr/sbin/squid is not installed: the node agent runs it for Squid Pods (apt-get install squid)"
    );
}

/// One HTTP/1.1 request to a JSON API (the discovery API) on `addr`, with
/// a bearer `token`: the status and the body as JSON (a string when it is
/// not JSON).
pub async fn api_call(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let (status, _, v) = api_call_retry_after(addr, method, path, token, body).await;
    (status, v)
}

/// [`api_call`], with the answer's `Retry-After` in seconds.
pub async fn api_call_retry_after(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (u16, Option<u64>, serde_json::Value) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "discovery");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = send
        .send_request(req.body(Full::new(hyper::body::Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, retry_after, v)
}

/// One HTTP/1.1 request on a fresh connection (from `source` when
/// given), `Connection: close`, with a bearer `token` and a JSON `body`:
/// the status and the body, or `None` when the connection was refused,
/// closed or took over 5 s (a server going away, or refusing it).
pub async fn raw_call(
    addr: std::net::SocketAddr,
    source: Option<std::net::Ipv4Addr>,
    (method, path): (&str, &str),
    token: Option<&str>,
    body: &str,
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let sock = tokio::net::TcpSocket::new_v4().ok()?;
        if let Some(ip) = source {
            sock.bind((ip, 0).into()).ok()?;
        }
        let mut c = sock.connect(addr).await.ok()?;
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
        let (_, b) = text.split_once("\r\n\r\n")?;
        Some((status, b.to_string()))
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), attempt)
        .await
        .ok()?
}

/// Reads an HTTP request or response head (up to the blank line, 64 KiB at
/// most) byte by byte, so nothing after it is consumed.
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(c: &mut S) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") && buf.len() < 65536 {
        match c.read(&mut b).await {
            Ok(1) => buf.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The repository of the operator's image in config/manager: the test
/// cluster's node agent runs the binary built from this checkout for it.
pub const OPERATOR_IMAGE: &str = "example.com/egress-proxies-operator";

/// The images this checkout's tests run on the test cluster: the default
/// Squid image (its Pods give their own command, run with the host's squid)
/// and the operator's image.
pub fn cluster_images() -> Vec<String> {
    let squid = egress_proxies_operator::config::DEFAULT_SQUID_IMAGE;
    let squid_repo = squid.rsplit_once(':').map_or(squid, |(repo, _)| repo);
    vec![
        squid_repo.to_string(),
        format!(
            "{OPERATOR_IMAGE}={}",
            env!("CARGO_BIN_EXE_egress-proxies-operator")
        ),
    ]
}

/// The test binary's one real Kubernetes cluster (or `E2E_KUBECONFIG`'s),
/// started on first use; tests share it with a namespace each. Without the
/// built control plane it panics naming `make test-cluster`, never skips.
pub fn cluster() -> &'static test_cluster::TestCluster {
    static CLUSTER: std::sync::OnceLock<test_cluster::TestCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| start_cluster(false))
}

/// Like [`cluster`] without a node agent, for tests that run no Pods.
pub fn control_plane() -> &'static test_cluster::TestCluster {
    static CLUSTER: std::sync::OnceLock<test_cluster::TestCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| start_cluster(true))
}

fn start_cluster(no_pods: bool) -> test_cluster::TestCluster {
    test_cluster::TestCluster::start(&test_cluster::Options {
        images: cluster_images(),
        no_pods,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("the test cluster must start: {e:#}"))
}

/// The operator's CRDs, applied server-side once per cluster of the test
/// binary (the fault suite uses both of its clusters) and Established.
pub fn install_crds(c: &test_cluster::TestCluster) {
    static DONE: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.iter().any(|k| k == c.kubeconfig()) {
        return;
    }
    let dir = repo().join("crds");
    let dir = dir.to_str().unwrap();
    c.kubectl_ok(&["apply", "--server-side", "-k", dir]);
    // kubectl wait fails at once, instead of waiting, on a CRD whose status
    // has no conditions yet (the moment after the apply): ask again.
    let wait = [
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/proxies.crawl.example.com",
        "crd/providerhealths.crawl.example.com",
    ];
    let started = std::time::Instant::now();
    while !c
        .kubectl()
        .args(wait)
        .output()
        .is_ok_and(|o| o.status.success())
        && started.elapsed() < std::time::Duration::from_secs(60)
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    c.kubectl_ok(&wait);
    done.push(c.kubeconfig().to_path_buf());
}

/// One test's ground: the binary's cluster (with the CRDs), an admin client
/// and a namespace of its own.
pub struct Ground {
    pub cluster: &'static test_cluster::TestCluster,
    pub client: kube::Client,
    pub ns: String,
}

/// A [`Ground`] on the cluster with the node agent (Pods run).
pub async fn ground(prefix: &str) -> Ground {
    ground_on(cluster(), prefix).await
}

/// A [`Ground`] on the cluster without a node agent (no Pods run).
pub async fn ground_without_pods(prefix: &str) -> Ground {
    ground_on(control_plane(), prefix).await
}

async fn ground_on(cluster: &'static test_cluster::TestCluster, prefix: &str) -> Ground {
    install_crds(cluster);
    let client = cluster.client().await;
    let ns = cluster.namespace(&client, prefix).await;
    Ground {
        cluster,
        client,
        ns,
    }
}

impl Ground {
    /// The operator binary (see [`operator`]) confined to this test: it
    /// watches only this namespace, keeps its Lease here, and has an
    /// installation id of its own, so operators of parallel tests never
    /// touch each other's Proxies or instances.
    /// The operator with one `kubernetes` provider whose Squid Pods may
    /// reach `target` (on the cluster bridge) and probe it for a 200,
    /// logging at info to `dir/operator.log`.
    pub fn probing_operator(&self, dir: &Path, target: std::net::SocketAddr) -> Operator {
        let mut cmd = self.operator(dir, &kubernetes_reaching("kubernetes", "", target.ip()));
        cmd.args(["--default-probe-url", &format!("http://{target}/")])
            .args(["--default-probe-expected-status", "200"])
            .env("LOG_LEVEL", "info");
        Operator::spawn(cmd, &dir.join("operator.log"))
    }

    /// The operator with its discovery API on `api`, guarded by `token`.
    pub fn discovery_operator(
        &self,
        dir: &Path,
        providers: &str,
        api: std::net::SocketAddr,
        token: &str,
    ) -> Command {
        let mut cmd = self.operator(dir, providers);
        cmd.args(["--discovery-bind-address", &api.to_string()])
            .env("DISCOVERY_TOKEN", token);
        cmd
    }

    pub fn operator(&self, dir: &Path, providers: &str) -> Command {
        let mut cmd = operator(dir, providers, self.cluster.kubeconfig());
        cmd.args([
            "--proxy-namespace",
            &self.ns,
            "--operator-namespace",
            &self.ns,
        ])
        .env("INSTALLATION_ID", &self.ns)
        .env("POD_NAMESPACE", &self.ns);
        cmd
    }

    /// Proxies of this namespace.
    pub fn proxies(&self) -> kube::Api<egress_proxies_operator::api::Proxy> {
        kube::Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Any namespaced kind of this namespace.
    pub fn api<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        kube::Api::namespaced(self.client.clone(), &self.ns)
    }

    /// kubectl in this namespace; panics unless it succeeds; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.ns.as_str()];
        all.extend_from_slice(args);
        self.cluster.kubectl_ok(&all)
    }

    /// Where to bind a server that Pods of this cluster must reach.
    pub fn host_ip(&self) -> std::net::IpAddr {
        self.cluster.host_ip()
    }
}

/// Panics unless the events at `times_ms` (sorted, in milliseconds) keep a
/// token bucket of `burst` refilled one token per `interval_ms`: no window
/// holds more than the burst plus one per interval of its length, which
/// is stretched by `slack_ms` for the way from the operator to where the
/// events are seen.
pub fn assert_within_rate(times_ms: &[i64], burst: usize, interval_ms: i64, slack_ms: i64) {
    for i in 0..times_ms.len() {
        for j in i..times_ms.len() {
            let span = times_ms[j] - times_ms[i];
            let allowed = burst + usize::try_from((span + slack_ms) / interval_ms).unwrap();
            assert!(
                j - i < allowed,
                "{} creates within {span} ms: more than the {allowed} the bucket allows",
                j - i + 1
            );
        }
    }
}

/// A tiny HTTP server on `ip` answering `status` and `body` to every
/// request, recording the request heads; stops when the test's runtime ends.
pub async fn recording_target(
    ip: std::net::IpAddr,
    status: u16,
    body: &'static str,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let head = read_head(&mut c).await;
                s.lock().unwrap().push(head);
                let _ = c
                    .write_all(
                        format!(
                            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A TLS server for `ip` signed by a fresh CA; returns its address
/// and the CA PEM.
pub async fn tls_target_on(ip: std::net::IpAddr) -> (std::net::SocketAddr, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    use tokio::io::AsyncWriteExt;
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "probe test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![ip.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg));
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(c).await {
                    let _ = read_head(&mut tls).await;
                    let _ = tls
                        .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                        .await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    (addr, ca_cert.pem())
}

/// The test process's trace backend (Jaeger, started on first use).
pub use test_cluster::jaeger::{jaeger, Trace};

/// The `OTEL_*` variables that have the operator export its spans to the
/// test process's Jaeger over `protocol` (`grpc` or `http/protobuf`) every
/// 200 ms, as `service` (one per test: the tests of a binary share one
/// Jaeger, and find their traces by service).
pub fn otel_to_jaeger(protocol: &str, service: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger().endpoint(protocol)),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
        ("OTEL_SERVICE_NAME", service.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".to_string()),
    ]
}

/// The trace id of a text log line (`traceID=<hex>`).
pub fn trace_id_of(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("traceID=")?;
    let id: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
    (!id.is_empty()).then_some(id)
}

/// The creating reconcile's trace `trace_id` of the Proxy `ns/name`, found
/// by its id through Jaeger's query API once whole, as a user sees it: a
/// root `Reconcile Proxy` span of `service` naming the Proxy, with
/// `provider.create` of `provider` below it and the Kubernetes client
/// call that created the instance's Pod below that. Panics saying what is
/// missing; returns the trace.
pub async fn creating_reconcile_trace(
    trace_id: &str,
    service: &str,
    ns: &str,
    name: &str,
    provider: &str,
) -> Trace {
    let trace = jaeger()
        .wait_trace(trace_id, std::time::Duration::from_secs(30), |t| {
            t.named("provider.create").any(|c| {
                t.ancestry(c).last().map(String::as_str) == Some("Reconcile Proxy")
                    && t.children(c).any(|k| k.tags.contains_key("http.method"))
            })
        })
        .await;
    let root = trace
        .named("Reconcile Proxy")
        .find(|r| r.parent.is_none())
        .unwrap_or_else(|| panic!("no root Reconcile Proxy span: {trace:#?}"));
    assert_eq!(root.service, service, "{root:?}");
    assert_eq!(
        root.tag("k8s.object.name").as_deref(),
        Some(name),
        "{root:?}"
    );
    assert_eq!(
        root.tag("k8s.namespace.name").as_deref(),
        Some(ns),
        "{root:?}"
    );
    let create = trace
        .named("provider.create")
        .find(|c| trace.is_below(c, root))
        .unwrap_or_else(|| panic!("no provider.create below the root: {trace:#?}"));
    assert_eq!(
        create.tag("provider.name").as_deref(),
        Some(provider),
        "{create:?}"
    );
    let post = trace
        .children(create)
        .find(|k| k.tags.contains_key("http.method"))
        .unwrap_or_else(|| panic!("no client span below provider.create: {trace:#?}"));
    println!(
        "trace {trace_id}: {} spans; {}",
        trace.spans.len(),
        trace.ancestry(post).join(" < ")
    );
    trace
}
