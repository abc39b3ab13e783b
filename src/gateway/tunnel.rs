//! Copying a tunnel's bytes both ways. A buffer is held only while bytes
//! are moving (and a second after): an idle tunnel holds its two sockets and nothing else, so
//! thousands of open tunnels cost little memory. A tunnel with no byte
//! either way for the idle timeout is closed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// One direction's buffer while it copies: 16 KiB (was 64), so that a
/// gateway at its connection cap, every tunnel busy, fits its Pod
/// (`edge_budget`); a read of 16 KiB still moves a TLS record whole.
pub(crate) const BUF: usize = 16 * 1024;

/// How long a quiet direction keeps its buffer.
const KEEP: Duration = Duration::from_secs(1);

/// Bytes moved each way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// From the client to the upstream.
    pub up: u64,
    /// From the upstream to the client.
    pub down: u64,
}

/// Relays between `client` and `upstream` until both ends closed, one
/// failed, or `idle` passed with no byte; `early` are bytes each side
/// sent before the relay began (client's, upstream's).
pub async fn relay(
    client: TcpStream,
    upstream: TcpStream,
    early: (Bytes, Bytes),
    idle: Duration,
) -> (Moved, Option<std::io::Error>) {
    let (cr, mut cw) = client.into_split();
    let (ur, mut uw) = upstream.into_split();
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (up, down) = (early.0.len() as u64, early.1.len() as u64);
    let copy = async {
        let (sent, answered) = early;
        if !sent.is_empty() {
            uw.write_all(&sent).await?;
        }
        if !answered.is_empty() {
            cw.write_all(&answered).await?;
        }
        // Not held while the tunnel lives.
        drop((sent, answered));
        let (a, b) = tokio::try_join!(
            pump(&cr, &mut uw, &last, start),
            pump(&ur, &mut cw, &last, start)
        )?;
        Ok::<_, std::io::Error>((a, b))
    };
    let watchdog = async {
        loop {
            tokio::time::sleep(idle / 4).await;
            let quiet = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if quiet >= idle {
                return;
            }
        }
    };
    let outcome = tokio::select! {
        r = copy => r.map(|(a, b)| Moved { up: up + a, down: down + b }).map_err(|e| (Moved { up, down }, e)),
        () = watchdog => Err((Moved { up, down }, std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no byte either way for {idle:?}")))),
    };
    match outcome {
        Ok(m) => (m, None),
        Err((m, e)) => (m, Some(e)),
    }
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing
/// side (the other direction may go on: a half-closed tunnel). The buffer
/// is taken when bytes arrive and given back once the direction has been
/// quiet for [`KEEP`], so a busy direction reuses it and an idle one holds
/// none; it is filled without being zeroed first.
async fn pump(
    from: &OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    last: &AtomicU64,
    start: Instant,
) -> std::io::Result<u64> {
    let mut total = 0u64;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if buf.capacity() == 0 {
            from.readable().await?;
            buf = Vec::with_capacity(BUF);
        } else if let Ok(ready) = tokio::time::timeout(KEEP, from.readable()).await {
            ready?;
        } else {
            buf = Vec::new();
            continue;
        }
        loop {
            buf.clear();
            match from.try_read_buf(&mut buf) {
                Ok(0) => {
                    let _ = to.shutdown().await;
                    return Ok(total);
                }
                Ok(n) => {
                    to.write_all(&buf[..n]).await?;
                    total += n as u64;
                    let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                    last.store(ms, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Waits for the client's side of the tunnel (after the `200` is sent),
/// then relays.
pub(super) async fn relay_upgraded(
    gw: &super::Gateway,
    req: http::Request<hyper::body::Incoming>,
    conn: tokio::net::TcpStream,
    early: bytes::Bytes,
    key: &crate::lease::ProxyKey,
) {
    let upgraded = match hyper::upgrade::on(req).await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "The client left before its tunnel opened");
            return;
        }
    };
    // The front serves plain TCP streams only, so this is what it holds.
    let Ok(parts) = upgraded.downcast::<hyper_util::rt::TokioIo<tokio::net::TcpStream>>() else {
        tracing::warn!("A gateway tunnel was not over TCP; closed");
        return;
    };
    let client = parts.io.into_inner();
    // The client's bytes past its CONNECT are a slice of hyper's read
    // buffer (8 KiB): copied out, so the buffer is not held for the
    // tunnel's whole life.
    let sent = bytes::Bytes::copy_from_slice(&parts.read_buf);
    drop(parts.read_buf);
    let (idle, opened) = (gw.settings.idle_timeout, std::time::Instant::now());
    gw.metrics.tunnel_opened();
    let (moved, err) = relay(client, conn, (sent, early), idle).await;
    gw.metrics
        .tunnel_closed(opened.elapsed(), moved.up, moved.down);
    match err {
        None => {
            tracing::debug!(upstream = %key, up = moved.up, down = moved.down, "Gateway tunnel closed")
        }
        Some(e) => {
            tracing::debug!(upstream = %key, up = moved.up, down = moved.down, error = %e, "Gateway tunnel ended")
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: a panic is its failure report
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_early_ones_first_and_a_half_close_carries_over() {
        let (mut client, client_side) = pair().await;
        let (upstream_side, mut upstream) = pair().await;
        let early = (
            Bytes::from_static(b"hello "),
            Bytes::from_static(b"welcome "),
        );
        let relay = tokio::spawn(relay(
            client_side,
            upstream_side,
            early,
            Duration::from_secs(30),
        ));
        client.write_all(b"upstream").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got, b"hello upstream",
            "the client's end reached the upstream"
        );
        // The other direction still flows after the client's half-close.
        let big = vec![9u8; 300 * 1024];
        upstream.write_all(b"client").await.unwrap();
        upstream.write_all(&big).await.unwrap();
        upstream.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(&back[..14], b"welcome client");
        assert_eq!(back.len(), 14 + big.len());
        let (moved, err) = relay.await.unwrap();
        assert!(err.is_none(), "{err:?}");
        assert_eq!(
            moved,
            Moved {
                up: 14,
                down: 14 + big.len() as u64
            }
        );
    }

    #[tokio::test]
    async fn a_quiet_tunnel_is_closed_after_the_idle_timeout() {
        let (mut client, client_side) = pair().await;
        let (upstream_side, _upstream) = pair().await;
        let idle = Duration::from_millis(400);
        let started = Instant::now();
        let (_, err) = relay(client_side, upstream_side, Default::default(), idle).await;
        assert_eq!(err.map(|e| e.kind()), Some(std::io::ErrorKind::TimedOut));
        assert!(started.elapsed() >= idle);
        let mut b = [0u8; 1];
        assert_eq!(
            client.read(&mut b).await.unwrap(),
            0,
            "the client sees the end"
        );
    }
}
