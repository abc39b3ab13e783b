//! The provider error taxonomy: every error a provider returns is classified
//! once, at the provider edge, into one of five classes that the reconciler,
//! GC and the decorators branch on.

use std::error::Error as StdError;
use std::fmt;

/// A boxed error that can cross threads.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What the caller should do about a failed provider call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The instance does not exist (and no delete of it is in progress).
    NotFound,
    /// A quota or rate limit; retry after minutes, not milliseconds.
    QuotaExceeded,
    /// Network, 5xx, timeouts, cancellation, anything unknown: retry with backoff.
    Transient,
    /// Authentication or permission refused (cloud 401/403 that is not a
    /// quota, SSH key or host key rejected, libvirt auth): the provider
    /// cannot be used with these credentials right now. Nothing in a Proxy's
    /// spec fixes it and restoring the credentials does, so it is retried
    /// slowly and never latched.
    Unavailable,
    /// Bad config or argument, malformed ID: retrying cannot help until the
    /// spec or config changes.
    Permanent,
}

impl ErrorClass {
    /// Every class, for documentation checks.
    pub const ALL: [ErrorClass; 5] = [
        ErrorClass::NotFound,
        ErrorClass::QuotaExceeded,
        ErrorClass::Transient,
        ErrorClass::Unavailable,
        ErrorClass::Permanent,
    ];

    /// The `result` label of provider metrics and the `provider.result` span
    /// attribute for a call that failed with this class.
    pub fn metric_label(self) -> &'static str {
        match self {
            ErrorClass::NotFound => "not_found",
            ErrorClass::QuotaExceeded => "quota_exceeded",
            ErrorClass::Transient => "transient",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Permanent => "permanent",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorClass::NotFound => "not found",
            ErrorClass::QuotaExceeded => "quota exceeded",
            ErrorClass::Transient => "transient",
            ErrorClass::Unavailable => "unavailable",
            ErrorClass::Permanent => "permanent",
        })
    }
}

/// The provider operation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `create`
    Create,
    /// `get`
    Get,
    /// `delete`
    Delete,
    /// `list` (ListByTag)
    List,
}

impl Op {
    /// Lowercase name used in metrics labels and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Get => "get",
            Op::Delete => "delete",
            Op::List => "list",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified provider error: which provider (configured name), which
/// operation, which instance, what class, and the cause.
#[derive(Debug, thiserror::Error)]
pub struct ProviderError {
    class: ErrorClass,
    op: Op,
    provider: String,
    id: String,
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "provider {:?} {}", self.provider, self.op)?;
        if !self.id.is_empty() {
            write!(f, " {}", self.id)?;
        }
        write!(f, " ({})", self.class)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        if let Some(src) = &self.source {
            write!(f, ": {}", plain_message(src.as_ref()))?;
        }
        Ok(())
    }
}

impl ProviderError {
    /// An error of `class` with a message and no underlying cause.
    pub fn new(
        class: ErrorClass,
        op: Op,
        provider: &str,
        id: &str,
        message: impl Into<String>,
    ) -> Self {
        ProviderError {
            class,
            op,
            provider: provider.to_string(),
            id: id.to_string(),
            message: message.into(),
            source: None,
        }
    }

    /// Wraps `cause` with `class`, unless the cause chain already carries a
    /// class (a provider may pre-tag internal errors with [`Tagged`]): that
    /// class wins.
    pub fn wrap(
        class: ErrorClass,
        op: Op,
        provider: &str,
        id: &str,
        cause: impl Into<BoxError>,
    ) -> Self {
        let cause = cause.into();
        let class = class_in_chain(cause.as_ref()).unwrap_or(class);
        ProviderError {
            class,
            op,
            provider: provider.to_string(),
            id: id.to_string(),
            message: String::new(),
            source: Some(cause),
        }
    }

