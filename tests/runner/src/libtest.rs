//! What a test binary's output says: its counts (libtest's `test result:`
//! lines) and each test's time (`--report-time`'s `<1.234s>`).

use std::time::Duration;

/// Counts and per-test times of one job's output.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Whether any `test result:` line was seen: a binary that printed
    /// none crashed or was killed before libtest could summarise.
    pub summarised: bool,
    /// (test name, its time) for each test that reported one.
    pub times: Vec<(String, Duration)>,
}

/// Reads libtest's human output.
pub fn read(output: &str) -> Outcome {
    let mut o = Outcome::default();
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("test result: ") {
            o.summarised = true;
            o.passed += count(rest, "passed");
            o.failed += count(rest, "failed");
            o.ignored += count(rest, "ignored");
        } else if let Some((name, time)) = timed(line) {
            o.times.push((name, time));
        }
    }
    o
}

/// `N WORD` in `ok. 5 passed; 0 failed; 1 ignored; ...`.
fn count(summary: &str, word: &str) -> u64 {
    summary
        .split(';')
        .filter_map(|part| {
            let mut it = part.split_whitespace().rev();
            let w = it.next()?;
            let n = it.next()?;
            (w == word).then(|| n.parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// `test a::b ... ok <1.234s>` (also FAILED).
fn timed(line: &str) -> Option<(String, Duration)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.split_once(" ... ")?;
    let secs = result.split_once('<')?.1.strip_suffix("s>")?;
    let secs: f64 = secs.parse().ok()?;
    Some((name.to_string(), Duration::from_secs_f64(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_over_every_summary_and_times_are_per_test() {
        let out = "\nrunning 3 tests\n\
            test a::slow ... ok <12.500s>\n\
            test a::fails ... FAILED <0.010s>\n\
            test a::bench ... ignored\n\
            test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 12.51s\n\
            \nrunning 2 tests\n\
            test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n";
        let o = read(out);
        assert_eq!((o.passed, o.failed, o.ignored), (3, 1, 1));
        assert!(o.summarised);
        assert_eq!(
            o.times,
            vec![
                ("a::slow".to_string(), Duration::from_millis(12_500)),
                ("a::fails".to_string(), Duration::from_millis(10)),
            ]
        );
    }

    #[test]
    fn output_without_a_summary_is_marked() {
        let o = read("running 1 test\nthread 'main' panicked\n");
        assert!(!o.summarised);
        assert_eq!((o.passed, o.failed), (0, 0));
    }

    #[test]
    fn a_printed_line_that_looks_like_a_test_is_not_a_time() {
        assert_eq!(timed("test a ... ok"), None);
        assert_eq!(timed("test a ... ok <soon>"), None);
        assert_eq!(timed("tested a ... ok <1s>"), None);
    }
}
