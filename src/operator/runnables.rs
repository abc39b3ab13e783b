//! Starting the runnables the [`Operator`](super::Operator) wires: each
//! function takes what it needs, spawns its tasks into the shared set, and
//! returns the handles other runnables consume.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::Store;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::metrics::Metrics;
use super::settings::{HealthSettings, ProviderChecks, Settings};
use crate::api::constants::DISCOVERY_URL_ANNOTATION;
use crate::api::{Proxy, ProxyPhase};
use crate::discovery;
use crate::fleet::Fleet;
use crate::health;
use crate::leader::Observed;
use crate::lease::{LeaseKey, LeaseStore};
use crate::providerhealth::metrics::TargetSample;
use crate::providerhealth::{self, writer::Writer, Monitor};
use crate::replica::internal::{url_sealed, GATEWAY_URL_SEAL_ANNOTATION, URL_SEAL_ANNOTATION};
use crate::replica::members::Replicas;

/// `proxy_operator_proxies{phase,provider}`, counted from the shared Proxy
/// cache at every scrape; the providers in force (`sets`, reloads
/// included) report every phase even before they have a Proxy.
pub fn count_phases(
    metrics: &Metrics,
    cache: Store<Proxy>,
    sets: tokio::sync::watch::Receiver<Arc<super::reload::ProviderSet>>,
) {
    metrics.phases.set_phases(move || {
        let configured: Vec<String> = sets
            .borrow()
            .config
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        phase_counts(&cache.state(), &configured)
    });
}

/// Proxies by provider and phase, as (phase, provider, count). Every phase
/// is present, zero included, for each configured provider and each other
/// provider a Proxy names; External Proxies (no provider) count under `""`,
/// which Prometheus reads as no `provider` label.
pub fn phase_counts(proxies: &[Arc<Proxy>], configured: &[String]) -> Vec<(String, String, i64)> {
    let phases = [
        ProxyPhase::Provisioning,
        ProxyPhase::Running,
        ProxyPhase::Ready,
        ProxyPhase::Failed,
    ];
    let provider_of = |p: &Proxy| p.spec.provider.clone().unwrap_or_default();
    let mut providers: Vec<String> = configured.to_vec();
    for p in proxies {
        let name = provider_of(p);
        if !providers.contains(&name) {
            providers.push(name);
        }
    }
    let mut counts = Vec::with_capacity(providers.len() * phases.len());
    for provider in providers {
        for ph in phases {
            let n = proxies
                .iter()
                .filter(|p| provider_of(p) == provider)
                .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(ph))
                .count();
            counts.push((
                ph.as_str().to_string(),
                provider.clone(),
                i64::try_from(n).unwrap_or(i64::MAX),
            ));
        }
    }
    counts
}

pub use crate::replica::lease_key::Keys;

