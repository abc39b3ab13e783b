//! Whose failure an answer is (pure), decided here once for the CONNECT
//! and the plain-http paths alike, and told to the crawler in one header.
//!
//! The rule: an upstream that answered in HTTP is alive. What it said is
//! about the target (the site refused, did not resolve, timed out, or its
//! port is denied), unless the answer is about the upstream itself: it
//! refused the gateway's own credentials (`407`) or Squid says it cannot
//! work (shutting down, out of sockets, no route of its own). Only those,
//! and failures to reach or read the upstream at all, make the gateway
//! suspect it. A dead site is therefore relayed, never charged to the
//! fleet, and a session keeps its upstream whatever its targets do; the
//! health engine's probe stays the judge of an upstream's health.

use http::header::{HeaderName, HeaderValue};
use http::Response;

/// The header every failed answer of the gateway carries, saying whose
/// failure it is: one of [`Failure::word`].
pub const FAILURE: &str = "x-gateway-failure";

/// Whose failure an answer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The crawler's request or credentials (`400`, `407`).
    Client,
    /// The gateway's own bounds or an empty fleet (`429`, `503`).
    Gateway,
    /// The upstream proxy could not be reached or failed (`502`).
    Proxy,
    /// The target, as the upstream reported it: relayed as the upstream
    /// answered it.
    Target,
}

impl Failure {
    /// The header's value.
    pub fn word(self) -> &'static str {
        match self {
            Failure::Client => "client",
            Failure::Gateway => "gateway",
            Failure::Proxy => "proxy",
            Failure::Target => "target",
        }
    }

    /// Sets the header on `r`, and keeps the verdict in its extensions
    /// for the request's accounting.
    pub fn mark<B>(self, mut r: Response<B>) -> Response<B> {
        r.headers_mut().insert(
            HeaderName::from_static(FAILURE),
            HeaderValue::from_static(self.word()),
        );
        r.extensions_mut().insert(self);
        r
    }
}

/// Squid's error pages (`X-Squid-Error`) that speak of Squid itself, not
/// of the target: it is stopping, it has no socket or route of its own,
/// or its own helpers failed. Every other Squid error (ERR_CONNECT_FAIL,
/// ERR_DNS_FAIL, ERR_READ_TIMEOUT, ERR_ACCESS_DENIED for a denied port or
/// address, ...) is about the target.
const SQUID_OWN: [&str; 6] = [
    "ERR_SHUTTING_DOWN",
    "ERR_SOCKET_FAILURE",
    "ERR_CANNOT_FORWARD",
    "ERR_ICAP_FAILURE",
    "ERR_CACHE_ACCESS_DENIED",
    "ERR_CACHE_MGR_ACCESS_DENIED",
];

/// Whose failure an upstream's non-2xx answer is: the upstream's own
/// ([`Failure::Proxy`]) or the target's. `squid_error` is the answer's
/// `X-Squid-Error` (`ERR_CONNECT_FAIL 111`), when it has one.
pub fn of_answer(status: u16, squid_error: Option<&str>) -> Failure {
    if status == 407 {
        return Failure::Proxy;
    }
    let code = squid_error.and_then(|e| e.split_whitespace().next());
    match code {
        Some(c) if SQUID_OWN.contains(&c) => Failure::Proxy,
        _ => Failure::Target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_speaks_of_the_upstream_itself_is_the_upstreams() {
        let cases = [
            // Squid could not reach the site, or the name did not resolve.
            (503, Some("ERR_CONNECT_FAIL 111"), Failure::Target),
            (503, Some("ERR_DNS_FAIL 0"), Failure::Target),
            (504, Some("ERR_READ_TIMEOUT 0"), Failure::Target),
            (502, Some("ERR_ZERO_SIZE_OBJECT 0"), Failure::Target),
            // A port or address the upstream denies is denied on any.
            (403, Some("ERR_ACCESS_DENIED 0"), Failure::Target),
            // A proxy that is not Squid, saying the same in its own words.
            (502, None, Failure::Target),
            (503, None, Failure::Target),
            (403, None, Failure::Target),
            // The upstream refused the gateway's credentials.
            (407, None, Failure::Proxy),
            (407, Some("ERR_CACHE_ACCESS_DENIED 0"), Failure::Proxy),
            // Squid speaking of itself.
            (503, Some("ERR_SHUTTING_DOWN 0"), Failure::Proxy),
            (503, Some("ERR_SOCKET_FAILURE 24"), Failure::Proxy),
            (503, Some("ERR_CANNOT_FORWARD 0"), Failure::Proxy),
            (500, Some("ERR_ICAP_FAILURE 0"), Failure::Proxy),
        ];
        for (status, squid, want) in cases {
            assert_eq!(of_answer(status, squid), want, "{status} {squid:?}");
        }
    }

    #[test]
    fn a_marked_answer_says_whose_failure_in_its_header_and_extensions() {
        let r = Failure::Target.mark(Response::new(()));
        assert_eq!(r.headers()[FAILURE], "target");
        assert_eq!(r.extensions().get::<Failure>(), Some(&Failure::Target));
    }
}
