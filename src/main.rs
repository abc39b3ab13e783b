//! Composition root: flags, logs, config, then the runnables; nothing else.

use std::process::ExitCode;

use clap::Parser;
use tracing::{error, info};

use egress_proxies_operator::cli::{self, Flags};
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::telemetry;

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    if flags.check_config {
        return check_config(&flags);
    }
    telemetry::init_logs(&flags.log_level, flags.log_format);
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

    // The runnables (reconciler, health engine, discovery, GC, provider
    // health monitor) are added here as they land; until then the process
    // only holds its validated configuration until asked to stop.
    shutdown_signal().await;
    info!("Shutting down");
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
    #[cfg(unix)]
    {
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
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
