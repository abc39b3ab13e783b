//! Log setup (text or JSON) and tracing export (operator.md §7): spans go
//! to an OpenTelemetry exporter only when the standard `OTEL_*` variables
//! ask for one; otherwise no tracer is installed and log lines are exactly
//! what they are without tracing. Inside an exported span every log line
//! carries `traceID` and `spanID`.

use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{dynamic_filter_fn, EnvFilter};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields};
use tracing_subscriber::fmt::{self as tfmt, FmtContext};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::api::constants::OPERATOR_NAME;
use crate::cli::LogFormat;

/// Spans queued for export at most (the SDK default 2048 is oversized for
/// a 128Mi pod).
pub const MAX_QUEUE: usize = 512;
/// How long the shutdown flush may take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where spans go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exporter {
    /// Tracing off, with why.
    Off(&'static str),
    /// OTLP over HTTP with protobuf bodies (port 4318).
    OtlpHttp,
    /// OTLP over gRPC (port 4317).
    OtlpGrpc,
    /// Spans printed to stdout as JSON lines (local development).
    Console,
}

impl Exporter {
    /// The name logged in `tracing enabled`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Exporter::Off(_) => "none",
            Exporter::OtlpHttp => "otlp/http",
            Exporter::OtlpGrpc => "otlp/grpc",
            Exporter::Console => "console",
        }
    }
}

/// Decides the exporter from the environment (`get` reads a variable).
pub fn decide(get: impl Fn(&str) -> Option<String>) -> Result<Exporter, String> {
    let var = |k: &str| get(k).map(|v| v.trim().to_string()).unwrap_or_default();
    if var("OTEL_SDK_DISABLED").eq_ignore_ascii_case("true") {
        return Ok(Exporter::Off("OTEL_SDK_DISABLED=true"));
    }
    let exporter = var("OTEL_TRACES_EXPORTER").to_ascii_lowercase();
    let endpoint = !var("OTEL_EXPORTER_OTLP_ENDPOINT").is_empty()
        || !var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_empty();
    match exporter.as_str() {
        "none" => Ok(Exporter::Off("OTEL_TRACES_EXPORTER=none")),
        "" if !endpoint => Ok(Exporter::Off(
            "no OTEL_TRACES_EXPORTER or OTLP endpoint configured",
        )),
        "" | "otlp" => {
            let mut protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
            if protocol.is_empty() {
                protocol = var("OTEL_EXPORTER_OTLP_PROTOCOL");
            }
            match protocol.as_str() {
                "" | "http/protobuf" => Ok(Exporter::OtlpHttp),
                "grpc" => Ok(Exporter::OtlpGrpc),
                other => Err(format!(
                    "unsupported OTLP protocol {other:?} (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL): use grpc or http/protobuf"
                )),
            }
        }
        "console" => Ok(Exporter::Console),
        other => Err(format!("unsupported OTEL_TRACES_EXPORTER {other:?}")),
    }
}

/// Keeps the tracer provider for the shutdown flush.
#[derive(Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the exporter (bounded by [`FLUSH_TIMEOUT`]).
    pub fn shutdown(self) {
        let Some(p) = self.provider else { return };
        // The exporter's blocking HTTP client must not run on a runtime
        // thread; the flush runs on a plain thread.
        let done = std::thread::spawn(move || p.shutdown_with_timeout(FLUSH_TIMEOUT)).join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "Failed to flush traces on shutdown"),
            Err(_) => tracing::error!("Failed to flush traces on shutdown"),
        }
    }
}

/// Installs the global subscriber without tracing export. A bad filter
/// falls back to `info` and says so, rather than starting without logs.
pub fn init_logs(filter: &str, format: LogFormat) {
    let _ = init_with(filter, format, Exporter::Off("logs only"));
}

/// Installs logs and, when the environment asks for it, tracing export.
/// An error is a tracing setup problem (the caller exits 1).
pub fn init(filter: &str, format: LogFormat) -> Result<Telemetry, String> {
    let exporter = decide(|k| std::env::var(k).ok())?;
    init_with(filter, format, exporter)
}

fn env_filter(filter: &str) -> (EnvFilter, Option<String>) {
    match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e.to_string())),
    }
}

