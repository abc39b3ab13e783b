//! The engine: keeps the probe schedule in step with the Proxy cache, runs
//! due probes on a bounded pool of workers, folds results through the
//! thresholds, and publishes status-affecting ones (snapshot + reconcile
//! trigger).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use rustls::ClientConfig;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tracing::{debug, info, Instrument};
use url::Url;

use super::notify::Notifier;
use super::probe::{self, ProbeError, ProbeResult, ProbeTarget};
use super::schedule::Schedule;
use super::threshold::{self, Change, Thresholds};
use crate::api::health::{HealthReport, HealthSource};
use crate::api::{Proxy, ProxyMode, ProxyPhase};
use crate::metrics::HealthMetrics;

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

/// The health engine: the snapshot readers see, and the settings the loop
/// runs with.
pub struct Engine {
    defaults: Defaults,
    workers: usize,
    tls: Arc<ClientConfig>,
    trace_probes: bool,
    metrics: HealthMetrics,
    snapshot: RwLock<HashMap<String, (String, HealthReport)>>,
}

impl HealthSource for Engine {
    fn verdict(&self, namespace: &str, name: &str, uid: &str) -> Option<bool> {
        self.report(namespace, name, uid).map(|r| r.healthy)
    }

    fn report(&self, namespace: &str, name: &str, uid: &str) -> Option<HealthReport> {
        let snap = self.snapshot.read().unwrap_or_else(|p| p.into_inner());
        let (u, r) = snap.get(&key_of(namespace, name))?;
        (u == uid).then(|| r.clone())
    }
}

struct Done {
    key: String,
    spec: ProbeSpec,
    started_ms: u64,
    at: DateTime<Utc>,
    result: ProbeResult,
}

impl Engine {
    /// An engine; `workers` is the probe pool size (at least 1).
    pub fn new(
        defaults: Defaults,
        workers: usize,
        tls: Arc<ClientConfig>,
        trace_probes: bool,
        metrics: HealthMetrics,
    ) -> Self {
        Engine {
            defaults,
            workers: workers.max(1),
            tls,
            trace_probes,
            metrics,
            snapshot: RwLock::new(HashMap::new()),
        }
    }

    fn publish(&self, key: &str, uid: &str, report: Option<HealthReport>) {
        let mut snap = self.snapshot.write().unwrap_or_else(|p| p.into_inner());
        match report {
            Some(r) => snap.insert(key.to_string(), (uid.to_string(), r)),
            None => snap.remove(key),
        };
    }

    /// Runs until `shutdown` resolves, probing the Proxies in `cache`.
    pub async fn run(
        self: Arc<Self>,
        cache: Store<Proxy>,
        mut notifier: Notifier,
        shutdown: impl Future<Output = ()>,
    ) {
        let epoch = Instant::now();
        let now_ms = || u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let pool = Arc::new(Semaphore::new(self.workers));
        let (done_tx, mut done_rx) = mpsc::channel::<Done>(self.workers * 2);
        let mut sched: Schedule<String> = Schedule::default();
        let mut targets: HashMap<String, ProbeSpec> = HashMap::new();
        let mut states: HashMap<String, threshold::State> = HashMap::new();
        let mut last_sync: Option<u64> = None;
        tokio::pin!(shutdown);
        info!(workers = self.workers, "Health engine started");
        loop {
            let now = now_ms();
            if last_sync.is_none_or(|t| now >= t + SYNC_EVERY.as_millis() as u64) {
                last_sync = Some(now);
                self.sync(&cache, &mut sched, &mut targets, &mut states, now);
                notifier.flush();
            }
            for key in sched.pop_due(now, pool.available_permits()) {
                let Some(spec) = targets.get(&key).cloned() else {
                    continue;
                };
                let Ok(permit) = pool.clone().try_acquire_owned() else {
                    // Cannot happen (we popped at most the free permits);
                    // reschedule rather than lose the proxy.
                    sched.complete(&key, now, now);
                    continue;
                };
                let (tx, tls, trace) = (done_tx.clone(), self.tls.clone(), self.trace_probes);
                tokio::spawn(async move {
                    let result = if trace {
                        let span = tracing::info_span!(
                            parent: None,
                            "health.probe",
                            otel.kind = "client",
                            proxy = %key,
                            probe.ok = tracing::field::Empty,
                            probe.latency_ms = tracing::field::Empty,
                            otel.status_code = tracing::field::Empty,
                            otel.status_message = tracing::field::Empty,
                        );
                        let r = probe::probe(&spec.target, &tls)
                            .instrument(span.clone())
                            .await;
                        span.record("probe.ok", r.ok);
                        span.record("probe.latency_ms", r.latency.as_millis() as u64);
                        if let Some(e) = &r.error {
                            span.record("otel.status_code", "ERROR");
                            span.record("otel.status_message", e.to_string());
                        }
                        r
                    } else {
                        probe::probe(&spec.target, &tls).await
                    };
                    drop(permit);
                    let _ = tx
                        .send(Done {
                            key,
                            spec,
                            started_ms: now,
                            at: Utc::now(),
                            result,
                        })
                        .await;
                });
            }
            let wait_ms = if pool.available_permits() == 0 {
                SYNC_EVERY.as_millis() as u64
            } else {
                sched
                    .next_due()
                    .map_or(SYNC_EVERY.as_millis() as u64, |d| d.saturating_sub(now))
                    .min(SYNC_EVERY.as_millis() as u64)
            };
            tokio::select! {
                _ = &mut shutdown => break,
                Some(done) = done_rx.recv() => {
                    let now = now_ms();
                    sched.complete(&done.key, done.started_ms, now);
                    self.fold(done, &targets, &mut states, &mut notifier);
                }
                _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
            }
        }
        info!("Health engine stopped");
    }

