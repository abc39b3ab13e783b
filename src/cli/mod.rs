//! Command-line flags (operator.md §8.1) and their validation.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::api::constants::INSTALL_NAMESPACE;

mod command;
pub mod gateway;

pub use command::{Cli, Command, Role};

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// The operator's flags (also those of `gateway`).
#[derive(Parser, Debug, Clone)]
#[command(name = "egress-proxies-operator", version = crate::VERSION, long_about = None, args_override_self = true)]
pub struct Flags {
    /// What this process runs: set by the command, not a flag.
    #[arg(skip)]
    pub role: Role,

    /// Path of the providers YAML file (required; `gateway` reads none). In
    /// the cluster: /etc/proxy-operator/providers.yaml from the
    /// providers-config ConfigMap.
    #[arg(long, value_name = "FILE")]
    pub providers_config: Option<PathBuf>,

    /// How often the providers file is read again (a ConfigMap volume
    /// changes under a running Pod): a valid change is put in force without
    /// a restart, a broken one is refused and the last good config stays;
    /// 0 turns reloading off.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub providers_config_reload_interval: Duration,

    /// Validate the providers file and exit: 0 when valid, 1 with every
    /// problem listed otherwise. Needs no cluster.
    #[arg(long)]
    pub check_config: bool,

    /// Address of the Prometheus /metrics endpoint, e.g. :8443; "0" turns
    /// it off.
    #[arg(long, default_value = "0", value_name = "ADDR")]
    pub metrics_bind_address: String,

    /// Serve /metrics over HTTPS, letting through only bearer tokens the API
    /// server authenticates (TokenReview) and authorizes for `get` on the
    /// non-resource URL /metrics (SubjectAccessReview; the metrics-reader
    /// ClusterRole grants it). `--metrics-secure=false`: plain HTTP, anyone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub metrics_secure: bool,

    /// Directory with the metrics server's certificate and key (tls.crt,
    /// tls.key in PEM, as a mounted kubernetes.io/tls Secret). Default: a
    /// self-signed certificate made at start.
    #[arg(long, value_name = "DIR")]
    pub metrics_cert_dir: Option<PathBuf>,

    /// Address serving /healthz and /readyz; "0" turns it off.
    #[arg(long, default_value = ":8081", value_name = "ADDR")]
    pub health_probe_bind_address: String,

    /// Elect a leader through a coordination.k8s.io Lease so only one replica
    /// reconciles, probes, collects garbage and checks providers.
    #[arg(long)]
    pub leader_elect: bool,

    /// Namespace the operator runs in: holds the leader-election Lease and
    /// feeds the default installation identity.
    #[arg(long, env = "POD_NAMESPACE", default_value = INSTALL_NAMESPACE, value_name = "NS")]
    pub operator_namespace: String,

    /// How long a leader's Lease lasts without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it steps down.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,

    /// Interval between attempts to acquire or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub leader_election_retry_period: Duration,

    /// Only watch Proxies in this namespace (default: all namespaces). GC
    /// still lists Proxies cluster-wide so it never mistakes another
    /// namespace's instances for orphans.
    #[arg(long, value_name = "NS")]
    pub proxy_namespace: Option<String>,

    /// Proxies reconciled at once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub max_concurrent_reconciles: u16,

    /// Identity written on every instance this installation creates; GC only
    /// ever deletes instances carrying it. Default: derived from the
    /// kube-system namespace UID and --operator-namespace.
    #[arg(long, env = "INSTALLATION_ID", value_name = "ID")]
    pub installation_id: Option<String>,

    /// The most health probes in flight at once (a memory bound: a probe
    /// in flight holds a socket and its buffers, some tens of KiB during a
    /// TLS handshake). Below it the pool follows the fleet: twice its
    /// probes a second times their mean latency, at least 32. A probe
    /// waiting on the network holds only its slot (no thread); slots are
    /// shared fairly across namespaces, so one namespace of unresponsive
    /// endpoints cannot delay the others' verdicts.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u16).range(1..))]
    pub health_workers: u16,

