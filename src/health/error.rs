//! Why a probe failed, classified once where it fails. Each variant has a
//! bounded [`ProbeError::reason`] (the `reason` label of
//! `proxy_operator_healthcheck_failures_total`) and a plain-words message
//! (its `Display`, the Healthy condition's message).

use std::io;
use std::time::Duration;

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Nothing accepts connections on the proxy's address.
    #[error("connecting to the proxy: {0}")]
    Refused(String),
    /// The proxy could not be reached otherwise (unreachable, reset, DNS).
    #[error("connecting to the proxy: {0}")]
    Connect(String),
    /// The proxy answered the `CONNECT` with a non-2xx status.
    #[error("proxy refused CONNECT with status {0}")]
    ProxyRefused(u16),
    /// The TLS handshake with the target (through the tunnel) failed.
    #[error("{0}")]
    Tls(String),
    /// The target answered, with another status than the expected one.
    #[error("{who} answered status {status}, expected {expected}")]
    Status {
        /// Who answered (`target`).
        who: &'static str,
        /// The status received.
        status: u16,
        /// The status expected.
        expected: u16,
    },
    /// The probe did not finish within its timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The connection closed before any answer.
    #[error("{0} closed the connection without answering")]
    Closed(&'static str),
    /// Reading or writing on an open connection failed.
    #[error("{0}")]
    Io(String),
    /// The answer was not HTTP/1.x (no status line, or a head too long).
    #[error("{0}")]
    Protocol(String),
    /// The probe URL cannot be probed (no host or port, another scheme).
    #[error("{0}")]
    Url(String),
    /// An External endpoint is, or resolves to, an address in
    /// `--probe-deny-cidrs`: not dialled. The message is the same whatever
    /// listens there (nothing was sent).
    #[error("spec.endpoint.host {0:?} is or resolves to an address in the operator's --probe-deny-cidrs (cloud metadata, link-local, the cluster's private ranges and the like) that --probe-allow-cidrs does not open; not dialled")]
    Denied(String),
}

impl ProbeError {
    /// Every [`ProbeError::reason`], for forgetting a proxy's series.
    pub const REASONS: [&'static str; 11] = [
        "refused",
        "connect",
        "proxy_refused",
        "tls",
        "status",
        "timeout",
        "closed",
        "io",
        "protocol",
        "url",
        "denied",
    ];

    /// The bounded class of the failure (a metric label value).
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeError::Refused(_) => "refused",
            ProbeError::Connect(_) => "connect",
            ProbeError::ProxyRefused(_) => "proxy_refused",
            ProbeError::Tls(_) => "tls",
            ProbeError::Status { .. } => "status",
            ProbeError::Timeout(_) => "timeout",
            ProbeError::Closed(_) => "closed",
            ProbeError::Io(_) => "io",
            ProbeError::Protocol(_) => "protocol",
            ProbeError::Url(_) => "url",
            ProbeError::Denied(_) => "denied",
        }
    }

    /// Connecting to the proxy failed with `e`.
    pub fn connect(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionRefused => ProbeError::Refused(e.to_string()),
            _ => ProbeError::Connect(e.to_string()),
        }
    }

    /// `what` (e.g. `sending the request`) failed with `e` on an open
    /// connection.
    pub fn io(what: &str, e: &io::Error) -> Self {
        ProbeError::Io(format!("{what}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_errors_are_classified() {
        use io::ErrorKind::*;
        let cases = [
            (ConnectionRefused, "refused"),
            (ConnectionReset, "connect"),
            (HostUnreachable, "connect"),
            (NetworkUnreachable, "connect"),
            (AddrNotAvailable, "connect"),
            (PermissionDenied, "connect"),
            (TimedOut, "connect"),
        ];
        for (kind, want) in cases {
            let e = ProbeError::connect(&io::Error::new(kind, "boom"));
            assert_eq!(e.reason(), want, "{kind:?}");
            assert_eq!(e.to_string(), "connecting to the proxy: boom", "{kind:?}");
        }
        for kind in [BrokenPipe, ConnectionReset, UnexpectedEof, TimedOut] {
            let e = ProbeError::io("sending the request", &io::Error::new(kind, "x"));
            assert_eq!(
                (e.reason(), e.to_string().as_str()),
                ("io", "sending the request: x"),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn reasons_are_bounded_and_messages_plain() {
        struct Case {
            name: &'static str,
            error: ProbeError,
            reason: &'static str,
            message: &'static str,
        }
        let cases = [
            Case {
                name: "proxy refused CONNECT",
                error: ProbeError::ProxyRefused(403),
                reason: "proxy_refused",
                message: "proxy refused CONNECT with status 403",
            },
            Case {
                name: "unexpected status",
                error: ProbeError::Status {
                    who: "target",
                    status: 500,
                    expected: 204,
                },
                reason: "status",
                message: "target answered status 500, expected 204",
            },
            Case {
                name: "timeout",
                error: ProbeError::Timeout(Duration::from_millis(500)),
                reason: "timeout",
                message: "timed out after 500ms",
            },
            Case {
                name: "closed without answering",
                error: ProbeError::Closed("proxy"),
                reason: "closed",
                message: "proxy closed the connection without answering",
            },
            Case {
                name: "tls failure",
                error: ProbeError::Tls("TLS through the tunnel: invalid peer certificate".into()),
                reason: "tls",
                message: "TLS through the tunnel: invalid peer certificate",
            },
            Case {
                name: "io failure",
                error: ProbeError::Io("sending CONNECT: broken pipe".into()),
                reason: "io",
                message: "sending CONNECT: broken pipe",
            },
            Case {
                name: "protocol violation",
                error: ProbeError::Protocol("target sent no valid HTTP status line".into()),
                reason: "protocol",
                message: "target sent no valid HTTP status line",
            },
            Case {
                name: "bad probe url",
                error: ProbeError::Url("unsupported probe URL scheme \"ftp\"".into()),
                reason: "url",
                message: "unsupported probe URL scheme \"ftp\"",
            },
            Case {
                name: "a denied destination",
                error: ProbeError::Denied("metadata.internal".into()),
                reason: "denied",
                message: "spec.endpoint.host \"metadata.internal\" is or resolves to an address in the operator's --probe-deny-cidrs (cloud metadata, link-local, the cluster's private ranges and the like) that --probe-allow-cidrs does not open; not dialled",
            },
        ];
        for c in cases {
            let e = c.error;
            assert_eq!(
                (e.reason(), e.to_string().as_str()),
                (c.reason, c.message),
                "{}",
                c.name
            );
            assert!(ProbeError::REASONS.contains(&e.reason()), "{}", c.name);
        }
    }
}
