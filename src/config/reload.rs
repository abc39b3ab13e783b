//! What a rewritten providers file means for the running operator, decided
//! purely: nothing (the same entries), a change to apply (which names were
//! added, removed or changed), or a refusal that keeps the last good
//! config in force.

use std::fmt;

use super::ProvidersConfig;

/// Which provider names a new config adds, removes or changes, each in
/// the order of the file that has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Names only the new config has.
    pub added: Vec<String>,
    /// Names only the old config has.
    pub removed: Vec<String>,
    /// Names both have, with different settings.
    pub changed: Vec<String>,
}

impl Change {
    /// The new config is the old one entry for entry (a comment or the
    /// order changed, or nothing did).
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ("added", &self.added),
            ("removed", &self.removed),
            ("changed", &self.changed),
        ]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("{what}: {}", names.join(", ")))
        .collect();
        if parts.is_empty() {
            f.write_str("no provider changed")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}

/// The difference from `old` to `new`, by provider name.
pub fn diff(old: &ProvidersConfig, new: &ProvidersConfig) -> Change {
    let mut change = Change::default();
    for entry in &new.providers {
        match old.get(&entry.name) {
            None => change.added.push(entry.name.clone()),
            Some(before) if before != entry => change.changed.push(entry.name.clone()),
            Some(_) => {}
        }
    }
    change.removed = old
        .providers
        .iter()
        .filter(|p| new.get(&p.name).is_none())
        .map(|p| p.name.clone())
        .collect();
    change
}

/// What to do with a providers file read again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every entry is as in force: nothing to do.
    Unchanged,
    /// Put the new config in force.
    Apply(Change),
    /// Keep the config in force; the problems, each naming the entry and
    /// key, one per line.
    Refuse(String),
}

/// The verdict on `read` (the file parsed and validated, or why it could
/// not be) against the config in force.
pub fn judge(in_force: &ProvidersConfig, read: Result<&ProvidersConfig, String>) -> Verdict {
    match read {
        Err(problems) => Verdict::Refuse(problems),
        Ok(new) => {
            let change = diff(in_force, new);
            if change.is_empty() {
                Verdict::Unchanged
            } else {
                Verdict::Apply(change)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> ProvidersConfig {
        ProvidersConfig::from_slice(yaml.as_bytes()).unwrap()
    }

    const TWO: &str =
        "providers:\n  - name: a\n    type: kubernetes\n  - name: b\n    type: kubernetes\n";

    #[test]
    fn the_verdict_names_what_a_rewrite_changes() {
        struct Case {
            name: &'static str,
            new: Result<&'static str, &'static str>,
            want: Verdict,
        }
        let change = |added: &[&str], removed: &[&str], changed: &[&str]| {
            let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
            Verdict::Apply(Change {
                added: own(added),
                removed: own(removed),
                changed: own(changed),
            })
        };
        let cases = [
            Case {
                name: "same entries in another order, with a comment",
                new: Ok("# edited\nproviders:\n  - name: b\n    type: kubernetes\n  - name: a\n    type: kubernetes\n"),
                want: Verdict::Unchanged,
            },
            Case {
                name: "one added",
                new: Ok("providers:\n  - name: a\n    type: kubernetes\n  - name: b\n    type: kubernetes\n  - name: c\n    type: kubernetes\n"),
                want: change(&["c"], &[], &[]),
            },
            Case {
                name: "one removed",
                new: Ok("providers:\n  - name: b\n    type: kubernetes\n"),
                want: change(&[], &["a"], &[]),
            },
            Case {
                name: "one's limits changed, one replaced by another",
                new: Ok("providers:\n  - name: a\n    type: kubernetes\n    createsPerMinute: 3\n  - name: c\n    type: kubernetes\n"),
                want: change(&["c"], &["b"], &["a"]),
            },
            Case {
                name: "a broken file is refused with its problems",
                new: Err("providers[0] (a): createsPerMinute: must be at least 1"),
                want: Verdict::Refuse("providers[0] (a): createsPerMinute: must be at least 1".into()),
            },
        ];
        let in_force = config(TWO);
        for c in cases {
            let parsed = c.new.map(config);
            let got = judge(&in_force, parsed.as_ref().map_err(|e| e.to_string()));
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn a_change_reads_as_plain_words() {
        let c = Change {
            added: vec!["c".into(), "d".into()],
            removed: vec![],
            changed: vec!["a".into()],
        };
        assert_eq!(c.to_string(), "added: c, d; changed: a");
        assert_eq!(Change::default().to_string(), "no provider changed");
    }
}
