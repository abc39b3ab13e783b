//! Keeps a process's shared keys as their Secrets say, through a rotation
//! (`lease::keyring`): each Secret is read again every
//! [`RELOAD_EVERY`]; the keys it holds then, as its `rotate-at` and the
//! grace put them, replace those every holder of the key uses. A manager
//! folds a finished rotation into the Secret (`key` = `next`), so the next
//! rotation starts from one key. A Secret that cannot be read or holds
//! nothing usable changes nothing: the keys read before stay, and the log
//! says why once.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::lease_key::{keys_in, Which, DATA_KEY, NEXT_KEY, ROTATE_AT_KEY};
use crate::lease::keyring::{Phase, RELOAD_EVERY};
use crate::lease::LeaseKey;
use crate::provider::error::plain_message;

/// What one reload keeps and does.
pub struct Reload {
    /// The key every holder uses.
    pub key: LeaseKey,
    /// Which Secret, and how the log names it.
    pub which: Which,
    /// How long the old key is taken after `rotate-at`.
    pub grace: Duration,
    /// Whether this process folds a finished rotation (managers).
    pub folds: bool,
}

/// What a process keeps fresh: its own key, and a manager's gateway key
/// (only managers fold, as only they may update the Secrets).
pub fn reloads(keys: &super::lease_key::Keys, gateway_only: bool, grace: Duration) -> Vec<Reload> {
    let own = match gateway_only {
        true => (
            super::lease_key::GATEWAY_KEY,
            super::lease_key::GATEWAY_GRACE,
        ),
        false => (super::lease_key::LEASE_KEY, grace),
    };
    let mut all = vec![Reload {
        key: keys.own.clone(),
        which: own.0,
        grace: own.1,
        folds: !gateway_only,
    }];
    if let Some(g) = &keys.gateway {
        all.push(Reload {
            key: g.clone(),
            which: super::lease_key::GATEWAY_KEY,
            grace: super::lease_key::GATEWAY_GRACE,
            folds: true,
        });
    }
    all
}

/// Reads `r.which`'s Secret in `namespace` again every [`RELOAD_EVERY`]
/// until `stop`.
pub async fn keep_fresh(client: Client, namespace: String, r: Reload, stop: CancellationToken) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let mut said: Option<String> = None;
    let mut phase = Phase::Settled;
    let mut fold_said: Option<String> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(RELOAD_EVERY) => {}
            () = stop.cancelled() => return,
        }
        let now = chrono::Utc::now().timestamp();
        let read = match api.get_opt(r.which.secret).await {
            Ok(Some(s)) => keys_in(s.data.as_ref(), now, r.grace).map(|k| (k, s)),
            Ok(None) => Err("is gone".to_string()),
            Err(e) => Err(format!("cannot be read: {}", plain_message(&e))),
        };
        let ((key, now_phase), secret) = match read {
            Ok(read) => read,
            Err(why) => {
                if said.as_ref() != Some(&why) {
                    warn!(secret = r.which.secret, problem = %why, "The Secret of {} {why}; keeping the keys read before", r.which.what);
                    said = Some(why);
                }
                continue;
            }
        };
        said = None;
        let before = r.key.id();
        r.key.adopt(&key);
        if now_phase != phase {
            let taken: Vec<String> = key.taken().iter().map(ToString::to_string).collect();
            info!(secret = r.which.secret, signing = %key.id(), taken = ?taken, phase = ?now_phase, "The rotation of {} moved on", r.which.what);
            phase = now_phase;
        } else if key.id() != before {
            info!(secret = r.which.secret, signing = %key.id(), "{} changed", r.which.what);
        }
        if r.folds && now_phase == Phase::Done {
            if let Err(why) = fold(&api, secret, r.which).await {
                if fold_said.as_ref() != Some(&why) {
                    warn!(secret = r.which.secret, error = %why, "Could not fold the finished rotation of {}; the next key signs all the same", r.which.what);
                    fold_said = Some(why);
                }
            }
        }
    }
}

/// Writes a finished rotation back as one key: `key` = `next`, without
/// `next` and `rotate-at`. A conflict means another replica folded it (or
/// someone changed it) first: the next read tells. `Err`: the API
/// server's words.
async fn fold(api: &Api<Secret>, mut secret: Secret, which: Which) -> Result<(), String> {
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    let Some(next) = data.remove(NEXT_KEY) else {
        return Ok(());
    };
    data.insert(DATA_KEY.to_string(), next);
    data.remove(ROTATE_AT_KEY);
    match api
        .replace(which.secret, &PostParams::default(), &secret)
        .await
    {
        Ok(_) => {
            info!(
                secret = which.secret,
                "Folded the finished rotation of {}", which.what
            );
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(plain_message(&e)),
    }
}
