//! Acquires that name a ProxyPool (`"filters": {"pool": ...}`): each is
//! counted as the pool's demand (`lease::demand`), and a refused one is
//! answered as the pool controller asked: `503 pool_scaling_up` while the
//! pool comes back from zero, a short Retry-After while it grows.

use std::time::Instant;

use axum::http::StatusCode;

use super::error::ApiError;
use super::model::Filter;
use super::state::ApiState;
use crate::lease::demand::Answer;
use crate::lease::{AcquireError, Candidates};

/// Counts `client`'s acquire naming a pool as its demand (a refusal for
/// want of proxies, `refusal`, as unmet demand when a new Proxy of the
/// pool would match `filter`); how a refusal is answered.
pub(super) fn asked(
    s: &ApiState,
    filter: &Filter,
    client: &str,
    refusal: Option<&AcquireError>,
) -> Answer {
    let f = filter.filters();
    let Some(pool) = f.pool.as_deref() else {
        return Answer::Plain;
    };
    let short = matches!(
        refusal,
        Some(AcquireError::NoProxy | AcquireError::NoCapacity { .. })
    );
    s.leases.demand().asked(
        (f.namespace.as_deref(), pool),
        client,
        short,
        |shape| filter.could_match(shape),
        Instant::now(),
    )
}

/// The answer to an acquire the store refused, the pool it names having
/// its say.
pub(super) fn refused(
    s: &ApiState,
    filter: &Filter,
    members: &dyn Candidates,
    client: &str,
    e: AcquireError,
) -> ApiError {
    match asked(s, filter, client, Some(&e)) {
        Answer::Waking(wait) => {
            s.metrics.lease_event("refused", 1);
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "pool_scaling_up",
                "the pool is scaled to zero or coming back from it: it grows for this acquire; ask again after Retry-After",
            )
            .retry_after(wait)
        }
        Answer::Growing(cap) => plain(s, members, client, e).retry_within(cap),
        Answer::Plain => plain(s, members, client, e),
    }
}

/// The answer to an acquire the store refused, with when to ask again.
pub(super) fn plain(
    s: &ApiState,
    members: &dyn Candidates,
    client: &str,
    e: AcquireError,
) -> ApiError {
    s.metrics.lease_event("refused", 1);
    let (status, code) = status_of(&e);
    let wait = s.leases.retry_after_among(members, client, &e);
    ApiError::new(status, code, e.to_string()).retry_after(wait)
}

/// The status and code of a refusal: `409` when the fleet said no to
/// this ask, `503` when the leader cannot grant anything now.
fn status_of(e: &AcquireError) -> (StatusCode, &'static str) {
    match e {
        AcquireError::NoProxy => (StatusCode::CONFLICT, "no_proxy"),
        AcquireError::NoCapacity { .. } => (StatusCode::CONFLICT, "no_capacity"),
        AcquireError::ClientLimit { .. } => (StatusCode::CONFLICT, "client_limit"),
        AcquireError::Recovering { .. } => (StatusCode::SERVICE_UNAVAILABLE, "recovering"),
        AcquireError::TableFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, "table_full"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_is_the_leaders_503_and_says_so_in_plain_words() {
        let full = AcquireError::TableFull { max: 400_000 };
        assert_eq!(
            status_of(&full),
            (StatusCode::SERVICE_UNAVAILABLE, "table_full")
        );
        assert_eq!(
            full.to_string(),
            "the lease table holds 400000 live and released leases, the most it keeps; retry once some end"
        );
        let busy = AcquireError::NoCapacity {
            matching: 1,
            at_capacity: 1,
            cooling: 0,
        };
        assert_eq!(status_of(&busy), (StatusCode::CONFLICT, "no_capacity"));
    }
}
