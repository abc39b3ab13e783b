use super::super::managed::{next_managed_step, ManagedInput, Step};
use super::super::status::{mark_not_configured, mark_quota};
use super::super::tests::{latched, status_with_id, t};
use super::*;
use crate::api::health::HealthReport;
use crate::api::proxy::conditions::*;
use crate::api::ProxyPhase;
use crate::provider::InstanceState;

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

/// A status that has served and was found healthy.
fn healthy_running() -> ProxyStatus {
    let report = HealthReport {
        healthy: true,
        latency_ms: 12,
        probed_at: t(-10),
        message: "probe passed".into(),
    };
    let mut s = status_with_id();
    status::mark_running(&mut s, "10.0.0.7", &Health::Report(report), t(-10), Some(3));
    s
}

fn reason_of(s: &ProxyStatus, type_: &str) -> Option<(ConditionStatus, String)> {
    condition::find(&s.conditions, type_).map(|c| (c.status, c.reason.clone()))
}

#[test]
fn endings_table() {
    struct Case {
        name: &'static str,
        before: ProxyStatus,
        ending: Ending<'static>,
        want: End,
        phase: Option<ProxyPhase>,
        provisioned: Option<(ConditionStatus, &'static str)>,
        healthy: Option<(ConditionStatus, &'static str)>,
    }
    let unhealthy = HealthReport {
        healthy: false,
        latency_ms: 5,
        probed_at: t(0),
        message: "connecting to the proxy: refused".into(),
    };
    let after = |d: Duration| End::RequeueAfter(d);
    let running = Some(ProxyPhase::Running);
    let ready = Some(ProxyPhase::Ready);
    let provisioning = Some(ProxyPhase::Provisioning);
    let failed = Some(ProxyPhase::Failed);
    let prov = |s, r| Some((s, r));
    use ConditionStatus::{False, True, Unknown};
    let cases = vec![
        Case {
            name: "finalizer added: come back at once",
            before: ProxyStatus::default(),
            ending: Ending::FinalizerAdded,
            want: after(REQUEUE_NOW),
            phase: None,
            provisioned: None,
            healthy: None,
        },
        Case {
            name: "latched: wait for an edit, status untouched",
            before: latched(3),
            ending: Ending::Latched,
            want: End::AwaitChange,
            phase: failed,
            provisioned: prov(False, REASON_PERMANENT_ERROR),
            healthy: None,
        },
        Case {
            name: "provider not configured: Failed, waits",
            before: ProxyStatus::default(),
            ending: Ending::ProviderNotConfigured { provider: "gone" },
            want: End::AwaitChange,
            phase: failed,
            provisioned: prov(False, REASON_PERMANENT_ERROR),
            healthy: None,
        },
        Case {
            name: "cloud-init unreadable on a new Proxy: Provisioning, retried",
            before: ProxyStatus::default(),
            ending: Ending::CloudInitUnreadable {
                message: "secret ci not found".into(),
            },
            want: after(CLOUD_INIT_RETRY),
            phase: provisioning,
            provisioned: prov(False, REASON_CLOUD_INIT_ERROR),
            healthy: None,
        },
        Case {
            name: "cloud-init unreadable on a serving Proxy keeps its phase",
            before: healthy_running(),
            ending: Ending::CloudInitUnreadable {
                message: "secret ci not found".into(),
            },
            want: after(CLOUD_INIT_RETRY),
            phase: ready,
            provisioned: prov(False, REASON_CLOUD_INIT_ERROR),
            healthy: prov(True, status::REASON_PROBE_SUCCEEDED),
        },
        Case {
            name: "no port: invalid spec, waits",
            before: ProxyStatus::default(),
            ending: Ending::NoPort,
            want: End::AwaitChange,
            phase: failed,
            provisioned: prov(False, REASON_INVALID_SPEC),
            healthy: None,
        },
        Case {
            name: "created: Provisioning, the old verdict Unknown, come back at once",
            before: healthy_running(),
            ending: Ending::Created {
                id: "default/proxy-y".into(),
            },
            want: after(REQUEUE_NOW),
            phase: provisioning,
            provisioned: prov(False, REASON_CREATING),
            healthy: prov(Unknown, status::REASON_AWAITING_PROBE),
        },
        Case {
            name: "delete submitted: Provisioning, verdict Unknown, poll",
            before: healthy_running(),
            ending: Ending::Replacing {
                why: ReplaceCause::SpecChanged,
                requested: true,
            },
            want: after(DELETION_POLL),
            phase: provisioning,
            provisioned: prov(False, REASON_CREATING),
            healthy: prov(Unknown, status::REASON_AWAITING_PROBE),
        },
        Case {
            name: "still deleting: poll, the Healthy condition untouched",
            before: healthy_running(),
            ending: Ending::Replacing {
                why: ReplaceCause::Stopped(InstanceState::Stopped),
                requested: false,
            },
            want: after(DELETION_POLL),
            phase: provisioning,
            provisioned: prov(False, REASON_CREATING),
            healthy: prov(True, status::REASON_PROBE_SUCCEEDED),
        },
        Case {
            name: "provisioning: poll, verdict Unknown",
            before: healthy_running(),
            ending: Ending::Provisioning,
            want: after(PROVISIONING_POLL),
            phase: provisioning,
            provisioned: prov(False, REASON_CREATING),
            healthy: prov(Unknown, status::REASON_AWAITING_PROBE),
        },
        Case {
            name: "running without a verdict: Running, resync",
            before: status_with_id(),
            ending: Ending::Running {
                ip: "10.0.0.7".into(),
                health: Health::Unknown,
            },
            want: after(RUNNING_RESYNC),
            phase: running,
            provisioned: prov(True, REASON_INSTANCE_RUNNING),
            healthy: None,
        },
        Case {
            name: "running, no report but healthy before: stays Ready",
            before: healthy_running(),
            ending: Ending::Running {
                ip: "10.0.0.7".into(),
                health: Health::Unknown,
            },
            want: after(RUNNING_RESYNC),
            phase: ready,
            provisioned: prov(True, REASON_INSTANCE_RUNNING),
            healthy: prov(True, status::REASON_PROBE_SUCCEEDED),
        },
        Case {
            name: "running, failing probes: Running",
            before: healthy_running(),
            ending: Ending::Running {
                ip: "10.0.0.7".into(),
                health: Health::Report(unhealthy.clone()),
            },
            want: after(RUNNING_RESYNC),
            phase: running,
            provisioned: prov(True, REASON_INSTANCE_RUNNING),
            healthy: prov(False, status::REASON_PROBE_FAILED),
        },
        Case {
            name: "external without an endpoint: invalid",
            before: ProxyStatus::default(),
            ending: Ending::External {
                host: None,
                health: Health::Unknown,
            },
            want: End::AwaitChange,
            phase: failed,
            provisioned: prov(False, REASON_INVALID_SPEC),
            healthy: None,
        },
        Case {
            name: "external, healthy by verdict: Ready, no Provisioned",
            before: ProxyStatus::default(),
            ending: Ending::External {
                host: Some("px.example"),
                health: Health::Verdict(true),
            },
            want: End::AwaitChange,
            phase: ready,
            provisioned: None,
            healthy: None,
        },
        Case {
            name: "deletion, not held",
            before: status_with_id(),
            ending: Ending::NotHeld,
            want: End::AwaitChange,
            phase: None,
            provisioned: None,
            healthy: None,
        },
        Case {
            name: "deletion, released",
            before: status_with_id(),
            ending: Ending::Released,
            want: End::AwaitChange,
            phase: None,
            provisioned: None,
            healthy: None,
        },
        Case {
            name: "deletion, cleanup pending: poll",
            before: status_with_id(),
            ending: Ending::CleanupPending,
            want: after(DELETION_POLL),
            phase: None,
            provisioned: None,
            healthy: None,
        },
        Case {
            name: "step limit: come back at once",
            before: status_with_id(),
            ending: Ending::StepLimit,
            want: after(REQUEUE_NOW),
            phase: None,
            provisioned: None,
            healthy: None,
        },
    ];
    for c in cases {
        let mut s = c.before.clone();
        let got = end(c.ending, &mut s, t(0), Some(3));
        assert_eq!(got, c.want, "{}", c.name);
        assert_eq!(s.phase, c.phase, "{}: phase", c.name);
        let own = |x: Option<(ConditionStatus, &str)>| x.map(|(s, r)| (s, r.to_string()));
        assert_eq!(
            reason_of(&s, PROVISIONED),
            own(c.provisioned),
            "{}: Provisioned",
            c.name
        );
        assert_eq!(
            reason_of(&s, HEALTHY),
            own(c.healthy),
            "{}: Healthy",
            c.name
        );
    }
}

#[test]
fn endings_record_what_they_found() {
    let mut s = status_with_id();
    end(
        Ending::Created {
            id: "default/proxy-y".into(),
        },
        &mut s,
        t(0),
        Some(1),
    );
    assert_eq!(s.provider_id.as_deref(), Some("default/proxy-y"));
    end(
        Ending::Replacing {
            why: ReplaceCause::SpecChanged,
            requested: true,
        },
        &mut s,
        t(1),
        Some(1),
    );
    assert_eq!(s.delete_requested_at, Some(t(1)));
    end(
        Ending::Running {
            ip: "10.0.0.9".into(),
            health: Health::Unknown,
        },
        &mut s,
        t(2),
        Some(1),
    );
    assert_eq!(
        (s.ip.as_deref(), s.delete_requested_at),
        (Some("10.0.0.9"), None)
    );
    let mut gone = status_with_id();
    end(Ending::CleanupRequested, &mut gone, t(5), Some(1));
    assert_eq!(gone.delete_requested_at, Some(t(5)));
    let mut ext = ProxyStatus::default();
    end(
        Ending::External {
            host: Some("px.example"),
            health: Health::Unknown,
        },
        &mut ext,
        t(0),
        Some(1),
    );
    assert_eq!(
        (ext.ip.as_deref(), ext.phase),
        (Some("px.example"), Some(ProxyPhase::Running))
    );
    let mut bad = ProxyStatus::default();
    end(Ending::NoPort, &mut bad, t(0), Some(1));
    let c = condition::find(&bad.conditions, PROVISIONED).unwrap();
    assert_eq!(
        (c.message.as_str(), c.observed_generation),
        (PORT_REQUIRED, Some(1))
    );
}

#[test]
fn managed_failure_table() {
    struct Case {
        name: &'static str,
        class: ErrorClass,
        want: Result<End, Backoff>,
        phase: Option<ProxyPhase>,
        reason: Option<&'static str>,
        latches: bool,
    }
    let cases = [
        Case {
            name: "permanent latches at this generation",
            class: ErrorClass::Permanent,
            want: Ok(End::AwaitChange),
            phase: Some(ProxyPhase::Failed),
            reason: Some(REASON_PERMANENT_ERROR),
            latches: true,
        },
        Case {
            name: "quota is retried after minutes, the phase kept",
            class: ErrorClass::QuotaExceeded,
            want: Ok(End::RequeueAfter(QUOTA_RETRY)),
            phase: None,
            reason: Some(REASON_QUOTA_EXCEEDED),
            latches: false,
        },
        Case {
            name: "transient goes to backoff, the status untouched",
            class: ErrorClass::Transient,
            want: Err(Backoff),
            phase: None,
            reason: None,
            latches: false,
        },
        Case {
            name: "not found outside get goes to backoff",
            class: ErrorClass::NotFound,
            want: Err(Backoff),
            phase: None,
            reason: None,
            latches: false,
        },
    ];
    for c in cases {
        let mut s = ProxyStatus::default();
        let got = managed_failure(c.class, "zone \"x\" is unknown", &mut s, t(0), Some(3));
        assert_eq!(got, c.want, "{}", c.name);
        assert_eq!(s.phase, c.phase, "{}: phase", c.name);
        let cond = condition::find(&s.conditions, PROVISIONED);
        assert_eq!(cond.map(|c| c.reason.as_str()), c.reason, "{}", c.name);
        if let Some(cond) = cond {
            assert_eq!(cond.message, "zone \"x\" is unknown", "{}", c.name);
        }
        assert_eq!(is_latched(&s, Some(3)), c.latches, "{}: latch", c.name);
    }
}

#[test]
fn delete_failure_table() {
    struct Case {
        name: &'static str,
        class: ErrorClass,
        want: Result<End, Backoff>,
    }
    let cases = [
        Case {
            name: "quota is retried after minutes",
            class: ErrorClass::QuotaExceeded,
            want: Ok(End::RequeueAfter(QUOTA_RETRY)),
        },
        Case {
            name: "transient: backoff",
            class: ErrorClass::Transient,
            want: Err(Backoff),
        },
        Case {
            name: "permanent: backoff (the finalizer holds)",
            class: ErrorClass::Permanent,
            want: Err(Backoff),
        },
        Case {
            name: "not found: backoff",
            class: ErrorClass::NotFound,
            want: Err(Backoff),
        },
    ];
    for c in cases {
        assert_eq!(delete_failure(c.class), c.want, "{}", c.name);
    }
}

#[test]
fn backoff_table() {
    struct Case {
        name: &'static str,
        failures: u32,
        want: Duration,
    }
    let ms = Duration::from_millis;
    let cases = [
        Case {
            name: "first failure",
            failures: 1,
            want: ms(5),
        },
        Case {
            name: "doubles",
            failures: 2,
            want: ms(10),
        },
        Case {
            name: "tenth",
            failures: 10,
            want: ms(2560),
        },
        Case {
            name: "capped at 1000s",
            failures: 20,
            want: ms(1_000_000),
        },
        Case {
            name: "no overflow far out",
            failures: u32::MAX,
            want: ms(1_000_000),
        },
        Case {
            name: "zero counts as the first",
            failures: 0,
            want: ms(5),
        },
    ];
    for c in cases {
        assert_eq!(backoff(c.failures), c.want, "{}", c.name);
    }
}