/// The discovery and lease API (every replica) with its lease sweeper and,
/// with `--discovery-tokens-secret`, the watch that keeps its tokens; lease
/// calls are served here only while `leader` says this replica leads, and
/// forwarded to the leader otherwise. Leases are signed with `key`. Returns
/// the lease store, its replicas (`replica::members`), and a token
/// cancelled once the API stopped serving.
pub fn spawn_discovery(
    tasks: &mut JoinSet<()>,
    addr: SocketAddr,
    settings: &Settings,
    (client, cache, keys): (&kube::Client, crate::proxy_store::ProxyStore, Keys),
    (metrics, replacer): (&Metrics, Arc<dyn discovery::Replacer>),
    (leader, fence): (tokio::sync::watch::Receiver<Observed>, crate::leader::Fence),
    stop: impl Future<Output = ()> + Send + 'static,
) -> (Arc<LeaseStore>, Arc<Replicas>, CancellationToken) {
    // A 503 asks the crawler back after one election attempt.
    let retry_after = settings
        .leader
        .map(|t| Duration::from_secs(t.retry_period.as_secs_f64().ceil() as u64))
        .unwrap_or(Duration::from_secs(1));
    let gateway_only = settings.role == crate::cli::Role::Gateway;
    // A gateway checks the seal made with its own key.
    let seal = match gateway_only {
        true => GATEWAY_URL_SEAL_ANNOTATION,
        false => URL_SEAL_ANNOTATION,
    };
    let trusted = keys.own.clone();
    let forwarder = discovery::Forwarder::new(
        Arc::new(move || fenced(leader_of(&leader.borrow(), (&trusted, seal)), fence.holds())),
        discovery::FORWARD_TIMEOUT,
        retry_after,
    )
    .with_key(keys.own.clone())
    .with_gateway_key(keys.gateway.clone());
    let leases = LeaseStore::new(settings.leases).with_client_limits(settings.client_limits);
    // A gateway never leads, so it signs no lease id: it has no key to.
    let leases = Arc::new(match gateway_only {
        true => leases,
        false => leases.with_key(keys.own),
    });
    let fixed = settings.discovery_tokens.clone();
    let secret = settings.discovery_tokens_secret.clone();
    let tokens = Arc::new(discovery::TokenSet::new(&fixed, secret.is_some()));
    metrics.discovery.tokens_applied(fixed.len());
    let replicas = Arc::new(Replicas::new(leases.clone(), &super::leader_identity()));
    let state =
        discovery::ApiState::with_clients(Arc::new(cache), leases.clone(), &[], &metrics.discovery)
            .with_token_set(tokens.clone())
            .with_external_namespaces(settings.health.defaults.external.clone())
            .with_credentials(settings.health.defaults.credentials.clone())
            .with_forwarder(forwarder)
            .with_replicas(replicas.clone())
            .with_replacer(replacer)
            .with_bench_routes(settings.health.pause.clone());
    // A process that can never lead must not hold up grants.
    let state = match settings.role {
        crate::cli::Role::Gateway => state.as_observer(),
        crate::cli::Role::Operator => state,
    };
    let stop = futures::FutureExt::shared(Box::pin(stop));
    // Only the operator makes the token: the gateway's RBAC reads Secrets.
    let generate = match settings.role {
        crate::cli::Role::Operator => settings.generate_discovery_token.clone(),
        crate::cli::Role::Gateway => None,
    };
    let min_len = match settings.gateway_bind {
        Some(_) => super::tokens::GATEWAY_MIN_TOKEN,
        None => 0,
    };
    if let Some(name) = secret {
        let (client, namespace) = (client.clone(), settings.operator_namespace.clone());
        let (m, stop) = (metrics.discovery.clone(), stop.clone());
        tasks.spawn(async move {
            let watch = super::tokens::watch_secret(
                client.clone(),
                &namespace,
                &name,
                (fixed, min_len),
                tokens,
                m,
                stop.clone(),
            );
            // The watch takes the generated token as soon as it is written.
            match generate {
                Some(token_client) => {
                    let made = super::tokens::ensure_generated(
                        client,
                        &namespace,
                        &name,
                        &token_client,
                        stop,
                    );
                    futures::join!(made, watch);
                }
                None => watch.await,
            }
        });
    }
    // The health engine (while this replica leads) probes at once what a
    // gateway saw fail.
    let state = state.with_hints(settings.health.hints.clone());
    // The gateway takes the API's listing, tokens and lease service; the
    // API takes its session reports.
    let state = match settings.gateway_bind {
        Some(at) => {
            let fed = (state.gateway_parts(), metrics.gateway.clone());
            let deny = settings.health.defaults.deny.clone();
            let gateway = spawn_gateway(
                tasks,
                at,
                (settings.gateway.clone(), deny),
                fed,
                stop.clone(),
            );
            state.with_gateway(gateway)
        }
        None => state,
    };
    let served = CancellationToken::new();
    let done = served.clone();
    let limits = settings.discovery_limits;
    tasks.spawn(async move {
        if let Err(e) = discovery::serve(addr, state, limits, stop).await {
            error!(%addr, error = %e, "Discovery API failed");
        }
        done.cancel();
    });
    (leases, replicas, served)
}

