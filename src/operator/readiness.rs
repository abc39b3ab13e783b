//! What `/readyz` says beside `ok` while the replica serves in a degraded
//! way, kept current from the parts that know.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::replica::members::Replicas;

/// Keeps `/readyz` saying whether this replica's copy of the leader's
/// lease table is stale (`replica::copy_age`), once a second until
/// `stop`. A stale copy never makes the replica unready: it still serves.
pub async fn tell_copy_age(
    replicas: Arc<Replicas>,
    ready: crate::http::Readiness,
    stop: impl Future<Output = ()>,
) {
    use crate::replica::copy_age;
    tokio::pin!(stop);
    let (mut said, mut warned) = (None, false);
    let started = std::time::Instant::now();
    loop {
        let state = replicas.copy().at(std::time::Instant::now());
        // No copy yet is news only once a first answer is overdue (a
        // replica about to lead has none either).
        let starting = started.elapsed() <= copy_age::COPY_STALE_AFTER;
        let detail = match state {
            copy_age::CopyState::None if starting => None,
            _ => copy_age::detail(state),
        };
        // Logged when a copy ages past its bound and when it is current
        // again; no copy before a first answer is only a detail.
        let aged = matches!(state, copy_age::CopyState::Aged(_)) && detail.is_some();
        match (&detail, aged, warned) {
            (Some(d), true, false) => warn!("{d}"),
            (None, _, true) => info!("The copy of the leader's lease table is current again"),
            _ => {}
        }
        warned = aged || (warned && detail.is_some());
        // Said again only when it changes (its age in whole seconds).
        if detail != said {
            ready.set_detail_of("lease copy", detail.clone());
            said = detail;
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
