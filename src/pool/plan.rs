//! What a pool does next, from what it holds: pure, tested by tables
//! (`plan_tests.rs`). The shell (`reconcile.rs`) reads the Proxies and
//! the lease table, asks [`plan`], and carries out its steps.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::fleet::DrainStep;

/// One Proxy of the pool, as the plan needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// Its Ready condition is True.
    pub ready: bool,
    /// It holds at least one lease.
    pub leased: bool,
    /// When it was created.
    pub created: DateTime<Utc>,
    /// It is being deleted.
    pub deleting: bool,
    /// Scaled down since then (the scale-down annotation), and where its
    /// drain stands.
    pub removing: Option<DrainStep>,
    /// Made from the pool's current template.
    pub up_to_date: bool,
    /// Not Ready because a provider cap, quota or the circuit breaker
    /// holds it back: its Provisioned reason and message.
    pub held: Option<(String, String)>,
}

/// A step of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create a Proxy of this name from the template.
    Create(String),
    /// Take this Proxy out of the pool: no new lease, deleted once its
    /// leases end or its drain times out.
    ScaleDown(String),
    /// Keep this Proxy after all (the pool grew back while it drained).
    Keep(String),
    /// Delete this Proxy (its drain is over).
    Delete(String),
    /// Write the current template into this Proxy.
    Update(String),
}

/// The plan's answer: the steps, the status counts, and when to look
/// again at the latest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// In order.
    pub steps: Vec<Step>,
    /// What the status says.
    pub counts: Counts,
    /// A drain ends then: look again.
    pub wake: Option<DateTime<Utc>>,
    /// Kept Proxies held back by a provider cap, quota or the circuit
    /// breaker: how many, and the first one's reason and message.
    pub held: Option<(i32, String, String)>,
}

/// The status's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Members not being deleted.
    pub replicas: i32,
    /// Kept members Ready.
    pub ready: i32,
    /// Kept members holding a lease.
    pub leased: i32,
    /// Kept members up to date.
    pub updated: i32,
    /// Members the pool keeps (neither deleting nor scaled down).
    pub kept: i32,
}

impl Counts {
    /// Every Proxy the pool should keep exists, is Ready and up to date,
    /// and nothing else is left.
    pub fn settled(&self, desired: i32) -> bool {
        self.kept == desired
            && self.ready == desired
            && self.updated == desired
            && self.replicas == desired
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The name of the `i`-th Proxy of `pool`.
pub fn member_name(pool: &str, i: usize) -> String {
    format!("{pool}-{i}")
}

/// What `pool` (wanting `desired` Proxies) does next with `members`.
///
/// - Too few kept: Proxies being scaled down are kept again first (the
///   newest first), then new ones are created under the lowest free
///   names (`<pool>-<n>`; a name in use, by a Proxy of the pool being
///   deleted or by one of another owner in `taken`, is skipped, so a
///   create never collides).
/// - Too many: the excess is scaled down, not Ready first, then those
///   without a lease, then the oldest; a scaled-down Proxy drains (its
///   leases run to their end or the drain timeout) before its delete.
/// - Kept Proxies not made from the current template are rewritten;
///   their replacement then waits for the provider's budget like any
///   spec change.
pub fn plan(pool: &str, desired: i32, members: &[Member], taken: &BTreeSet<String>) -> Plan {
    let desired_n = usize::try_from(desired.max(0)).unwrap_or(0);
    let mut steps = Vec::new();
    let mut wake: Option<DateTime<Utc>> = None;
    let live: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();
    let mut kept: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| m.removing.is_none())
        .collect();
    let mut draining: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| m.removing.is_some())
        .collect();

    if kept.len() < desired_n {
        // The newest drains first: they are the least likely to have lost
        // their leases' holders.
        draining.sort_by(|a, b| b.created.cmp(&a.created).then(a.name.cmp(&b.name)));
        let back = (desired_n - kept.len()).min(draining.len());
        for m in draining.drain(..back) {
            steps.push(Step::Keep(m.name.clone()));
            kept.push(m);
        }
        let used: BTreeSet<&str> = members
            .iter()
            .map(|m| m.name.as_str())
            .chain(taken.iter().map(String::as_str))
            .collect();
        let mut i = 0;
        let mut creates = desired_n - kept.len();
        while creates > 0 {
            let name = member_name(pool, i);
            if !used.contains(name.as_str()) {
                steps.push(Step::Create(name));
                creates -= 1;
            }
            i += 1;
        }
    } else if kept.len() > desired_n {
        // Worst first: not Ready, then unleased, then oldest.
        kept.sort_by(|a, b| {
            (a.ready, a.leased, a.created, &a.name).cmp(&(b.ready, b.leased, b.created, &b.name))
        });
        let excess = kept.len() - desired_n;
        for m in kept.drain(..excess) {
            steps.push(Step::ScaleDown(m.name.clone()));
        }
    }
    for m in &draining {
        match m.removing {
            Some(DrainStep::Replace(_)) => steps.push(Step::Delete(m.name.clone())),
            Some(DrainStep::Wait { until }) => {
                wake = Some(wake.map_or(until, |w| w.min(until)));
            }
            // Marked, not yet started: the shell starts it with the mark.
            Some(DrainStep::Start) | None => {}
        }
    }
    for m in &kept {
        if !m.up_to_date {
            steps.push(Step::Update(m.name.clone()));
        }
    }
    let counts = Counts {
        replicas: count(live.len()),
        ready: count(kept.iter().filter(|m| m.ready).count()),
        leased: count(kept.iter().filter(|m| m.leased).count()),
        updated: count(kept.iter().filter(|m| m.up_to_date).count()),
        kept: count(kept.len()),
    };
    let mut held_back = kept.iter().filter_map(|m| m.held.as_ref());
    let held = held_back.next().map(|(reason, message)| {
        (
            1 + count(held_back.count()),
            reason.clone(),
            message.clone(),
        )
    });
    Plan {
        steps,
        counts,
        wake,
        held,
    }
}

/// The JSON merge patch (RFC 7386) that turns `cur` into `want`: keys
/// only `cur` has are removed (null), objects are compared key by key,
/// anything else is replaced when it differs.
pub fn merge_diff(cur: &serde_json::Value, want: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Map, Value};
    match (cur, want) {
        (Value::Object(c), Value::Object(w)) => {
            let mut out = Map::new();
            for (k, wv) in w {
                match c.get(k) {
                    Some(cv) if cv == wv => {}
                    Some(cv) if cv.is_object() && wv.is_object() => {
                        out.insert(k.clone(), merge_diff(cv, wv));
                    }
                    _ => {
                        out.insert(k.clone(), wv.clone());
                    }
                }
            }
            for k in c.keys().filter(|k| !w.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        (_, w) => w.clone(),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
