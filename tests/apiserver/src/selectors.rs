//! Label and field selectors for list and watch.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(s: &str) -> Result<Vec<String>, String> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            if let Some(k) = part.strip_prefix('!') {
                reqs.push(Req::NotExists(k.trim().to_string()));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(Req::NotEq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once("==") {
                reqs.push(Req::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once('=') {
                reqs.push(Req::Eq(k.trim().into(), v.trim().into()));
            } else if let Some(idx) = part.find(" notin ") {
                reqs.push(Req::NotIn(
                    part[..idx].trim().into(),
                    parse_set(&part[idx + 7..])?,
                ));
            } else if let Some(idx) = part.find(" in ") {
                reqs.push(Req::In(
                    part[..idx].trim().into(),
                    parse_set(&part[idx + 4..])?,
                ));
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unable to parse requirement: {part:?}"));
            } else {
                reqs.push(Req::Exists(part));
            }
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(|v| v.as_str());
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: equality / inequality on a few metadata fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector: {part:?}"));
            };
            let k = k.trim();
            if field_value(&Value::Null, k).is_none() {
                return Err(format!("field label not supported: {k}"));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let actual = field_value(obj, k).unwrap_or_default();
            (actual == *v) == *eq
        })
    }
}

/// The value of a supported field-selector key (None when the key is unsupported).
fn field_value(obj: &Value, key: &str) -> Option<String> {
    let ptr = match key {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        "status.phase" => "/status/phase",
        "spec.nodeName" => "/spec/nodeName",
        "type" => "/type",
        "involvedObject.name" => "/involvedObject/name",
        "involvedObject.kind" => "/involvedObject/kind",
        "involvedObject.uid" => "/involvedObject/uid",
        _ => return None,
    };
    Some(
        obj.pointer(ptr)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "x"}}});
        for (s, want) in [
            ("a=1", true),
            ("a==1", true),
            ("a!=1", false),
            ("a in (1,2)", true),
            ("a notin (1,2)", false),
            ("c notin (1)", true),
            ("b", true),
            ("!b", false),
            ("!c", true),
            ("a=1,b in (x, y)", true),
            ("a=1,c", false),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&o), want, "{s}");
        }
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "n", "namespace": "ns"}});
        assert!(FieldSelector::parse("metadata.name=n").unwrap().matches(&o));
        assert!(!FieldSelector::parse("metadata.name!=n")
            .unwrap()
            .matches(&o));
        assert!(
            FieldSelector::parse("metadata.namespace==ns,metadata.name=n")
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.bogus=1").is_err());
    }
}
