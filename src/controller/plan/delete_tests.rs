use chrono::{DateTime, Utc};

use super::super::tests::{inst, t};
use super::*;
use crate::provider::{ErrorClass, InstanceState};

#[test]
fn deletion_path_table() {
    let found = GetOutcome::Found(inst(InstanceState::Running, "1.2.3.4"));
    let perm = GetOutcome::Failed(ErrorClass::Permanent, "host retired".into());
    let quota = GetOutcome::Failed(ErrorClass::QuotaExceeded, "rate".into());
    let refused = GetOutcome::Failed(ErrorClass::Unavailable, "HTTP 401".into());
    let create_failed = GetOutcome::CreateFailed(ErrorClass::Permanent, "no such image".into());
    struct Case<'a> {
        name: &'static str,
        has_finalizer: bool,
        provider_id: Option<&'static str>,
        skip_cleanup: bool,
        configured: bool,
        get: Option<&'a GetOutcome>,
        delete_requested_at: Option<DateTime<Utc>>,
        want: DeleteStep,
    }
    let cases = vec![
        Case {
            name: "no finalizer: nothing",
            has_finalizer: false,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::Nothing,
        },
        Case {
            name: "nothing recorded: release",
            has_finalizer: true,
            provider_id: None,
            skip_cleanup: false,
            configured: true,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::Release {
                why: ReleaseReason::NothingRecorded,
            },
        },
        Case {
            name: "empty id: release",
            has_finalizer: true,
            provider_id: Some(""),
            skip_cleanup: false,
            configured: true,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::Release {
                why: ReleaseReason::NothingRecorded,
            },
        },
        Case {
            name: "skip-cleanup: release without calls",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: true,
            configured: true,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::Release {
                why: ReleaseReason::SkipCleanup,
            },
        },
        Case {
            name: "skip-cleanup beats an unconfigured provider",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: true,
            configured: false,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::Release {
                why: ReleaseReason::SkipCleanup,
            },
        },
        Case {
            name: "unconfigured provider: error",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: false,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::ProviderNotConfigured,
        },
        Case {
            name: "get first",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: None,
            delete_requested_at: None,
            want: DeleteStep::Get,
        },
        Case {
            name: "gone: release",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&GetOutcome::NotFound),
            delete_requested_at: None,
            want: DeleteStep::Release {
                why: ReleaseReason::InstanceGone,
            },
        },
        Case {
            name: "found: delete",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&found),
            delete_requested_at: None,
            want: DeleteStep::Delete,
        },
        Case {
            name: "found, delete asked 5s ago: wait",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&found),
            delete_requested_at: Some(t(-5)),
            want: DeleteStep::Wait,
        },
        Case {
            name: "found, delete asked 5m ago: delete again",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&found),
            delete_requested_at: Some(t(-300)),
            want: DeleteStep::Delete,
        },
        Case {
            name: "permanent get: delete anyway",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&perm),
            delete_requested_at: None,
            want: DeleteStep::DeleteAfterPermanentGet {
                get_error: "host retired".into(),
            },
        },
        Case {
            name: "quota get: by class",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&quota),
            delete_requested_at: None,
            want: DeleteStep::Failed {
                class: ErrorClass::QuotaExceeded,
                message: "rate".into(),
            },
        },
        Case {
            name: "unavailable get: no blind delete, retried by class",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&refused),
            delete_requested_at: None,
            want: DeleteStep::Failed {
                class: ErrorClass::Unavailable,
                message: "HTTP 401".into(),
            },
        },
        Case {
            name: "a failed asynchronous create: delete anyway, as a permanent get",
            has_finalizer: true,
            provider_id: Some("id"),
            skip_cleanup: false,
            configured: true,
            get: Some(&create_failed),
            delete_requested_at: None,
            want: DeleteStep::DeleteAfterPermanentGet {
                get_error: "no such image".into(),
            },
        },
    ];
    for c in cases {
        let input = DeleteInput {
            has_finalizer: c.has_finalizer,
            provider_id: c.provider_id,
            skip_cleanup: c.skip_cleanup,
            provider_configured: c.configured,
            get: c.get,
            delete_requested_at: c.delete_requested_at,
            now: t(0),
        };
        assert_eq!(next_delete_step(&input), c.want, "{}", c.name);
    }
}

#[test]
fn repeated_cleanup_failures_show_in_the_status_with_the_providers_words() {
    let mut status = ProxyStatus::default();
    for n in 1..CLEANUP_FAILED_AFTER {
        mark_cleanup_failed(&mut status, n, "HTTP 403: permission denied", t(0));
        assert!(
            condition::find(&status.conditions, DELETING).is_none(),
            "one failure ({n}) is often a blip"
        );
    }
    mark_cleanup_failed(
        &mut status,
        CLEANUP_FAILED_AFTER,
        "HTTP 403: permission denied",
        t(1),
    );
    let c = condition::find(&status.conditions, DELETING).expect("Deleting");
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::False, REASON_CLEANUP_FAILED)
    );
    assert!(
        c.message.ends_with(": HTTP 403: permission denied"),
        "{}",
        c.message
    );
    assert!(c.message.contains("skip-cleanup"), "says how to abandon it");
    let first = c.clone();
    mark_cleanup_failed(&mut status, 7, "HTTP 403: permission denied", t(9));
    assert_eq!(
        condition::find(&status.conditions, DELETING),
        Some(&first),
        "the same failure again changes nothing (no new Event)"
    );
}

#[test]
fn a_deleted_proxy_goes_through_its_retiring_then_its_surge_then_its_current_instance() {
    use crate::api::{RetiringStatus, SurgeStatus};
    let at = t;
    let mut st = ProxyStatus {
        provider_id: Some("cur".into()),
        retiring: Some(RetiringStatus {
            provider_id: "old".into(),
            since: at(0),
            ..RetiringStatus::default()
        }),
        surge: Some(SurgeStatus {
            serial: 2,
            started_at: at(0),
            provider_id: Some("new".into()),
            ..SurgeStatus::default()
        }),
        ..ProxyStatus::default()
    };
    assert_eq!(deletion_target(&st), (Target::Retiring, Some("old"), None));
    target_delete_requested(&mut st, Target::Retiring, at(5));
    assert_eq!(
        deletion_target(&st),
        (Target::Retiring, Some("old"), Some(at(5)))
    );
    forget_target(&mut st, Target::Retiring);
    assert_eq!(deletion_target(&st), (Target::Surge, Some("new"), None));
    target_delete_requested(&mut st, Target::Surge, at(6));
    assert_eq!(
        deletion_target(&st),
        (Target::Surge, Some("new"), Some(at(6)))
    );
    forget_target(&mut st, Target::Surge);
    assert_eq!(deletion_target(&st), (Target::Current, Some("cur"), None));
    target_delete_requested(&mut st, Target::Current, at(7));
    assert_eq!(st.delete_requested_at, Some(at(7)));
    // A surge decided but never created has no instance of its own to
    // delete here (one created before a crash is an orphan for GC).
    st.surge = Some(SurgeStatus::default());
    assert_eq!(deletion_target(&st).0, Target::Current);
}
