//! The discovery API's series: requests by route, lease events, and the
//! active leases and site cooldowns read from the store at scrape time.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;

use crate::metrics::{HistogramFamily, Registrar, Scraped};

/// Labels of a lease event counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    /// granted, refused, renewed, released, expired, readmitted,
    /// readmit_refused, or a report result.
    pub event: String,
}

/// Labels of the forwarded lease call counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// relayed, or why not: no_leader, not_leader, unreachable, timeout,
    /// unverified, refused.
    pub outcome: String,
}

/// Labels of the lease-table answer counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// delta or whole.
    pub kind: String,
}

/// Labels of a discovery API request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The matched route pattern, e.g. `POST /v1/leases`.
    pub route: String,
    /// HTTP status code.
    pub status: String,
    /// The caller: its token's name (`anonymous` on an open API, `none`
    /// when no token was accepted). As many values as named tokens.
    pub client: String,
}

/// Labels of a discovery API latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// The matched route pattern, e.g. `POST /v1/leases`.
    pub route: String,
}

fn request_histogram() -> Histogram {
    // 50us .. ~1.6s: the API answers from memory.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

const LEASES_ACTIVE: &str = "proxy_operator_leases_active";
const SITE_COOLDOWNS: &str = "proxy_operator_lease_site_cooldowns";
const COPY_AGE: &str = "proxy_operator_lease_copy_age_seconds";

/// Series written by the discovery and lease API.
#[derive(Clone)]
pub struct DiscoveryMetrics {
    requests: Family<RouteLabels, Counter>,
    duration: HistogramFamily<RouteLabel>,
    lease_events: Family<EventLabel, Counter>,
    forwarded: Family<OutcomeLabel, Counter>,
    feed_answers: Family<KindLabel, Counter>,
    copy_lag: Histogram,
    copy_behind: Histogram,
    leases_active: Scraped<i64>,
    site_cooldowns: Scraped<i64>,
    copy_age: Scraped<i64>,
    token_reload_failures: Counter,
    told_dropped: Counter,
    tokens_last_reload_successful: Gauge,
    token_clients: Gauge,
    lease_key_shared: Gauge,
}

impl DiscoveryMetrics {
    /// The families, registered in `registry`; the active-lease gauge is a
    /// collector (it prints after every registered family).
    pub fn register(registry: &mut Registrar) -> Self {
        let m = DiscoveryMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(request_histogram as fn() -> Histogram),
            lease_events: Family::default(),
            forwarded: Family::default(),
            feed_answers: Family::default(),
            // 0.5 ms … ~8 s.
            copy_lag: Histogram::new(exponential_buckets(0.0005, 2.0, 15)),
            // 1 … 262,144 changes (the log's length).
            copy_behind: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            leases_active: Scraped::default(),
            site_cooldowns: Scraped::default(),
            copy_age: Scraped::default(),
            token_reload_failures: Counter::default(),
            told_dropped: Counter::default(),
            tokens_last_reload_successful: Gauge::default(),
            token_clients: Gauge::default(),
            lease_key_shared: Gauge::default(),
        };
        registry.register(
            "proxy_operator_discovery_requests",
            "Discovery API requests by route pattern and status",
            m.requests.clone(),
        );
        registry.register(
            "proxy_operator_discovery_request_duration_seconds",
            "Discovery API request latency by route pattern",
            m.duration.clone(),
        );
        registry.register(
            "proxy_operator_lease_events",
            "Lease outcomes: granted, refused, renewed, released, expired, readmitted (another leader's lease taken in) and readmit_refused (its proxy had no room), and reported ok, blocked or failed",
            m.lease_events.clone(),
        );
        registry.register(
            "proxy_operator_discovery_forwarded",
            "Lease calls a follower sent to the leader, by outcome: relayed, or answered 503 because of no_leader, not_leader, unreachable, timeout, unverified (the Lease names an unsealed URL) or refused (the leader refused the forward signature)",
            m.forwarded.clone(),
        );
        registry.register(
            "proxy_operator_lease_feed_answers",
            "Lease-table answers the leader sent to followers and gateways, by kind: delta (what changed since the copy they hold) or whole (the table, to a member that joins or that the change log no longer covers)",
            m.feed_answers.clone(),
        );
        registry.register(
            "proxy_operator_lease_copy_lag_seconds",
            "How old the oldest change in each delta of the leader's lease table was when this follower or gateway had taken it in (the leader's clock when it was made to this process's when taken)",
            m.copy_lag.clone(),
        );
        registry.register(
            "proxy_operator_lease_copy_behind_changes",
            "Changes each delta of the leader's lease table carried: how many versions this follower's or gateway's copy was behind when the leader answered",
            m.copy_behind.clone(),
        );
        registry.register(
            "proxy_operator_gateway_leader_messages_dropped",
            "Cooldowns and failed upstreams this process's gateway could not queue for the leader (1,024 wait at most, the same message once): the cooldown holds on this replica until its next copy of the lease table, and a failed upstream is found by its next probe",
            m.told_dropped.clone(),
        );
        registry.register(
            "proxy_operator_discovery_token_reload_failures",
            "Contents of the discovery tokens Secret that were refused (an empty token, a bad client name, a token shared by two clients); the last good tokens stayed in force",
            m.token_reload_failures.clone(),
        );
        registry.register(
            "proxy_operator_discovery_tokens_last_reload_successful",
            "1 when the discovery tokens Secret as it is now is the set in force, 0 while a refused content waits to be fixed",
            m.tokens_last_reload_successful.clone(),
        );
        registry.register(
            "proxy_operator_discovery_token_clients",
            "Named clients whose tokens the discovery API accepts now",
            m.token_clients.clone(),
        );
        registry.register(
            "proxy_operator_lease_key_shared",
            "1 when lease ids are signed with the key every replica shares (the lease key Secret), 0 when with a key of this process only (the Secret is forbidden or absent): leases then do not survive a restart or a leader change",
            m.lease_key_shared.clone(),
        );
        // No Secret, or none read yet: nothing was refused.
        m.tokens_last_reload_successful.set(1);
        registry.register_collector(
            &[LEASES_ACTIVE],
            ScrapedGauge(LEASES_ACTIVE, LEASES_ACTIVE_HELP, m.leases_active.clone()),
        );
        registry.register_collector(
            &[SITE_COOLDOWNS],
            ScrapedGauge(
                SITE_COOLDOWNS,
                SITE_COOLDOWNS_HELP,
                m.site_cooldowns.clone(),
            ),
        );
        registry.register_collector(
            &[COPY_AGE],
            ScrapedGauge(COPY_AGE, COPY_AGE_HELP, m.copy_age.clone()),
        );
        m
    }

    /// Where `proxy_operator_lease_copy_age_seconds` is read from (the
    /// replicas' copy of the leader's table); it reads 0 until set.
    pub fn set_copy_age(&self, f: impl Fn() -> i64 + Send + Sync + 'static) {
        self.copy_age.set(f);
    }

    /// Where `proxy_operator_leases_active` is read from (the lease store);
    /// it reads 0 until set.
    pub fn set_leases(&self, f: impl Fn() -> i64 + Send + Sync + 'static) {
        self.leases_active.set(f);
    }

    /// Where `proxy_operator_lease_site_cooldowns` is read from (the lease
    /// store); it reads 0 until set.
    pub fn set_site_cooldowns(&self, f: impl Fn() -> i64 + Send + Sync + 'static) {
        self.site_cooldowns.set(f);
    }

    /// Records one request.
    pub fn observe_request(&self, route: &str, status: u16, client: &str, took: Duration) {
        self.requests
            .get_or_create(&RouteLabels {
                route: route.to_string(),
                status: status.to_string(),
                client: if client.is_empty() { "none" } else { client }.to_string(),
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabel {
                route: route.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one lease call a follower forwarded (or could not).
    pub fn forwarded(&self, outcome: &str) {
        self.forwarded
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Counts one message the gateway could not queue for the leader.
    pub fn told_dropped(&self) {
        self.told_dropped.inc();
    }

    /// One delta of the leader's table taken into this replica's copy:
    /// its oldest change `lag_secs` old, `behind` changes in it.
    pub fn copy_delta(&self, lag_secs: f64, behind: u64) {
        self.copy_lag.observe(lag_secs);
        self.copy_behind.observe(behind as f64);
    }

    /// Counts one lease-table answer to a follower or gateway.
    pub fn feed_answer(&self, kind: &str) {
        self.feed_answers
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// The tokens in force are now those of `clients` clients.
    pub fn tokens_applied(&self, clients: usize) {
        self.token_clients
            .set(i64::try_from(clients).unwrap_or(i64::MAX));
        self.tokens_last_reload_successful.set(1);
    }

    /// Lease ids are signed with the shared key (`true`) or one of this
    /// process only.
    pub fn lease_key(&self, shared: bool) {
        self.lease_key_shared.set(i64::from(shared));
    }

    /// A content of the tokens Secret was refused.
    pub fn tokens_refused(&self) {
        self.token_reload_failures.inc();
        self.tokens_last_reload_successful.set(0);
    }

    /// Counts one lease event.
    pub fn lease_event(&self, event: &str, n: u64) {
        if n > 0 {
            self.lease_events
                .get_or_create(&EventLabel {
                    event: event.to_string(),
                })
                .inc_by(n);
        }
    }
}

const LEASES_ACTIVE_HELP: &str = "Leases currently held by clients";
const COPY_AGE_HELP: &str = "Seconds since the leader last answered this replica's copy of its lease table (0 while this replica leads, -1 before a first answer); past 10 the copy is stale and the gateway withholds no proxy by the leases in it";
const SITE_COOLDOWNS_HELP: &str = "Site cooldown entries the lease store holds (a proxy and a site each, withheld from the clients that reported it or from everyone once enough clients agreed); bounded by 50,000, 1,000 per proxy and 1,000 reports per client";

/// A gauge asked of the lease store at each scrape: (name, help, source).
#[derive(Debug)]
struct ScrapedGauge(&'static str, &'static str, Scraped<i64>);

impl Collector for ScrapedGauge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        ConstGauge::new(self.2.read().unwrap_or(0)).encode(encoder.encode_descriptor(
            self.0,
            self.1,
            None,
            MetricType::Gauge,
        )?)
    }
}
