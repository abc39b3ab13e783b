use super::*;
use crate::fleet::BreakerPolicy;

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("a valid timestamp")
}

fn report(open_since: Option<i64>, lost: usize, seen: usize) -> Report {
    Report {
        open_since: open_since.map(at),
        lost,
        seen,
        policy: BreakerPolicy::default(),
    }
}

#[test]
fn replacing_condition_table() {
    struct Case {
        name: &'static str,
        before: Option<Report>,
        now: Report,
        want: (&'static str, &'static str, i64),
        message: &'static str,
    }
    let cases = [
        Case {
            name: "closed from the start: True since now",
            before: None,
            now: report(None, 0, 5),
            want: ("True", "CircuitClosed", 100),
            message: "the circuit breaker is closed: 0 of the 5 proxies Ready within the last 5m were lost (unhealthy or gone); it opens above 50% with at least 3 Ready",
        },
        Case {
            name: "open: False since it opened, with the share and the time",
            before: Some(report(None, 0, 5)),
            now: report(Some(40), 4, 5),
            want: ("False", "CircuitOpen", 40),
            message: "the circuit breaker is open since 2027-01-15T08:00:40Z: 4 of the 5 proxies Ready within the last 5m were lost (unhealthy or gone), more than 50%; not replacing or recycling this provider's proxies until the share falls back or the crawl.example.com/reset-circuit-breaker annotation resets it",
        },
        Case {
            name: "still open with fewer lost: the transition time stays",
            before: Some(report(Some(40), 4, 5)),
            now: report(Some(40), 3, 5),
            want: ("False", "CircuitOpen", 40),
            message: "the circuit breaker is open since 2027-01-15T08:00:40Z: 3 of the 5 proxies Ready within the last 5m were lost (unhealthy or gone), more than 50%; not replacing or recycling this provider's proxies until the share falls back or the crawl.example.com/reset-circuit-breaker annotation resets it",
        },
        Case {
            name: "closed again: True since now",
            before: Some(report(Some(40), 4, 5)),
            now: report(None, 1, 5),
            want: ("True", "CircuitClosed", 100),
            message: "the circuit breaker is closed: 1 of the 5 proxies Ready within the last 5m were lost (unhealthy or gone); it opens above 50% with at least 3 Ready",
        },
        Case {
            name: "still closed: the transition time stays",
            before: Some(report(None, 0, 0)),
            now: report(None, 1, 5),
            want: ("True", "CircuitClosed", 10),
            message: "the circuit breaker is closed: 1 of the 5 proxies Ready within the last 5m were lost (unhealthy or gone); it opens above 50% with at least 3 Ready",
        },
    ];
    for c in cases {
        let ready = Condition::new("Ready", ConditionStatus::True, "AllTargetsReady", "", at(1));
        let mut conditions = vec![ready.clone()];
        if let Some(b) = &c.before {
            conditions = with_replacing(conditions, b, at(10));
        }
        let got = with_replacing(conditions, &c.now, at(100));
        assert_eq!(got.len(), 2, "{}: Ready and Replacing", c.name);
        assert_eq!(got[0], ready, "{}: Ready untouched", c.name);
        let r = &got[1];
        assert_eq!(
            (r.status.as_str(), r.reason.as_str(), r.last_transition_time),
            (c.want.0, c.want.1, at(c.want.2)),
            "{}",
            c.name
        );
        assert_eq!(r.message, c.message, "{}", c.name);
    }
}

#[test]
fn transition_notes_table() {
    struct Case {
        name: &'static str,
        transition: Transition,
        report: Report,
        want: (Severity, &'static str, &'static str),
        text: &'static str,
    }
    let cases = [
        Case {
            name: "opened: a Warning with the counts",
            transition: Transition::Opened { lost: 4, seen: 5 },
            report: report(Some(40), 4, 5),
            want: (Severity::Warning, "CircuitOpen", "HoldReplacing"),
            text: "4 of the 5 proxies of provider gcp-eu Ready within the last 5m were lost at once, more than 50%: the circuit breaker opened; not replacing or recycling them until it closes",
        },
        Case {
            name: "closed: Normal with the share now",
            transition: Transition::Closed,
            report: report(None, 1, 5),
            want: (Severity::Normal, "CircuitClosed", "ResumeReplacing"),
            text: "the circuit breaker of provider gcp-eu closed: 1 of 5 proxies lost, 50% or less; replacing and recycling resume",
        },
        Case {
            name: "reset: Normal naming the annotation",
            transition: Transition::Reset,
            report: report(None, 0, 1),
            want: (Severity::Normal, "CircuitReset", "ResumeReplacing"),
            text: "the circuit breaker of provider gcp-eu was reset with the crawl.example.com/reset-circuit-breaker annotation: losses before now no longer count; replacing and recycling resume",
        },
    ];
    for c in cases {
        let n = transition_note("gcp-eu", c.transition, &c.report);
        assert_eq!((n.severity, n.reason, n.action), c.want, "{}", c.name);
        assert_eq!(n.text, c.text, "{}", c.name);
    }
}
