//! The size bounds of the free-form fields (src/api/limits.rs), enforced by
//! the real API server: an oversized field is refused naming the field and
//! its bound, nothing is stored; a field at its bound is taken as written.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

use egress_proxies_operator::api::{Proxy, ProxyPool};
use kube::api::PostParams;
use serde_json::{json, Value};

/// One object to create and what the API server must answer.
struct Case {
    what: &'static str,
    /// `Proxy` or `ProxyPool`.
    kind: &'static str,
    spec: Value,
    /// Refused with a 422 whose message holds the field and these words;
    /// `None`: stored as written.
    refused: Option<(&'static str, &'static str)>,
}

fn proxy(extra: Value) -> Value {
    let mut spec = json!({"provider": "kubernetes", "port": 3128});
    merge(&mut spec, extra);
    spec
}

fn pool(template_extra: Value) -> Value {
    let mut template = json!({"spec": {"provider": "kubernetes", "port": 3128}});
    merge(&mut template, template_extra);
    json!({"replicas": 0, "template": template})
}

fn merge(into: &mut Value, extra: Value) {
    if let (Some(into), Value::Object(extra)) = (into.as_object_mut(), extra) {
        for (k, v) in extra {
            match into.get_mut(&k) {
                Some(have @ Value::Object(_)) if v.is_object() => merge(have, v),
                _ => {
                    into.insert(k, v);
                }
            }
        }
    }
}

/// `n` entries whose keys and values are `len` characters long.
fn map(n: usize, len: usize) -> Value {
    (0..n)
        .map(|i| {
            let key = format!("{i:0len$}");
            (key, Value::String("v".repeat(len)))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test]
async fn oversized_fields_are_refused_by_the_api_server_naming_the_field() {
    let ground = support::ground_without_pods("limits").await;
    let kib = |n: usize| "x".repeat(n * 1024);
    let cases = [
        Case {
            what: "a 100 KiB inline cloud-init",
            kind: "Proxy",
            spec: proxy(json!({"cloudInit": {"inline": kib(100)}})),
            refused: Some(("spec.cloudInit.inline", "65536")),
        },
        Case {
            what: "a 64 KiB inline cloud-init (the bound)",
            kind: "Proxy",
            spec: proxy(json!({"cloudInit": {"inline": kib(64)}})),
            refused: None,
        },
        Case {
            what: "33 attributes",
            kind: "Proxy",
            spec: proxy(json!({"attributes": map(33, 2)})),
            refused: Some(("spec.attributes", "32")),
        },
        Case {
            what: "an attribute value of 257 characters",
            kind: "Proxy",
            spec: proxy(json!({"attributes": {"geo": "v".repeat(257)}})),
            refused: Some(("spec.attributes", "256")),
        },
        Case {
            what: "an attribute key of 257 characters",
            kind: "Proxy",
            spec: proxy(json!({"attributes": {"k".repeat(257): "home"}})),
            refused: Some((
                "spec.attributes",
                "attribute keys must be at most 256 characters",
            )),
        },
        Case {
            what: "32 attributes of 256-character keys and values (the bounds)",
            kind: "Proxy",
            spec: proxy(json!({"attributes": map(32, 256)})),
            refused: None,
        },
        Case {
            what: "a placement zone of 254 characters",
            kind: "Proxy",
            spec: proxy(json!({"placement": {"zone": "z".repeat(254)}})),
            refused: Some(("spec.placement.zone", "253")),
        },
        Case {
            what: "a placement image of 254 characters",
            kind: "Proxy",
            spec: proxy(json!({"placement": {"image": "i".repeat(254)}})),
            refused: Some(("spec.placement.image", "253")),
        },
        Case {
            what: "placement strings of 253 characters (the bound)",
            kind: "Proxy",
            spec: proxy(
                json!({"placement": {"region": "r".repeat(253), "zone": "z".repeat(253), "machineType": "m".repeat(253), "image": "i".repeat(253)}}),
            ),
            refused: None,
        },
        Case {
            what: "a recycle duration of 34 characters",
            kind: "Proxy",
            spec: proxy(json!({"recycle": {"maxAge": "1h".repeat(17)}})),
            refused: Some(("spec.recycle.maxAge", "32")),
        },
        Case {
            what: "a pool template's 100 KiB inline cloud-init",
            kind: "ProxyPool",
            spec: pool(json!({"spec": {"cloudInit": {"inline": kib(100)}}})),
            refused: Some(("spec.template.spec.cloudInit.inline", "65536")),
        },
        Case {
            what: "a pool template's 33 attributes",
            kind: "ProxyPool",
            spec: pool(json!({"spec": {"attributes": map(33, 2)}})),
            refused: Some(("spec.template.spec.attributes", "32")),
        },
        Case {
            what: "a pool template's label value of 64 characters",
            kind: "ProxyPool",
            spec: pool(json!({"metadata": {"labels": {"team": "t".repeat(64)}}})),
            refused: Some(("spec.template.metadata.labels", "63")),
        },
        Case {
            what: "a pool template's 64 KiB inline cloud-init and 32 labels (the bounds)",
            kind: "ProxyPool",
            spec: pool(
                json!({"metadata": {"labels": map(32, 63)}, "spec": {"cloudInit": {"inline": kib(64)}}}),
            ),
            refused: None,
        },
    ];
    let proxies = ground.proxies();
    let pools: kube::Api<ProxyPool> = ground.api();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let name = format!("limits-{i}");
        let object = json!({
            "apiVersion": "crawl.example.com/v1alpha1",
            "kind": c.kind,
            "metadata": {"name": name},
            "spec": c.spec,
        });
        let (created, stored) = match c.kind {
            "Proxy" => {
                let p: Proxy = serde_json::from_value(object).unwrap();
                let created = proxies.create(&PostParams::default(), &p).await.map(drop);
                let stored = proxies
                    .get_opt(&name)
                    .await
                    .unwrap()
                    .map(|p| serde_json::to_value(p.spec).unwrap());
                (created, stored)
            }
            _ => {
                let p: ProxyPool = serde_json::from_value(object).unwrap();
                let created = pools.create(&PostParams::default(), &p).await.map(drop);
                let stored = pools
                    .get_opt(&name)
                    .await
                    .unwrap()
                    .map(|p| serde_json::to_value(p.spec).unwrap());
                (created, stored)
            }
        };
        let verdict = match (&c.refused, created) {
            (Some((field, words)), Err(kube::Error::Api(s))) => {
                println!("{}: {} {}", c.what, s.code, s.message);
                if s.code != 422 {
                    Some(format!("answered {}, not 422: {}", s.code, s.message))
                } else if !s.message.contains(field) || !s.message.contains(words) {
                    Some(format!(
                        "the message names no {field} with {words:?}: {}",
                        s.message
                    ))
                } else if stored.is_some() {
                    Some("refused, yet stored".into())
                } else {
                    None
                }
            }
            (Some(_), other) => Some(format!("not refused: {other:?}")),
            (None, Ok(())) => {
                println!("{}: stored", c.what);
                match stored {
                    Some(spec) if contains(&spec, &c.spec) => None,
                    other => Some(format!("stored other than written: {other:?}")),
                }
            }
            (None, Err(e)) => Some(format!("refused: {e}")),
        };
        if let Some(why) = verdict {
            failures.push(format!("{}: {why}", c.what));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Whether every field of `want` is in `have` with the same value (the
/// server adds defaults, such as `mode`).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        _ => have == want,
    }
}
