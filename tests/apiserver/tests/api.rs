//! The test API server against the real kube-rs client.

mod common;

use common::*;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;
use std::collections::BTreeMap;

#[tokio::test]
async fn watch_resumes_from_resource_version_and_410_when_too_old() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let a = api.create(&PostParams::default(), &p1("a")).await.unwrap();
    let from = rv(&a);
    api.create(&PostParams::default(), &p1("b")).await.unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let stream = api
        .watch(&WatchParams::default().timeout(10), &from)
        .await
        .unwrap();
    let events: Vec<_> = within(10, "3 watch events", stream.take(3).try_collect::<Vec<_>>())
        .await
        .unwrap();
    let names: Vec<String> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.clone().unwrap()),
            WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.clone().unwrap()),
            WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.clone().unwrap()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["ADDED b", "MODIFIED a", "DELETED b"]);

    // Push the starting point out of the retained event window.
    let cms: Api<ConfigMap> = Api::default_namespaced(srv.client());
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("churn".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    for i in 0..=test_apiserver::store::EVENT_WINDOW {
        let p = json!({"data": {"i": i.to_string()}});
        cms.patch("churn", &PatchParams::default(), &Patch::Merge(p))
            .await
            .unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &from)
        .await
        .unwrap()
        .boxed();
    match within(5, "410 event", stream.next()).await {
        Some(Ok(WatchEvent::Error(s))) => assert_eq!(s.code, 410, "{s:?}"),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_arrive_when_allowed() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let list = api.list(&ListParams::default()).await.unwrap();
    let from = list.metadata.resource_version.unwrap();
    let wp = WatchParams::default().timeout(10);
    assert!(wp.bookmarks, "kube asks for bookmarks by default");
    let mut stream = api.watch(&wp, &from).await.unwrap().boxed();
    match within(8, "a bookmark", stream.next()).await {
        Some(Ok(WatchEvent::Bookmark(b))) => assert!(!b.metadata.resource_version.is_empty()),
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn stale_resource_version_conflicts_and_errors_are_statuses() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let created = api.create(&PostParams::default(), &p1("c")).await.unwrap();
    let mut stale = created.clone();
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"port": 3129}})),
    )
    .await
    .unwrap();
    stale.data["spec"]["port"] = json!(3130);
    let (code, reason, msg) = api_err(api.replace("c", &PostParams::default(), &stale).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"), "{msg}");
    let p = json!({"metadata": {"resourceVersion": rv(&created)}, "spec": {"port": 3131}});
    let (code, _, _) = api_err(
        api.patch("c", &PatchParams::default(), &Patch::Merge(p))
            .await,
    );
    assert_eq!(code, 409);
    let (code, reason, _) = api_err(api.create(&PostParams::default(), &p1("c")).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    let (code, reason, msg) = api_err(api.get("nope").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert_eq!(msg, "proxies.crawl.example.com \"nope\" not found");
    // A current resourceVersion is accepted.
    let cur = api.get("c").await.unwrap();
    let mut next = cur.clone();
    next.data["spec"]["port"] = json!(3132);
    let replaced = api
        .replace("c", &PostParams::default(), &next)
        .await
        .unwrap();
    assert_ne!(rv(&replaced), rv(&cur));
}

#[tokio::test]
async fn generation_bumps_only_on_spec_change() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let o = api.create(&PostParams::default(), &p1("g")).await.unwrap();
    assert_eq!(generation(&o), 1);
    assert_eq!(o.metadata.uid.as_ref().map(|u| u.len()), Some(36));
    assert!(o.metadata.creation_timestamp.is_some());
    let pp = PatchParams::default();
    let o = api
        .patch(
            "g",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(generation(&o), 1);
    let o = api
        .patch("g", &pp, &Patch::Merge(json!({"spec": {"port": 8080}})))
        .await
        .unwrap();
    assert_eq!(generation(&o), 2);
    let o = api
        .patch_status(
            "g",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(generation(&o), 2);
    // A no-op write changes nothing, not even the resourceVersion.
    let same = api
        .patch("g", &pp, &Patch::Merge(json!({"spec": {"port": 8080}})))
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&o));
}

#[tokio::test]
async fn status_subresource_is_split_from_spec() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let pp = PatchParams::default();
    api.create(&PostParams::default(), &p1("s")).await.unwrap();
    api.patch_status(
        "s",
        &pp,
        &Patch::Merge(json!({"status": {"phase": "Running", "ip": "10.0.0.1"}})),
    )
    .await
    .unwrap();
    // Writes to the main resource keep the old status.
    let o = api
        .patch(
            "s",
            &pp,
            &Patch::Merge(json!({"spec": {"port": 9000}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(o.data["status"]["phase"], "Running");
    assert_eq!(o.data["spec"]["port"], 9000);
    let g = generation(&o);
    // Status writes do not change spec or generation.
    let o = api
        .patch_status(
            "s",
            &pp,
            &Patch::Merge(json!({"spec": {"port": 1}, "status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    assert_eq!(o.data["spec"]["port"], 9000);
    assert_eq!(o.data["status"]["phase"], "Ready");
    assert_eq!(generation(&o), g);
    // Status values are validated too.
    let (code, _, msg) = api_err(
        api.patch_status(
            "s",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Sleeping"}})),
        )
        .await,
    );
    assert_eq!(code, 422, "{msg}");
    assert!(msg.contains("status.phase"), "{msg}");
    // Cluster-scoped, status-only kind.
    let ph: Api<DynamicObject> = Api::all_with(srv.client(), &health_ar());
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProviderHealth",
        "metadata": {"name": "kubernetes"}}))
    .unwrap();
    ph.create(&PostParams::default(), &obj).await.unwrap();
    let st = json!({"status": {"type": "kubernetes", "targetsReady": "1/1"}});
    let o = ph
        .patch_status("kubernetes", &pp, &Patch::Merge(st))
        .await
        .unwrap();
    assert_eq!(o.data["status"]["targetsReady"], "1/1");
    assert_eq!(generation(&o), 1);
}

/// Like kube-apiserver, a custom resource without `kind` is refused (a
/// lenient server hid that the operator created ProviderHealths untyped).
#[tokio::test]
async fn a_custom_resource_without_its_kind_is_refused() {
    let srv = server().await;
    let ph: Api<DynamicObject> = Api::all_with(srv.client(), &health_ar());
    let mut obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProviderHealth",
        "metadata": {"name": "untyped"}}))
    .unwrap();
    obj.types = None;
    let (code, _, msg) = api_err(ph.create(&PostParams::default(), &obj).await);
    assert_eq!(code, 400, "{msg}");
    assert!(msg.contains("Object 'Kind' is missing"), "{msg}");
    assert!(msg.contains("must be of type ProviderHealth"), "{msg}");
    let mut wrong = obj.clone();
    wrong.types = Some(kube::core::TypeMeta {
        api_version: "crawl.example.com/v1".into(),
        kind: "ProviderHealth".into(),
    });
    let (code, _, msg) = api_err(ph.create(&PostParams::default(), &wrong).await);
    assert_eq!(code, 400, "{msg}");
    assert!(
        msg.contains("does not match the expected API version"),
        "{msg}"
    );
}

/// Like kube-apiserver, a CRD that describes the top-level metadata is refused.
#[test]
fn a_crd_describing_metadata_is_refused() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"kind": "Thing", "plural": "things"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "metadata": {"type": "object", "description": "meta"}}}}}]}
    });
    let err = test_apiserver::resources::crd_defs(&crd).unwrap_err();
    assert!(err.contains("properties[metadata]: Forbidden"), "{err}");
    let mut ok = crd.clone();
    ok["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] =
        json!({"type": "object"});
    assert!(test_apiserver::resources::crd_defs(&ok).is_ok());
}

