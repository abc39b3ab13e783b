use chrono::TimeZone;

use super::*;
use crate::fleet::DrainDone;

fn at(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
}

/// A Ready, unleased, up-to-date member created at second `age`.
fn m(name: &str, age: i64) -> Member {
    Member {
        name: name.into(),
        ready: true,
        leased: false,
        created: at(age),
        deleting: false,
        removing: None,
        up_to_date: true,
        held: None,
    }
}

fn not_ready(mut x: Member) -> Member {
    x.ready = false;
    x
}

fn leased(mut x: Member) -> Member {
    x.leased = true;
    x
}

fn draining(mut x: Member, step: DrainStep) -> Member {
    x.removing = Some(step);
    x
}

fn create(n: &str) -> Step {
    Step::Create(n.into())
}
fn down(n: &str) -> Step {
    Step::ScaleDown(n.into())
}

#[test]
fn the_plan_scales_by_table() {
    let wait = DrainStep::Wait { until: at(500) };
    let done = DrainStep::Replace(DrainDone::NoLeases);
    let cases: Vec<(&str, i32, Vec<Member>, Vec<Step>)> =
        vec![
        (
            "an empty pool creates every member under the lowest names",
            3,
            vec![],
            vec![create("eu-0"), create("eu-1"), create("eu-2")],
        ),
        (
            "names in use are skipped, a Proxy being deleted too",
            3,
            vec![m("eu-0", 1), {
                let mut d = m("eu-1", 2);
                d.deleting = true;
                d
            }],
            vec![create("eu-2"), create("eu-3")],
        ),
        ("at its size nothing happens", 2, vec![m("eu-0", 1), m("eu-1", 2)], vec![]),
        (
            "scale-down takes the not Ready first, then the unleased, then the oldest",
            1,
            vec![
                leased(m("eu-0", 1)),
                m("eu-1", 2),
                not_ready(leased(m("eu-2", 3))),
                m("eu-3", 0),
            ],
            vec![down("eu-2"), down("eu-3"), down("eu-1")],
        ),
        (
            "a leased member is scaled down only when every other is leased too, the oldest first",
            1,
            vec![leased(m("eu-0", 5)), leased(m("eu-1", 2))],
            vec![down("eu-1")],
        ),
        (
            "a drained member is deleted, one still draining waits",
            1,
            vec![m("eu-0", 1), draining(m("eu-1", 2), done), draining(m("eu-2", 3), wait)],
            vec![Step::Delete("eu-1".into())],
        ),
        (
            "growing back keeps the newest draining member before creating",
            3,
            vec![
                m("eu-0", 1),
                draining(leased(m("eu-1", 2)), wait),
                draining(m("eu-2", 3), wait),
            ],
            vec![Step::Keep("eu-2".into()), Step::Keep("eu-1".into())],
        ),
        (
            "growing past the draining ones keeps them all and creates the rest",
            4,
            vec![draining(m("eu-0", 2), wait)],
            vec![
                Step::Keep("eu-0".into()),
                create("eu-1"),
                create("eu-2"),
                create("eu-3"),
            ],
        ),
        (
            "kept members from an older template are rewritten, leaving ones are not",
            1,
            vec![
                {
                    let mut x = m("eu-0", 1);
                    x.up_to_date = false;
                    x
                },
                {
                    let mut x = draining(m("eu-1", 2), wait);
                    x.up_to_date = false;
                    x
                },
            ],
            vec![Step::Update("eu-0".into())],
        ),
        (
            "zero replicas scales every member down",
            0,
            vec![m("eu-0", 1), leased(m("eu-1", 2))],
            vec![down("eu-0"), down("eu-1")],
        ),
    ];
    for (name, desired, members, want) in cases {
        assert_eq!(
            plan("eu", desired, &members, &BTreeSet::new()).steps,
            want,
            "{name}"
        );
    }
    let taken = BTreeSet::from(["eu-0".to_string(), "eu-2".to_string()]);
    assert_eq!(
        plan("eu", 2, &[], &taken).steps,
        vec![create("eu-1"), create("eu-3")],
        "a name another Proxy of the namespace holds is skipped"
    );
}

#[test]
fn the_counts_describe_what_the_pool_keeps() {
    let wait = DrainStep::Wait { until: at(500) };
    let members = vec![
        leased(m("eu-0", 1)),
        not_ready(m("eu-1", 2)),
        {
            let mut x = m("eu-2", 3);
            x.up_to_date = false;
            x
        },
        draining(leased(m("eu-3", 4)), wait),
        {
            let mut d = m("eu-4", 5);
            d.deleting = true;
            d
        },
    ];
    let p = plan("eu", 3, &members, &BTreeSet::new());
    assert_eq!(
        p.counts,
        Counts {
            replicas: 4,
            ready: 2,
            leased: 1,
            updated: 2,
            kept: 3,
        }
    );
    assert!(!p.counts.settled(3));
    assert_eq!(p.wake, Some(at(500)), "a drain's end wakes the pool");
    let steady = plan(
        "eu",
        2,
        &[m("eu-0", 1), leased(m("eu-1", 2))],
        &BTreeSet::new(),
    );
    assert!(steady.counts.settled(2));
    assert_eq!(steady.wake, None);
}

#[test]
fn a_template_change_is_written_as_a_merge_patch_that_removes_what_went() {
    use serde_json::json;
    let cases = [
        (
            "same: nothing",
            json!({"port": 3128, "attributes": {"a": "1"}}),
            json!({"port": 3128, "attributes": {"a": "1"}}),
            json!({}),
        ),
        (
            "a changed value, a new key, a removed key, a removed map entry",
            json!({"port": 3128, "cloudInit": {"inline": "x"}, "attributes": {"a": "1", "b": "2"}}),
            json!({"port": 3129, "recycle": {"maxAge": "1h"}, "attributes": {"a": "1"}}),
            json!({"port": 3129, "recycle": {"maxAge": "1h"}, "cloudInit": null, "attributes": {"b": null}}),
        ),
        (
            "a list is replaced whole",
            json!({"l": [1, 2]}),
            json!({"l": [2]}),
            json!({"l": [2]}),
        ),
    ];
    for (name, cur, want, patch) in cases {
        assert_eq!(merge_diff(&cur, &want), patch, "{name}");
    }
}

#[test]
fn kept_proxies_held_back_by_a_cap_are_counted_with_the_first_ones_words() {
    let held = |mut x: Member, why: &str| {
        x.ready = false;
        x.held = Some((why.into(), format!("{} waits", x.name)));
        x
    };
    let mut draining = held(m("p-3", 1), "CircuitOpen");
    draining.removing = Some(DrainStep::Wait { until: at(0) });
    let members = [
        m("p-0", 30),
        held(m("p-1", 20), "InstanceLimit"),
        held(m("p-2", 10), "InstanceLimit"),
        draining,
    ];
    let p = plan("p", 3, &members, &BTreeSet::new());
    assert_eq!(
        p.held,
        Some((2, "InstanceLimit".to_string(), "p-1 waits".to_string())),
        "the scaled-down one does not count"
    );
    assert_eq!(plan("p", 1, &[m("p-0", 1)], &BTreeSet::new()).held, None);
}
