//! The lease signing key, shared by every replica through a Secret in the
//! operator namespace: the first replica that finds it missing creates it;
//! a create conflict means another replica won the race, whose key is read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use tracing::info;

use crate::lease::signed::{random_bytes, KEY_LEN};
use crate::lease::LeaseKey;
use crate::provider::error::plain_message;

/// The Secret's name.
pub const SECRET_NAME: &str = "egress-proxies-operator-lease-key";

/// The key of the Secret's data that holds the key bytes.
pub const DATA_KEY: &str = "key";

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or creating the Secret failed.
    #[error("cannot read or create Secret {namespace}/{SECRET_NAME}: {message}")]
    Api {
        /// Operator namespace.
        namespace: String,
        /// The API server's words.
        message: String,
    },
    /// The Secret exists but holds no usable key.
    #[error("Secret {namespace}/{SECRET_NAME}: data key {DATA_KEY:?} {reason}; delete the Secret to have a new key created")]
    Bad {
        /// Operator namespace.
        namespace: String,
        /// What is wrong.
        reason: String,
    },
}

/// The key in `secret`, or what is wrong with it.
pub fn key_of(secret: &Secret) -> Result<LeaseKey, String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or_else(|| "is missing".to_string())?;
    LeaseKey::from_bytes(&bytes.0).map_err(|e| format!("is unusable: {e}"))
}

/// Reads the key Secret in `namespace`, creating it when missing.
pub async fn load_or_create(client: Client, namespace: &str) -> Result<LeaseKey, KeyError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let api_err = |e: kube::Error| KeyError::Api {
        namespace: namespace.to_string(),
        message: plain_message(&e),
    };
    let bad = |reason| KeyError::Bad {
        namespace: namespace.to_string(),
        reason,
    };
    if let Some(s) = api.get_opt(SECRET_NAME).await.map_err(api_err)? {
        return key_of(&s).map_err(bad);
    }
    let fresh = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET_NAME.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "egress-proxies-operator".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            DATA_KEY.to_string(),
            ByteString(random_bytes::<KEY_LEN>().to_vec()),
        )])),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &fresh).await {
        Ok(s) => {
            info!(
                namespace,
                secret = SECRET_NAME,
                "Created the lease signing key"
            );
            key_of(&s).map_err(bad)
        }
        // Another replica created it first: use theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let s = api.get(SECRET_NAME).await.map_err(api_err)?;
            key_of(&s).map_err(bad)
        }
        Err(e) => Err(api_err(e)),
    }
}
