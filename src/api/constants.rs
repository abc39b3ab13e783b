//! Names that must match exactly across the operator, its manifests, its
//! users' tooling and the backends (operator.md §0.3).

/// API group of both custom resources.
pub const GROUP: &str = "crawl.example.com";
/// API version of both custom resources.
pub const VERSION: &str = "v1alpha1";
/// Project, binary, OpenTelemetry service name and managed-by value.
pub const OPERATOR_NAME: &str = "egress-proxies-operator";
/// The CRDs' category: `kubectl get egress-proxies` lists Proxies and
/// ProviderHealths together (the derive on Proxy spells it out too).
pub const CATEGORY: &str = "egress-proxies";
/// Namespace the manifests install into.
pub const INSTALL_NAMESPACE: &str = "egress-proxies-operator-system";

/// Finalizer on managed Proxies: holds the object until its instance is gone.
pub const FINALIZER: &str = "crawl.example.com/finalizer";
/// Annotation holding the hash of the spec the instance was built from.
pub const SPEC_HASH_ANNOTATION: &str = "crawl.example.com/spec-hash";
/// Annotation that lets deletion drop the finalizer without cleanup;
/// honoured only when its value is exactly `"true"`.
pub const SKIP_CLEANUP_ANNOTATION: &str = "crawl.example.com/skip-cleanup";
/// Annotation on a Proxy asking for a new instance (a fresh egress IP):
/// each new value is acted on once, through the provider's budget and a
/// drain (`status.replaceHandled` holds the last value acted on). The
/// lease API's `POST /v1/leases/{id}/replace` writes it too.
pub const REPLACE_ANNOTATION: &str = "crawl.example.com/replace";
/// Annotation on a ProviderHealth that resets the provider's circuit
/// breaker (any value); the operator removes it once it has acted.
pub const RESET_CIRCUIT_BREAKER_ANNOTATION: &str = "crawl.example.com/reset-circuit-breaker";
/// Label a Secret must carry before the operator reads cloud-init from it.
pub const CLOUD_INIT_SECRET_LABEL: &str = "crawl.example.com/cloud-init";
/// Label on every credentials Secret the operator reads: those it
/// generates for Managed Proxies, and those users name for External ones.
pub const CREDENTIALS_SECRET_LABEL: &str = "crawl.example.com/proxy-credentials";
/// Standard ownership label on objects the operator creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Backend-side mark: every instance the operator creates carries
/// `proxy-operator-managed=true`.
pub const MANAGED_MARK: &str = "proxy-operator-managed";
/// The only value of [`MANAGED_MARK`] that counts as managed.
pub const MANAGED_MARK_VALUE: &str = "true";
/// Backend-side mark holding the owning Proxy's UID.
pub const UID_MARK: &str = "proxy-operator-uid";
/// Backend-side mark holding the installation identity, so GC can tell this
/// installation's instances from another cluster's.
pub const INSTALLATION_MARK: &str = "proxy-operator-installation";

/// Annotation on the leader-election Lease: the leader's discovery API
/// base URL, where followers forward lease calls.
pub const DISCOVERY_URL_ANNOTATION: &str = "crawl.example.com/discovery-url";

/// Name of the Lease used for leader election.
pub const LEADER_ELECTION_ID: &str = "egress-proxies-operator.crawl.example.com";

/// `true` only for the exact annotation value `"true"`.
pub fn is_true_annotation(value: Option<&str>) -> bool {
    value == Some("true")
}

/// Label naming the pool a Proxy belongs to (its `status.selector`).
pub const POOL_LABEL: &str = "crawl.example.com/pool";

/// Annotation a pool writes on a Proxy it scales down: from then on the
/// Proxy gets no new lease and no renewal; it is deleted once its leases
/// end or its drain timeout passes. Its value is when (RFC 3339).
pub const SCALE_DOWN_ANNOTATION: &str = "crawl.example.com/scale-down";

/// Annotation with the hash of the pool template a Proxy was made from.
pub const POOL_TEMPLATE_ANNOTATION: &str = "crawl.example.com/pool-template-hash";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_cleanup_needs_exactly_true() {
        assert!(is_true_annotation(Some("true")));
        for v in [
            None,
            Some(""),
            Some("True"),
            Some("yes"),
            Some("1"),
            Some(" true"),
        ] {
            assert!(!is_true_annotation(v), "{v:?}");
        }
    }
}
