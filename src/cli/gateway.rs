//! The gateway's flags (`--gateway-*`, flattened into the operator's),
//! and their checks (docs/gateway.md).

use std::time::Duration;

/// `--gateway-*`.
#[derive(clap::Args, Debug, Clone)]
pub struct GatewayFlags {
    /// Address of the gateway, one forward proxy (HTTP CONNECT and
    /// absolute-form requests) relaying each connection through a healthy
    /// proxy of the fleet (docs/gateway.md); "0" (the default) turns it
    /// off. It needs the discovery API on and its tokens: crawlers sign in
    /// with their client name and token.
    #[arg(long, default_value = "0", value_name = "ADDR")]
    pub gateway_bind_address: String,

    /// Connections the gateway holds open at once, tunnels included (each
    /// may hold a full request head or a busy tunnel's two buffers: 1,536
    /// fit half the gateway Pod's 256Mi at worst).
    #[arg(long, default_value_t = 1536, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub gateway_max_connections: u32,

    /// Connections (tunnels included) one source address may hold open
    /// through the gateway at once, signed in or not; 0, and any larger
    /// value, is held to half of --gateway-max-connections, so one
    /// address always leaves room for others.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub gateway_max_connections_per_address: u32,

    /// Connections one client (one token name) may hold open through the
    /// gateway at once.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub gateway_max_connections_per_client: u32,

    /// Connections the gateway sends through one upstream proxy at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub gateway_max_connections_per_upstream: u32,

    /// The most upstreams the gateway passes over at once for failing a
    /// connection (refused, timed out, or an error of the upstream
    /// itself), as a percentage of the eligible ones; at least one. Past
    /// it, a failing upstream is left to its health probe alone.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100), value_name = "PERCENT")]
    pub gateway_max_suspect_percent: u32,

    /// How long the gateway remembers a session after its last connection,
    /// when its username asks no `ttl-<minutes>`.
    #[arg(long, default_value = "30m", value_parser = super::parse_duration, value_name = "DURATION")]
    pub gateway_session_ttl: Duration,

    /// The longest `ttl-<minutes>` a gateway username may ask.
    #[arg(long, default_value = "24h", value_parser = super::parse_duration, value_name = "DURATION")]
    pub gateway_max_session_ttl: Duration,

    /// Statuses of a plain-http answer through the gateway that mean the
    /// site banned the upstream: it cools down for that site (as a lease
    /// report with the site would) and the client's next request goes
    /// elsewhere. Comma-separated; empty: none.
    #[arg(long, default_value = "403,429", value_name = "CODE,...")]
    pub gateway_ban_statuses: String,

    /// A gateway tunnel or upstream connection with no byte either way
    /// this long is closed.
    #[arg(long, default_value = "5m", value_parser = super::parse_duration, value_name = "DURATION")]
    pub gateway_idle_timeout: Duration,

    /// How long a stopping gateway (SIGTERM) waits for the requests and
    /// tunnels open through it to end, taking no new connection, before
    /// it cuts them. The shipped Deployment's grace period (30 s, a 5 s
    /// preStop wait first) leaves room for the default.
    #[arg(long, default_value = "20s", value_parser = super::parse_duration, value_name = "DURATION")]
    pub gateway_drain_timeout: Duration,

    /// The share of gateway requests (a CONNECT's setup, a plain-http
    /// request) traced as a `gateway.request` span, from 0 (none) to 1
    /// (all): at hundreds of new connections a second, tracing each would
    /// cost more than the relay.
    #[arg(long, default_value_t = 0.01, value_parser = sample_ratio, value_name = "RATIO")]
    pub gateway_trace_sample_ratio: f64,
}

/// A ratio from 0 to 1.
fn sample_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a ratio from 0 to 1")),
    }
}

impl GatewayFlags {
    /// Every problem of these flags, with the API on or off
    /// (`discovery_on`) and tokens in force or not (`has_token`): the
    /// gateway signs crawlers in with discovery tokens, so it needs the
    /// API's state and tokens (an open gateway would be an open proxy).
    pub fn check(&self, discovery_on: bool, has_token: bool) -> Result<(), String> {
        if !matches!(super::parse_bind(&self.gateway_bind_address), Ok(Some(_))) {
            return Ok(());
        }
        if !discovery_on {
            return Err(
                "--gateway-bind-address needs the discovery API on (it shares its \
                proxies, leases and tokens): set --discovery-bind-address"
                    .to_string(),
            );
        }
        if !has_token {
            return Err(
                "--gateway-bind-address needs discovery tokens (crawlers sign in \
                with their client name and token): set DISCOVERY_TOKEN, \
                --discovery-tokens-dir or --discovery-tokens-secret"
                    .to_string(),
            );
        }
        let minute = Duration::from_secs(60);
        let (ttl, max) = (self.gateway_session_ttl, self.gateway_max_session_ttl);
        if ttl < minute || max < minute || ttl > max {
            return Err(format!(
                "--gateway-session-ttl ({}) must be at least 1m and at most \
                 --gateway-max-session-ttl ({})",
                humantime::format_duration(ttl),
                humantime::format_duration(max)
            ));
        }
        if self.gateway_idle_timeout < Duration::from_secs(1) {
            return Err("--gateway-idle-timeout must be at least 1s".to_string());
        }
        ban_statuses(&self.gateway_ban_statuses).map(|_| ())
    }
}

/// `--gateway-ban-statuses`: HTTP statuses, comma-separated.
pub fn ban_statuses(list: &str) -> Result<Vec<u16>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| match c.parse::<u16>() {
            Ok(n) if (100..=599).contains(&n) => Ok(n),
            _ => Err(format!(
                "--gateway-ban-statuses: {c:?} is not an HTTP status (100-599)"
            )),
        })
        .collect()
}
