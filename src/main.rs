//! The binary: parse the flags, build the operator, run it, map the exit
//! code. Everything else lives in the library (`operator` wires it).

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use egress_proxies_operator::cli::{Cli, Flags};
use egress_proxies_operator::crashpoint;
use egress_proxies_operator::operator::{self, settings, Operator, Settings};
use egress_proxies_operator::telemetry;

/// jemalloc, not glibc's malloc: under the lease API's churn glibc kept
/// 35-75 MiB of freed pages above a live heap of about 95 MiB (heaptrack)
/// and the leader's peak went past the Pod's 128Mi; jemalloc's background
/// thread hands freed pages back (docs/performance.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Cli::parse().into_flags();
    if flags.check_config {
        return match settings::check_config(flags.providers_config.as_ref()) {
            Ok(verdict) => {
                println!("{verdict}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    // Before the OTLP exporter's HTTP client is built.
    egress_proxies_operator::tls::install_ring();
    // Logs, plus OTLP/console export when OTEL_* asks.
    let log_filter = flags.log_filter();
    let telemetry = match telemetry::init(&log_filter, flags.log_format) {
        Ok(t) => t,
        Err(e) => {
            telemetry::init_logs(&log_filter, flags.log_format);
            error!(error = %e, "Failed to set up tracing");
            return ExitCode::FAILURE;
        }
    };
    info!(
        version = env!("CARGO_PKG_VERSION"),
        commit = egress_proxies_operator::COMMIT,
        rust = env!("EPO_RUSTC"),
        "Starting egress-proxies-operator"
    );
    let code = run(&flags).await;
    telemetry.shutdown();
    code
}

async fn run(flags: &Flags) -> ExitCode {
    match crashpoint::arm_from_env() {
        Ok(None) => {}
        Ok(Some(t)) => {
            warn!(point = %t.point, hit = t.nth, "Test hook armed: the process aborts at this crash point")
        }
        Err(e) => {
            error!(problem = %e, "Invalid settings");
            return ExitCode::FAILURE;
        }
    }
    let settings = match Settings::from_flags(flags) {
        Ok(s) => s,
        Err(problems) => {
            for p in problems {
                error!(problem = %p, "Invalid settings");
            }
            return ExitCode::FAILURE;
        }
    };
    info!(providers = ?settings.providers.names(), "Loaded providers config");
    let operator = match Operator::build(settings).await {
        Ok(o) => o,
        Err(e) => {
            error!(error = %e, "Cannot start");
            return ExitCode::FAILURE;
        }
    };
    let stop = CancellationToken::new();
    tokio::spawn(operator::stop_on_signal(stop.clone()));
    match operator.run(stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "Cannot start");
            ExitCode::FAILURE
        }
    }
}
