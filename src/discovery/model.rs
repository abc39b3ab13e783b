//! Wire types of the discovery and lease API and the pure rules behind
//! them: which Proxies are listed, and how filters match.

use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::credentials::Sensitive;
use crate::lease::demand::Shape;
use crate::lease::ProxyKey;

/// A healthy proxy a crawler may use: connect to `url` (`http://ip:port`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyItem {
    /// Proxy object name.
    pub name: String,
    /// Proxy object namespace.
    pub namespace: String,
    /// Address to connect to.
    pub ip: String,
    /// Port to connect to.
    pub port: u16,
    /// `http://ip:port`; in a lease's answer, with `username:password@`
    /// when the proxy takes credentials: ready for a client's proxy
    /// setting. `GET /v1/proxies` never carries a password.
    #[schema(value_type = String)]
    pub url: Sensitive,
    /// The username the proxy asks for (HTTP Basic, `Proxy-Authorization`);
    /// absent when it takes none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Its password, in a lease's answer only; absent when it takes none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub password: Option<Sensitive>,
    /// `Managed` or `External`.
    pub mode: String,
    /// Provider name (Managed); absent for External proxies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Placement zone, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Placement region, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The ProxyPool it belongs to (its `crawl.example.com/pool` label),
    /// when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// `spec.attributes`.
    pub attributes: BTreeMap<String, String>,
    /// The Proxy object's labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Probe latency of the last status-affecting result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_millis: Option<i64>,
}

impl ProxyItem {
    /// The lease store's key.
    pub fn key(&self) -> ProxyKey {
        ProxyKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// `GET /v1/proxies`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProxyList {
    /// Healthy proxies matching the filters, sorted by namespace and name.
    pub items: Vec<ProxyItem>,
}

/// Filters, ANDed. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Filters {
    /// Provider name (exact).
    #[serde(default)]
    pub provider: Option<String>,
    /// Placement zone (exact).
    #[serde(default)]
    pub zone: Option<String>,
    /// Placement region (exact).
    #[serde(default)]
    pub region: Option<String>,
    /// Every key must be present in `spec.attributes` with this value.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// The Proxy's namespace (exact).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The ProxyPool the proxy belongs to (exact).
    #[serde(default)]
    pub pool: Option<String>,
    /// A label selector on the Proxy object, as `kubectl -l` takes it
    /// (`tier=gold,team in (a,b),!canary`).
    #[serde(default)]
    #[schema(
        pattern = "^( *(![A-Za-z0-9._/-]*[A-Za-z0-9._-]|[A-Za-z0-9._/-]*[A-Za-z0-9._-] *(==?|!=) *[A-Za-z0-9._-]*|[A-Za-z0-9._/-]*[A-Za-z0-9._-] +(in|notin) +\\( *[A-Za-z0-9._-]*( *, *[A-Za-z0-9._-]*)* *\\)|[A-Za-z0-9._/-]*[A-Za-z0-9._-]) *(, *(![A-Za-z0-9._/-]*[A-Za-z0-9._-]|[A-Za-z0-9._/-]*[A-Za-z0-9._-] *(==?|!=) *[A-Za-z0-9._-]*|[A-Za-z0-9._/-]*[A-Za-z0-9._-] +(in|notin) +\\( *[A-Za-z0-9._-]*( *, *[A-Za-z0-9._-]*)* *\\)|[A-Za-z0-9._/-]*[A-Za-z0-9._-]) *)*)?$"
    )]
    pub label_selector: Option<String>,
}

/// Query parameters of `GET /v1/proxies` (documentation; parsed by hand
/// because `attr` repeats).
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ListQuery {
    /// Provider name (exact).
    provider: Option<String>,
    /// Placement zone (exact).
    zone: Option<String>,
    /// Placement region (exact).
    region: Option<String>,
    /// The Proxy's namespace (exact).
    namespace: Option<String>,
    /// The ProxyPool the proxy belongs to (exact).
    pool: Option<String>,
    /// A label selector on the Proxy object, as `kubectl -l` takes it.
    #[param(
        rename = "labelSelector",
        pattern = "^( *(![A-Za-z0-9._/-]*[A-Za-z0-9._-]|[A-Za-z0-9._/-]*[A-Za-z0-9._-] *(==?|!=) *[A-Za-z0-9._-]*|[A-Za-z0-9._/-]*[A-Za-z0-9._-] +(in|notin) +\\( *[A-Za-z0-9._-]*( *, *[A-Za-z0-9._-]*)* *\\)|[A-Za-z0-9._/-]*[A-Za-z0-9._-]) *(, *(![A-Za-z0-9._/-]*[A-Za-z0-9._-]|[A-Za-z0-9._/-]*[A-Za-z0-9._-] *(==?|!=) *[A-Za-z0-9._-]*|[A-Za-z0-9._/-]*[A-Za-z0-9._-] +(in|notin) +\\( *[A-Za-z0-9._-]*( *, *[A-Za-z0-9._-]*)* *\\)|[A-Za-z0-9._/-]*[A-Za-z0-9._-]) *)*)?$"
    )]
    label_selector: Option<String>,
    /// `key:value` (or `key=value`) that `spec.attributes` must hold;
    /// repeat for several, all must match.
    #[param(pattern = "^[^:=]+[:=]")]
    attr: Option<Vec<String>>,
}

