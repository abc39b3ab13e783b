use chrono::TimeZone;

use super::*;

fn t(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
}

fn inst(state: InstanceState, ip: &str) -> Instance {
    Instance {
        ip: ip.into(),
        ..Instance::new("default/proxy-x", state)
    }
}

fn status_with_id() -> ProxyStatus {
    ProxyStatus {
        provider_id: Some("default/proxy-x".into()),
        ..Default::default()
    }
}

fn latched(generation: i64) -> ProxyStatus {
    let mut s = ProxyStatus::default();
    mark_permanent(
        &mut s,
        "placement.zone \"x\" is unknown",
        t(0),
        Some(generation),
    );
    s
}

struct Case {
    name: &'static str,
    status: ProxyStatus,
    has_finalizer: bool,
    configured: bool,
    recorded: Option<&'static str>,
    spec: Option<&'static str>,
    get: Option<GetOutcome>,
    delete_requested_at: Option<DateTime<Utc>>,
    want: Step,
}

fn base(name: &'static str, want: Step) -> Case {
    Case {
        name,
        status: status_with_id(),
        has_finalizer: true,
        configured: true,
        recorded: Some("h1"),
        spec: Some("h1"),
        get: None,
        delete_requested_at: None,
        want,
    }
}

#[test]
fn managed_path_table() {
    let cases = vec![
        Case {
            has_finalizer: false,
            ..base("finalizer first, before anything else", Step::AddFinalizer)
        },
        Case {
            has_finalizer: false,
            configured: false,
            ..base(
                "finalizer even before the provider check",
                Step::AddFinalizer,
            )
        },
        Case {
            status: latched(3),
            ..base("latched at this generation: no calls", Step::Latched)
        },
        Case {
            status: latched(2),
            configured: false,
            ..base(
                "an old latch lifts; then the provider check runs",
                Step::ProviderNotConfigured,
            )
        },
        Case {
            configured: false,
            ..base("unconfigured provider", Step::ProviderNotConfigured)
        },
        Case {
            spec: None,
            ..base(
                "cloud-init resolved before anything touches the provider",
                Step::ResolveCloudInit,
            )
        },
        Case {
            status: ProxyStatus::default(),
            recorded: None,
            ..base("nothing recorded: create", Step::Create)
        },
        Case {
            status: ProxyStatus::default(),
            recorded: Some("old"),
            ..base("nothing recorded, stale hash: create", Step::Create)
        },
        Case {
            recorded: None,
            ..base(
                "adopted instance without a hash: record it, no replacement",
                Step::RecordHash,
            )
        },
        base("recorded and matching: get", Step::Get),
        Case {
            recorded: Some("h0"),
            ..base("hash differs: get first", Step::Get)
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Provisioning, ""))),
            ..base("provisioning: wait", Step::WaitProvisioning)
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Running, "10.0.0.7"))),
            ..base(
                "running with an IP",
                Step::Running {
                    ip: "10.0.0.7".into(),
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Running, ""))),
            ..base(
                "running without an IP is still provisioning",
                Step::WaitProvisioning,
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Stopped, ""))),
            ..base(
                "stopped: delete",
                Step::Delete {
                    why: ReplaceCause::Stopped(InstanceState::Stopped),
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Terminated, ""))),
            ..base(
                "terminated: delete",
                Step::Delete {
                    why: ReplaceCause::Stopped(InstanceState::Terminated),
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Stopped, ""))),
            delete_requested_at: Some(t(-30)),
            ..base(
                "stopped, delete asked 30s ago: wait, no resubmit",
                Step::WaitForDeletion {
                    why: ReplaceCause::Stopped(InstanceState::Stopped),
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Running, "10.0.0.7"))),
            recorded: Some("h0"),
            ..base(
                "spec changed, old still there: delete",
                Step::Delete {
                    why: ReplaceCause::SpecChanged,
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Running, "10.0.0.7"))),
            recorded: Some("h0"),
            delete_requested_at: Some(t(-120)),
            ..base(
                "spec changed, delete asked 2m ago: resubmit",
                Step::Delete {
                    why: ReplaceCause::SpecChanged,
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Running, "10.0.0.7"))),
            recorded: Some("h0"),
            delete_requested_at: Some(t(10)),
            ..base(
                "a request time in the future counts as recent",
                Step::WaitForDeletion {
                    why: ReplaceCause::SpecChanged,
                },
            )
        },
        Case {
            get: Some(GetOutcome::NotFound),
            recorded: Some("h0"),
            ..base(
                "spec changed, old gone: clear and create",
                Step::ClearAndCreate,
            )
        },
        Case {
            get: Some(GetOutcome::NotFound),
            ..base("vanished instance: clear and create", Step::ClearAndCreate)
        },
        Case {
            get: Some(GetOutcome::Failed(ErrorClass::Transient, "timeout".into())),
            ..base(
                "get error: handled by class",
                Step::Failed {
                    class: ErrorClass::Transient,
                    message: "timeout".into(),
                },
            )
        },
        Case {
            get: Some(GetOutcome::Failed(ErrorClass::Permanent, "bad id".into())),
            ..base(
                "permanent get error",
                Step::Failed {
                    class: ErrorClass::Permanent,
                    message: "bad id".into(),
                },
            )
        },
    ];
    for c in cases {
        let status = ProxyStatus {
            delete_requested_at: c.delete_requested_at,
            ..c.status.clone()
        };
        let input = ManagedInput {
            generation: Some(3),
            has_finalizer: c.has_finalizer,
            status: &status,
            provider_configured: c.configured,
            recorded_hash: c.recorded,
            spec_hash: c.spec,
            get: c.get.as_ref(),
            now: t(0),
        };
        assert_eq!(next_managed_step(&input), c.want, "{}", c.name);
    }
}

