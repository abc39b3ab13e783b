//! What the API calls out to, and keeps beside its state: the operator's
//! [`Replacer`], a gateway's [`GatewaySessions`], and each client's replace
//! budget. Traits and plain values only, so the state that holds them
//! depends on no route.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lease::ProxyKey;

/// Replaces one client may ask for within [`REPLACE_WINDOW`].
pub const REPLACES_PER_WINDOW: usize = 10;
/// The window of the per-client replace limit.
pub const REPLACE_WINDOW: Duration = Duration::from_secs(60);
/// What a replace asks of the operator; the API itself only knows leases.
#[async_trait::async_trait]
pub trait Replacer: Send + Sync {
    /// Why `provider` replaces nothing now (its circuit breaker is open),
    /// in words for the crawler; `None` when it may.
    fn held(&self, provider: &str) -> Option<String>;
    /// Asks for a new instance for the proxy `key`, `value` naming who
    /// asked (the annotation's value); the error in plain words.
    async fn request(&self, key: &ProxyKey, value: &str) -> Result<(), String>;
}

/// Each client's replaces within the last [`REPLACE_WINDOW`].
#[derive(Debug, Default)]
pub struct ReplaceLimits {
    by_client: BTreeMap<Arc<str>, VecDeque<Instant>>,
}

impl ReplaceLimits {
    /// Takes one of `client`'s replaces at `now`, or says how long until
    /// one is free.
    pub fn take(&mut self, client: &Arc<str>, now: Instant) -> Result<(), Duration> {
        // Forget clients whose window is over, so the map stays as small
        // as the set of clients replacing right now.
        self.by_client.retain(|_, times| {
            while times
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= REPLACE_WINDOW)
            {
                times.pop_front();
            }
            !times.is_empty()
        });
        let times = self.by_client.entry(client.clone()).or_default();
        if times.len() >= REPLACES_PER_WINDOW {
            let oldest = times.front().copied().unwrap_or(now);
            return Err(REPLACE_WINDOW.saturating_sub(now.saturating_duration_since(oldest)));
        }
        times.push_back(now);
        Ok(())
    }
}

/// What a gateway knows of its sessions.
pub trait GatewaySessions: Send + Sync {
    /// The upstream `client`'s session `id` last used, while remembered;
    /// else, when `asked` gives the session's username (and the site), the
    /// upstream its next connection would get here; or why the username
    /// does not do (a sentence).
    fn upstream_of(
        &self,
        client: &Arc<str>,
        id: &str,
        asked: (Option<&str>, Option<&str>),
    ) -> Result<Option<ProxyKey>, String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_ten_replaces_a_minute_and_others_are_not_held() {
        let mut limits = ReplaceLimits::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(limits.take(&a, t0 + Duration::from_secs(i)), Ok(()), "{i}");
        }
        assert_eq!(
            limits.take(&a, t0 + Duration::from_secs(20)),
            Err(Duration::from_secs(40)),
            "the eleventh waits for the first to leave the window"
        );
        assert_eq!(limits.take(&b, t0 + Duration::from_secs(20)), Ok(()));
        assert_eq!(limits.take(&a, t0 + Duration::from_secs(60)), Ok(()));
        assert_eq!(
            limits.take(&a, t0 + Duration::from_secs(60)),
            Err(Duration::from_secs(1))
        );
        let later = t0 + Duration::from_secs(600);
        assert_eq!(limits.take(&a, later), Ok(()));
        assert_eq!(limits.by_client.len(), 1, "b's window is over: forgotten");
    }
}
