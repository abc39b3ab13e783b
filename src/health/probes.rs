//! The engine's decisions, without I/O or a runtime: [`Probes`] keeps the
//! probe targets in step with the Proxy set, says what is due at a given
//! `now` (milliseconds on the engine's monotonic clock, passed in), and
//! folds each result through the thresholds into a verdict to publish.
//! The engine (`engine.rs`) only runs what it is told and publishes.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use url::Url;

use super::probe::{ProbeResult, ProbeTarget};
use super::schedule::Schedule;
use super::threshold::{self, Change, Thresholds};
use crate::api::health::HealthReport;
use crate::api::{Proxy, ProxyMode, ProxyPhase};

/// Operator-wide probe defaults (flags).
#[derive(Debug, Clone)]
pub struct Defaults {
    /// `--default-probe-url`.
    pub url: Url,
    /// `--default-probe-expected-status`.
    pub expected_status: u16,
}

/// Default seconds between probes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default probe timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the schedule is brought in step with the Proxy cache.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);
/// What the engine probes for one Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The Proxy's UID when the spec was taken.
    pub uid: String,
    /// Where and what.
    pub target: ProbeTarget,
    /// Time between probes.
    pub interval: Duration,
    /// Flip thresholds.
    pub thresholds: Thresholds,
}

fn positive(v: Option<i32>, default: u64) -> u64 {
    v.and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// What to probe for a Proxy, or `None` when it has nothing to probe yet:
/// being deleted, a Managed Proxy without a running instance (phase Running
/// or Ready with an IP), or an invalid endpoint or URL.
pub fn probe_spec(p: &Proxy, d: &Defaults) -> Option<ProbeSpec> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let (host, port) = match p.spec.mode {
        ProxyMode::External => {
            let ep = p.spec.endpoint.as_ref()?;
            (ep.host.clone(), ep.port)
        }
        ProxyMode::Managed => {
            let st = p.status.as_ref()?;
            if !matches!(st.phase, Some(ProxyPhase::Running | ProxyPhase::Ready)) {
                return None;
            }
            (st.ip.clone().filter(|ip| !ip.is_empty())?, p.spec.port?)
        }
    };
    let port = u16::try_from(port).ok().filter(|p| *p > 0)?;
    let hc = p.spec.health_check.clone().unwrap_or_default();
    let url = match &hc.url {
        Some(u) => Url::parse(u).ok()?,
        None => d.url.clone(),
    };
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    let expected_status = hc
        .expected_status
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(d.expected_status);
    Some(ProbeSpec {
        uid: p.uid().unwrap_or_default(),
        target: ProbeTarget {
            proxy_host: host,
            proxy_port: port,
            url,
            expected_status,
            timeout: Duration::from_secs(positive(hc.timeout_seconds, DEFAULT_TIMEOUT.as_secs())),
        },
        interval: Duration::from_secs(positive(hc.interval_seconds, DEFAULT_INTERVAL.as_secs())),
        thresholds: Thresholds {
            success: positive(hc.success_threshold, 2).min(1000) as u32,
            failure: positive(hc.failure_threshold, 3).min(1000) as u32,
        },
    })
}

