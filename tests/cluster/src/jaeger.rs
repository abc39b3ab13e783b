//! A real trace backend for the tests: Jaeger's all-in-one (`jaeger`,
//! built by `make test-cluster` from tests/cluster/go/jaeger), one per test
//! process, started on first use. It keeps spans in memory, takes OTLP over
//! gRPC and HTTP, and answers its query API; every listener is on
//! 127.0.0.1 at a port picked here, so test binaries running side by side
//! never meet. The kernel kills it when the test process is gone.
//!
//! The query side reads Jaeger's HTTP query API (`/api/traces`), what its
//! UI shows a user: traces by id, and by service and operation.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::handle::bin;
use crate::process::{free_port, tail};

/// The running Jaeger and where it listens.
pub struct Jaeger {
    /// OTLP/gRPC receiver: `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`.
    pub otlp_grpc: SocketAddr,
    /// OTLP/HTTP receiver: `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`.
    pub otlp_http: SocketAddr,
    /// The query service's HTTP API (and UI).
    pub query: SocketAddr,
    /// Its output.
    pub log: PathBuf,
    _child: Mutex<Child>,
}

/// The test process's Jaeger, started on first use. Without the built
/// program it panics naming `make test-cluster` (under CI as anywhere:
/// never a skip).
pub fn jaeger() -> &'static Jaeger {
    static JAEGER: OnceLock<Jaeger> = OnceLock::new();
    JAEGER.get_or_init(|| Jaeger::start().unwrap_or_else(|e| panic!("Jaeger must start: {e:#}")))
}

/// Jaeger v2's configuration: memory storage, OTLP receivers and the query
/// service on the given loopback addresses, and nothing else listening
/// (no health check, metrics, zpages, remote sampling or query gRPC port
/// beyond the one given: the defaults of those bind fixed ports).
fn config(grpc: SocketAddr, http: SocketAddr, query: SocketAddr, query_grpc: SocketAddr) -> String {
    format!(
        "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: {query}
    grpc:
      endpoint: {query_grpc}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {grpc}
      http:
        endpoint: {http}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"
    )
}