    /// With an https probe URL, every Nth probe of a healthy proxy is the
    /// full fetch (CONNECT, TLS, the request); the others check that the
    /// proxy accepts the CONNECT, which Squid answers only once it has
    /// reached the target. A failed probe makes the next one full. 1:
    /// every probe is full.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub probe_full_every: u32,

    /// How long a proxy's host name (an External endpoint) is taken as
    /// resolved; a failed lookup is kept 5 s at most. 0: every probe
    /// resolves it.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub probe_dns_ttl: Duration,

    /// URL fetched through each proxy when its spec.healthCheck names none.
    #[arg(
        long,
        default_value = "https://www.gstatic.com/generate_204",
        value_name = "URL"
    )]
    pub default_probe_url: String,

    /// HTTP status the default probe URL must answer with.
    #[arg(long, default_value_t = 204, value_parser = clap::value_parser!(u16).range(100..=599))]
    pub default_probe_expected_status: u16,

    /// PEM file of extra CA certificates trusted by probes (e.g. a private CA
    /// in tests).
    #[arg(long, value_name = "FILE")]
    pub probe_ca_file: Option<PathBuf>,

    /// Namespaces whose External Proxies are probed and offered to crawlers,
    /// comma-separated; `*` for every namespace. Default: the operator's own
    /// namespace only. An External Proxy elsewhere gets
    /// `Provisioned=False/ExternalNotAllowed` and is never dialled.
    #[arg(long, value_name = "NS,...")]
    pub external_proxy_namespaces: Option<String>,

    /// Addresses and CIDRs an External Proxy's endpoint must not be (or
    /// resolve to): the health engine does not dial them, nor the gateway.
    /// Comma-separated; empty turns the check off.
    #[arg(long, default_value = crate::tenancy::DEFAULT_PROBE_DENY, value_name = "CIDR,...")]
    pub probe_deny_cidrs: String,

    /// Addresses and CIDRs an External Proxy's endpoint may be even inside
    /// a range of --probe-deny-cidrs (an office proxy on 10.20.0.0/16
    /// without the rest of 10.0.0.0/8). Comma-separated; default none.
    #[arg(long, default_value = "", value_name = "CIDR,...")]
    pub probe_allow_cidrs: String,

    /// Give every health probe its own root trace span (off by default:
    /// one probe per proxy per second is a lot of spans).
    #[arg(long)]
    pub trace_health_probes: bool,

    /// Address of the discovery and lease API; "0" turns it off.
    #[arg(long, default_value = ":8090", value_name = "ADDR")]
    pub discovery_bind_address: String,

    /// Base URL at which the other replicas reach this replica's discovery
    /// API (with --leader-elect the leader publishes it on its Lease, and
    /// followers forward lease calls there). Default: http://$POD_IP and
    /// the port of --discovery-bind-address.
    #[arg(long, value_name = "URL")]
    pub discovery_advertise_url: Option<String>,

    /// Connections the discovery API holds open at once.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub discovery_max_connections: u32,

    /// Connections one source address may hold open on the discovery API
    /// (0: no cap of its own), so that one client reopening idle
    /// connections cannot keep crawlers or the other replicas' forwards
    /// out. Crawlers behind one NAT address share it.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub discovery_max_connections_per_address: u32,

    /// Serve the discovery API without a bearer token when
    /// `DISCOVERY_TOKEN` is unset. Without this flag the operator refuses to
    /// start with the API on and no token.
    #[arg(long)]
    pub allow_unauthenticated_discovery: bool,

    /// The gateway's flags (`--gateway-*`).
    #[command(flatten)]
    pub gateway: gateway::GatewayFlags,

    /// Directory of named discovery tokens, one file per client: the file's
    /// name is the client's name, its content the token (a Secret mounted
    /// as a volume). Read at startup; with `DISCOVERY_TOKEN` the client
    /// `default` is added.
    #[arg(long, value_name = "DIR")]
    pub discovery_tokens_dir: Option<PathBuf>,

    /// Also export the probe series per proxy (a histogram and a failure
    /// counter for each Proxy). Off by default: the fleet-wide series,
    /// by provider and namespace, do not grow with the number of Proxies.
    #[arg(long)]
    pub per_proxy_metrics: bool,

    /// Secret in the operator namespace holding named discovery tokens, one
    /// key per client (key: the client's name, value: its token). Watched:
    /// an edit is in force within seconds, without a restart; a content
    /// with an empty token or a bad client name is refused and the last
    /// good set stays. The API then requires a token even while the Secret
    /// is absent.
    #[arg(long, value_name = "NAME")]
    pub discovery_tokens_secret: Option<String>,

    /// With --discovery-tokens-secret: while that Secret does not exist,
    /// the operator creates it holding one random token for client CLIENT
    /// (the key). Created once, never rewritten, so the token stays across
    /// restarts, upgrades and re-renders; read it from the Secret.
    #[arg(long, value_name = "CLIENT", requires = "discovery_tokens_secret")]
    pub generate_discovery_token: Option<String>,

    /// Leases one client (one token name) may hold at once; 0: no limit.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub max_leases_per_client: u32,

    /// Distinct clients whose reports (for every site, or for the same
    /// site) put a proxy in cooldown for every client; a client's own
    /// report always withholds the proxy from itself.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub global_cooldown_min_clients: u16,

    /// Longest lease a client may ask for (at most 24h).
    #[arg(long, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    pub max_lease_ttl: Duration,

    /// Lease length when the client asks for none.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub default_lease_ttl: Duration,

    /// How long a proxy is not leased after a client reports it blocked or
    /// failing (for that site, or for all sites); at most 24h.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_cooldown: Duration,

    /// Leases one proxy may hold at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_leases_per_proxy: u32,

    /// Time between orphan GC sweeps; 0 turns GC off.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub gc_interval: Duration,

    /// Instances younger than this are never collected (protects creates in
    /// flight).
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub gc_min_age: Duration,

    /// At most this many instances are deleted per sweep, so a bug or a stale
    /// cache cannot wipe a fleet.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub gc_max_deletes_per_sweep: u32,

    /// Time between provider health checks: 0 turns them off (and deletes
    /// every ProviderHealth object), otherwise at least 10s.
    #[arg(long, default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    pub provider_check_interval: Duration,

    /// Time limit of one provider check round; 0 means min(15s, interval).
    #[arg(long, default_value = "0", value_parser = parse_duration, value_name = "DURATION")]
    pub provider_check_timeout: Duration,

    /// How often each gcp and kvm provider lists all its instances (one
    /// aggregated list, one list per host), jittered up to 20% early; a
    /// Running Proxy's check is answered from the newest listing instead of
    /// a get per Proxy. 0 turns it off (a get per check).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub provider_list_interval: Duration,

    /// Log whole request and response payloads in the gcp wire log (large
    /// payloads are elided otherwise). user-data is never logged.
    #[arg(long)]
    pub gcp_wire_log_full_payloads: bool,

    /// Log filter: a level (error, warn, info, debug, trace) or tracing
    /// directives such as `info,egress_proxies_operator=debug`. When
    /// neither the flag nor LOG_LEVEL is set, RUST_LOG is used, else info.
    #[arg(long, env = "LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Serves `make bench-scale`'s routes on the discovery API (a
    /// lease-shaped route with no store, a switch holding the probes).
    /// Hidden: a benchmark's aid, never an installation's setting.
    #[arg(long, hide = true)]
    pub bench_routes: bool,
}

