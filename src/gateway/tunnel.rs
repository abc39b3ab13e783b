//! Copying a tunnel's bytes both ways. A buffer is held only while bytes
//! are moving: an idle tunnel holds its two sockets and nothing else, so
//! thousands of open tunnels cost little memory. A tunnel with no byte
//! either way for the idle timeout is closed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// One direction's buffer while it copies.
const BUF: usize = 16 * 1024;

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
        if !early.0.is_empty() {
            uw.write_all(&early.0).await?;
        }
        if !early.1.is_empty() {
            cw.write_all(&early.1).await?;
        }
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
/// side (the other direction may go on: a half-closed tunnel).
async fn pump(
    from: &OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    last: &AtomicU64,
    start: Instant,
) -> std::io::Result<u64> {
    let mut total = 0u64;
    loop {
        from.readable().await?;
        // Taken only now, and dropped before the next wait.
        let mut buf = vec![0u8; BUF];
        loop {
            match from.try_read(&mut buf) {
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