    /// Wraps `cause`, classifying it with `classify` unless it is pre-tagged.
    pub fn classify_with(
        op: Op,
        provider: &str,
        id: &str,
        cause: impl Into<BoxError>,
        classify: impl FnOnce(&(dyn StdError + 'static)) -> ErrorClass,
    ) -> Self {
        let cause = cause.into();
        let class = class_in_chain(cause.as_ref()).unwrap_or_else(|| classify(cause.as_ref()));
        Self::wrap(class, op, provider, id, cause)
    }

    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        self.class
    }
    /// The operation that failed.
    pub fn op(&self) -> Op {
        self.op
    }
    /// The configured provider name.
    pub fn provider(&self) -> &str {
        &self.provider
    }
    /// The providerID, empty when none was known.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Whether this error is of `class`.
    pub fn is(&self, class: ErrorClass) -> bool {
        self.class == class
    }
    /// The underlying backend error, if any, downcast to `E`.
    pub fn cause<E: StdError + 'static>(&self) -> Option<&E> {
        let mut cur: Option<&(dyn StdError + 'static)> = self.source.as_deref().map(|e| e as _);
        while let Some(e) = cur {
            if let Some(found) = e.downcast_ref::<E>() {
                return Some(found);
            }
            cur = e.source();
        }
        None
    }
}

/// A provider-internal error tagged with a class before it reaches the
/// provider edge (e.g. a placement error that is Permanent by nature).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Tagged {
    /// The class the edge must keep.
    pub class: ErrorClass,
    /// What went wrong, naming the field and value where there is one.
    pub message: String,
}

impl Tagged {
    /// A tagged error.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Tagged {
            class,
            message: message.into(),
        }
    }
    /// A Permanent error.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Permanent, message)
    }
}

/// The first class found along an error's cause chain.
fn class_in_chain(err: &(dyn StdError + 'static)) -> Option<ErrorClass> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(p) = e.downcast_ref::<ProviderError>() {
            return Some(p.class);
        }
        if let Some(t) = e.downcast_ref::<Tagged>() {
            return Some(t.class);
        }
        cur = e.source();
    }
    None
}