/// Parses `0`, or a humantime duration such as `10s`, `1m30s`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 10s, 1m, 1h30m, or 0)"))
}

/// Parses a bind address: `:PORT` (all interfaces), `HOST:PORT`, or `0`
/// for off (returns `None`).
pub fn parse_bind(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s == "0" || s.is_empty() {
        return Ok(None);
    }
    let full = if let Some(port) = s.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else {
        s.to_string()
    };
    full.parse::<SocketAddr>()
        .map(Some)
        .map_err(|e| format!("invalid address {s:?}: {e} (use :PORT, HOST:PORT or 0)"))
}

/// Upper bound of `--max-lease-ttl` and `--lease-cooldown`: far below what
/// date arithmetic can overflow on, and longer than any crawl needs.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Checks that `value` of `flag` is at most [`MAX_LEASE_DURATION`].
pub fn validate_lease_duration(flag: &str, value: Duration) -> Result<(), String> {
    if value > MAX_LEASE_DURATION {
        return Err(format!(
            "{flag} must be at most {}, got {}",
            humantime::format_duration(MAX_LEASE_DURATION),
            humantime::format_duration(value)
        ));
    }
    Ok(())
}

/// Minimum provider check interval: keeps one status write per provider
/// per round cheap.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Validates `--provider-check-interval` and `--provider-check-timeout`.
pub fn validate_check_flags(interval: Duration, timeout: Duration) -> Result<(), String> {
    if interval.is_zero() {
        return Ok(());
    }
    if interval < MIN_CHECK_INTERVAL {
        return Err(format!(
            "--provider-check-interval must be 0 (off) or at least 10s, got {}",
            humantime::format_duration(interval)
        ));
    }
    if timeout > interval {
        return Err(format!(
            "--provider-check-timeout must be at most the interval ({}), got {}",
            humantime::format_duration(interval),
            humantime::format_duration(timeout)
        ));
    }
    Ok(())
}

