use super::super::status::*;
use super::super::tests::t;
use super::super::ReplaceCause;
use super::*;
use crate::api::health::HealthReport;
use crate::api::proxy::conditions::*;
use crate::provider::InstanceState;

fn report(healthy: bool, message: &str) -> Health {
    Health::Report(HealthReport {
        healthy,
        latency_ms: 12,
        probed_at: t(0),
        message: message.into(),
    })
}

#[test]
fn ready_follows_the_phase_with_the_blocking_reason() {
    struct Case {
        name: &'static str,
        /// Builds the status a pass leaves.
        build: fn(&mut ProxyStatus),
        ready: ConditionStatus,
        reason: &'static str,
        /// A part of the message.
        message: &'static str,
    }
    let cases = [
        Case {
            name: "never acted on",
            build: |_| {},
            ready: ConditionStatus::False,
            reason: REASON_PENDING,
            message: "not acted on",
        },
        Case {
            name: "a create submitted: Provisioned's reason",
            build: |s| mark_creating(s, t(0), Some(1)),
            ready: ConditionStatus::False,
            reason: REASON_CREATING,
            message: "being created",
        },
        Case {
            name: "held back by the create limits",
            build: |s| {
                mark_held(
                    s,
                    REASON_CREATE_THROTTLED,
                    "held until 10:00",
                    t(0),
                    Some(1),
                )
            },
            ready: ConditionStatus::False,
            reason: REASON_CREATE_THROTTLED,
            message: "held until 10:00",
        },
        Case {
            name: "running, no verdict yet",
            build: |s| mark_running(s, "10.0.0.2", &Health::Unknown, t(0), Some(1)),
            ready: ConditionStatus::False,
            reason: REASON_AWAITING_VERDICT,
            message: "no probe verdict",
        },
        Case {
            name: "running, probes fail: Healthy's reason and the probe error",
            build: |s| {
                mark_running(
                    s,
                    "10.0.0.2",
                    &report(false, "connect refused"),
                    t(0),
                    Some(1),
                )
            },
            ready: ConditionStatus::False,
            reason: REASON_PROBE_FAILED,
            message: "connect refused",
        },
        Case {
            name: "running, probes pass: Ready",
            build: |s| mark_running(s, "10.0.0.2", &report(true, "204"), t(0), Some(1)),
            ready: ConditionStatus::True,
            reason: REASON_PROXY_READY,
            message: "probes pass",
        },
        Case {
            name: "ready by a bare verdict, no Healthy condition",
            build: |s| mark_running(s, "10.0.0.2", &Health::Verdict(true), t(0), Some(1)),
            ready: ConditionStatus::True,
            reason: REASON_PROXY_READY,
            message: "advertised",
        },
        Case {
            name: "latched: the latch reason",
            build: |s| mark_permanent(s, "zone \"x\" is unknown", t(0), Some(1)),
            ready: ConditionStatus::False,
            reason: REASON_PERMANENT_ERROR,
            message: "zone \"x\" is unknown",
        },
        Case {
            name: "provider not configured",
            build: |s| mark_not_configured(s, "kvm-x", t(0)),
            ready: ConditionStatus::False,
            reason: REASON_PERMANENT_ERROR,
            message: "not configured",
        },
        Case {
            name: "serving, then the instance stopped: replaced, Provisioned's reason",
            build: |s| {
                mark_running(s, "10.0.0.2", &report(true, "204"), t(0), Some(1));
                mark_replacing(
                    s,
                    ReplaceCause::Stopped(InstanceState::Terminated),
                    true,
                    t(1),
                    Some(1),
                );
                health_unknown(s, t(1));
            },
            ready: ConditionStatus::False,
            reason: REASON_CREATING,
            message: "Terminated",
        },
        Case {
            name: "an External Proxy refused by the allowlist",
            build: |s| {
                mark_external_refused(
                    s,
                    (REASON_EXTERNAL_NOT_ALLOWED, "namespace \"a\" not allowed"),
                    t(0),
                    Some(1),
                )
            },
            ready: ConditionStatus::False,
            reason: REASON_EXTERNAL_NOT_ALLOWED,
            message: "not allowed",
        },
        Case {
            name: "an External Proxy, probes failing",
            build: |s| mark_external(s, "px.example", &report(false, "timed out"), t(0)),
            ready: ConditionStatus::False,
            reason: REASON_PROBE_FAILED,
            message: "timed out",
        },
        Case {
            name: "a serving Proxy while the provider cannot be observed keeps Ready",
            build: |s| {
                mark_running(s, "10.0.0.2", &report(true, "204"), t(0), Some(1));
                mark_unavailable(s, "403 forbidden", &Health::Unknown, t(1), Some(1));
            },
            ready: ConditionStatus::True,
            reason: REASON_PROXY_READY,
            message: "probes pass",
        },
    ];
    for c in cases {
        let mut s = ProxyStatus::default();
        (c.build)(&mut s);
        let (status, reason, message) = ready_condition(&s);
        assert_eq!(
            status == ConditionStatus::True,
            s.phase == Some(ProxyPhase::Ready),
            "{}: Ready exactly when the phase is",
            c.name
        );
        assert_eq!((status, reason.as_str()), (c.ready, c.reason), "{}", c.name);
        assert!(message.contains(c.message), "{}: {message}", c.name);
    }
}

#[test]
fn summarize_records_the_generation_but_keeps_the_latch_marker() {
    let mut s = ProxyStatus::default();
    mark_not_configured(&mut s, "kvm-x", t(0));
    summarize(&mut s, Some(3), t(0));
    assert_eq!(s.observed_generation, Some(3));
    let ready = condition::find(&s.conditions, READY).unwrap();
    assert_eq!(
        (ready.status, ready.observed_generation),
        (ConditionStatus::False, Some(3))
    );
    assert_eq!(
        condition::find(&s.conditions, PROVISIONED)
            .unwrap()
            .observed_generation,
        None,
        "an unconfigured provider must stay no latch"
    );
    assert!(!super::super::is_latched(&s, Some(3)));

    // Turning Ready moves the transition time once; a later pass at a new
    // generation updates the generation, not the time.
    mark_running(&mut s, "10.0.0.2", &report(true, "204"), t(5), Some(3));
    summarize(&mut s, Some(3), t(5));
    summarize(&mut s, Some(4), t(9));
    let ready = condition::find(&s.conditions, READY).unwrap();
    assert_eq!(
        (
            ready.status,
            ready.last_transition_time,
            ready.observed_generation
        ),
        (ConditionStatus::True, t(5), Some(4))
    );
    let healthy = condition::find(&s.conditions, HEALTHY).unwrap();
    assert_eq!(healthy.observed_generation, Some(4));
    assert_eq!(
        condition::find(&s.conditions, PROVISIONED)
            .unwrap()
            .observed_generation,
        Some(3),
        "Provisioned keeps the generation its builder set"
    );
    assert_eq!(s.observed_generation, Some(4));
}
