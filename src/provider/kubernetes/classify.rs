//! Error classification for the kubernetes provider: the one `classify`
//! function, tested by a table.

use kube::core::Status;

use crate::provider::ErrorClass;

/// What the API server's ResourceQuota admission says when it refuses a
/// create: over the quota (`pods "x" is forbidden: exceeded quota: q,
/// requested: ...`), a quota whose usage the controller has not counted
/// yet, or one the Pod does not fit.
const QUOTA_TEXTS: [&str; 4] = [
    "exceeded quota",
    "status unknown for quota",
    "failed quota",
    "insufficient quota",
];
/// The cause reason of a create in a namespace being deleted.
const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";
/// The message of the same refusal, for servers that give no causes.
const TERMINATING_TEXT: &str = "because it is being terminated";

/// The error class of a Kubernetes API error:
///
/// | error | class |
/// |---|---|
/// | 404 | NotFound |
/// | 429, 403 from a ResourceQuota | QuotaExceeded |
/// | 403 because the namespace is being terminated | Transient |
/// | 401, any other 403 (RBAC, admission) | Unavailable |
/// | 400, 422 | Permanent |
/// | anything else, not an API error | Transient |
///
/// A terminating namespace is not a spec problem: the Proxy in it is being
/// deleted too, and its deletion path takes over on the next pass.
pub fn classify(err: &(dyn std::error::Error + 'static)) -> ErrorClass {
    match err.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) => match status.code {
            404 => ErrorClass::NotFound,
            429 => ErrorClass::QuotaExceeded,
            403 if is_quota(status) => ErrorClass::QuotaExceeded,
            403 if is_namespace_terminating(status) => ErrorClass::Transient,
            401 | 403 => ErrorClass::Unavailable,
            400 | 422 => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        },
        _ => ErrorClass::Transient,
    }
}

fn is_quota(s: &Status) -> bool {
    QUOTA_TEXTS.iter().any(|t| s.message.contains(t))
}

fn is_namespace_terminating(s: &Status) -> bool {
    let by_cause = s
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == NAMESPACE_TERMINATING));
    by_cause || s.message.contains(TERMINATING_TEXT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::{StatusCause, StatusDetails};

    fn api(code: u16, message: &str, reason: &str, causes: &[&str]) -> kube::Error {
        let mut s = Status::failure(message, reason).with_code(code);
        if !causes.is_empty() {
            s.details = Some(StatusDetails {
                causes: causes
                    .iter()
                    .map(|r| StatusCause {
                        reason: (*r).to_string(),
                        message: String::new(),
                        field: "metadata.namespace".into(),
                    })
                    .collect(),
                name: String::new(),
                group: String::new(),
                kind: "pods".into(),
                uid: String::new(),
                retry_after_seconds: 0,
            });
        }
        kube::Error::Api(s.boxed())
    }

    #[test]
    fn classification_table() {
        struct Case {
            name: &'static str,
            err: kube::Error,
            want: ErrorClass,
        }
        let plain = |code| api(code, "m", "R", &[]);
        let cases = [
            Case {
                name: "404",
                err: plain(404),
                want: ErrorClass::NotFound,
            },
            Case {
                name: "429",
                err: plain(429),
                want: ErrorClass::QuotaExceeded,
            },
            Case {
                name: "403 RBAC",
                err: api(
                    403,
                    "pods is forbidden: User \"system:serviceaccount:x:y\" cannot create resource \"pods\"",
                    "Forbidden",
                    &[],
                ),
                want: ErrorClass::Unavailable,
            },
            Case {
                name: "403 without text",
                err: plain(403),
                want: ErrorClass::Unavailable,
            },
            Case {
                name: "401",
                err: api(401, "Unauthorized", "Unauthorized", &[]),
                want: ErrorClass::Unavailable,
            },
            Case {
                name: "403 ResourceQuota",
                err: api(
                    403,
                    "pods \"proxy-a\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2",
                    "Forbidden",
                    &[],
                ),
                want: ErrorClass::QuotaExceeded,
            },
            Case {
                name: "403 from a quota not counted yet",
                err: api(
                    403,
                    "pods \"proxy-a\" is forbidden: status unknown for quota: pods, resources: pods",
                    "Forbidden",
                    &[],
                ),
                want: ErrorClass::QuotaExceeded,
            },
            Case {
                name: "403 NamespaceTerminating by cause",
                err: api(
                    403,
                    "pods \"proxy-a\" is forbidden: unable to create new content in namespace t because it is being terminated",
                    "Forbidden",
                    &[NAMESPACE_TERMINATING],
                ),
                want: ErrorClass::Transient,
            },
            Case {
                name: "403 NamespaceTerminating by message only",
                err: api(
                    403,
                    "unable to create new content in namespace t because it is being terminated",
                    "Forbidden",
                    &[],
                ),
                want: ErrorClass::Transient,
            },
            Case {
                name: "422",
                err: plain(422),
                want: ErrorClass::Permanent,
            },
            Case {
                name: "400",
                err: plain(400),
                want: ErrorClass::Permanent,
            },
            Case {
                name: "500",
                err: plain(500),
                want: ErrorClass::Transient,
            },
            Case {
                name: "503",
                err: plain(503),
                want: ErrorClass::Transient,
            },
            Case {
                name: "409",
                err: plain(409),
                want: ErrorClass::Transient,
            },
        ];
        for c in cases {
            assert_eq!(classify(&c.err), c.want, "{}", c.name);
        }
        assert_eq!(classify(&std::io::Error::other("x")), ErrorClass::Transient);
    }
}