/// The round timeout in force: an explicit timeout, or min(15s, interval).
pub fn effective_check_timeout(interval: Duration, timeout: Duration) -> Duration {
    if timeout.is_zero() {
        interval.min(Duration::from_secs(15))
    } else {
        timeout
    }
}

/// The log filter in force: `--log-level` (or `LOG_LEVEL`), else
/// `RUST_LOG` (what Rust tooling and most operators' users reach for
/// first), else `info`. An empty value counts as unset.
pub fn log_filter(flag: Option<&str>, rust_log: Option<&str>) -> String {
    [flag, rust_log]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|f| !f.is_empty())
        .unwrap_or("info")
        .to_string()
}

impl Flags {
    /// [`log_filter`] of these flags and this process's `RUST_LOG`.
    pub fn log_filter(&self) -> String {
        let rust_log = std::env::var("RUST_LOG").ok();
        log_filter(self.log_level.as_deref(), rust_log.as_deref())
    }

    /// Cross-flag checks clap cannot express; every problem is listed.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        for (flag, value) in [
            ("--metrics-bind-address", &self.metrics_bind_address),
            (
                "--health-probe-bind-address",
                &self.health_probe_bind_address,
            ),
            ("--discovery-bind-address", &self.discovery_bind_address),
            ("--gateway-bind-address", &self.gateway.gateway_bind_address),
        ] {
            if let Err(e) = parse_bind(value) {
                problems.push(format!("{flag}: {e}"));
            }
        }
        if let Some(name) = &self.discovery_tokens_secret {
            if !secret_name(name) {
                problems.push(format!(
                    "--discovery-tokens-secret must be a Secret name (1-253 of a-z, 0-9, - and ., starting and ending alphanumeric), got {name:?}"
                ));
            }
        }
        if let Some(id) = &self.installation_id {
            if let Err(e) = crate::provider::naming::validate_installation_id(id) {
                problems.push(format!("--installation-id: {e}"));
            }
        }
        if self.default_lease_ttl.is_zero() || self.default_lease_ttl > self.max_lease_ttl {
            problems.push(format!(
                "--default-lease-ttl must be positive and at most --max-lease-ttl ({}), got {}",
                humantime::format_duration(self.max_lease_ttl),
                humantime::format_duration(self.default_lease_ttl)
            ));
        }
        for (flag, value) in [
            ("--max-lease-ttl", self.max_lease_ttl),
            ("--lease-cooldown", self.lease_cooldown),
        ] {
            if let Err(e) = validate_lease_duration(flag, value) {
                problems.push(e);
            }
        }
        let url_ok = crate::config::http_url(&self.default_probe_url).is_ok();
        if !url_ok {
            problems.push(format!(
                "--default-probe-url must be an http(s) URL, got {:?}",
                self.default_probe_url
            ));
        }
        if self.leader_elect
            && (self.leader_election_renew_deadline >= self.leader_election_lease_duration
                || self.leader_election_retry_period >= self.leader_election_renew_deadline)
        {
            problems.push(
                "leader election needs retry-period < renew-deadline < lease-duration".to_string(),
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Whether `name` is a valid Secret name (a DNS subdomain).
fn secret_name(name: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    name.len() <= 253
        && edge(name.as_bytes().first())
        && edge(name.as_bytes().last())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn log_filter_falls_back_to_rust_log_then_info() {
        struct Case {
            name: &'static str,
            flag: Option<&'static str>,
            rust_log: Option<&'static str>,
            want: &'static str,
        }
        let cases = [
            Case {
                name: "nothing set",
                flag: None,
                rust_log: None,
                want: "info",
            },
            Case {
                name: "RUST_LOG alone",
                flag: None,
                rust_log: Some("egress_proxies_operator=debug,kube=warn"),
                want: "egress_proxies_operator=debug,kube=warn",
            },
            Case {
                name: "the flag or LOG_LEVEL wins over RUST_LOG",
                flag: Some("warn"),
                rust_log: Some("trace"),
                want: "warn",
            },
            Case {
                name: "an empty LOG_LEVEL is unset",
                flag: Some(""),
                rust_log: Some("debug"),
                want: "debug",
            },
            Case {
                name: "an empty RUST_LOG is unset",
                flag: None,
                rust_log: Some(" "),
                want: "info",
            },
        ];
        for c in cases {
            assert_eq!(log_filter(c.flag, c.rust_log), c.want, "{}", c.name);
        }
    }

    #[test]
    fn log_level_has_no_default_so_rust_log_can_apply() {
        // clap reads LOG_LEVEL from the environment: only assert when the
        // test's environment does not set it.
        if std::env::var_os("LOG_LEVEL").is_none() {
            let flags = Flags::try_parse_from(["egress-proxies-operator"]).unwrap();
            assert_eq!(flags.log_level, None);
        }
        let flags =
            Flags::try_parse_from(["egress-proxies-operator", "--log-level", "debug"]).unwrap();
        assert_eq!(flags.log_level.as_deref(), Some("debug"));
    }

    #[test]
    fn check_flag_rules() {
        struct Case {
            name: &'static str,
            interval: Duration,
            timeout: Duration,
            ok: bool,
        }
        let cases = [
            Case {
                name: "off",
                interval: d(0),
                timeout: d(0),
                ok: true,
            },
            Case {
                name: "off: the timeout is not checked",
                interval: d(0),
                timeout: d(999),
                ok: true,
            },
            Case {
                name: "interval under the minimum",
                interval: d(9),
                timeout: d(0),
                ok: false,
            },
            Case {
                name: "the minimum interval, default timeout",
                interval: d(10),
                timeout: d(0),
                ok: true,
            },
            Case {
                name: "timeout equal to the interval",
                interval: d(60),
                timeout: d(60),
                ok: true,
            },
            Case {
                name: "timeout over the interval",
                interval: d(60),
                timeout: d(61),
                ok: false,
            },
            Case {
                name: "timeout under the interval",
                interval: d(60),
                timeout: d(15),
                ok: true,
            },
            Case {
                name: "minimum interval and equal timeout",
                interval: d(10),
                timeout: d(10),
                ok: true,
            },
            Case {
                name: "short interval with a timeout",
                interval: d(5),
                timeout: d(1),
                ok: false,
            },
            Case {
                name: "interval over the minimum",
                interval: d(12),
                timeout: d(0),
                ok: true,
            },
            Case {
                name: "timeout twice the interval",
                interval: d(60),
                timeout: d(120),
                ok: false,
            },
        ];
        for c in cases {
            assert_eq!(
                validate_check_flags(c.interval, c.timeout).is_ok(),
                c.ok,
                "{}",
                c.name
            );
        }
        let msg = validate_check_flags(d(5), d(0)).unwrap_err();
        assert!(
            msg.contains("--provider-check-interval must be 0 (off) or at least 10s, got 5s"),
            "{msg}"
        );
        let msg = validate_check_flags(d(20), d(30)).unwrap_err();
        assert!(
            msg.contains("--provider-check-timeout must be at most the interval (20s), got 30s"),
            "{msg}"
        );
    }

    #[test]
    fn lease_durations_are_capped_naming_the_flag() {
        struct Case {
            name: &'static str,
            args: &'static [&'static str],
            problem: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "the bound itself",
                args: &["--max-lease-ttl", "24h", "--lease-cooldown", "24h"],
                problem: None,
            },
            Case {
                name: "a TTL over the bound",
                args: &["--max-lease-ttl", "25h"],
                problem: Some("--max-lease-ttl must be at most 1day, got 1day 1h"),
            },
            Case {
                name: "a cooldown that would overflow date arithmetic",
                args: &["--lease-cooldown", "300000000years"],
                problem: Some("--lease-cooldown must be at most 1day"),
            },
        ];
        for c in cases {
            let mut args = vec!["x"];
            args.extend_from_slice(c.args);
            let got = Flags::parse_from(args).validate();
            match c.problem {
                None => assert!(got.is_ok(), "{}: {got:?}", c.name),
                Some(want) => {
                    let problems = got.unwrap_err();
                    assert!(
                        problems.iter().any(|p| p.starts_with(want)),
                        "{}: {problems:?}",
                        c.name
                    );
                }
            }
        }
    }

    #[test]
    fn effective_timeout_defaults() {
        assert_eq!(effective_check_timeout(d(60), d(0)), d(15));
        assert_eq!(effective_check_timeout(d(12), d(0)), d(12));
        assert_eq!(effective_check_timeout(d(60), d(30)), d(30));
    }

    #[test]
    fn durations_and_addresses() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1m").unwrap(), d(60));
        assert_eq!(parse_duration("1h30m").unwrap(), d(5400));
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_bind("0").unwrap(), None);
        assert_eq!(
            parse_bind(":8090").unwrap(),
            Some("0.0.0.0:8090".parse().unwrap())
        );
        assert_eq!(
            parse_bind("127.0.0.1:1").unwrap(),
            Some("127.0.0.1:1".parse().unwrap())
        );
        assert_eq!(
            parse_bind("[::1]:80").unwrap(),
            Some("[::1]:80".parse().unwrap())
        );
        assert!(parse_bind("localhost").is_err());
    }

    #[test]
    fn defaults_are_valid_and_cross_checks_report_each_problem() {
        let f = Flags::parse_from(["egress-proxies-operator"]);
        f.validate().unwrap();
        assert_eq!(f.max_concurrent_reconciles, 3);
        assert_eq!(f.provider_check_interval, d(60));
        let f = Flags::parse_from([
            "x",
            "--metrics-bind-address",
            "nope",
            "--installation-id",
            "Bad ID",
            "--default-lease-ttl",
            "2h",
        ]);
        let problems = f.validate().unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("--metrics-bind-address"));
        assert!(problems[1].starts_with("--installation-id"));
        assert!(problems[2].starts_with("--default-lease-ttl"));
        assert!(Flags::try_parse_from(["x", "--max-concurrent-reconciles", "0"]).is_err());
    }
}
