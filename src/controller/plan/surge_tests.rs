use std::time::Duration;

use super::*;
use crate::controller::plan::tests::{inst, t};
use crate::controller::plan::End;
use crate::controller::throttle::limiter::Held;
use crate::fleet::DrainDone;
use crate::provider::ErrorClass;

const HASH: &str = "v1:new";

fn serving() -> ProxyStatus {
    ProxyStatus {
        provider_id: Some("old".into()),
        ip: Some("10.0.0.1".into()),
        port: Some(3128),
        ..ProxyStatus::default()
    }
}

fn surging(id: Option<&str>, created: Option<i64>) -> ProxyStatus {
    ProxyStatus {
        surge: Some(SurgeStatus {
            serial: 1,
            started_at: t(0),
            provider_id: id.map(String::from),
            created_at: created.map(t),
            port: Some(3129),
            spec_hash: Some(HASH.into()),
            delete_requested_at: None,
            credentials_secret: None,
        }),
        ..serving()
    }
}

fn retiring(requested: Option<i64>) -> ProxyStatus {
    ProxyStatus {
        retiring: Some(RetiringStatus {
            provider_id: "older".into(),
            ip: Some("10.0.0.9".into()),
            since: t(0),
            delete_requested_at: requested.map(t),
            credentials_secret: None,
        }),
        ..serving()
    }
}

fn found(state: InstanceState, ip: &str) -> Option<GetOutcome> {
    Some(GetOutcome::Found(inst(state, ip)))
}

