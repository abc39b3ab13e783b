//! The keys replicas share through Secrets in the operator namespace: the
//! lease signing key (every manager replica: lease ids, forwards, the
//! leader's URL seal, hand-overs) and the gateway key (the gateway
//! processes' calls to the leader, and the seal of its URL they check;
//! never lease ids). The first process that finds one missing creates it;
//! a create conflict means another won the race, whose key is read.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;
use tracing::info;

use crate::lease::keyring::{self, Phase};
use crate::lease::signed::{random_bytes, KEY_LEN};
use crate::lease::LeaseKey;
use crate::provider::error::plain_message;

/// The lease signing key Secret's name.
pub const SECRET_NAME: &str = "egress-proxies-operator-lease-key";

/// The gateway key Secret's name.
pub const GATEWAY_SECRET_NAME: &str = "egress-proxies-operator-gateway-key";

/// The key of the Secret's data that holds the key bytes.
pub const DATA_KEY: &str = "key";

/// During a rotation, the data key of the coming key.
pub const NEXT_KEY: &str = "next";

/// During a rotation, the data key of when the coming key signs (unix
/// seconds).
pub const ROTATE_AT_KEY: &str = "rotate-at";

/// How long the gateway key's old key is still taken after a rotation:
/// it signs calls and seals that live seconds.
pub const GATEWAY_GRACE: Duration = Duration::from_secs(60);

/// Which shared key: its Secret and how the log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Which {
    /// The Secret's name.
    pub secret: &'static str,
    /// Its name in the log.
    pub what: &'static str,
    /// The warning when only a key of this process can be had.
    alone: &'static str,
    /// `/readyz`'s words then.
    detail: &'static str,
}

/// The lease signing key.
pub const LEASE_KEY: Which = Which {
    secret: SECRET_NAME,
    what: "the lease signing key",
    alone: "Signing lease ids with a key of this process only: leases will not survive a restart or a leader change, and this replica's forwards are refused. Give the operator create and get on this Secret in its namespace (config/rbac/leader_election_role.yaml)",
    detail: "lease ids are signed with a key of this process only (the lease key Secret is forbidden or absent): leases do not survive a restart or a leader change",
};

/// The gateway key.
pub const GATEWAY_KEY: Which = Which {
    secret: GATEWAY_SECRET_NAME,
    what: "the gateway key",
    alone: "Signing calls to the leader with a gateway key of this process only: the leader refuses them, so this gateway forwards no lease call and copies no lease table or credentials. Give the gateway create and get on this Secret in its namespace (config/components/gateway/follower_role.yaml)",
    detail: "the gateway key is a key of this process only (its Secret is forbidden or absent): the leader refuses this gateway's calls",
};

/// The keys a process signs and checks replica calls with.
#[derive(Clone)]
pub struct Keys {
    /// Signs this process's calls to the leader and checks the leader's
    /// URL seal: the lease key on a manager (which also signs lease ids
    /// with it), the gateway key on a gateway.
    pub own: LeaseKey,
    /// A manager's: the gateway key, to take the gateway processes' calls
    /// and seal its URL for them; none on a gateway.
    pub gateway: Option<LeaseKey>,
}

