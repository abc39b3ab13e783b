//! The operator's settings: the flags turned into typed values, with every
//! file they name read, before anything starts. A problem is found here, at
//! startup, not later on the leader (a bad `--probe-ca-file` used to stop
//! the health engine only after GC had started).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::tokens;
use crate::cli::{self, Flags};
use crate::config::ProvidersConfig;
use crate::health;
use crate::leader;
use crate::lease::{ClientLimits, LeaseConfig};
use crate::tenancy::{parse_cidrs, ExternalNamespaces, ProbeDenylist};

/// What the operator runs with. Not `Debug`: it carries the discovery
/// token.
pub struct Settings {
    /// The operator, or only the gateway.
    pub role: cli::Role,
    /// The providers file, loaded and validated (none for the gateway).
    pub providers: ProvidersConfig,
    /// `--providers-config` and `--providers-config-reload-interval`:
    /// where and how often to read the file again; `None` when off.
    pub providers_reload: Option<(PathBuf, Duration)>,
    /// `--health-probe-bind-address` (`None`: off).
    pub probe_bind: Option<SocketAddr>,
    /// `--metrics-bind-address` (`None`: off).
    pub metrics_bind: Option<SocketAddr>,
    /// The metrics server's TLS with `--metrics-secure` (the default) and
    /// the server on; `None`: plain HTTP without authentication.
    pub metrics_tls: Option<Arc<rustls::ServerConfig>>,
    /// `--discovery-bind-address` (`None`: off).
    pub discovery_bind: Option<SocketAddr>,
    /// `--gateway-bind-address` (`None`: off).
    pub gateway_bind: Option<SocketAddr>,
    /// The gateway's bounds (`--gateway-*`).
    pub gateway: crate::gateway::Settings,
    /// The discovery API's connection limits.
    pub discovery_limits: crate::server::Limits,
    /// Where the other replicas reach this one's discovery API
    /// (`--discovery-advertise-url`, or from `POD_IP`); `None`: unknown.
    pub discovery_advertise: Option<String>,
    /// Leader election timing with `--leader-elect`, `None` without.
    pub leader: Option<leader::Timing>,
    /// Where the leader Lease lives, and part of the installation id.
    pub operator_namespace: String,
    /// `--proxy-namespace`: watch one namespace instead of all.
    pub proxy_namespace: Option<String>,
    /// `--installation-id`; derived from the cluster when `None`.
    pub installation_id: Option<String>,
    /// `--max-concurrent-reconciles`.
    pub max_concurrent_reconciles: u16,
    /// The health engine's settings.
    pub health: HealthSettings,
    /// The lease store's limits.
    pub leases: LeaseConfig,
    /// The discovery API's clients and their bearer tokens:
    /// `DISCOVERY_TOKEN` as `default`, then `--discovery-tokens-dir`.
    pub discovery_tokens: Vec<(String, String)>,
    /// `--per-proxy-metrics`.
    pub per_proxy_metrics: bool,
    /// `--discovery-tokens-secret`: more clients, watched.
    pub discovery_tokens_secret: Option<String>,
    /// `--generate-discovery-token`: the client whose token the operator
    /// creates in that Secret while it is absent.
    pub generate_discovery_token: Option<String>,
    /// Per-client lease caps and the global-cooldown quorum.
    pub client_limits: ClientLimits,
    /// Orphan GC: interval, minimum age, deletes per sweep.
    pub gc: GcSettings,
    /// Provider checks (`--provider-check-interval`, effective timeout);
    /// `None` when off.
    pub provider_checks: Option<ProviderChecks>,
    /// `--gcp-wire-log-full-payloads`.
    pub gcp_wire_log_full_payloads: bool,
    /// `--provider-list-interval`; `None` when off.
    pub provider_list_interval: Option<Duration>,
}