#[test]
fn deletion_path_table() {
    let found = GetOutcome::Found(inst(InstanceState::Running, "1.2.3.4"));
    let perm = GetOutcome::Failed(ErrorClass::Permanent, "host retired".into());
    let quota = GetOutcome::Failed(ErrorClass::QuotaExceeded, "rate".into());
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        bool,
        Option<&str>,
        bool,
        bool,
        Option<&GetOutcome>,
        Option<DateTime<Utc>>,
        DeleteStep,
    )> = vec![
        (
            "no finalizer: nothing",
            false,
            Some("id"),
            false,
            true,
            None,
            None,
            DeleteStep::Nothing,
        ),
        (
            "nothing recorded: release",
            true,
            None,
            false,
            true,
            None,
            None,
            DeleteStep::Release {
                why: ReleaseReason::NothingRecorded,
            },
        ),
        (
            "empty id: release",
            true,
            Some(""),
            false,
            true,
            None,
            None,
            DeleteStep::Release {
                why: ReleaseReason::NothingRecorded,
            },
        ),
        (
            "skip-cleanup: release without calls",
            true,
            Some("id"),
            true,
            true,
            None,
            None,
            DeleteStep::Release {
                why: ReleaseReason::SkipCleanup,
            },
        ),
        (
            "skip-cleanup beats an unconfigured provider",
            true,
            Some("id"),
            true,
            false,
            None,
            None,
            DeleteStep::Release {
                why: ReleaseReason::SkipCleanup,
            },
        ),
        (
            "unconfigured provider: error",
            true,
            Some("id"),
            false,
            false,
            None,
            None,
            DeleteStep::ProviderNotConfigured,
        ),
        (
            "get first",
            true,
            Some("id"),
            false,
            true,
            None,
            None,
            DeleteStep::Get,
        ),
        (
            "gone: release",
            true,
            Some("id"),
            false,
            true,
            Some(&GetOutcome::NotFound),
            None,
            DeleteStep::Release {
                why: ReleaseReason::InstanceGone,
            },
        ),
        (
            "found: delete",
            true,
            Some("id"),
            false,
            true,
            Some(&found),
            None,
            DeleteStep::Delete,
        ),
        (
            "found, delete asked 5s ago: wait",
            true,
            Some("id"),
            false,
            true,
            Some(&found),
            Some(t(-5)),
            DeleteStep::Wait,
        ),
        (
            "found, delete asked 5m ago: delete again",
            true,
            Some("id"),
            false,
            true,
            Some(&found),
            Some(t(-300)),
            DeleteStep::Delete,
        ),
        (
            "permanent get: delete anyway",
            true,
            Some("id"),
            false,
            true,
            Some(&perm),
            None,
            DeleteStep::DeleteAfterPermanentGet {
                get_error: "host retired".into(),
            },
        ),
        (
            "quota get: by class",
            true,
            Some("id"),
            false,
            true,
            Some(&quota),
            None,
            DeleteStep::Failed {
                class: ErrorClass::QuotaExceeded,
                message: "rate".into(),
            },
        ),
    ];
    for (name, fin, id, skip, configured, get, asked, want) in cases {
        let input = DeleteInput {
            has_finalizer: fin,
            provider_id: id,
            skip_cleanup: skip,
            provider_configured: configured,
            get,
            delete_requested_at: asked,
            now: t(0),
        };
        assert_eq!(next_delete_step(&input), want, "{name}");
    }
}

