//! The discovery API's named tokens: `DISCOVERY_TOKEN` (client `default`)
//! and one file per client in `--discovery-tokens-dir` (a Secret mounted
//! as a volume: each key a file). Pure but for reading the directory.

use std::path::Path;

use crate::discovery::DEFAULT_CLIENT;

/// Whether `name` may name a client: 1-63 of `[a-z0-9-]`.
fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Checks (client, token) pairs: names valid and distinct, tokens
/// non-empty and distinct. The message never shows a token.
pub fn check(pairs: &[(String, String)]) -> Result<(), String> {
    for (i, (name, token)) in pairs.iter().enumerate() {
        if !valid_name(name) {
            return Err(format!(
                "client name {name:?} must be 1-63 of a-z, 0-9 and -"
            ));
        }
        if token.is_empty() {
            return Err(format!("the token of client {name} is empty"));
        }
        if let Some((other, _)) = pairs[..i].iter().find(|(n, _)| n == name) {
            return Err(format!("client {other} is named twice"));
        }
        if let Some((other, _)) = pairs[..i].iter().find(|(_, t)| t == token) {
            return Err(format!("clients {other} and {name} have the same token"));
        }
    }
    Ok(())
}

/// `DISCOVERY_TOKEN` as `default`, then every file of `dir` (names
/// starting with `.` skipped: the Secret volume's own entries), sorted.
pub fn gather(env: Option<&str>, dir: Option<&Path>) -> Result<Vec<(String, String)>, String> {
    let mut pairs: Vec<(String, String)> = env
        .filter(|t| !t.is_empty())
        .map(|t| (DEFAULT_CLIENT.to_string(), t.to_string()))
        .into_iter()
        .collect();
    if let Some(dir) = dir {
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let mut files = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Follows the Secret volume's symlinks to the key files.
            if name.starts_with('.') || !entry.path().is_file() {
                continue;
            }
            let token = std::fs::read_to_string(entry.path())
                .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
            files.push((name, token.trim_end_matches(['\r', '\n']).to_string()));
        }
        files.sort();
        pairs.extend(files);
    }
    check(&pairs)?;
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn token_rules() {
        struct Case {
            name: &'static str,
            pairs: &'static [(&'static str, &'static str)],
            problem: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "two clients",
                pairs: &[("crawler-a", "s1"), ("crawler-b", "s2")],
                problem: None,
            },
            Case {
                name: "a bad name",
                pairs: &[("Crawler_A", "s1")],
                problem: Some("client name \"Crawler_A\""),
            },
            Case {
                name: "an empty token",
                pairs: &[("a", "")],
                problem: Some("the token of client a is empty"),
            },
            Case {
                name: "a name twice",
                pairs: &[("default", "s1"), ("default", "s2")],
                problem: Some("client default is named twice"),
            },
            Case {
                name: "a shared token, never shown",
                pairs: &[("a", "secret-1"), ("b", "secret-1")],
                problem: Some("clients a and b have the same token"),
            },
        ];
        for c in cases {
            let got = check(&pairs(c.pairs));
            match c.problem {
                None => assert!(got.is_ok(), "{}: {got:?}", c.name),
                Some(want) => {
                    let e = got.unwrap_err();
                    assert!(e.contains(want), "{}: {e}", c.name);
                    assert!(!e.contains("secret"), "{}: a token leaked: {e}", c.name);
                }
            }
        }
    }

    #[test]
    fn the_directory_is_read_like_a_secret_volume() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("crawler-b"), "tok-b\n").unwrap();
        std::fs::write(dir.path().join("crawler-a"), "tok-a").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join(".hidden"), "x").unwrap();
        let got = gather(Some("env-token"), Some(dir.path())).unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("default", "env-token"),
                ("crawler-a", "tok-a"),
                ("crawler-b", "tok-b")
            ])
        );
        assert!(gather(None, Some(&dir.path().join("absent"))).is_err());
        assert_eq!(gather(None, None).unwrap(), Vec::new());
    }
}
