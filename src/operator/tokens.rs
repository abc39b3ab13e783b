//! The discovery API's named tokens: `DISCOVERY_TOKEN` (client `default`)
//! and one file per client in `--discovery-tokens-dir` (a Secret mounted
//! as a volume: each key a file), both read once at startup; and the
//! Secret `--discovery-tokens-secret`, one key per client, watched through
//! the API server so an edit is in force within seconds without a restart.
//! A content that does not pass [`check`] is refused (logged with the key
//! and the reason, counted) and the last good set stays. Pure but for
//! reading the directory and [`watch_secret`].

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tracing::{info, info_span, warn, Instrument};

use crate::discovery::metrics::DiscoveryMetrics;
use crate::discovery::{TokenSet, DEFAULT_CLIENT};

/// Whether `name` may name a client: 1-63 of `[a-z0-9-]`.
fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Checks (client, token) pairs: names valid and distinct, tokens
/// non-empty and distinct. The message never shows a token.
pub fn check(pairs: &[(String, String)]) -> Result<(), String> {
    for (i, (name, token)) in pairs.iter().enumerate() {
        if !valid_name(name) {
            return Err(format!(
                "client name {name:?} must be 1-63 of a-z, 0-9 and -"
            ));
        }
        if token.is_empty() {
            return Err(format!("the token of client {name} is empty"));
        }
        if let Some((other, _)) = pairs[..i].iter().find(|(n, _)| n == name) {
            return Err(format!("client {other} is named twice"));
        }
        if let Some((other, _)) = pairs[..i].iter().find(|(_, t)| t == token) {
            return Err(format!("clients {other} and {name} have the same token"));
        }
    }
    Ok(())
}

/// The shortest token a client may have while the gateway serves: there
/// it is a proxy password, which a pod of the cluster may guess at line
/// rate (the gateway's failed sign-in budget slows one address, not a
/// fleet of them).
pub const GATEWAY_MIN_TOKEN: usize = 16;

/// Checks that every token is at least `min` bytes (0: any), naming the
/// first client whose token is not. The message never shows a token.
pub fn long_enough(pairs: &[(String, String)], min: usize) -> Result<(), String> {
    match pairs.iter().find(|(_, t)| t.len() < min) {
        None => Ok(()),
        Some((name, token)) => Err(format!(
            "the token of client {name} is {} bytes; with the gateway on every token \
             must be at least {min} (it is also a proxy password)",
            token.len()
        )),
    }
}

/// `DISCOVERY_TOKEN` as `default`, then every file of `dir` (names
/// starting with `.` skipped: the Secret volume's own entries), sorted.
pub fn gather(env: Option<&str>, dir: Option<&Path>) -> Result<Vec<(String, String)>, String> {
    let mut pairs: Vec<(String, String)> = env
        .filter(|t| !t.is_empty())
        .map(|t| (DEFAULT_CLIENT.to_string(), t.to_string()))
        .into_iter()
        .collect();
    if let Some(dir) = dir {
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let mut files = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Follows the Secret volume's symlinks to the key files.
            if name.starts_with('.') || !entry.path().is_file() {
                continue;
            }
            let token = std::fs::read_to_string(entry.path())
                .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
            files.push((name, token.trim_end_matches(['\r', '\n']).to_string()));
        }
        files.sort();
        pairs.extend(files);
    }
    check(&pairs)?;
    Ok(pairs)
}

/// The clients of the tokens Secret's `data` (one key per client, the
/// value its token, a trailing newline dropped) after the fixed ones
/// (`DISCOVERY_TOKEN`, `--discovery-tokens-dir`), all checked together. The
/// message names the key and the reason, never a token.
pub fn with_secret(
    fixed: &[(String, String)],
    data: &BTreeMap<String, ByteString>,
) -> Result<Vec<(String, String)>, String> {
    let mut pairs = fixed.to_vec();
    for (key, value) in data {
        let token = std::str::from_utf8(&value.0)
            .map_err(|_| format!("key {key:?}: the token is not UTF-8 text"))?;
        pairs.push((
            key.clone(),
            token.trim_end_matches(['\r', '\n']).to_string(),
        ));
    }
    check(&pairs)?;
    Ok(pairs)
}

