//! Proxy credentials: a username and a random password per instance, kept
//! in a Secret the Proxy owns (keys `username`, `password`, and `htpasswd`
//! for Squid's `basic_ncsa_auth`), handed to crawlers with their leases and
//! sent by the operator's own probes.
//!
//! The password is never logged: [`Sensitive`]'s `Debug` prints nothing of
//! it, and only [`Credentials::expose`] gives it out, to the code that
//! writes it where it belongs (a Secret, a `Proxy-Authorization` header,
//! a lease answer).

pub mod cache;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use ring::rand::{SecureRandom, SystemRandom};

use crate::api::constants::{
    CREDENTIALS_SECRET_LABEL, INSTALLATION_MARK, MANAGED_BY_LABEL, MANAGED_MARK,
    MANAGED_MARK_VALUE, UID_MARK,
};
use crate::api::{AuthMode, Proxy, ProxyMode};
pub use cache::CredentialsCache;

/// Secret key of the username.
pub const USERNAME_KEY: &str = "username";
/// Secret key of the password.
pub const PASSWORD_KEY: &str = "password";
/// Secret key of the `user:hash` line Squid's `basic_ncsa_auth` reads.
pub const HTPASSWD_KEY: &str = "htpasswd";
/// Label naming the Proxy a generated credentials Secret belongs to (for
/// `kubectl get secret -l`).
pub const PROXY_NAME_LABEL: &str = "crawl.example.com/proxy";

/// Text that holds a password (a password, a URL with one): its `Debug`
/// prints nothing of it; it serializes as the text itself, for the
/// answers that hand it out on purpose.
#[derive(Clone, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Sensitive(String);

impl Sensitive {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Sensitive(text.into())
    }
    /// The text, for where it is written on purpose.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A username and its password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The username (no `:`; safe in a URL's user info).
    pub username: String,
    password: Sensitive,
}

/// Why a Secret holds no usable credentials (its words name the key,
/// never a value).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    /// A key is absent or empty.
    #[error("Secret {name:?} has no {key:?} key (or it is empty)")]
    MissingKey {
        /// Secret name.
        name: String,
        /// The key.
        key: &'static str,
    },
    /// A value is not UTF-8, or the username holds a `:` (HTTP Basic
    /// cannot carry it).
    #[error("Secret {name:?} key {key:?} is not usable: {why}")]
    Unusable {
        /// Secret name.
        name: String,
        /// The key.
        key: &'static str,
        /// Why.
        why: &'static str,
    },
    /// The system's random source failed.
    #[error("the system random source failed")]
    Random,
}

/// SHA-512 crypt rounds: the minimum. Stretching guards guessable
/// passwords; these are 160 random bits, and every hash costs the
/// operator (and Squid's helper, at each check it has not cached) CPU.
pub const HASH_ROUNDS: usize = 1000;

/// The alphabet of crypt(3) salts.
const SALT_ALPHABET: &[u8; 64] =
    b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

