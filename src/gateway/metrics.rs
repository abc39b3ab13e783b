//! The gateway's series. Labels stay bounded: clients are the named
//! tokens, pools only those a routed request named (a pool that matched
//! proxies exists), results and error classes are fixed words.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::metrics::Registrar;

/// Labels of a gateway request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The token's name (`none` when no token was accepted).
    pub client: String,
    /// `connect` (a tunnel) or `http` (an absolute-form request).
    pub kind: &'static str,
    /// The pool the username named, once the request was routed
    /// (otherwise empty).
    pub pool: String,
    /// `ok`, `unauthenticated`, `bad_request`, `client_limit`,
    /// `no_upstream`, `upstream_failed` or `target_failed` (the upstream
    /// said the target failed: relayed).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

/// The gateway's series.
#[derive(Clone, Debug)]
pub struct GatewayMetrics {
    requests: Family<RequestLabels, Counter>,
    setup: Histogram,
    upstream_errors: Family<ClassLabel, Counter>,
    refused: Family<ReasonLabel, Counter>,
    tunnels_open: Gauge,
    tunnel_duration: Histogram,
    bytes: Family<DirectionLabel, Counter>,
    session_moves: Counter,
    sessions: Gauge,
}

impl GatewayMetrics {
    /// The series, registered in `registry`.
    pub fn register(registry: &mut Registrar) -> Self {
        let m = GatewayMetrics {
            requests: Family::default(),
            // 100us .. ~3s: a CONNECT through an upstream on the same
            // network takes a few milliseconds.
            setup: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            upstream_errors: Family::default(),
            refused: Family::default(),
            tunnels_open: Gauge::default(),
            // 10 ms .. ~11.7 h.
            tunnel_duration: Histogram::new(exponential_buckets(0.01, 4.0, 12)),
            bytes: Family::default(),
            session_moves: Counter::default(),
            sessions: Gauge::default(),
        };
        registry.register(
            "proxy_operator_gateway_requests",
            "Gateway requests (CONNECTs and absolute-form requests) by client, kind, pool and result",
            m.requests.clone(),
        );
        registry.register(
            "proxy_operator_gateway_setup_seconds",
            "Time from a gateway request to its upstream being ready (tunnel granted or connection open)",
            m.setup.clone(),
        );
        registry.register(
            "proxy_operator_gateway_upstream_errors",
            "Upstream failures seen by the gateway, by class (connect, timeout, refused, protocol, credentials)",
            m.upstream_errors.clone(),
        );
        registry.register(
            "proxy_operator_gateway_connections_refused",
            "Gateway connections closed unread, by reason (gateway_full, address_full, failed_sign_ins, sign_in_wait)",
            m.refused.clone(),
        );
        registry.register(
            "proxy_operator_gateway_tunnels_open",
            "Gateway tunnels open now",
            m.tunnels_open.clone(),
        );
        registry.register(
            "proxy_operator_gateway_tunnel_duration_seconds",
            "How long gateway tunnels stayed open",
            m.tunnel_duration.clone(),
        );
        registry.register(
            "proxy_operator_gateway_tunnel_bytes",
            "Bytes relayed through gateway tunnels, by direction (up: client to target, down: target to client)",
            m.bytes.clone(),
        );
        registry.register(
            "proxy_operator_gateway_session_moves",
            "Gateway sessions moved to another upstream because theirs was no longer usable",
            m.session_moves.clone(),
        );
        registry.register(
            "proxy_operator_gateway_sessions",
            "Gateway sessions this replica remembers",
            m.sessions.clone(),
        );
        m
    }

    /// One request's outcome.
    pub fn request(&self, labels: RequestLabels) {
        self.requests.get_or_create(&labels).inc();
    }

    /// An upstream became ready after `took`.
    pub fn set_up(&self, took: Duration) {
        self.setup.observe(took.as_secs_f64());
    }

    /// An upstream failed, as `class`.
    pub fn upstream_error(&self, class: &'static str) {
        self.upstream_errors
            .get_or_create(&ClassLabel { class })
            .inc();
    }

    /// A connection was closed unread, for `reason`.
    pub fn connection_refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// A tunnel opened.
    pub fn tunnel_opened(&self) {
        self.tunnels_open.inc();
    }

    /// A tunnel closed after `took`, having moved `up` and `down` bytes.
    pub fn tunnel_closed(&self, took: Duration, up: u64, down: u64) {
        self.tunnels_open.dec();
        self.tunnel_duration.observe(took.as_secs_f64());
        for (direction, n) in [("up", up), ("down", down)] {
            self.bytes
                .get_or_create(&DirectionLabel { direction })
                .inc_by(n);
        }
    }

    /// A session moved.
    pub fn session_moved(&self) {
        self.session_moves.inc();
    }

    /// Sessions remembered now.
    pub fn set_sessions(&self, n: usize) {
        self.sessions.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
/// The metrics' result of an answer: its failure's, as [`answer`] or the
/// relay marked it; an unmarked answer is the target's own, relayed.
pub(super) fn result_of<B>(r: &http::Response<B>) -> &'static str {
    let Some(whose) = r.extensions().get::<super::blame::Failure>() else {
        return "ok";
    };
    match (whose, r.status()) {
        (super::blame::Failure::Target, _) => "target_failed",
        (_, http::StatusCode::BAD_REQUEST) => "bad_request",
        (_, http::StatusCode::PROXY_AUTHENTICATION_REQUIRED) => "unauthenticated",
        (_, http::StatusCode::TOO_MANY_REQUESTS) => "client_limit",
        (_, http::StatusCode::SERVICE_UNAVAILABLE) => "no_upstream",
        _ => "upstream_failed",
    }
}
