//! Custom-resource validation against a CRD's openAPIV3Schema: pruning of
//! nulls and unknown fields, defaulting, structural checks and CEL rules.

use crate::errors::FieldError;
use serde_json::{Map, Value};

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

fn nullable(schema: &Value) -> bool {
    schema.get("nullable") == Some(&Value::Bool(true))
}

/// Drop nulls of non-nullable fields, drop unknown fields, and apply `default:`s,
/// as the real server does before validation. `root` keeps apiVersion/kind/metadata.
pub fn prune_and_default(schema: &Value, value: &mut Value, root: bool) {
    match value {
        Value::Object(obj) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            if let Some(props) = props {
                for (k, ps) in props {
                    if obj.get(k) == Some(&Value::Null) && !nullable(ps) {
                        obj.remove(k);
                    }
                    if !obj.contains_key(k) {
                        if let Some(d) = ps.get("default") {
                            obj.insert(k.clone(), d.clone());
                        }
                    }
                }
                let keep_unknown = preserves_unknown(schema)
                    || matches!(additional, Some(Value::Object(_)) | Some(Value::Bool(true)));
                if !keep_unknown {
                    obj.retain(|k, _| {
                        props.contains_key(k)
                            || (root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    });
                }
            }
            for (k, v) in obj.iter_mut() {
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    prune_and_default(ps, v, false);
                } else if let Some(a @ Value::Object(_)) = additional {
                    prune_and_default(a, v, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for it in items.iter_mut() {
                    prune_and_default(is, it, false);
                }
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Print a schema bound like the real server (65535 rather than 65535.0).
fn num(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        Some(f) => format!("{f}"),
        None => v.to_string(),
    }
}

/// Structural validation of `value` at `path` (types, enum, bounds, lengths, pattern, required).
pub fn check(schema: &Value, value: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if value.is_null() {
        if !nullable(schema) && schema.get("type").is_some() {
            errs.push(FieldError::invalid(
                path,
                &Value::String("null".into()),
                &format!(
                    "{path} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let ok = match t {
            "number" => matches!(actual, "integer" | "number"),
            "integer" => actual == "integer",
            _ => actual == t,
        } || (int_or_string && matches!(actual, "integer" | "string"));
        if !ok {
            errs.push(FieldError::invalid(
                path,
                &Value::String(actual.into()),
                &format!("{path} in body must be of type {t}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            errs.push(FieldError::not_supported(path, value, allowed));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            let excl = schema.get("exclusiveMaximum") == Some(&Value::Bool(true));
            if n > max || (excl && n == max) {
                let rel = if excl {
                    "less than"
                } else {
                    "less than or equal to"
                };
                errs.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{path} in body should be {rel} {}", num(&schema["maximum"])),
                ));
            }
        }
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            let excl = schema.get("exclusiveMinimum") == Some(&Value::Bool(true));
            if n < min || (excl && n == min) {
                let rel = if excl {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                errs.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{path} in body should be {rel} {}", num(&schema["minimum"])),
                ));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                errs.push(FieldError::too_long(path, max));
            }
        }
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            if len < min {
                errs.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{path} in body should be at least {min} chars long"),
                ));
            }
        }
        if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
            match regex_lite::Regex::new(p) {
                Ok(re) if !re.is_match(s) => errs.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{path} in body should match '{p}'"),
                )),
                _ => {}
            }
        }
    }
    match value {
        Value::Object(obj) => check_object(schema, obj, path, errs),
        Value::Array(items) => {
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if items.len() as u64 > max {
                    errs.push(FieldError {
                        field: path.into(),
                        reason: "FieldValueTooMany",
                        message: format!(
                            "{path}: Too many: {}: must have at most {max} items",
                            items.len()
                        ),
                    });
                }
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if (items.len() as u64) < min {
                    errs.push(FieldError::invalid(
                        path,
                        &Value::String("array".into()),
                        &format!("{path} in body should have at least {min} items"),
                    ));
                }
            }
            if let Some(is) = schema.get("items") {
                for (i, it) in items.iter().enumerate() {
                    check(is, it, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

fn check_object(schema: &Value, obj: &Map<String, Value>, path: &str, errs: &mut Vec<FieldError>) {
    for req in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !obj.contains_key(req) {
            errs.push(FieldError::required(&join(path, req), ""));
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in obj {
        if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(ps) = props.and_then(|p| p.get(k)) {
            check(ps, v, &join(path, k), errs);
        } else if let Some(a @ Value::Object(_)) = schema.get("additionalProperties") {
            check(a, v, &join(path, k), errs);
        }
    }
}

/// Run the CEL `x-kubernetes-validations` rules (with `oldSelf` on update).
pub fn check_cel(schema: &Value, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let validator = kube::core::cel::Validator::new();
    let Err(cel_errs) = validator.validate(schema, obj, old) else {
        return;
    };
    for e in cel_errs {
        let field = e.field_path.trim_start_matches('.').to_string();
        let at = lookup(obj, &field);
        let reason = e
            .reason
            .clone()
            .unwrap_or_else(|| "FieldValueInvalid".into());
        let fe = match reason.as_str() {
            "FieldValueRequired" => FieldError::required(&field, &e.message),
            "FieldValueForbidden" => FieldError::forbidden(&field, &e.message),
            "FieldValueDuplicate" => FieldError {
                field: field.clone(),
                reason: "FieldValueDuplicate",
                message: format!("{field}: Duplicate value: {}", e.message),
            },
            _ => FieldError::invalid(
                &field,
                &Value::String(type_name(at.unwrap_or(&Value::Null)).into()),
                &e.message,
            ),
        };
        errs.push(fe);
    }
}

fn lookup<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for part in dotted.split('.').filter(|p| !p.is_empty()) {
        let (key, idx) = match part.split_once('[') {
            Some((k, rest)) => (k, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        cur = cur.get(key)?;
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

/// Default, prune and validate a custom resource in place. Returns the field errors.
pub fn validate_custom(schema: &Value, obj: &mut Value, old: Option<&Value>) -> Vec<FieldError> {
    prune_and_default(schema, obj, true);
    let mut errs = Vec::new();
    check(schema, obj, "", &mut errs);
    if errs.is_empty() {
        check_cel(schema, obj, old, &mut errs);
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "required": ["spec"], "properties": {"spec": {"type": "object",
          "x-kubernetes-validations": [{"rule": "self.mode != 'External' || has(self.endpoint)",
             "message": "spec.endpoint is required when spec.mode is External",
             "fieldPath": ".endpoint", "reason": "FieldValueRequired"}],
          "properties": {
            "port": {"type": "integer", "minimum": 1.0, "maximum": 65535.0, "nullable": true},
            "mode": {"type": "string", "enum": ["Managed", "External"], "default": "Managed",
                     "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "spec.mode is immutable"}]},
            "endpoint": {"type": "object", "nullable": true, "properties": {"host": {"type": "string"}}},
            "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"}}}}})
    }

    #[test]
    fn defaults_and_ranges() {
        let mut o = json!({"spec": {"port": 70000, "junk": 1}});
        let errs = validate_custom(&schema(), &mut o, None);
        assert_eq!(o["spec"]["mode"], "Managed");
        assert!(o["spec"].get("junk").is_none());
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].message,
            "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535"
        );
    }

    #[test]
    fn enum_type_pattern_required() {
        let mut o = json!({"spec": {"mode": "Bogus", "port": "x", "name": "ABCD"}});
        let errs = validate_custom(&schema(), &mut o, None);
        let all: Vec<_> = errs.iter().map(|e| e.message.clone()).collect();
        assert!(
            all.iter()
                .any(|m| m.starts_with("spec.mode: Unsupported value: \"Bogus\"")),
            "{all:?}"
        );
        assert!(
            all.iter()
                .any(|m| m.contains("spec.port in body must be of type integer")),
            "{all:?}"
        );
        assert!(
            all.iter().any(|m| m.contains("spec.name: Too long")),
            "{all:?}"
        );
        assert!(all.iter().any(|m| m.contains("should match")), "{all:?}");
        let mut o = json!({"metadata": {}});
        let errs = validate_custom(&schema(), &mut o, None);
        assert_eq!(errs[0].message, "spec: Required value");
    }

    #[test]
    fn cel_rules() {
        let mut o = json!({"spec": {"mode": "External"}});
        let errs = validate_custom(&schema(), &mut o, None);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.endpoint");
        let old = json!({"spec": {"mode": "Managed"}});
        let mut o = json!({"spec": {"mode": "External", "endpoint": {"host": "h"}}});
        let errs = validate_custom(&schema(), &mut o, Some(&old));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(
            errs[0].message,
            "spec.mode: Invalid value: \"string\": spec.mode is immutable"
        );
    }
}
