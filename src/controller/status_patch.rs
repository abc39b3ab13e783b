//! The JSON merge patch that turns one status into another: changed and new
//! keys carry their value, removed keys carry `null` (a plain serialization
//! would leave removed fields in place).

use serde_json::{Map, Value};

/// The RFC 7386 merge patch from `base` to `new`; `None` when equal.
pub fn merge_diff(base: &Value, new: &Value) -> Option<Value> {
    if base == new {
        return None;
    }
    match (base, new) {
        (Value::Object(b), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, bv) in b {
                match n.get(k) {
                    None => {
                        out.insert(k.clone(), Value::Null);
                    }
                    Some(nv) => {
                        if let Some(d) = merge_diff(bv, nv) {
                            out.insert(k.clone(), d);
                        }
                    }
                }
            }
            for (k, nv) in n {
                if !b.contains_key(k) {
                    out.insert(k.clone(), nv.clone());
                }
            }
            Some(Value::Object(out))
        }
        // Lists and scalars are replaced whole (merge patch has no list merge).
        _ => Some(new.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_diff_table() {
        let cases = [
            (json!({"a": 1}), json!({"a": 1}), None),
            (json!({"a": 1}), json!({"a": 2}), Some(json!({"a": 2}))),
            (
                json!({"a": 1, "b": 2}),
                json!({"a": 1}),
                Some(json!({"b": null})),
            ),
            (json!({}), json!({"c": [1]}), Some(json!({"c": [1]}))),
            (
                json!({"o": {"x": 1, "y": 2}}),
                json!({"o": {"x": 1}}),
                Some(json!({"o": {"y": null}})),
            ),
            (
                json!({"l": [1, 2]}),
                json!({"l": [1]}),
                Some(json!({"l": [1]})),
            ),
        ];
        for (base, new, want) in cases {
            assert_eq!(merge_diff(&base, &new), want, "{base} -> {new}");
            // Applying the patch to base gives new.
            if let Some(p) = merge_diff(&base, &new) {
                let mut b = base.clone();
                json_merge(&mut b, &p);
                assert_eq!(b, new);
            }
        }
    }

    fn json_merge(target: &mut Value, patch: &Value) {
        if let Value::Object(p) = patch {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    json_merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        } else {
            *target = patch.clone();
        }
    }
}
