//! Resolving `spec.cloudInit` to its text: inline, or from a labelled
//! Secret in the Proxy's namespace.
//!
//! Secrets are read from the operator's own watch of labelled Secrets (the
//! [`SecretCache`]), never with `get`: the shipped RBAC grants `list` and
//! `watch` on Secrets only, and the label selector keeps every other Secret
//! out of the operator's memory.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, ObjectRef, Store};

use crate::api::constants::CLOUD_INIT_SECRET_LABEL;
use crate::api::CloudInit;

/// How long a reconcile waits for the Secret watch's first list before it
/// reports [`CloudInitError::NotSynced`] (and retries later).
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The label selector of the Secret watch.
pub fn secret_selector() -> String {
    format!("{CLOUD_INIT_SECRET_LABEL}=true")
}

/// The Secrets labelled `crawl.example.com/cloud-init=true`, as the Proxy
/// controller's Secret watch reflects them.
pub struct SecretCache {
    store: Store<Secret>,
    writer: Mutex<Option<reflector::store::Writer<Secret>>>,
}

impl Default for SecretCache {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        SecretCache {
            store,
            writer: Mutex::new(Some(writer)),
        }
    }
}

impl SecretCache {
    /// The writer the watch fills the cache through; `None` once taken.
    pub fn take_writer(&self) -> Option<reflector::store::Writer<Secret>> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The cached Secret `namespace/name`, once the watch has listed.
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, CloudInitError> {
        if tokio::time::timeout(SYNC_WAIT, self.store.wait_until_ready())
            .await
            .map_or(true, |r| r.is_err())
        {
            return Err(CloudInitError::NotSynced {
                name: name.to_string(),
            });
        }
        Ok(self
            .store
            .get(&ObjectRef::<Secret>::new(name).within(namespace)))
    }
}

/// Why cloud-init could not be resolved (shown in the Proxy's status).
#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    /// No Secret of that name carries the label (it may exist unlabelled:
    /// the operator cannot tell, as it never reads unlabelled Secrets).
    #[error("no cloud-init Secret {name:?} in namespace {namespace:?}: create it, or label it {CLOUD_INIT_SECRET_LABEL}: \"true\" (the operator reads only labelled Secrets)")]
    NotFound {
        /// Secret name.
        name: String,
        /// Namespace.
        namespace: String,
    },
    /// The Secret lacks the opt-in label.
    #[error("Secret {name:?} is not labelled {CLOUD_INIT_SECRET_LABEL}: \"true\", so the operator may not read it")]
    Unlabelled {
        /// Secret name.
        name: String,
    },
    /// The key is missing.
    #[error("Secret {name:?} has no key {key:?}")]
    MissingKey {
        /// Secret name.
        name: String,
        /// The key.
        key: String,
    },
    /// The value is not UTF-8.
    #[error("Secret {name:?} key {key:?} is not UTF-8 text")]
    NotText {
        /// Secret name.
        name: String,
        /// The key.
        key: String,
    },
    /// The Secret watch has not listed yet (or cannot: see the operator's log).
    #[error(
        "cloud-init Secret {name:?}: the operator's watch of labelled Secrets has not synced yet"
    )]
    NotSynced {
        /// Secret name.
        name: String,
    },
}

/// The resolved cloud-init text (empty when the Proxy has none): what the
/// spec hash covers and the template a create fills in
/// ([`super::user_data::render`]).
pub async fn resolve(
    secrets: &SecretCache,
    namespace: &str,
    spec: Option<&CloudInit>,
) -> Result<String, CloudInitError> {
    let Some(ci) = spec else {
        return Ok(String::new());
    };
    if ci.builtin.is_some() {
        return Ok(super::user_data::BUILTIN_SQUID.to_string());
    }
    if let Some(text) = &ci.inline {
        return Ok(text.clone());
    }
    let Some(r) = &ci.secret_ref else {
        return Ok(String::new());
    };
    let Some(secret) = secrets.get(namespace, &r.name).await? else {
        return Err(CloudInitError::NotFound {
            name: r.name.clone(),
            namespace: namespace.to_string(),
        });
    };
    extract(&secret, &r.name, r.key_or_default())
}

