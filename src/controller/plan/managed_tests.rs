use chrono::{DateTime, Utc};

use super::super::tests::{inst, latched, open_gates, status_with_id, t};
use super::*;
use crate::api::ProxyStatus;
use crate::controller::throttle::limiter::{CreateGate, Held};
use crate::fleet::{DrainDone, RecycleStep};
use crate::provider::{ErrorClass, InstanceState};

struct Case {
    name: &'static str,
    status: ProxyStatus,
    has_finalizer: bool,
    configured: bool,
    recorded: Option<&'static str>,
    spec: Option<&'static str>,
    get: Option<GetOutcome>,
    delete_requested_at: Option<DateTime<Utc>>,
    gates: Gates,
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
        gates: open_gates(),
        want,
    }
}

/// Each case's step, at t(0), with a 900 s startup timeout.
fn check(cases: Vec<Case>) {
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
            startup_timeout: std::time::Duration::from_secs(900),
            port: Some(3128),
            gates: c.gates,
            side: &Default::default(),
        };
        assert_eq!(next_managed_step(&input), c.want, "{}", c.name);
    }
}

#[test]
fn managed_path_table() {
    // Created at `at` (seconds from t(0), the test's now); the startup
    // timeout is 900 s.
    let created = |at: i64| ProxyStatus {
        created_at: Some(t(at)),
        ..status_with_id()
    };
    let timed_out = Step::Delete {
        why: ReplaceCause::StartupTimedOut {
            after: std::time::Duration::from_secs(900),
        },
    };
    let cases =
        vec![
        Case {
            has_finalizer: false,
            ..base("finalizer first, before anything else", Step::AddFinalizer)
        },
        Case {
            status: created(-899),
            get: Some(GetOutcome::Found(inst(InstanceState::Provisioning, ""))),
            ..base("provisioning within its startup timeout: wait", Step::WaitProvisioning)
        },
        Case {
            status: created(-900),
            get: Some(GetOutcome::Found(inst(InstanceState::Provisioning, ""))),
            ..base("provisioning at its startup timeout: replace", timed_out.clone())
        },
        Case {
            status: created(-3600),
            get: Some(GetOutcome::Found(inst(InstanceState::Running, ""))),
            ..base("running without an address past the timeout: replace", timed_out.clone())
        },
        Case {
            status: created(-3600),
            get: Some(GetOutcome::Found(inst(InstanceState::Running, "10.0.0.9"))),
            ..base(
                "running with an address: the timeout no longer matters",
                Step::Running {
                    ip: "10.0.0.9".into(),
                    outdated: false,
                    recycle: RecycleStep::Serve,
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Provisioning, ""))),
            ..base(
                "no create time recorded (an older operator's): wait, the timeout starts now",
                Step::WaitProvisioning,
            )
        },
        Case {
            status: created(-3600),
            get: Some(GetOutcome::Found(inst(InstanceState::Provisioning, ""))),
            delete_requested_at: Some(t(-10)),
            ..base(
                "timed out, delete just asked: wait for it",
                Step::WaitForDeletion {
                    why: ReplaceCause::StartupTimedOut {
                        after: std::time::Duration::from_secs(900),
                    },
                },
            )
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
            ..base("nothing recorded: create", Step::Create { port: 3128 })
        },
        Case {
            status: ProxyStatus::default(),
            recorded: Some("old"),
            ..base("nothing recorded, stale hash: create", Step::Create { port: 3128 })
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
                    outdated: false,
                    recycle: RecycleStep::Serve,
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
                "spec changed, old still serving: it serves until the budget rolls it",
                Step::Running {
                    ip: "10.0.0.7".into(),
                    outdated: true,
                    recycle: RecycleStep::Serve,
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Provisioning, ""))),
            recorded: Some("h0"),
            ..base(
                "spec changed, old still provisioning (serves nothing): delete",
                Step::Delete {
                    why: ReplaceCause::SpecChanged,
                },
            )
        },
        Case {
            get: Some(GetOutcome::Found(inst(InstanceState::Stopped, ""))),
            recorded: Some("h0"),
            ..base(
                "spec changed, old stopped: delete",
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
                "spec changed, delete asked 2m ago and still serving: back to the budget's roll",
                Step::Running {
                    ip: "10.0.0.7".into(),
                    outdated: true,
                    recycle: RecycleStep::Serve,
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
        Case {
            get: Some(GetOutcome::CreateFailed(
                ErrorClass::Permanent,
                "image family ubuntu-9999 not found".into(),
            )),
            ..base(
                "the get reports the create failed: the create's failure",
                Step::CreateFailed {
                    class: ErrorClass::Permanent,
                    message: "image family ubuntu-9999 not found".into(),
                },
            )
        },
    ];
    check(cases);
}

#[test]
fn create_port_table() {
    struct Case {
        name: &'static str,
        port: Option<i32>,
        want: Option<u16>,
    }
    let cases = [
        Case {
            name: "a port",
            port: Some(3128),
            want: Some(3128),
        },
        Case {
            name: "the highest port",
            port: Some(65535),
            want: Some(65535),
        },
        Case {
            name: "none",
            port: None,
            want: None,
        },
        Case {
            name: "zero",
            port: Some(0),
            want: None,
        },
        Case {
            name: "negative",
            port: Some(-1),
            want: None,
        },
        Case {
            name: "too high",
            port: Some(65536),
            want: None,
        },
    ];
    for c in cases {
        assert_eq!(create_port(c.port), c.want, "{}", c.name);
    }
}

#[test]
fn a_drained_instance_is_replaced_for_its_changed_spec_or_its_recycle() {
    assert_eq!(ReplaceCause::of_drain(true), ReplaceCause::SpecChanged);
    assert_eq!(ReplaceCause::of_drain(false), ReplaceCause::Recycled);
}

#[test]
fn the_gates_are_asked_only_when_needed_and_their_answers_end_the_pass() {
    let stopped = || Some(GetOutcome::Found(inst(InstanceState::Stopped, "")));
    let running = || Some(GetOutcome::Found(inst(InstanceState::Running, "10.0.0.9")));
    let gates = |replace: Option<bool>, recycle: Option<RecycleStep>| Gates {
        replace,
        recycle,
        create: None,
    };
    let drained = Some(RecycleStep::Replace(DrainDone::NoLeases));
    let create = |gate: Option<CreateGate>| Gates {
        create: gate,
        ..gates(None, None)
    };
    let capped = Held::InstanceLimit { max: 3, held: 3 };
    let cases = vec![
        Case {
            status: ProxyStatus::default(),
            gates: create(None),
            ..base("no instance: ask the create gate", Step::AskCreate)
        },
        Case {
            status: ProxyStatus::default(),
            gates: create(Some(CreateGate::Go)),
            ..base("the gate lets it go", Step::Create { port: 3128 })
        },
        Case {
            status: ProxyStatus::default(),
            gates: create(Some(CreateGate::Held(capped))),
            ..base("the gate holds it", Step::Held(capped))
        },
        Case {
            get: stopped(),
            gates: gates(None, None),
            ..base(
                "a stopped instance: ask the breaker first",
                Step::AskReplace,
            )
        },
        Case {
            get: stopped(),
            gates: gates(Some(false), None),
            ..base("the breaker is open: hold", Step::CircuitOpen)
        },
        Case {
            get: Some(GetOutcome::NotFound),
            gates: gates(None, None),
            ..base(
                "a vanished instance: ask the breaker first",
                Step::AskReplace,
            )
        },
        Case {
            get: Some(GetOutcome::NotFound),
            gates: gates(Some(false), None),
            ..base("vanished, breaker open: hold", Step::CircuitOpen)
        },
        Case {
            get: Some(GetOutcome::NotFound),
            recorded: Some("old"),
            gates: gates(Some(false), None),
            ..base(
                "vanished with a changed spec: replaced whatever the breaker says",
                Step::ClearAndCreate,
            )
        },
        Case {
            get: running(),
            gates: gates(None, None),
            ..base("running: ask the fleet", Step::AskRecycle)
        },
        Case {
            get: running(),
            gates: gates(None, Some(RecycleStep::StartDrain)),
            ..base(
                "running, the drain starts: still serving this pass",
                Step::Running {
                    ip: "10.0.0.9".into(),
                    outdated: false,
                    recycle: RecycleStep::StartDrain,
                },
            )
        },
        Case {
            get: running(),
            gates: gates(None, drained),
            ..base(
                "drained: delete it for its recycle",
                Step::DeleteDrained {
                    why: ReplaceCause::Recycled,
                },
            )
        },
        Case {
            get: running(),
            recorded: Some("old"),
            gates: gates(None, drained),
            ..base(
                "drained and outdated: delete it for its spec",
                Step::DeleteDrained {
                    why: ReplaceCause::SpecChanged,
                },
            )
        },
        Case {
            get: running(),
            delete_requested_at: Some(t(-5)),
            gates: gates(None, drained),
            ..base(
                "drained, delete just asked: wait",
                Step::WaitForDeletion {
                    why: ReplaceCause::Recycled,
                },
            )
        },
    ];
    check(cases);
}
