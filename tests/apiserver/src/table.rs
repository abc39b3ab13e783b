//! `meta.k8s.io/v1` Table responses for kubectl, from printer columns.

use crate::resources::{PrinterColumn, ResourceDef};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    /// `[?(@.a.b=="x")]` (or `!=`).
    Filter(Vec<String>, bool, String),
}

fn parse_path(p: &str) -> Vec<Step> {
    let p = p.trim().trim_start_matches('{').trim_end_matches('}');
    let mut steps = Vec::new();
    let b = p.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'.' => {
                let start = i + 1;
                i = start;
                while i < b.len() && b[i] != b'.' && b[i] != b'[' {
                    i += 1;
                }
                if i > start {
                    steps.push(Step::Field(p[start..i].to_string()));
                }
            }
            b'[' => {
                let Some(end) = p[i..].find(']').map(|e| e + i) else {
                    break;
                };
                // A filter may contain ']' only inside quotes; find the closing ")]".
                let end = if p[i..].starts_with("[?(") {
                    p[i..].find(")]").map(|e| e + i + 1).unwrap_or(end)
                } else {
                    end
                };
                let inner = &p[i + 1..end];
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Ok(n) = inner.parse::<usize>() {
                    steps.push(Step::Index(n));
                } else if let Some(f) = inner.strip_prefix("?(").and_then(|x| x.strip_suffix(')')) {
                    let (lhs, eq, rhs) = if let Some((l, r)) = f.split_once("!=") {
                        (l, false, r)
                    } else if let Some((l, r)) = f.split_once("==") {
                        (l, true, r)
                    } else {
                        (f, true, "")
                    };
                    let fields = lhs
                        .trim()
                        .trim_start_matches('@')
                        .split('.')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect();
                    let rhs = rhs.trim().trim_matches('"').trim_matches('\'').to_string();
                    steps.push(Step::Filter(fields, eq, rhs));
                } else {
                    let key = inner.trim_matches('\'').trim_matches('"').to_string();
                    steps.push(Step::Field(key));
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    steps
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Evaluate a kubectl-style JSONPath; returns every match.
pub fn eval(path: &str, obj: &Value) -> Vec<Value> {
    let mut cur = vec![obj.clone()];
    for step in parse_path(path) {
        let mut next = Vec::new();
        for v in cur {
            match &step {
                Step::Field(f) => {
                    if let Some(x) = v.get(f.as_str()) {
                        next.push(x.clone());
                    }
                }
                Step::Index(n) => {
                    if let Some(x) = v.get(*n) {
                        next.push(x.clone());
                    }
                }
                Step::All => match v {
                    Value::Array(a) => next.extend(a),
                    Value::Object(o) => next.extend(o.into_iter().map(|(_, x)| x)),
                    _ => {}
                },
                Step::Filter(fields, eq, rhs) => {
                    for item in v.as_array().into_iter().flatten() {
                        let mut x = Some(item);
                        for f in fields {
                            x = x.and_then(|x| x.get(f.as_str()));
                        }
                        let hit = match x {
                            Some(x) if rhs.is_empty() && fields.is_empty() => !x.is_null(),
                            Some(x) => (scalar_text(x) == *rhs) == *eq,
                            None => !*eq,
                        };
                        if hit {
                            next.push(item.clone());
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

/// Kubernetes' short human duration (5s, 3m12s, 47m, 5h3m, 3d4h, 20d, 2y).
pub fn human_age(ts: &str) -> Option<String> {
    let t = chrono::DateTime::parse_from_rfc3339(ts).ok()?;
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    Some(if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", secs % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    })
}

fn cell(col: &PrinterColumn, obj: &Value) -> Value {
    let Some(v) = eval(&col.json_path, obj).into_iter().next() else {
        return Value::Null;
    };
    match col.type_.as_str() {
        "date" => v
            .as_str()
            .and_then(human_age)
            .map(Value::String)
            .unwrap_or(Value::Null),
        "integer" | "number" | "boolean" => v,
        _ => match v {
            Value::String(_) => v,
            Value::Null => Value::Null,
            other => Value::String(other.to_string()),
        },
    }
}

fn age_col() -> PrinterColumn {
    PrinterColumn {
        name: "Age".into(),
        json_path: ".metadata.creationTimestamp".into(),
        type_: "date".into(),
        description: String::new(),
        priority: 0,
        format: String::new(),
    }
}

fn col(name: &str, path: &str, type_: &str, priority: i64) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        json_path: path.into(),
        type_: type_.into(),
        description: String::new(),
        priority,
        format: String::new(),
    }
}

/// The columns after Name.
fn columns(def: &ResourceDef) -> Vec<PrinterColumn> {
    if def.schema.is_some() {
        if def.columns.is_empty() {
            return vec![age_col()];
        }
        return def.columns.clone();
    }
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => vec![
            col("Ready", "", "string", 0),
            col("Status", ".status.phase", "string", 0),
            col("Restarts", "", "integer", 0),
            age_col(),
            col("IP", ".status.podIP", "string", 1),
        ],
        ("", "namespaces") => vec![col("Status", ".status.phase", "string", 0), age_col()],
        _ => vec![age_col()],
    }
}

fn pod_cells(obj: &Value, cols: &[PrinterColumn]) -> Vec<Value> {
    let total = obj
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let statuses = obj
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|s| s.get("ready") == Some(&Value::Bool(true)))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
        .sum();
    cols.iter()
        .map(|c| match c.name.as_str() {
            "Ready" => json!(format!("{ready}/{total}")),
            "Restarts" => json!(restarts),
            _ => cell(c, obj),
        })
        .collect()
}

/// `includeObject` handling for a row's object.
fn row_object(obj: &Value, include: &str) -> Option<Value> {
    match include {
        "None" => None,
        "Object" => Some(obj.clone()),
        _ => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_default(),
        })),
    }
}

/// A Table of `objs`. `include` is the includeObject parameter.
pub fn table(
    def: &ResourceDef,
    objs: &[Value],
    rv: Option<u64>,
    include: &str,
    headers: bool,
) -> Value {
    let cols = columns(def);
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace.", "priority": 0})];
    for c in &cols {
        defs.push(json!({"name": c.name, "type": c.type_, "format": c.format,
            "description": c.description, "priority": c.priority}));
    }
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or_default()];
            if def.group.is_empty() && def.plural == "pods" {
                cells.extend(pod_cells(o, &cols));
            } else {
                cells.extend(cols.iter().map(|c| cell(c, o)));
            }
            let mut row = json!({"cells": cells});
            if let Some(obj) = row_object(o, include) {
                row["object"] = obj;
            }
            row
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "rows": rows,
    });
    if headers {
        t["columnDefinitions"] = json!(defs);
    }
    if let Some(rv) = rv {
        t["metadata"]["resourceVersion"] = json!(rv.to_string());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_filters() {
        let o = json!({"status": {"conditions": [
            {"type": "Provisioned", "status": "True"},
            {"type": "Healthy", "status": "False"}]}, "spec": {"mode": "Managed"}});
        assert_eq!(eval(".spec.mode", &o), vec![json!("Managed")]);
        assert_eq!(
            eval(".status.conditions[?(@.type==\"Healthy\")].status", &o),
            vec![json!("False")]
        );
        assert_eq!(
            eval(".status.conditions[0].type", &o),
            vec![json!("Provisioned")]
        );
        assert_eq!(eval(".status.conditions[*].type", &o).len(), 2);
        assert!(eval(".status.ip", &o).is_empty());
    }

    #[test]
    fn ages() {
        let t = (chrono::Utc::now() - chrono::Duration::seconds(30))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        assert_eq!(human_age(&t).as_deref(), Some("30s"));
    }
}