/// The class of any error: the class it carries, or Transient when it
/// carries none (unknown errors are retried, the safe default).
pub fn class_of(err: &(dyn StdError + 'static)) -> ErrorClass {
    class_in_chain(err).unwrap_or(ErrorClass::Transient)
}

/// An error as a user reads it in a status message, condition, Event or
/// log line: never a `Debug` dump.
///
/// A Kubernetes API error is the API server's own message (`secrets "ci" is
/// forbidden: User "..." cannot get resource "secrets" ...`), not kube's
/// `Display`, which appends the whole `Status` in `Debug` form. Any other
/// error is its `Display` followed by its causes, joined with `": "`; a
/// `Display` that already ends with its cause (the `"{context}: {source}"`
/// convention) is not repeated, and its cause's text is rewritten the same
/// way, so an API error deep in a chain still reads plainly.
pub fn plain_message(err: &(dyn StdError + 'static)) -> String {
    if let Some(status) = api_status(err) {
        return status_text(status);
    }
    let text = err.to_string();
    let Some(cause) = err.source() else {
        return text;
    };
    if let Some(status) = api_status(cause) {
        // A wrapper that shows kube's API error text but hands on its
        // `Status` as the cause (`#[error(transparent)]` over `kube::Error`).
        let kube_text = format!("ApiError: {status} ({status:?})");
        if let Some(head) = text.strip_suffix(kube_text.as_str()) {
            return format!("{head}{}", status_text(status));
        }
    }
    let rest = plain_message(cause);
    let raw = cause.to_string();
    if let Some(head) = text.strip_suffix(raw.as_str()) {
        // `#[error(transparent)]` (head empty) or `"{context}: {source}"`.
        return format!("{head}{rest}");
    }
    if text.ends_with(rest.as_str()) {
        return text;
    }
    format!("{text}: {rest}")
}

/// The `Status` of a Kubernetes API error, at `err` itself (kube's
/// `Error::Api`, or the `Status` it carries as its source).
fn api_status<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a kube::core::Status> {
    if let Some(kube::Error::Api(s)) = err.downcast_ref::<kube::Error>() {
        return Some(s);
    }
    if let Some(s) = err.downcast_ref::<kube::core::Status>() {
        return Some(s);
    }
    err.downcast_ref::<Box<kube::core::Status>>().map(|b| &**b)
}

/// The API server's message, or what there is of it.
fn status_text(s: &kube::core::Status) -> String {
    if !s.message.is_empty() {
        s.message.clone()
    } else if !s.reason.is_empty() {
        format!("{} (HTTP {})", s.reason, s.code)
    } else {
        format!("the API server answered HTTP {}", s.code)
    }
}

/// The metrics/tracing result label of a call outcome.
pub fn result_label<T>(res: &Result<T, ProviderError>) -> &'static str {
    match res {
        Ok(_) => "ok",
        Err(e) => e.class().metric_label(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("http 403: quotaExceeded")]
    struct SdkError {
        status: u16,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[source] Tagged);

    #[test]
    fn class_of_table() {
        let io = std::io::Error::other("boom");
        let cases: Vec<(&str, Box<dyn StdError + 'static>, ErrorClass)> = vec![
            (
                "unclassified is transient",
                Box::new(io),
                ErrorClass::Transient,
            ),
            (
                "provider error keeps its class",
                Box::new(ProviderError::new(
                    ErrorClass::Permanent,
                    Op::Create,
                    "gcp-eu",
                    "",
                    "bad zone",
                )),
                ErrorClass::Permanent,
            ),
            (
                "tagged",
                Box::new(Tagged::new(ErrorClass::QuotaExceeded, "pool full")),
                ErrorClass::QuotaExceeded,
            ),
            (
                "tag deeper in the chain",
                Box::new(Outer(Tagged::new(ErrorClass::NotFound, "gone"))),
                ErrorClass::NotFound,
            ),
        ];
        for (name, err, want) in cases {
            assert_eq!(class_of(err.as_ref()), want, "{name}");
        }
    }

    #[test]
    fn wrap_honours_pretagged_class_and_keeps_the_cause() {
        let e = ProviderError::wrap(
            ErrorClass::Transient,
            Op::Create,
            "kvm-home",
            "",
            Tagged::permanent("placement.machineType \"huge\" is not in kvm.machineTypes"),
        );
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.cause::<Tagged>().is_some());

        let e = ProviderError::classify_with(
            Op::Get,
            "gcp-eu",
            "zones/z/instances/n",
            SdkError { status: 403 },
            |err| match err.downcast_ref::<SdkError>() {
                Some(s) if s.status == 403 => ErrorClass::QuotaExceeded,
                _ => ErrorClass::Transient,
            },
        );
        assert!(e.is(ErrorClass::QuotaExceeded));
        assert_eq!(e.cause::<SdkError>().map(|s| s.status), Some(403));
        // A wrapped provider error is itself classified.
        let outer = ProviderError::wrap(ErrorClass::Transient, Op::Get, "x", "", e);
        assert_eq!(outer.class(), ErrorClass::QuotaExceeded);
    }

    #[test]
    fn message_names_provider_op_id_and_cause() {
        let e = ProviderError::wrap(
            ErrorClass::Transient,
            Op::Delete,
            "gcp-eu",
            "zones/a/instances/b",
            std::io::Error::other("reset"),
        );
        let s = e.to_string();
        for part in [
            "gcp-eu",
            "delete",
            "zones/a/instances/b",
            "transient",
            "reset",
        ] {
            assert!(s.contains(part), "{s} lacks {part}");
        }
        assert_eq!(e.provider(), "gcp-eu");
        assert_eq!(e.op(), Op::Delete);
        assert_eq!(e.id(), "zones/a/instances/b");
    }

    fn forbidden() -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code: 403,
            message: "secrets \"ci\" is forbidden: User \"system:serviceaccount:egress-proxies-operator-system:controller-manager\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\"".into(),
            reason: "Forbidden".into(),
            metadata: None,
            details: None,
        }))
    }

    const FORBIDDEN: &str = "secrets \"ci\" is forbidden: User \"system:serviceaccount:egress-proxies-operator-system:controller-manager\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\"";

    /// A context whose Display ends with its source (the thiserror habit).
    #[derive(Debug, thiserror::Error)]
    #[error("reading Secret \"ci\": {0}")]
    struct WithSource(#[source] kube::Error);

    /// A context whose Display leaves the source out.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Leaf(&'static str);
    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Chain {
        text: &'static str,
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error(transparent)]
    struct Transparent(#[from] kube::Error);

    #[test]
    fn plain_message_table() {
        let chain = Chain {
            text: "creating Pod",
            source: Box::new(Chain {
                text: "connecting",
                source: Box::new(Leaf("connection refused")),
            }),
        };
        let cases: Vec<(&str, Box<dyn StdError + 'static>, String)> = vec![
            (
                "an API error is the server's message",
                Box::new(forbidden()),
                FORBIDDEN.into(),
            ),
            (
                "an API error without a message",
                Box::new(kube::Error::Api(Box::new(kube::core::Status {
                    code: 503,
                    reason: "ServiceUnavailable".into(),
                    ..Default::default()
                }))),
                "ServiceUnavailable (HTTP 503)".into(),
            ),
            (
                "a context that embeds its API error",
                Box::new(WithSource(forbidden())),
                format!("reading Secret \"ci\": {FORBIDDEN}"),
            ),
            (
                "transparent",
                Box::new(Transparent(forbidden())),
                FORBIDDEN.into(),
            ),
            (
                "a source chain is joined with ': '",
                Box::new(chain),
                "creating Pod: connecting: connection refused".into(),
            ),
            (
                "a provider error around an API error",
                Box::new(ProviderError::wrap(
                    ErrorClass::Permanent,
                    Op::Create,
                    "kubernetes",
                    "default/proxy-x",
                    forbidden(),
                )),
                format!("provider \"kubernetes\" create default/proxy-x (permanent): {FORBIDDEN}"),
            ),
            ("a plain error", Box::new(Leaf("boom")), "boom".into()),
            (
                "a non-API kube error keeps its Display",
                Box::new(kube::Error::LinesCodecMaxLineLengthExceeded),
                "Error finding newline character".into(),
            ),
        ];
        for (name, err, want) in cases {
            let got = plain_message(err.as_ref());
            assert_eq!(got, want, "{name}");
            for dump in ["Status {", "Some(", "Failure"] {
                assert!(!got.contains(dump), "{name}: {got}");
            }
        }
    }

    /// The Display of a provider error is plain too (it is what reaches a
    /// Proxy's Provisioned condition).
    #[test]
    fn provider_error_display_has_no_debug_dump() {
        let e = ProviderError::wrap(ErrorClass::Permanent, Op::Get, "k", "ns/p", forbidden());
        let s = e.to_string();
        assert!(s.ends_with(FORBIDDEN), "{s}");
        assert!(!s.contains("Status {"), "{s}");
    }

    #[test]
    fn result_labels() {
        let ok: Result<(), ProviderError> = Ok(());
        assert_eq!(result_label(&ok), "ok");
        for (class, label) in [
            (ErrorClass::NotFound, "not_found"),
            (ErrorClass::QuotaExceeded, "quota_exceeded"),
            (ErrorClass::Transient, "transient"),
            (ErrorClass::Unavailable, "unavailable"),
            (ErrorClass::Permanent, "permanent"),
        ] {
            let r: Result<(), ProviderError> = Err(ProviderError::new(class, Op::Get, "p", "", ""));
            assert_eq!(result_label(&r), label);
        }
    }
}
