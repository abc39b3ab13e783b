//! Which jobs run, with how many test threads, in which order: the longest
//! first (by the last run's times), so that the long binaries start at
//! once and the short ones fill the gaps.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::cargo::Binary;

/// What a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// A test executable, run from its package's root.
    Test { path: PathBuf, cwd: PathBuf },
    /// A shell command (`sh -c`), run from the workspace root.
    Shell(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub name: String,
    pub program: Program,
    /// libtest's `--test-threads`; None keeps its default (the cores).
    pub threads: Option<usize>,
    pub estimate: Duration,
}

/// Binaries whose tests mostly wait on real parts (clusters, VMs, real-time
/// policies) rather than compute: more of their tests run at once than
/// there are cores. Others keep libtest's default.
const THREADS: &[(&str, usize)] = &[("control_plane", 4), ("e2e", 4)];

/// Times for a first run with no history (a clean `.ci/run`, 2 cores).
const FIRST_ESTIMATES: &[(&str, u64)] = &[
    ("control_plane", 546),
    ("e2e", 372),
    ("faults", 300),
    ("fuzz-api", 200),
    ("kvm", 144),
    ("e2e_samples", 90),
    ("discovery_abuse", 60),
    ("e2e_install", 60),
    ("newcomer", 60),
    ("e2e_helm", 45),
];

/// Every job, longest first. `only`, when not empty, keeps the jobs it
/// names.
pub fn jobs(
    binaries: Vec<Binary>,
    shells: Vec<(String, String)>,
    history: &HashMap<String, Duration>,
    only: &[String],
) -> Vec<Job> {
    let estimate = |name: &str| {
        history.get(name).copied().unwrap_or_else(|| {
            FIRST_ESTIMATES
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(Duration::from_secs(20), |(_, s)| Duration::from_secs(*s))
        })
    };
    let threads = |name: &str| THREADS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
    let tests = binaries.into_iter().map(|b| Job {
        estimate: estimate(&b.name),
        threads: threads(&b.name),
        program: Program::Test {
            path: b.path,
            cwd: b.cwd,
        },
        name: b.name,
    });
    let shells = shells.into_iter().map(|(name, cmd)| Job {
        estimate: estimate(&name),
        threads: None,
        program: Program::Shell(cmd),
        name,
    });
    let mut all: Vec<Job> = tests
        .chain(shells)
        .filter(|j| only.is_empty() || only.contains(&j.name))
        .collect();
    // Ties by name, so the order is the same every run.
    all.sort_by(|a, b| b.estimate.cmp(&a.estimate).then(a.name.cmp(&b.name)));
    all
}

/// The times file: `NAME<TAB>SECONDS` lines; anything else is passed over
/// (a file from an older runner must not stop the run).
pub fn read_history(text: &str) -> HashMap<String, Duration> {
    text.lines()
        .filter_map(|l| {
            let (name, secs) = l.rsplit_once('\t')?;
            let secs: f64 = secs.trim().parse().ok()?;
            (secs.is_finite() && secs >= 0.0)
                .then(|| (name.to_string(), Duration::from_secs_f64(secs)))
        })
        .collect()
}

/// The times file for this run's jobs, merged over the old one's (a run of
/// a few jobs keeps the others' times).
pub fn write_history(old: &HashMap<String, Duration>, ran: &[(String, Duration)]) -> String {
    let mut all = old.clone();
    for (name, took) in ran {
        all.insert(name.clone(), *took);
    }
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| format!("{n}\t{:.1}\n", all[n].as_secs_f64()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(name: &str) -> Binary {
        Binary {
            name: name.to_string(),
            path: PathBuf::from(format!("/t/{name}")),
            cwd: PathBuf::from("/w"),
        }
    }

    fn names(jobs: &[Job]) -> Vec<&str> {
        jobs.iter().map(|j| j.name.as_str()).collect()
    }

    #[test]
    fn the_longest_start_first_by_history_then_by_first_estimates() {
        let history = read_history("kvm\t900\nnewcomer\t5.5\n");
        let jobs = jobs(
            vec![
                bin("newcomer"),
                bin("control_plane"),
                bin("kvm"),
                bin("a"),
                bin("b"),
            ],
            vec![("fuzz-api".into(), "tests/fuzz-api.sh".into())],
            &history,
            &[],
        );
        assert_eq!(
            names(&jobs),
            ["kvm", "control_plane", "fuzz-api", "a", "b", "newcomer"]
        );
        assert_eq!(jobs[1].threads, Some(4));
        assert_eq!(jobs[0].threads, None);
        assert_eq!(jobs[2].program, Program::Shell("tests/fuzz-api.sh".into()));
    }

    #[test]
    fn only_keeps_the_named_jobs() {
        let jobs = jobs(
            vec![bin("e2e"), bin("kvm")],
            vec![("fuzz-api".into(), "x".into())],
            &HashMap::new(),
            &["kvm".to_string(), "fuzz-api".to_string()],
        );
        assert_eq!(names(&jobs), ["fuzz-api", "kvm"]);
    }

    #[test]
    fn history_round_trips_and_keeps_jobs_that_did_not_run() {
        let old = read_history("e2e\t372.0\nbroken line\nkvm\tNaN\nneg\t-1\n");
        assert_eq!(old.len(), 1);
        let text = write_history(&old, &[("kvm".into(), Duration::from_secs(144))]);
        assert_eq!(text, "e2e\t372.0\nkvm\t144.0\n");
        assert_eq!(read_history(&text)["kvm"], Duration::from_secs(144));
    }
}
