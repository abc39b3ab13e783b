//! Strict parsing and validation of the providers file.
//!
//! Entries are parsed one by one from a generic YAML tree so that each
//! error can be prefixed with the entry's index and name, and so that the
//! checks run in the documented order (name, type, blocks, type-specific,
//! create limits) whatever key a typo hit.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_norway::Value;

use super::ProviderType;
use super::{ConfigError, KubernetesConfig, ProviderConfig, ProviderSettings, ProvidersConfig};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    providers: Option<Vec<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default)]
    name: Option<Value>,
    #[serde(default, rename = "type")]
    type_: Option<Value>,
    #[serde(default)]
    kubernetes: Option<Value>,
    #[serde(default)]
    gcp: Option<Value>,
    #[serde(default)]
    kvm: Option<Value>,
    #[serde(default, rename = "createsPerMinute")]
    creates_per_minute: Option<Value>,
    #[serde(default, rename = "maxCreatesInFlight")]
    max_creates_in_flight: Option<Value>,
    #[serde(default, rename = "maxUnavailable")]
    max_unavailable: Option<Value>,
    #[serde(default, rename = "maxSurge")]
    max_surge: Option<Value>,
    #[serde(default, rename = "maxInstances")]
    max_instances: Option<Value>,
    #[serde(default, rename = "startupTimeout")]
    startup_timeout: Option<Value>,
    #[serde(default, rename = "circuitBreaker")]
    circuit_breaker: Option<Value>,
}

pub(super) fn parse(bytes: &[u8]) -> Result<ProvidersConfig, ConfigError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ConfigError::one(
            "the file is empty; it needs a top-level providers: list",
        ));
    }
    let raw: RawFile =
        serde_norway::from_slice(bytes).map_err(|e| ConfigError::one(format!("{e}")))?;
    let Some(entries) = raw.providers else {
        return Err(ConfigError::one(
            "providers is required (a list of provider entries)",
        ));
    };

    let mut problems = Vec::new();
    let mut providers = Vec::new();
    let mut first_index: BTreeMap<String, usize> = BTreeMap::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let shown_name = entry
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!(" {n:?}"))
            .unwrap_or_default();
        let prefix = format!("providers[{i}]{shown_name}");
        match parse_entry(entry) {
            Ok(p) => {
                if let Some(first) = first_index.get(&p.name) {
                    problems.push(format!(
                        "{prefix}: duplicate provider name {:?} (already used by providers[{first}])",
                        p.name
                    ));
                    continue;
                }
                first_index.insert(p.name.clone(), i);
                providers.push(p);
            }
            Err(why) => problems.push(format!("{prefix}: {why}")),
        }
    }
    if problems.is_empty() {
        Ok(ProvidersConfig { providers })
    } else {
        Err(ConfigError { problems })
    }
}

fn string_field(v: Option<Value>, key: &str) -> Result<String, String> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{key} must be a string (got {})", describe(&other))),
    }
}

pub(super) fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn parse_entry(entry: Value) -> Result<ProviderConfig, String> {
    if !entry.is_mapping() {
        return Err(format!(
            "an entry must be a mapping with name and type (got {})",
            describe(&entry)
        ));
    }
    let raw: RawEntry = serde_norway::from_value(entry).map_err(|e| e.to_string())?;

    let name = string_field(raw.name, "name")?;
    if name.is_empty() {
        return Err("name is required".into());
    }
    if !is_dns1123_label(&name) {
        return Err(format!(
            "name {name:?} must be a DNS-1123 label (at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit): it names the ProviderHealth object and is what Proxy spec.provider refers to"
        ));
    }

    let type_name = string_field(raw.type_, "type")?;
    if type_name.is_empty() {
        return Err("type is required".into());
    }
    let provider_type = ProviderType::parse(&type_name).ok_or_else(|| {
        format!(
            "unknown provider type {type_name:?} (known types: {})",
            ProviderType::ALL
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;

    let blocks = [
        (ProviderType::Kubernetes, raw.kubernetes),
        (ProviderType::Gcp, raw.gcp),
        (ProviderType::Kvm, raw.kvm),
    ];
    let mut own = None;
    for (block_type, value) in blocks {
        match value {
            None => {}
            Some(v) if block_type == provider_type => own = Some(v),
            Some(_) => {
                return Err(format!(
                    "type is {provider_type} but a {block_type} block is set"
                ));
            }
        }
    }

    let block = |key: &str| -> Result<Value, String> {
        own.clone()
            .ok_or_else(|| format!("{key} block is required for type {key}"))
    };
    // The path names the offending key inside the block, e.g. `kvm.hosts[0].user`.
    fn strict<T: serde::de::DeserializeOwned>(key: &str, v: Value) -> Result<T, String> {
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                format!("{key}: {}", e.inner())
            } else {
                format!("{key}.{path}: {}", e.inner())
            }
        })
    }
    let settings = match provider_type {
        ProviderType::Kubernetes => {
            let cfg = match own.clone() {
                None => KubernetesConfig::default(),
                Some(v) => strict("kubernetes", v)?,
            };
            if cfg.image.trim().is_empty() {
                return Err("kubernetes.image must not be empty".into());
            }
            cfg.destinations.rules()?;
            ProviderSettings::Kubernetes(cfg)
        }
        ProviderType::Gcp => {
            let cfg: super::GcpConfig = strict("gcp", block("gcp")?)?;
            cfg.validate()?;
            cfg.destinations.rules_of("gcp")?;
            ProviderSettings::Gcp(cfg)
        }
        ProviderType::Kvm => {
            let cfg: super::KvmConfig = strict("kvm", block("kvm")?)?;
            cfg.validate()?;
            cfg.destinations.rules_of("kvm")?;
            ProviderSettings::Kvm(cfg)
        }
    };
    let limits = super::CreateLimits::parse(
        raw.creates_per_minute,
        raw.max_creates_in_flight,
        raw.max_instances,
    )?
    .with_startup_timeout(raw.startup_timeout)?;
    let max_unavailable = super::fleet::max_unavailable(raw.max_unavailable)?;
    let max_surge = super::fleet::max_surge(raw.max_surge)?;
    let circuit_breaker = super::fleet::circuit_breaker(raw.circuit_breaker)?;
    Ok(ProviderConfig {
        name,
        provider_type,
        settings,
        limits,
        max_unavailable,
        max_surge,
        circuit_breaker,
    })
}

/// A lowercase RFC 1123 label of at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    let edge_ok = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !b.is_empty() && b.len() <= 63 && inner_ok && edge_ok(b.first()) && edge_ok(b.last())
}

/// `^[A-Za-z0-9][A-Za-z0-9_.-]*$`: safe to paste into a volume name or an ID.
pub(super) fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-')
}

/// An absolute http or https URL with a host.
pub fn http_url(s: &str) -> Result<(), String> {
    match url::Url::parse(s) {
        Ok(u)
            if matches!(u.scheme(), "http" | "https")
                && u.host_str().is_some_and(|h| !h.is_empty()) =>
        {
            Ok(())
        }
        _ => Err("must be an http(s) URL".into()),
    }
}
