use super::super::status::{self, Health};
use super::super::tests::t;
use super::super::ReplaceCause;
use super::*;
use crate::api::health::HealthReport;
use crate::provider::InstanceState;

/// A status built by the real builders, step by step.
type Build = fn(&mut ProxyStatus);

fn report(healthy: bool, message: &str) -> Health {
    Health::Report(HealthReport {
        healthy,
        latency_ms: 12,
        probed_at: t(0),
        message: message.into(),
    })
}

fn nothing(_: &mut ProxyStatus) {}
fn cleanup_failing(s: &mut ProxyStatus) {
    ready(s);
    super::super::delete::mark_cleanup_failed(s, 5, "HTTP 403: permission denied", t(3));
}
fn surging(s: &mut ProxyStatus) {
    ready(s);
    super::super::surge::start(s, t(3));
}
fn took_over(s: &mut ProxyStatus) {
    surging(s);
    super::super::surge::created(s, ("px-abc-1".into(), None), "v1:x", 3128, t(4));
    super::super::surge::take_over(s, "10.0.0.8", t(5));
}
fn created(s: &mut ProxyStatus) {
    s.provider_id = Some("px-abc".into());
    status::mark_creating(s, t(0), Some(1));
}
fn running(s: &mut ProxyStatus) {
    created(s);
    status::mark_running(s, "10.0.0.7", &Health::Unknown, t(1), Some(1));
}
fn ready(s: &mut ProxyStatus) {
    created(s);
    status::mark_running(s, "10.0.0.7", &report(true, "ok"), t(1), Some(1));
}
fn unhealthy(s: &mut ProxyStatus) {
    ready(s);
    let failed = report(false, "connect to 10.0.0.7:3128 refused");
    status::mark_running(s, "10.0.0.7", &failed, t(2), Some(1));
}
fn replacing_spec(s: &mut ProxyStatus) {
    ready(s);
    status::mark_replacing(s, ReplaceCause::SpecChanged, true, t(3), Some(2));
    status::health_unknown(s, t(3));
}
fn replacing_vanished(s: &mut ProxyStatus) {
    ready(s);
    let why = ReplaceCause::Stopped(InstanceState::Terminated);
    status::mark_replacing(s, why, true, t(3), Some(1));
    status::health_unknown(s, t(3));
}
fn replace_asked(s: &mut ProxyStatus) {
    ready(s);
    s.replace_handled = Some("api client crawler-a at t".into());
}
fn timed_out(s: &mut ProxyStatus) {
    created(s);
    let why = ReplaceCause::StartupTimedOut {
        after: std::time::Duration::from_secs(900),
    };
    status::mark_replacing(s, why, true, t(900), Some(1));
}
fn timed_out_recreated(s: &mut ProxyStatus) {
    timed_out(s);
    status::clear_instance(s);
    s.provider_id = Some("px-def".into());
    status::mark_creating(s, t(901), Some(1));
}
fn recreated(s: &mut ProxyStatus) {
    replacing_spec(s);
    status::clear_instance(s);
    s.provider_id = Some("px-def".into());
    status::mark_creating(s, t(4), Some(2));
}
fn recreated_running(s: &mut ProxyStatus) {
    recreated(s);
    status::mark_running(s, "10.0.0.8", &Health::Unknown, t(5), Some(2));
}
fn vanished_and_recreated(s: &mut ProxyStatus) {
    ready(s);
    status::clear_instance(s);
    s.provider_id = Some("px-new".into());
    status::mark_creating(s, t(4), Some(1));
}
fn quota(s: &mut ProxyStatus) {
    status::mark_quota(s, "quota CPUS exceeded in us-east1", t(0), Some(1));
}
fn cloud_init(s: &mut ProxyStatus) {
    let msg = "cloud-init Secret \"boot\" is not labelled for the operator";
    status::mark_cloud_init_error(s, msg, t(0), Some(1));
}
fn permanent(s: &mut ProxyStatus) {
    status::mark_permanent(s, "machine type n9-huge does not exist", t(0), Some(1));
}
fn unavailable(s: &mut ProxyStatus) {
    ready(s);
    let msg = "credentials refused";
    status::mark_unavailable(s, msg, &report(true, "ok"), t(5), Some(1));
}

