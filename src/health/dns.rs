//! Host names of probed proxies (External endpoints may be names), each
//! resolved at most once per TTL however many proxies share it and however
//! often they are probed: without it every probe of such a proxy took a
//! thread of the blocking pool for `getaddrinfo`. The system resolver
//! does not say a record's TTL, so one fixed TTL (`--probe-dns-ttl`)
//! stands for it; a failed lookup is kept for [`FAILED_TTL`] at most, so
//! a name fixed in DNS is probed again soon.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::error::ProbeError;

/// The longest a failed lookup is kept.
pub const FAILED_TTL: Duration = Duration::from_secs(5);

/// Names past which expired entries are swept at the next new name.
const SWEEP_ABOVE: usize = 1024;

type Lookup = Result<Arc<[IpAddr]>, ProbeError>;

/// The kept lookups by name.
type Slots = Mutex<HashMap<String, Arc<Slot>>>;

/// One lookup of one name: in flight until its cell is set, then kept
/// until it expires.
struct Slot {
    born: Instant,
    cell: OnceCell<Lookup>,
}

impl Slot {
    fn fresh(&self, now: Instant, ttl: Duration) -> bool {
        match self.cell.get() {
            None => true,
            Some(Ok(_)) => now < self.born + ttl,
            Some(Err(_)) => now < self.born + ttl.min(FAILED_TTL),
        }
    }
}

/// Resolves the proxies' host names; [`Resolver::default`] keeps nothing
/// (a lookup per call), [`Resolver::caching`] keeps each answer for a TTL.
#[derive(Default)]
pub struct Resolver {
    cache: Option<(Duration, Slots)>,
}

impl Resolver {
    /// Keeps each answer `ttl` (zero: keeps nothing).
    pub fn caching(ttl: Duration) -> Self {
        Resolver {
            cache: (!ttl.is_zero()).then(|| (ttl, Mutex::new(HashMap::new()))),
        }
    }

    /// The addresses of `host` (an IP address as it is, with no lookup)
    /// at `port`.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ProbeError> {
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let ips = self.lookup_with(host, Instant::now(), system).await?;
        Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
    }

    /// `host`'s addresses as of `now`: kept ones while fresh, else what
    /// `lookup` answers (one lookup for all callers asking meanwhile).
    async fn lookup_with<F, Fut>(&self, host: &str, now: Instant, lookup: F) -> Lookup
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Lookup>,
    {
        let Some((ttl, cache)) = &self.cache else {
            return lookup(host.to_string()).await;
        };
        let slot = {
            // Plain map: a panic elsewhere cannot leave it half-written.
            let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(host) {
                Some(s) if s.fresh(now, *ttl) => s.clone(),
                _ => {
                    if map.len() > SWEEP_ABOVE {
                        map.retain(|_, s| s.fresh(now, *ttl));
                    }
                    let s = Arc::new(Slot {
                        born: now,
                        cell: OnceCell::new(),
                    });
                    map.insert(host.to_string(), s.clone());
                    s
                }
            }
        };
        slot.cell
            .get_or_init(|| lookup(host.to_string()))
            .await
            .clone()
    }
}

/// The system resolver (`getaddrinfo` on the blocking pool).
async fn system(host: String) -> Lookup {
    let addrs = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .map_err(|e| ProbeError::connect(&e))?;
    let ips: Arc<[IpAddr]> = addrs.map(|a| a.ip()).collect();
    if ips.is_empty() {
        return Err(ProbeError::Connect(format!("{host} has no address")));
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting(
        n: &AtomicUsize,
        ok: bool,
    ) -> impl FnOnce(String) -> std::future::Ready<Lookup> + '_ {
        move |_| {
            n.fetch_add(1, Ordering::SeqCst);
            std::future::ready(if ok {
                Ok(Arc::from([IpAddr::from([192, 0, 2, 7])]))
            } else {
                Err(ProbeError::Connect("no such name".into()))
            })
        }
    }

    #[tokio::test]
    async fn a_name_is_resolved_at_most_once_per_ttl() {
        let r = Resolver::caching(Duration::from_secs(30));
        let n = AtomicUsize::new(0);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // Probed every second for 30 s, by two proxies sharing the name.
        for sec in 0..30 {
            for _ in 0..2 {
                let ips = r
                    .lookup_with("proxy.example", t0 + s(sec), counting(&n, true))
                    .await;
                assert_eq!(&*ips.unwrap(), &[IpAddr::from([192, 0, 2, 7])]);
            }
        }
        assert_eq!(n.load(Ordering::SeqCst), 1, "one lookup in the first TTL");
        r.lookup_with("proxy.example", t0 + s(30), counting(&n, true))
            .await
            .unwrap();
        assert_eq!(
            n.load(Ordering::SeqCst),
            2,
            "looked up again once it expired"
        );
        r.lookup_with("other.example", t0 + s(30), counting(&n, true))
            .await
            .unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 3, "each name has its own entry");
    }

    #[tokio::test]
    async fn a_failed_lookup_is_kept_only_briefly() {
        let r = Resolver::caching(Duration::from_secs(30));
        let n = AtomicUsize::new(0);
        let t0 = Instant::now();
        for ms in [0, 1000, 4999] {
            let e = r
                .lookup_with(
                    "gone.example",
                    t0 + Duration::from_millis(ms),
                    counting(&n, false),
                )
                .await;
            assert!(e.is_err());
        }
        assert_eq!(n.load(Ordering::SeqCst), 1);
        r.lookup_with("gone.example", t0 + FAILED_TTL, counting(&n, true))
            .await
            .unwrap();
        assert_eq!(
            n.load(Ordering::SeqCst),
            2,
            "asked again after {FAILED_TTL:?}"
        );
    }

    #[tokio::test]
    async fn without_a_cache_every_call_looks_up_and_addresses_need_none() {
        let r = Resolver::default();
        let n = AtomicUsize::new(0);
        let t0 = Instant::now();
        for _ in 0..3 {
            r.lookup_with("proxy.example", t0, counting(&n, true))
                .await
                .unwrap();
        }
        assert_eq!(n.load(Ordering::SeqCst), 3);
        let cached = Resolver::caching(Duration::from_secs(30));
        for (host, want) in [
            ("127.0.0.9", "127.0.0.9:3128"),
            ("[::1]", "[::1]:3128"),
            ("::1", "[::1]:3128"),
        ] {
            let a = cached.resolve(host, 3128).await.unwrap();
            assert_eq!(a, vec![want.parse::<SocketAddr>().unwrap()]);
        }
        assert!(
            cached.cache.as_ref().unwrap().1.lock().unwrap().is_empty(),
            "addresses are not looked up"
        );
    }
}
