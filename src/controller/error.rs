//! Why a reconcile failed: each of these goes back to the controller,
//! which retries the Proxy with backoff.

use crate::api::constants::SKIP_CLEANUP_ANNOTATION;
use crate::provider::error::plain_message;
use crate::provider::ProviderError;

/// A reconcile that should be retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A provider call failed transiently (or with NotFound outside get).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {msg}", msg = plain_message(.0))]
    Kube(#[from] kube::Error),
    /// The credentials of an instance could not be read or stored.
    #[error("{0}")]
    Credentials(String),
    /// The provider of a Proxy being deleted is not configured.
    #[error("provider {provider:?} is not configured; cannot clean up instance {id}; set {SKIP_CLEANUP_ANNOTATION}: \"true\" to abandon it")]
    NotConfigured {
        /// The provider name.
        provider: String,
        /// The instance.
        id: String,
    },
    /// Cleanup after a permanent get failed too.
    #[error("instance unreachable ({get_error}) and delete failed: {delete_error}")]
    Cleanup {
        /// The get error.
        get_error: String,
        /// The delete error.
        delete_error: ProviderError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{ErrorClass, Op};

    #[test]
    fn messages_say_what_to_do() {
        struct Case {
            name: &'static str,
            err: Error,
            want: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "not configured names the provider, the instance and the way out",
                err: Error::NotConfigured {
                    provider: "kvm-old".into(),
                    id: "host/proxy-x".into(),
                },
                want: &["\"kvm-old\"", "host/proxy-x", SKIP_CLEANUP_ANNOTATION],
            },
            Case {
                name: "cleanup names both failures",
                err: Error::Cleanup {
                    get_error: "host retired".into(),
                    delete_error: ProviderError::new(
                        ErrorClass::Transient,
                        Op::Delete,
                        "kvm",
                        "host/proxy-x",
                        "connection reset",
                    ),
                },
                want: &["host retired", "connection reset"],
            },
        ];
        for c in cases {
            let msg = plain_message(&c.err);
            for w in c.want {
                assert!(msg.contains(w), "{}: {msg}", c.name);
            }
        }
    }
}
