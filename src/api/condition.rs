//! Standard Kubernetes conditions with the apimachinery validation rules,
//! and set-condition semantics (transition time moves only on a status flip).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Status of a condition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It cannot be told whether the condition holds.
    #[default]
    Unknown,
}

impl ConditionStatus {
    /// The spelling used in the API (`True`, `False`, `Unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// One aspect of an object's current state (the standard condition shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of the condition in CamelCase, e.g. `Ready`, `Provisioned`, `Healthy`.
    #[schemars(length(max = 316))]
    #[schemars(regex(
        pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
    ))]
    #[serde(rename = "type")]
    pub type_: String,
    /// Status of the condition: True, False or Unknown.
    pub status: ConditionStatus,
    /// Machine-readable CamelCase reason for the condition's last change.
    #[schemars(length(min = 1, max = 1024))]
    #[schemars(regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"))]
    pub reason: String,
    /// Human-readable details about the last change.
    #[schemars(length(max = 32768))]
    pub message: String,
    /// When the status last changed.
    pub last_transition_time: DateTime<Utc>,
    /// The `metadata.generation` the condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// A condition as first observed at `now`.
    pub fn new(
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
        now: DateTime<Utc>,
    ) -> Self {
        Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message: message.into(),
            last_transition_time: now,
            observed_generation: None,
        }
    }

    /// Records the generation the condition describes.
    pub fn at_generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }
}

/// Finds the condition of `type_`.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Inserts or updates a condition with set-condition semantics: the
/// transition time is kept unless the status changes; reason, message and
/// generation are updated in place. Returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        None => {
            conditions.push(new);
            true
        }
        Some(old) => {
            let transition = if old.status == new.status {
                old.last_transition_time
            } else {
                new.last_transition_time
            };
            let updated = Condition {
                last_transition_time: transition,
                ..new
            };
            if *old == updated {
                false
            } else {
                *old = updated;
                true
            }
        }
    }
}

/// Removes the condition of `type_`; returns whether it was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    #[test]
    fn set_condition_semantics() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "A", "m1", t(0))
        ));
        // Same status, new reason and message: updated in place, time kept.
        assert!(set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "B", "m2", t(5))
        ));
        assert_eq!(cs[0].last_transition_time, t(0));
        assert_eq!(cs[0].reason, "B");
        assert_eq!(cs[0].message, "m2");
        // Identical: no change reported.
        assert!(!set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "B", "m2", t(9))
        ));
        // Status flips: the transition time moves.
        assert!(set(
            &mut cs,
            Condition::new("Ready", ConditionStatus::True, "B", "m2", t(10))
        ));
        assert_eq!(cs[0].last_transition_time, t(10));
        // Other types are independent.
        assert!(set(
            &mut cs,
            Condition::new("Healthy", ConditionStatus::True, "Ok", "", t(11))
        ));
        assert_eq!(cs.len(), 2);
        assert_eq!(find(&cs, "Healthy").unwrap().reason, "Ok");
        assert!(remove(&mut cs, "Healthy"));
        assert!(!remove(&mut cs, "Healthy"));
        assert!(find(&cs, "Healthy").is_none());
    }

    #[test]
    fn generation_change_is_a_change() {
        let mut cs = vec![
            Condition::new("P", ConditionStatus::False, "R", "m", t(0)).at_generation(Some(1))
        ];
        assert!(set(
            &mut cs,
            Condition::new("P", ConditionStatus::False, "R", "m", t(1)).at_generation(Some(2))
        ));
        assert_eq!(cs[0].observed_generation, Some(2));
        assert_eq!(cs[0].last_transition_time, t(0));
    }
}
