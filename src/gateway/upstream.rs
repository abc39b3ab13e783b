//! Dialing an upstream proxy, and asking it for a tunnel. Errors are
//! classified here, once: each says in plain words what the upstream did.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::fleet::Upstream;

/// The longest answer head to a CONNECT an upstream may send.
const MAX_HEAD: usize = 16 * 1024;

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
}

impl UpstreamError {
    /// The metrics' class of the error.
    pub fn class(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Timeout(_) => "timeout",
            UpstreamError::Refused(407) => "credentials",
            UpstreamError::Refused(_) => "refused",
            UpstreamError::Malformed(_) | UpstreamError::Closed(_) => "protocol",
        }
    }
}

/// A TCP connection to `up`, within `limit`.
pub async fn dial(up: &Upstream, limit: Duration) -> Result<TcpStream, UpstreamError> {
    let conn = tokio::time::timeout(limit, TcpStream::connect((up.host.as_str(), up.port)))
        .await
        .map_err(|_| UpstreamError::Timeout(limit))?
        .map_err(UpstreamError::Connect)?;
    // Tunnels carry interactive traffic (TLS handshakes): no Nagle delay.
    let _ = conn.set_nodelay(true);
    Ok(conn)
}

/// A tunnel through `up` to `authority`, within `limit`: the connection
/// and any bytes the upstream sent after its answer's head.
pub async fn tunnel(
    up: &Upstream,
    authority: &str,
    limit: Duration,
) -> Result<(TcpStream, Bytes), UpstreamError> {
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
                    if !(200..300).contains(&code) {
                        return Err(UpstreamError::Refused(code));
                    }
                    return Ok((conn, Bytes::copy_from_slice(&buf[len..])));
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