#[tokio::test]
async fn finalizers_and_deletion_timestamp() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let pp = PatchParams::default();
    let mut o = p1("f");
    o.metadata.finalizers = Some(vec!["crawl.example.com/cleanup".into()]);
    api.create(&PostParams::default(), &o).await.unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    let from = list.metadata.resource_version.unwrap();
    let res = api.delete("f", &DeleteParams::default()).await.unwrap();
    let kept = res
        .left()
        .expect("the object is returned while finalizers remain");
    assert!(kept.metadata.deletion_timestamp.is_some());
    let again = api.get("f").await.unwrap();
    assert!(again.metadata.deletion_timestamp.is_some());
    // No new finalizers once deleting.
    let add = json!({"metadata": {"finalizers": ["crawl.example.com/cleanup", "other/x"]}});
    let (code, _, msg) = api_err(api.patch("f", &pp, &Patch::Merge(add)).await);
    assert_eq!(code, 422, "{msg}");
    api.patch(
        "f",
        &pp,
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let (code, _, _) = api_err(api.get("f").await);
    assert_eq!(code, 404);
    let stream = api
        .watch(&WatchParams::default().timeout(5), &from)
        .await
        .unwrap();
    let evs: Vec<_> = within(5, "2 events", stream.take(2).try_collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(matches!(&evs[0], WatchEvent::Modified(o) if o.metadata.deletion_timestamp.is_some()));
    assert!(matches!(&evs[1], WatchEvent::Deleted(_)));
    // Without finalizers, delete is immediate.
    api.create(&PostParams::default(), &p1("f2")).await.unwrap();
    api.delete("f2", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(api.get("f2").await).0, 404);
}

#[tokio::test]
async fn schema_validation_and_cel_rules() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let pp = PostParams::default();
    let bad_port = proxy("v1", json!({"provider": "kubernetes", "port": 70000}));
    let (code, reason, msg) = api_err(api.create(&pp, &bad_port).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        msg,
        "Proxy.crawl.example.com \"v1\" is invalid: spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535"
    );
    let bad_mode = proxy(
        "v2",
        json!({"provider": "kubernetes", "port": 1, "mode": "Bogus"}),
    );
    let (code, _, msg) = api_err(api.create(&pp, &bad_mode).await);
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.mode: Unsupported value: \"Bogus\""),
        "{msg}"
    );
    let no_port = proxy("v3", json!({"provider": "kubernetes"}));
    let (code, _, msg) = api_err(api.create(&pp, &no_port).await);
    assert_eq!(code, 422);
    assert!(msg.contains("spec.port: Required value"), "{msg}");
    let external = proxy("v4", json!({"mode": "External"}));
    let (_, _, msg) = api_err(api.create(&pp, &external).await);
    assert!(msg.contains("spec.endpoint: Required value"), "{msg}");
    let both = proxy(
        "v5",
        json!({"provider": "k", "port": 1, "cloudInit": {"inline": "x", "secretRef": {"name": "s"}}}),
    );
    let (_, _, msg) = api_err(api.create(&pp, &both).await);
    assert!(
        msg.contains("exactly one of cloudInit.inline or cloudInit.secretRef"),
        "{msg}"
    );

    // Defaulting: mode becomes Managed; transition rule: provider is immutable.
    let ok = api.create(&pp, &p1("v6")).await.unwrap();
    assert_eq!(ok.data["spec"]["mode"], "Managed");
    let change = json!({"spec": {"provider": "gcp"}});
    let (code, _, msg) = api_err(
        api.patch("v6", &PatchParams::default(), &Patch::Merge(change))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("spec.provider: Invalid value: \"string\": spec.provider is immutable"),
        "{msg}"
    );
    // Validation runs on the patched result (JSON patch too).
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/spec/port", "value": 0}]))
            .unwrap();
    let (code, _, msg) = api_err(
        api.patch("v6", &PatchParams::default(), &Patch::<()>::Json(jp))
            .await,
    );
    assert_eq!(code, 422);
    assert!(msg.contains("spec.port"), "{msg}");
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let srv = server().await;
    let api = proxies(&srv.client());
    let ssa = PatchParams::apply("test").force();
    let o = api
        .patch("ssa", &ssa, &Patch::Apply(p1("ssa")))
        .await
        .unwrap();
    assert_eq!(generation(&o), 1);
    let mut changed = p1("ssa");
    changed.data["spec"]["port"] = json!(4000);
    let o = api
        .patch("ssa", &ssa, &Patch::Apply(changed))
        .await
        .unwrap();
    assert_eq!(o.data["spec"]["port"], 4000);
    assert_eq!(generation(&o), 2);
    let st = json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "status": {"phase": "Provisioning"}});
    let o = api
        .patch_status("ssa", &ssa, &Patch::Apply(st))
        .await
        .unwrap();
    assert_eq!(o.data["status"]["phase"], "Provisioning");
}

