//! Container restarts: whether to restart, and kubelet's crash-loop
//! back-off, capped lower so tests stay fast.
//!
//! The first restart is immediate; then 10 s, 20 s, 40 s, 40 s, ... (kubelet
//! caps at 5 min). A container that ran for 10 minutes starts over.

use std::time::Duration;

pub const INITIAL: Duration = Duration::from_secs(10);
pub const CAP: Duration = Duration::from_secs(40);
pub const RESET_AFTER: Duration = Duration::from_secs(600);

/// Whether a container that exited with `exit_code` runs again.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The back-off state of one container.
#[derive(Debug, Default, Clone)]
pub struct Backoff {
    streak: u32,
}

impl Backoff {
    /// The delay before the next start, after a run that lasted `ran_for`.
    pub fn next(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= RESET_AFTER {
            self.streak = 0;
        }
        let delay = match self.streak {
            0 => Duration::ZERO,
            n => INITIAL.saturating_mul(1u32 << (n - 1).min(16)).min(CAP),
        };
        self.streak = self.streak.saturating_add(1);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_policies() {
        let cases = [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 137, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ];
        for (policy, code, want) in cases {
            assert_eq!(should_restart(policy, code), want, "{policy} {code}");
        }
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let short = Duration::from_secs(1);
        let got: Vec<u64> = (0..6).map(|_| b.next(short).as_secs()).collect();
        assert_eq!(got, vec![0, 10, 20, 40, 40, 40]);
        assert_eq!(b.next(RESET_AFTER), Duration::ZERO);
        assert_eq!(b.next(short), INITIAL);
    }
}
