//! The circuit breaker as a user sees it, for the breaker system tests of
//! every provider: the ProviderHealth `Replacing` condition and the Events
//! recorded on the ProviderHealth (cluster-scoped: they are in `default`).

use std::time::Duration;

use egress_proxies_operator::api::ProviderHealth;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::Api;

use super::eventually;

/// `provider`'s ProviderHealth `Replacing` condition: (status, reason,
/// message).
pub async fn replacing(
    ph: &Api<ProviderHealth>,
    provider: &str,
) -> Option<(String, String, String)> {
    let obj = ph.get_opt(provider).await.ok()??;
    let c = obj
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Replacing")?;
    Some((c.status.as_str().to_string(), c.reason, c.message))
}

/// Waits up to `secs` for `provider`'s Replacing condition to read
/// `status`.
pub async fn until_replacing(
    ph: &Api<ProviderHealth>,
    provider: &str,
    status: &str,
    what: &str,
    secs: u64,
) -> (String, String, String) {
    eventually(what, Duration::from_secs(secs), || async {
        replacing(ph, provider).await.filter(|r| r.0 == status)
    })
    .await
}

/// Waits up to 30 s for an Event of `reason` on `provider`'s
/// ProviderHealth; returns the notes.
pub async fn until_event(client: &kube::Client, provider: &str, reason: &str) -> Vec<String> {
    eventually(
        &format!("Event {reason}"),
        Duration::from_secs(30),
        || async {
            let e = events(client, provider, reason).await;
            (!e.is_empty()).then_some(e)
        },
    )
    .await
}

/// Events of `reason` recorded on `provider`'s ProviderHealth, with their
/// notes.
pub async fn events(client: &kube::Client, provider: &str, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = api.list(&ListParams::default()).await.unwrap().items;
    list.into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("ProviderHealth") && r.name.as_deref() == Some(provider)
            }) && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The `proxy_operator_provider_circuit_open` gauge of `provider` on the
/// operator's metrics endpoint.
pub async fn gauge(metrics: std::net::SocketAddr, provider: &str) -> Option<f64> {
    let series = format!("proxy_operator_provider_circuit_open{{provider=\"{provider}\"}}");
    super::leader::scraped(metrics, &series).await
}

/// Asserts that an open breaker's message names the share it judged:
/// "`lost` of the `seen` proxies", more than half lost, at most `failed`
/// lost, and `seen` the fleet or one short of it: the view is refreshed
/// once a second, so a Proxy that turned Ready just before the outage may
/// not be counted yet.
pub fn assert_names_share(message: &str, failed: usize, fleet: usize) {
    let (lost, seen) = share_of(message)
        .unwrap_or_else(|| panic!("the message says how many were lost: {message}"));
    assert!(
        seen <= fleet && seen + 1 >= fleet,
        "{seen} seen Ready, the fleet is {fleet}: {message}"
    );
    assert!(
        lost * 2 > seen && lost <= failed,
        "{lost} lost of {seen}, {failed} failed: {message}"
    );
}

/// The numbers of "… N of the M proxies …".
fn share_of(message: &str) -> Option<(usize, usize)> {
    let (before, after) = message.split_once(" of the ")?;
    let lost = before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let seen = after.split(' ').next()?.parse().ok()?;
    Some((lost, seen))
}

#[test]
fn the_share_is_read_from_the_message() {
    let open = "the circuit breaker is open since 2026-12-03T10:04:24Z: 3 of the 4 proxies Ready within the last 10m were lost (unhealthy or gone), more than 50%";
    assert_eq!(share_of(open), Some((3, 4)));
    assert_eq!(share_of("no share here"), None);
}
