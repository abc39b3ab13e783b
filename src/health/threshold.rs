//! Threshold logic: pure folding of probe results into a verdict, and the
//! rule that decides which results are worth a status write.

/// Consecutive results needed to flip a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Successes to turn healthy.
    pub success: u32,
    /// Failures to turn unhealthy.
    pub failure: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            success: 2,
            failure: 3,
        }
    }
}

/// A latency change is material when it moves by more than this many
/// milliseconds **and** by more than [`MATERIAL_LATENCY_RATIO`] of the
/// last reported value: both, so neither 2 → 5 ms nor 900 → 1000 ms
/// writes a status.
pub const MATERIAL_LATENCY_MS: u64 = 100;
/// See [`MATERIAL_LATENCY_MS`].
pub const MATERIAL_LATENCY_RATIO: f64 = 0.5;

/// Per-proxy health state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// The current verdict; `None` before the first result.
    pub healthy: Option<bool>,
    /// Consecutive successes so far.
    pub successes: u32,
    /// Consecutive failures so far.
    pub failures: u32,
    /// Latency of the last status-affecting result.
    pub reported_latency_ms: Option<u64>,
    /// When (engine clock, ms) a result of this proxy last reached the
    /// status; set by the engine, not by [`fold`].
    pub written_ms: Option<u64>,
    /// The last result's latency already differed materially from the
    /// reported one: a second such result in a row is a change.
    pub moved: bool,
}

/// Why a result affects status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The very first result.
    First,
    /// A threshold was crossed: the verdict flipped.
    Flip,
    /// Same verdict (healthy), materially different latency.
    Latency,
}

/// Whether `new` differs materially from `old`.
pub fn material_latency(old: u64, new: u64) -> bool {
    let delta = old.abs_diff(new);
    delta > MATERIAL_LATENCY_MS && (delta as f64) > (old as f64) * MATERIAL_LATENCY_RATIO
}

