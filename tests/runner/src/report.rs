//! The closing report: each job's wall time and counts, the slowest tests,
//! and the one line CI reads.

use std::fmt::Write;
use std::time::Duration;

use crate::libtest::Outcome;

pub struct Row {
    pub name: String,
    pub started: Duration,
    pub took: Duration,
    pub result: Result<(), String>,
    pub outcome: Outcome,
}

pub fn mmss(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

/// The table, in the order the jobs started, then the `slowest` longest
/// tests, then `suite: N passed, N failed`.
pub fn render(rows: &[Row], wall: Duration, slowest: usize) -> String {
    let mut out = String::new();
    let mut rows: Vec<&Row> = rows.iter().collect();
    rows.sort_by_key(|r| r.started);
    let _ = writeln!(
        out,
        "\n| job | started | wall | passed | failed | ignored | result |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for r in &rows {
        let result = match &r.result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("FAILED ({e})"),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            mmss(r.started),
            mmss(r.took),
            r.outcome.passed,
            r.outcome.failed,
            r.outcome.ignored,
            result
        );
    }
    let mut tests: Vec<(&str, &str, Duration)> = rows
        .iter()
        .flat_map(|r| {
            r.outcome
                .times
                .iter()
                .map(|(t, d)| (r.name.as_str(), t.as_str(), *d))
        })
        .collect();
    tests.sort_by_key(|t| std::cmp::Reverse(t.2));
    if !tests.is_empty() {
        let _ = writeln!(out, "\nslowest tests:\n\n| test | time |\n|---|---|");
        for (job, test, d) in tests.iter().take(slowest) {
            let _ = writeln!(out, "| {job} {test} | {} |", mmss(*d));
        }
    }
    let passed: u64 = rows.iter().map(|r| r.outcome.passed).sum();
    // A job that failed without a failed test (a crash, a timeout, a script
    // error) counts as one failure, so the line never reads clean.
    let failed: u64 = rows
        .iter()
        .map(|r| match (&r.result, r.outcome.failed) {
            (Err(_), 0) => 1,
            (_, n) => n,
        })
        .sum();
    let _ = writeln!(out, "\nwall time {}", mmss(wall));
    let _ = writeln!(out, "suite: {passed} passed, {failed} failed");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, started: u64, result: Result<(), String>, passed: u64, failed: u64) -> Row {
        Row {
            name: name.into(),
            started: Duration::from_secs(started),
            took: Duration::from_secs(75),
            result,
            outcome: Outcome {
                passed,
                failed,
                times: vec![(format!("{name}_t"), Duration::from_secs(started + 1))],
                ..Outcome::default()
            },
        }
    }

    #[test]
    fn a_crashed_job_counts_as_a_failure_and_rows_follow_start_order() {
        let text = render(
            &[
                row("late", 10, Ok(()), 3, 0),
                row("crashed", 0, Err("signal: 9".into()), 2, 0),
                row("red", 5, Err("exit status: 101".into()), 1, 2),
            ],
            Duration::from_secs(125),
            2,
        );
        assert!(
            text.ends_with("\nwall time 2:05\nsuite: 6 passed, 3 failed\n"),
            "{text}"
        );
        let crashed = text.find("| crashed | 0:00 | 1:15 |").unwrap();
        assert!(crashed < text.find("| late |").unwrap());
        assert!(text.contains("FAILED (signal: 9)"));
        assert!(
            text.contains("| late late_t | 0:11 |\n| red red_t | 0:06 |\n\n"),
            "{text}"
        );
    }
}