#[tokio::test]
async fn label_and_field_selectors() {
    let srv = server().await;
    let api = proxies(&srv.client());
    for (name, labels) in [
        ("l1", vec![("tier", "a"), ("geo", "eu")]),
        ("l2", vec![("tier", "b")]),
        ("l3", vec![]),
    ] {
        let mut o = p1(name);
        let l: BTreeMap<String, String> = labels
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        o.metadata.labels = Some(l);
        api.create(&PostParams::default(), &o).await.unwrap();
    }
    let names = |sel: &'static str| {
        let api = api.clone();
        async move {
            let list = api.list(&ListParams::default().labels(sel)).await.unwrap();
            list.items
                .into_iter()
                .map(|o| o.metadata.name.unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(names("tier=a").await, ["l1"]);
    assert_eq!(names("tier==b").await, ["l2"]);
    assert_eq!(names("tier!=a").await, ["l2", "l3"]);
    assert_eq!(names("tier in (a,b)").await, ["l1", "l2"]);
    assert_eq!(names("tier notin (a)").await, ["l2", "l3"]);
    assert_eq!(names("geo").await, ["l1"]);
    assert_eq!(names("!geo").await, ["l2", "l3"]);
    let list = api
        .list(&ListParams::default().fields("metadata.name=l2"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    // Cross-namespace list.
    let all: Api<DynamicObject> = Api::all_with(srv.client(), &proxy_ar());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        3
    );
    let other: Api<DynamicObject> = Api::namespaced_with(srv.client(), "kube-system", &proxy_ar());
    assert!(other
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

#[tokio::test]
async fn runtime_watcher_sees_changes() {
    let srv = server().await;
    let api = proxies(&srv.client());
    api.create(&PostParams::default(), &p1("w0")).await.unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let first = within(10, "initial object", stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("w0"));
    api.create(&PostParams::default(), &p1("w1")).await.unwrap();
    let second = within(10, "new object", stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.metadata.name.as_deref(), Some("w1"));
    api.patch_status(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Ready"}})),
    )
    .await
    .unwrap();
    let third = within(10, "status change", stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.data["status"]["phase"], "Ready");
}

#[tokio::test]
async fn discovery_and_namespaces() {
    let srv = server().await;
    let client = srv.client();
    let list = client
        .list_api_group_resources("crawl.example.com/v1alpha1")
        .await
        .unwrap();
    let px = list.resources.iter().find(|r| r.name == "proxies").unwrap();
    assert!(px.namespaced);
    assert_eq!(px.short_names.as_deref(), Some(&["px".to_string()][..]));
    assert!(list.resources.iter().any(|r| r.name == "proxies/status"));
    let ph = list
        .resources
        .iter()
        .find(|r| r.name == "providerhealths")
        .unwrap();
    assert!(!ph.namespaced);
    let core = client.list_core_api_resources("v1").await.unwrap();
    for r in [
        "pods",
        "pods/status",
        "secrets",
        "configmaps",
        "events",
        "namespaces",
    ] {
        assert!(core.resources.iter().any(|x| x.name == r), "{r}");
    }
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ks = ns.get("kube-system").await.unwrap();
    assert_eq!(
        ks.metadata.uid.as_deref(),
        Some(test_apiserver::store::KUBE_SYSTEM_UID)
    );
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
    // generateName.
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let mut cm = ConfigMap::default();
    cm.metadata.generate_name = Some("gen-".into());
    let made = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(made.metadata.name.unwrap().starts_with("gen-"));
}

#[tokio::test]
async fn binary_serves_until_sigterm() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kc)
        .arg("--crds")
        .arg(test_apiserver::workspace_crds_dir())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = within(20, "ready line", lines.next_line()).await.unwrap();
    assert_eq!(line.as_deref(), Some("ready"));
    let text = std::fs::read_to_string(&kc).unwrap();
    assert!(
        text.contains("server: http://127.0.0.1:") && !text.contains(":0\n"),
        "{text}"
    );
    let kubeconfig = kube::config::Kubeconfig::read_from(&kc).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    test_apiserver::install_crypto_provider();
    let client = kube::Client::try_from(config).unwrap();
    let api = proxies(&client);
    api.create(&PostParams::default(), &p1("bin"))
        .await
        .unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let status = within(10, "exit after SIGTERM", child.wait())
        .await
        .unwrap();
    assert!(status.success() || status.code().is_some(), "{status:?}");
}
