//! The probe targets of `make bench-scale`, in a process of their own (so
//! they can be pinned to a CPU and their CPU read apart): one epoll loop
//! answering `200 ok` as the proxy (an absolute-form GET, as the probes
//! send for an http URL) and as the target behind a Squid Pod (an
//! origin-form GET). The path `/p/s<i>` names Proxy `i`; the process keeps
//! when each was last fetched and, while a window is open, samples every
//! Proxy's age once a second: the verdict age the benchmark reports is
//! measured where the probes land.
//!
//! Driven over its standard streams, one line each way: it prints
//! `@@ listening ADDR`; `open` starts a window (`@@ ok`); `close` ends it
//! and prints `@@ ages P50_MS P99_MS MAX_MS REQUESTS NEVER`; end of input
//! stops it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The line prefix of every answer (libtest prints its own lines too).
pub const PREFIX: &str = "@@ ";

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

struct Seen {
    epoch: Instant,
    /// Per Proxy: milliseconds since `epoch` of its newest fetch, plus 1
    /// (0: never).
    last: Vec<AtomicU64>,
    requests: AtomicU64,
    /// Ages sampled in the open window, in ms.
    window: Mutex<Option<Vec<u32>>>,
}

/// The index `i` of a request target naming `/p/s<i>`.
fn proxy_index(target: &str) -> Option<usize> {
    let at = target.find("/p/s")? + 4;
    let digits: &str = &target[at..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

async fn serve(mut c: tokio::net::TcpStream, seen: Arc<Seen>) {
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") && len < buf.len() {
        match c.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let target = head.split_whitespace().nth(1).unwrap_or("");
    if let Some(i) = proxy_index(target).filter(|i| *i < seen.last.len()) {
        let ms = seen.epoch.elapsed().as_millis() as u64 + 1;
        seen.last[i].store(ms, Ordering::Relaxed);
    }
    seen.requests.fetch_add(1, Ordering::Relaxed);
    let _ = c.write_all(OK).await;
}

fn sample(seen: &Seen) {
    // Between windows there is nothing to sample.
    if let Some(ages) = seen.window.lock().unwrap().as_mut() {
        let now = seen.epoch.elapsed().as_millis() as u64 + 1;
        ages.extend(seen.last.iter().map(|l| match l.load(Ordering::Relaxed) {
            0 => u32::MAX,
            t => now.saturating_sub(t).min(u64::from(u32::MAX - 1)) as u32,
        }));
    }
}

fn pct(sorted: &[u32], p: f64) -> u32 {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// Runs the responder for `n` Proxies on `ip` until its input ends.
pub fn run(ip: std::net::IpAddr, n: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let seen = Arc::new(Seen {
            epoch: Instant::now(),
            last: (0..n).map(|_| AtomicU64::new(0)).collect(),
            requests: AtomicU64::new(0),
            window: Mutex::new(None),
        });
        println!("{PREFIX}listening {}", l.local_addr().unwrap());
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok((c, _)) => {
                        tokio::spawn(serve(c, s.clone()));
                    }
                    // Out of descriptors in a burst: the targets must
                    // outlive it.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        let s = seen.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                sample(&s);
            }
        });
        // Standard input on a thread of its own, its lines sent here.
        let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut requests_at_open = 0;
        while let Some(line) = lines.recv().await {
            match line.trim() {
                "open" => {
                    *seen.window.lock().unwrap() = Some(Vec::new());
                    requests_at_open = seen.requests.load(Ordering::Relaxed);
                    println!("{PREFIX}ok");
                }
                "close" => {
                    let mut ages = seen.window.lock().unwrap().take().unwrap_or_default();
                    let never = ages.iter().filter(|a| **a == u32::MAX).count();
                    ages.sort_unstable();
                    let requests = seen.requests.load(Ordering::Relaxed) - requests_at_open;
                    println!(
                        "{PREFIX}ages {} {} {} {requests} {never}",
                        pct(&ages, 0.5),
                        pct(&ages, 0.99),
                        ages.last().copied().unwrap_or_default()
                    );
                }
                _ => {}
            }
        }
    });
}

/// The responder as the benchmark sees it: the child process and its
/// address.
pub struct Responder {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    pub addr: SocketAddr,
}

/// What one window saw.
pub struct Ages {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Requests answered in the window.
    pub requests: u64,
    /// Samples of Proxies never fetched.
    pub never: u64,
}

impl Responder {
    /// Starts this test binary again as a responder for `n` Proxies on
    /// `ip`, pinned to `cpu` when given.
    pub fn spawn(ip: std::net::IpAddr, n: usize, cpu: Option<usize>) -> Responder {
        let mut cmd = super::role_command("responder", cpu, None);
        cmd.env("BENCH_RESPONDER_IP", ip.to_string())
            .env("BENCH_RESPONDER_N", n.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let input = child.stdin.take().unwrap();
        let mut output =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let addr = loop {
            let line = output.next().expect("the responder exited").unwrap();
            if let Some(a) = line.strip_prefix("@@ listening ") {
                break a.parse().unwrap();
            }
        };
        Responder {
            child,
            input,
            output,
            addr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn ask(&mut self, what: &str, answer: &str) -> String {
        use std::io::Write;
        writeln!(self.input, "{what}").unwrap();
        loop {
            let line = self.output.next().expect("the responder exited").unwrap();
            if let Some(rest) = line.strip_prefix(PREFIX) {
                if let Some(v) = rest.strip_prefix(answer) {
                    return v.trim().to_string();
                }
            }
        }
    }

    /// Starts sampling ages.
    pub fn open(&mut self) {
        self.ask("open", "ok");
    }

    /// Ends the window.
    pub fn close(&mut self) -> Ages {
        let v: Vec<u64> = self
            .ask("close", "ages")
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        Ages {
            p50: Duration::from_millis(v[0]),
            p99: Duration::from_millis(v[1]),
            max: Duration::from_millis(v[2]),
            requests: v[3],
            never: v[4],
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_proxy_is_named_by_its_path_in_either_request_form() {
    assert_eq!(proxy_index("http://127.0.0.1:9/p/s12"), Some(12));
    assert_eq!(proxy_index("/p/s0"), Some(0));
    assert_eq!(proxy_index("/p/s7?x=1"), Some(7));
    assert_eq!(proxy_index("/other"), None);
}