/// `POST /v1/leases`. Every field is optional; an empty body is `{}`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AcquireBody {
    /// Lease length in seconds, 1..=--max-lease-ttl; default
    /// --default-lease-ttl.
    #[serde(default, deserialize_with = "whole_seconds")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub ttl_seconds: Option<Seconds>,
    /// Which proxies qualify.
    #[serde(default)]
    pub filters: Filters,
    /// Same key, same proxy while it stays healthy and has capacity.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[ -~]+$")]
    pub sticky_key: Option<String>,
    /// The site to be crawled: proxies cooling down for it are skipped.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[ -~]+$")]
    pub site: Option<String>,
}

/// `POST /v1/leases/{id}/renew`; an empty body is `{}`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RenewBody {
    /// New lease length from now, as for acquire.
    #[serde(default, deserialize_with = "whole_seconds")]
    #[schema(value_type = Option<i64>, minimum = 1)]
    pub ttl_seconds: Option<Seconds>,
}

/// `POST /v1/leases/{id}/report`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReportBody {
    /// `ok`, `blocked` or `failed`.
    #[schema(value_type = ReportResult)]
    pub result: String,
    /// The site concerned: the cooldown then applies to it only.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[ -~]+$")]
    pub site: Option<String>,
}

/// `POST /v1/sessions/{session}/report`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionReportBody {
    /// `ok`, `blocked` or `failed`.
    #[schema(value_type = ReportResult)]
    pub result: String,
    /// The site concerned: the cooldown then applies to it only.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[ -~]+$")]
    pub site: Option<String>,
    /// The gateway username the session uses (`<client>-session-<id>...`):
    /// with it, a gateway replica that has not carried the session finds
    /// its upstream the way the gateway chooses one.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 256, pattern = "^[ -~]+$")]
    pub username: Option<String>,
}

/// How a leased proxy did (documentation of `ReportBody.result`; parsed
/// by hand so an unknown value answers 400 `invalid_result`).
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum ReportResult {
    /// It worked.
    Ok,
    /// The site blocked it.
    Blocked,
    /// It failed (connect errors, timeouts).
    Failed,
}

/// A TTL as sent: a whole number of seconds, possibly out of range (the
/// range is checked against the flags, answering 400 `invalid_ttl`).
/// Large values saturate so they are reported as too long, not as a type
/// error.
pub type Seconds = i64;

/// Accepts a JSON integer, or a float with no fractional part (`60.0`, as
/// JSON Schema counts it an integer); anything else is a type error.
fn whole_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Seconds>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(i) = n.as_i64() {
        return Ok(Some(i));
    }
    if n.as_u64().is_some() {
        return Ok(Some(i64::MAX));
    }
    match n.as_f64() {
        // `as` saturates: 1e300 becomes i64::MAX, reported as too long.
        Some(f) if f.is_finite() && f.fract() == 0.0 => Ok(Some(f as i64)),
        _ => Err(D::Error::custom(format!(
            "ttlSeconds must be a whole number of seconds, got {n}"
        ))),
    }
}

/// A lease.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseResponse {
    /// Lease id (opaque).
    pub id: String,
    /// The leased proxy.
    pub proxy: ProxyItem,
    /// RFC 3339 time the lease ends unless renewed.
    pub expires_at: String,
    /// The lease length granted.
    pub ttl_seconds: u64,
}

/// Every error.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Machine code and human message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine code, e.g. `unknown_lease`.
    pub code: String,
    /// Human explanation.
    pub message: String,
}

/// [`Filters`] ready to match: the label selector parsed once a request.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    f: Filters,
    selector: Option<Selector>,
}

impl Filter {
    /// Checks and compiles `f`; a malformed label selector is refused
    /// with the requirement at fault.
    pub fn new(f: Filters) -> Result<Self, String> {
        let selector = f
            .label_selector
            .as_deref()
            .map(super::selector::parse)
            .transpose()?;
        Ok(Filter { f, selector })
    }

