//! The gcp wire log: request and response summaries at TRACE under the
//! target `egress_proxies_operator::provider::gcp::wire`. Large string
//! values (metadata values above all) are elided unless full payloads were
//! asked for (`--gcp-wire-log-full-payloads`); the `user-data` metadata
//! value is always redacted, whatever the option says.

use serde_json::Value;

use super::build::USER_DATA_KEY;

/// Strings longer than this are elided unless full payloads are on.
pub const ELIDE_ABOVE: usize = 1024;

/// Target of the wire-log events.
pub const TARGET: &str = "egress_proxies_operator::provider::gcp::wire";

/// A JSON rendering of `payload` safe for the log: every `{"key":
/// "user-data", "value": ...}` item has its value replaced by its size, and
/// (unless `full`) every other string longer than [`ELIDE_ABOVE`] by its size.
pub fn redact(payload: &Value, full: bool) -> Value {
    match payload {
        Value::Object(map) => {
            let is_user_data = map.get("key").and_then(Value::as_str) == Some(USER_DATA_KEY);
            let out = map
                .iter()
                .map(|(k, v)| {
                    let v = if is_user_data && k == "value" {
                        let n = v.as_str().map(str::len).unwrap_or(0);
                        Value::String(format!("<redacted {n} bytes>"))
                    } else {
                        redact(v, full)
                    };
                    (k.clone(), v)
                })
                .collect();
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| redact(v, full)).collect()),
        Value::String(s) if !full && s.len() > ELIDE_ABOVE => {
            Value::String(format!("<elided {} bytes>", s.len()))
        }
        other => other.clone(),
    }
}

/// Serialises `body` and renders it with [`redact`]; a body that does not
/// serialise is shown as a placeholder (never with Debug, which would show
/// user-data).
pub fn render<T: serde::Serialize>(body: &T, full: bool) -> String {
    match serde_json::to_value(body) {
        Ok(v) => redact(&v, full).to_string(),
        Err(_) => "<unserialisable>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn user_data_is_always_redacted_and_large_values_elided() {
        let big = "x".repeat(ELIDE_ABOVE + 1);
        let v = json!({
            "name": "proxy-a",
            "metadata": {"items": [
                {"key": "user-data", "value": "SENTINEL"},
                {"key": "other", "value": big},
                {"key": "small", "value": "ok"},
            ]},
        });
        for full in [false, true] {
            let s = redact(&v, full).to_string();
            assert!(!s.contains("SENTINEL"), "{s}");
            assert!(s.contains("<redacted 8 bytes>"), "{s}");
            assert!(s.contains("\"ok\""), "{s}");
            assert!(s.contains("proxy-a"), "{s}");
            assert_eq!(s.contains(&big), full, "{s}");
            assert_eq!(s.contains("<elided 1025 bytes>"), !full, "{s}");
        }
    }
}
