use super::super::managed::{next_managed_step, ManagedInput, Step};
use super::super::status::{mark_not_configured, mark_quota};
use super::super::tests::{latched, status_with_id, t};
use super::*;
use crate::api::health::HealthReport;
use crate::api::proxy::conditions::*;
use crate::api::ProxyPhase;
use crate::provider::{InstanceState, Op};

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
        startup_timeout: std::time::Duration::from_secs(900),
        port: Some(3128),
        gates: super::super::tests::open_gates(),
        side: &Default::default(),
    };
    assert_eq!(next_managed_step(&input), Step::Create { port: 3128 });
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
                port: 3128,
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
                recycle: None,
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
                recycle: None,
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
                recycle: None,
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
            name:
                "external in a namespace not allowed, healthy before: Failed, nothing left probed",
            before: healthy_running(),
            ending: Ending::ExternalNotAllowed {
                message: "spec.mode: not here".into(),
            },
            want: End::AwaitChange,
            phase: failed,
            provisioned: prov(False, REASON_EXTERNAL_NOT_ALLOWED),
            healthy: prov(Unknown, REASON_NOT_PROBED),
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
            port: 3129,
        },
        &mut s,
        t(0),
        Some(1),
    );
    assert_eq!(s.provider_id.as_deref(), Some("default/proxy-y"));
    assert_eq!(s.port, Some(3129), "the port it serves on");
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
            recycle: None,
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
    let mut refused = healthy_running();
    end(
        Ending::ExternalNotAllowed {
            message: "spec.mode: not here".into(),
        },
        &mut refused,
        t(0),
        Some(1),
    );
    assert_eq!(
        (refused.ip.as_deref(), refused.latency_millis),
        (None, None),
        "an address or latency left would read as serving"
    );
    // Allowed again: served, the refusal gone.
    end(
        Ending::External {
            host: Some("px.example"),
            health: Health::Unknown,
        },
        &mut refused,
        t(1),
        Some(1),
    );
    assert_eq!(reason_of(&refused, PROVISIONED), None);
    assert_eq!(refused.ip.as_deref(), Some("px.example"));
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
        op: Op,
        class: ErrorClass,
        /// The status before the failure.
        before: ProxyStatus,
        health: Health,
        want: Result<End, Backoff>,
        phase: Option<ProxyPhase>,
        reason: Option<&'static str>,
        provisioned: Option<ConditionStatus>,
        latches: bool,
    }
    let healthy_report = HealthReport {
        healthy: true,
        latency_ms: 9,
        probed_at: t(-1),
        message: "probe passed".into(),
    };
    let failing_report = HealthReport {
        healthy: false,
        latency_ms: 9,
        probed_at: t(-1),
        message: "connecting to the proxy: refused".into(),
    };
    let unavailable = Ok(End::RequeueAfter(UNAVAILABLE_RETRY_MIN));
    let ready = Some(ProxyPhase::Ready);
    use ConditionStatus::{False, Unknown};
    let cases = [
        Case {
            name: "a permanent create latches at this generation",
            op: Op::Create,
            class: ErrorClass::Permanent,
            before: ProxyStatus::default(),
            health: Health::Unknown,
            want: Ok(End::AwaitChange),
            phase: Some(ProxyPhase::Failed),
            reason: Some(REASON_PERMANENT_ERROR),
            provisioned: Some(False),
            latches: true,
        },
        Case {
            name: "a permanent get of a Ready Proxy does not latch: unavailable, Ready kept",
            op: Op::Get,
            class: ErrorClass::Permanent,
            before: healthy_running(),
            health: Health::Unknown,
            want: unavailable,
            phase: ready,
            reason: Some(REASON_PROVIDER_UNAVAILABLE),
            provisioned: Some(Unknown),
            latches: false,
        },
        Case {
            name: "a permanent delete does not latch",
            op: Op::Delete,
            class: ErrorClass::Permanent,
            before: healthy_running(),
            health: Health::Report(healthy_report.clone()),
            want: unavailable,
            phase: ready,
            reason: Some(REASON_PROVIDER_UNAVAILABLE),
            provisioned: Some(Unknown),
            latches: false,
        },
        Case {
            name: "a permanent list does not latch",
            op: Op::List,
            class: ErrorClass::Permanent,
            before: status_with_id(),
            health: Health::Unknown,
            want: unavailable,
            phase: None,
            reason: Some(REASON_PROVIDER_UNAVAILABLE),
            provisioned: Some(Unknown),
            latches: false,
        },
        Case {
            name: "auth on get of a Ready Proxy with passing probes: stays Ready, slow retry",
            op: Op::Get,
            class: ErrorClass::Unavailable,
            before: healthy_running(),
            health: Health::Report(healthy_report.clone()),
            want: unavailable,
            phase: ready,
            reason: Some(REASON_PROVIDER_UNAVAILABLE),
            provisioned: Some(Unknown),
            latches: false,
        },
        Case {
            name: "auth on get of a Ready Proxy whose probes fail: leaves the pool, not Failed",
            op: Op::Get,
            class: ErrorClass::Unavailable,
            before: healthy_running(),
            health: Health::Report(failing_report),
            want: unavailable,
            phase: Some(ProxyPhase::Running),
            reason: Some(REASON_PROVIDER_UNAVAILABLE),
            provisioned: Some(Unknown),
            latches: false,
        },
        Case {
            name: "auth on create: unavailable, never latched",
            op: Op::Create,
            class: ErrorClass::Unavailable,
            before: ProxyStatus::default(),
            health: Health::Unknown,
            want: unavailable,
            phase: None,
            reason: Some(REASON_PROVIDER_UNAVAILABLE),
            provisioned: Some(Unknown),
            latches: false,
        },
        Case {
            name: "quota is retried after minutes, the phase kept",
            op: Op::Create,
            class: ErrorClass::QuotaExceeded,
            before: ProxyStatus::default(),
            health: Health::Unknown,
            want: Ok(End::RequeueAfter(QUOTA_RETRY)),
            phase: None,
            reason: Some(REASON_QUOTA_EXCEEDED),
            provisioned: Some(False),
            latches: false,
        },
        Case {
            name: "quota on get of a Ready Proxy keeps it Ready",
            op: Op::Get,
            class: ErrorClass::QuotaExceeded,
            before: healthy_running(),
            health: Health::Unknown,
            want: Ok(End::RequeueAfter(QUOTA_RETRY)),
            phase: ready,
            reason: Some(REASON_QUOTA_EXCEEDED),
            provisioned: Some(False),
            latches: false,
        },
        Case {
            name: "transient goes to backoff, the status untouched",
            op: Op::Get,
            class: ErrorClass::Transient,
            before: ProxyStatus::default(),
            health: Health::Unknown,
            want: Err(Backoff),
            phase: None,
            reason: None,
            provisioned: None,
            latches: false,
        },
        Case {
            name: "not found outside get goes to backoff",
            op: Op::Delete,
            class: ErrorClass::NotFound,
            before: ProxyStatus::default(),
            health: Health::Unknown,
            want: Err(Backoff),
            phase: None,
            reason: None,
            provisioned: None,
            latches: false,
        },
    ];
    for c in cases {
        let mut s = c.before.clone();
        let failure = Failure {
            op: c.op,
            class: c.class,
            message: "zone \"x\" is unknown",
        };
        let got = managed_failure(&failure, &c.health, &mut s, t(0), Some(3));
        assert_eq!(got, c.want, "{}", c.name);
        assert_eq!(s.phase, c.phase, "{}: phase", c.name);
        let cond = condition::find(&s.conditions, PROVISIONED);
        assert_eq!(cond.map(|c| c.reason.as_str()), c.reason, "{}", c.name);
        assert_eq!(cond.map(|c| c.status), c.provisioned, "{}", c.name);
        if let Some(cond) = cond {
            assert!(
                cond.message.contains("zone \"x\" is unknown"),
                "{}: {}",
                c.name,
                cond.message
            );
        }
        assert_eq!(is_latched(&s, Some(3)), c.latches, "{}: latch", c.name);
    }
}

