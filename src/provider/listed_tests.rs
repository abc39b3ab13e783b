use super::*;
use crate::api::ProxySpec;
use crate::provider::InstanceState;
use chrono::TimeZone;

fn t(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
}

fn inst(id: &str, uid: &str, state: InstanceState, ip: &str) -> Instance {
    Instance {
        ip: ip.into(),
        uid: uid.into(),
        ..Instance::new(id, state)
    }
}

fn snap(at: i64, complete: bool, instances: &[Instance]) -> Snapshot {
    Snapshot::of(
        Listing {
            instances: instances.to_vec(),
            unread_scopes: if complete {
                Vec::new()
            } else {
                vec!["zones/down".into()]
            },
        },
        t(at),
    )
}

#[test]
fn the_newest_listing_answers_for_what_it_holds_while_fresh() {
    let running = inst("z/a", "ua", InstanceState::Running, "192.0.2.1");
    let s = snap(100, true, std::slice::from_ref(&running));
    let listed = Observation::Listed {
        instance: running.clone(),
        listed_at: t(100),
    };
    let max = Duration::from_secs(90);
    let cases = [
        ("no listing yet", None, "z/a", 100, Observation::Unknown),
        ("listed", Some(&s), "z/a", 130, listed.clone()),
        ("at the age limit", Some(&s), "z/a", 190, listed),
        ("too old: get", Some(&s), "z/a", 191, Observation::Unknown),
        (
            "absent: get confirms",
            Some(&s),
            "z/b",
            130,
            Observation::Unknown,
        ),
    ];
    for (name, snap, id, now, want) in cases {
        assert_eq!(answer(snap, id, t(now), max), want, "{name}");
    }
}

#[test]
fn consecutive_listings_name_the_proxies_whose_instances_changed() {
    let a = inst("z/a", "ua", InstanceState::Running, "192.0.2.1");
    let b = inst("z/b", "ub", InstanceState::Running, "192.0.2.2");
    let a_stopped = inst("z/a", "ua", InstanceState::Stopped, "192.0.2.1");
    let a_moved = inst("z/a", "ua", InstanceState::Running, "192.0.2.9");
    let c = inst("z/c", "uc", InstanceState::Provisioning, "");
    let unmarked = inst("z/x", "", InstanceState::Running, "192.0.2.7");
    let both = [a.clone(), b.clone()];
    let cases: [(&str, Option<Snapshot>, Snapshot, &[&str]); 8] = [
        ("first listing", None, snap(1, true, &both), &[]),
        (
            "nothing changed",
            Some(snap(1, true, &both)),
            snap(2, true, &both),
            &[],
        ),
        (
            "stopped",
            Some(snap(1, true, &both)),
            snap(2, true, &[a_stopped, b.clone()]),
            &["ua"],
        ),
        (
            "new address",
            Some(snap(1, true, &both)),
            snap(2, true, &[a_moved, b.clone()]),
            &["ua"],
        ),
        (
            "vanished from a complete listing",
            Some(snap(1, true, &both)),
            snap(2, true, std::slice::from_ref(&b)),
            &["ua"],
        ),
        (
            "missing from an incomplete listing: not taken for gone",
            Some(snap(1, true, &both)),
            snap(2, false, std::slice::from_ref(&b)),
            &[],
        ),
        (
            "appeared",
            Some(snap(1, true, &both)),
            snap(2, true, &[a.clone(), b.clone(), c]),
            &["uc"],
        ),
        (
            "unmarked instances name nobody",
            Some(snap(1, true, &both)),
            snap(2, true, &[a, b, unmarked]),
            &[],
        ),
    ];
    for (name, old, new, want) in cases {
        let got: Vec<String> = changed(old.as_ref(), &new).into_iter().collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn uids_map_to_the_proxies_that_carry_them() {
    let proxy = |name: &str, uid: &str| {
        let mut p = Proxy::new(name, ProxySpec::default());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(uid.into());
        Arc::new(p)
    };
    let proxies = [proxy("a", "ua"), proxy("b", "ub"), proxy("c", "uc")];
    let uids = BTreeSet::from(["ua".to_string(), "uc".to_string(), "gone".to_string()]);
    let names: Vec<String> = proxies_of(&proxies, &uids)
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["a", "c"]);
}