/// Told whether the key is the shared one (the metric
/// `proxy_operator_lease_key_shared`).
pub type SharedGauge<'a> = dyn Fn(bool) + Sync + 'a;

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or creating the Secret is forbidden, or its namespace does
    /// not exist: asking again will not help.
    #[error("cannot read or create Secret {namespace}/{secret}: {message}")]
    Unavailable {
        /// Operator namespace.
        namespace: String,
        /// The Secret.
        secret: &'static str,
        /// The API server's words.
        message: String,
    },
    /// Reading or creating the Secret failed for now (the API server
    /// unreachable, overloaded, timing out): worth asking again.
    #[error("cannot read or create Secret {namespace}/{secret} yet: {message}")]
    Api {
        /// Operator namespace.
        namespace: String,
        /// The Secret.
        secret: &'static str,
        /// The API server's words.
        message: String,
    },
    /// The Secret exists but holds no usable key, or a malformed
    /// rotation.
    #[error("Secret {namespace}/{secret}: {reason}")]
    Bad {
        /// Operator namespace.
        namespace: String,
        /// The Secret.
        secret: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// What a failed read or create of the Secret in `namespace` means:
/// forbidden (403) or no such namespace (404) will not change by asking
/// again; anything else (unreachable, 5xx, 429, a timeout) may.
pub fn classify(namespace: &str, secret: &'static str, e: &kube::Error) -> KeyError {
    let (namespace, message) = (namespace.to_string(), plain_message(e));
    match e {
        kube::Error::Api(s) if s.code == 403 || s.code == 404 => KeyError::Unavailable {
            namespace,
            secret,
            message,
        },
        _ => KeyError::Api {
            namespace,
            secret,
            message,
        },
    }
}

/// The keys in `secret` now, with `grace`, or what is wrong with them.
pub fn key_of(secret: &Secret, grace: Duration) -> Result<LeaseKey, String> {
    let now = chrono::Utc::now().timestamp();
    keys_in(secret.data.as_ref(), now, grace).map(|(key, _)| key)
}

/// The keys in a key Secret's `data` at `now` (unix seconds), with
/// `grace` after `rotate-at` ([`keyring::phase`]), and where the rotation
/// stands; or what is wrong, in words that name the data key and never
/// its value.
pub fn keys_in(
    data: Option<&BTreeMap<String, ByteString>>,
    now: i64,
    grace: Duration,
) -> Result<(LeaseKey, Phase), String> {
    let get = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
    let Some(key) = get(DATA_KEY) else {
        return Err(format!(
            "data key {DATA_KEY:?} is missing; delete the Secret to have a new key created"
        ));
    };
    let next = get(NEXT_KEY);
    let at = match (next, get(ROTATE_AT_KEY)) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(format!(
                "data key {NEXT_KEY:?} needs {ROTATE_AT_KEY:?} beside it (unix seconds, as `date +%s` prints)"
            ))
        }
        (Some(_), Some(at)) => Some(
            std::str::from_utf8(at)
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    format!("data key {ROTATE_AT_KEY:?} must be unix seconds, as `date +%s` prints")
                })?,
        ),
    };
    let phase = keyring::phase(at, now, grace);
    let key = LeaseKey::rotating(key, next, phase).map_err(|e| {
        let which = match next.is_some_and(|n| n.len() < KEY_LEN) {
            true => NEXT_KEY,
            false => DATA_KEY,
        };
        format!("data key {which:?} is unusable: {e}")
    })?;
    Ok((key, phase))
}

/// Reads `which` key's Secret in `namespace`, creating it when missing.
pub async fn load_or_create(
    client: Client,
    namespace: &str,
    (which, grace): (Which, Duration),
) -> Result<LeaseKey, KeyError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let name = which.secret;
    let api_err = |e: kube::Error| classify(namespace, name, &e);
    let bad = |reason| KeyError::Bad {
        namespace: namespace.to_string(),
        secret: name,
        reason,
    };
    if let Some(s) = api.get_opt(name).await.map_err(api_err)? {
        return key_of(&s, grace).map_err(bad);
    }
    let fresh = super::own_secret(name, DATA_KEY, random_bytes::<KEY_LEN>().to_vec());
    match api.create(&PostParams::default(), &fresh).await {
        Ok(s) => {
            info!(namespace, secret = name, "Created {}", which.what);
            key_of(&s, grace).map_err(bad)
        }
        // Another process created it first: use theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let s = api.get(name).await.map_err(api_err)?;
            key_of(&s, grace).map_err(bad)
        }
        Err(e) => Err(api_err(e)),
    }
}