/// The health engine's settings.
pub struct HealthSettings {
    /// Probe URL and expected status for Proxies that name none.
    pub defaults: health::Defaults,
    /// `--health-workers`: the most probes in flight.
    pub workers: usize,
    /// `--probe-dns-ttl`.
    pub dns_ttl: Duration,
    /// The probes' TLS roots (webpki plus `--probe-ca-file`).
    pub tls: Arc<rustls::ClientConfig>,
    /// `--trace-health-probes`.
    pub trace_probes: bool,
    /// The switch holding the probes (`--bench-routes` only).
    pub pause: Option<health::Pause>,
    /// Proxies the gateway saw failing, for the engine to probe at once.
    pub hints: health::Hints,
}

/// Orphan GC's settings (the installation id comes later, from the cluster).
#[derive(Clone, Copy, Debug)]
pub struct GcSettings {
    pub interval: Duration,
    pub min_age: Duration,
    pub max_deletes: u32,
}

/// Provider checks: how often, and how long one round may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderChecks {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Settings {
    /// Reads the flags (and `DISCOVERY_TOKEN`): every problem is listed,
    /// each naming its flag, so one start shows them all.
    pub fn from_flags(flags: &Flags) -> Result<Settings, Vec<String>> {
        Settings::from_flags_and_env(
            flags,
            std::env::var("DISCOVERY_TOKEN").ok(),
            std::env::var("POD_IP").ok(),
        )
    }

    fn from_flags_and_env(
        flags: &Flags,
        discovery_token: Option<String>,
        pod_ip: Option<String>,
    ) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let advertise = advertise_url(
            flags.discovery_advertise_url.as_deref(),
            pod_ip.as_deref(),
            cli::parse_bind(&flags.discovery_bind_address)
                .ok()
                .flatten(),
        )
        .map_err(|e| problems.push(e))
        .ok()
        .flatten();
        if let Err(mut p) = flags.validate() {
            problems.append(&mut p);
        }
        if let Err(e) =
            cli::validate_check_flags(flags.provider_check_interval, flags.provider_check_timeout)
        {
            problems.push(e);
        }
        let discovery_tokens = tokens::gather(
            discovery_token.as_deref(),
            flags.discovery_tokens_dir.as_deref(),
        )
        .map_err(|e| problems.push(format!("--discovery-tokens-dir: {e}")))
        .unwrap_or_default();
        if matches!(
            cli::parse_bind(&flags.gateway.gateway_bind_address),
            Ok(Some(_))
        ) {
            if let Err(e) = tokens::long_enough(&discovery_tokens, tokens::GATEWAY_MIN_TOKEN) {
                problems.push(format!("DISCOVERY_TOKEN or --discovery-tokens-dir: {e}"));
            }
        }
        if let Some(client) = &flags.generate_discovery_token {
            if let Err(e) = tokens::check(&[(client.clone(), "-".into())]) {
                problems.push(format!("--generate-discovery-token: {e}"));
            }
        }
        let has_token = !discovery_tokens.is_empty() || flags.discovery_tokens_secret.is_some();
        if let Err(e) = discovery_auth(flags, has_token) {
            problems.push(e);
        }
        let discovery_on = !matches!(cli::parse_bind(&flags.discovery_bind_address), Ok(None));
        if let Err(e) = flags.gateway.check(discovery_on, has_token) {
            problems.push(e);
        }
        let tls = health::probe::tls_config(flags.probe_ca_file.as_deref())
            .map_err(|e| problems.push(format!("--probe-ca-file: {e}")))
            .ok();
        let metrics_tls = metrics_tls(flags).map_err(|e| problems.push(e)).ok();
        let url = url::Url::parse(&flags.default_probe_url).ok();
        let external = ExternalNamespaces::parse(
            flags.external_proxy_namespaces.as_deref(),
            &flags.operator_namespace,
        )
        .map_err(|e| problems.push(e))
        .ok();
        let deny = ProbeDenylist::parse(&flags.probe_deny_cidrs)
            .and_then(|d| {
                let allow = parse_cidrs("--probe-allow-cidrs", &flags.probe_allow_cidrs)?;
                Ok(d.allowing(allow))
            })
            .map_err(|e| problems.push(e))
            .ok();
        let gateway_only = flags.role == cli::Role::Gateway;
        if gateway_only
            && !matches!(
                cli::parse_bind(&flags.gateway.gateway_bind_address),
                Ok(Some(_))
            )
        {
            problems.push(
                "gateway: set --gateway-bind-address (the address crawlers connect to; \
                 the shipped Deployment uses :3128)"
                    .to_string(),
            );
        }
        let providers = match &flags.providers_config {
            // The gateway provisions nothing: it reads Proxies only.
            _ if gateway_only => Some(ProvidersConfig::default()),
            None => {
                problems.push("--providers-config is required".to_string());
                None
            }
            Some(path) => ProvidersConfig::load(path)
                .map_err(|e| problems.push(format!("--providers-config: {e}")))
                .ok(),
        };
        // validate() has already named a bad bind address or probe URL.
        let bind = |s: &str| cli::parse_bind(s).ok().flatten();
        let (
            Some(providers),
            Some(tls),
            Some(metrics_tls),
            Some(url),
            Some(external),
            Some(deny),
            true,
        ) = (
            providers,
            tls,
            metrics_tls,
            url,
            external,
            deny,
            problems.is_empty(),
        )
        else {
            return Err(problems);
        };
        let interval = flags.provider_check_interval;
        let reload = flags.providers_config_reload_interval;
        Ok(Settings {
            role: flags.role,
            providers,
            providers_reload: flags
                .providers_config
                .clone()
                .filter(|_| !reload.is_zero() && !gateway_only)
                .map(|path| (path, reload)),
            probe_bind: bind(&flags.health_probe_bind_address),
            metrics_bind: bind(&flags.metrics_bind_address),
            metrics_tls,
            discovery_bind: bind(&flags.discovery_bind_address),
            gateway_bind: bind(&flags.gateway.gateway_bind_address),
            gateway: crate::gateway::Settings {
                max_connections: usize::try_from(flags.gateway.gateway_max_connections)
                    .unwrap_or(usize::MAX),
                max_per_address: usize::try_from(flags.gateway.gateway_max_connections_per_address)
                    .unwrap_or(usize::MAX),
                max_per_client: flags.gateway.gateway_max_connections_per_client,
                max_per_upstream: flags.gateway.gateway_max_connections_per_upstream,
                max_suspect_percent: flags.gateway.gateway_max_suspect_percent,
                session_ttl: flags.gateway.gateway_session_ttl,
                max_session_ttl: flags.gateway.gateway_max_session_ttl,
                idle_timeout: flags.gateway.gateway_idle_timeout,
                drain_timeout: flags.gateway.gateway_drain_timeout,
                // A ratio from 0 to 1 (checked by its parser).
                traced_per_million: (flags.gateway.gateway_trace_sample_ratio * 1e6).round() as u32,
                ban_statuses: cli::gateway::ban_statuses(&flags.gateway.gateway_ban_statuses)
                    .unwrap_or_default(),
                ..crate::gateway::Settings::default()
            },
            discovery_limits: crate::server::Limits {
                max_connections: usize::try_from(flags.discovery_max_connections)
                    .unwrap_or(usize::MAX),
                // Kept for the other replicas' forwards: a sixteenth, at
                // most the shipped 64.
                reserved: usize::try_from(flags.discovery_max_connections / 16)
                    .unwrap_or(usize::MAX)
                    .min(crate::server::DISCOVERY_LIMITS.reserved),
                max_per_address: usize::try_from(flags.discovery_max_connections_per_address)
                    .unwrap_or(usize::MAX),
                ..crate::server::DISCOVERY_LIMITS
            },
            discovery_advertise: advertise,
            // The gateway always follows the Lease (it never campaigns):
            // without a leader to read from it would take itself for one.
            leader: (flags.leader_elect || gateway_only).then_some(leader::Timing {
                lease_duration: flags.leader_election_lease_duration,
                renew_deadline: flags.leader_election_renew_deadline,
                retry_period: flags.leader_election_retry_period,
            }),
            operator_namespace: flags.operator_namespace.clone(),
            proxy_namespace: flags.proxy_namespace.clone(),
            installation_id: flags.installation_id.clone(),
            max_concurrent_reconciles: flags.max_concurrent_reconciles,
            health: HealthSettings {
                defaults: health::Defaults {
                    url,
                    expected_status: flags.default_probe_expected_status,
                    external: Arc::new(external),
                    deny: Arc::new(deny),
                    credentials: Arc::default(),
                    full_every: flags.probe_full_every,
                },
                workers: usize::from(flags.health_workers),
                dns_ttl: flags.probe_dns_ttl,
                tls,
                trace_probes: flags.trace_health_probes,
                pause: flags.bench_routes.then(health::Pause::default),
                hints: health::Hints::default(),
            },
            leases: LeaseConfig {
                max_leases_per_proxy: flags.max_leases_per_proxy,
                default_ttl: flags.default_lease_ttl,
                max_ttl: flags.max_lease_ttl,
                cooldown: flags.lease_cooldown,
            },
            discovery_tokens,
            discovery_tokens_secret: flags.discovery_tokens_secret.clone(),
            generate_discovery_token: flags.generate_discovery_token.clone(),
            per_proxy_metrics: flags.per_proxy_metrics,
            client_limits: ClientLimits {
                max_leases: flags.max_leases_per_client,
                global_cooldown_min_clients: usize::from(flags.global_cooldown_min_clients),
            },
            gc: GcSettings {
                interval: flags.gc_interval,
                min_age: flags.gc_min_age,
                max_deletes: flags.gc_max_deletes_per_sweep,
            },
            provider_checks: (!interval.is_zero()).then(|| ProviderChecks {
                interval,
                timeout: cli::effective_check_timeout(interval, flags.provider_check_timeout),
            }),
            gcp_wire_log_full_payloads: flags.gcp_wire_log_full_payloads,
            provider_list_interval: (!flags.provider_list_interval.is_zero())
                .then_some(flags.provider_list_interval),
        })
    }
}