/// The gateway inside this process: it shares the discovery API's
/// listing, lease store and tokens (`api`).
fn spawn_gateway(
    tasks: &mut JoinSet<()>,
    addr: SocketAddr,
    (settings, deny): (crate::gateway::Settings, Arc<crate::tenancy::ProbeDenylist>),
    (api, metrics): (
        discovery::GatewayParts,
        crate::gateway::metrics::GatewayMetrics,
    ),
    stop: impl Future<Output = ()> + Send + 'static,
) -> Arc<crate::gateway::Gateway> {
    let fleet = Arc::new(crate::gateway::ApiFleet::new(api).with_deny(deny));
    let gateway = crate::gateway::Gateway::new(fleet.clone(), settings, metrics);
    let gateway = Arc::new(gateway);
    let serving = gateway.clone();
    let stop = futures::FutureExt::shared(Box::pin(stop));
    tasks.spawn(crate::gateway::warm_upstreams(fleet, stop.clone()));
    tasks.spawn(async move {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                error!(%addr, error = %e, "The gateway could not listen");
                return;
            }
        };
        info!(%addr, "Gateway listening");
        if let Err(e) = crate::gateway::serve(listener, serving, stop).await {
            error!(%addr, error = %e, "Gateway failed");
        }
    });
    gateway
}

/// The leader view a lease call acts on: this replica leads only while
/// its fence holds (`leader::Fence`); past it, whatever the election last
/// saw, it answers as if no leader were known (503 `leader_unavailable`)
/// until a renewal, or a step-down and the next leader's URL.
pub fn fenced(view: discovery::Leader, holds: bool) -> discovery::Leader {
    match (view, holds) {
        (discovery::Leader::Me, false) => discovery::Leader::Unknown,
        (view, _) => view,
    }
}

/// Where lease calls go, from what the election last saw: here, to the
/// URL the leader publishes on its Lease when it carries the seal of
/// `key` (the shared lease key), or nowhere.
pub fn leader_of(observed: &Observed, (key, annotation): (&LeaseKey, &str)) -> discovery::Leader {
    match observed {
        Observed::Me => discovery::Leader::Me,
        Observed::Other(p) => match p.annotations.get(DISCOVERY_URL_ANNOTATION) {
            None => discovery::Leader::Unknown,
            Some(url) => {
                let seal = p.annotations.get(annotation).map_or("", |s| s.as_str());
                let term = (p.term.holder.as_str(), p.term.transitions);
                if url_sealed(key, url, term, seal) {
                    discovery::Leader::At(url.clone())
                } else {
                    discovery::Leader::Unverified
                }
            }
        },
        Observed::Nobody => discovery::Leader::Unknown,
    }
}

/// The credentials Secrets' watch: probes, leases and creates read them
/// from this one.
pub fn watch_credentials(
    tasks: &mut JoinSet<()>,
    s: &super::Settings,
    client: &kube::Client,
    stop: &CancellationToken,
) {
    let cache = &s.health.defaults.credentials;
    let Some(watch) = credentials_watch(cache, client.clone(), s.proxy_namespace.as_deref()) else {
        return; // a second call: the first one's watch fills the cache
    };
    let stop = stop.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = watch => {}
            _ = stop.cancelled() => {}
        }
    });
}