    /// Brings the schedule in step with the cache: new Proxies are seeded,
    /// changed ones (UID or target) start over, gone ones are pruned and
    /// their metric series forgotten.
    fn sync(
        &self,
        cache: &Store<Proxy>,
        sched: &mut Schedule<String>,
        targets: &mut HashMap<String, ProbeSpec>,
        states: &mut HashMap<String, threshold::State>,
        now: u64,
    ) {
        let mut seen = HashSet::new();
        for p in cache.state() {
            let Some(spec) = probe_spec(&p, &self.defaults) else {
                continue;
            };
            let key = key_of(&p.namespace().unwrap_or_default(), &p.name_any());
            seen.insert(key.clone());
            let interval = spec.interval.as_millis() as u64;
            match targets.get(&key) {
                Some(old) if old.uid == spec.uid && old.target == spec.target => {
                    if old != &spec {
                        sched.upsert(&key, interval, now, 0);
                        targets.insert(key, spec);
                    }
                }
                old => {
                    if old.is_some() {
                        debug!(proxy = %key, "Probe target changed; starting over");
                        states.remove(&key);
                        self.publish(&key, "", None);
                        sched.remove(&key);
                    }
                    sched.upsert(&key, interval, now, spread(&key, interval));
                    targets.insert(key, spec);
                }
            }
        }
        let gone: Vec<String> = targets
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            targets.remove(&key);
            states.remove(&key);
            sched.remove(&key);
            self.publish(&key, "", None);
            self.metrics.forget_proxy(&key, &ProbeError::REASONS);
        }
    }

    fn fold(
        &self,
        done: Done,
        targets: &HashMap<String, ProbeSpec>,
        states: &mut HashMap<String, threshold::State>,
        notifier: &mut Notifier,
    ) {
        let Some(current) = targets.get(&done.key) else {
            return; // pruned while in flight
        };
        if current.uid != done.spec.uid || current.target != done.spec.target {
            debug!(proxy = %done.key, "Discarding a stale probe result");
            return;
        }
        let r = &done.result;
        self.metrics.observe(
            &done.key,
            r.error.as_ref().map(ProbeError::reason),
            r.latency,
        );
        let latency_ms = u64::try_from(r.latency.as_millis()).unwrap_or(u64::MAX);
        let state = states.entry(done.key.clone()).or_default();
        let (next, change) = threshold::fold(*state, r.ok, latency_ms, current.thresholds);
        *state = next;
        let Some(change) = change else {
            return;
        };
        let healthy = next.healthy == Some(true);
        if change != Change::Latency {
            info!(proxy = %done.key, healthy, latencyMillis = latency_ms, error = r.error.as_ref().map(ToString::to_string).unwrap_or_default(), "Proxy health changed");
        }
        let message = if healthy {
            format!(
                "probe of {} through the proxy passed",
                redact(&current.target.url)
            )
        } else {
            r.error
                .as_ref()
                .map_or_else(|| "probe failed".into(), ToString::to_string)
        };
        self.publish(
            &done.key,
            &current.uid,
            Some(HealthReport {
                healthy,
                latency_ms,
                probed_at: done.at,
                message,
            }),
        );
        if let Some((ns, name)) = done.key.split_once('/') {
            notifier.notify(ns, name);
        }
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
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> Defaults {
        Defaults {
            url: Url::parse("https://www.gstatic.com/generate_204").unwrap(),
            expected_status: 204,
        }
    }

    fn proxy(v: serde_json::Value) -> Proxy {
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

    fn external(name: &str, uid: &str, port: u16) -> Proxy {
        proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port},
                "healthCheck": {"url": "http://127.0.0.1:9/", "expectedStatus": 200, "timeoutSeconds": 1}}}),
        )
    }

    /// A "proxy" that answers 200 to every request.
    async fn answering_proxy() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = c.read(&mut buf).await;
                    let _ = c
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn the_loop_probes_notifies_restarts_on_uid_change_and_prunes() {
        use kube::runtime::watcher::Event;
        let port = answering_proxy().await;
        let metrics = crate::metrics::Metrics::new();
        let engine = Arc::new(Engine::new(
            defaults(),
            2,
            super::super::probe::tls_config(None).unwrap(),
            false,
            metrics.health.clone(),
        ));
        let (reader, mut writer) = kube::runtime::reflector::store::<Proxy>();
        writer.apply_watcher_event(&Event::Apply(external("a", "u1", port)));
        let (notifier, mut rx) = Notifier::channel(4);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(engine.clone().run(reader, notifier, async move {
            let _ = stop_rx.await;
        }));
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (first.name.as_str(), first.namespace.as_deref()),
            ("a", Some("ns"))
        );
        assert_eq!(engine.verdict("ns", "a", "u1"), Some(true));
        assert_eq!(engine.verdict("ns", "a", "other-uid"), None);
        let r = engine.report("ns", "a", "u1").unwrap();
        assert!(r.message.contains("passed"), "{r:?}");
        // Recreated under the same name: the old verdict is gone, a new
        // first verdict comes for the new UID.
        writer.apply_watcher_event(&Event::Apply(external("a", "u2", port)));
        let again = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.name, "a");
        assert_eq!(engine.verdict("ns", "a", "u1"), None);
        assert_eq!(engine.verdict("ns", "a", "u2"), Some(true));
        assert!(metrics.encode().unwrap().contains("proxy=\"ns/a\""));
        // Deleted: pruned, series forgotten.
        writer.apply_watcher_event(&Event::Delete(external("a", "u2", port)));
        let mut gone = false;
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if engine.verdict("ns", "a", "u2").is_none()
                && !metrics.encode().unwrap().contains("ns/a")
            {
                gone = true;
                break;
            }
        }
        assert!(gone, "pruned");
        let _ = stop_tx.send(());
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_result_for_an_old_uid_is_discarded() {
        let metrics = crate::metrics::Metrics::new();
        let engine = Engine::new(
            defaults(),
            1,
            super::super::probe::tls_config(None).unwrap(),
            false,
            metrics.health.clone(),
        );
        let old = probe_spec(&external("a", "u1", 1), &defaults()).unwrap();
        let new = probe_spec(&external("a", "u2", 1), &defaults()).unwrap();
        let targets = HashMap::from([("ns/a".to_string(), new)]);
        let mut states = HashMap::new();
        let (mut n, mut rx) = Notifier::channel(4);
        let done = Done {
            key: "ns/a".into(),
            spec: old,
            started_ms: 0,
            at: Utc::now(),
            result: ProbeResult {
                ok: true,
                latency: Duration::from_millis(5),
                error: None,
            },
        };
        engine.fold(done, &targets, &mut states, &mut n);
        assert!(states.is_empty());
        assert!(rx.try_recv().is_err());
        assert_eq!(engine.verdict("ns", "a", "u1"), None);
        assert_eq!(engine.verdict("ns", "a", "u2"), None);
        assert!(!metrics.encode().unwrap().contains("ns/a"));
    }

    #[test]
    fn redaction_and_spread() {
        let u = Url::parse("https://user:pw@h.example/p?token=x#f").unwrap();
        assert_eq!(redact(&u), "https://h.example/p");
        assert!(spread("ns/a", 1000) < 1000);
        assert_eq!(spread("ns/a", 1000), spread("ns/a", 1000));
    }
}
