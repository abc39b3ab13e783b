//! Kubernetes Events the operator records (events.k8s.io/v1, through
//! kube-runtime's recorder), reported as `egress-proxies-operator`. One
//! recorder serves the whole process; it repeats an identical Event as a
//! series instead of a new object.
//!
//! A note is read by anyone who may list Events: it is built from names,
//! counts and plain upstream messages only, never from cloud-init, tokens
//! or keys.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tracing::{debug, warn};

use crate::api::constants::OPERATOR_NAME;
use crate::provider::error::plain_message;

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
    recorder: Recorder,
}

impl Events {
    /// A recorder reporting as `egress-proxies-operator` from this replica.
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: OPERATOR_NAME.into(),
            instance: Some(instance()),
        };
        Events {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Records `note` on `regarding`. An Event is best effort: a failure
    /// is logged, never returned.
    pub async fn record(&self, regarding: &ObjectReference, note: Note) {
        let event = Event {
            type_: match note.severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            },
            reason: note.reason.into(),
            note: Some(cut(&note.text)),
            action: note.action.into(),
            secondary: None,
        };
        let name = regarding.name.as_deref().unwrap_or_default();
        match self.recorder.publish(&event, regarding).await {
            Ok(()) => debug!(object = %name, reason = note.reason, "Recorded an Event"),
            Err(e) => {
                warn!(object = %name, reason = note.reason, error = %plain_message(&e), "Could not record an Event")
            }
        }
    }
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