/// Waits (at most `limit`) for a gateway's first copy of the leader's
/// credentials.
pub async fn credentials_copied(cache: &crate::credentials::CredentialsCache, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cache.synced() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The watch that fills `cache` with the labelled credentials Secrets (of
/// `namespace`, or all), to be polled for as long as it should run; `None`
/// when the cache already has its watch.
pub fn credentials_watch(
    cache: &crate::credentials::CredentialsCache,
    client: kube::Client,
    namespace: Option<&str>,
) -> Option<impl Future<Output = ()> + Send + 'static> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::{watcher, WatchStreamExt};
    let writer = cache.take_writer()?;
    let api: kube::Api<Secret> = match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    };
    let wc = watcher::Config::default().labels(&crate::credentials::CredentialsCache::selector());
    let changes = cache.change_counter();
    Some(
        watcher(api, wc)
            .modify(|s: &mut Secret| crate::proxy_store::strip_meta(&mut s.metadata))
            .default_backoff()
            .reflect(writer)
            .for_each(move |res| {
                match res {
                    Ok(_) => {
                        changes.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::provider::error::plain_message(&e), "Watching credentials Secrets");
                    }
                }
                std::future::ready(())
            }),
    )
}

/// The health engine (leader-only): probes every Proxy through itself and
/// names the Proxies whose status changed on the returned channel.
pub fn spawn_health_engine(
    tasks: &mut JoinSet<()>,
    settings: &HealthSettings,
    cache: crate::proxy_store::ProxyStore,
    metrics: &Metrics,
    stop: impl Future<Output = ()> + Send + 'static,
) -> (
    Arc<health::Engine>,
    tokio::sync::mpsc::Receiver<kube::runtime::reflector::ObjectRef<Proxy>>,
) {
    let engine = Arc::new(
        health::Engine::new(
            settings.defaults.clone(),
            settings.workers,
            settings.tls.clone(),
            settings.trace_probes,
            metrics.health.clone(),
        )
        .with_resolver(health::dns::Resolver::caching(settings.dns_ttl))
        .with_pause(settings.pause.clone())
        .with_hints(settings.hints.clone()),
    );
    let (notifier, events) = health::Notifier::channel(health::NOTIFY_CAPACITY);
    let runner = engine.clone();
    // The probes run on a runtime of their own, on one thread: a burst of
    // due probes then waits for that thread, and the API's requests, on
    // the main runtime, are not queued behind it (the kernel shares the
    // CPU between the threads). Its channels and the stop signal work
    // across runtimes.
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("health-probes")
        .build()
    {
        Ok(rt) => {
            tasks.spawn_blocking(move || rt.block_on(runner.run(cache, notifier, stop)));
        }
        Err(e) => {
            warn!(error = %e, "Cannot start the probes' own runtime; probing on the main one");
            tasks.spawn(async move { runner.run(cache, notifier, stop).await });
        }
    }
    (engine, events)
}

/// The provider health monitor and the ProviderHealth writer of `op`
/// (leader-only, reporting `fleet`'s circuit breakers), after removing
/// objects of unconfigured providers (all of them when checks are off).
/// The removal runs in the spawned task, so starting a term of leadership
/// never waits on the API server.
pub fn spawn_provider_health(
    tasks: &mut JoinSet<()>,
    op: &super::Operator,
    providers: &crate::provider::registry::Registry,
    installation: &str,
    fleet: Arc<Fleet>,
    stop: &CancellationToken,
) {
    let (checks, client, metrics) = (op.settings.provider_checks, &op.client, &op.metrics);
    let names: BTreeSet<String> = providers
        .checkers()
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let (client, installation_id) = (client.clone(), installation.to_string());
    let Some(ProviderChecks { interval, timeout }) = checks else {
        let stop = stop.clone();
        tasks.spawn(async move {
            let none = BTreeSet::new();
            tokio::select! {
                _ = providerhealth::writer::cleanup(&client, &installation_id, &none) => {}
                _ = stop.cancelled() => {}
            }
        });
        info!("Provider checks are off (--provider-check-interval=0)");
        return;
    };
    let monitor = Monitor::new(providers.checkers().to_vec(), interval, timeout);
    let snapshot = monitor.snapshot();
    let snap = snapshot.clone();
    metrics.provider_health.set_targets(move || {
        snap.get()
            .iter()
            .flat_map(|r| {
                let at = r.checked_at.timestamp_micros() as f64 / 1e6;
                r.targets.iter().map(move |t| TargetSample {
                    provider: r.provider.clone(),
                    target: t.name.clone(),
                    up: t.ready,
                    duration_seconds: t.latency.as_secs_f64(),
                    timestamp_seconds: at,
                })
            })
            .collect()
    });
    let writer = Writer::new(
        client.clone(),
        snapshot,
        names.clone(),
        &installation_id,
        Some(metrics.reconcile.clone()),
    )
    .with_breakers(fleet)
    .with_events(op.events.clone());
    let rounds = monitor.subscribe();
    let stop = stop.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = providerhealth::writer::cleanup(&client, &installation_id, &names) => {}
            _ = stop.cancelled() => return,
        }
        let monitor_stop = stop.clone().cancelled_owned();
        let writer_stop = stop.cancelled_owned();
        tokio::join!(
            monitor.run(monitor_stop),
            providerhealth::writer::run(writer, rounds, writer_stop)
        );
    });
}

