//! One probe: fetch a URL **through** the proxy. `https://` targets go
//! through a real `CONNECT` tunnel, then TLS and an HTTP/1.1 request inside
//! it; `http://` targets are sent to the proxy as a forward request with an
//! absolute URI. Requests are written by hand so nothing, in particular no
//! `traceparent` or other tracing header, is ever added to what goes
//! through a proxy to an outside site.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use url::Url;

pub use super::dns::Resolver;
pub use super::error::ProbeError;
use crate::credentials::Credentials;
use crate::tenancy::ProbeDenylist;

/// Longest response head (status line and headers) read.
const MAX_HEAD: usize = 16 * 1024;
/// The probe's User-Agent.
pub const USER_AGENT: &str = concat!("egress-proxies-operator-probe/", env!("CARGO_PKG_VERSION"));

/// What to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// Host of the proxy (IP or name).
    pub proxy_host: String,
    /// Port of the proxy.
    pub proxy_port: u16,
    /// Addresses the proxy's host must not be or resolve to (External
    /// Proxies); `None`: any.
    pub deny: Option<Arc<ProbeDenylist>>,
    /// The URL fetched through it.
    pub url: Url,
    /// The status the URL must answer with.
    pub expected_status: u16,
    /// Limit for the whole probe.
    pub timeout: Duration,
    /// The proxy's credentials, sent as `Proxy-Authorization` (its
    /// `Debug` hides the password).
    pub credentials: Option<Credentials>,
}

/// The result of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// The expected status came back in time.
    pub ok: bool,
    /// How long it took (up to the timeout).
    pub latency: Duration,
    /// Why it failed.
    pub error: Option<ProbeError>,
}

/// Builds the probe TLS configuration: the webpki roots plus every
/// certificate of `ca_file` (PEM).
pub fn tls_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let mut n = 0;
        for cert in CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?
        {
            let cert = cert.map_err(|e| format!("parsing {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("adding a CA from {}: {e}", path.display()))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("{} holds no PEM certificate", path.display()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// How much of the check a probe does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// The whole fetch: for an https URL, CONNECT, TLS and the request
    /// inside the tunnel.
    Full,
    /// For an https URL, only that the proxy accepts the CONNECT (Squid
    /// answers it once it reached the target); an http URL is always
    /// fetched whole.
    Connect,
}

impl Depth {
    /// How deep the next probe of a Proxy goes: full unless its URL is
    /// https (`tunnel`), its last probe passed and a full one passed
    /// `since` probes ago, fewer than `every` - 1 probes since (so every
    /// `every`th probe is full). A failure makes the next probe full, so a
    /// proxy going bad is judged on full probes at the thresholds' pace.
    pub fn next(tunnel: bool, since: Option<u32>, every: u32) -> Depth {
        match since {
            Some(n) if tunnel && n.saturating_add(1) < every => Depth::Connect,
            _ => Depth::Full,
        }
    }
}

/// What a probe sends, built once per target: the request bytes (with
/// the credentials in them) and the TLS name. Its `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub enum Wire {
    /// An http URL: the forward request.
    Forward(Box<[u8]>),
    /// An https URL: the CONNECT, the target's TLS name, the request
    /// inside the tunnel.
    Tunnel {
        /// The CONNECT request.
        connect: Box<[u8]>,
        /// The name the target's certificate must hold.
        name: ServerName<'static>,
        /// The GET sent through the tunnel.
        request: Box<[u8]>,
    },
    /// The URL cannot be probed: every probe fails with this.
    Invalid(ProbeError),
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wire::Forward(_) => f.write_str("Wire::Forward(..)"),
            Wire::Tunnel { .. } => f.write_str("Wire::Tunnel(..)"),
            Wire::Invalid(e) => write!(f, "Wire::Invalid({e})"),
        }
    }
}

impl Wire {
    /// The bytes `target` sends, or why its URL cannot be probed.
    pub fn of(target: &ProbeTarget) -> Wire {
        Self::build(target).unwrap_or_else(Wire::Invalid)
    }

