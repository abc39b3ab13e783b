use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::*;

const S: fn(u64) -> Duration = Duration::from_secs;

struct Case {
    name: &'static str,
    elapsed: Duration,
    got: u64,
    want: Result<(), &'static str>,
}

#[test]
fn verdict_table() {
    let l = Limits {
        deadline: S(100),
        min_bytes_per_second: 1000,
        grace: S(10),
        stall: S(60),
    };
    let len = 1_000_000;
    for c in [
        Case {
            name: "slow start inside the grace period",
            elapsed: S(9),
            got: 1,
            want: Ok(()),
        },
        Case {
            name: "fast enough after the grace period",
            elapsed: S(20),
            got: 20_000,
            want: Ok(()),
        },
        Case {
            name: "too slow after the grace period",
            elapsed: S(20),
            got: 19_999,
            want: Err("999 bytes/s after 20s (19999 of 1000000 bytes) is below the minimum of 1000 bytes/s"),
        },
        Case {
            name: "past the deadline",
            elapsed: S(100),
            got: 999_999,
            want: Err("did not finish within 100s (999999 of 1000000 bytes)"),
        },
        Case {
            name: "complete is never judged",
            elapsed: S(500),
            got: len,
            want: Ok(()),
        },
    ] {
        assert_eq!(
            verdict(&l, c.elapsed, c.got, len),
            c.want.map_err(String::from),
            "{}",
            c.name
        );
    }
}

/// An HTTP server on 127.0.0.1 that announces `len` bytes and sends one
/// byte every `every`.
async fn slow_drip(len: u64, every: Duration) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..len {
                    if s.write_all(b"x").await.is_err() || s.flush().await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            });
        }
    });
    format!("http://{addr}/slow.qcow2")
}

async fn run(url: &str, limits: Limits) -> Result<Option<String>, String> {
    let resp = reqwest::get(url).await.unwrap();
    let len = resp.content_length().unwrap();
    let (tx, mut rx) = mpsc::channel(4);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let r = feed(resp, tx, len, limits, url).await;
    drain.await.unwrap();
    r
}

#[tokio::test]
async fn a_slow_drip_below_the_minimum_rate_fails() {
    // Never stalls (a byte every 20 ms), but 50 bytes/s is far below 10 KiB/s.
    let url = slow_drip(1_000_000, Duration::from_millis(20)).await;
    let limits = Limits {
        deadline: S(3600),
        min_bytes_per_second: 10 * 1024,
        grace: Duration::from_millis(300),
        stall: S(60),
    };
    let err = run(&url, limits).await.unwrap_err();
    assert!(err.contains("below the minimum of 10240 bytes/s"), "{err}");
    assert!(err.contains(&url), "{err}");
}

#[tokio::test]
async fn a_download_past_its_deadline_fails() {
    // A byte every 200 ms: the stall timeout and the rate never trip.
    let url = slow_drip(1_000_000, Duration::from_millis(200)).await;
    let limits = Limits {
        deadline: Duration::from_millis(500),
        min_bytes_per_second: 0,
        grace: S(3600),
        stall: S(60),
    };
    let err = run(&url, limits).await.unwrap_err();
    assert!(err.contains("did not finish within"), "{err}");
}

#[tokio::test]
async fn a_download_within_its_limits_completes() {
    let url = slow_drip(5, Duration::from_millis(1)).await;
    let got = run(&url, Limits::default()).await.unwrap();
    // sha256("xxxxx")
    assert_eq!(
        got.as_deref(),
        Some("eaf16bc07968e013f3f94ab1342472434a39fc3475f11cf341a6c3965974f8e9")
    );
}