#[test]
fn side_step_table() {
    use InstanceState::{Provisioning, Running, Stopped};
    struct Case {
        name: &'static str,
        status: ProxyStatus,
        obs: SideObs,
        now: i64,
        want: Option<SideStep>,
    }
    let case = |name, status, obs, now, want| Case {
        name,
        status,
        obs,
        now,
        want,
    };
    let obs = SideObs::default;
    let held = CreateGate::Held(Held::ReplaceBackoff { until: t(9) });
    let give_up = |why| Some(SideStep::GiveUp { why });
    let stale_hash = {
        let mut s = surging(Some("new"), Some(0));
        if let Some(x) = s.surge.as_mut() {
            x.spec_hash = Some("v1:older".into());
        }
        s
    };
    let deleting = |at: i64| {
        let mut s = surging(Some("new"), Some(0));
        if let Some(x) = s.surge.as_mut() {
            x.delete_requested_at = Some(t(at));
        }
        s
    };
    let both = {
        let mut s = surging(Some("new"), Some(0));
        s.retiring = retiring(None).retiring;
        s
    };
    let cases = [
        case("nothing in progress", serving(), obs(), 0, None),
        case(
            "a surge decided: ask the create gate",
            surging(None, None),
            obs(),
            1,
            Some(SideStep::AskCreate),
        ),
        case(
            "the gate lets it go: create the next serial on spec.port",
            surging(None, None),
            SideObs {
                create: Some(CreateGate::Go),
                ..obs()
            },
            1,
            Some(SideStep::Create {
                serial: 1,
                port: 3129,
            }),
        ),
        case(
            "the gate holds it: wait",
            surging(None, None),
            SideObs {
                create: Some(held),
                ..obs()
            },
            1,
            None,
        ),
        case(
            "created: look at it",
            surging(Some("new"), Some(1)),
            obs(),
            2,
            Some(SideStep::Get),
        ),
        case(
            "still provisioning: wait",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Provisioning, ""),
                ..obs()
            },
            60,
            None,
        ),
        case(
            "running without an address: wait",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Running, ""),
                ..obs()
            },
            60,
            None,
        ),
        case(
            "not up by the startup timeout: given up",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Provisioning, ""),
                ..obs()
            },
            901,
            give_up(GiveUp::StartupTimedOut),
        ),
        case(
            "running with an address: probe it",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Running, "10.0.0.2"),
                ..obs()
            },
            30,
            Some(SideStep::Probe {
                ip: "10.0.0.2".into(),
            }),
        ),
        case(
            "the probe passed: it takes over",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Running, "10.0.0.2"),
                probe: Some(true),
                ..obs()
            },
            30,
            Some(SideStep::TakeOver {
                ip: "10.0.0.2".into(),
            }),
        ),
        case(
            "the probe failed: wait for the next pass",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Running, "10.0.0.2"),
                probe: Some(false),
                ..obs()
            },
            30,
            None,
        ),
        case(
            "failing its probe past the startup timeout: given up",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Running, "10.0.0.2"),
                probe: Some(false),
                ..obs()
            },
            901,
            give_up(GiveUp::StartupTimedOut),
        ),
        case(
            "stopped: given up",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: found(Stopped, ""),
                ..obs()
            },
            30,
            give_up(GiveUp::Failed),
        ),
        case(
            "its asynchronous create failed: given up",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: Some(GetOutcome::CreateFailed(ErrorClass::Permanent, "no".into())),
                ..obs()
            },
            30,
            give_up(GiveUp::Failed),
        ),
        case(
            "a failed get: wait",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: Some(GetOutcome::Failed(ErrorClass::Transient, "503".into())),
                ..obs()
            },
            30,
            None,
        ),
        case(
            "vanished: forgotten (the fleet admits a new surge)",
            surging(Some("new"), Some(1)),
            SideObs {
                surge: Some(GetOutcome::NotFound),
                ..obs()
            },
            30,
            Some(SideStep::Forget),
        ),
        case(
            "built from an older spec: given up",
            stale_hash,
            SideObs {
                surge: found(Running, "10.0.0.2"),
                ..obs()
            },
            30,
            give_up(GiveUp::Outdated),
        ),
        case(
            "given up and still there: wait for the delete",
            deleting(20),
            SideObs {
                surge: found(Running, "10.0.0.2"),
                ..obs()
            },
            30,
            None,
        ),
        case(
            "given up long ago and still there: delete again",
            deleting(20),
            SideObs {
                surge: found(Running, "10.0.0.2"),
                ..obs()
            },
            200,
            give_up(GiveUp::Deleting),
        ),
        case(
            "given up and gone: forgotten",
            deleting(20),
            SideObs {
                surge: Some(GetOutcome::NotFound),
                ..obs()
            },
            30,
            Some(SideStep::Forget),
        ),
        case(
            "retiring: ask how its drain stands",
            retiring(None),
            obs(),
            30,
            Some(SideStep::AskDrain),
        ),
        case(
            "retiring with leases: wait",
            retiring(None),
            SideObs {
                drain: Some(DrainStep::Wait { until: t(90) }),
                ..obs()
            },
            30,
            None,
        ),
        case(
            "retiring, drained: delete it",
            retiring(None),
            SideObs {
                drain: Some(DrainStep::Replace(DrainDone::NoLeases)),
                ..obs()
            },
            30,
            Some(SideStep::DeleteRetiring),
        ),
        case(
            "its delete asked: look",
            retiring(Some(30)),
            obs(),
            40,
            Some(SideStep::GetRetiring),
        ),
        case(
            "its delete asked and it is gone: retired",
            retiring(Some(30)),
            SideObs {
                retiring: Some(GetOutcome::NotFound),
                ..obs()
            },
            40,
            Some(SideStep::Retired),
        ),
        case(
            "its delete asked long ago and it still runs: delete again",
            retiring(Some(30)),
            SideObs {
                retiring: found(Running, "10.0.0.9"),
                ..obs()
            },
            200,
            Some(SideStep::DeleteRetiring),
        ),
        case(
            "a ready surge waits while the last one still retires",
            both,
            SideObs {
                drain: Some(DrainStep::Wait { until: t(90) }),
                surge: found(Running, "10.0.0.2"),
                probe: Some(true),
                ..obs()
            },
            30,
            None,
        ),
        case(
            "a failed side call rests the side steps for the pass",
            surging(None, None),
            SideObs {
                failed: true,
                ..obs()
            },
            1,
            None,
        ),
    ];
    for c in cases {
        let got = next_side_step(&SideInput {
            status: &c.status,
            spec_hash: HASH,
            port: Some(3129),
            startup_timeout: Duration::from_secs(900),
            obs: &c.obs,
            now: t(c.now),
        });
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn a_surge_is_recorded_before_its_create_and_takes_the_next_serial() {
    let mut st = ProxyStatus {
        instance_serial: Some(4),
        ..serving()
    };
    start(&mut st, t(5));
    let s = st.surge.clone().expect("recorded");
    assert_eq!((s.serial, s.provider_id), (5, None));
    assert!(condition::find(&st.conditions, RECYCLING).is_some_and(|c| c.reason == REASON_SURGING));
    start(&mut st, t(6));
    assert_eq!(st.surge.as_ref().map(|s| s.started_at), Some(t(5)), "once");
    created(
        &mut st,
        ("new".into(), Some("proxy-x-5".into())),
        HASH,
        3129,
        t(7),
    );
    let s = st.surge.clone().expect("still recorded");
    assert_eq!(s.provider_id.as_deref(), Some("new"));
    assert_eq!(s.credentials_secret.as_deref(), Some("proxy-x-5"));
    assert_eq!((s.created_at, s.port), (Some(t(7)), Some(3129)));
}

#[test]
fn taking_over_makes_the_surge_current_and_retires_the_old_instance() {
    let mut st = surging(Some("new"), Some(7));
    st.instance_serial = None;
    st.draining_since = Some(t(1));
    st.credentials_secret = Some("proxy-x".into());
    if let Some(s) = st.surge.as_mut() {
        s.credentials_secret = Some("proxy-x-1".into());
    }
    take_over(&mut st, "10.0.0.2", t(40));
    assert_eq!(
        st.credentials_secret.as_deref(),
        Some("proxy-x-1"),
        "leases and probes of the new instance use its own credentials"
    );
    assert_eq!(st.provider_id.as_deref(), Some("new"));
    assert_eq!(st.ip.as_deref(), Some("10.0.0.2"));
    assert_eq!((st.port, st.instance_serial), (Some(3129), Some(1)));
    assert_eq!(st.created_at, Some(t(7)));
    assert_eq!(st.surge, None);
    assert_eq!(st.draining_since, None);
    let r = st.retiring.clone().expect("the old instance retires");
    assert_eq!(r.provider_id, "old");
    assert_eq!((r.ip.as_deref(), r.since), (Some("10.0.0.1"), t(40)));
    assert!(condition::find(&st.conditions, RECYCLING).is_some_and(|c| c.reason == REASON_RETIRING));
    retire_requested(&mut st, t(50));
    assert_eq!(
        st.retiring.as_ref().and_then(|r| r.delete_requested_at),
        Some(t(50))
    );
    retired(&mut st);
    assert_eq!(st.retiring, None);
    assert!(condition::find(&st.conditions, RECYCLING).is_none());
}

#[test]
fn a_surge_given_up_is_forgotten_once_gone() {
    let mut st = surging(Some("new"), Some(1));
    start(&mut st, t(0));
    failed(&mut st, "creating", "quota exceeded", t(2));
    let c = condition::find(&st.conditions, RECYCLING)
        .cloned()
        .expect("said");
    assert!(
        c.message
            .contains("creating failed, retrying: quota exceeded"),
        "{}",
        c.message
    );
    giving_up(&mut st, t(3));
    assert_eq!(
        st.surge.as_ref().and_then(|s| s.delete_requested_at),
        Some(t(3))
    );
    forget(&mut st);
    assert_eq!(st.surge, None);
    assert!(condition::find(&st.conditions, RECYCLING).is_none());
    assert_eq!(
        st.provider_id.as_deref(),
        Some("old"),
        "the current one stays"
    );
}

#[test]
fn a_proxy_with_side_instances_looks_again_soon() {
    let long = End::RequeueAfter(Duration::from_secs(60));
    assert_eq!(poll(&serving(), long), long);
    assert_eq!(poll(&serving(), End::AwaitChange), End::AwaitChange);
    let soon = End::RequeueAfter(SIDE_POLL);
    assert_eq!(poll(&surging(None, None), long), soon);
    assert_eq!(poll(&retiring(None), End::AwaitChange), soon);
    let short = End::RequeueAfter(Duration::from_secs(1));
    assert_eq!(poll(&retiring(None), short), short);
}
