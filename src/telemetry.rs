//! Log setup: structured `tracing` output as text or JSON.

use tracing_subscriber::{fmt, EnvFilter};

use crate::cli::LogFormat;

/// Installs the global subscriber. A bad filter falls back to `info` and
/// says so, rather than starting without logs.
pub fn init_logs(filter: &str, format: LogFormat) {
    let (env_filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e.to_string())),
    };
    let builder = fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    // try_init: a second init (tests) is not an error worth dying for.
    let _ = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    if let Some(e) = bad {
        tracing::warn!(filter, error = %e, "Invalid --log-level; using info");
    }
}
