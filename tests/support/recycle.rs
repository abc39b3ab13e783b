//! The `maxAge` recycle run the fleet tests share (kubernetes and gcp): a
//! crawler leases every proxy and renews until refused, while samples of
//! the Proxies record how many are unavailable at once, every drain, and
//! that no draining proxy is leased; then the check that no held lease was
//! cut by its instance's deletion.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use egress_proxies_operator::api::Proxy;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};

use super::{api_call, phase};

/// A lease one crawler holds on one proxy, renewed until the API refuses.
pub struct Held {
    pub id: String,
    /// The end of the lease as last granted.
    pub ends: DateTime<Utc>,
    /// Still being renewed (the API has not refused a renewal yet).
    pub renewing: bool,
}

/// What the samples saw until every Proxy had a new, Ready instance.
pub struct Sampled {
    /// The most Proxies unavailable (not Ready, or draining) at once.
    pub most_unavailable: usize,
    /// Each Proxy's drains, by their start: a drain of the Proxy, or the
    /// takeover of a surge replacement (from which the old instance
    /// retires, taking no new leases).
    pub drains: BTreeMap<String, BTreeSet<DateTime<Utc>>>,
    /// The fewest Ready Proxies in a sample, and how many samples there were.
    pub fewest_ready: usize,
    pub samples: usize,
    /// Leases asked for on draining proxies (each refused, or the run panics).
    pub refused_while_draining: usize,
}

impl Sampled {
    /// Prints what was sampled and asserts the budget held and that some
    /// draining proxy was asked for a lease (and refused).
    pub fn assert_within(&self, budget: usize, took: Duration) {
        println!(
            "every Proxy recycled {took:?} after applying; at most {} unavailable at once; {} leases refused on draining proxies",
            self.most_unavailable, self.refused_while_draining
        );
        assert!(
            self.most_unavailable <= budget,
            "{} Proxies unavailable at once, maxUnavailable is {budget}",
            self.most_unavailable
        );
        assert!(
            self.refused_while_draining > 0,
            "some draining proxy was asked for a lease"
        );
    }

    /// Prints what was sampled and asserts that every one of the `n`
    /// Proxies stayed Ready, serving, in every sample (a surge roll).
    pub fn assert_all_ready(&self, n: usize, took: Duration) {
        println!(
            "every Proxy replaced {took:?} after applying; {} samples, at least {} Ready in each, at most {} unavailable",
            self.samples, self.fewest_ready, self.most_unavailable
        );
        assert_eq!(self.fewest_ready, n, "the Ready count dropped");
        assert_eq!(self.most_unavailable, 0, "a Proxy was unavailable");
        assert_eq!(self.refused_while_draining, 0, "no Proxy drained");
    }
}

fn expires_at(lease: &Value) -> DateTime<Utc> {
    lease["expiresAt"].as_str().unwrap().parse().unwrap()
}

/// A crawler of the discovery API on `api`, leasing for `ttl_s` seconds.
pub struct Crawler<'a> {
    pub api: SocketAddr,
    pub token: &'a str,
    pub ttl_s: i64,
}

