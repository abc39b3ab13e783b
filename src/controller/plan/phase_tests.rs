use super::*;
use crate::api::condition::Condition;
use crate::api::health::HealthReport;
use chrono::{TimeZone, Utc};

#[test]
fn phase_table() {
    struct Case {
        name: &'static str,
        stage: Stage,
        previous: Option<ProxyPhase>,
        want: Option<ProxyPhase>,
    }
    use ProxyPhase::{Failed, Provisioning, Ready, Running};
    let cases = [
        Case {
            name: "provisioning, whatever it was",
            stage: Stage::Provisioning,
            previous: Some(Ready),
            want: Some(Provisioning),
        },
        Case {
            name: "serving and ready",
            stage: Stage::Serving { ready: true },
            previous: Some(Provisioning),
            want: Some(Ready),
        },
        Case {
            name: "serving, not ready",
            stage: Stage::Serving { ready: false },
            previous: Some(Ready),
            want: Some(Running),
        },
        Case {
            name: "failed",
            stage: Stage::Failed,
            previous: Some(Running),
            want: Some(Failed),
        },
        Case {
            name: "awaiting cloud-init keeps the phase",
            stage: Stage::AwaitingCloudInit,
            previous: Some(Ready),
            want: Some(Ready),
        },
        Case {
            name: "awaiting cloud-init with no phase yet: Provisioning",
            stage: Stage::AwaitingCloudInit,
            previous: None,
            want: Some(Provisioning),
        },
        Case {
            name: "retrying keeps the phase",
            stage: Stage::Retrying,
            previous: Some(Running),
            want: Some(Running),
        },
        Case {
            name: "retrying with no phase yet: none",
            stage: Stage::Retrying,
            previous: None,
            want: None,
        },
    ];
    for c in cases {
        assert_eq!(phase(c.stage, c.previous), c.want, "{}", c.name);
    }
}

#[test]
fn ready_table() {
    struct Case {
        name: &'static str,
        /// The Healthy condition's status before, if any.
        before: Option<ConditionStatus>,
        /// A report's verdict, or a bare verdict (`Verdict`), or nothing.
        report: Option<bool>,
        verdict: Option<bool>,
        want: bool,
    }
    let cases = [
        Case {
            name: "a healthy report",
            before: None,
            report: Some(true),
            verdict: None,
            want: true,
        },
        Case {
            name: "a failing report beats a healthy condition",
            before: Some(ConditionStatus::True),
            report: Some(false),
            verdict: None,
            want: false,
        },
        Case {
            name: "no report: a healthy condition is kept",
            before: Some(ConditionStatus::True),
            report: None,
            verdict: None,
            want: true,
        },
        Case {
            name: "no report, condition unknown",
            before: Some(ConditionStatus::Unknown),
            report: None,
            verdict: None,
            want: false,
        },
        Case {
            name: "nothing at all",
            before: None,
            report: None,
            verdict: None,
            want: false,
        },
        Case {
            name: "a bare healthy verdict",
            before: None,
            report: None,
            verdict: Some(true),
            want: true,
        },
        Case {
            name: "a bare failing verdict keeps a healthy condition",
            before: Some(ConditionStatus::True),
            report: None,
            verdict: Some(false),
            want: true,
        },
    ];
    let at = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
    for c in cases {
        let mut s = ProxyStatus::default();
        if let Some(st) = c.before {
            s.conditions
                .push(Condition::new(HEALTHY, st, "Any", "", at));
        }
        let report = c.report.map(|h| HealthReport {
            healthy: h,
            latency_ms: 1,
            probed_at: at,
            message: String::new(),
        });
        assert_eq!(
            ready(&Health::of(report, c.verdict), &s),
            c.want,
            "{}",
            c.name
        );
    }
}
