use super::super::tests::t;
use super::*;
use crate::api::ProxyPhase;
use crate::provider::InstanceState;

#[test]
fn status_builders() {
    let mut s = ProxyStatus::default();
    mark_creating(&mut s, t(0), Some(1));
    assert_eq!(s.phase, Some(ProxyPhase::Provisioning));
    mark_running(&mut s, "10.0.0.2", &Health::Unknown, t(1), Some(1));
    assert_eq!(
        (s.phase, s.ip.as_deref()),
        (Some(ProxyPhase::Running), Some("10.0.0.2"))
    );
    let c = condition::find(&s.conditions, PROVISIONED).unwrap();
    assert_eq!(
        (c.status, c.reason.as_str(), c.last_transition_time),
        (ConditionStatus::True, REASON_INSTANCE_RUNNING, t(1))
    );
    mark_running(&mut s, "10.0.0.2", &Health::Verdict(true), t(2), Some(1));
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

#[test]
fn health_folds_into_a_serving_status() {
    struct Case {
        name: &'static str,
        /// The Healthy condition before, if any.
        before: Option<bool>,
        /// A report (healthy?) or a bare verdict.
        report: Option<bool>,
        verdict: Option<bool>,
        phase: ProxyPhase,
        healthy: Option<(ConditionStatus, &'static str)>,
        latency: Option<i64>,
    }
    let cases = [
        Case {
            name: "a healthy report: Ready, ProbeSucceeded, latency",
            before: None,
            report: Some(true),
            verdict: None,
            phase: ProxyPhase::Ready,
            healthy: Some((ConditionStatus::True, REASON_PROBE_SUCCEEDED)),
            latency: Some(42),
        },
        Case {
            name: "a failing report beats a healthy past: Running, ProbeFailed",
            before: Some(true),
            report: Some(false),
            verdict: None,
            phase: ProxyPhase::Running,
            healthy: Some((ConditionStatus::False, REASON_PROBE_FAILED)),
            latency: Some(42),
        },
        Case {
            name: "nothing known, healthy before: kept Ready",
            before: Some(true),
            report: None,
            verdict: None,
            phase: ProxyPhase::Ready,
            healthy: Some((ConditionStatus::True, REASON_PROBE_SUCCEEDED)),
            latency: Some(7),
        },
        Case {
            name: "nothing known, unhealthy before: Running",
            before: Some(false),
            report: None,
            verdict: None,
            phase: ProxyPhase::Running,
            healthy: Some((ConditionStatus::False, REASON_PROBE_FAILED)),
            latency: Some(7),
        },
        Case {
            name: "nothing known, never probed: Running, no condition",
            before: None,
            report: None,
            verdict: None,
            phase: ProxyPhase::Running,
            healthy: None,
            latency: None,
        },
        Case {
            name: "a bare healthy verdict: Ready, no condition written",
            before: None,
            report: None,
            verdict: Some(true),
            phase: ProxyPhase::Ready,
            healthy: None,
            latency: None,
        },
    ];
    for c in cases {
        let mut s = ProxyStatus::default();
        if let Some(h) = c.before {
            let old = HealthReport {
                healthy: h,
                latency_ms: 7,
                probed_at: t(-5),
                message: "before".into(),
            };
            apply_health(&mut s, &Health::Report(old.clone()), t(-5));
        }
        let report = c.report.map(|h| HealthReport {
            healthy: h,
            latency_ms: 42,
            probed_at: t(0),
            message: "x".repeat(2000),
        });
        let probed = report.is_some();
        mark_external(&mut s, "px.example", &Health::of(report, c.verdict), t(1));
        assert_eq!(s.phase, Some(c.phase), "{}", c.name);
        let cond = condition::find(&s.conditions, HEALTHY);
        assert_eq!(
            cond.map(|c| (c.status, c.reason.as_str())),
            c.healthy,
            "{}",
            c.name
        );
        assert_eq!(s.latency_millis, c.latency, "{}: latency", c.name);
        if probed {
            let cond = cond.unwrap();
            assert_eq!(cond.message.len(), 1024, "{}: message bounded", c.name);
            assert_eq!(s.last_probe_time, Some(t(0)), "{}", c.name);
        }
    }
}

#[test]
fn a_new_instance_is_never_advertised_on_the_old_verdict() {
    let mut s = ProxyStatus::default();
    health_unknown(&mut s, t(0));
    assert!(s.conditions.is_empty(), "no condition is invented");
    let old = HealthReport {
        healthy: true,
        latency_ms: 1,
        probed_at: t(0),
        message: "ok".into(),
    };
    mark_running(
        &mut s,
        "10.0.0.2",
        &Health::Report(old.clone()),
        t(0),
        Some(1),
    );
    health_unknown(&mut s, t(1));
    let c = condition::find(&s.conditions, HEALTHY).unwrap();
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::Unknown, REASON_AWAITING_PROBE)
    );
}

