//! Label selectors in the Kubernetes string syntax (`kubectl -l`), for the
//! `labelSelector` filter: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k` and `!k`, joined by commas (all must hold).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use kube::core::{Expression, Selector};

/// The syntax as a regular expression: the `pattern` of `labelSelector` in
/// the OpenAPI document (so clients and fuzzers know what is valid), and
/// the last word of [`parse`]: a string is accepted exactly when it
/// matches and every requirement parses.
pub const PATTERN: &str = r"^( *(![A-Za-z0-9._/-]*[A-Za-z0-9._-]|[A-Za-z0-9._/-]*[A-Za-z0-9._-] *(==?|!=) *[A-Za-z0-9._-]*|[A-Za-z0-9._/-]*[A-Za-z0-9._-] +(in|notin) +\( *[A-Za-z0-9._-]*( *, *[A-Za-z0-9._-]*)* *\)|[A-Za-z0-9._/-]*[A-Za-z0-9._-]) *(, *(![A-Za-z0-9._/-]*[A-Za-z0-9._-]|[A-Za-z0-9._/-]*[A-Za-z0-9._-] *(==?|!=) *[A-Za-z0-9._-]*|[A-Za-z0-9._/-]*[A-Za-z0-9._-] +(in|notin) +\( *[A-Za-z0-9._-]*( *, *[A-Za-z0-9._-]*)* *\)|[A-Za-z0-9._/-]*[A-Za-z0-9._-]) *)*)?$";

static SYNTAX: LazyLock<Option<regex_lite::Regex>> =
    LazyLock::new(|| regex_lite::Regex::new(PATTERN).ok());

/// Parses `s` into a selector, or says which requirement is malformed.
pub fn parse(s: &str) -> Result<Selector, String> {
    let selector = parse_requirements(s)?;
    // The pattern is a constant that a test compiles: None cannot happen.
    if SYNTAX.as_ref().is_some_and(|re| !re.is_match(s)) {
        return Err(format!(
            "labelSelector {s:?} is not in the selector syntax (k=v, k!=v, k in (a,b), k notin (a,b), k, !k, joined by commas; no space after '!' or before '(' is missing)"
        ));
    }
    Ok(selector)
}

fn parse_requirements(s: &str) -> Result<Selector, String> {
    let mut exprs = Vec::new();
    for req in split_top(s)? {
        let req = req.trim();
        if req.is_empty() {
            return Err(format!("labelSelector {s:?} has an empty requirement"));
        }
        exprs.push(requirement(req).map_err(|why| format!("labelSelector {req:?}: {why}"))?);
    }
    Ok(exprs.into_iter().collect())
}

/// Splits at the commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!("labelSelector {s:?} closes a parenthesis it never opened")
                })?;
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("labelSelector {s:?} leaves a parenthesis open"));
    }
    if !s.trim().is_empty() {
        out.push(&s[start..]);
    }
    Ok(out)
}

fn requirement(req: &str) -> Result<Expression, String> {
    if let Some(key) = req.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key_of(key)?));
    }
    for (word, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = req.split_once(word) {
            let (key, set) = (key_of(key)?, set_of(set)?);
            return Ok(if notin {
                Expression::NotIn(key, set)
            } else {
                Expression::In(key, set)
            });
        }
    }
    for (op, equal) in [("!=", false), ("==", true), ("=", true)] {
        if let Some((key, value)) = req.split_once(op) {
            let (key, value) = (key_of(key)?, value_of(value)?);
            return Ok(if equal {
                Expression::Equal(key, value)
            } else {
                Expression::NotEqual(key, value)
            });
        }
    }
    Ok(Expression::Exists(key_of(req)?))
}

/// A label key: an optional DNS prefix and `/`, then a name of
/// alphanumerics, `-`, `_` and `.`.
fn key_of(key: &str) -> Result<String, String> {
    let key = key.trim();
    let name = key.rsplit_once('/').map_or(key, |(_, n)| n);
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/');
    if name.is_empty() || !key.chars().all(ok) {
        return Err(format!(
            "{key:?} is not a label key (letters, digits, '-', '_', '.', an optional prefix/)"
        ));
    }
    Ok(key.to_string())
}

/// A label value: alphanumerics, `-`, `_` and `.` (may be empty; one
/// longer than Kubernetes allows simply matches nothing).
fn value_of(value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !value.chars().all(ok) {
        return Err(format!(
            "{value:?} is not a label value (letters, digits, '-', '_', '.')"
        ));
    }
    Ok(value.to_string())
}

fn set_of(set: &str) -> Result<BTreeSet<String>, String> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("{:?} is not a set: write (a,b)", set.trim()))?;
    inner.split(',').map(value_of).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::core::SelectorExt;

    use super::*;

    /// Accepted exactly when the OpenAPI pattern matches: the fuzz run
    /// sends what the pattern allows and expects it accepted, and what it
    /// refuses and expects a 400.
    #[test]
    fn the_pattern_and_the_parser_agree() {
        let re = regex_lite::Regex::new(PATTERN).unwrap();
        for s in [
            "",
            "a",
            "!a",
            "a=b",
            "a==b",
            "a!=b",
            "a=",
            " a = b , c ",
            "a in (b,c)",
            "a in (,)",
            "a notin ( b , c )",
            "in in (in)",
            "x.io/name-1_2=v.3",
            "a,b,!c,d in (e)",
            " ",
            "! a",
            "a in(b)",
            "a b",
            "a=b=c",
            "a,,b",
            "(",
            "a in (b",
            "a/=b",
            "a=b c",
            "é=b",
            "a!b",
        ] {
            assert_eq!(
                parse(s).is_ok(),
                re.is_match(s),
                "{s:?}: parse {:?}",
                parse(s)
            );
        }
    }

    #[test]
    fn selectors_parse_and_match_as_kubectl_reads_them() {
        let labels: BTreeMap<String, String> = [
            ("tier", "gold"),
            ("team", "crawl"),
            ("app.kubernetes.io/part-of", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let cases: [(&str, Result<bool, &str>); 17] = [
            ("", Ok(true)),
            ("tier=gold", Ok(true)),
            ("tier==gold", Ok(true)),
            ("tier=silver", Ok(false)),
            ("tier!=silver", Ok(true)),
            ("tier!=gold", Ok(false)),
            ("tier in (gold, silver)", Ok(true)),
            ("tier notin (gold,silver)", Ok(false)),
            ("team,tier=gold", Ok(true)),
            ("!team", Ok(false)),
            ("!zone", Ok(true)),
            ("zone", Ok(false)),
            ("app.kubernetes.io/part-of=x, tier in (gold)", Ok(true)),
            ("tier in gold", Err("is not a set")),
            ("tier in (gold", Err("leaves a parenthesis open")),
            ("tier=gold,,team", Err("empty requirement")),
            ("ti er=gold", Err("is not a label key")),
        ];
        for (s, want) in cases {
            match (parse(s), want) {
                (Ok(sel), Ok(m)) => assert_eq!(sel.matches(&labels), m, "{s}"),
                (Err(e), Err(words)) => assert!(e.contains(words), "{s}: {e}"),
                (got, want) => panic!("{s}: got {got:?}, want {want:?}"),
            }
        }
    }
}
