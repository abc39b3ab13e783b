//! `make bench-lease-memory`: the anonymous memory (heap, as resident
//! pages: what a cgroup charges) the lease store takes per live lease and
//! per released lease it still remembers, in a process of its own with
//! nothing else running: no runtime, no HTTP, no probes. BENCH_PROXIES
//! (default 10,000) healthy proxies; BENCH_LEASES (default 100,000) leases
//! granted by the store's own choice, one client, one-hour TTL, signed
//! ids, held; then as many granted and released at once on a second
//! store (what a closed loop leaves behind). Ignored by `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies_operator::lease::{
    AcquireRequest, Candidates, LeaseConfig, LeaseKey, LeaseStore, ProxyKey,
};

/// This process's anonymous resident memory (heap and stacks), bytes.
fn anon() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024.0
}

/// Every healthy proxy of the one listing told to the store.
struct All(usize);

impl Candidates for All {
    fn len(&self) -> usize {
        self.0
    }
    fn whole(&self) -> Option<u64> {
        Some(1)
    }
    fn contains(&self, _: &ProxyKey) -> bool {
        true
    }
    fn keys(&self) -> Box<dyn Iterator<Item = &ProxyKey> + '_> {
        Box::new(std::iter::empty())
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
#[ignore = "benchmark: run with make bench-lease-memory"]
fn bench_lease_memory() {
    let fleet = env("BENCH_PROXIES", 10_000).clamp(1, 1_000_000);
    let n = env("BENCH_LEASES", 100_000).clamp(1, 10_000_000);
    let config = LeaseConfig {
        max_leases_per_proxy: u32::try_from(n.div_ceil(fleet) + 1).unwrap(),
        default_ttl: Duration::from_secs(3600),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(300),
    };
    let req = AcquireRequest {
        ttl: Duration::from_secs(3600),
        client: Arc::from("bench-token"),
        ..Default::default()
    };
    let store = |_| {
        let store = LeaseStore::new(config).with_key(LeaseKey::random());
        let mut keys: Vec<ProxyKey> = (0..fleet)
            .map(|i| ProxyKey {
                namespace: "bench".into(),
                name: format!("p{i}"),
            })
            .collect();
        keys.sort();
        store.set_eligible(1, keys);
        // One grant and release first, so what is made once (the client's
        // entry, the proxies' states) is not counted per lease.
        let warm = store.acquire_among(&All(fleet), &req).unwrap();
        store.release(&warm.id);
        store
    };

    let before = anon();
    let held = store(());
    let empty = anon() - before;
    let started = Instant::now();
    for _ in 0..n {
        held.acquire_among(&All(fleet), &req).unwrap();
    }
    let grant_secs = started.elapsed().as_secs_f64();
    let live = anon() - before - empty;
    assert_eq!(held.active(), n, "every lease is live");

    let churn = store(());
    let before = anon();
    let started = Instant::now();
    for _ in 0..n {
        let lease = churn.acquire_among(&All(fleet), &req).unwrap();
        assert!(churn.release(&lease.id), "a live lease is released");
    }
    let pair_secs = started.elapsed().as_secs_f64();
    let released = anon() - before;
    assert_eq!(churn.active(), 0, "no lease is left");

    let mib = |b: f64| b / 1048576.0;
    println!("lease store memory: {fleet} proxies, {n} leases, one client, signed ids");
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| anonymous memory per live lease | {:.0} B ({:.1} MiB for {n}) |",
        live / n as f64,
        mib(live)
    );
    println!(
        "| anonymous memory per released lease still remembered | {:.0} B ({:.1} MiB for {n}) |",
        released / n as f64,
        mib(released)
    );
    println!(
        "| one store with no lease (proxies' state, eligible set) | {:.1} MiB |",
        mib(empty)
    );
    println!(
        "| grants per second / grant+release pairs per second (one thread, no HTTP) | {:.0} / {:.0} |",
        n as f64 / grant_secs,
        n as f64 / pair_secs
    );
}