/// Where the other replicas reach this one's discovery API: the flag as
/// given (plain `http`, with a host), else `http://POD_IP:port`, else the
/// bind address when it names one; `None` when nothing tells (a leader
/// then publishes no URL and followers answer 503 to lease calls).
pub fn advertise_url(
    flag: Option<&str>,
    pod_ip: Option<&str>,
    bind: Option<SocketAddr>,
) -> Result<Option<String>, String> {
    if let Some(given) = flag {
        let url = url::Url::parse(given)
            .map_err(|e| format!("--discovery-advertise-url {given:?}: {e}"))?;
        if url.scheme() != "http" || url.host_str().is_none() {
            return Err(format!(
                "--discovery-advertise-url {given:?}: must be http://HOST[:PORT] (replicas talk plain HTTP to each other)"
            ));
        }
        return Ok(Some(given.trim_end_matches('/').to_string()));
    }
    let Some(bind) = bind else {
        return Ok(None);
    };
    let host = match pod_ip.map(str::trim).filter(|ip| !ip.is_empty()) {
        Some(ip) => ip
            .parse::<std::net::IpAddr>()
            .map_err(|e| format!("POD_IP {ip:?} is not an IP address: {e}"))?,
        None if !bind.ip().is_unspecified() => bind.ip(),
        None => return Ok(None),
    };
    Ok(Some(format!(
        "http://{}",
        SocketAddr::new(host, bind.port())
    )))
}

