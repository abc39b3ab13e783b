//! The lease table at every cap a client can fill (issue 52): its state
//! encodes within the bound the feed and the hand-over are sized from,
//! is taken in whole by a follower, and the process's peak memory is
//! printed (docs/performance.md, "The lease table at its caps").
//!
//! The work runs in a child process of this test binary (the same test,
//! told so by an environment variable), so the peak it reads is the
//! table's, not other tests'.

use std::sync::Arc;
use std::time::Duration;

use super::index::Whole;
use super::snapshot::tests::k;
use super::wire::{self, Sizes};
use super::*;

const CHILD: &str = "EGRESS_LEASE_CAPS_CHILD";
const PROXIES: usize = 10_000;
const CLIENTS: usize = 1_000;
const QUORUM: usize = 2;

fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Fills a store to its caps and prints what the parent checks.
fn at_caps() {
    let per_proxy = u32::try_from(MAX_LEASE_IDS / PROXIES).unwrap();
    let cfg = LeaseConfig {
        max_leases_per_proxy: per_proxy,
        default_ttl: Duration::from_secs(3600),
        max_ttl: Duration::from_secs(3600),
        cooldown: Duration::from_secs(3600),
    };
    let limits = ClientLimits {
        max_leases: 0,
        global_cooldown_min_clients: QUORUM,
    };
    let store = LeaseStore::with(cfg, Arc::new(SystemClock)).with_client_limits(limits);
    let mut keys: Vec<ProxyKey> = (0..PROXIES)
        .map(|i| k(&format!("residential-pool-europe-west4-{i:05}")))
        .collect();
    keys.sort();
    store.set_eligible(1, keys.clone());
    let all = Whole {
        generation: 1,
        len: keys.len(),
    };
    let clients: Vec<Arc<str>> = (0..CLIENTS)
        .map(|i| Arc::from(format!("crawler-team-{i:04}").as_str()))
        .collect();
    let base = peak_kib();
    for i in 0..MAX_LEASE_IDS {
        let req = AcquireRequest {
            ttl: Duration::from_secs(3600),
            sticky_key: (i < MAX_STICKY_KEYS).then(|| format!("session-{i:08}-of-a-crawl")),
            site: None,
            client: clients[i % CLIENTS].clone(),
        };
        store.acquire_among(&all, &req).unwrap();
    }
    let refused = store.acquire_among(
        &all,
        &AcquireRequest {
            ttl: Duration::from_secs(60),
            client: clients[0].clone(),
            ..Default::default()
        },
    );
    println!(
        "caps: refused={}",
        matches!(refused, Err(AcquireError::TableFull { .. }))
    );
    // Site cooldowns: every entry the caps allow, each reported by a
    // quorum of clients; each proxy's global cooldown by a quorum too.
    for i in 0..MAX_COOLDOWN_SITES {
        let site = format!("www.site-{i:06}.example");
        for q in 0..QUORUM {
            // Clients 0-49 report every site once, clients 50-99 again:
            // two distinct clients a site, 1,000 reports a client.
            let who = &clients[(q * MAX_COOLDOWN_SITES + i) / MAX_SITE_REPORTS_PER_CLIENT];
            store.cool_down(&keys[i % PROXIES], who, Some(&site));
        }
    }
    for (i, key) in keys.iter().enumerate() {
        for q in 0..QUORUM {
            store.cool_down(key, &clients[(i + q) % CLIENTS], None);
        }
    }
    let (sticky, sites) = store.held();
    println!(
        "caps: leases={} sticky={sticky} sites={sites} reports={}",
        store.active(),
        store.site_reports(&clients[0]).0
    );
    let filled = peak_kib();
    let limit = store.state_limit();
    let (_, bytes) = store.export_encoded();
    let z = Sizes {
        ids: MAX_LEASE_IDS,
        sticky: MAX_STICKY_KEYS,
        sites: MAX_COOLDOWN_SITES,
        quorum: QUORUM,
        proxies: PROXIES,
        clients: CLIENTS,
    };
    println!(
        "caps: bytes={} bound={} limit={limit}",
        bytes.len(),
        wire::max_bytes(z),
    );
    let exported = peak_kib();
    // The follower: its copy at the caps too, replaced by the whole table.
    let got = wire::decode(&bytes).unwrap();
    drop(bytes);
    assert!(store.replace(&got, store.term(), "feed-2").unwrap());
    drop(got);
    println!(
        "caps: copied={} base_kib={base} filled_kib={filled} exported_kib={exported} peak_kib={}",
        store.active(),
        peak_kib()
    );
}

fn figure(out: &str, name: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

#[test]
fn a_table_at_every_cap_fits_its_bound_is_copied_whole_and_its_peak_is_printed() {
    if std::env::var_os(CHILD).is_some() {
        return at_caps();
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new(me)
        .args([
            "--exact",
            "lease::caps_tests::a_table_at_every_cap_fits_its_bound_is_copied_whole_and_its_peak_is_printed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let caps: String = text
        .lines()
        .filter_map(|l| l.find("caps:").map(|i| &l[i..]))
        .collect::<Vec<_>>()
        .join(" ");
    println!("{caps}");
    assert!(
        caps.contains("refused=true"),
        "past the cap nothing is granted: {caps}"
    );
    assert_eq!(figure(&caps, "leases"), MAX_LEASE_IDS as u64);
    assert_eq!(figure(&caps, "sticky"), MAX_STICKY_KEYS as u64);
    assert_eq!(figure(&caps, "sites"), MAX_COOLDOWN_SITES as u64);
    assert_eq!(
        figure(&caps, "reports"),
        (MAX_COOLDOWN_SITES * QUORUM) as u64
    );
    let (bytes, bound, limit) = (
        figure(&caps, "bytes"),
        figure(&caps, "bound"),
        figure(&caps, "limit"),
    );
    assert!(bytes <= bound && bound <= limit.max(bound), "{caps}");
    assert!(bytes <= limit, "a follower takes the table: {caps}");
    // The hand-over's Secrets hold `wire::CEILING` bytes.
    assert!(
        bytes as usize <= wire::CEILING,
        "the hand-over holds it: {caps}"
    );
    assert_eq!(figure(&caps, "copied"), MAX_LEASE_IDS as u64);
}
