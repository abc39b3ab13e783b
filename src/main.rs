//! Composition root: flags, logs, config, client, providers, runnables.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{error, info, warn};

use egress_proxies_operator::cli::{self, Flags};
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::controller::{self, Context};
use egress_proxies_operator::lease::{LeaseConfig, LeaseStore};
use egress_proxies_operator::metrics::Metrics;
use egress_proxies_operator::provider::naming::derive_installation_id;
use egress_proxies_operator::provider::registry::{self, ProviderType, Registry};
use egress_proxies_operator::{discovery, health, http, telemetry};

/// How long runnables get to finish after SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    if flags.check_config {
        return check_config(&flags);
    }
    telemetry::init_logs(&flags.log_level, flags.log_format);
    // Two TLS backends are linked (ring via kube, aws-lc-rs via the Google
    // client); rustls refuses to guess, so pick one for the whole process.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        warn!("A TLS crypto provider was already installed");
    }
    info!(
        version = env!("CARGO_PKG_VERSION"),
        "Starting egress-proxies-operator"
    );

    let Some(path) = flags.providers_config.clone() else {
        error!("--providers-config is required");
        return ExitCode::FAILURE;
    };
    if let Err(e) =
        cli::validate_check_flags(flags.provider_check_interval, flags.provider_check_timeout)
    {
        error!(error = %e, "Invalid provider check flags");
        return ExitCode::FAILURE;
    }
    if let Err(problems) = flags.validate() {
        for p in problems {
            error!(problem = %p, "Invalid flags");
        }
        return ExitCode::FAILURE;
    }
    let config = match ProvidersConfig::load(&path) {
        Ok(c) => c,
        Err(e) => {
            error!(path = %path.display(), error = %e, "Failed to load providers config");
            return ExitCode::FAILURE;
        }
    };
    info!(providers = ?config.names(), "Loaded providers config");

    // Stop signal shared by every runnable.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("Shutting down");
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let metrics = Metrics::new();
    let mut tasks = tokio::task::JoinSet::new();
    if let Ok(Some(addr)) = cli::parse_bind(&flags.health_probe_bind_address) {
        let stop = stopped();
        tasks.spawn(async move {
            if let Err(e) = http::serve_probes(addr, stop).await {
                error!(%addr, error = %e, "Probe server failed");
            }
        });
    }
    if let Ok(Some(addr)) = cli::parse_bind(&flags.metrics_bind_address) {
        let (m, stop) = (metrics.clone(), stopped());
        tasks.spawn(async move {
            if let Err(e) = http::serve_metrics(addr, m, stop).await {
                error!(%addr, error = %e, "Metrics server failed");
            }
        });
    }

    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "Cannot build a Kubernetes client (in-cluster config or KUBECONFIG)");
            return ExitCode::FAILURE;
        }
    };
    let deps = registry::Deps {
        client: client.clone(),
    };
    let providers = match Registry::build(&config, &metrics.provider, |e| {
        registry::construct(e, &deps)
    }) {
        Ok(r) => r,
        Err(e) => {
            error!(error = %e, "Failed to build providers");
            return ExitCode::FAILURE;
        }
    };
    let installation_id = match &flags.installation_id {
        Some(id) => id.clone(),
        None => match Api::<Namespace>::all(client.clone())
            .get("kube-system")
            .await
        {
            Ok(ns) => derive_installation_id(
                &ns.metadata.uid.unwrap_or_default(),
                &flags.operator_namespace,
            ),
            Err(e) => {
                error!(error = %e, "Cannot read the kube-system namespace to derive the installation id; pass --installation-id");
                return ExitCode::FAILURE;
            }
        },
    };
    info!(installationID = %installation_id, "Installation identity");
    if flags.leader_elect {
        warn!("--leader-elect is not implemented yet: this replica acts as the leader; run a single replica");
    }

    let watch_pods = config
        .providers
        .iter()
        .any(|p| p.provider_type == ProviderType::Kubernetes);
    // --- health engine and discovery/lease API (issue 5) -----------------
    // One Proxy cache feeds both. The engine always runs for now (leader-only
    // once leader election lands); the API runs on every replica.
    let (proxy_cache, fill_cache) =
        health::proxy_cache(client.clone(), flags.proxy_namespace.as_deref());
    {
        let stop = stopped();
        tasks.spawn(async move {
            tokio::select! {
                _ = fill_cache => {}
                _ = stop => {}
            }
        });
    }
    let probe_tls = match health::probe::tls_config(flags.probe_ca_file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "Invalid --probe-ca-file");
            return ExitCode::FAILURE;
        }
    };
    let probe_url = match url::Url::parse(&flags.default_probe_url) {
        Ok(u) => u,
        Err(e) => {
            error!(error = %e, "Invalid --default-probe-url");
            return ExitCode::FAILURE;
        }
    };
    let engine = Arc::new(health::Engine::new(
        health::Defaults {
            url: probe_url,
            expected_status: flags.default_probe_expected_status,
        },
        usize::from(flags.health_workers),
        probe_tls,
        flags.trace_health_probes,
        metrics.health.clone(),
    ));
    let (notifier, health_events) = health::Notifier::channel(health::engine::NOTIFY_CAPACITY);
    {
        let (engine, cache, stop) = (engine.clone(), proxy_cache.clone(), stopped());
        tasks.spawn(async move { engine.run(cache, notifier, stop).await });
    }
    if let Ok(Some(addr)) = cli::parse_bind(&flags.discovery_bind_address) {
        let leases = Arc::new(LeaseStore::new(LeaseConfig {
            max_leases_per_proxy: flags.max_leases_per_proxy,
            default_ttl: flags.default_lease_ttl,
            max_ttl: flags.max_lease_ttl,
            cooldown: flags.lease_cooldown,
        }));
        let token = std::env::var("DISCOVERY_TOKEN").ok();
        let state = discovery::ApiState::new(
            Arc::new(proxy_cache.clone()),
            leases,
            token.as_deref(),
            metrics.discovery.clone(),
        );
        let stop = stopped();
        tasks.spawn(async move {
            if let Err(e) = discovery::serve(addr, state, stop).await {
                error!(%addr, error = %e, "Discovery API failed");
            }
        });
    }
    let health_source: Arc<dyn controller::HealthSource> = engine;
    // --- end of health engine and discovery/lease API ---------------------

    let ctx = Arc::new(Context::new(
        client,
        providers,
        installation_id,
        Some(health_source),
    ));
    let ns = flags.proxy_namespace.clone();
    let concurrency = flags.max_concurrent_reconciles;
    let stop = stopped();
    tasks.spawn(async move {
        let events = health::trigger_stream(health_events);
        controller::run(
            ctx,
            ns.as_deref(),
            concurrency,
            watch_pods,
            Some(events),
            stop,
        )
        .await;
    });
    // Runnables finish their in-flight work on the stop signal; one that is
    // stuck (e.g. a watch retrying an unreachable API server) is abandoned
    // after a grace period so SIGTERM always ends the process.
    let stop = stopped();
    tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => {}
        _ = async { stop.await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            warn!(grace = ?SHUTDOWN_GRACE, "Runnables did not stop in time; abandoning them");
            tasks.abort_all();
        }
    }
    ExitCode::SUCCESS
}

/// `--check-config`: validate the providers file without a cluster.
fn check_config(flags: &Flags) -> ExitCode {
    let Some(path) = &flags.providers_config else {
        eprintln!("--check-config needs --providers-config FILE");
        return ExitCode::FAILURE;
    };
    match ProvidersConfig::load(path) {
        Ok(cfg) => {
            let list: Vec<String> = cfg
                .providers
                .iter()
                .map(|p| format!("{} ({})", p.name, p.provider_type))
                .collect();
            println!(
                "{}: valid, {} provider(s){}{}",
                path.display(),
                list.len(),
                if list.is_empty() { "" } else { ": " },
                list.join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            error!(error = %e, "Cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
