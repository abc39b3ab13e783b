//! Create hold: a Proxy whose create was refused with a slow retry (a
//! quota or rate limit, or a provider refusing the operator's credentials
//! or permissions) asks again only after that retry, however often it is
//! reconciled meanwhile. Its own status write (`QuotaExceeded`,
//! `ProviderUnavailable`), a create held by the provider's bucket
//! (`CreateThrottled`) and any watch event all start passes; without the
//! hold each would call create again, and Proxies alternating between
//! those reasons spent the provider's whole create budget on calls the API
//! refused (found by the gcp outage system test).
//! Pure: the shell keeps the holds in memory, by Proxy UID.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::{End, Failure};
use crate::provider::{ErrorClass, Op};

/// No create for a Proxy before `until`, while its spec stays at
/// `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateHold {
    /// The generation whose create was refused.
    pub generation: Option<i64>,
    /// When the create may go again.
    pub until: DateTime<Utc>,
}

/// Whether a create refused with `class` waits out its requeue: the
/// classes retried slowly (minutes), not by backoff, and not latched.
fn holds(class: ErrorClass) -> bool {
    match class {
        ErrorClass::QuotaExceeded | ErrorClass::Unavailable => true,
        ErrorClass::Permanent | ErrorClass::NotFound | ErrorClass::Transient => false,
    }
}

/// The hold a failed pass leaves at `now`, when it ended with `end` (its
/// requeue, jitter applied): only a create refused with a slowly retried
/// class holds, until that requeue comes.
pub fn hold_after(
    failure: &Failure<'_>,
    generation: Option<i64>,
    end: End,
    now: DateTime<Utc>,
) -> Option<CreateHold> {
    if failure.op != Op::Create || !holds(failure.class) {
        return None;
    }
    let End::RequeueAfter(retry) = end else {
        return None;
    };
    let until = now
        .checked_add_signed(TimeDelta::from_std(retry).unwrap_or(TimeDelta::MAX))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    Some(CreateHold { generation, until })
}

/// How much longer a create of the spec at `generation` waits at `now`;
/// `None` when it may go: no hold, the hold is over, or the spec changed
/// since (an edit may well be the fix).
pub fn waiting(
    hold: Option<CreateHold>,
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let hold = hold?;
    if hold.generation != generation {
        return None;
    }
    hold.until
        .signed_duration_since(now)
        .to_std()
        .ok()
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
#[path = "hold_tests.rs"]
mod tests;
