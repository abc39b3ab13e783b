//! Dialing an upstream proxy, and asking it for a tunnel. Errors are
//! classified here, once: each says in plain words what the upstream did.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::fleet::Upstream;

/// The longest answer head to a CONNECT an upstream may send.
const MAX_HEAD: usize = 16 * 1024;

/// The most of a refused CONNECT's body (Squid's error page, about 4 KiB)
/// kept to relay to the crawler; the rest is cut.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// A CONNECT the upstream answered with an error about the target
/// ([`super::blame::of_answer`]): relayed to the crawler as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetAnswer {
    pub status: u16,
    /// Its `Content-Type`, `X-Squid-Error` and `Retry-After`, when given.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Its body, up to [`MAX_ERROR_BODY`].
    pub body: Bytes,
}

/// What a CONNECT through an upstream gave.
#[derive(Debug)]
pub enum Opened {
    /// The tunnel, and any bytes the upstream sent after its answer.
    Tunnel(TcpStream, Bytes),
    /// The upstream is fine; the target is not.
    Target(TargetAnswer),
}

/// The headers of a refused CONNECT worth relaying.
const RELAYED: [&str; 3] = ["content-type", "x-squid-error", "retry-after"];

/// Why an upstream gave no connection or tunnel.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("could not connect to the upstream proxy: {0}")]
    Connect(std::io::Error),
    #[error("the upstream proxy did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the upstream proxy answered the CONNECT with {0}")]
    Refused(u16),
    #[error("the upstream proxy's answer was not HTTP: {0}")]
    Malformed(String),
    #[error("the upstream proxy closed the connection: {0}")]
    Closed(std::io::Error),
    #[error("the upstream proxy cannot be dialled: {0}")]
    Denied(String),
}

impl UpstreamError {
    /// The metrics' class of the error.
    pub fn class(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) | UpstreamError::Denied(_) => "connect",
            UpstreamError::Timeout(_) => "timeout",
            UpstreamError::Refused(407) => "credentials",
            UpstreamError::Refused(_) => "refused",
            UpstreamError::Malformed(_) | UpstreamError::Closed(_) => "protocol",
        }
    }
}

/// A TCP connection to `up` (at its pinned address), within `limit`.
pub async fn dial(up: &Upstream, limit: Duration) -> Result<TcpStream, UpstreamError> {
    let work = async {
        let addr = up
            .pin
            .address(&up.host, up.port)
            .await
            .map_err(UpstreamError::Denied)?;
        TcpStream::connect(addr)
            .await
            .map_err(UpstreamError::Connect)
    };
    let conn = tokio::time::timeout(limit, work)
        .await
        .map_err(|_| UpstreamError::Timeout(limit))??;
    // Tunnels carry interactive traffic (TLS handshakes): no Nagle delay.
    let _ = conn.set_nodelay(true);
    Ok(conn)
}

/// A tunnel through `up` to `authority`, within `limit`: the connection
/// and any bytes the upstream sent after its answer's head, or the
/// upstream's answer when it speaks of the target. An answer that speaks
/// of the upstream itself is its error.
pub async fn tunnel(
    up: &Upstream,
    authority: &str,
    limit: Duration,
) -> Result<Opened, UpstreamError> {
    let work = async {
        let mut conn = dial(up, limit).await?;
        let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
        if let Some(auth) = &up.authorization {
            head.push_str("Proxy-Authorization: ");
            head.push_str(auth);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes())
            .await
            .map_err(UpstreamError::Closed)?;
        let mut buf = Vec::with_capacity(1024);
        loop {
            let mut chunk = [0u8; 1024];
            let n = conn.read(&mut chunk).await.map_err(UpstreamError::Closed)?;
            if n == 0 {
                return Err(UpstreamError::Closed(
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut answer = httparse::Response::new(&mut headers);
            match answer.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let code = answer.code.unwrap_or(0);
                    if (200..300).contains(&code) {
                        return Ok(Opened::Tunnel(conn, Bytes::copy_from_slice(&buf[len..])));
                    }
                    let header = |name: &str| {
                        answer
                            .headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case(name))
                            .map(|h| h.value)
                    };
                    let squid = header("x-squid-error").and_then(|v| std::str::from_utf8(v).ok());
                    if super::blame::of_answer(code, squid) == super::blame::Failure::Proxy {
                        return Err(UpstreamError::Refused(code));
                    }
                    let length = header("content-length")
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|v| v.trim().parse::<usize>().ok());
                    let headers = RELAYED
                        .iter()
                        .filter_map(|&n| {
                            let v = http::HeaderValue::from_bytes(header(n)?).ok()?;
                            Some((http::HeaderName::from_static(n), v))
                        })
                        .collect();
                    let mut body = buf.split_off(len);
                    read_body(&mut conn, &mut body, length).await;
                    return Ok(Opened::Target(TargetAnswer {
                        status: code,
                        headers,
                        body: body.into(),
                    }));
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
                Ok(httparse::Status::Partial) => {
                    return Err(UpstreamError::Malformed(format!(
                        "an answer head over {MAX_HEAD} bytes"
                    )))
                }
                Err(e) => return Err(UpstreamError::Malformed(e.to_string())),
            }
        }
    };
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| UpstreamError::Timeout(limit))?
}

/// Reads a refused CONNECT's body into `body` (which holds what came with
/// the head): `length` bytes when the answer said, else to the end; at
/// most [`MAX_ERROR_BODY`]. A read that fails ends it: the body is a
/// courtesy to the crawler, the status is the answer.
async fn read_body(conn: &mut TcpStream, body: &mut Vec<u8>, length: Option<usize>) {
    let want = length.unwrap_or(MAX_ERROR_BODY).min(MAX_ERROR_BODY);
    let mut chunk = [0u8; 4096];
    while body.len() < want {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(want);
}
