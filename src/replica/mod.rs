//! The replicated lease table's protocol between processes, below the
//! discovery API and the gateway (docs/architecture.md, "Replicas trust
//! only each other" and "In-sync followers"): the shared keys and their
//! rotation, the seals every call between replicas carries, who is in
//! sync with the leader and how old a copy is, the leader's memory of
//! request keys, the bounded queue of a gateway's messages to the leader
//! and their delivery, the lease table as a gateway uses it, the planned
//! hand-over of the table and the horizon a next leader waits for.
//! Nothing here names the discovery API's routes or state.

pub mod copy;
pub mod copy_age;
pub mod credentials_copy;
pub mod feed;
pub mod forward;
pub mod handover;
pub mod horizon;
pub mod internal;
pub mod key_reload;
pub mod lease_key;
pub mod lease_service;
pub mod members;
pub mod outbox;
pub mod replay;
pub mod to_leader;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;

/// A Secret of the operator's own (keys, hand-over chunks): `name`,
/// labelled as the operator's, holding `bytes` under `data_key`.
pub(crate) fn own_secret(name: &str, data_key: &str, bytes: Vec<u8>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "egress-proxies-operator".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(data_key.to_string(), ByteString(bytes))])),
        ..Default::default()
    }
}