/// The discovery API fails closed: with it on, a token (`DISCOVERY_TOKEN`)
/// is required unless `--allow-unauthenticated-discovery` says otherwise.
fn discovery_auth(flags: &Flags, has_token: bool) -> Result<(), String> {
    let api_on = !matches!(cli::parse_bind(&flags.discovery_bind_address), Ok(None));
    if api_on && !has_token && !flags.allow_unauthenticated_discovery {
        return Err(
            "DISCOVERY_TOKEN is not set: the discovery API refuses to serve without a \
            bearer token; set it (in the cluster: Secret discovery-token, key token), pass \
            --allow-unauthenticated-discovery to serve everyone, or turn the API off with \
            --discovery-bind-address=0"
                .to_string(),
        );
    }
    Ok(())
}

/// The metrics server's TLS: made (or read from `--metrics-cert-dir`) only
/// when it will serve HTTPS.
fn metrics_tls(flags: &Flags) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    let on = matches!(cli::parse_bind(&flags.metrics_bind_address), Ok(Some(_)));
    if !flags.metrics_secure {
        if flags.metrics_cert_dir.is_some() {
            return Err(
                "--metrics-cert-dir: not used with --metrics-secure=false (plain HTTP); drop one"
                    .into(),
            );
        }
        return Ok(None);
    }
    if !on {
        return Ok(None);
    }
    crate::metrics_auth::server_config(flags.metrics_cert_dir.as_deref())
        .map(Some)
        .map_err(|e| e.to_string())
}

