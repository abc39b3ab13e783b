//! `make bench-idle`: where the operator's idle memory goes (issue 19).
//! The operator binary (`IDLE_OPERATOR_BIN`, else the test build) starts
//! on the real test API server as `make bench-scale` starts it (discovery
//! API and plain `/metrics` on, no providers, no Proxy); 5 s after it
//! serves `/metrics` (when the benchmark reads "RSS idle") its
//! `/proc/<pid>/status` and `/proc/<pid>/smaps` are read and printed by
//! kind of mapping: the heap (glibc's main arena and `malloc`'s mmapped
//! thread arenas and big blocks), thread stacks, the binary's own pages,
//! each shared library. `IDLE_SECS` reads once more after that many more
//! seconds (default 30: tokio's idle blocking threads have exited).
//! Variables of the environment reach the operator (`MALLOC_ARENA_MAX=`,
//! `TOKIO_WORKER_THREADS=` to compare); `IDLE_OPERATOR_BIN` may be a
//! script that execs the binary (under heaptrack's preload library, say).
//! Prints; asserts nothing about size. Ignored by `cargo test`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{self, eventually, Operator};

/// One mapping of `/proc/<pid>/smaps`: its header line and Rss (KiB).
struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    path: String,
    rss: u64,
    anon: u64,
}

fn smaps(pid: u32) -> Vec<Mapping> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or_default();
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                let perms = f.next().unwrap_or_default().to_string();
                let path = f.nth(3).unwrap_or_default().to_string();
                out.push(Mapping {
                    start,
                    end,
                    perms,
                    path,
                    rss: 0,
                    anon: 0,
                });
                continue;
            }
        }
        let kib = || f.clone().next().and_then(|v| v.parse::<u64>().ok());
        if let Some(m) = out.last_mut() {
            match first {
                "Rss:" => m.rss = kib().unwrap_or(0),
                "Anonymous:" => m.anon = kib().unwrap_or(0),
                _ => {}
            }
        }
    }
    out
}

/// The kind of an anonymous mapping: glibc gives each thread arena a
/// 64 MiB-aligned reservation (HEAP_MAX), Rust threads a 2 MiB stack with
/// a guard page below it; the rest are big `malloc` blocks (mmap
/// threshold) and the runtime's own maps.
fn kind(m: &Mapping, binary: &str, guards: &[u64]) -> String {
    let size = m.end - m.start;
    match m.path.as_str() {
        "[heap]" => "heap: main arena ([heap])".into(),
        "[stack]" => "main thread stack".into(),
        "" if guards.contains(&m.start) => "thread and signal stacks".into(),
        "" if m.start.is_multiple_of(64 << 20) && size <= 64 << 20 => "heap: thread arenas".into(),
        "" => "heap: other anonymous (big blocks, allocator maps)".into(),
        p if p == binary => "binary (text, data, relocations)".into(),
        p if p.starts_with('[') => format!("kernel {p}"),
        p => {
            let lib = p.rsplit('/').next().unwrap_or(p);
            let lib = lib.split(".so").next().unwrap_or(lib);
            // What a Rust binary links without the kvm provider; the rest
            // is libvirt's client library and what it loads.
            if ["ld-linux-x86-64", "libc", "libm", "libgcc_s"].contains(&lib) {
                format!("library {lib}")
            } else {
                "libraries: libvirt and its dependencies".into()
            }
        }
    }
}

fn status(pid: u32) -> BTreeMap<String, String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn report(pid: u32, binary: &str, when: &str) {
    let st = status(pid);
    println!("-- {when}");
    for k in ["VmRSS", "RssAnon", "RssFile", "VmHWM", "VmSize", "Threads"] {
        println!("{k:>8}: {}", st.get(k).map_or("?", String::as_str));
    }
    let maps = smaps(pid);
    // A thread's stack sits right above its guard page (a mapping with no
    // permissions of one page).
    let guards: Vec<u64> = maps
        .iter()
        .filter(|m| m.perms.starts_with("---p") && m.end - m.start == 4096 && m.path.is_empty())
        .map(|m| m.end)
        .collect();
    let mut by: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let mut arena_start = None;
    for m in &maps {
        let mut k = kind(m, binary, &guards);
        // The tail of a thread arena's reservation (PROT_NONE and the
        // part grown into) belongs to it.
        if k == "heap: thread arenas" {
            arena_start = Some(m.start);
        } else if k.starts_with("heap: other")
            && arena_start.is_some_and(|s| m.end <= s + (64 << 20))
        {
            k = "heap: thread arenas".into();
        }
        let e = by.entry(k).or_default();
        e.0 += m.rss;
        e.1 += m.anon;
        e.2 += 1;
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .0));
    println!(
        "{:<52} {:>9} {:>9} {:>5}",
        "mapping", "Rss KiB", "Anon KiB", "maps"
    );
    for (k, (rss, anon, n)) in rows.iter().filter(|r| r.1 .0 > 0) {
        println!("{k:<52} {rss:>9} {anon:>9} {n:>5}");
    }
    // The binary by segment: code (r-x), read-only data and what the
    // loader reads (r--), data relocated at load (RELRO) and .data (rw-).
    for m in maps.iter().filter(|m| m.path == binary) {
        println!(
            "  binary {} {:>6} KiB mapped {:>9} {:>9}",
            m.perms,
            (m.end - m.start) / 1024,
            m.rss,
            m.anon
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with make bench-idle"]
async fn idle_memory() {
    let later: u64 = std::env::var("IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let ground = support::ground_without_pods("idle").await;
    let (api, metrics) = (support::loopback(), support::loopback());
    let dir = tempfile::tempdir().unwrap();
    let cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, "idle-token");
    let binary = std::env::var("IDLE_OPERATOR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_egress-proxies-operator").to_string());
    let mut other = std::process::Command::new(&binary);
    other
        .args(cmd.get_args())
        .args(["--metrics-bind-address", &metrics.to_string()]);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => other.env(k, v),
            None => other.env_remove(k),
        };
    }
    let op = Operator::spawn(other, &dir.path().join("operator.log"));
    eventually(
        "the operator serves /metrics",
        Duration::from_secs(60),
        || async { tokio::net::TcpStream::connect(metrics).await.ok().map(drop) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The program the process runs (`IDLE_OPERATOR_BIN` may be a wrapper
    // that execs it, e.g. under heaptrack's preload library).
    let binary = std::fs::read_link(format!("/proc/{}/exe", op.pid())).unwrap();
    let binary = binary.to_string_lossy();
    println!("operator: {binary}");
    report(
        op.pid(),
        &binary,
        "5 s after /metrics serves (bench-scale's RSS idle)",
    );
    if later > 0 {
        tokio::time::sleep(Duration::from_secs(later)).await;
        report(op.pid(), &binary, &format!("{later} s later"));
    }
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap();
    assert!(
        log.contains("synced; ready"),
        "the operator never got ready:\n{log}"
    );
}