/// What one watch event means for the tokens Secret: its data now (an
/// absent or deleted Secret has none, so its clients get 401), or nothing
/// to do. `seen` tracks whether the relist in progress found the Secret.
fn secret_data(event: Event<Secret>, seen: &mut bool) -> Option<BTreeMap<String, ByteString>> {
    match event {
        Event::Init => {
            *seen = false;
            None
        }
        Event::InitApply(s) | Event::Apply(s) => {
            *seen = true;
            Some(s.data.unwrap_or_default())
        }
        Event::InitDone => (!*seen).then(BTreeMap::new),
        Event::Delete(_) => Some(BTreeMap::new()),
    }
}

/// Keeps `set` equal to the fixed clients plus those of the Secret
/// `namespace`/`name` until `stop`; every replica runs it (each serves the
/// API). A refused content leaves `set` as it was.
pub async fn watch_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
    (fixed, min_len): (Vec<(String, String)>, usize),
    set: Arc<TokenSet>,
    metrics: DiscoveryMetrics,
    stop: impl Future<Output = ()>,
) {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(api, config).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut stop = std::pin::pin!(stop);
    let mut seen = false;
    loop {
        let event = tokio::select! {
            _ = &mut stop => return,
            e = events.next() => e,
        };
        let data = match event {
            None => return,
            Some(Err(e)) => {
                warn!(secret = %name, error = %e, "Watching the discovery tokens Secret failed; the tokens in force stay");
                continue;
            }
            Some(Ok(e)) => secret_data(e, &mut seen),
        };
        let Some(data) = data else { continue };
        let span = info_span!("discovery_tokens_reload", secret = %name, keys = data.len());
        async {
            let checked =
                with_secret(&fixed, &data).and_then(|p| long_enough(&p, min_len).map(|()| p));
            match checked {
                Ok(pairs) => {
                    let before = set.clients();
                    if set.replace(&pairs) {
                        let now = set.clients();
                        let names = |v: &[Arc<str>]| v.join(",");
                        let added: Vec<Arc<str>> =
                            now.iter().filter(|n| !before.contains(n)).cloned().collect();
                        let removed: Vec<Arc<str>> =
                            before.iter().filter(|n| !now.contains(n)).cloned().collect();
                        info!(
                            clients = %names(&now),
                            added = %names(&added),
                            removed = %names(&removed),
                            "Discovery tokens reloaded"
                        );
                    }
                    metrics.tokens_applied(pairs.len());
                }
                Err(reason) => {
                    warn!(%reason, "Refused the discovery tokens Secret's content; the last good tokens stay in force");
                    metrics.tokens_refused();
                }
            }
        }
        .instrument(span)
        .await;
    }
}

/// The Secret `--generate-discovery-token` creates: `client`'s random
/// token, labelled as the operator's. `None` when the system's secure
/// random source fails (never a weaker token).
fn generated_secret(namespace: &str, name: &str, client: &str) -> Option<Secret> {
    use ring::rand::SecureRandom;
    let mut raw = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut raw).ok()?;
    let token = data_encoding::BASE64URL_NOPAD.encode(&raw);
    Some(Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "egress-proxies-operator".to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                "egress-proxies-operator/generated".to_string(),
                format!("the discovery token of client {client}, created once while the Secret was absent; delete the Secret to have a new one made"),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(BTreeMap::from([(client.to_string(), ByteString(token.into_bytes()))])),
        ..Default::default()
    })
}