    fn build(target: &ProbeTarget) -> Result<Wire, ProbeError> {
        let host = host_header(&target.url)?;
        // Only ever to the proxy: it consumes the header (a CONNECT's never
        // reaches the target; Squid drops it from a forward request).
        let auth = match &target.credentials {
            Some(c) => format!("Proxy-Authorization: {}\r\n", c.proxy_authorization()),
            None => String::new(),
        };
        match target.url.scheme() {
            "http" => {
                // Forward request: the absolute URI goes to the proxy.
                let mut abs = target.url.clone();
                abs.set_fragment(None);
                let req = format!(
                    "GET {abs} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n{auth}Accept: */*\r\nConnection: close\r\n\r\n"
                );
                Ok(Wire::Forward(req.into_bytes().into()))
            }
            "https" => {
                let (h, port) = host_port(&target.url)?;
                let authority = if h.contains(':') {
                    format!("[{h}]:{port}")
                } else {
                    format!("{h}:{port}")
                };
                let connect = format!(
                    "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: {USER_AGENT}\r\n{auth}\r\n"
                );
                let name = ServerName::try_from(h.trim_matches(['[', ']']).to_string())
                    .map_err(|e| ProbeError::Tls(format!("invalid TLS server name {h:?}: {e}")))?;
                let request = format!(
                    "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
                    path_and_query(&target.url)
                );
                Ok(Wire::Tunnel {
                    connect: connect.into_bytes().into(),
                    name,
                    request: request.into_bytes().into(),
                })
            }
            other => Err(ProbeError::Url(format!(
                "unsupported probe URL scheme {other:?}"
            ))),
        }
    }

    /// Whether a [`Depth::Connect`] probe checks less than a full one
    /// (an https URL).
    pub fn is_tunnel(&self) -> bool {
        matches!(self, Wire::Tunnel { .. })
    }
}

/// Runs one full probe, resolving a host name each time; never panics,
/// never exceeds `target.timeout` by more than scheduling noise.
pub async fn probe(target: &ProbeTarget, tls: &Arc<ClientConfig>) -> ProbeResult {
    let wire = Wire::of(target);
    probe_with(target, &wire, Depth::Full, tls, &Resolver::default()).await
}

/// Runs one probe of `target` sending `wire` (built from it), as deep as
/// `depth` says, resolving a host name through `dns`.
pub async fn probe_with(
    target: &ProbeTarget,
    wire: &Wire,
    depth: Depth,
    tls: &Arc<ClientConfig>,
    dns: &Resolver,
) -> ProbeResult {
    let start = Instant::now();
    let res = tokio::time::timeout(target.timeout, run(target, wire, depth, tls, dns)).await;
    let latency = start.elapsed();
    let error = match res {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(ProbeError::Timeout(target.timeout)),
    };
    ProbeResult {
        ok: error.is_none(),
        latency,
        error,
    }
}

fn host_port(url: &Url) -> Result<(String, u16), ProbeError> {
    let host = url
        .host_str()
        .ok_or_else(|| ProbeError::Url("probe URL has no host".into()))?;
    let port = url
        .port_or_known_default()
        .ok_or_else(|| ProbeError::Url("probe URL has no port".into()))?;
    Ok((host.to_string(), port))
}

fn path_and_query(url: &Url) -> String {
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    }
}

fn host_header(url: &Url) -> Result<String, ProbeError> {
    let (host, port) = host_port(url)?;
    Ok(match url.port() {
        Some(_) => format!("{host}:{port}"),
        None => host,
    })
}

/// The proxy's addresses, checked against the target's denylist before
/// anything is dialled: the connection goes to exactly the addresses
/// checked (a name cannot resolve to another one in between), and a
/// denied one fails the probe without a packet sent, so its message says
/// nothing of what listens there.
async fn resolve(
    target: &ProbeTarget,
    dns: &Resolver,
) -> Result<Vec<std::net::SocketAddr>, ProbeError> {
    let addrs = dns.resolve(&target.proxy_host, target.proxy_port).await?;
    if let Some(deny) = &target.deny {
        if addrs.iter().any(|a| deny.denies(a.ip())) {
            return Err(ProbeError::Denied(target.proxy_host.clone()));
        }
    }
    Ok(addrs)
}

