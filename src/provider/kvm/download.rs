//! The HTTP side of a base-image download (issue 17): chunks go to the
//! upload through a bounded channel while an overall deadline, a minimum
//! average rate and a stall timeout are enforced, so a slow-drip URL fails
//! instead of holding a transfer slot for hours.

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// The limits on one download.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest the whole body may take.
    pub deadline: Duration,
    /// The lowest average rate, bytes per second, once `grace` has passed.
    pub min_bytes_per_second: u64,
    /// How long before the rate is judged (slow starts are fine).
    pub grace: Duration,
    /// How long the body may stall between two chunks.
    pub stall: Duration,
}

/// Overall deadline of one base-image download.
pub const DEADLINE: Duration = Duration::from_secs(3600);
/// Minimum average download rate (64 KiB/s).
pub const MIN_BYTES_PER_SECOND: u64 = 64 * 1024;
/// Time before the rate is judged.
pub const RATE_GRACE: Duration = Duration::from_secs(30);
/// How long the download may stall between two chunks.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: DEADLINE,
            min_bytes_per_second: MIN_BYTES_PER_SECOND,
            grace: RATE_GRACE,
            stall: STALL_TIMEOUT,
        }
    }
}

/// Whether a download that has fetched `got` of `len` bytes in `elapsed`
/// may go on; the error says why not, in plain words.
pub fn verdict(l: &Limits, elapsed: Duration, got: u64, len: u64) -> Result<(), String> {
    if got < len && elapsed >= l.deadline {
        return Err(format!(
            "did not finish within {:?} ({got} of {len} bytes)",
            l.deadline
        ));
    }
    if got < len && elapsed >= l.grace {
        let ms = elapsed.as_millis().max(1) as u64;
        let rate = got.saturating_mul(1000) / ms;
        if rate < l.min_bytes_per_second {
            return Err(format!(
                "{rate} bytes/s after {}s ({got} of {len} bytes) is below the minimum of {} bytes/s",
                elapsed.as_secs(),
                l.min_bytes_per_second
            ));
        }
    }
    Ok(())
}

/// Reads `resp` (of `len` bytes) into `tx` under `limits`; the hex SHA-256
/// of the body, `None` when the receiving side ended first (its error is
/// the one to report). On failure the receiver gets a `None` chunk.
pub async fn feed(
    mut resp: reqwest::Response,
    tx: mpsc::Sender<Option<Vec<u8>>>,
    len: u64,
    limits: Limits,
    url: &str,
) -> Result<Option<String>, String> {
    let started = Instant::now();
    let mut hasher = Sha256::new();
    let mut got = 0u64;
    let fail = |why: String| format!("fetching image {url}: {why}");
    loop {
        let left = limits.deadline.saturating_sub(started.elapsed());
        let wait = limits.stall.min(left);
        let chunk = match tokio::time::timeout(wait, resp.chunk()).await {
            Err(_) => {
                let _ = tx.send(None).await;
                let why = verdict(&limits, started.elapsed(), got, len)
                    .err()
                    .unwrap_or(format!("stalled for {:?}", limits.stall));
                return Err(fail(why));
            }
            Ok(Err(e)) => {
                let _ = tx.send(None).await;
                return Err(fail(e.to_string()));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(c))) => c,
        };
        got += chunk.len() as u64;
        hasher.update(&chunk);
        if got > len {
            let _ = tx.send(None).await;
            return Err(fail("body longer than Content-Length".into()));
        }
        if let Err(why) = verdict(&limits, started.elapsed(), got, len) {
            let _ = tx.send(None).await;
            return Err(fail(why));
        }
        if tx.send(Some(chunk.to_vec())).await.is_err() {
            return Ok(None);
        }
    }
    if got != len {
        let _ = tx.send(None).await;
        return Err(fail(format!("body ended after {got} of {len} bytes")));
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Some(hex))
}

#[cfg(test)]
#[path = "download_tests.rs"]
mod tests;
