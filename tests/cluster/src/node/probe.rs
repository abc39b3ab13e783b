//! Readiness, liveness and startup probes: `httpGet` and `tcpSocket` from
//! the host to the Pod IP, `exec` through a helper in the container's
//! namespaces.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How often and how strictly a probe runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// The probe's timing with Kubernetes' defaults (period 10 s, timeout 1 s,
/// thresholds 1 and 3).
pub fn timing(p: &Probe) -> Timing {
    let secs =
        |v: Option<i32>, d: i32, min: i32| Duration::from_secs(v.unwrap_or(d).max(min) as u64);
    let count = |v: Option<i32>, d: i32| v.unwrap_or(d).max(1) as u32;
    Timing {
        initial_delay: secs(p.initial_delay_seconds, 0, 0),
        period: secs(p.period_seconds, 10, 1),
        timeout: secs(p.timeout_seconds, 1, 1),
        success_threshold: count(p.success_threshold, 1),
        failure_threshold: count(p.failure_threshold, 3),
    }
}

/// Turns results into a verdict after enough consecutive ones.
#[derive(Debug, Default)]
pub struct Counter {
    successes: u32,
    failures: u32,
}

/// What a result changes.
#[derive(Debug, PartialEq, Clone, Copy)]
pub enum Verdict {
    Success,
    Failure,
    Undecided,
}

impl Counter {
    pub fn record(&mut self, ok: bool, t: &Timing) -> Verdict {
        if ok {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= t.success_threshold {
                return Verdict::Success;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= t.failure_threshold {
                return Verdict::Failure;
            }
        }
        Verdict::Undecided
    }
}

/// Resolves a probe port: a number, or the name of a container port.
pub fn port(container: &Container, p: &IntOrString) -> Result<u16, String> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .and_then(|cp| u16::try_from(cp.container_port).ok())
                .ok_or_else(|| format!("no container port named {name:?}"))
        }
    }
}

/// Whether an HTTP status line means success (200..400).
pub fn http_ok(status_line: &str) -> bool {
    status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .is_some_and(|c| (200..400).contains(&c))
}

/// One `httpGet` attempt.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    host: Option<&str>,
    headers: &[(String, String)],
) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let host = host.map(str::to_string).unwrap_or_else(|| addr.to_string());
    let path = if path.is_empty() { "/" } else { path };
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.contains(&b'\n') && buf.len() < 4096 {
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().next().unwrap_or_default();
    if http_ok(line) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with {line:?}"))
    }
}

/// One `tcpSocket` attempt.
pub async fn tcp(addr: SocketAddr) -> Result<(), String> {
    TcpStream::connect(addr)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What the probe targets.
pub enum Action {
    Http {
        addr: SocketAddr,
        path: String,
        host: Option<String>,
        headers: Vec<(String, String)>,
    },
    Tcp(SocketAddr),
    Exec(Vec<String>),
}

/// The probe's action against `pod_ip`.
pub fn action(p: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Result<Action, String> {
    if let Some(h) = &p.http_get {
        if h.scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"))
        {
            return Err("HTTPS probes are not supported by the test node agent".into());
        }
        let port = port(container, &h.port)?;
        let host = h.host.clone().filter(|h| !h.is_empty());
        let ip = host
            .as_deref()
            .and_then(|h| h.parse::<Ipv4Addr>().ok())
            .unwrap_or(pod_ip);
        let mut headers = Vec::new();
        let mut host_header = None;
        for hh in h.http_headers.iter().flatten() {
            if hh.name.eq_ignore_ascii_case("host") {
                host_header = Some(hh.value.clone());
            } else {
                headers.push((hh.name.clone(), hh.value.clone()));
            }
        }
        return Ok(Action::Http {
            addr: SocketAddr::from((ip, port)),
            path: h.path.clone().unwrap_or_else(|| "/".into()),
            host: host_header,
            headers,
        });
    }
    if let Some(t) = &p.tcp_socket {
        let port = port(container, &t.port)?;
        let ip = t
            .host
            .as_deref()
            .and_then(|h| h.parse::<Ipv4Addr>().ok())
            .unwrap_or(pod_ip);
        return Ok(Action::Tcp(SocketAddr::from((ip, port))));
    }
    if let Some(e) = &p.exec {
        return Ok(Action::Exec(e.command.clone().unwrap_or_default()));
    }
    if p.grpc.is_some() {
        return Err("gRPC probes are not supported by the test node agent".into());
    }
    Err("the probe has no action".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn timings_and_defaults() {
        let t = timing(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let t = timing(&Probe {
            initial_delay_seconds: Some(5),
            period_seconds: Some(2),
            failure_threshold: Some(1),
            success_threshold: Some(2),
            ..Default::default()
        });
        assert_eq!(t.initial_delay, Duration::from_secs(5));
        assert_eq!(t.period, Duration::from_secs(2));
        assert_eq!((t.success_threshold, t.failure_threshold), (2, 1));
    }

    #[test]
    fn counts_thresholds() {
        let t = Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 2,
            failure_threshold: 3,
        };
        let mut c = Counter::default();
        let got: Vec<Verdict> = [true, true, false, false, true, false, false, false]
            .iter()
            .map(|ok| c.record(*ok, &t))
            .collect();
        use Verdict::*;
        assert_eq!(
            got,
            vec![
                Undecided, Success, Undecided, Undecided, Undecided, Undecided, Undecided, Failure
            ]
        );
    }

    #[test]
    fn ports_by_number_and_name() {
        let c = Container {
            ports: Some(vec![ContainerPort {
                name: Some("proxy".into()),
                container_port: 3128,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(port(&c, &IntOrString::Int(8080)), Ok(8080));
        assert_eq!(port(&c, &IntOrString::String("proxy".into())), Ok(3128));
        assert_eq!(port(&c, &IntOrString::String("81".into())), Ok(81));
        assert!(port(&c, &IntOrString::String("nope".into())).is_err());
        assert!(port(&c, &IntOrString::Int(70000)).is_err());
    }

    #[test]
    fn http_status_lines() {
        assert!(http_ok("HTTP/1.1 200 OK"));
        assert!(http_ok("HTTP/1.0 302 Found"));
        assert!(!http_ok("HTTP/1.1 404 Not Found"));
        assert!(!http_ok("HTTP/1.1 500 Oops"));
        assert!(!http_ok(""));
    }

    #[tokio::test]
    async fn http_get_against_a_local_server() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let resp = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        assert!(http_get(addr, "/healthz", None, &[]).await.is_ok());
        assert!(http_get(addr, "/healthz", None, &[]).await.is_err());
    }
}
