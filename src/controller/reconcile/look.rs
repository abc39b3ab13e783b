//! The one way a reconcile reads an instance: from the provider's
//! observation when it holds the instance, else by one `get` (issue 19:
//! a Running Proxy costs no per-Proxy call while its provider observes).

use crate::api::ProxyStatus;
use crate::controller::plan::GetOutcome;
use crate::provider::Provider;

/// What the reconcile knows of instance `id`, for a pass that started
/// from `status`.
pub(super) async fn look(provider: &dyn Provider, id: &str, status: &ProxyStatus) -> GetOutcome {
    match GetOutcome::observed(provider.observed(id), status) {
        Some(seen) => seen,
        None => GetOutcome::of(provider.get(id).await),
    }
}