/// The text under `key` of a Secret that carries the opt-in label.
pub fn extract(secret: &Secret, name: &str, key: &str) -> Result<String, CloudInitError> {
    let labelled = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CLOUD_INIT_SECRET_LABEL))
        .is_some_and(|v| v == "true");
    if !labelled {
        return Err(CloudInitError::Unlabelled {
            name: name.to_string(),
        });
    }
    let from_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone());
    let from_string = secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.clone().into_bytes());
    let bytes = from_data
        .or(from_string)
        .ok_or_else(|| CloudInitError::MissingKey {
            name: name.to_string(),
            key: key.to_string(),
        })?;
    String::from_utf8(bytes).map_err(|_| CloudInitError::NotText {
        name: name.to_string(),
        key: key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(label: Option<&str>, data: &[(&str, &[u8])]) -> Secret {
        let mut s = Secret::default();
        if let Some(v) = label {
            s.metadata.labels = Some(BTreeMap::from([(
                CLOUD_INIT_SECRET_LABEL.to_string(),
                v.to_string(),
            )]));
        }
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        );
        s
    }

    fn secret_ref(name: &str) -> CloudInit {
        CloudInit {
            inline: None,
            secret_ref: Some(crate::api::SecretKeyRef {
                name: name.into(),
                key: None,
            }),
            builtin: None,
        }
    }

    /// Secrets come from the watch's cache: a cached labelled Secret
    /// resolves, a missing one names the label, and nothing calls the API.
    #[tokio::test]
    async fn resolve_reads_the_cache() {
        let cache = SecretCache::default();
        let mut writer = cache.take_writer().unwrap();
        assert!(cache.take_writer().is_none());
        let mut s = secret(Some("true"), &[("user-data", b"#cloud-config\n")]);
        s.metadata.name = Some("ci".into());
        s.metadata.namespace = Some("default".into());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(s));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);

        let text = resolve(&cache, "default", Some(&secret_ref("ci"))).await;
        assert_eq!(text.unwrap(), "#cloud-config\n");
        let e = resolve(&cache, "default", Some(&secret_ref("other")))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"other\"") && e.contains(CLOUD_INIT_SECRET_LABEL),
            "{e}"
        );
        // Same name, other namespace: not this Proxy's Secret.
        let e = resolve(&cache, "prod", Some(&secret_ref("ci"))).await;
        assert!(matches!(e, Err(CloudInitError::NotFound { .. })), "{e:?}");
        // Inline and absent cloud-init need no cache.
        let inline = CloudInit {
            inline: Some("x".into()),
            secret_ref: None,
            builtin: None,
        };
        assert_eq!(
            resolve(&cache, "default", Some(&inline)).await.unwrap(),
            "x"
        );
        assert_eq!(resolve(&cache, "default", None).await.unwrap(), "");
    }

    /// A watch that never listed (here: its writer is gone) is reported,
    /// not mistaken for a missing Secret.
    #[tokio::test]
    async fn resolve_without_a_synced_watch_says_so() {
        let cache = SecretCache::default();
        drop(cache.take_writer());
        let e = resolve(&cache, "default", Some(&secret_ref("ci")))
            .await
            .unwrap_err();
        assert!(matches!(e, CloudInitError::NotSynced { .. }), "{e:?}");
        assert!(e.to_string().contains("not synced"), "{e}");
    }

    #[test]
    fn extract_table() {
        let ok = secret(Some("true"), &[("user-data", b"#cloud-config\n")]);
        assert_eq!(extract(&ok, "ci", "user-data").unwrap(), "#cloud-config\n");
        let cases: Vec<(Secret, &str, &str)> = vec![
            (
                secret(None, &[("user-data", b"x")]),
                "user-data",
                "not labelled",
            ),
            (
                secret(Some("yes"), &[("user-data", b"x")]),
                "user-data",
                "not labelled",
            ),
            (
                secret(Some("true"), &[("other", b"x")]),
                "user-data",
                "no key \"user-data\"",
            ),
            (
                secret(Some("true"), &[("user-data", &[0xff, 0xfe])]),
                "user-data",
                "not UTF-8",
            ),
        ];
        for (s, key, want) in cases {
            let e = extract(&s, "ci", key).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want}");
            assert!(e.contains("\"ci\""), "{e} names the Secret");
        }
    }
}