/// Folds one result into the state. Returns the new state and, when the
/// result must reach the Proxy's status, why. A latency change counts when
/// two results in a row show it: one probe stalled by a busy machine or a
/// lost packet does not rewrite the status.
pub fn fold(state: State, ok: bool, latency_ms: u64, t: Thresholds) -> (State, Option<Change>) {
    let mut s = state;
    if ok {
        s.successes = s.successes.saturating_add(1);
        s.failures = 0;
    } else {
        s.failures = s.failures.saturating_add(1);
        s.successes = 0;
    }
    let change = match s.healthy {
        None => {
            s.healthy = Some(ok);
            Some(Change::First)
        }
        Some(false) if ok && s.successes >= t.success.max(1) => {
            s.healthy = Some(true);
            Some(Change::Flip)
        }
        Some(true) if !ok && s.failures >= t.failure.max(1) => {
            s.healthy = Some(false);
            Some(Change::Flip)
        }
        Some(true) if ok => {
            let material = s
                .reported_latency_ms
                .is_some_and(|old| material_latency(old, latency_ms));
            let again = material && s.moved;
            s.moved = material;
            again.then_some(Change::Latency)
        }
        _ => None,
    };
    if !ok {
        s.moved = false;
    }
    if change.is_some() {
        s.reported_latency_ms = Some(latency_ms);
        s.moved = false;
    }
    (s, change)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        success: 2,
        failure: 3,
    };

    /// Runs a sequence of (ok, latency) and returns the verdict and change
    /// after each step.
    fn run(seq: &[(bool, u64)], t: Thresholds) -> Vec<(Option<bool>, Option<Change>)> {
        let mut s = State::default();
        seq.iter()
            .map(|(ok, ms)| {
                let (n, c) = fold(s, *ok, *ms, t);
                s = n;
                (s.healthy, c)
            })
            .collect()
    }

    #[test]
    fn verdict_table() {
        use Change::*;
        let y = Some(true);
        let n = Some(false);
        struct Case {
            name: &'static str,
            /// Each result as (ok, latency in ms).
            steps: &'static [(bool, u64)],
            /// The verdict and change after each step.
            want: Vec<(Option<bool>, Option<Change>)>,
        }
        let cases = [
            Case {
                name: "first ok",
                steps: &[(true, 10)],
                want: vec![(y, Some(First))],
            },
            Case {
                name: "first fail",
                steps: &[(false, 10)],
                want: vec![(n, Some(First))],
            },
            Case {
                name: "two failures do not flip, the third does",
                steps: &[(true, 10), (false, 10), (false, 10), (false, 10)],
                want: vec![(y, Some(First)), (y, None), (y, None), (n, Some(Flip))],
            },
            Case {
                name: "a success resets the failure count",
                steps: &[
                    (true, 10),
                    (false, 10),
                    (false, 10),
                    (true, 10),
                    (false, 10),
                    (false, 10),
                ],
                want: vec![
                    (y, Some(First)),
                    (y, None),
                    (y, None),
                    (y, None),
                    (y, None),
                    (y, None),
                ],
            },
            Case {
                name: "two successes to recover",
                steps: &[(false, 10), (true, 10), (true, 10), (true, 10)],
                want: vec![(n, Some(First)), (n, None), (y, Some(Flip)), (y, None)],
            },
            Case {
                name: "failures while unhealthy are silent",
                steps: &[(false, 10), (false, 10), (false, 5000)],
                want: vec![(n, Some(First)), (n, None), (n, None)],
            },
            Case {
                name: "material latency change while healthy, twice in a row",
                steps: &[
                    (true, 100),
                    (true, 190),
                    (true, 260),
                    (true, 300),
                    (true, 310),
                ],
                want: vec![
                    (y, Some(First)),
                    (y, None),
                    (y, None),
                    (y, Some(Latency)),
                    (y, None),
                ],
            },
            Case {
                name: "latency drop is material too",
                steps: &[(true, 1000), (true, 400), (true, 420)],
                want: vec![(y, Some(First)), (y, None), (y, Some(Latency))],
            },
            Case {
                name: "one stalled probe between normal ones writes nothing",
                steps: &[(true, 5), (true, 400), (true, 5), (true, 300), (true, 6)],
                want: vec![(y, Some(First)), (y, None), (y, None), (y, None), (y, None)],
            },
        ];
        for c in cases {
            assert_eq!(run(c.steps, T), c.want, "{}", c.name);
        }
    }

    #[test]
    fn thresholds_of_one_flip_at_once() {
        let t = Thresholds {
            success: 1,
            failure: 1,
        };
        let got = run(&[(true, 1), (false, 1), (true, 1)], t);
        assert_eq!(
            got,
            vec![
                (Some(true), Some(Change::First)),
                (Some(false), Some(Change::Flip)),
                (Some(true), Some(Change::Flip)),
            ]
        );
    }

    #[test]
    fn materiality_needs_both_bounds() {
        struct Case {
            name: &'static str,
            old_ms: u64,
            new_ms: u64,
            want: bool,
        }
        let cases = [
            Case {
                name: "the ratio is material, the absolute change is not",
                old_ms: 2,
                new_ms: 5,
                want: false,
            },
            Case {
                name: "absolute change too small",
                old_ms: 900,
                new_ms: 1000,
                want: false,
            },
            Case {
                name: "absolute change material, the ratio is not",
                old_ms: 1000,
                new_ms: 1400,
                want: false,
            },
            Case {
                name: "both material",
                old_ms: 100,
                new_ms: 201,
                want: true,
            },
            Case {
                name: "both material, downwards",
                old_ms: 300,
                new_ms: 100,
                want: true,
            },
            Case {
                name: "from zero",
                old_ms: 0,
                new_ms: 101,
                want: true,
            },
        ];
        for c in cases {
            assert_eq!(
                material_latency(c.old_ms, c.new_ms),
                c.want,
                "{}: {} -> {}",
                c.name,
                c.old_ms,
                c.new_ms
            );
        }
    }
}