/// Waits for every task in `tasks`; once `until` has resolved, gives them
/// `grace` more, then aborts the rest.
pub(super) async fn drain(
    tasks: &mut JoinSet<()>,
    until: impl Future<Output = ()>,
    grace: Duration,
) {
    tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => {}
        _ = async { until.await; tokio::time::sleep(grace).await } => {
            tracing::warn!(grace = ?grace, "Runnables did not stop in time; abandoning them");
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_past_its_fence_answers_as_if_none_were_known() {
        use discovery::Leader;
        let at = || Leader::At("http://10.0.0.2:8090".into());
        for (view, holds, want) in [
            (Leader::Me, true, Leader::Me),
            (Leader::Me, false, Leader::Unknown),
            (at(), false, at()),
            (Leader::Unverified, false, Leader::Unverified),
            (Leader::Unknown, true, Leader::Unknown),
        ] {
            assert_eq!(fenced(view.clone(), holds), want, "{view:?} {holds}");
        }
    }
    use crate::api::{ProxySpec, ProxyStatus};
    use crate::replica::internal::seal_url;

    fn key(b: u8) -> LeaseKey {
        LeaseKey::from_bytes(&[b; crate::lease::signed::KEY_LEN]).unwrap()
    }

    /// The term the tests' Lease is in.
    const TERM: (&str, i32) = ("b_1", 3);

    /// Another replica's Lease in `term`, publishing `pairs`.
    fn other(pairs: &[(&str, &str)], (holder, transitions): (&str, i32)) -> Observed {
        Observed::Other(crate::leader::Published {
            annotations: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            term: crate::leader::Term {
                holder: holder.into(),
                transitions,
            },
        })
    }

    #[test]
    fn a_gateway_trusts_the_url_its_own_key_sealed_only() {
        let url = "http://10.0.0.7:8090";
        let (lease, gateway) = (key(1), key(3));
        let published = other(
            &[
                (DISCOVERY_URL_ANNOTATION, url),
                (URL_SEAL_ANNOTATION, &seal_url(&lease, url, TERM)),
                (GATEWAY_URL_SEAL_ANNOTATION, &seal_url(&gateway, url, TERM)),
            ],
            TERM,
        );
        let at = discovery::Leader::At(url.into());
        assert_eq!(
            leader_of(&published, (&gateway, GATEWAY_URL_SEAL_ANNOTATION)),
            at
        );
        assert_eq!(leader_of(&published, (&lease, URL_SEAL_ANNOTATION)), at);
        // The lease key's seal is no gateway's, and the reverse.
        let unverified = discovery::Leader::Unverified;
        assert_eq!(
            leader_of(&published, (&gateway, URL_SEAL_ANNOTATION)),
            unverified
        );
        assert_eq!(
            leader_of(&published, (&lease, GATEWAY_URL_SEAL_ANNOTATION)),
            unverified
        );
    }

    #[test]
    fn lease_calls_go_where_the_election_says() {
        struct Case {
            name: &'static str,
            observed: Observed,
            want: discovery::Leader,
        }
        let published = |pairs: &[(&str, &str)]| other(pairs, TERM);
        let cases = [
            Case {
                name: "this replica leads",
                observed: Observed::Me,
                want: discovery::Leader::Me,
            },
            Case {
                name: "another leads and publishes its URL, sealed",
                observed: published(&[
                    (DISCOVERY_URL_ANNOTATION, "http://10.0.0.7:8090"),
                    (
                        URL_SEAL_ANNOTATION,
                        &seal_url(&key(1), "http://10.0.0.7:8090", TERM),
                    ),
                    ("other", "x"),
                ]),
                want: discovery::Leader::At("http://10.0.0.7:8090".into()),
            },
            Case {
                name: "a URL without a seal: forged, or an older version",
                observed: published(&[(DISCOVERY_URL_ANNOTATION, "http://10.6.6.6:8090")]),
                want: discovery::Leader::Unverified,
            },
            Case {
                name: "another URL under a genuine seal",
                observed: published(&[
                    (DISCOVERY_URL_ANNOTATION, "http://10.6.6.6:8090"),
                    (
                        URL_SEAL_ANNOTATION,
                        &seal_url(&key(1), "http://10.0.0.7:8090", TERM),
                    ),
                ]),
                want: discovery::Leader::Unverified,
            },
            Case {
                name: "a seal of an earlier term, replayed",
                observed: other(
                    &[
                        (DISCOVERY_URL_ANNOTATION, "http://10.0.0.7:8090"),
                        (
                            URL_SEAL_ANNOTATION,
                            &seal_url(&key(1), "http://10.0.0.7:8090", ("b_1", 2)),
                        ),
                    ],
                    TERM,
                ),
                want: discovery::Leader::Unverified,
            },
            Case {
                name: "sealed by another installation",
                observed: published(&[
                    (DISCOVERY_URL_ANNOTATION, "http://10.0.0.7:8090"),
                    (
                        URL_SEAL_ANNOTATION,
                        &seal_url(&key(2), "http://10.0.0.7:8090", TERM),
                    ),
                ]),
                want: discovery::Leader::Unverified,
            },
            Case {
                name: "another leads but publishes no URL (an older version)",
                observed: published(&[("other", "x")]),
                want: discovery::Leader::Unknown,
            },
            Case {
                name: "no live holder",
                observed: Observed::Nobody,
                want: discovery::Leader::Unknown,
            },
        ];
        for c in cases {
            let got = leader_of(&c.observed, (&key(1), URL_SEAL_ANNOTATION));
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn every_phase_is_counted_per_provider_zero_included() {
        let with = |provider: Option<&str>, phase: Option<ProxyPhase>| {
            let mut p = Proxy::new(
                "p",
                ProxySpec {
                    provider: provider.map(String::from),
                    ..Default::default()
                },
            );
            p.status = Some(ProxyStatus {
                phase,
                ..Default::default()
            });
            Arc::new(p)
        };
        let proxies = vec![
            with(Some("gcp-eu"), Some(ProxyPhase::Ready)),
            with(Some("gcp-eu"), Some(ProxyPhase::Ready)),
            with(Some("gcp-eu"), None),
            with(Some("kvm-home"), Some(ProxyPhase::Failed)),
            with(None, Some(ProxyPhase::Ready)),
        ];
        let configured = ["gcp-eu", "k8s"].map(String::from);
        let got = phase_counts(&proxies, &configured);
        let want = [
            ("gcp-eu", [0, 0, 2, 0]),
            ("k8s", [0, 0, 0, 0]),
            ("kvm-home", [0, 0, 0, 1]),
            ("", [0, 0, 1, 0]),
        ]
        .into_iter()
        .flat_map(|(provider, n)| {
            ["Provisioning", "Running", "Ready", "Failed"]
                .into_iter()
                .zip(n)
                .map(move |(ph, n)| (ph.to_string(), provider.to_string(), n))
        })
        .collect::<Vec<_>>();
        assert_eq!(got, want);
        assert!(phase_counts(&[], &[]).is_empty());
    }
}