/// `--check-config`: the one-line verdict on the providers file, for a
/// human at a terminal (stdout on success, stderr on failure).
pub fn check_config(path: Option<&PathBuf>) -> Result<String, String> {
    let path = path.ok_or_else(|| "--check-config needs --providers-config FILE".to_string())?;
    let cfg = ProvidersConfig::load(path).map_err(|e| e.to_string())?;
    let list: Vec<String> = cfg
        .providers
        .iter()
        .map(|p| format!("{} ({})", p.name, p.provider_type))
        .collect();
    Ok(format!(
        "{}: valid, {} provider(s){}{}",
        path.display(),
        list.len(),
        if list.is_empty() { "" } else { ": " },
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags(extra: &[&str], providers: &std::path::Path) -> Flags {
        let mut args = vec![
            "egress-proxies-operator".to_string(),
            "--providers-config".to_string(),
            providers.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Flags::parse_from(args)
    }

    fn providers_file(dir: &tempfile::TempDir) -> PathBuf {
        let path = dir.path().join("providers.yaml");
        std::fs::write(&path, "providers:\n  - name: k\n    type: kubernetes\n").unwrap();
        path
    }

    struct Case {
        name: &'static str,
        args: &'static [&'static str],
        /// `DISCOVERY_TOKEN`.
        token: Option<&'static str>,
        /// Substrings of the problems, one per expected problem; empty: valid.
        problems: &'static [&'static str],
    }

    #[test]
    fn flags_become_settings_or_every_problem() {
        let dir = tempfile::tempdir().unwrap();
        let providers = providers_file(&dir);
        let cases = [
            Case {
                name: "defaults, with a token",
                args: &[],
                token: Some("t"),
                problems: &[],
            },
            Case {
                name: "no token: the API refuses to serve everyone",
                args: &[],
                token: None,
                problems: &["DISCOVERY_TOKEN is not set"],
            },
            Case {
                name: "an empty token is no token",
                args: &[],
                token: Some(""),
                problems: &["--allow-unauthenticated-discovery"],
            },
            Case {
                name: "no token, explicitly allowed",
                args: &["--allow-unauthenticated-discovery"],
                token: None,
                problems: &[],
            },
            Case {
                name: "no token, the API off",
                args: &["--discovery-bind-address", "0"],
                token: None,
                problems: &[],
            },
            Case {
                name: "a generated token for a well-named client",
                args: &[
                    "--discovery-tokens-secret",
                    "tokens",
                    "--generate-discovery-token",
                    "default",
                ],
                token: None,
                problems: &[],
            },
            Case {
                name: "a generated token's client must be a client name",
                args: &[
                    "--discovery-tokens-secret",
                    "tokens",
                    "--generate-discovery-token",
                    "Not_A_Name",
                ],
                token: None,
                problems: &["--generate-discovery-token: client name \"Not_A_Name\""],
            },
            Case {
                name: "the gateway with a token",
                args: &["--gateway-bind-address", "127.0.0.1:3128"],
                token: Some("a-token-of-16-bytes"),
                problems: &[],
            },
            Case {
                name: "with the gateway on a short token is refused naming its client",
                args: &["--gateway-bind-address", "127.0.0.1:3128"],
                token: Some("t"),
                problems: &["the token of client default is 1 bytes; with the gateway on every token must be at least 16"],
            },
            Case {
                name: "the gateway without tokens would be an open proxy",
                args: &[
                    "--gateway-bind-address",
                    ":3128",
                    "--allow-unauthenticated-discovery",
                ],
                token: None,
                problems: &["--gateway-bind-address needs discovery tokens"],
            },
            Case {
                name: "the gateway without the discovery API",
                args: &[
                    "--gateway-bind-address",
                    ":3128",
                    "--discovery-bind-address",
                    "0",
                ],
                token: Some("a-token-of-16-bytes"),
                problems: &["--gateway-bind-address needs the discovery API on"],
            },
            Case {
                name: "a gateway session ttl over its max",
                args: &[
                    "--gateway-bind-address",
                    ":3128",
                    "--gateway-session-ttl",
                    "2h",
                    "--gateway-max-session-ttl",
                    "1h",
                ],
                token: Some("a-token-of-16-bytes"),
                problems: &["--gateway-session-ttl (2h) must be at least 1m and at most --gateway-max-session-ttl (1h)"],
            },
            Case {
                name: "a bad gateway ban status",
                args: &[
                    "--gateway-bind-address",
                    ":3128",
                    "--gateway-ban-statuses",
                    "403,forbidden",
                ],
                token: Some("a-token-of-16-bytes"),
                problems: &["--gateway-ban-statuses: \"forbidden\" is not an HTTP status (100-599)"],
            },
            Case {
                name: "a bad gateway address",
                args: &["--gateway-bind-address", "nowhere"],
                token: Some("a-token-of-16-bytes"),
                problems: &["--gateway-bind-address:"],
            },
            Case {
                name: "a missing metrics cert dir is found at startup, with the server on",
                args: &[
                    "--metrics-bind-address",
                    "127.0.0.1:0",
                    "--metrics-cert-dir",
                    "/nonexistent",
                ],
                token: Some("t"),
                problems: &["--metrics-cert-dir: /nonexistent/tls.crt"],
            },
            Case {
                name: "a metrics cert dir with plain metrics is refused",
                args: &["--metrics-secure=false", "--metrics-cert-dir", "/tmp"],
                token: Some("t"),
                problems: &["--metrics-cert-dir: not used with --metrics-secure=false"],
            },
            Case {
                name: "plain metrics",
                args: &["--metrics-secure=false", "--metrics-bind-address", ":0"],
                token: Some("t"),
                problems: &[],
            },
            Case {
                name: "a missing CA file is found at startup",
                args: &["--probe-ca-file", "/nonexistent/ca.pem"],
                token: Some("t"),
                problems: &["--probe-ca-file"],
            },
            Case {
                name: "every problem at once",
                args: &[
                    "--probe-ca-file",
                    "/nonexistent/ca.pem",
                    "--metrics-bind-address",
                    "nope",
                    "--provider-check-interval",
                    "5s",
                ],
                token: Some("t"),
                problems: &[
                    "--metrics-bind-address",
                    "--provider-check-interval",
                    "--probe-ca-file",
                ],
            },
        ];
        for c in cases {
            match Settings::from_flags_and_env(
                &flags(c.args, &providers),
                c.token.map(String::from),
                None,
            ) {
                Ok(_) => assert!(c.problems.is_empty(), "{}: accepted", c.name),
                Err(got) => {
                    assert_eq!(got.len(), c.problems.len(), "{}: {got:?}", c.name);
                    for want in c.problems {
                        assert!(
                            got.iter().any(|p| p.contains(want)),
                            "{}: no problem names {want}: {got:?}",
                            c.name
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn typed_values() {
        let dir = tempfile::tempdir().unwrap();
        let f = flags(
            &[
                "--metrics-bind-address",
                "0",
                "--discovery-bind-address",
                "127.0.0.1:9000",
                "--provider-check-interval",
                "0",
                "--leader-elect",
            ],
            &providers_file(&dir),
        );
        let s =
            Settings::from_flags_and_env(&f, Some("t".into()), Some("10.0.0.7".into())).unwrap();
        assert_eq!(s.metrics_bind, None);
        assert_eq!(
            s.discovery_advertise.as_deref(),
            Some("http://10.0.0.7:9000")
        );
        assert_eq!(s.discovery_bind, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(s.provider_checks, None, "0 turns checks off");
        assert!(s.leader.is_some());
        assert_eq!(
            s.discovery_tokens,
            [("default".to_string(), "t".to_string())]
        );
        assert_eq!(s.providers.names(), vec!["k"]);
    }

    #[test]
    fn a_missing_providers_file_is_named() {
        let f = Flags::parse_from(["egress-proxies-operator"]);
        let got = Settings::from_flags_and_env(&f, None, None).err().unwrap();
        assert!(
            got.iter().any(|p| p == "--providers-config is required"),
            "{got:?}"
        );
    }

    #[test]
    fn the_advertised_url_comes_from_the_flag_the_pod_ip_or_the_bind_address() {
        struct Case {
            name: &'static str,
            flag: Option<&'static str>,
            pod_ip: Option<&'static str>,
            bind: Option<&'static str>,
            want: Result<Option<&'static str>, &'static str>,
        }
        let cases = [
            Case {
                name: "the flag wins, without its trailing slash",
                flag: Some("http://leader.example:8090/"),
                pod_ip: Some("10.0.0.7"),
                bind: Some("0.0.0.0:8090"),
                want: Ok(Some("http://leader.example:8090")),
            },
            Case {
                name: "POD_IP and the bind port",
                flag: None,
                pod_ip: Some("10.0.0.7"),
                bind: Some("0.0.0.0:8090"),
                want: Ok(Some("http://10.0.0.7:8090")),
            },
            Case {
                name: "an IPv6 POD_IP is bracketed",
                flag: None,
                pod_ip: Some("fd00::7"),
                bind: Some("0.0.0.0:8090"),
                want: Ok(Some("http://[fd00::7]:8090")),
            },
            Case {
                name: "no POD_IP: a bind address that names a host",
                flag: None,
                pod_ip: None,
                bind: Some("127.0.0.3:9000"),
                want: Ok(Some("http://127.0.0.3:9000")),
            },
            Case {
                name: "no POD_IP and a wildcard bind: unknown",
                flag: None,
                pod_ip: None,
                bind: Some("0.0.0.0:8090"),
                want: Ok(None),
            },
            Case {
                name: "the API off: nothing to advertise",
                flag: None,
                pod_ip: Some("10.0.0.7"),
                bind: None,
                want: Ok(None),
            },
            Case {
                name: "https is refused, naming the flag",
                flag: Some("https://leader:8090"),
                pod_ip: None,
                bind: Some("0.0.0.0:8090"),
                want: Err("--discovery-advertise-url \"https://leader:8090\": must be http://"),
            },
            Case {
                name: "not a URL",
                flag: Some("leader:8090:x"),
                pod_ip: None,
                bind: None,
                want: Err("--discovery-advertise-url \"leader:8090:x\""),
            },
            Case {
                name: "a bad POD_IP is named",
                flag: None,
                pod_ip: Some("pod-ip"),
                bind: Some("0.0.0.0:8090"),
                want: Err("POD_IP \"pod-ip\" is not an IP address"),
            },
        ];
        for c in cases {
            let got = advertise_url(c.flag, c.pod_ip, c.bind.map(|b| b.parse().unwrap()));
            match (got, c.want) {
                (Ok(got), Ok(want)) => assert_eq!(got.as_deref(), want, "{}", c.name),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{}: {got}", c.name),
                (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
            }
        }
    }
}