fn build_provider(exporter: &Exporter) -> Result<SdkTracerProvider, String> {
    let mut resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(OPERATOR_NAME)
        .with_attribute(KeyValue::new(
            "service.version",
            concat!(env!("CARGO_PKG_VERSION"), "+", env!("EPO_COMMIT")),
        ))
        .with_detectors(&[Box::new(
            opentelemetry_sdk::resource::EnvResourceDetector::new(),
        )]);
    if let Ok(name) = std::env::var("OTEL_SERVICE_NAME") {
        if !name.trim().is_empty() {
            resource = resource.with_service_name(name.trim().to_string());
        }
    }
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(MAX_QUEUE)
        .build();
    let builder = SdkTracerProvider::builder().with_resource(resource.build());
    let builder = match exporter {
        Exporter::OtlpHttp => {
            // Built on a plain thread: the blocking HTTP client refuses to
            // be created inside the async runtime.
            crate::tls::install_ring();
            let exp = std::thread::spawn(|| {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .build()
                    .map_err(|e| e.to_string())
            })
            .join()
            .map_err(|_| "building the OTLP exporter panicked".to_string())??;
            builder.with_span_processor(
                BatchSpanProcessor::builder(exp)
                    .with_batch_config(batch)
                    .build(),
            )
        }
        Exporter::OtlpGrpc => {
            // tonic's channel connects lazily, on the runtime this runs
            // in (main's): an unreachable collector fails each export in
            // the batch processor's thread (the batch is dropped), never
            // the operator.
            let exp = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
                .map_err(|e| e.to_string())?;
            builder.with_span_processor(
                BatchSpanProcessor::builder(exp)
                    .with_batch_config(batch)
                    .build(),
            )
        }
        Exporter::Console => builder.with_span_processor(
            BatchSpanProcessor::builder(ConsoleExporter)
                .with_batch_config(batch)
                .build(),
        ),
        Exporter::Off(_) => return Err("tracing is off".into()),
    };
    Ok(builder.build())
}

/// The operator's own spans at info and above are exported.
fn is_operator_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span()
        && meta.target().starts_with("egress_proxies_operator")
        && *meta.level() <= tracing::Level::INFO
}

fn init_with(filter: &str, format: LogFormat, exporter: Exporter) -> Result<Telemetry, String> {
    let (env_filter, bad) = env_filter(filter);
    let provider = match &exporter {
        Exporter::Off(_) => None,
        e => Some(build_provider(e)?),
    };
    let fmt_layer = match format {
        LogFormat::Text => tfmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .event_format(TraceIds {
                inner: format::Format::default().with_target(false),
                enabled: provider.is_some(),
            })
            .boxed(),
        LogFormat::Json => tfmt::layer()
            .with_writer(std::io::stderr)
            .event_format(TraceIds {
                inner: format::Format::default()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
                enabled: provider.is_some(),
            })
            .fmt_fields(format::JsonFields::new())
            .boxed(),
    };
    let otel_layer = provider.as_ref().map(|p| {
        let tracer = p.tracer(OPERATOR_NAME);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_level(false)
            .with_target(false)
            .with_threads(false)
            .with_location(false)
            .with_filter(
                dynamic_filter_fn(|meta, cx| {
                    // The Kubernetes client's request spans only as
                    // children: watches and other background requests
                    // create nothing.
                    if meta.target().starts_with("kube_client") {
                        return meta.is_span()
                            && meta.name() == "HTTP"
                            && cx.lookup_current().is_some();
                    }
                    is_operator_span(meta)
                })
                // Callsites that can never pass are ruled out once (when no
                // other layer wants them either).
                .with_callsite_filter(|meta| {
                    let candidate = meta.is_span()
                        && if meta.target().starts_with("kube_client") {
                            meta.name() == "HTTP"
                        } else {
                            is_operator_span(meta)
                        };
                    if candidate {
                        tracing::subscriber::Interest::sometimes()
                    } else {
                        tracing::subscriber::Interest::never()
                    }
                })
                .with_max_level_hint(tracing::level_filters::LevelFilter::DEBUG),
            )
    });
    let dispatch: tracing::Dispatch = tracing_subscriber::registry()
        .with(fmt_layer.with_filter(env_filter))
        .with(otel_layer)
        .into();
    // A second init (tests) is not an error worth dying for.
    if tracing::dispatcher::set_global_default(dispatch.clone()).is_ok() {
        let _ = DISPATCH.set(dispatch.downgrade());
    }
    if let Some(e) = bad {
        tracing::warn!(filter, error = %e, "Invalid log filter (--log-level, LOG_LEVEL or RUST_LOG); using info");
    }
    match &exporter {
        Exporter::Off(reason) => {
            if *reason != "logs only" {
                tracing::info!(reason, "tracing disabled");
            }
        }
        e => {
            opentelemetry::global::set_text_map_propagator(
                opentelemetry::propagation::TextMapCompositePropagator::new(vec![
                    Box::new(opentelemetry_sdk::propagation::TraceContextPropagator::new()),
                    Box::new(opentelemetry_sdk::propagation::BaggagePropagator::new()),
                ]),
            );
            tracing::info!(
                exporter = e.as_str(),
                service = OPERATOR_NAME,
                "tracing enabled"
            );
        }
    }
    Ok(Telemetry { provider })
}

/// The installed dispatcher, for reading span contexts while formatting
/// (inside a dispatch the thread's default dispatcher is not available).
static DISPATCH: std::sync::OnceLock<tracing::dispatcher::WeakDispatch> =
    std::sync::OnceLock::new();

