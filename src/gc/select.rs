//! The pure half of orphan GC: which listed instances a sweep deletes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::events::{Note, Severity};
use crate::provider::Instance;

/// Why an instance is kept or deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An orphan of this installation, old enough, within the budget.
    Delete,
    /// Carries another installation's mark (or none).
    OtherInstallation,
    /// Carries no owner UID: never deleted.
    NoUid,
    /// Its Proxy exists (possibly being deleted).
    Live,
    /// Younger than MinAge, or its age is unknown and GC first saw it less
    /// than MinAge ago.
    TooYoung,
    /// Eligible, but this sweep already used its delete budget.
    OverBudget,
}

/// What a sweep decides with.
pub struct Rules<'a> {
    /// Our installation identity.
    pub installation_id: &'a str,
    /// UIDs of every Proxy in the cluster, including those being deleted.
    pub live: &'a HashSet<String>,
    /// The sweep's time.
    pub now: DateTime<Utc>,
    /// `--gc-min-age`.
    pub min_age: Duration,
    /// When GC first saw each instance whose creation time is unknown,
    /// keyed by providerID.
    pub first_seen: &'a HashMap<String, DateTime<Utc>>,
}

fn older_than(since: DateTime<Utc>, now: DateTime<Utc>, min_age: Duration) -> bool {
    match (now - since).to_std() {
        Ok(age) => age >= min_age,
        // `since` is in the future (clock skew): young.
        Err(_) => false,
    }
}

/// Whether a sweep that has run for `elapsed` is past its time: half of
/// `--gc-min-age`. Its listings then are too old to delete by: an
/// instance created after them is protected by min-age only while the
/// sweep is younger than that. A min-age of zero asks for no such
/// protection, and never stops a sweep.
pub fn overran(elapsed: Duration, min_age: Duration) -> bool {
    !min_age.is_zero() && elapsed > min_age / 2
}

/// The verdict for one instance, ignoring the budget.
pub fn verdict(inst: &Instance, rules: &Rules<'_>) -> Verdict {
    if inst.installation_id.is_empty() || inst.installation_id != rules.installation_id {
        return Verdict::OtherInstallation;
    }
    if inst.uid.is_empty() {
        return Verdict::NoUid;
    }
    if rules.live.contains(&inst.uid) {
        return Verdict::Live;
    }
    // An unknown creation time counts from when GC first saw the instance;
    // one not seen before is seen now, so it is young.
    let since = inst
        .created_at
        .or_else(|| rules.first_seen.get(&inst.id).copied())
        .unwrap_or(rules.now);
    if !older_than(since, rules.now, rules.min_age) {
        return Verdict::TooYoung;
    }
    Verdict::Delete
}

/// Verdicts for a provider's listing, in order; `budget` (deletes left in
/// this sweep) is decremented for each `Delete`, and eligible instances
/// past it get `OverBudget`.
pub fn select(instances: &[Instance], rules: &Rules<'_>, budget: &mut u32) -> Vec<Verdict> {
    instances
        .iter()
        .map(|i| match verdict(i, rules) {
            Verdict::Delete if *budget == 0 => Verdict::OverBudget,
            Verdict::Delete => {
                *budget -= 1;
                Verdict::Delete
            }
            v => v,
        })
        .collect()
}

/// Updates the first-seen times of one provider's instances with an
/// unknown creation time: new ones are stamped `now`; known ones keep their
/// stamp; instances of this provider no longer listed are forgotten.
/// Keys are `<provider>/<providerID>`.
pub fn track_first_seen(
    first_seen: &mut HashMap<String, DateTime<Utc>>,
    provider: &str,
    instances: &[Instance],
    now: DateTime<Utc>,
) {
    let prefix = format!("{provider}/");
    let listed: HashSet<String> = instances
        .iter()
        .filter(|i| i.created_at.is_none())
        .map(|i| format!("{prefix}{}", i.id))
        .collect();
    first_seen.retain(|k, _| !k.starts_with(&prefix) || listed.contains(k));
    for k in listed {
        first_seen.entry(k).or_insert(now);
    }
}