#[test]
fn a_pass_records_an_event_per_transition_only() {
    struct Case {
        name: &'static str,
        before: Build,
        after: Build,
        /// (reason, Warning?, words the note contains)
        want: Vec<(&'static str, bool, &'static str)>,
    }
    let cases = [
        Case {
            name: "a create was issued",
            before: nothing,
            after: created,
            want: vec![(CREATING, false, "px-abc")],
        },
        Case {
            name: "still booting: nothing new",
            before: created,
            after: created,
            want: vec![],
        },
        Case {
            name: "running, no verdict yet",
            before: created,
            after: running,
            want: vec![(RUNNING, false, "10.0.0.7")],
        },
        Case {
            name: "running and healthy in the same pass: Running then Ready",
            before: created,
            after: ready,
            want: vec![(RUNNING, false, "px-abc"), (READY, false, "10.0.0.7")],
        },
        Case {
            name: "the first verdict makes it Ready",
            before: running,
            after: ready,
            want: vec![(READY, false, "Ready")],
        },
        Case {
            name: "Ready and resynced: nothing",
            before: ready,
            after: ready,
            want: vec![],
        },
        Case {
            name: "probes start failing",
            before: ready,
            after: unhealthy,
            want: vec![(UNHEALTHY, true, "refused")],
        },
        Case {
            name: "still failing: nothing new",
            before: unhealthy,
            after: unhealthy,
            want: vec![],
        },
        Case {
            name: "healthy again",
            before: unhealthy,
            after: ready,
            want: vec![(READY, false, "10.0.0.7")],
        },
        Case {
            name: "spec changed: replacing, with the cause",
            before: ready,
            after: replacing_spec,
            want: vec![(REPLACING, false, "spec changed")],
        },
        Case {
            name: "instance vanished: replacing, with its state",
            before: ready,
            after: replacing_vanished,
            want: vec![(REPLACING, false, "Terminated")],
        },
        Case {
            name: "the instance vanished and was re-created in one pass",
            before: ready,
            after: vanished_and_recreated,
            want: vec![
                (REPLACING, false, "px-abc vanished"),
                (CREATING, false, "px-new"),
            ],
        },
        Case {
            name: "a replace asked for: the request, naming the client",
            before: ready,
            after: replace_asked,
            want: vec![(REPLACE_REQUESTED, false, "replace=api client crawler-a")],
        },
        Case {
            name: "the same request again: nothing new",
            before: replace_asked,
            after: replace_asked,
            want: vec![],
        },
        Case {
            name: "not running by its startup timeout: a Warning naming the timeout",
            before: created,
            after: timed_out,
            want: vec![(STARTUP_TIMED_OUT, true, "15m after its create")],
        },
        Case {
            name: "its replacement's create, and no vanished note for the old one",
            before: timed_out,
            after: timed_out_recreated,
            want: vec![(CREATING, false, "px-def")],
        },
        Case {
            name: "waiting for the old instance to go: nothing new",
            before: replacing_spec,
            after: replacing_spec,
            want: vec![],
        },
        Case {
            name: "the replacement's create",
            before: replacing_spec,
            after: recreated,
            want: vec![(CREATING, false, "px-def")],
        },
        Case {
            name: "the replacement runs",
            before: recreated,
            after: recreated_running,
            want: vec![(RUNNING, false, "px-def")],
        },
        Case {
            name: "a surge replacement starts",
            before: ready,
            after: surging,
            want: vec![(SURGING, false, "instance px-abc serves")],
        },
        Case {
            name: "it takes over: Replaced, not a vanished instance",
            before: surging,
            after: took_over,
            want: vec![(
                REPLACED,
                false,
                "px-abc-1 at 10.0.0.8 took over from px-abc",
            )],
        },
        Case {
            name: "retiring: nothing new",
            before: took_over,
            after: took_over,
            want: vec![],
        },
        Case {
            name: "quota refused the create",
            before: nothing,
            after: quota,
            want: vec![(QUOTA_EXCEEDED, true, "CPUS")],
        },
        Case {
            name: "quota again with the same words: nothing new",
            before: quota,
            after: quota,
            want: vec![],
        },
        Case {
            name: "cloud-init unreadable",
            before: nothing,
            after: cloud_init,
            want: vec![(CLOUD_INIT_ERROR, true, "not labelled")],
        },
        Case {
            name: "a permanent create error latches: Failed",
            before: nothing,
            after: permanent,
            want: vec![(FAILED, true, "n9-huge")],
        },
        Case {
            name: "the provider stops answering a serving Proxy",
            before: ready,
            after: unavailable,
            want: vec![(PROVIDER_UNAVAILABLE, true, "credentials")],
        },
        Case {
            name: "a deleted Proxy's cleanup keeps failing: one Warning with the provider's words",
            before: ready,
            after: cleanup_failing,
            want: vec![(CLEANUP_FAILED, true, "HTTP 403: permission denied")],
        },
        Case {
            name: "still failing the same way: nothing new",
            before: cleanup_failing,
            after: cleanup_failing,
            want: vec![],
        },
    ];
    for c in cases {
        let (mut before, mut after) = (ProxyStatus::default(), ProxyStatus::default());
        (c.before)(&mut before);
        (c.after)(&mut after);
        let got = pass_notes(&before, &after);
        let got: Vec<_> = got
            .iter()
            .map(|n| (n.reason, n.severity == Severity::Warning, n.text.clone()))
            .collect();
        assert_eq!(got.len(), c.want.len(), "{}: {got:?}", c.name);
        for ((reason, warning, text), (want_reason, want_warning, words)) in got.iter().zip(&c.want)
        {
            assert_eq!((reason, warning), (want_reason, want_warning), "{}", c.name);
            assert!(text.contains(words), "{}: {text:?} lacks {words:?}", c.name);
        }
    }
}

#[test]
fn a_released_finalizer_records_what_became_of_the_instance() {
    struct Case {
        name: &'static str,
        why: ReleaseReason,
        id: Option<&'static str>,
        want: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "instance gone: Deleted",
            why: ReleaseReason::InstanceGone,
            id: Some("px-abc"),
            want: Some(DELETED),
        },
        Case {
            name: "skip-cleanup: the instance stays",
            why: ReleaseReason::SkipCleanup,
            id: Some("px-abc"),
            want: Some(CLEANUP_SKIPPED),
        },
        Case {
            name: "never had an instance: nothing to say",
            why: ReleaseReason::NothingRecorded,
            id: None,
            want: None,
        },
        Case {
            name: "an empty id is no instance",
            why: ReleaseReason::InstanceGone,
            id: Some(""),
            want: None,
        },
    ];
    for c in cases {
        let got = released_note(c.why, c.id);
        assert_eq!(got.as_ref().map(|n| n.reason), c.want, "{}", c.name);
        if let Some(n) = got {
            assert!(n.text.contains("px-abc"), "{}: {}", c.name, n.text);
        }
    }
}
