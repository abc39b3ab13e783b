//! The gateway's username grammar (docs/gateway.md): the client's name,
//! then `-<key>-<value>` parameters choosing the session and the proxies.
//! Pure; what a malformed username says is the reason in its `407`.

use std::time::Duration;

use crate::discovery::Filters;

/// The parameter names, in the order the docs list them.
pub const KEYS: [&str; 8] = [
    "session", "ttl", "pool", "provider", "zone", "region", "ns", "label",
];

/// The longest session id.
pub const MAX_SESSION_LEN: usize = 64;

/// What a username asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Wanted {
    /// The sticky session's id; none: each connection may go elsewhere.
    pub session: Option<String>,
    /// How long the session is remembered after its last use; none: the
    /// gateway's default.
    pub ttl: Option<Duration>,
    /// Which proxies it may use (the lease API's filters).
    pub filters: Filters,
}

/// Parses `username`, sent with the token of `client`, allowing session
/// lifetimes up to `max_ttl`. The error is the reason, in plain words.
pub fn parse(username: &str, client: &str, max_ttl: Duration) -> Result<Wanted, String> {
    let rest = match username.strip_prefix(client) {
        Some("") => return Ok(Wanted::default()),
        Some(rest) if rest.starts_with('-') => &rest[1..],
        _ => {
            return Err(format!(
                "the username must be the client name {client:?} (the one this password \
                 belongs to), optionally followed by -<key>-<value> parameters"
            ))
        }
    };
    let mut wanted = Wanted::default();
    let mut labels: Vec<String> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    let mut tokens = rest.split('-').peekable();
    while let Some(key) = tokens.next() {
        if !KEYS.contains(&key) {
            return Err(format!(
                "unknown parameter {key:?} (known: {})",
                KEYS.join(", ")
            ));
        }
        // A value runs up to the next parameter name, so it may hold '-'
        // (zones such as europe-west1-b).
        let mut parts = Vec::new();
        while let Some(t) = tokens.next_if(|t| !KEYS.contains(t)) {
            parts.push(t);
        }
        let value = parts.join("-");
        if value.is_empty() {
            return Err(format!("parameter {key:?} needs a value: {key}-<value>"));
        }
        if key != "label" {
            if seen.contains(&key) {
                return Err(format!("parameter {key:?} is given twice"));
            }
            seen.push(key);
        }
        match key {
            "session" => wanted.session = Some(session(&value)?),
            "ttl" => wanted.ttl = Some(ttl(&value, max_ttl)?),
            "pool" => wanted.filters.pool = Some(value),
            "provider" => wanted.filters.provider = Some(value),
            "zone" => wanted.filters.zone = Some(value),
            "region" => wanted.filters.region = Some(value),
            "ns" => wanted.filters.namespace = Some(value),
            _ => labels.push(label(&value)?),
        }
    }
    if wanted.ttl.is_some() && wanted.session.is_none() {
        return Err("ttl applies to a session: add session-<id>".to_string());
    }
    if !labels.is_empty() {
        wanted.filters.label_selector = Some(labels.join(","));
    }
    Ok(wanted)
}

fn session(value: &str) -> Result<String, String> {
    let ok = value.len() <= MAX_SESSION_LEN && value.bytes().all(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!(
            "session id {value:?} must be 1 to {MAX_SESSION_LEN} letters and digits"
        ))
    }
}

fn ttl(value: &str, max: Duration) -> Result<Duration, String> {
    let max_minutes = max.as_secs() / 60;
    match value.parse::<u64>() {
        Ok(m) if (1..=max_minutes).contains(&m) => Ok(Duration::from_secs(m * 60)),
        _ => Err(format!(
            "ttl {value:?} must be a whole number of minutes from 1 to {max_minutes}"
        )),
    }
}

/// One label filter, `key=value`, checked as the lease API checks its
/// label selector.
fn label(value: &str) -> Result<String, String> {
    let (k, v) = value
        .split_once('=')
        .ok_or_else(|| format!("label filter {value:?} must be label-<key>=<value>"))?;
    let one = format!("{k}={v}");
    let f = Filters {
        label_selector: Some(one.clone()),
        ..Filters::default()
    };
    crate::discovery::Filter::new(f).map_err(|e| format!("label filter {value:?}: {e}"))?;
    if k.is_empty() {
        return Err(format!(
            "label filter {value:?} must be label-<key>=<value>"
        ));
    }
    Ok(one)
}

#[cfg(test)]
#[path = "username_tests.rs"]
mod tests;