/// Creates the tokens Secret with one random token for `client` unless it
/// exists, retrying (1 s doubling to 30 s) until it exists or `stop`. An
/// existing Secret is never touched, so every replica may run this at once
/// and a token, once made, stays. The token is never logged.
pub async fn ensure_generated(
    client: kube::Client,
    namespace: &str,
    name: &str,
    token_client: &str,
    stop: impl Future<Output = ()>,
) {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let mut wait = std::time::Duration::from_secs(1);
    let mut stop = std::pin::pin!(stop);
    loop {
        let reason = match generated_secret(namespace, name, token_client) {
            None => "the system's secure random source failed".to_string(),
            Some(secret) => match api.create(&Default::default(), &secret).await {
                Ok(_) => {
                    info!(secret = %name, client = %token_client, "Created the discovery token Secret with a random token");
                    return;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => return,
                Err(kube::Error::Api(e)) => e.message,
                Err(e) => e.to_string(),
            },
        };
        warn!(secret = %name, %reason, retry_in = ?wait, "Could not create the discovery token Secret");
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(30));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tokens::tests::pairs;

    #[test]
    fn with_the_gateway_on_a_short_token_is_refused_naming_its_client() {
        let p = pairs(&[("a", "0123456789abcdef"), ("b", "short")]);
        assert_eq!(long_enough(&p, 0), Ok(()));
        assert_eq!(long_enough(&p[..1], GATEWAY_MIN_TOKEN), Ok(()));
        let e = long_enough(&p, GATEWAY_MIN_TOKEN).unwrap_err();
        assert!(
            e.contains("client b is 5 bytes") && e.contains("at least 16"),
            "{e}"
        );
        assert!(!e.contains("short"), "never the token: {e}");
    }

    #[test]
    fn a_generated_token_secret_holds_one_fresh_token_for_its_client() {
        let a = generated_secret("ops", "discovery-token", "default").unwrap();
        let b = generated_secret("ops", "discovery-token", "default").unwrap();
        let data = a.data.clone().unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["default"]);
        let token = std::str::from_utf8(&data["default"].0).unwrap();
        // 256 random bits, usable as a bearer token and a proxy password.
        assert_eq!(token.len(), 43);
        assert!(token
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_ne!(a.data, b.data, "each Secret made gets its own token");
        assert_eq!(a.metadata.namespace.as_deref(), Some("ops"));
        // The pairs it yields pass the same check as a user's Secret.
        assert!(with_secret(&[], &data).is_ok());
    }

    #[test]
    fn token_rules() {
        struct Case {
            name: &'static str,
            pairs: &'static [(&'static str, &'static str)],
            problem: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "two clients",
                pairs: &[("crawler-a", "s1"), ("crawler-b", "s2")],
                problem: None,
            },
            Case {
                name: "a bad name",
                pairs: &[("Crawler_A", "s1")],
                problem: Some("client name \"Crawler_A\""),
            },
            Case {
                name: "an empty token",
                pairs: &[("a", "")],
                problem: Some("the token of client a is empty"),
            },
            Case {
                name: "a name twice",
                pairs: &[("default", "s1"), ("default", "s2")],
                problem: Some("client default is named twice"),
            },
            Case {
                name: "a shared token, never shown",
                pairs: &[("a", "secret-1"), ("b", "secret-1")],
                problem: Some("clients a and b have the same token"),
            },
        ];
        for c in cases {
            let got = check(&pairs(c.pairs));
            match c.problem {
                None => assert!(got.is_ok(), "{}: {got:?}", c.name),
                Some(want) => {
                    let e = got.unwrap_err();
                    assert!(e.contains(want), "{}: {e}", c.name);
                    assert!(!e.contains("secret"), "{}: a token leaked: {e}", c.name);
                }
            }
        }
    }

    #[test]
    fn the_directory_is_read_like_a_secret_volume() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("crawler-b"), "tok-b\n").unwrap();
        std::fs::write(dir.path().join("crawler-a"), "tok-a").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join(".hidden"), "x").unwrap();
        let got = gather(Some("env-token"), Some(dir.path())).unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("default", "env-token"),
                ("crawler-a", "tok-a"),
                ("crawler-b", "tok-b")
            ])
        );
        assert!(gather(None, Some(&dir.path().join("absent"))).is_err());
        assert_eq!(gather(None, None).unwrap(), Vec::new());
    }

    fn data(d: &[(&str, &[u8])]) -> BTreeMap<String, ByteString> {
        d.iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
            .collect()
    }

    #[test]
    fn secret_contents() {
        struct Case {
            name: &'static str,
            fixed: &'static [(&'static str, &'static str)],
            data: &'static [(&'static str, &'static [u8])],
            want: Result<&'static [(&'static str, &'static str)], &'static str>,
        }
        let cases = [
            Case {
                name: "two clients after the fixed one, newline dropped",
                fixed: &[("default", "env")],
                data: &[("crawler-a", b"ta\n"), ("crawler-b", b"tb")],
                want: Ok(&[("default", "env"), ("crawler-a", "ta"), ("crawler-b", "tb")]),
            },
            Case {
                name: "an empty Secret: only the fixed clients",
                fixed: &[],
                data: &[],
                want: Ok(&[]),
            },
            Case {
                name: "an empty value names its key",
                fixed: &[],
                data: &[("crawler-a", b"ta"), ("crawler-b", b"\n")],
                want: Err("the token of client crawler-b is empty"),
            },
            Case {
                name: "a key that is no client name",
                fixed: &[],
                data: &[("Crawler_B", b"tb")],
                want: Err("client name \"Crawler_B\" must be 1-63 of a-z, 0-9 and -"),
            },
            Case {
                name: "a key naming a fixed client",
                fixed: &[("default", "env")],
                data: &[("default", b"other")],
                want: Err("client default is named twice"),
            },
            Case {
                name: "a token shared with a fixed client",
                fixed: &[("default", "secret-env")],
                data: &[("crawler-a", b"secret-env")],
                want: Err("clients default and crawler-a have the same token"),
            },
            Case {
                name: "a value that is not text",
                fixed: &[],
                data: &[("crawler-a", &[0xff, 0xfe])],
                want: Err("key \"crawler-a\": the token is not UTF-8 text"),
            },
        ];
        for c in cases {
            let got = with_secret(&pairs(c.fixed), &data(c.data));
            match c.want {
                Ok(want) => assert_eq!(got, Ok(pairs(want)), "{}", c.name),
                Err(want) => {
                    let e = got.unwrap_err();
                    assert_eq!(e, want, "{}", c.name);
                }
            }
        }
    }

    #[test]
    fn watch_events_give_the_secret_data_or_nothing() {
        let secret = |d: &[(&str, &[u8])]| Secret {
            data: Some(data(d)),
            ..Default::default()
        };
        let mut seen = false;
        assert_eq!(secret_data(Event::Init, &mut seen), None);
        assert_eq!(
            secret_data(Event::InitDone, &mut seen),
            Some(BTreeMap::new()),
            "a relist without the Secret: none of its clients"
        );
        assert_eq!(secret_data(Event::Init, &mut seen), None);
        let found = secret_data(Event::InitApply(secret(&[("a", b"t")])), &mut seen);
        assert_eq!(found, Some(data(&[("a", b"t")])));
        assert_eq!(
            secret_data(Event::InitDone, &mut seen),
            None,
            "the relist found it: already applied"
        );
        let edited = secret_data(Event::Apply(secret(&[("b", b"u")])), &mut seen);
        assert_eq!(edited, Some(data(&[("b", b"u")])));
        assert_eq!(
            secret_data(Event::Delete(secret(&[])), &mut seen),
            Some(BTreeMap::new()),
            "deleted: its clients get 401"
        );
        assert_eq!(
            secret_data(Event::Apply(Secret::default()), &mut seen),
            Some(BTreeMap::new()),
            "a Secret without data"
        );
    }
}