#[test]
fn latch_is_per_generation_and_only_for_permanent_errors() {
    assert!(is_latched(&latched(3), Some(3)));
    assert!(!is_latched(&latched(3), Some(4)));
    let mut s = ProxyStatus::default();
    mark_quota(&mut s, "quota", t(0), Some(3));
    assert!(!is_latched(&s, Some(3)));
    mark_not_configured(&mut s, "gone", t(0));
    assert!(
        !is_latched(&s, Some(3)),
        "not-configured is re-evaluated, never latched"
    );
    // Once the provider is configured the next pass goes on to create.
    let input = ManagedInput {
        generation: Some(3),
        has_finalizer: true,
        status: &s,
        provider_configured: true,
        recorded_hash: None,
        spec_hash: Some("h"),
        get: None,
        now: t(1),
    };
    assert_eq!(next_managed_step(&input), Step::Create);
}

#[test]
fn status_builders() {
    let mut s = ProxyStatus::default();
    mark_creating(&mut s, t(0), Some(1));
    assert_eq!(s.phase, Some(ProxyPhase::Provisioning));
    mark_running(&mut s, "10.0.0.2", None, t(1), Some(1));
    assert_eq!(
        (s.phase, s.ip.as_deref()),
        (Some(ProxyPhase::Running), Some("10.0.0.2"))
    );
    let c = condition::find(&s.conditions, PROVISIONED).unwrap();
    assert_eq!(
        (c.status, c.reason.as_str(), c.last_transition_time),
        (ConditionStatus::True, REASON_INSTANCE_RUNNING, t(1))
    );
    mark_running(&mut s, "10.0.0.2", Some(true), t(2), Some(1));
    assert_eq!(s.phase, Some(ProxyPhase::Ready));
    mark_replacing(
        &mut s,
        ReplaceCause::Stopped(InstanceState::Terminated),
        true,
        t(3),
        Some(1),
    );
    assert_eq!(s.delete_requested_at, Some(t(3)));
    assert!(condition::find(&s.conditions, PROVISIONED)
        .unwrap()
        .message
        .contains("Terminated"));
    clear_instance(&mut s);
    assert!(s.provider_id.is_none() && s.ip.is_none() && s.delete_requested_at.is_none());
    mark_not_configured(&mut s, "kvm-x", t(4));
    let c = condition::find(&s.conditions, PROVISIONED).unwrap();
    assert_eq!(c.reason, REASON_PERMANENT_ERROR);
    assert_eq!(c.observed_generation, None, "not a latch");
    assert!(c.message.contains("\"kvm-x\""));
    assert_eq!(s.phase, Some(ProxyPhase::Failed));
}
