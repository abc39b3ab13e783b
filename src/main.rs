//! Composition root: flags, logs, config, client, providers, runnables.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{error, info, warn};

use egress_proxies_operator::api::constants::LEADER_ELECTION_ID;
use egress_proxies_operator::cli::{self, Flags};
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::controller::{self, Context};
use egress_proxies_operator::gc::{self, Gc};
use egress_proxies_operator::metrics::Metrics;
use egress_proxies_operator::provider::error::plain_message;
use egress_proxies_operator::provider::naming::derive_installation_id;
use egress_proxies_operator::provider::registry::{self, ProviderType, Registry};
use egress_proxies_operator::{health, http, leader, runnables, telemetry};

/// How long runnables get to finish after SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    if flags.check_config {
        return check_config(&flags);
    }
    // --- tracing (issue 8): logs, plus OTLP/console export when OTEL_* asks ---
    let telemetry = match telemetry::init(&flags.log_level, flags.log_format) {
        Ok(t) => t,
        Err(e) => {
            telemetry::init_logs(&flags.log_level, flags.log_format);
            error!(error = %e, "Failed to set up tracing");
            return ExitCode::FAILURE;
        }
    };
    // --- end tracing ---
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

    let kube_config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %plain_message(&e), "Cannot build a Kubernetes client (in-cluster config or KUBECONFIG)");
            return ExitCode::FAILURE;
        }
    };
    let api_url = kube_config.cluster_url.to_string();
    let client = match Client::try_from(kube_config) {
        Ok(c) => c,
        Err(e) => {
            error!(error = %plain_message(&e), "Cannot build a Kubernetes client (in-cluster config or KUBECONFIG)");
            return ExitCode::FAILURE;
        }
    };
    let deps = registry::Deps {
        client: client.clone(),
        api_url,
        gcp_wire_log_full_payloads: flags.gcp_wire_log_full_payloads,
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
                error!(error = %plain_message(&e), "Cannot read the kube-system namespace to derive the installation id; pass --installation-id");
                return ExitCode::FAILURE;
            }
        },
    };
    info!(installationID = %installation_id, "Installation identity");
    // One Proxy cache on every replica feeds the phase gauge, the discovery
    // API and (on the leader) the health engine.
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
    runnables::count_phases(&metrics, proxy_cache.clone());
    if let Ok(Some(addr)) = cli::parse_bind(&flags.discovery_bind_address) {
        runnables::spawn_discovery(
            &mut tasks,
            addr,
            &flags,
            proxy_cache.clone(),
            &metrics,
            stopped(),
        );
    }
    // Everything below is leader-only: with --leader-elect, wait for the
    // Lease; a replica that loses it exits, so leader-only work never runs
    // on two replicas at once.
    let mut held_lease = None;
    if flags.leader_elect {
        let identity = leader_identity();
        let timing = leader::Timing {
            lease_duration: flags.leader_election_lease_duration,
            renew_deadline: flags.leader_election_renew_deadline,
            retry_period: flags.leader_election_retry_period,
        };
        let campaign = leader::campaign(
            client.clone(),
            &flags.operator_namespace,
            LEADER_ELECTION_ID,
            identity.clone(),
            timing,
        );
        let mut leading = campaign.leading.clone();
        info!(identity = %identity, lease = LEADER_ELECTION_ID, namespace = %flags.operator_namespace, "Waiting to become the leader");
        let stop = stopped();
        tokio::select! {
            won = leading.wait_for(|l| *l) => {
                if won.is_err() {
                    error!("Leader election stopped before winning");
                    return ExitCode::FAILURE;
                }
            }
            _ = stop => {
                telemetry.shutdown();
                return ExitCode::SUCCESS;
            }
        }
        tokio::spawn(async move {
            // An error means the campaign was stopped for shutdown.
            if leading.wait_for(|l| !*l).await.is_ok() {
                error!("Lost leadership; exiting so that leader-only work never runs twice");
                std::process::exit(1);
            }
        });
        held_lease = Some((campaign, identity));
    }

    let watch_pods = config
        .providers
        .iter()
        .any(|p| p.provider_type == ProviderType::Kubernetes);
    let gc = Gc::new(
        client.clone(),
        providers.clone(),
        gc::Settings {
            interval: flags.gc_interval,
            min_age: flags.gc_min_age,
            max_deletes: flags.gc_max_deletes_per_sweep,
            installation_id: installation_id.clone(),
        },
        metrics.gc.clone(),
    );
    let stop = stopped();
    tasks.spawn(async move { gc.run(stop).await });
    runnables::spawn_provider_health(&mut tasks, &flags, &client, &providers, &metrics, &stopped)
        .await;
    let (engine, health_events) = match runnables::spawn_health_engine(
        &mut tasks,
        &flags,
        proxy_cache,
        &metrics,
        stopped(),
    ) {
        Ok(h) => h,
        Err(e) => {
            error!(error = %e, "Failed to add health engine");
            return ExitCode::FAILURE;
        }
    };
    let health_source: Arc<dyn controller::HealthSource> = engine;
    let client_for_release = client.clone();
    let ctx = Arc::new(
        Context::new(client, providers, installation_id, Some(health_source))
            .with_metrics(metrics.reconcile.clone()),
    );
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
    // Leader-only work has stopped: hand the Lease over now rather than
    // make the next leader wait out its duration.
    if let Some((campaign, identity)) = held_lease {
        campaign.stop().await;
        let release = leader::release(
            client_for_release,
            &flags.operator_namespace,
            LEADER_ELECTION_ID,
            &identity,
        );
        match tokio::time::timeout(std::time::Duration::from_secs(2), release).await {
            Ok(Ok(true)) => info!(lease = LEADER_ELECTION_ID, "Released the leader lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                warn!(error = %plain_message(&e), "Could not release the leader lease; it expires by itself")
            }
            Err(_) => warn!("Releasing the leader lease timed out; it expires by itself"),
        }
    }
    telemetry.shutdown();
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

/// A unique candidate name: the Pod name (HOSTNAME in a Pod) and the pid.
fn leader_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "egress-proxies-operator".to_string());
    format!("{host}_{}", std::process::id())
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