impl Credentials {
    /// Credentials from their parts.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: Sensitive(password.into()),
        }
    }

    /// `username` with a new random password: 32 characters of base32
    /// (160 bits), safe unescaped in a URL.
    pub fn generate(username: &str) -> Result<Self, CredentialsError> {
        let mut bytes = [0u8; 20];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| CredentialsError::Random)?;
        let password = data_encoding::BASE32_NOPAD
            .encode(&bytes)
            .to_ascii_lowercase();
        Ok(Credentials::new(username, password))
    }

    /// The password, for the places it is written to on purpose.
    pub fn expose(&self) -> &str {
        &self.password.0
    }

    /// The `user:hash` line (SHA-512 crypt, [`HASH_ROUNDS`] rounds, a
    /// random salt), which `basic_ncsa_auth` checks through the system's
    /// crypt(3). CPU work: call it off the async threads.
    pub fn htpasswd(&self) -> Result<String, CredentialsError> {
        let mut raw = [0u8; 16];
        SystemRandom::new()
            .fill(&mut raw)
            .map_err(|_| CredentialsError::Random)?;
        let salt: String = raw
            .iter()
            .map(|b| SALT_ALPHABET[usize::from(b & 63)] as char)
            .collect();
        let params =
            sha_crypt::Sha512Params::new(HASH_ROUNDS).map_err(|_| CredentialsError::Random)?;
        let hash = sha_crypt::sha512_crypt_b64(self.expose().as_bytes(), salt.as_bytes(), &params)
            .map_err(|_| CredentialsError::Random)?;
        Ok(format!(
            "{}:$6$rounds={HASH_ROUNDS}${salt}${hash}\n",
            self.username
        ))
    }

    /// The password, wrapped for answers that hand it out.
    pub fn password(&self) -> Sensitive {
        self.password.clone()
    }

    /// `http://user:password@host:port` (user and password
    /// percent-encoded; `host` bracketed already when IPv6).
    pub fn url(&self, host: &str, port: u16) -> Sensitive {
        let plain = format!("http://{host}:{port}");
        let Ok(mut url) = url::Url::parse(&plain) else {
            return Sensitive(plain);
        };
        // Both only fail for a URL that cannot hold credentials (no
        // host), which an http URL with a host never is.
        let _ = url.set_username(&self.username);
        let _ = url.set_password(Some(self.expose()));
        // The port always written: a proxy URL without one means 1080 to
        // curl, so the URL crate's elided `:80` would send it elsewhere.
        let (user, password) = (url.username(), url.password().unwrap_or_default());
        Sensitive(format!("http://{user}:{password}@{host}:{port}"))
    }

    /// The value of a `Proxy-Authorization` header.
    pub fn proxy_authorization(&self) -> String {
        let pair = format!("{}:{}", self.username, self.expose());
        format!("Basic {}", data_encoding::BASE64.encode(pair.as_bytes()))
    }

    /// The credentials a Secret holds under `username` and `password`.
    pub fn from_secret(secret: &Secret) -> Result<Self, CredentialsError> {
        let name = secret.name_any();
        let text = |key: &'static str| -> Result<String, CredentialsError> {
            let value = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .filter(|v| !v.0.is_empty())
                .ok_or_else(|| CredentialsError::MissingKey {
                    name: name.clone(),
                    key,
                })?;
            String::from_utf8(value.0.clone()).map_err(|_| CredentialsError::Unusable {
                name: name.clone(),
                key,
                why: "not UTF-8 text",
            })
        };
        let username = text(USERNAME_KEY)?;
        if username.contains(':') {
            return Err(CredentialsError::Unusable {
                name,
                key: USERNAME_KEY,
                why: "a username cannot hold ':' in HTTP Basic authentication",
            });
        }
        Ok(Credentials::new(username, text(PASSWORD_KEY)?))
    }
}

/// The Secret (in the Proxy's namespace) with the credentials its proxy
/// takes: the current instance's for a Managed Proxy, `spec.auth.secretRef`
/// for an External one; `None` when it takes none.
pub fn secret_of(p: &Proxy) -> Option<&str> {
    match p.spec.mode {
        ProxyMode::Managed => p.status.as_ref()?.credentials_secret.as_deref(),
        ProxyMode::External => {
            let auth = p.spec.auth.as_ref()?;
            if auth.mode == AuthMode::None {
                return None;
            }
            auth.secret_ref.as_ref().map(|r| r.name.as_str())
        }
    }
}

/// Who a generated credentials Secret belongs to.
#[derive(Clone, Debug)]
pub struct Owner<'a> {
    /// The Proxy's namespace.
    pub namespace: &'a str,
    /// The Proxy's name.
    pub proxy_name: &'a str,
    /// The Proxy's UID.
    pub uid: &'a str,
    /// This installation's identity.
    pub installation_id: &'a str,
}

/// The Secret `name` holding `creds` (and `htpasswd`, their
/// [`Credentials::htpasswd`] line) for `owner`'s instance of that name:
/// owned by the Proxy (so it goes with it), labelled so the operator's
/// watch sees it.
pub fn secret(name: &str, owner: &Owner<'_>, creds: &Credentials, htpasswd: &str) -> Secret {
    let labels = BTreeMap::from([
        (CREDENTIALS_SECRET_LABEL.to_string(), "true".to_string()),
        (MANAGED_MARK.to_string(), MANAGED_MARK_VALUE.to_string()),
        (UID_MARK.to_string(), owner.uid.to_string()),
        (
            INSTALLATION_MARK.to_string(),
            owner.installation_id.to_string(),
        ),
        (PROXY_NAME_LABEL.to_string(), owner.proxy_name.to_string()),
        (
            MANAGED_BY_LABEL.to_string(),
            "egress-proxies-operator".to_string(),
        ),
    ]);
    let string_data = BTreeMap::from([
        (USERNAME_KEY.to_string(), creds.username.clone()),
        (PASSWORD_KEY.to_string(), creds.expose().to_string()),
        (HTPASSWD_KEY.to_string(), htpasswd.to_string()),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(owner.namespace.to_string()),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "crawl.example.com/v1alpha1".into(),
                kind: "Proxy".into(),
                name: owner.proxy_name.to_string(),
                uid: owner.uid.to_string(),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }]),
            ..Default::default()
        },
        string_data: Some(string_data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
