//! GC sweeps against the test API server with scripted providers: a
//! failing provider list skips that provider only, a failing Proxy list
//! skips the whole sweep, the per-sweep budget holds across providers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use egress_proxies_operator::config::ProvidersConfig;
use egress_proxies_operator::gc::{Gc, Settings};
use egress_proxies_operator::metrics::Metrics;
use egress_proxies_operator::provider::registry::{ProviderType, Registry};
use egress_proxies_operator::provider::{
    CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider, ProviderError,
};
use test_apiserver::{Options, TestApiServer};

struct Scripted {
    name: String,
    fail_list: bool,
    instances: Vec<Instance>,
    deleted: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Provider for Scripted {
    fn name(&self) -> &str {
        &self.name
    }
    fn provider_type(&self) -> ProviderType {
        ProviderType::Kubernetes
    }
    async fn create(&self, _req: &CreateRequest) -> Result<String, ProviderError> {
        unreachable!("GC never creates")
    }
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        Err(ProviderError::new(
            ErrorClass::NotFound,
            Op::Get,
            &self.name,
            id,
            "gone",
        ))
    }
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        self.deleted
            .lock()
            .unwrap()
            .push(format!("{}:{id}", self.name));
        Ok(())
    }
    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        if self.fail_list {
            return Err(ProviderError::new(
                ErrorClass::Transient,
                Op::List,
                &self.name,
                "",
                "backend down",
            ));
        }
        Ok(Listing {
            instances: self.instances.clone(),
            unread_scopes: Vec::new(),
        })
    }
}

fn orphan(id: &str) -> Instance {
    Instance {
        uid: format!("uid-{id}"),
        installation_id: "ours".into(),
        created_at: Some(Utc::now() - chrono::Duration::hours(1)),
        ..Instance::new(id, InstanceState::Running)
    }
}

async fn setup(with_crds: bool, max_deletes: u32) -> (TestApiServer, Gc, Arc<Mutex<Vec<String>>>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = TestApiServer::start(Options {
        crds_dir: with_crds.then(test_apiserver::workspace_crds_dir),
        ..Default::default()
    })
    .await
    .expect("test API server starts");
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let cfg = ProvidersConfig::from_slice(
        b"providers:\n  - name: a-broken\n    type: kubernetes\n  - name: b-fine\n    type: kubernetes\n",
    )
    .unwrap();
    let d = deleted.clone();
    let registry = Registry::build(&cfg, &Metrics::new().provider, |e| {
        let p: Arc<dyn Provider> = Arc::new(Scripted {
            name: e.name.clone(),
            fail_list: e.name == "a-broken",
            instances: vec![orphan("x"), orphan("y"), orphan("z")],
            deleted: d.clone(),
        });
        Ok(p)
    })
    .unwrap();
    let gc = Gc::new(
        server.client(),
        registry,
        Settings {
            interval: Duration::from_secs(3600),
            min_age: Duration::from_secs(60),
            max_deletes,
            installation_id: "ours".into(),
        },
    );
    (server, gc, deleted)
}

#[tokio::test]
async fn a_failing_provider_list_skips_only_that_provider_and_the_budget_holds() {
    let (_server, mut gc, deleted) = setup(true, 2).await;
    let report = gc.sweep().await;
    assert!(report.ran);
    assert_eq!(report.failed_providers, ["a-broken"]);
    assert_eq!(report.deleted, 2, "budget of 2");
    assert_eq!(*deleted.lock().unwrap(), ["b-fine:x", "b-fine:y"]);
}

#[tokio::test]
async fn a_failing_proxy_list_skips_the_sweep() {
    // No CRDs: listing Proxies fails.
    let (_server, mut gc, deleted) = setup(false, 20).await;
    let report = gc.sweep().await;
    assert!(!report.ran);
    assert_eq!(report.deleted, 0);
    assert!(deleted.lock().unwrap().is_empty());
}
