use std::time::Duration;

use super::*;
use crate::provider::{ErrorClass, Op};

fn failure() -> ProviderError {
    ProviderError::new(ErrorClass::Permanent, Op::Create, "kvm", "id", "boom")
}

async fn finish(rx: &mut watch::Receiver<JobState>) -> JobState {
    *rx.wait_for(|s| *s != JobState::Running).await.unwrap()
}

#[tokio::test]
async fn a_done_job_is_reported_once() {
    let jobs = Jobs::default();
    let mut rx = jobs.start("d", "u", "i", || async { Ok(()) });
    assert_eq!(finish(&mut rx).await, JobState::Done);
    assert!(matches!(jobs.take_finished("d"), Some(Outcome::Done)));
    assert!(jobs.take_finished("d").is_none());
    assert!(jobs.provisioning("d").is_none());
}

#[tokio::test]
async fn a_failure_is_reported_once_with_its_error() {
    let jobs = Jobs::default();
    let mut rx = jobs.start("d", "u", "i", || async { Err(failure()) });
    assert_eq!(finish(&mut rx).await, JobState::Failed);
    match jobs.take_finished("d") {
        Some(Outcome::Failed(e)) => assert!(e.is(ErrorClass::Permanent)),
        other => panic!("{other:?}"),
    }
    assert!(jobs.take_finished("d").is_none());
}

#[tokio::test]
async fn a_running_job_is_provisioning_and_not_started_twice() {
    let jobs = Jobs::default();
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let mut rx = jobs.start("d", "u", "i", || async move {
        let _ = wait.await;
        Ok(())
    });
    let mut second_ran = false;
    let _ = jobs.start("d", "other", "other", || {
        second_ran = true;
        async { Err(failure()) }
    });
    assert!(!second_ran);
    assert!(matches!(jobs.take_finished("d"), Some(Outcome::Running)));
    let p = jobs.provisioning("d").unwrap();
    assert_eq!((p.uid.as_str(), p.installation.as_str()), ("u", "i"));
    go.send(()).unwrap();
    assert_eq!(finish(&mut rx).await, JobState::Done);
}

#[tokio::test]
async fn cancel_stops_the_job() {
    let jobs = Jobs::default();
    let mut rx = jobs.start("d", "u", "i", || async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    });
    assert!(jobs.cancel("d").await);
    assert!(!jobs.cancel("d").await);
    assert!(jobs.take_finished("d").is_none());
    // The sender went with the aborted task.
    assert!(rx.wait_for(|s| *s != JobState::Running).await.is_err());
}

#[tokio::test]
async fn forget_drops_the_record_only() {
    let jobs = Jobs::default();
    let mut rx = jobs.start("d", "u", "i", || async { Ok(()) });
    jobs.forget("d");
    assert!(jobs.take_finished("d").is_none());
    assert_eq!(finish(&mut rx).await, JobState::Done);
}