    /// The filters as asked.
    pub fn filters(&self) -> &Filters {
        &self.f
    }

    /// Whether it matches every proxy (no filter asked).
    pub fn is_empty(&self) -> bool {
        self.f == Filters::default()
    }

    /// Whether `item` passes every filter.
    pub fn matches(&self, item: &ProxyItem) -> bool {
        self.matches_fields(Fields {
            provider: item.provider.as_ref(),
            zone: item.zone.as_ref(),
            region: item.region.as_ref(),
            namespace: &item.namespace,
            pool: item.pool.as_ref(),
            attributes: &item.attributes,
            labels: &item.labels,
        })
    }

    /// Whether a new Proxy of a pool (`shape`, from its template) would
    /// pass every filter: only then is a refusal demand on that pool.
    pub fn could_match(&self, shape: &Shape) -> bool {
        self.matches_fields(Fields {
            provider: shape.provider.as_ref(),
            zone: shape.zone.as_ref(),
            region: shape.region.as_ref(),
            namespace: &shape.namespace,
            pool: Some(&shape.pool),
            attributes: &shape.attributes,
            labels: &shape.labels,
        })
    }

    fn matches_fields(&self, item: Fields<'_>) -> bool {
        let f = &self.f;
        let eq = |want: &Option<String>, have: Option<&String>| {
            want.as_ref().is_none_or(|w| have == Some(w))
        };
        eq(&f.provider, item.provider)
            && eq(&f.zone, item.zone)
            && eq(&f.region, item.region)
            && eq(&f.namespace, Some(item.namespace))
            && eq(&f.pool, item.pool)
            && f.attributes
                .iter()
                .all(|(k, v)| item.attributes.get(k) == Some(v))
            && self
                .selector
                .as_ref()
                .is_none_or(|s| s.matches(item.labels))
    }
}

/// What the filters look at, of a proxy or of a pool's next one.
struct Fields<'a> {
    provider: Option<&'a String>,
    zone: Option<&'a String>,
    region: Option<&'a String>,
    namespace: &'a String,
    pool: Option<&'a String>,
    attributes: &'a BTreeMap<String, String>,
    labels: &'a BTreeMap<String, String>,
}