impl Crawler<'_> {
    /// Asks for a lease on the proxy whose `slot` attribute is `name`.
    async fn acquire(&self, name: &str, ttl_s: i64) -> (u16, Value) {
        let body = json!({"ttlSeconds": ttl_s, "filters": {"attributes": {"slot": name}}});
        api_call(
            self.api,
            "POST",
            "/v1/leases",
            Some(self.token),
            body.to_string().into(),
        )
        .await
    }

    /// Leases each of `names` (its `slot` attribute).
    pub async fn lease_each(&self, names: &[String]) -> BTreeMap<String, Held> {
        let mut held = BTreeMap::new();
        for name in names {
            let (code, lease) = self.acquire(name, self.ttl_s).await;
            if code == 201 {
                held.insert(
                    name.clone(),
                    Held {
                        id: lease["id"].as_str().unwrap().into(),
                        ends: expires_at(&lease),
                        renewing: true,
                    },
                );
            }
        }
        println!("leased {} of {} proxies", held.len(), names.len());
        held
    }

    /// Samples `proxies` about every 200 ms, renewing `held` every 2 s, until each
    /// of the `n` Proxies is Ready, not draining, and `old_gone` (its first
    /// instance was deleted); panics after `within` with `report()`.
    pub async fn until_recycled(
        &self,
        proxies: &Api<Proxy>,
        held: &mut BTreeMap<String, Held>,
        n: usize,
        within: Duration,
        old_gone: impl Fn(&str) -> bool,
        report: impl Fn() -> String,
    ) -> Sampled {
        let (api, token, ttl_s) = (self.api, self.token, self.ttl_s);
        let started = Instant::now();
        let mut out = Sampled {
            most_unavailable: 0,
            drains: BTreeMap::new(),
            refused_while_draining: 0,
            fewest_ready: usize::MAX,
            samples: 0,
        };
        // Proxies draining in a sample, with when that sample was taken.
        let mut draining_seen: BTreeMap<String, Instant> = BTreeMap::new();
        let mut last_renew = Instant::now();
        let draining = |p: &Proxy| {
            p.status
                .as_ref()
                .is_some_and(|s| s.draining_since.is_some())
        };
        loop {
            let list = proxies.list(&Default::default()).await.unwrap().items;
            let now = Instant::now();
            let unavailable = list
                .iter()
                .filter(|p| phase(p) != Some("Ready") || draining(p))
                .count();
            out.most_unavailable = out.most_unavailable.max(unavailable);
            let ready = list.iter().filter(|p| phase(p) == Some("Ready")).count();
            out.fewest_ready = out.fewest_ready.min(ready);
            out.samples += 1;
            let mut draining_now = BTreeSet::new();
            for p in &list {
                let st = p.status.as_ref();
                if let Some(t) = st.and_then(|s| s.draining_since) {
                    out.drains.entry(p.name_any()).or_default().insert(t);
                    draining_now.insert(p.name_any());
                }
                if let Some(r) = st.and_then(|s| s.retiring.as_ref()) {
                    out.drains.entry(p.name_any()).or_default().insert(r.since);
                }
            }
            draining_seen.retain(|n, _| draining_now.contains(n));
            for n in &draining_now {
                draining_seen.entry(n.clone()).or_insert(now);
            }
            // A proxy draining for 2 s (well past the operator's cache catching
            // up with its own write) gets no new lease.
            for (name, since) in &draining_seen {
                if now.duration_since(*since) < Duration::from_secs(2) {
                    continue;
                }
                let (code, answer) = self.acquire(name, 1).await;
                assert_eq!(
                    code, 409,
                    "a lease on {name}, draining since {since:?}: {answer}"
                );
                out.refused_while_draining += 1;
            }
            if last_renew.elapsed() >= Duration::from_secs(2) {
                last_renew = Instant::now();
                for h in held.values_mut().filter(|h| h.renewing) {
                    let body = json!({"ttlSeconds": ttl_s}).to_string();
                    let path = format!("/v1/leases/{}/renew", h.id);
                    let (code, lease) =
                        api_call(api, "POST", &path, Some(token), body.into()).await;
                    match code {
                        200 => h.ends = expires_at(&lease),
                        _ => h.renewing = false,
                    }
                }
            }
            let replaced = list
                .iter()
                .filter(|p| old_gone(&p.name_any()) && phase(p) == Some("Ready") && !draining(p))
                .count();
            if replaced == n {
                return out;
            }
            assert!(
                started.elapsed() < within,
                "only {replaced} of {n} Proxies have a new, Ready instance after {:?}\n{}",
                started.elapsed(),
                report()
            );
            // At least five samples a second with the list's own time.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
}

/// Asserts that no held lease was cut: each Proxy's first instance was
/// deleted (`deleted_at`, to the second) no sooner than the end of the
/// lease held on it when its first drain began, or the drain timeout.
/// Returns how many leases were held when their drain began.
pub fn assert_no_lease_cut(
    held: &BTreeMap<String, Held>,
    drains: &BTreeMap<String, BTreeSet<DateTime<Utc>>>,
    deleted_at: impl Fn(&str) -> DateTime<Utc>,
    drain_timeout_s: i64,
) -> usize {
    let mut checked = 0;
    for (name, h) in held {
        let drain = *drains[name].first().unwrap();
        if h.ends <= drain {
            continue;
        }
        checked += 1;
        let asked = deleted_at(name);
        let bound = h
            .ends
            .min(drain + chrono::TimeDelta::seconds(drain_timeout_s));
        // The deletion time is known to the second, rounded down.
        assert!(
            asked + chrono::TimeDelta::seconds(1) > bound,
            "{name}: its instance was deleted at {asked}, before the lease held on it ended at {} (drain began {drain})",
            h.ends
        );
    }
    println!("{checked} leases were held when their proxy's drain began, none cut");
    checked
}
