//! The reconcile's writes to its Proxy: the status (a merge patch of what
//! changed), and metadata under the object's resourceVersion.

use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tracing::instrument;

use super::status_patch;
use crate::api::constants::SPEC_HASH_ANNOTATION;
use crate::api::{Proxy, ProxyStatus};
use crate::controller::error::Error;

#[instrument(name = "status.patch", skip_all)]
pub(super) async fn patch_status(
    proxy: &Proxy,
    client: &Client,
    base: &ProxyStatus,
    new: &ProxyStatus,
) -> Result<(), Error> {
    let (Ok(b), Ok(n)) = (serde_json::to_value(base), serde_json::to_value(new)) else {
        return Ok(());
    };
    let Some(diff) = status_patch::merge_diff(&b, &n) else {
        return Ok(());
    };
    let api: Api<Proxy> = Api::namespaced(client.clone(), &proxy.namespace().unwrap_or_default());
    match api
        .patch_status(
            &proxy.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": diff })),
        )
        .await
    {
        Ok(_) => Ok(()),
        // The reconcile may just have released the last finalizer.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Updates metadata with the object's resourceVersion as a precondition,
/// so a stale write fails with a conflict instead of clobbering.
pub(super) async fn patch_metadata(
    proxy: &Proxy,
    client: &Client,
    metadata: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<Proxy> = Api::namespaced(client.clone(), &proxy.namespace().unwrap_or_default());
    let mut md = metadata;
    md["resourceVersion"] = json!(proxy.resource_version());
    api.patch(
        &proxy.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": md })),
    )
    .await?;
    Ok(())
}

/// Writes the spec-hash annotation unless it already holds `hash`, and
/// remembers what was written.
pub(super) async fn record_hash(
    proxy: &Proxy,
    client: &Client,
    recorded: &mut Option<String>,
    hash: &Option<String>,
) -> Result<(), Error> {
    if recorded != hash {
        patch_metadata(
            proxy,
            client,
            json!({ "annotations": { SPEC_HASH_ANNOTATION: hash } }),
        )
        .await?;
        recorded.clone_from(hash);
    }
    Ok(())
}
