//! Kubernetes Events the operator records (events.k8s.io/v1), reported as
//! `egress-proxies-operator` from this replica. One recorder serves the
//! whole process; it counts an identical Event on the same object within
//! six minutes on the first one's series instead of a new object
//! ([`series`] decides, in bounded memory).
//!
//! A note is read by anyone who may list Events: it is built from names,
//! counts and plain upstream messages only, never from cloud-init, tokens
//! or keys.

pub mod series;

use std::sync::{Arc, Mutex};

use chrono::Utc;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use tracing::{debug, warn};

use crate::api::constants::OPERATOR_NAME;
use crate::provider::error::plain_message;
use series::{Publish, Series};

/// The API server's limit on an Event's note, in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;

/// Whether an Event reports something normal or something to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Shown as `Normal`.
    Normal,
    /// Shown as `Warning`.
    Warning,
}

/// One Event to record on an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Normal or Warning.
    pub severity: Severity,
    /// CamelCase reason, e.g. `CircuitOpen`.
    pub reason: &'static str,
    /// CamelCase action the operator took or held back, e.g. `HoldReplacing`.
    pub action: &'static str,
    /// Plain words for a person; cut to [`MAX_NOTE_BYTES`].
    pub text: String,
}

/// Records Events; cheap to clone.
#[derive(Clone)]
pub struct Events {
    client: Client,
    instance: String,
    series: Arc<Mutex<Series>>,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Normal => "Normal",
            Severity::Warning => "Warning",
        }
    }
}

impl Events {
    /// A recorder reporting as `egress-proxies-operator` from this replica.
    pub fn new(client: Client) -> Self {
        Events {
            client,
            instance: instance(),
            series: Arc::default(),
        }
    }

    /// Records `note` on `regarding`. An Event is best effort: a failure
    /// is logged, never returned.
    pub async fn record(&self, regarding: &ObjectReference, note: Note) {
        let text = cut(&note.text);
        fn part(v: &Option<String>) -> &str {
            v.as_deref().unwrap_or_default()
        }
        let (namespace, name) = (part(&regarding.namespace), part(&regarding.name));
        let key = series::key(
            [
                part(&regarding.api_version),
                part(&regarding.kind),
                namespace,
                name,
                part(&regarding.uid),
            ],
            note.severity.as_str(),
            note.reason,
            note.action,
            &text,
        );
        let now = Utc::now();
        // Cluster-scoped objects' Events go to `default`, as kubectl
        // describe looks for them there.
        let events: Api<Event> = Api::namespaced(
            self.client.clone(),
            if namespace.is_empty() {
                "default"
            } else {
                namespace
            },
        );
        let publish = self.series().publish(key, now);
        let res = match publish {
            Publish::Repeat { name: event, count } => {
                let res = repeat(&events, &event, count).await;
                if res.is_err() {
                    // Gone (the API server's event TTL) or refused: the
                    // next repeat starts a new Event.
                    self.series().forget(&key);
                }
                res
            }
            Publish::Create => {
                let event = self.event(regarding, &note, text);
                let res = events.create(&PostParams::default(), &event).await;
                if res.is_ok() {
                    let event_name = event.metadata.name.unwrap_or_default();
                    self.series().created(key, event_name, now);
                }
                res.map(drop)
            }
        };
        match res {
            Ok(()) => debug!(object = %name, reason = note.reason, "Recorded an Event"),
            Err(e) => {
                warn!(object = %name, reason = note.reason, error = %plain_message(&e), "Could not record an Event")
            }
        }
    }

    fn series(&self) -> std::sync::MutexGuard<'_, Series> {
        self.series.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new Event of `note` on `regarding`, named after it and the time.
    fn event(&self, regarding: &ObjectReference, note: &Note, text: String) -> Event {
        let at = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let named = regarding.name.as_deref().filter(|n| !n.is_empty());
        let name = format!(
            "{}.{:x}",
            named.unwrap_or(OPERATOR_NAME),
            at.0.as_nanosecond()
        );
        Event {
            action: Some(note.action.into()),
            reason: Some(note.reason.into()),
            event_time: Some(at),
            regarding: Some(regarding.clone()),
            note: Some(text),
            metadata: ObjectMeta {
                name: Some(name),
                ..Default::default()
            },
            reporting_controller: Some(OPERATOR_NAME.into()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(note.severity.as_str().into()),
            ..Default::default()
        }
    }
}

/// Counts a repeat on the series of Event `name`: seen `count` times, the
/// last now.
async fn repeat(events: &Api<Event>, name: &str, count: i32) -> Result<(), kube::Error> {
    let series = EventSeries {
        count,
        last_observed_time: MicroTime(k8s_openapi::jiff::Timestamp::now()),
    };
    let patch = serde_json::json!({ "series": series });
    events
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// This replica's name among the reporters: the Pod name (HOSTNAME in a
/// Pod), else the binary's name.
pub fn instance() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| OPERATOR_NAME.to_string())
}

/// At most [`MAX_NOTE_BYTES`], cut on a character boundary with `…`.
pub fn cut(text: &str) -> String {
    if text.len() <= MAX_NOTE_BYTES {
        return text.to_string();
    }
    let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_to_the_api_limit_on_a_character_boundary() {
        struct Case {
            name: &'static str,
            text: String,
            want_len: usize,
            cut: bool,
        }
        let cases = [
            Case {
                name: "short: unchanged",
                text: "4 of 5 lost".into(),
                want_len: 11,
                cut: false,
            },
            Case {
                name: "exactly the limit: unchanged",
                text: "x".repeat(1024),
                want_len: 1024,
                cut: false,
            },
            Case {
                name: "ascii over the limit",
                text: "x".repeat(3000),
                want_len: 1024,
                cut: true,
            },
            Case {
                name: "two-byte characters over the limit",
                text: "é".repeat(3000),
                want_len: 1023,
                cut: true,
            },
        ];
        for c in cases {
            let got = cut(&c.text);
            assert_eq!(got.len(), c.want_len, "{}", c.name);
            assert_eq!(got.ends_with('…'), c.cut, "{}", c.name);
        }
    }
}
