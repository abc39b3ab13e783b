//! Size bounds of what a tenant writes into a Proxy or a ProxyPool's
//! template. The API server enforces them (they are in the CRDs' schema),
//! so an oversized object is refused naming its field before the operator,
//! etcd or the CEL rules see it; the bounds also keep the CEL rules' cost
//! estimates low. docs/api-reference.md lists them.

/// `spec.cloudInit.inline`, in characters (64 KiB of ASCII): far above a
/// cloud-config that installs a proxy, and well under GCE's 256 KB
/// metadata value, so it never fails at the cloud instead.
pub const CLOUD_INIT_INLINE_MAX: u64 = 64 * 1024;

/// Entries of `spec.attributes`: every one is copied into each listing
/// and lease answer of the discovery API.
pub const ATTRIBUTES_MAX: u64 = 32;

/// A key or value of `spec.attributes`, in characters.
pub const ATTRIBUTE_MAX: u64 = 256;

/// A `spec.placement` string: a DNS name's length, which zones, machine
/// types and image names stay well within.
pub const PLACEMENT_MAX: u64 = 253;

/// A duration such as `spec.recycle.maxAge` (`24h`, `1h30m`): far more
/// than any valid one needs.
pub const DURATION_MAX: u64 = 32;

/// A Secret's key (`cloudInit.secretRef.key`): Kubernetes' own bound.
pub const SECRET_KEY_MAX: u64 = 253;

/// Labels and annotations of a pool's template, each.
pub const TEMPLATE_METADATA_MAX: u64 = 32;

/// A label or annotation key: a 253-character prefix, `/`, and a
/// 63-character name (Kubernetes' bound).
pub const METADATA_KEY_MAX: u64 = 317;

/// A label value (Kubernetes' bound).
pub const LABEL_VALUE_MAX: u64 = 63;

/// An annotation value of a pool's template: 32 of them fit Kubernetes'
/// 256 KiB bound on an object's annotations with room for the operator's.
pub const ANNOTATION_VALUE_MAX: u64 = 4096;
