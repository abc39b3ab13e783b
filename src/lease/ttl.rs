//! The TTL a client may ask for.

use std::time::Duration;

/// Why a TTL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    /// Zero or negative.
    #[error("ttlSeconds must be positive, got {0}")]
    NotPositive(i64),
    /// Above `--max-lease-ttl`.
    #[error("ttlSeconds must be at most {max} (the maximum lease TTL), got {got}")]
    TooLong {
        /// The request.
        got: i64,
        /// The bound in seconds.
        max: u64,
    },
}

/// TTL rule: absent → `default`; must be 1..=`max` seconds.
pub fn validate_ttl(
    seconds: Option<i64>,
    default: Duration,
    max: Duration,
) -> Result<Duration, TtlError> {
    let Some(s) = seconds else {
        return Ok(default);
    };
    if s <= 0 {
        return Err(TtlError::NotPositive(s));
    }
    let max_s = max.as_secs();
    if u64::try_from(s).map_or(true, |v| v > max_s) {
        return Err(TtlError::TooLong { got: s, max: max_s });
    }
    Ok(Duration::from_secs(s.unsigned_abs()))
}
