//! Resolving `spec.cloudInit` to its text: inline, or from a labelled
//! Secret in the Proxy's namespace.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::api::constants::CLOUD_INIT_SECRET_LABEL;
use crate::api::CloudInit;

/// Why cloud-init could not be resolved (shown in the Proxy's status).
#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    /// The Secret does not exist.
    #[error("cloud-init Secret {name:?} not found in namespace {namespace:?}")]
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
    /// The API call failed.
    #[error("reading cloud-init Secret {name:?}: {source}")]
    Api {
        /// Secret name.
        name: String,
        /// The error.
        source: kube::Error,
    },
}

/// The resolved cloud-init text (empty when the Proxy has none).
pub async fn resolve(
    client: &Client,
    namespace: &str,
    spec: Option<&CloudInit>,
) -> Result<String, CloudInitError> {
    let Some(ci) = spec else {
        return Ok(String::new());
    };
    if let Some(text) = &ci.inline {
        return Ok(text.clone());
    }
    let Some(r) = &ci.secret_ref else {
        return Ok(String::new());
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match api.get_opt(&r.name).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(CloudInitError::NotFound {
                name: r.name.clone(),
                namespace: namespace.to_string(),
            })
        }
        Err(source) => {
            return Err(CloudInitError::Api {
                name: r.name.clone(),
                source,
            })
        }
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