#[test]
fn condition_messages_are_cut_to_the_crd_limit() {
    struct Case {
        name: &'static str,
        message: String,
        /// The length in characters after the cut.
        chars: usize,
        cut: bool,
    }
    let cases = [
        Case {
            name: "short: as is",
            message: "zone \"x\" is unknown".into(),
            chars: 19,
            cut: false,
        },
        Case {
            name: "exactly the limit: as is",
            message: "a".repeat(MESSAGE_MAX_CHARS),
            chars: MESSAGE_MAX_CHARS,
            cut: false,
        },
        Case {
            name: "one over: cut and marked",
            message: "a".repeat(MESSAGE_MAX_CHARS + 1),
            chars: MESSAGE_MAX_CHARS,
            cut: true,
        },
        Case {
            name: "multi-byte characters are counted, never split",
            message: "é".repeat(MESSAGE_MAX_CHARS * 2),
            chars: MESSAGE_MAX_CHARS,
            cut: true,
        },
    ];
    for c in cases {
        let got = truncate_message(&c.message);
        assert_eq!(got.chars().count(), c.chars, "{}", c.name);
        assert_eq!(got.ends_with(" [truncated]"), c.cut, "{}", c.name);
        // What reaches the Provisioned condition is cut the same way.
        let mut s = ProxyStatus::default();
        mark_quota(&mut s, &c.message, t(0), Some(1));
        let cond = condition::find(&s.conditions, PROVISIONED).unwrap();
        assert_eq!(cond.message, got, "{}: condition", c.name);
    }
    // The prefix of an unavailable provider is counted in the limit.
    let mut s = ProxyStatus::default();
    let long = "x".repeat(MESSAGE_MAX_CHARS);
    mark_unavailable(&mut s, &long, &Health::Unknown, t(0), Some(1));
    let cond = condition::find(&s.conditions, PROVISIONED).unwrap();
    assert_eq!(cond.message.chars().count(), MESSAGE_MAX_CHARS);
}

#[test]
fn an_unavailable_provider_keeps_a_serving_proxy_serving_by_its_health() {
    struct Case {
        name: &'static str,
        phase: Option<ProxyPhase>,
        ip: Option<&'static str>,
        health: Health,
        want: Option<ProxyPhase>,
    }
    let report = |healthy| {
        Health::Report(HealthReport {
            healthy,
            latency_ms: 3,
            probed_at: t(0),
            message: String::new(),
        })
    };
    let cases = [
        Case {
            name: "Ready, probes pass: Ready",
            phase: Some(ProxyPhase::Ready),
            ip: Some("10.0.0.1"),
            health: report(true),
            want: Some(ProxyPhase::Ready),
        },
        Case {
            name: "Ready, probes fail: Running (out of the pool), not Failed",
            phase: Some(ProxyPhase::Ready),
            ip: Some("10.0.0.1"),
            health: report(false),
            want: Some(ProxyPhase::Running),
        },
        Case {
            name: "Running, probes pass: Ready",
            phase: Some(ProxyPhase::Running),
            ip: Some("10.0.0.1"),
            health: report(true),
            want: Some(ProxyPhase::Ready),
        },
        Case {
            name: "Provisioning: kept",
            phase: Some(ProxyPhase::Provisioning),
            ip: None,
            health: report(true),
            want: Some(ProxyPhase::Provisioning),
        },
        Case {
            name: "new: no phase yet",
            phase: None,
            ip: None,
            health: Health::Unknown,
            want: None,
        },
        Case {
            name: "Failed before (provider not configured): waits as Provisioning",
            phase: Some(ProxyPhase::Failed),
            ip: None,
            health: Health::Unknown,
            want: Some(ProxyPhase::Provisioning),
        },
    ];
    for c in cases {
        let mut s = ProxyStatus {
            phase: c.phase,
            ip: c.ip.map(str::to_string),
            ..Default::default()
        };
        mark_unavailable(&mut s, "HTTP 401", &c.health, t(0), Some(2));
        assert_eq!(s.phase, c.want, "{}", c.name);
        let cond = condition::find(&s.conditions, PROVISIONED).unwrap();
        assert_eq!(
            (cond.status, cond.reason.as_str()),
            (ConditionStatus::Unknown, REASON_PROVIDER_UNAVAILABLE),
            "{}",
            c.name
        );
        assert_eq!(
            cond.message, "the provider cannot be observed: HTTP 401",
            "{}",
            c.name
        );
    }
}

#[test]
fn a_verdict_counts_only_for_the_host_it_probed() {
    struct Case {
        name: &'static str,
        probed: Option<&'static str>,
        host: Option<&'static str>,
        want_report: bool,
    }
    let cases = [
        Case {
            name: "probed through the address served now",
            probed: Some("10.0.0.2"),
            host: Some("10.0.0.2"),
            want_report: true,
        },
        Case {
            name: "probed through the replaced instance: none yet",
            probed: Some("10.0.0.2"),
            host: Some("10.0.0.3"),
            want_report: false,
        },
        Case {
            name: "a source that does not say where it probed",
            probed: None,
            host: Some("10.0.0.3"),
            want_report: true,
        },
        Case {
            name: "no address known to compare with",
            probed: Some("10.0.0.2"),
            host: None,
            want_report: true,
        },
    ];
    let report = HealthReport {
        healthy: true,
        latency_ms: 1,
        probed_at: t(0),
        message: "ok".into(),
    };
    for c in cases {
        let got = Health::at(Some(report.clone()), Some(true), c.probed, c.host);
        let want = if c.want_report {
            Health::Report(report.clone())
        } else {
            Health::Unknown
        };
        assert_eq!(got, want, "{}", c.name);
    }
}
