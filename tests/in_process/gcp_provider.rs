//! The gcp provider's contract tests (providers.md §14), with the real
//! Compute client pointed at a local stand-in (tests/gcp_standin).
#![cfg(feature = "gcp")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::gcp_standin;

use std::time::Duration;

use egress_proxies_operator::config::GcpConfig;
use egress_proxies_operator::provider::gcp::{GcpOptions, GcpProvider};
use egress_proxies_operator::provider::{
    Checker, CreateRequest, ErrorClass, InstanceState, Provider,
};
use gcp_standin::{StandIn, ZONE};
use serde_json::json;

fn cfg(endpoint: &str) -> GcpConfig {
    gcp_standin::config(endpoint)
}

fn opts() -> GcpOptions {
    gcp_standin::options(false)
}

async fn setup() -> (StandIn, GcpProvider) {
    let s = StandIn::start().await;
    let p = GcpProvider::new("gcp-eu", &cfg(&s.url), opts()).unwrap();
    (s, p)
}

fn req(name: &str, uid: &str) -> CreateRequest {
    gcp_standin::request(name, uid, "#cloud-config\n")
}

#[tokio::test]
async fn constructor_does_not_dial() {
    // Nothing listens there; new() must still succeed.
    let p = GcpProvider::new("gcp-eu", &cfg("http://127.0.0.1:9"), opts()).unwrap();
    assert_eq!(p.name(), "gcp-eu");
    assert!(p.checker().is_some());
}