#[test]
fn unavailable_retry_grows_with_the_outage_and_is_capped() {
    struct Case {
        name: &'static str,
        /// Seconds since the Proxy turned unavailable, if it is.
        since: Option<i64>,
        want: Duration,
    }
    let cases = [
        Case {
            name: "first refusal: the minimum",
            since: None,
            want: UNAVAILABLE_RETRY_MIN,
        },
        Case {
            name: "just turned unavailable",
            since: Some(0),
            want: UNAVAILABLE_RETRY_MIN,
        },
        Case {
            name: "unavailable for four minutes: wait four more",
            since: Some(240),
            want: Duration::from_secs(240),
        },
        Case {
            name: "an hour: capped",
            since: Some(3600),
            want: UNAVAILABLE_RETRY_MAX,
        },
        Case {
            name: "a transition time in the future: the minimum",
            since: Some(-500),
            want: UNAVAILABLE_RETRY_MIN,
        },
    ];
    for c in cases {
        let mut s = healthy_running();
        if let Some(since) = c.since {
            status::mark_unavailable(&mut s, "401", &Health::Unknown, t(-since), Some(3));
        }
        assert_eq!(unavailable_retry(&s, t(0)), c.want, "{}", c.name);
    }
    // The transition time holds while the refusal lasts, so the wait grows.
    let mut s = healthy_running();
    let f = Failure {
        op: Op::Get,
        class: ErrorClass::Unavailable,
        message: "401",
    };
    let mut waits = Vec::new();
    let mut now = 0;
    for _ in 0..8 {
        let got = managed_failure(&f, &Health::Unknown, &mut s, t(now), Some(3));
        let Ok(End::RequeueAfter(d)) = got else {
            panic!("{got:?}")
        };
        waits.push(d.as_secs());
        now += i64::try_from(d.as_secs()).unwrap();
    }
    assert_eq!(waits, [60, 60, 120, 240, 480, 600, 600, 600]);
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
            name: "unavailable: retried after minutes",
            class: ErrorClass::Unavailable,
            want: Ok(End::RequeueAfter(QUOTA_RETRY)),
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

#[test]
fn a_held_create_says_why_and_comes_back_no_sooner_than_its_next_try() {
    use crate::config::CreateLimits;
    use crate::controller::throttle::limiter::{Held, Hold};
    let s = std::time::Duration::from_secs;
    let limits = CreateLimits::default();
    let cases = [
        (
            Held::Throttled {
                hold: Hold::Rate,
                until: t(40),
                limits,
            },
            Some("CreateThrottled"),
            s(30),
        ),
        (
            Held::ReplaceBackoff { until: t(70) },
            Some("ReplaceBackoff"),
            s(60),
        ),
        (
            Held::InstanceLimit { max: 3, held: 3 },
            Some("InstanceLimit"),
            s(15),
        ),
        // The refusal's own condition stays; only the wait counts.
        (Held::Refused { wait: s(200) }, None, s(200)),
    ];
    for (held, reason, wait) in cases {
        let mut status = ProxyStatus::default();
        let got = end(
            Ending::Held {
                provider: "gcp-eu",
                held,
            },
            &mut status,
            t(10),
            Some(1),
        );
        assert_eq!(got, End::NotBefore(wait), "{held:?}");
        let shown = condition::find(&status.conditions, PROVISIONED).map(|c| c.reason.as_str());
        assert_eq!(shown, reason, "{held:?}");
    }
    assert_eq!(
        super::super::jittered(End::NotBefore(s(30)), 0.5),
        End::RequeueAfter(std::time::Duration::from_millis(32_500)),
        "spread after the next try (half of at most 5 s), never before"
    );
}
