//! Shared helpers for the integration tests.
#![allow(dead_code)]

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{json, Value};
use std::future::Future;
use std::time::Duration;
use test_apiserver::{Options, TestApiServer};

pub async fn server() -> TestApiServer {
    TestApiServer::start(Options {
        crds_dir: Some(test_apiserver::workspace_crds_dir()),
        ..Default::default()
    })
    .await
    .expect("server starts")
}

pub fn proxy_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "Proxy"),
        "proxies",
    )
}

pub fn health_ar() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crawl.example.com", "v1alpha1", "ProviderHealth"),
        "providerhealths",
    )
}

pub fn proxies(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), "default", &proxy_ar())
}

pub fn proxy(name: &str, spec: Value) -> DynamicObject {
    let v = json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    });
    serde_json::from_value(v).expect("a valid DynamicObject")
}

pub fn p1(name: &str) -> DynamicObject {
    proxy(name, json!({"provider": "kubernetes", "port": 3128}))
}

/// The API error code and message of a failed call.
pub fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Run `f` with a deadline, panicking with `what` on timeout.
pub async fn within<T>(secs: u64, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs}s: {what}"))
}

pub fn rv(o: &DynamicObject) -> String {
    o.metadata
        .resource_version
        .clone()
        .expect("a resourceVersion")
}

pub fn generation(o: &DynamicObject) -> i64 {
    o.metadata.generation.expect("a generation")
}