#[tokio::test]
async fn repeat_create_returns_same_id_without_a_second_instance() {
    let (s, p) = setup().await;
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    assert_eq!(id, format!("zones/{ZONE}/instances/proxy-a"));
    let again = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    assert_eq!(again, id);
    assert_eq!(s.instance_count(), 1);
    // Past the request-id window: 409, adopted after the uid check.
    s.forget_request_ids();
    let third = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    assert_eq!(third, id);
    assert_eq!(s.instance_count(), 1);
    // Every insert carried the same request id.
    let rids: Vec<String> = s
        .requests()
        .into_iter()
        .filter(|(m, _, _)| m == "POST")
        .map(|(_, _, q)| {
            q.split('&')
                .find(|kv| kv.starts_with("requestId="))
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(rids.len(), 3);
    assert!(
        rids.iter()
            .all(|r| r == &rids[0] && r.len() == "requestId=".len() + 36),
        "{rids:?}"
    );
}

#[tokio::test]
async fn adoption_with_a_wrong_uid_is_permanent() {
    let (s, p) = setup().await;
    p.create(&req("proxy-a", "uid-a")).await.unwrap();
    let e = p.create(&req("proxy-a", "uid-b")).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
    let m = e.to_string();
    assert!(m.contains("uid-a") && m.contains("uid-b"), "{m}");
    assert_eq!(s.instance_count(), 1);
}

#[tokio::test]
async fn impossible_placement_is_permanent_before_any_call() {
    let (s, p) = setup().await;
    for (field, edit) in [
        (
            "placement.zone",
            (|r: &mut CreateRequest| r.placement.zone.clear()) as fn(&mut CreateRequest),
        ),
        ("placement.machineType", |r| {
            r.placement.machine_type.clear()
        }),
        ("placement.image", |r| r.placement.image.clear()),
    ] {
        let mut r = req("proxy-a", "uid-a");
        edit(&mut r);
        let e = p.create(&r).await.unwrap_err();
        assert!(e.is(ErrorClass::Permanent), "{e}");
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(e.provider(), "gcp-eu");
    }
    assert!(s.requests().is_empty());
}

#[tokio::test]
async fn a_placement_outside_the_allowlists_is_permanent_before_any_call() {
    let s = StandIn::start().await;
    let mut c = cfg(&s.url);
    c.allowed_machine_types = vec!["e2-small".into()];
    let p = GcpProvider::new("gcp-eu", &c, opts()).unwrap();
    let mut r = req("proxy-a", "uid-a");
    r.placement.machine_type = "n2-highmem-96".into();
    let e = p.create(&r).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
    assert!(
        e.to_string()
            .contains("placement.machineType \"n2-highmem-96\" is not allowed"),
        "{e}"
    );
    assert!(s.requests().is_empty(), "the stand-in was called");
    // A listed one goes through.
    r.placement.machine_type = "e2-small".into();
    p.create(&r).await.unwrap();
    assert_eq!(s.instance_count(), 1);
}

#[tokio::test]
async fn get_reads_state_ip_uid_and_created_at_back() {
    let (s, p) = setup().await;
    let before = chrono::Utc::now() - chrono::Duration::seconds(5);
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    let first = p.get(&id).await.unwrap();
    assert_eq!(first.state, InstanceState::Provisioning);
    assert_eq!(first.ip, "");
    let second = p.get(&id).await.unwrap();
    assert_eq!(second.state, InstanceState::Running);
    assert!(second.ip.starts_with("127.0.0."), "{}", second.ip);
    assert_eq!(second.uid, "uid-a");
    assert_eq!(second.installation_id, "inst-1");
    assert_eq!(second.id, id);
    let created = second.created_at.expect("created_at");
    assert!(
        created >= before && created <= chrono::Utc::now(),
        "{created}"
    );
    s.set_creation_timestamp("proxy-a", "not a time");
    assert_eq!(p.get(&id).await.unwrap().created_at, None);
}

#[tokio::test]
async fn running_needs_an_ip() {
    let (s, p) = setup().await;
    s.with(|st| {
        st.no_ip = true;
        st.running_after_gets = 1;
    });
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    let i = p.get(&id).await.unwrap();
    assert_eq!(i.state, InstanceState::Provisioning);
    assert!(i.ip.is_empty());
}

#[tokio::test]
async fn statuses_map_and_unknown_is_stopped() {
    let (s, p) = setup().await;
    s.with(|st| st.running_after_gets = 1);
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    for (status, want) in [
        ("FROBNICATING", InstanceState::Stopped),
        ("TERMINATED", InstanceState::Terminated),
        ("STOPPED", InstanceState::Stopped),
        ("SUSPENDED", InstanceState::Stopped),
        ("STAGING", InstanceState::Provisioning),
        ("RUNNING", InstanceState::Running),
    ] {
        s.with(|st| st.status_override.insert("proxy-a".into(), status.into()));
        assert_eq!(p.get(&id).await.unwrap().state, want, "{status}");
    }
}

#[tokio::test]
async fn malformed_ids_are_permanent() {
    let (s, p) = setup().await;
    for bad in ["ns/name", "zones/z/instances", "hosts/h/domains/d", ""] {
        let e = p.get(bad).await.unwrap_err();
        assert!(e.is(ErrorClass::Permanent), "{e}");
        assert!(e.to_string().contains("malformed gcp providerID"), "{e}");
        let e = p.delete(bad).await.unwrap_err();
        assert!(e.is(ErrorClass::Permanent), "{e}");
    }
    assert!(s.requests().is_empty());
}

#[tokio::test]
async fn get_after_delete_and_delete_twice() {
    let (s, p) = setup().await;
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    p.delete(&id).await.unwrap();
    // In flight: a second delete does not resubmit.
    p.delete(&id).await.unwrap();
    assert_eq!(s.count("DELETE", "/instances/proxy-a"), 1);
    // Still there while deleting (G2), then gone.
    assert_eq!(p.get(&id).await.unwrap().state, InstanceState::Stopped);
    let e = p.get(&id).await.unwrap_err();
    assert!(e.is(ErrorClass::NotFound), "{e}");
    // Deleting what is gone succeeds.
    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    // Never existed at all.
    p.delete(&format!("zones/{ZONE}/instances/proxy-never"))
        .await
        .unwrap();
    assert_eq!(s.instance_count(), 0);
}

/// Replacement reuses the name: the insert after the old instance is gone
/// is a new attempt and must create an instance, not be deduplicated into
/// the first insert's finished operation.
#[tokio::test]
async fn create_after_delete_inserts_a_new_instance() {
    let (s, p) = setup().await;
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    p.delete(&id).await.unwrap();
    let _ = p.get(&id).await;
    assert!(p.get(&id).await.unwrap_err().is(ErrorClass::NotFound));
    assert_eq!(s.instance_count(), 0);
    assert_eq!(p.create(&req("proxy-a", "uid-a")).await.unwrap(), id);
    assert_eq!(
        s.instance_count(),
        1,
        "the second insert must create the instance"
    );
    assert!(p.get(&id).await.is_ok());
}

#[tokio::test]
async fn list_excludes_unmarked_instances_and_reads_every_page() {
    let (s, p) = setup().await;
    s.with(|st| {
        st.ignore_filter = true;
        st.page_size = 2;
    });
    for i in 0..5 {
        p.create(&req(&format!("proxy-{i}"), &format!("uid-{i}")))
            .await
            .unwrap();
    }
    s.put("us-east1-c", "foreign", json!({"team": "x"}), "RUNNING");
    s.put(
        "us-east1-c",
        "half-marked",
        json!({"proxy-operator-managed": "false", "proxy-operator-uid": "u"}),
        "RUNNING",
    );
    let l = p.list_by_tag().await.unwrap();
    let mut ids: Vec<String> = l.instances.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    let want: Vec<String> = (0..5)
        .map(|i| format!("zones/{ZONE}/instances/proxy-{i}"))
        .collect();
    assert_eq!(ids, want);
    for i in &l.instances {
        assert!(i.uid.starts_with("uid-"), "{i:?}");
        assert_eq!(i.installation_id, "inst-1");
        assert!(i.created_at.is_some());
    }
    assert!(l.unread_scopes.is_empty());
    assert_eq!(s.count("GET", "/aggregated/instances"), 4);
    let (_, _, q) = s
        .requests()
        .into_iter()
        .find(|(_, p, _)| p.contains("aggregated"))
        .unwrap();
    assert!(q.contains("filter=labels.proxy-operator-managed"), "{q}");
}

#[tokio::test]
async fn partial_list_reports_unread_zones() {
    let (s, p) = setup().await;
    p.create(&req("proxy-a", "uid-a")).await.unwrap();
    s.with(|st| st.unreachable_zones = vec!["asia-east1-a".into()]);
    let l = p.list_by_tag().await.unwrap();
    assert_eq!(l.instances.len(), 1);
    assert_eq!(l.unread_scopes, vec!["zones/asia-east1-a".to_string()]);
}

#[tokio::test]
async fn error_statuses_are_classified_through_the_real_client() {
    let (s, p) = setup().await;
    let id = p.create(&req("proxy-a", "uid-a")).await.unwrap();
    let table: [(u16, &str, ErrorClass); 11] = [
        (404, "notFound", ErrorClass::NotFound),
        (429, "rateLimitExceeded", ErrorClass::QuotaExceeded),
        (403, "quotaExceeded", ErrorClass::QuotaExceeded),
        (403, "rateLimitExceeded", ErrorClass::QuotaExceeded),
        (403, "userRateLimitExceeded", ErrorClass::QuotaExceeded),
        (403, "forbidden", ErrorClass::Unavailable),
        (403, "accessNotConfigured", ErrorClass::Unavailable),
        (400, "invalid", ErrorClass::Permanent),
        (401, "authError", ErrorClass::Unavailable),
        (500, "backendError", ErrorClass::Transient),
        (502, "badGateway", ErrorClass::Transient),
    ];
    for (code, reason, want) in table {
        s.inject("get", code, reason);
        let e = p.get(&id).await.unwrap_err();
        assert_eq!(e.class(), want, "get {code} {reason}: {e}");
        assert_eq!(e.provider(), "gcp-eu");
        if want != ErrorClass::NotFound {
            s.inject("list", code, reason);
            let e = p.list_by_tag().await.unwrap_err();
            assert_eq!(e.class(), want, "list {code} {reason}: {e}");
            s.inject("insert", code, reason);
            let e = p.create(&req("proxy-b", "uid-b")).await.unwrap_err();
            assert_eq!(e.class(), want, "create {code} {reason}: {e}");
            s.inject("delete", code, reason);
            let e = p.delete(&id).await.unwrap_err();
            assert_eq!(e.class(), want, "delete {code} {reason}: {e}");
        }
    }
    // The SDK error stays reachable with its HTTP status.
    s.inject("get", 403, "forbidden");
    let e = p.get(&id).await.unwrap_err();
    let api = e
        .cause::<google_cloud_compute_v1::Error>()
        .expect("sdk error in chain");
    assert_eq!(api.http_status_code(), Some(403));
    // Not an HTTP answer at all: Transient.
    let dead = GcpProvider::new("gcp-eu", &cfg("http://127.0.0.1:9"), opts()).unwrap();
    let e = dead.get(&id).await.unwrap_err();
    assert!(e.is(ErrorClass::Transient), "{e}");
}

#[tokio::test]
async fn async_insert_failure_shows_its_reason_from_get() {
    let (s, p) = setup().await;
    for (code, want) in [
        ("QUOTA_EXCEEDED", ErrorClass::QuotaExceeded),
        ("RESOURCE_NOT_FOUND", ErrorClass::Permanent),
    ] {
        s.with(|st| st.fail_next_insert_op = Some((code.into(), format!("{code}: the details"))));
        let name = format!("proxy-{}", code.to_lowercase().replace('_', "-"));
        let id = p.create(&req(&name, "uid-a")).await.unwrap();
        let e = p.get(&id).await.unwrap_err();
        assert_eq!(e.class(), want, "{e}");
        assert!(e.to_string().contains("the details"), "{e}");
        // Reported once; then the instance simply is not there.
        let e = p.get(&id).await.unwrap_err();
        assert!(e.is(ErrorClass::NotFound), "{e}");
    }
    assert_eq!(s.instance_count(), 0);
}

#[tokio::test]
async fn check_reasons() {
    let (s, p) = setup().await;
    // Reachable: one request, one page, even with a next-page token.
    s.with(|st| st.endless_pages = true);
    p.create(&req("proxy-a", "uid-a")).await.unwrap();
    p.create(&req("proxy-b", "uid-b")).await.unwrap();
    let before = s.count("GET", "/aggregated/instances");
    let t = p.check().await;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].name, "my-project");
    assert_eq!(t[0].address, "compute.googleapis.com");
    assert!(t[0].ready, "{t:?}");
    assert_eq!(t[0].reason, "Reachable");
    assert_eq!(s.count("GET", "/aggregated/instances"), before + 1);
    let (_, path, q) = s
        .requests()
        .into_iter()
        .rev()
        .find(|(_, p, _)| p.contains("aggregated"))
        .unwrap();
    assert_eq!(path, "/compute/v1/projects/my-project/aggregated/instances");
    assert!(q.contains("maxResults=1"), "{q}");
    for (code, reason, want) in [
        (401, "authError", "Unauthorized"),
        (403, "forbidden", "Forbidden"),
        (403, "accessNotConfigured", "Forbidden"),
        (500, "backendError", "APIError"),
        (503, "backendError", "APIError"),
    ] {
        s.inject("list", code, reason);
        let t = p.check().await;
        assert!(!t[0].ready);
        assert_eq!(t[0].reason, want, "{code} {reason}: {}", t[0].message);
        assert!(!t[0].message.is_empty());
    }
    // Slow answer: Timeout.
    let mut o = opts();
    o.check_timeout = Duration::from_millis(200);
    let slow = GcpProvider::new("gcp-eu", &cfg(&s.url), o).unwrap();
    s.with(|st| st.delay.insert("list".into(), Duration::from_secs(2)));
    let t = slow.check().await;
    assert_eq!(t[0].reason, "Timeout", "{t:?}");
    s.with(|st| st.delay.clear());
    // Nothing listening: Unreachable.
    let dead = GcpProvider::new("gcp-eu", &cfg("http://127.0.0.1:9"), opts()).unwrap();
    let t = dead.check().await;
    assert_eq!(t[0].reason, "Unreachable", "{t:?}");
    assert!(!t[0].ready);
}

#[tokio::test]
async fn empty_project_check_is_reachable() {
    let (_s, p) = setup().await;
    let t = p.check().await;
    assert!(t[0].ready, "{t:?}");
}
