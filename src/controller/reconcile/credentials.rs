//! The credentials of an instance about to be created: read from its
//! Secret when an earlier pass made it (a crash after the create adopts the
//! instance, which holds those), else generated and stored first.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use crate::api::{AuthMode, Proxy, ProxyAuth};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::credentials::cache::Lookup;
use crate::credentials::{self, Credentials, Owner};
use crate::provider::error::plain_message;
use crate::provider::naming::instance_name;
use crate::provider::InstanceCredentials;

/// How long a create waits for the credentials watch's first list.
const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The credentials the instance of `serial` takes, `None` when the Proxy
/// asks for none (`spec.auth.mode: None`). The Secret is named as the
/// instance, so each instance, and only a new one, has its own.
pub async fn ensure(
    ctx: &Context,
    proxy: &Proxy,
    serial: u32,
) -> Result<Option<InstanceCredentials>, Error> {
    let uid = proxy.uid().unwrap_or_default();
    let namespace = proxy.namespace().unwrap_or_default();
    let name = instance_name(&uid, serial);
    if ProxyAuth::mode_of(proxy.spec.auth.as_ref()) == AuthMode::None {
        // Left by an instance of this name made while the Proxy still
        // asked for credentials (the mode changed between its delete and
        // this create): nothing will use it.
        if matches!(
            ctx.credentials.lookup(&namespace, &name),
            Lookup::Found(_) | Lookup::Invalid(_)
        ) {
            forget(ctx, proxy, Some(&name)).await;
        }
        return Ok(None);
    }
    let cache = &ctx.credentials;
    if !cache.ready_within(SYNC_WAIT).await {
        return Err(Error::Credentials(format!(
            "credentials Secret {name:?}: the operator's watch of credentials Secrets has not synced yet"
        )));
    }
    let creds = match cache.lookup(&namespace, &name) {
        Lookup::Found(creds) => creds,
        Lookup::Invalid(e) => return Err(Error::Credentials(e.to_string())),
        Lookup::NotSynced | Lookup::Missing => store(ctx, proxy, &name).await?,
    };
    Ok(Some(InstanceCredentials {
        secret_name: name,
        credentials: creds,
    }))
}

/// New credentials for the instance `name` and their htpasswd line, made
/// off the async threads (the line is a hash).
async fn generate(name: &str) -> Result<(Credentials, String), Error> {
    let owned = name.to_string();
    tokio::task::spawn_blocking(move || {
        let creds = Credentials::generate(&owned)?;
        let line = creds.htpasswd()?;
        Ok::<_, credentials::CredentialsError>((creds, line))
    })
    .await
    .map_err(|e| Error::Credentials(format!("generating credentials: {e}")))?
    .map_err(|e| Error::Credentials(e.to_string()))
}

/// Generates credentials into a new Secret `name` owned by `proxy`.
async fn store(ctx: &Context, proxy: &Proxy, name: &str) -> Result<Credentials, Error> {
    let (uid, namespace) = (
        proxy.uid().unwrap_or_default(),
        proxy.namespace().unwrap_or_default(),
    );
    let (creds, line) = generate(name).await?;
    let owner = Owner {
        namespace: &namespace,
        proxy_name: &proxy.name_any(),
        uid: &uid,
        installation_id: &ctx.installation_id,
    };
    let secret = credentials::secret(name, &owner, &creds, &line);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            info!(secret = %name, "Credentials generated");
            ctx.credentials.wrote(&namespace, name, &creds);
            Ok(creds)
        }
        // Made by an earlier pass the cache does not show yet: its
        // credentials are the ones to use, so wait for them.
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Credentials(format!(
            "credentials Secret {name:?} exists but the operator's watch has not seen it yet"
        ))),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Puts back the current instance's credentials Secret when it was
/// deleted, with new credentials: a Pod's mounted copy takes them within a
/// volume refresh; a VM keeps the ones it was built with, fails its probes
/// and is replaced as any unhealthy instance.
pub async fn restore(ctx: &Context, proxy: &Proxy, secret: Option<&str>) -> Result<(), Error> {
    let Some(name) = secret else {
        return Ok(());
    };
    // The watch alone: a Secret this process wrote a moment ago and a
    // user deleted since is gone (a create the watch has not shown yet
    // answers 409, and the next pass looks again).
    let namespace = proxy.namespace().unwrap_or_default();
    if ctx.credentials.watched(&namespace, name) != Lookup::Missing {
        return Ok(());
    }
    tracing::warn!(secret = %name, "The instance's credentials Secret was deleted: generating new ones");
    store(ctx, proxy, name).await.map(|_| ())
}

/// After the delete of the instance whose credentials `secret` holds was
/// asked: new credentials into it, so that the instance re-created under
/// its name (a drain-first replacement keeps the name) takes new ones; or,
/// when the Proxy now asks for none, the Secret deleted. Best effort: on
/// failure the new instance takes the old credentials (a warning says
/// so), or the unused Secret stays until the Proxy goes.
pub async fn replaced(ctx: &Context, proxy: &Proxy, secret: Option<&str>) {
    if ProxyAuth::mode_of(proxy.spec.auth.as_ref()) == AuthMode::None {
        forget(ctx, proxy, secret).await;
    } else {
        rotate(ctx, proxy, secret).await;
    }
}

async fn rotate(ctx: &Context, proxy: &Proxy, secret: Option<&str>) {
    let Some(name) = secret else { return };
    let namespace = proxy.namespace().unwrap_or_default();
    let (creds, line) = match generate(name).await {
        Ok(made) => made,
        Err(e) => {
            warn!(secret = %name, error = %plain_message(&e), "Cannot rotate the credentials: the next instance takes the current ones");
            return;
        }
    };
    let patch = serde_json::json!({"stringData": {
        credentials::USERNAME_KEY: creds.username,
        credentials::PASSWORD_KEY: creds.expose(),
        credentials::HTPASSWD_KEY: line,
    }});
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            ctx.credentials.wrote(&namespace, name, &creds);
            info!(secret = %name, "Credentials rotated for the next instance");
        }
        // Gone: the next create generates new ones anyway.
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            warn!(secret = %name, error = %plain_message(&e), "Cannot rotate the credentials: the next instance takes the current ones")
        }
    }
}

/// Deletes the credentials Secret of an instance that is gone for good (a
/// retired or given-up one). Best effort: a Secret left over goes with its
/// Proxy.
pub async fn forget(ctx: &Context, proxy: &Proxy, secret: Option<&str>) {
    let Some(name) = secret else { return };
    let api: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &proxy.namespace().unwrap_or_default());
    match api.delete(name, &Default::default()).await {
        Ok(_) => info!(secret = %name, "Credentials of a gone instance deleted"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            warn!(secret = %name, error = %plain_message(&e), "Cannot delete the credentials of a gone instance")
        }
    }
}