async fn run(
    target: &ProbeTarget,
    wire: &Wire,
    depth: Depth,
    tls: &Arc<ClientConfig>,
    dns: &Resolver,
) -> Result<(), ProbeError> {
    if let Wire::Invalid(e) = wire {
        return Err(e.clone());
    }
    let addrs = resolve(target, dns).await?;
    let mut conn = TcpStream::connect(&addrs[..])
        .await
        .map_err(|e| ProbeError::connect(&e))?;
    let _ = conn.set_nodelay(true);
    let mut buf = Vec::with_capacity(READ_CHUNK);
    match wire {
        Wire::Forward(req) => exchange(&mut conn, req, &mut buf, target.expected_status).await,
        Wire::Tunnel {
            connect,
            name,
            request,
        } => {
            conn.write_all(connect)
                .await
                .map_err(|e| ProbeError::io("sending CONNECT", &e))?;
            let status = read_status(&mut conn, &mut buf, Head::Whole, "proxy").await?;
            if !(200..300).contains(&status) {
                return Err(ProbeError::ProxyRefused(status));
            }
            if depth == Depth::Connect {
                return Ok(());
            }
            let mut stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name.clone(), conn)
                .await
                .map_err(|e| ProbeError::Tls(format!("TLS through the tunnel: {e}")))?;
            exchange(&mut stream, request, &mut buf, target.expected_status).await
        }
        Wire::Invalid(e) => Err(e.clone()),
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    req: &[u8],
    buf: &mut Vec<u8>,
    expected: u16,
) -> Result<(), ProbeError> {
    s.write_all(req)
        .await
        .map_err(|e| ProbeError::io("sending the request", &e))?;
    let status = read_status(s, buf, Head::StatusLine, "target").await?;
    if status == expected {
        Ok(())
    } else {
        Err(ProbeError::Status {
            who: "target",
            status,
            expected,
        })
    }
}

/// Bytes asked of one `read()`: a whole head in one call as a rule.
const READ_CHUNK: usize = 1024;

/// How much of a response head [`read_status`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Head {
    /// Up to the blank line: a CONNECT's answer. When it accepts, the
    /// tunnel follows, and the target speaks only after the client's TLS
    /// hello, so a byte past the head is a protocol error.
    Whole,
    /// Up to the end of the status line: the connection is closed after.
    StatusLine,
}

/// Reads a response head in chunks and returns its status.
async fn read_status<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    head: Head,
    who: &'static str,
) -> Result<u16, ProbeError> {
    buf.clear();
    let end = loop {
        let from = buf.len().saturating_sub(3);
        if buf.len() >= MAX_HEAD {
            return Err(ProbeError::Protocol(format!(
                "{who} response head exceeds {MAX_HEAD} bytes"
            )));
        }
        buf.reserve(READ_CHUNK);
        match s.read_buf(buf).await {
            Ok(0) if buf.is_empty() => return Err(ProbeError::Closed(who)),
            Ok(0) => break None,
            Ok(_) => {}
            Err(e) => return Err(ProbeError::io(&format!("reading the {who} response"), &e)),
        }
        let found = match head {
            Head::Whole => find(&buf[from..], b"\r\n\r\n").map(|i| from + i + 4),
            Head::StatusLine => find(buf, b"\n").map(|i| i + 1),
        };
        if let Some(end) = found {
            break Some(end);
        }
    };
    let status = parse_status(buf)
        .ok_or_else(|| ProbeError::Protocol(format!("{who} sent no valid HTTP status line")))?;
    // A refusal may come with a body; an accepted tunnel must be clean.
    if head == Head::Whole && (200..300).contains(&status) && end.is_some_and(|e| e < buf.len()) {
        return Err(ProbeError::Protocol(format!(
            "{who} sent data past its answer to the CONNECT before the tunnel was used"
        )));
    }
    Ok(status)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status of `HTTP/1.x NNN ...`.
pub fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok().filter(|c| (100..=599).contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        let cases: [(&[u8], Option<u16>); 7] = [
            (b"HTTP/1.1 204 No Content\r\n\r\n", Some(204)),
            (b"HTTP/1.0 200 OK\r\nA: b\r\n\r\n", Some(200)),
            (b"HTTP/1.1 403\r\n\r\n", Some(403)),
            (b"HTTP/2 200\r\n\r\n", None),
            (b"SSH-2.0-OpenSSH\r\n", None),
            (b"HTTP/1.1 99 x\r\n", None),
            (b"", None),
        ];
        for (head, want) in cases {
            assert_eq!(
                parse_status(head),
                want,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn request_parts() {
        let u = Url::parse("https://example.com/generate_204?x=1#f").unwrap();
        assert_eq!(host_port(&u).unwrap(), ("example.com".into(), 443));
        assert_eq!(path_and_query(&u), "/generate_204?x=1");
        assert_eq!(host_header(&u).unwrap(), "example.com");
        let u = Url::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(host_header(&u).unwrap(), "127.0.0.1:8080");
    }

    #[test]
    fn ca_file_errors_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "").unwrap();
        assert!(tls_config(Some(&p))
            .unwrap_err()
            .contains("no PEM certificate"));
        assert!(tls_config(Some(&dir.path().join("missing.pem"))).is_err());
        assert!(tls_config(None).is_ok());
    }
}