/// How long to wait before asking again after a transient error, at most.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// The key every replica shares, asked again after a transient error
/// (signing with a key of this process only would strand its leases at
/// the next restart or leader change), until `stop` fires (`Ok(None)`).
/// Only when the Secret is forbidden or its namespace absent, a key of
/// this process: said in the log and, given them, on `/readyz` and to
/// `told` (`proxy_operator_lease_key_shared`). `(key, shared)`.
pub async fn shared_or_own(
    client: &Client,
    (namespace, which, grace): (&str, Which, Duration),
    stop: &tokio_util::sync::CancellationToken,
    told: Option<&SharedGauge<'_>>,
    ready: Option<&crate::http::Readiness>,
) -> Result<Option<(LeaseKey, bool)>, KeyError> {
    let shared = |yes: bool| {
        if let Some(tell) = told {
            tell(yes);
        }
    };
    let mut wait = std::time::Duration::from_secs(1);
    loop {
        match load_or_create(client.clone(), namespace, (which, grace)).await {
            Ok(key) => {
                shared(true);
                return Ok(Some((key, true)));
            }
            // No Secret to share (no RBAC for it, no such namespace, as
            // under `make run`): serve with a key of this process. Lease
            // ids stay unforgeable; only taking them in elsewhere is lost.
            Err(e @ KeyError::Unavailable { .. }) => {
                tracing::warn!(error = %e, "{}", which.alone);
                shared(false);
                if let Some(r) = ready {
                    r.set_detail(which.detail);
                }
                return Ok(Some((LeaseKey::random(), false)));
            }
            Err(e @ KeyError::Api { .. }) => {
                tracing::warn!(error = %e, retry_in = ?wait, key = which.what, "Cannot read a shared key yet; asking again");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => return Ok(None),
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The keys of this process (see [`Keys`]): a gateway
/// signs with the gateway key alone; a manager with the lease key, and
/// takes gateway calls with the gateway key. `shared`: whether its own
/// key is the one its Secret holds. `Ok(None)`: stopped meanwhile.
pub async fn keys_for(
    client: &Client,
    (namespace, gateway_only, grace): (&str, bool, Duration),
    stop: &tokio_util::sync::CancellationToken,
    told: &SharedGauge<'_>,
    ready: &crate::http::Readiness,
) -> Result<Option<(Keys, bool)>, KeyError> {
    let own = match gateway_only {
        true => (GATEWAY_KEY, GATEWAY_GRACE),
        false => (LEASE_KEY, grace),
    };
    let Some((key, shared)) = shared_or_own(
        client,
        (namespace, own.0, own.1),
        stop,
        Some(told),
        Some(ready),
    )
    .await?
    else {
        return Ok(None);
    };
    let gateway = match gateway_only {
        true => None,
        // Without it (no RBAC for it yet), gateways are refused, nothing
        // else: a key of this process stands in.
        false => match shared_or_own(
            client,
            (namespace, GATEWAY_KEY, GATEWAY_GRACE),
            stop,
            None,
            None,
        )
        .await?
        {
            Some((g, _)) => Some(g),
            None => return Ok(None),
        },
    };
    let keys = Keys { own: key, gateway };
    Ok(Some((keys, shared)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code,
            message: format!("{reason} for the test"),
            reason: reason.into(),
            metadata: None,
            details: None,
        }))
    }

    /// Issue 52: the Secret's rotation, read as the replicas read it;
    /// what is wrong names the data key and never shows a value.
    #[test]
    fn a_key_secret_is_read_with_its_rotation_and_a_bad_one_names_the_data_key() {
        let (old, new) = (vec![1u8; KEY_LEN], vec![2u8; KEY_LEN]);
        let hour = Duration::from_secs(3600);
        let data = |pairs: &[(&str, &[u8])]| -> BTreeMap<String, ByteString> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect()
        };
        let ok = [
            (data(&[("key", &old)]), 0, Phase::Settled, &old),
            (
                data(&[("key", &old), ("rotate-at", b"5")]),
                9,
                Phase::Settled,
                &old,
            ),
            (
                data(&[("key", &old), ("next", &new), ("rotate-at", b"100")]),
                99,
                Phase::Announced,
                &old,
            ),
            (
                data(&[("key", &old), ("next", &new), ("rotate-at", b" 100\n")]),
                100,
                Phase::Grace,
                &new,
            ),
            (
                data(&[("key", &old), ("next", &new), ("rotate-at", b"100")]),
                3700,
                Phase::Done,
                &new,
            ),
        ];
        for (d, now, phase, signs) in ok {
            let (key, got) = keys_in(Some(&d), now, hour).unwrap();
            assert_eq!(got, phase, "{now}");
            assert_eq!(key.id(), LeaseKey::from_bytes(signs).unwrap().id(), "{now}");
        }
        let short = vec![9u8; 5];
        let bad = [
            (data(&[]), "data key \"key\" is missing"),
            (data(&[("key", &short)]), "data key \"key\" is unusable"),
            (
                data(&[("key", &old), ("next", &short), ("rotate-at", b"1")]),
                "data key \"next\" is unusable",
            ),
            (
                data(&[("key", &old), ("next", &new)]),
                "data key \"next\" needs \"rotate-at\"",
            ),
            (
                data(&[("key", &old), ("next", &new), ("rotate-at", b"tomorrow")]),
                "data key \"rotate-at\" must be unix seconds",
            ),
        ];
        for (d, want) in bad {
            let err = keys_in(Some(&d), 0, hour).err().unwrap();
            assert!(err.starts_with(want), "{err}");
            assert!(!err.contains("tomorrow") && !err.contains("\\x"), "{err}");
        }
        assert!(keys_in(None, 0, hour).is_err());
    }

    #[test]
    fn only_a_forbidden_or_absent_secret_falls_back_to_a_key_of_this_process() {
        let cases = [
            (status(403, "Forbidden"), true),
            (status(404, "NotFound"), true),
            (status(500, "InternalError"), false),
            (status(503, "ServiceUnavailable"), false),
            (status(429, "TooManyRequests"), false),
            (status(504, "Timeout"), false),
        ];
        for (e, permanent) in cases {
            let got = classify("ops", SECRET_NAME, &e);
            assert_eq!(
                matches!(got, KeyError::Unavailable { .. }),
                permanent,
                "{e}: {got}"
            );
            assert!(got.to_string().contains("for the test"), "{got}");
        }
    }
}