/// Adds `traceID` and `spanID` of the innermost exported span to a line
/// formatted by `inner`: as keys after `{` for JSON, appended for text.
struct TraceIds<F> {
    inner: F,
    enabled: bool,
}

impl<S, N, F> FormatEvent<S, N> for TraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let ids = if self.enabled { trace_ids(ctx) } else { None };
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, format::Writer::new(&mut line), event)?;
        if let Some(rest) = line.strip_prefix('{') {
            write!(
                writer,
                "{{\"traceID\":\"{trace_id}\",\"spanID\":\"{span_id}\",{rest}"
            )
        } else {
            let body = line.trim_end_matches('\n');
            writeln!(writer, "{body} traceID={trace_id} spanID={span_id}")
        }
    }
}

fn trace_ids<S, N>(ctx: &FmtContext<'_, S, N>) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let scope = ctx.event_scope()?;
    let dispatch = DISPATCH.get()?.upgrade()?;
    for span in scope {
        let Some(cx) = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch) else {
            continue;
        };
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            return Some((sc.trace_id().to_string(), sc.span_id().to_string()));
        }
    }
    None
}

/// Prints finished spans to stdout, one JSON object per line.
#[derive(Debug)]
struct ConsoleExporter;

impl opentelemetry_sdk::trace::SpanExporter for ConsoleExporter {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        for s in batch {
            let attrs: serde_json::Map<String, serde_json::Value> = s
                .attributes
                .iter()
                .map(|kv| (kv.key.to_string(), kv.value.to_string().into()))
                .collect();
            let line = serde_json::json!({
                "name": s.name,
                "traceID": s.span_context.trace_id().to_string(),
                "spanID": s.span_context.span_id().to_string(),
                "parentSpanID": s.parent_span_id.to_string(),
                "kind": format!("{:?}", s.span_kind),
                "status": format!("{:?}", s.status),
                "attributes": attrs,
            });
            let _ = writeln!(out, "{line}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn exporter_decision_table() {
        struct Case {
            name: &'static str,
            env: &'static [(&'static str, &'static str)],
            want: Result<Exporter, ()>,
        }
        let cases = [
            Case {
                name: "nothing configured",
                env: &[],
                want: Ok(Exporter::Off(
                    "no OTEL_TRACES_EXPORTER or OTLP endpoint configured",
                )),
            },
            Case {
                name: "sdk disabled, trimmed and in any letter case, wins over an exporter",
                env: &[
                    ("OTEL_SDK_DISABLED", " TRUE "),
                    ("OTEL_TRACES_EXPORTER", "console"),
                ],
                want: Ok(Exporter::Off("OTEL_SDK_DISABLED=true")),
            },
            Case {
                name: "exporter none, in any letter case",
                env: &[("OTEL_TRACES_EXPORTER", "None")],
                want: Ok(Exporter::Off("OTEL_TRACES_EXPORTER=none")),
            },
            Case {
                name: "an otlp endpoint turns otlp on",
                env: &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")],
                want: Ok(Exporter::OtlpHttp),
            },
            Case {
                name: "a traces endpoint turns otlp on",
                env: &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://x/v1/traces")],
                want: Ok(Exporter::OtlpHttp),
            },
            Case {
                name: "otlp exporter",
                env: &[("OTEL_TRACES_EXPORTER", "otlp")],
                want: Ok(Exporter::OtlpHttp),
            },
            Case {
                name: "otlp over http/protobuf",
                env: &[
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ],
                want: Ok(Exporter::OtlpHttp),
            },
            Case {
                name: "otlp over grpc",
                env: &[
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                want: Ok(Exporter::OtlpGrpc),
            },
            Case {
                name: "an endpoint and grpc, trimmed",
                env: &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", " grpc "),
                ],
                want: Ok(Exporter::OtlpGrpc),
            },
            Case {
                name: "the traces protocol wins over the general one",
                env: &[
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                ],
                want: Ok(Exporter::OtlpGrpc),
            },
            Case {
                name: "the traces protocol wins the other way too",
                env: &[
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ],
                want: Ok(Exporter::OtlpHttp),
            },
            Case {
                name: "http/json is not supported",
                env: &[
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                ],
                want: Err(()),
            },
            Case {
                name: "console exporter",
                env: &[("OTEL_TRACES_EXPORTER", "console")],
                want: Ok(Exporter::Console),
            },
            Case {
                name: "unknown exporter",
                env: &[("OTEL_TRACES_EXPORTER", "zipkin")],
                want: Err(()),
            },
        ];
        for c in cases {
            let env: HashMap<String, String> = c
                .env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let got = decide(|k| env.get(k).cloned()).map_err(|_| ());
            assert_eq!(got, c.want, "{}: {env:?}", c.name);
        }
    }
}
