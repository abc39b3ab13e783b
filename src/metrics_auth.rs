//! Secure `/metrics`, as controller-runtime serves it: HTTPS, and each
//! scrape's bearer token authenticated by a TokenReview and authorized by a
//! SubjectAccessReview (non-resource URL `/metrics`, verb `get`) on the API
//! server. Prometheus scrapes every 15 s or so with the same token, so
//! verdicts are kept for a short while in a small bounded cache (keyed by
//! the token's SHA-256, never the token itself).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use crate::provider::error::plain_message;

/// How long a verdict is reused (controller-runtime's authorizer keeps an
/// allow for minutes; a revoked binding takes effect within this).
pub const VERDICT_TTL: Duration = Duration::from_secs(60);
/// Distinct tokens remembered at once: a few scrapers, with room to spare.
pub const CACHE_ENTRIES: usize = 64;
/// The certificate and key file names in `--metrics-cert-dir` (those of a
/// `kubernetes.io/tls` Secret mounted as a volume).
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// What the API server decided about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated, and the user may get `/metrics`.
    Allowed,
    /// The token is not valid (or there is none).
    Unauthenticated,
    /// Valid, but the user may not get `/metrics`.
    Forbidden { user: String },
}

/// The API server could not be asked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(String);

/// The bearer token of an `Authorization` header value, if it has one.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The answer for a scrape that is not let through.
pub fn refusal(outcome: &Result<Verdict, Unavailable>) -> Option<(StatusCode, String)> {
    match outcome {
        Ok(Verdict::Allowed) => None,
        Ok(Verdict::Unauthenticated) => Some((
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n".into(),
        )),
        Ok(Verdict::Forbidden { user }) => Some((
            StatusCode::FORBIDDEN,
            format!("{user} may not get /metrics (bind it to the metrics-reader ClusterRole)\n"),
        )),
        Err(e) => Some((
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot check the token with the API server: {e}\n"),
        )),
    }
}

/// Verdicts by token digest, each for [`VERDICT_TTL`], at most `cap` of
/// them: a full cache first drops expired entries, then the oldest.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<[u8; 32], (Verdict, Instant)>,
    ttl: Duration,
    cap: usize,
}

impl Cache {
    pub fn new(ttl: Duration, cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            ttl,
            cap,
        }
    }

    pub fn get(&self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        let (v, at) = self.entries.get(key)?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| v.clone())
    }

    pub fn put(&mut self, key: [u8; 32], verdict: Verdict, now: Instant) {
        if self.entries.len() >= self.cap && !self.entries.contains_key(&key) {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
            if self.entries.len() >= self.cap {
                let oldest = self.entries.iter().min_by_key(|(_, (_, at))| *at);
                if let Some(k) = oldest.map(|(k, _)| *k) {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(key, (verdict, now));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Asks the API server about scrape tokens (the operator's own client).
pub struct Reviewer {
    client: kube::Client,
    cache: Mutex<Cache>,
}

impl Reviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::new(Cache::new(VERDICT_TTL, CACHE_ENTRIES)),
        }
    }

    /// The verdict for `token`: cached, or a TokenReview then (when
    /// authenticated) a SubjectAccessReview. An unreachable API server is
    /// not cached, so the next scrape asks again.
    #[tracing::instrument(name = "metrics_auth", skip_all)]
    pub async fn review(&self, token: &str) -> Result<Verdict, Unavailable> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cached = self
            .cache
            .lock()
            .ok()
            .and_then(|c| c.get(&key, Instant::now()));
        if let Some(v) = cached {
            return Ok(v);
        }
        let verdict = self.ask(token).await?;
        if let Ok(mut c) = self.cache.lock() {
            c.put(key, verdict.clone(), Instant::now());
        }
        Ok(verdict)
    }

    async fn ask(&self, token: &str) -> Result<Verdict, Unavailable> {
        let unavailable = |e: kube::Error| Unavailable(plain_message(&e));
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(unavailable)?;
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            debug!(
                reason = status.error.as_deref().unwrap_or(""),
                "Metrics scrape token not authenticated"
            );
            return Ok(Verdict::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(unavailable)?;
        if decided.status.is_some_and(|s| s.allowed) {
            Ok(Verdict::Allowed)
        } else {
            debug!(user = %name, "Metrics scrape forbidden");
            Ok(Verdict::Forbidden { user: name })
        }
    }
}

/// Lets a request through only when its token passes [`Reviewer::review`].
pub async fn authorize(
    State(reviewer): State<Arc<Reviewer>>,
    req: Request,
    next: Next,
) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let outcome = match bearer(auth) {
        None => Ok(Verdict::Unauthenticated),
        Some(token) => reviewer.review(token).await,
    };
    if let Err(e) = &outcome {
        warn!(error = %e, "Cannot authorize a metrics scrape: the API server did not answer");
    }
    match refusal(&outcome) {
        None => next.run(req).await,
        Some((status, text)) => {
            (status, [(header::CONTENT_TYPE, "text/plain")], text).into_response()
        }
    }
}

/// A `--metrics-cert-dir` or self-signed certificate problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--metrics-cert-dir: {file}: {reason}")]
    File { file: String, reason: String },
    #[error("--metrics-cert-dir: {0}")]
    Config(String),
    #[error("generating the self-signed metrics certificate: {0}")]
    Generate(String),
}

/// The metrics server's TLS settings: the certificate and key in `dir`
/// (PEM [`CERT_FILE`] and [`KEY_FILE`]) or, without one, a self-signed
/// certificate made now (scrapers skip verification, as kubebuilder's
/// ServiceMonitor does).
pub fn server_config(dir: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain, key) = match dir {
        Some(dir) => read_pair(dir)?,
        None => self_signed()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("the certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_pair(
    dir: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let fail = |file: &str, reason: String| TlsError::File {
        file: dir.join(file).display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(dir.join(CERT_FILE))
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| fail(CERT_FILE, e.to_string()))?;
    if chain.is_empty() {
        return Err(fail(CERT_FILE, "no PEM certificate in it".into()));
    }
    // The key's own error text never quotes the key.
    let key = PrivateKeyDer::from_pem_file(dir.join(KEY_FILE))
        .map_err(|e| fail(KEY_FILE, e.to_string()))?;
    Ok((chain, key))
}

fn self_signed() -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let names = vec!["localhost".to_string()];
    let made =
        rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Generate(e.to_string()))?;
    let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    Ok((vec![made.cert.der().clone()], PrivateKeyDer::Pkcs8(key)))
}

#[cfg(test)]
#[path = "metrics_auth_tests.rs"]
mod tests;