impl Jaeger {
    fn start() -> anyhow::Result<Jaeger> {
        let program = bin("jaeger");
        let base = std::env::var_os("TEST_CLUSTER_STATE")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        sweep(&base);
        let dir = base.join(format!("jaeger-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // Ports are picked free, then bound by Jaeger a moment later:
        // another process may take one in between; that is worth a retry.
        let mut attempt = 1;
        loop {
            match Self::start_once(&program, &dir) {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!("jaeger: a port was taken while starting (attempt {attempt}); starting again");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once(program: &Path, dir: &Path) -> anyhow::Result<Jaeger> {
        let port = || free_port().map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        let (otlp_grpc, otlp_http, query, query_grpc) = (port()?, port()?, port()?, port()?);
        let conf = dir.join("config.yaml");
        std::fs::write(&conf, config(otlp_grpc, otlp_http, query, query_grpc))?;
        let log = dir.join("jaeger.log");
        let out = std::fs::File::create(&log)?;
        let mut cmd = Command::new(program);
        cmd.arg("--config")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let mut child =
            spawn_for_life(cmd).with_context(|| format!("starting {}", program.display()))?;
        // Ready when the query API answers and both receivers accept.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "jaeger exited ({status}); the end of {}:\n{}",
                    log.display(),
                    tail(&log, 30)
                );
            }
            let up = |a: SocketAddr| {
                std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok()
            };
            if up(otlp_grpc)
                && up(otlp_http)
                && get_blocking(query, "/api/services").is_ok_and(|(s, _)| s == 200)
            {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!(
                    "jaeger was not ready within 60 s; the end of {}:\n{}",
                    log.display(),
                    tail(&log, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Jaeger {
            otlp_grpc,
            otlp_http,
            query,
            log,
            _child: Mutex::new(child),
        })
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for an exporter using `protocol`
    /// (`grpc` or `http/protobuf`).
    pub fn endpoint(&self, protocol: &str) -> String {
        match protocol {
            "grpc" => format!("http://{}", self.otlp_grpc),
            _ => format!("http://{}", self.otlp_http),
        }
    }

    /// The trace `trace_id` (hex) as stored now; None while Jaeger has no
    /// span of it.
    pub async fn trace(&self, trace_id: &str) -> anyhow::Result<Option<Trace>> {
        let (status, body) = get(self.query, &format!("/api/traces/{trace_id}")).await?;
        if status == 404 {
            return Ok(None);
        }
        anyhow::ensure!(status == 200, "GET /api/traces/{trace_id}: {status} {body}");
        Ok(parse(&body)?.into_iter().next())
    }

    /// Traces of `service` holding a span named `operation` (any span
    /// when empty) of the last hour, newest first (at most 1,000), as the
    /// UI's search finds them.
    pub async fn find(&self, service: &str, operation: &str) -> anyhow::Result<Vec<Trace>> {
        let mut path = format!(
            "/api/traces?service={}&lookback=1h&limit=1000",
            encode(service)
        );
        if !operation.is_empty() {
            path.push_str(&format!("&operation={}", encode(operation)));
        }
        let (status, body) = get(self.query, &path).await?;
        anyhow::ensure!(status == 200, "GET {path}: {status} {body}");
        parse(&body)
    }

    /// The trace `trace_id` once it exists and `complete` holds for it
    /// (spans are exported in batches, so a trace fills in over time);
    /// panics after `timeout` with what was stored then.
    pub async fn wait_trace(
        &self,
        trace_id: &str,
        timeout: Duration,
        complete: impl Fn(&Trace) -> bool,
    ) -> Trace {
        let what = format!("trace {trace_id} complete");
        let found = poll(
            &what,
            timeout,
            async || self.trace(trace_id).await,
            |t| t.as_ref().is_some_and(&complete),
        )
        .await;
        found.unwrap_or_else(|| unreachable!("polled until present"))
    }

    /// The traces of `service` with a span `operation` once `wanted`
    /// holds for them all (spans arrive in batches); panics after
    /// `timeout` with what was found.
    pub async fn wait_find(
        &self,
        service: &str,
        operation: &str,
        timeout: Duration,
        wanted: impl Fn(&[Trace]) -> bool,
    ) -> Vec<Trace> {
        let what =
            format!("the traces of service {service:?} with operation {operation:?} as wanted");
        poll(
            &what,
            timeout,
            async || self.find(service, operation).await,
            |f| wanted(f),
        )
        .await
    }
}

/// Asks Jaeger with `ask` every 300 ms until its answer is `done`;
/// panics naming `what` after `timeout`, with the last answer.
async fn poll<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    ask: impl AsyncFn() -> anyhow::Result<T>,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let last = ask().await;
        match last {
            Ok(v) if done(&v) => return v,
            _ => assert!(
                Instant::now() < deadline,
                "not in Jaeger within {timeout:?}: {what}; last answer: {last:#?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// One trace as the query API returns it.
#[derive(Clone, Debug)]
pub struct Trace {
    pub id: String,
    pub spans: Vec<Span>,
}

/// One span: ids in hex, `parent` the span it is a child of (None for a
/// root), `service` its process's service name, `tags` its attributes.
#[derive(Clone, Debug)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent: Option<String>,
    pub name: String,
    pub service: String,
    pub tags: BTreeMap<String, serde_json::Value>,
}

impl Span {
    /// The attribute `key` as text (strings as they are, others printed).
    pub fn tag(&self, key: &str) -> Option<String> {
        self.tags.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

impl Trace {
    /// The spans named `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Span> + 'a {
        self.spans.iter().filter(move |s| s.name == name)
    }

    /// The span `id`.
    pub fn span(&self, id: &str) -> Option<&Span> {
        self.spans.iter().find(|s| s.span_id == id)
    }

    /// The direct children of `parent`.
    pub fn children<'a>(&'a self, parent: &'a Span) -> impl Iterator<Item = &'a Span> + 'a {
        self.spans
            .iter()
            .filter(move |s| s.parent.as_deref() == Some(parent.span_id.as_str()))
    }

    /// The names from `s` up to its root: `s` first.
    pub fn ancestry(&self, s: &Span) -> Vec<String> {
        let mut out = vec![s.name.clone()];
        let mut cur = s;
        while let Some(p) = cur.parent.as_deref().and_then(|p| self.span(p)) {
            out.push(p.name.clone());
            cur = p;
            if out.len() > self.spans.len() {
                break;
            }
        }
        out
    }

    /// Whether `s` is below `ancestor` (at any depth).
    pub fn is_below(&self, s: &Span, ancestor: &Span) -> bool {
        let mut cur = s;
        for _ in 0..=self.spans.len() {
            match cur.parent.as_deref().and_then(|p| self.span(p)) {
                Some(p) if p.span_id == ancestor.span_id => return true,
                Some(p) => cur = p,
                None => return false,
            }
        }
        false
    }
}

/// The query API's `{"data": [trace...]}` as [`Trace`]s.
fn parse(body: &str) -> anyhow::Result<Vec<Trace>> {
    let v: serde_json::Value =
        serde_json::from_str(body).context("the query API's answer is JSON")?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    for t in v["data"].as_array().into_iter().flatten() {
        let services: BTreeMap<String, String> = t["processes"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(id, p)| (id.clone(), text(&p["serviceName"])))
            .collect();
        let spans = t["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| Span {
                trace_id: text(&s["traceID"]),
                span_id: text(&s["spanID"]),
                parent: s["references"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["refType"] == "CHILD_OF")
                    .map(|r| text(&r["spanID"])),
                name: text(&s["operationName"]),
                service: services
                    .get(&text(&s["processID"]))
                    .cloned()
                    .unwrap_or_default(),
                tags: s["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|kv| (text(&kv["key"]), kv["value"].clone()))
                    .collect(),
            })
            .collect();
        out.push(Trace {
            id: text(&t["traceID"]),
            spans,
        });
    }
    Ok(out)
}

/// A query parameter, percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` over HTTP/1.0 (the answer ends with the connection):
/// the status and the body.
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        c.write_all(request(addr, path).as_bytes()).await?;
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .with_context(|| format!("GET {path}: no answer within 10 s"))??;
    answer(&raw)
}

/// [`get`] without a runtime, for the start.
fn get_blocking(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    c.write_all(request(addr, path).as_bytes())?;
    let mut raw = Vec::new();
    c.read_to_end(&mut raw)?;
    answer(&raw)
}

fn request(addr: SocketAddr, path: &str) -> String {
    format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n")
}

fn answer(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").context("an HTTP answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("a status line: {head}"))?;
    Ok((status, body.to_string()))
}

/// Starts `cmd` from a thread that lives as long as the process, with the
/// parent-death signal set: the kernel sends it when the spawning thread
/// ends, so from a test's own (short-lived) runtime thread it would kill
/// Jaeger at that test's end; from this thread, only at the process's.
fn spawn_for_life(mut cmd: Command) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe and touches no memory of the
    // parent; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("jaeger-parent".into())
        .spawn(move || {
            let _ = tx.send(cmd.spawn());
            loop {
                std::thread::park();
            }
        })?;
    rx.recv().map_err(std::io::Error::other)?
}

/// Removes the state directories of Jaegers whose test process is gone.
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("jaeger-")) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