/// The first-seen view of one provider, keyed by providerID, for [`Rules`].
pub fn first_seen_of(
    first_seen: &HashMap<String, DateTime<Utc>>,
    provider: &str,
) -> HashMap<String, DateTime<Utc>> {
    let prefix = format!("{provider}/");
    first_seen
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|id| (id.to_string(), *v)))
        .collect()
}

/// How many instance names an `OrphansCollected` note lists.
pub const NOTE_NAMES: usize = 10;

/// The Event on a provider's ProviderHealth after a sweep deleted the
/// orphaned instances `ids` (none: no Event): how many, and the first
/// [`NOTE_NAMES`] of them.
pub fn collected_note(ids: &[String]) -> Option<Note> {
    if ids.is_empty() {
        return None;
    }
    let shown = ids.iter().take(NOTE_NAMES).cloned().collect::<Vec<_>>();
    let more = ids.len() - shown.len();
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let noun = if ids.len() == 1 {
        "instance"
    } else {
        "instances"
    };
    Some(Note {
        severity: Severity::Normal,
        reason: "OrphansCollected",
        action: "Delete",
        text: format!(
            "deleted {} orphaned {noun}: {}{tail}",
            ids.len(),
            shown.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::InstanceState;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    fn inst(id: &str, uid: &str, inst_id: &str, created: Option<i64>) -> Instance {
        Instance {
            uid: uid.into(),
            installation_id: inst_id.into(),
            created_at: created.map(t),
            ..Instance::new(id, InstanceState::Running)
        }
    }

    #[test]
    fn a_sweep_overruns_past_half_the_minimum_age() {
        struct Case {
            name: &'static str,
            elapsed_ms: u64,
            min_age_s: u64,
            want: bool,
        }
        let cases = [
            Case {
                name: "a fresh sweep",
                elapsed_ms: 0,
                min_age_s: 600,
                want: false,
            },
            Case {
                name: "exactly half",
                elapsed_ms: 300_000,
                min_age_s: 600,
                want: false,
            },
            Case {
                name: "just past half",
                elapsed_ms: 300_001,
                min_age_s: 600,
                want: true,
            },
            Case {
                name: "min-age zero protects nothing and stops nothing",
                elapsed_ms: 3_600_000,
                min_age_s: 0,
                want: false,
            },
        ];
        for c in cases {
            let got = overran(
                Duration::from_millis(c.elapsed_ms),
                Duration::from_secs(c.min_age_s),
            );
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn verdict_table() {
        let live: HashSet<String> = ["live-uid".to_string()].into();
        let first_seen: HashMap<String, DateTime<Utc>> = [
            ("seen-long-ago".to_string(), t(0)),
            ("seen-now".into(), t(995)),
        ]
        .into();
        let rules = Rules {
            installation_id: "ours",
            live: &live,
            now: t(1000),
            min_age: Duration::from_secs(600),
            first_seen: &first_seen,
        };
        struct Case {
            name: &'static str,
            instance: Instance,
            want: Verdict,
        }
        let cases = [
            Case {
                name: "old enough",
                instance: inst("a", "u1", "ours", Some(0)),
                want: Verdict::Delete,
            },
            Case {
                name: "exactly the minimum age",
                instance: inst("a", "u1", "ours", Some(400)),
                want: Verdict::Delete,
            },
            Case {
                name: "one second too young",
                instance: inst("a", "u1", "ours", Some(401)),
                want: Verdict::TooYoung,
            },
            Case {
                name: "created in the future",
                instance: inst("a", "u1", "ours", Some(2000)),
                want: Verdict::TooYoung,
            },
            Case {
                name: "another installation",
                instance: inst("a", "u1", "theirs", Some(0)),
                want: Verdict::OtherInstallation,
            },
            Case {
                name: "no installation label",
                instance: inst("a", "u1", "", Some(0)),
                want: Verdict::OtherInstallation,
            },
            Case {
                name: "no uid label",
                instance: inst("a", "", "ours", Some(0)),
                want: Verdict::NoUid,
            },
            Case {
                name: "its Proxy still exists",
                instance: inst("a", "live-uid", "ours", Some(0)),
                want: Verdict::Live,
            },
            // Unknown creation time: counts from first sight.
            Case {
                name: "no creation time, first seen now",
                instance: inst("never-seen", "u1", "ours", None),
                want: Verdict::TooYoung,
            },
            Case {
                name: "no creation time, seen recently",
                instance: inst("seen-now", "u1", "ours", None),
                want: Verdict::TooYoung,
            },
            Case {
                name: "no creation time, seen long ago",
                instance: inst("seen-long-ago", "u1", "ours", None),
                want: Verdict::Delete,
            },
        ];
        for c in cases {
            assert_eq!(verdict(&c.instance, &rules), c.want, "{}", c.name);
        }
    }

    #[test]
    fn budget_caps_deletes_across_calls() {
        let live = HashSet::new();
        let fs = HashMap::new();
        let rules = Rules {
            installation_id: "ours",
            live: &live,
            now: t(1000),
            min_age: Duration::from_secs(1),
            first_seen: &fs,
        };
        let list = vec![
            inst("a", "u1", "ours", Some(0)),
            inst("b", "", "ours", Some(0)),
            inst("c", "u3", "ours", Some(0)),
            inst("d", "u4", "ours", Some(0)),
        ];
        let mut budget = 2;
        assert_eq!(
            select(&list, &rules, &mut budget),
            [
                Verdict::Delete,
                Verdict::NoUid,
                Verdict::Delete,
                Verdict::OverBudget
            ]
        );
        assert_eq!(budget, 0);
        // A second provider in the same sweep gets nothing.
        assert_eq!(
            select(&list[..1], &rules, &mut budget),
            [Verdict::OverBudget]
        );
    }

    #[test]
    fn first_seen_is_stamped_kept_and_forgotten_per_provider() {
        let mut fs = HashMap::new();
        let a = inst("a", "u", "ours", None);
        let b = inst("b", "u", "ours", Some(0));
        track_first_seen(&mut fs, "p1", &[a.clone(), b.clone()], t(10));
        track_first_seen(&mut fs, "p2", std::slice::from_ref(&a), t(11));
        assert_eq!(fs.len(), 2, "only unknown creation times are tracked");
        track_first_seen(&mut fs, "p1", std::slice::from_ref(&a), t(20));
        assert_eq!(fs["p1/a"], t(10), "kept");
        assert_eq!(
            first_seen_of(&fs, "p1"),
            HashMap::from([("a".into(), t(10))])
        );
        track_first_seen(&mut fs, "p1", &[], t(30));
        assert!(!fs.contains_key("p1/a"), "forgotten once gone");
        assert_eq!(fs["p2/a"], t(11), "other providers untouched");
    }

    #[test]
    fn collected_orphans_make_one_bounded_note() {
        struct Case {
            name: &'static str,
            deleted: usize,
            want: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "nothing deleted: no Event",
                deleted: 0,
                want: None,
            },
            Case {
                name: "one",
                deleted: 1,
                want: Some("deleted 1 orphaned instance: px-0"),
            },
            Case {
                name: "all listed up to the bound",
                deleted: 10,
                want: Some("deleted 10 orphaned instances: px-0, px-1, px-2, px-3, px-4, px-5, px-6, px-7, px-8, px-9"),
            },
            Case {
                name: "over the bound: the rest counted",
                deleted: 12,
                want: Some("deleted 12 orphaned instances: px-0, px-1, px-2, px-3, px-4, px-5, px-6, px-7, px-8, px-9 and 2 more"),
            },
        ];
        for c in cases {
            let ids: Vec<String> = (0..c.deleted).map(|i| format!("px-{i}")).collect();
            let got = collected_note(&ids);
            assert_eq!(got.as_ref().map(|n| n.text.as_str()), c.want, "{}", c.name);
            assert!(
                got.iter().all(|n| n.reason == "OrphansCollected"),
                "{}",
                c.name
            );
        }
    }
}
