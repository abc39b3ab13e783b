use super::*;
use crate::config::DestinationRules;
use crate::provider::kubernetes::build_pod;
use crate::provider::{CreateRequest, InstanceState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference, Time};

fn pod(phase: &str, ip: Option<&str>, deleting: bool) -> Pod {
    let req = CreateRequest {
        name: "proxy-abc".into(),
        uid: "uid-1".into(),
        namespace: "ns".into(),
        proxy_name: "p1".into(),
        port: 3128,
        installation_id: "inst".into(),
        ..Default::default()
    };
    let mut p = build_pod(&req, "img", &DestinationRules::default());
    p.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
    p.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
    if deleting {
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    }
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        pod_ip: ip.map(Into::into),
        host_ip: Some("192.0.2.1".into()),
        ..Default::default()
    });
    p
}

#[test]
fn a_stripped_pod_reads_as_the_same_instance_and_owner() {
    let cases = [
        ("Pending", None, false, InstanceState::Provisioning),
        ("Running", Some("10.1.2.3"), false, InstanceState::Running),
        (
            "Running",
            Some("10.1.2.3"),
            true,
            InstanceState::Provisioning,
        ),
        ("Failed", None, false, InstanceState::Terminated),
        ("Unknown", None, false, InstanceState::Stopped),
    ];
    for (phase, ip, deleting, want) in cases {
        let full = pod(phase, ip, deleting);
        let mut stripped = full.clone();
        strip_pod(&mut stripped);
        let what = format!("{phase} {ip:?} deleting={deleting}");
        assert_eq!(pod_instance(&stripped), pod_instance(&full), "{what}");
        assert_eq!(pod_instance(&stripped).state, want, "{what}");
        assert_eq!(owners(&stripped), owners(&full), "{what}");
        assert!(stripped.spec.is_none(), "{what}: the spec is not cached");
        assert_eq!(stripped.metadata.managed_fields, None, "{what}");
        assert_eq!(stripped.metadata.annotations, None, "{what}");
        let status = stripped.status.unwrap();
        assert_eq!(status.host_ip, None, "{what}");
        assert_eq!(stripped.metadata.labels.unwrap().len(), 2, "{what}");
    }
}

fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: "u".into(),
        ..Default::default()
    }
}

#[test]
fn a_pod_triggers_the_proxies_that_own_it_only() {
    let group = Proxy::group(&());
    let ours = format!("{group}/v1alpha1");
    let cases: [(&str, Vec<OwnerReference>, Vec<&str>); 5] = [
        ("no owners", vec![], vec![]),
        ("its Proxy", vec![owner(&ours, "Proxy", "p1")], vec!["p1"]),
        (
            "another version of the group",
            vec![owner(&format!("{group}/v2"), "Proxy", "p2")],
            vec!["p2"],
        ),
        (
            "a Proxy kind of another group",
            vec![owner("other.example.com/v1", "Proxy", "x")],
            vec![],
        ),
        (
            "another kind of ours",
            vec![owner(&ours, "ReplicaSet", "r"), owner(&ours, "Proxy", "p3")],
            vec!["p3"],
        ),
    ];
    for (name, refs, want) in cases {
        let mut p = pod("Running", Some("10.0.0.1"), false);
        p.metadata.owner_references = Some(refs);
        let got = owners(&p);
        let names: Vec<&str> = got.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, want, "{name}");
        assert!(
            got.iter().all(|r| r.namespace.as_deref() == Some("ns")),
            "{name}"
        );
    }
}

#[test]
fn the_store_answers_only_while_its_watch_runs() {
    let observer = PodObserver::default();
    assert_eq!(observer.observed("ns", "proxy-abc"), Observation::Unknown);
    // A store filled as a watch would fill it.
    let (reader, mut writer) = reflector::store::<Pod>();
    let mut running = pod("Running", Some("10.1.2.3"), false);
    strip_pod(&mut running);
    for ev in [
        watcher::Event::Init,
        watcher::Event::InitApply(running.clone()),
        watcher::Event::InitDone,
    ] {
        writer.apply_watcher_event(&ev);
    }
    let run = observer.slot.start(Some(reader));
    let found = observer.observed("ns", "proxy-abc");
    assert_eq!(found, Observation::Current(pod_instance(&running)));
    assert_eq!(observer.observed("ns", "other"), Observation::Unknown);
    assert_eq!(
        observer.observed("other", "proxy-abc"),
        Observation::Unknown
    );
    // The watch ending drops the store: a stale store never answers.
    drop(run);
    assert_eq!(observer.observed("ns", "proxy-abc"), Observation::Unknown);
}