/// The key of a Proxy in the engine: `namespace/name`.
pub fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A Proxy whose published verdict must go, found by [`Probes::sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// `namespace/name`.
    pub key: String,
    /// The Proxy left the set (its metric series go too); otherwise its
    /// UID or target changed and it starts over.
    pub gone: bool,
}

/// A status-affecting result: what to publish for a Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The UID the verdict belongs to.
    pub uid: String,
    /// Why it affects status.
    pub change: Change,
    /// What the reconciler folds into the status.
    pub report: HealthReport,
}

/// What one probe result amounts to ([`Probes::complete`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folded {
    /// The Proxy was pruned while its probe ran: nothing to record.
    Gone,
    /// The probe was of an older UID or target: nothing to record.
    Stale,
    /// Recorded; the status stays as it is.
    Quiet,
    /// Recorded, and the status must change.
    Publish(Verdict),
}

/// The health engine's state machine: targets, schedule and thresholds.
#[derive(Debug)]
pub struct Probes {
    defaults: Defaults,
    sched: Schedule<String>,
    targets: HashMap<String, ProbeSpec>,
    states: HashMap<String, threshold::State>,
    last_sync: Option<u64>,
}

const SYNC_MS: u64 = SYNC_EVERY.as_millis() as u64;

impl Probes {
    /// Nothing probed yet; Proxies are probed with `defaults` unless they
    /// say otherwise.
    pub fn new(defaults: Defaults) -> Self {
        Probes {
            defaults,
            sched: Schedule::default(),
            targets: HashMap::new(),
            states: HashMap::new(),
            last_sync: None,
        }
    }

    /// Whether [`Probes::sync`] is due (at once, then every [`SYNC_EVERY`]).
    pub fn sync_due(&self, now: u64) -> bool {
        self.last_sync.is_none_or(|t| now >= t + SYNC_MS)
    }

    /// Brings the targets in step with `proxies` (the cache's contents):
    /// new Proxies are seeded (spread over their first interval), changed
    /// ones (UID or target) start over, gone ones are pruned. Returns the
    /// Proxies whose published verdict must go.
    pub fn sync<'a>(
        &mut self,
        proxies: impl IntoIterator<Item = &'a Proxy>,
        now: u64,
    ) -> Vec<Dropped> {
        self.last_sync = Some(now);
        let mut dropped = Vec::new();
        let mut seen = HashSet::new();
        for p in proxies {
            let Some(spec) = probe_spec(p, &self.defaults) else {
                continue;
            };
            let key = key_of(&p.namespace().unwrap_or_default(), &p.name_any());
            seen.insert(key.clone());
            let interval = spec.interval.as_millis() as u64;
            match self.targets.get(&key) {
                Some(old) if old.uid == spec.uid && old.target == spec.target => {
                    if old != &spec {
                        self.sched.upsert(&key, interval, now, 0);
                        self.targets.insert(key, spec);
                    }
                }
                old => {
                    if old.is_some() {
                        self.states.remove(&key);
                        self.sched.remove(&key);
                        dropped.push(Dropped {
                            key: key.clone(),
                            gone: false,
                        });
                    }
                    self.sched
                        .upsert(&key, interval, now, spread(&key, interval));
                    self.targets.insert(key, spec);
                }
            }
        }
        let gone: Vec<String> = self
            .targets
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.targets.remove(&key);
            self.states.remove(&key);
            self.sched.remove(&key);
            dropped.push(Dropped { key, gone: true });
        }
        dropped
    }

    /// Up to `limit` probes due at `now`, each marked in flight until
    /// [`Probes::complete`] (or [`Probes::requeue`]).
    pub fn due(&mut self, now: u64, limit: usize) -> Vec<(String, ProbeSpec)> {
        self.sched
            .pop_due(now, limit)
            .into_iter()
            .filter_map(|key| {
                let spec = self.targets.get(&key)?.clone();
                Some((key, spec))
            })
            .collect()
    }

    /// A due probe that could not be started: rescheduled as if it had
    /// run at `now`, so the Proxy is not lost.
    pub fn requeue(&mut self, key: &str, now: u64) {
        self.sched.complete(&key.to_string(), now, now);
    }

    /// How long the engine may sleep at `now` with `free` workers: until
    /// the next probe is due, at most [`SYNC_EVERY`].
    pub fn wait(&mut self, now: u64, free: usize) -> Duration {
        let ms = if free == 0 {
            SYNC_MS
        } else {
            self.sched
                .next_due()
                .map_or(SYNC_MS, |d| d.saturating_sub(now))
                .min(SYNC_MS)
        };
        Duration::from_millis(ms)
    }

    /// Folds the `result` of the probe of `key` with `spec` that started at
    /// `started` and ended at `now` (wall clock `at`): schedules its next
    /// probe and, unless the target changed meanwhile, runs the thresholds.
    pub fn complete(
        &mut self,
        key: &str,
        spec: &ProbeSpec,
        started: u64,
        now: u64,
        at: DateTime<Utc>,
        result: &ProbeResult,
    ) -> Folded {
        self.sched.complete(&key.to_string(), started, now);
        let Some(current) = self.targets.get(key) else {
            return Folded::Gone;
        };
        if current.uid != spec.uid || current.target != spec.target {
            return Folded::Stale;
        }
        let latency_ms = u64::try_from(result.latency.as_millis()).unwrap_or(u64::MAX);
        let state = self.states.entry(key.to_string()).or_default();
        let (next, change) = threshold::fold(*state, result.ok, latency_ms, current.thresholds);
        *state = next;
        let Some(change) = change else {
            return Folded::Quiet;
        };
        let healthy = next.healthy == Some(true);
        let message = if healthy {
            format!(
                "probe of {} through the proxy passed",
                redact(&current.target.url)
            )
        } else {
            result
                .error
                .as_ref()
                .map_or_else(|| "probe failed".into(), ToString::to_string)
        };
        Folded::Publish(Verdict {
            uid: current.uid.clone(),
            change,
            report: HealthReport {
                healthy,
                latency_ms,
                probed_at: at,
                message,
            },
        })
    }

    /// The threshold state of `key` (`None` before its first result).
    pub fn state(&self, key: &str) -> Option<threshold::State> {
        self.states.get(key).copied()
    }

    /// How many Proxies are probed.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// Whether no Proxy is probed.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

/// The URL without credentials, query or fragment (for messages).
fn redact(u: &Url) -> String {
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// A stable offset in `0..interval` so a fleet seeded at once is spread
/// over the first interval instead of probed in one burst.
fn spread(key: &str, interval_ms: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish() % interval_ms.max(1)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::probe::ProbeError;
    use super::*;
    use serde_json::json;

    pub(crate) fn defaults() -> Defaults {
        Defaults {
            url: Url::parse("https://www.gstatic.com/generate_204").unwrap(),
            expected_status: 204,
        }
    }

    pub(crate) fn proxy(v: serde_json::Value) -> Proxy {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn probe_spec_table() {
        let base = |spec: serde_json::Value, status: serde_json::Value| {
            proxy(
                json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
                "spec": spec, "status": status}),
            )
        };
        type Want<'a> = Option<(&'a str, u16, &'a str, u16, u64, u32, u32)>;
        let cases: Vec<(&str, Proxy, Want)> = vec![
            (
                "managed running",
                base(
                    json!({"provider": "k", "port": 3128}),
                    json!({"phase": "Running", "ip": "10.0.0.1"}),
                ),
                Some((
                    "10.0.0.1",
                    3128,
                    "https://www.gstatic.com/generate_204",
                    204,
                    1,
                    2,
                    3,
                )),
            ),
            (
                "managed provisioning",
                base(
                    json!({"provider": "k", "port": 3128}),
                    json!({"phase": "Provisioning", "ip": "10.0.0.1"}),
                ),
                None,
            ),
            (
                "managed without ip",
                base(
                    json!({"provider": "k", "port": 3128}),
                    json!({"phase": "Running"}),
                ),
                None,
            ),
            (
                "external with overrides",
                base(
                    json!({"mode": "External", "endpoint": {"host": "px.example", "port": 8080},
                        "healthCheck": {"url": "http://t.example/x", "expectedStatus": 200, "intervalSeconds": 7,
                            "timeoutSeconds": 2, "successThreshold": 1, "failureThreshold": 5}}),
                    json!({}),
                ),
                Some(("px.example", 8080, "http://t.example/x", 200, 7, 1, 5)),
            ),
            (
                "bad url",
                base(
                    json!({"mode": "External", "endpoint": {"host": "h", "port": 1}, "healthCheck": {"url": "ftp://x"}}),
                    json!({}),
                ),
                None,
            ),
        ];
        for (name, p, want) in cases {
            let got = probe_spec(&p, &defaults()).map(|s| {
                (
                    s.target.proxy_host.clone(),
                    s.target.proxy_port,
                    s.target.url.to_string(),
                    s.target.expected_status,
                    s.interval.as_secs(),
                    s.thresholds.success,
                    s.thresholds.failure,
                )
            });
            let want =
                want.map(|(h, p, u, e, i, s, f)| (h.to_string(), p, u.to_string(), e, i, s, f));
            assert_eq!(got, want, "{name}");
        }
    }

    pub(crate) fn external(name: &str, uid: &str, port: u16) -> Proxy {
        proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port},
                "healthCheck": {"url": "http://127.0.0.1:9/", "expectedStatus": 200, "timeoutSeconds": 1}}}),
        )
    }

    #[test]
    fn redaction_and_spread() {
        let u = Url::parse("https://user:pw@h.example/p?token=x#f").unwrap();
        assert_eq!(redact(&u), "https://h.example/p");
        assert!(spread("ns/a", 1000) < 1000);
        assert_eq!(spread("ns/a", 1000), spread("ns/a", 1000));
    }

    fn ok(ms: u64) -> ProbeResult {
        ProbeResult {
            ok: true,
            latency: Duration::from_millis(ms),
            error: None,
        }
    }

    fn failed(e: ProbeError) -> ProbeResult {
        ProbeResult {
            ok: false,
            latency: Duration::from_millis(7),
            error: Some(e),
        }
    }

    /// `external` with an interval and thresholds of its own.
    fn tuned(name: &str, uid: &str, interval: u64, success: u32, failure: u32) -> Proxy {
        proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 1},
                "healthCheck": {"url": "http://u:pw@t.example/x?k=v", "expectedStatus": 200,
                    "intervalSeconds": interval, "successThreshold": success, "failureThreshold": failure}}}),
        )
    }

    fn keys(due: &[(String, ProbeSpec)]) -> Vec<&str> {
        let mut k: Vec<&str> = due.iter().map(|(k, _)| k.as_str()).collect();
        k.sort();
        k
    }

    #[test]
    fn sync_table() {
        let mut p = Probes::new(defaults());
        assert!(p.sync_due(0));
        let a = tuned("a", "u1", 1, 2, 3);
        let b = tuned("b", "u1", 1, 2, 3);
        let a2 = tuned("a", "u2", 1, 2, 3);
        let a2_tuned = tuned("a", "u2", 1, 1, 1);
        let pending = proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"provider": "k", "port": 3128}, "status": {"phase": "Provisioning"}}),
        );
        // (step, proxies, now, dropped)
        type Step<'a> = (&'a str, Vec<&'a Proxy>, u64, Vec<(&'a str, bool)>);
        let steps: Vec<Step> = vec![
            (
                "seed; nothing to probe for c",
                vec![&a, &b, &pending],
                0,
                vec![],
            ),
            ("unchanged", vec![&a, &b, &pending], 1000, vec![]),
            (
                "a recreated: starts over",
                vec![&a2, &b],
                2000,
                vec![("ns/a", false)],
            ),
            (
                "a's thresholds change: kept",
                vec![&a2_tuned, &b],
                3000,
                vec![],
            ),
            (
                "b deleted: gone",
                vec![&a2_tuned],
                4000,
                vec![("ns/b", true)],
            ),
        ];
        for (step, proxies, now, want) in steps {
            assert!(p.sync_due(now), "{step}");
            let got = p.sync(proxies, now);
            let got: Vec<(&str, bool)> = got.iter().map(|d| (d.key.as_str(), d.gone)).collect();
            assert_eq!(got, want, "{step}");
            assert!(!p.sync_due(now + 999), "{step}");
        }
        assert_eq!(p.len(), 1);
        let due = p.due(10_000, 10);
        assert_eq!(keys(&due), ["ns/a"]);
        assert_eq!(due[0].1.uid, "u2");
        assert_eq!(
            due[0].1.thresholds,
            Thresholds {
                success: 1,
                failure: 1
            }
        );
    }

    #[test]
    fn schedule_by_now() {
        let mut p = Probes::new(defaults());
        p.sync([&tuned("a", "u1", 2, 1, 1), &tuned("b", "u1", 2, 1, 1)], 0);
        // Both are seeded within their first interval.
        let first = p.due(1999, 10);
        assert_eq!(keys(&first), ["ns/a", "ns/b"]);
        // In flight: not due again, and nothing to wait for but the sync.
        assert!(p.due(100_000, 10).is_empty());
        assert_eq!(p.wait(2000, 4), SYNC_EVERY);
        assert_eq!(p.wait(2000, 0), SYNC_EVERY);
        let spec = first[0].1.clone();
        // Started at 2000, done at 2100: due one interval after the start.
        p.complete("ns/a", &spec, 2000, 2100, Utc::now(), &ok(5));
        assert_eq!(p.wait(3500, 4), Duration::from_millis(500));
        assert_eq!(p.wait(3500, 0), SYNC_EVERY);
        assert!(p.due(3999, 10).is_empty());
        assert_eq!(keys(&p.due(4000, 10)), ["ns/a"]);
        // A probe slower than its interval is due again at once.
        p.complete("ns/a", &spec, 4000, 9000, Utc::now(), &ok(5));
        assert_eq!(p.wait(9000, 1), Duration::ZERO);
        assert_eq!(keys(&p.due(9000, 1)), ["ns/a"]);
        // One that could not start is rescheduled as if it had run.
        p.requeue("ns/a", 9000);
        assert!(p.due(10_999, 1).is_empty());
        assert_eq!(keys(&p.due(11_000, 1)), ["ns/a"]);
        // A limit of zero pops nothing.
        p.complete("ns/a", &spec, 11_000, 11_000, Utc::now(), &ok(5));
        assert!(p.due(20_000, 0).is_empty());
    }

    #[test]
    fn results_fold_into_verdicts() {
        let refused = || ProbeError::Refused("Connection refused (os error 111)".into());
        let status = || ProbeError::Status {
            who: "target",
            status: 503,
            expected: 200,
        };
        // (result, what it amounts to: None quiet, Some((healthy, change, message)))
        type Want<'a> = Option<(bool, Change, &'a str)>;
        let passed = "probe of http://t.example/x through the proxy passed";
        let cases: Vec<(&str, Vec<(ProbeResult, Want)>)> = vec![
            (
                "first ok, two failures quiet, the third flips",
                vec![
                    (ok(10), Some((true, Change::First, passed))),
                    (failed(refused()), None),
                    (failed(status()), None),
                    (
                        failed(status()),
                        Some((
                            false,
                            Change::Flip,
                            "target answered status 503, expected 200",
                        )),
                    ),
                    (ok(10), None),
                    (ok(10), Some((true, Change::Flip, passed))),
                    (ok(500), Some((true, Change::Latency, passed))),
                ],
            ),
            (
                "first failure is reported in plain words",
                vec![(
                    failed(refused()),
                    Some((
                        false,
                        Change::First,
                        "connecting to the proxy: Connection refused (os error 111)",
                    )),
                )],
            ),
            (
                "a failure without an error",
                vec![(
                    ProbeResult {
                        ok: false,
                        latency: Duration::ZERO,
                        error: None,
                    },
                    Some((false, Change::First, "probe failed")),
                )],
            ),
        ];
        for (name, seq) in cases {
            let mut p = Probes::new(defaults());
            p.sync([&tuned("a", "u1", 1, 2, 3)], 0);
            let spec = p.due(1000, 1).pop().unwrap().1;
            let at = Utc::now();
            for (i, (result, want)) in seq.into_iter().enumerate() {
                let got = p.complete("ns/a", &spec, 0, 0, at, &result);
                let want = match want {
                    None => Folded::Quiet,
                    Some((healthy, change, message)) => Folded::Publish(Verdict {
                        uid: "u1".into(),
                        change,
                        report: HealthReport {
                            healthy,
                            latency_ms: result.latency.as_millis() as u64,
                            probed_at: at,
                            message: message.into(),
                        },
                    }),
                };
                assert_eq!(got, want, "{name}, step {i}");
            }
        }
    }

    #[test]
    fn stale_and_pruned_results_are_not_folded() {
        let mut p = Probes::new(defaults());
        let old = probe_spec(&external("a", "u1", 1), &defaults()).unwrap();
        let moved = probe_spec(&external("a", "u2", 2), &defaults()).unwrap();
        p.sync([&external("a", "u2", 1)], 0);
        let at = Utc::now();
        assert_eq!(p.complete("ns/a", &old, 0, 0, at, &ok(1)), Folded::Stale);
        let mut other_target = moved.clone();
        other_target.uid = "u2".into();
        assert_eq!(
            p.complete("ns/a", &other_target, 0, 0, at, &ok(1)),
            Folded::Stale
        );
        assert_eq!(p.state("ns/a"), None);
        p.sync([], 1000);
        assert!(p.is_empty());
        assert_eq!(p.complete("ns/a", &old, 0, 0, at, &ok(1)), Folded::Gone);
        assert!(p.due(u64::MAX / 2, 10).is_empty());
    }
}