/// Parses the list query: `provider`, `zone`, `region` once each, `attr`
/// repeated as `key:value` or `key=value`. Unknown or repeated parameters
/// are refused.
pub fn parse_query(q: Option<&str>) -> Result<Filters, String> {
    let mut f = Filters::default();
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        if v.is_empty() && k != "attr" {
            // `?zone=` is "no zone filter", as HTML forms send it.
            continue;
        }
        let once = |slot: &mut Option<String>| {
            if slot.is_some() {
                return Err(format!("query parameter {k:?} given twice"));
            }
            *slot = Some(v.to_string());
            Ok(())
        };
        match k.as_ref() {
            "provider" => once(&mut f.provider)?,
            "zone" => once(&mut f.zone)?,
            "region" => once(&mut f.region)?,
            "namespace" => once(&mut f.namespace)?,
            "pool" => once(&mut f.pool)?,
            "labelSelector" => once(&mut f.label_selector)?,
            "attr" => {
                let Some(i) = v.find([':', '=']) else {
                    return Err(format!("attr must be key:value or key=value, got {v:?}"));
                };
                let (key, val) = (&v[..i], &v[i + 1..]);
                if key.is_empty() {
                    return Err(format!("attr has an empty key: {v:?}"));
                }
                f.attributes.insert(key.to_string(), val.to_string());
            }
            other => {
                return Err(format!(
                    "unknown query parameter {other:?} (use provider, zone, region, namespace, labelSelector, attr)"
                ))
            }
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Proxy, ProxyPhase};
    use crate::discovery::item::item_of;
    use crate::tenancy::ExternalNamespaces;
    use kube::ResourceExt;
    use serde_json::json;

    fn proxy(v: serde_json::Value) -> Proxy {
        serde_json::from_value(v).unwrap()
    }

    fn ready(name: &str, spec: serde_json::Value, healthy: &str) -> Proxy {
        proxy(
            json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
            "status": {"phase": "Ready", "ip": "127.0.0.9", "conditions": [{"type": "Healthy",
                "status": healthy, "reason": "ProbeSucceeded", "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}),
        )
    }

    fn any() -> ExternalNamespaces {
        ExternalNamespaces::Any
    }

    #[test]
    fn external_proxies_are_offered_only_from_allowed_namespaces() {
        struct Case {
            name: &'static str,
            spec: serde_json::Value,
            allowed: ExternalNamespaces,
            listed: bool,
        }
        let external = json!({"mode": "External", "endpoint": {"host": "127.0.0.9", "port": 8080}});
        let managed = json!({"provider": "k", "port": 3128});
        let cases = [
            Case {
                name: "External, its namespace allowed",
                spec: external.clone(),
                allowed: ExternalNamespaces::only(["ns"]),
                listed: true,
            },
            Case {
                name: "External, Ready and Healthy by its status, its namespace not allowed",
                spec: external.clone(),
                allowed: ExternalNamespaces::only(["crawl"]),
                listed: false,
            },
            Case {
                name: "External, nothing allowed",
                spec: external,
                allowed: ExternalNamespaces::only([]),
                listed: false,
            },
            Case {
                name: "Managed: the allowlist is for External only",
                spec: managed,
                allowed: ExternalNamespaces::only([]),
                listed: true,
            },
        ];
        for c in cases {
            let p = ready("p", c.spec, "True");
            assert_eq!(
                item_of(&p, &c.allowed, &Default::default()).is_some(),
                c.listed,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn eligibility() {
        let ok = ready(
            "a",
            json!({"provider": "kubernetes", "port": 3128,
            "placement": {"zone": "z1", "region": "r1"}, "attributes": {"geo": "home"}}),
            "True",
        );
        let item = item_of(&ok, &any(), &Default::default()).unwrap();
        assert_eq!(item.url.expose(), "http://127.0.0.9:3128");
        assert_eq!(item.zone.as_deref(), Some("z1"));
        assert_eq!(item.provider.as_deref(), Some("kubernetes"));
        assert!(item_of(
            &ready("b", json!({"provider": "k", "port": 3128}), "False"),
            &any(),
            &Default::default()
        )
        .is_none());
        let ext = ready(
            "c",
            json!({"mode": "External", "endpoint": {"host": "127.0.0.9", "port": 8080}}),
            "True",
        );
        let e = item_of(&ext, &any(), &Default::default()).unwrap();
        assert_eq!(
            (e.port, e.provider.clone(), e.mode.as_str()),
            (8080, None, "External")
        );
        let mut running = ok.clone();
        running.status.as_mut().unwrap().phase = Some(ProxyPhase::Running);
        assert!(item_of(&running, &any(), &Default::default()).is_none());
        let mut draining = ok.clone();
        draining.status.as_mut().unwrap().draining_since = Some(chrono::Utc::now());
        assert!(
            item_of(&draining, &any(), &Default::default()).is_none(),
            "a draining proxy gets no new lease"
        );
        let json = serde_json::to_value(&item).unwrap();
        assert_eq!(json["attributes"]["geo"], "home");
        assert!(json.get("latencyMillis").is_none());
    }

    #[test]
    fn filters_and_queries() {
        let mut proxy = ready(
            "a",
            json!({"provider": "kubernetes", "port": 3128,
            "placement": {"zone": "z1"}, "attributes": {"geo": "home", "tier": "1"}}),
            "True",
        );
        proxy.labels_mut().insert("team".into(), "crawl".into());
        let item = item_of(&proxy, &any(), &Default::default()).unwrap();
        let cases: [(&str, Result<bool, ()>); 17] = [
            ("namespace=ns", Ok(true)),
            ("namespace=other", Ok(false)),
            ("labelSelector=team%3Dcrawl", Ok(true)),
            ("labelSelector=team+in+(crawl,seo),!canary", Ok(true)),
            ("labelSelector=team!%3Dcrawl", Ok(false)),
            ("labelSelector=team+in+crawl", Err(())),
            ("", Ok(true)),
            ("provider=kubernetes", Ok(true)),
            ("provider=gcp", Ok(false)),
            ("zone=z1&attr=geo:home", Ok(true)),
            ("attr=geo%3Dhome&attr=tier:1", Ok(true)),
            ("attr=geo:away", Ok(false)),
            ("region=r1", Ok(false)),
            ("attr=url:http://x", Ok(false)),
            ("attr=nocolon", Err(())),
            ("color=red", Err(())),
            ("zone=a&zone=b", Err(())),
        ];
        for (q, want) in cases {
            let got = parse_query(Some(q))
                .and_then(Filter::new)
                .map(|f| f.matches(&item))
                .map_err(|_| ());
            assert_eq!(got, want, "{q}");
        }
        let f = parse_query(Some("attr=url:http://x")).unwrap();
        assert_eq!(f.attributes["url"], "http://x");
    }
}
