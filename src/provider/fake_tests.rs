use super::*;

fn req(name: &str, uid: &str) -> CreateRequest {
    CreateRequest {
        name: name.into(),
        uid: uid.into(),
        namespace: "default".into(),
        proxy_name: "p".into(),
        port: 3128,
        installation_id: "inst-1".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn progression_table() {
    struct Case {
        name: &'static str,
        fake: FakeProvider,
        /// (state, ip) of each successive get.
        want: Vec<(InstanceState, &'static str)>,
    }
    let cases = [
        Case {
            name: "default: one Provisioning get, then Running with its own IP",
            fake: FakeProvider::new("f"),
            want: vec![
                (InstanceState::Provisioning, ""),
                (InstanceState::Running, "192.0.2.1"),
                (InstanceState::Running, "192.0.2.1"),
            ],
        },
        Case {
            name: "Running at once",
            fake: FakeProvider::new("f").with_provisioning_gets(0),
            want: vec![(InstanceState::Running, "192.0.2.1")],
        },
        Case {
            name: "three Provisioning gets, a fixed IP",
            fake: FakeProvider::new("f")
                .with_provisioning_gets(3)
                .with_ip("127.0.0.1"),
            want: vec![
                (InstanceState::Provisioning, ""),
                (InstanceState::Provisioning, ""),
                (InstanceState::Provisioning, ""),
                (InstanceState::Running, "127.0.0.1"),
            ],
        },
        Case {
            name: "never Running",
            fake: FakeProvider::new("f").with_provisioning_gets(u32::MAX),
            want: vec![(InstanceState::Provisioning, ""); 3],
        },
        Case {
            name: "Running needs an IP",
            fake: FakeProvider::new("f").with_provisioning_gets(0).with_ip(""),
            want: vec![(InstanceState::Provisioning, ""); 2],
        },
    ];
    for c in cases {
        let id = c.fake.create(&req("proxy-a", "uid-a")).await.unwrap();
        for (i, (state, ip)) in c.want.iter().enumerate() {
            let got = c.fake.get(&id).await.unwrap();
            assert_eq!(
                (got.state, got.ip.as_str()),
                (*state, *ip),
                "{}: get {i}",
                c.name
            );
            assert_eq!(got.uid, "uid-a", "{}", c.name);
            assert_eq!(got.installation_id, "inst-1", "{}", c.name);
            assert!(got.created_at.is_some(), "{}", c.name);
        }
    }
}

#[tokio::test]
async fn create_is_idempotent_by_name_and_refuses_another_owner() {
    let f = FakeProvider::new("f");
    let id = f.create(&req("proxy-a", "uid-a")).await.unwrap();
    assert_eq!(id, "fake/proxy-a");
    assert_eq!(f.create(&req("proxy-a", "uid-a")).await.unwrap(), id);
    assert_eq!(f.instances().len(), 1);

    let e = f.create(&req("proxy-a", "uid-b")).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
    let m = e.to_string();
    assert!(m.contains("uid-a") && m.contains("uid-b"), "{m}");

    // An unmarked instance of that name belongs to nobody we know: refused.
    let planted = f.plant(Seed::unmarked("proxy-b"));
    let e = f.create(&req("proxy-b", "uid-b")).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
    assert_eq!(e.id(), planted);
}

#[tokio::test]
async fn delete_table() {
    struct Case {
        name: &'static str,
        delete_gets: u32,
        /// States of the gets after the delete, before NotFound.
        visible: usize,
    }
    let cases = [
        Case {
            name: "gone at once",
            delete_gets: 0,
            visible: 0,
        },
        Case {
            name: "visible for two gets, like a terminating Pod",
            delete_gets: 2,
            visible: 2,
        },
    ];
    for c in cases {
        let f = FakeProvider::new("f")
            .with_provisioning_gets(0)
            .with_delete_gets(c.delete_gets);
        let id = f.create(&req("proxy-a", "uid-a")).await.unwrap();
        f.delete(&id).await.unwrap();
        // A second delete neither fails nor restarts the countdown.
        f.delete(&id).await.unwrap();
        for i in 0..c.visible {
            let got = f.get(&id).await.unwrap();
            assert_eq!(
                got.state,
                InstanceState::Provisioning,
                "{}: get {i}",
                c.name
            );
            assert_eq!(got.ip, "", "{}", c.name);
        }
        let e = f.get(&id).await.unwrap_err();
        assert!(e.is(ErrorClass::NotFound), "{}: {e}", c.name);
        f.delete(&id).await.unwrap();
        assert!(f.instances().is_empty(), "{}", c.name);
    }
    // Never existed at all.
    FakeProvider::new("f").delete("fake/nothing").await.unwrap();
}

#[tokio::test]
async fn malformed_ids_are_permanent() {
    let f = FakeProvider::new("f");
    for bad in ["", "fake/", "proxy-a", "ns/proxy-a", "fake/a/b"] {
        let e = f.get(bad).await.unwrap_err();
        assert!(e.is(ErrorClass::Permanent), "get {bad:?}: {e}");
        assert!(e.to_string().contains("malformed fake providerID"), "{e}");
        let e = f.delete(bad).await.unwrap_err();
        assert!(e.is(ErrorClass::Permanent), "delete {bad:?}: {e}");
    }
    let e = f.create(&req("", "uid-a")).await.unwrap_err();
    assert!(e.is(ErrorClass::Permanent), "{e}");
}

#[tokio::test]
async fn injected_faults_fail_the_next_calls_and_change_nothing() {
    struct Case {
        name: &'static str,
        op: Op,
        class: ErrorClass,
    }
    let cases = [
        Case {
            name: "create transient",
            op: Op::Create,
            class: ErrorClass::Transient,
        },
        Case {
            name: "create quota",
            op: Op::Create,
            class: ErrorClass::QuotaExceeded,
        },
        Case {
            name: "get permanent",
            op: Op::Get,
            class: ErrorClass::Permanent,
        },
        Case {
            name: "get not found",
            op: Op::Get,
            class: ErrorClass::NotFound,
        },
        Case {
            name: "delete transient",
            op: Op::Delete,
            class: ErrorClass::Transient,
        },
        Case {
            name: "list quota",
            op: Op::List,
            class: ErrorClass::QuotaExceeded,
        },
    ];
    for c in cases {
        let f = FakeProvider::new("f").with_provisioning_gets(0);
        let id = f.create(&req("proxy-a", "uid-a")).await.unwrap();
        f.fail_next(c.op, 2, c.class);
        let call = |f: FakeProvider, id: String| async move {
            match c.op {
                Op::Create => f.create(&req("proxy-b", "uid-b")).await.map(drop),
                Op::Get => f.get(&id).await.map(drop),
                Op::Delete => f.delete(&id).await,
                Op::List => f.list_by_tag().await.map(drop),
            }
        };
        for i in 0..2 {
            let e = call(f.clone(), id.clone()).await.unwrap_err();
            assert_eq!(e.class(), c.class, "{}: call {i}: {e}", c.name);
            assert_eq!(e.op(), c.op, "{}", c.name);
            assert_eq!(e.provider(), "f", "{}", c.name);
        }
        // A failed call changed nothing.
        assert_eq!(f.instances().len(), 1, "{}", c.name);
        call(f.clone(), id.clone()).await.unwrap();
        assert_eq!(
            f.calls(c.op),
            3 + usize::from(c.op == Op::Create),
            "{}",
            c.name
        );
    }
    let f = FakeProvider::new("f");
    f.fail_next_with(
        Op::Create,
        1,
        ErrorClass::Permanent,
        "placement.zone \"x\" is refused",
    );
    let e = f.create(&req("proxy-a", "uid-a")).await.unwrap_err();
    assert!(
        e.to_string().contains("placement.zone \"x\" is refused"),
        "{e}"
    );
}

#[tokio::test]
async fn list_reads_every_managed_mark_back_and_leaves_out_unmarked() {
    let f = FakeProvider::new("f");
    let mine = f.create(&req("proxy-a", "uid-a")).await.unwrap();
    let theirs = f.plant(Seed::managed("proxy-t", "uid-t", "inst-2"));
    f.plant(Seed::unmarked("by-hand"));
    let mut l = f.list_by_tag().await.unwrap();
    l.instances.sort_by(|a, b| a.id.cmp(&b.id));
    let got: Vec<(&str, &str, &str)> = l
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i.uid.as_str(), i.installation_id.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (mine.as_str(), "uid-a", "inst-1"),
            (theirs.as_str(), "uid-t", "inst-2")
        ]
    );
    assert!(l.unread_scopes.is_empty());
    f.set_unread_scopes(&["zone-b"]);
    assert_eq!(f.list_by_tag().await.unwrap().unread_scopes, ["zone-b"]);
    // Not listed, but there for get (as a real backend's unmarked VM is).
    let plain = f.get("fake/by-hand").await.unwrap();
    assert_eq!(
        (plain.uid.as_str(), plain.state),
        ("", InstanceState::Running)
    );
}

#[tokio::test]
async fn out_of_band_changes() {
    let f = FakeProvider::new("f").with_provisioning_gets(0);
    let id = f.create(&req("proxy-a", "uid-a")).await.unwrap();
    assert!(f.set_state(&id, InstanceState::Stopped, ""));
    assert_eq!(f.get(&id).await.unwrap().state, InstanceState::Stopped);
    assert!(f.set_state(&id, InstanceState::Running, "10.1.2.3"));
    assert_eq!(f.get(&id).await.unwrap().ip, "10.1.2.3");
    assert!(f.vanish(&id));
    assert!(!f.vanish(&id));
    assert!(!f.set_state(&id, InstanceState::Running, "10.1.2.3"));
    assert!(f.get(&id).await.unwrap_err().is(ErrorClass::NotFound));
}

#[tokio::test]
async fn check_and_type() {
    let f = FakeProvider::new("fake-1").with_type(ProviderType::Kvm);
    assert_eq!(f.provider_type(), ProviderType::Kvm);
    let checker = f.checker().unwrap();
    let t = checker.check().await;
    assert_eq!(t.len(), 1);
    assert_eq!(
        (t[0].name.as_str(), t[0].ready, t[0].reason.as_str()),
        ("fake-1", true, "Reachable")
    );
    f.set_unreachable(Some("switched off by the test"));
    let t = checker.check().await;
    assert_eq!((t[0].ready, t[0].reason.as_str()), (false, "Unreachable"));
    assert_eq!(t[0].message, "switched off by the test");
}
