//! `test-runner`: the test phase of `make test`. Builds every test target
//! once (`cargo test --no-run`), then runs the binaries side by side,
//! longest first, each with its output in a file of its own, printed whole
//! when it ends; closes with a table of where the time went, the slowest
//! tests and `suite: N passed, N failed`. Exit code 1 when any job failed.
//!
//! ```text
//! test-runner [--jobs N] [--only A,B] [--also NAME=SHELL]... [--timeout-mins M] [--list] [-- CARGO_TEST_ARGS]
//! ```

mod cargo;
mod libtest;
mod plan;
mod pool;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Args {
    jobs: usize,
    only: Vec<String>,
    also: Vec<(String, String)>,
    timeout: Duration,
    list: bool,
    cargo_args: Vec<String>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        jobs: std::env::var("TEST_JOBS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4),
        only: Vec::new(),
        also: Vec::new(),
        timeout: Duration::from_secs(30 * 60),
        list: false,
        cargo_args: Vec::new(),
    };
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--jobs" => {
                a.jobs = value("--jobs")?
                    .parse()
                    .map_err(|e| format!("--jobs: {e}"))?;
            }
            "--only" => a.only.extend(value("--only")?.split(',').map(String::from)),
            "--also" => {
                let v = value("--also")?;
                let (name, cmd) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--also {v}: expected NAME=SHELL_COMMAND"))?;
                a.also.push((name.to_string(), cmd.to_string()));
            }
            "--timeout-mins" => {
                let m: u64 = value("--timeout-mins")?
                    .parse()
                    .map_err(|e| format!("--timeout-mins: {e}"))?;
                a.timeout = Duration::from_secs(m * 60);
            }
            "--list" => a.list = true,
            "--" => a.cargo_args.extend(it.by_ref()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("test-runner: {e}");
            return ExitCode::from(2);
        }
    };
    let target =
        PathBuf::from(std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into()));
    let times_file = target.join("test-runner/times.tsv");
    let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let binaries = match cargo::build(&cargo_bin, &args.cargo_args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("test-runner: {e}");
            return ExitCode::from(1);
        }
    };
    let history = plan::read_history(&std::fs::read_to_string(&times_file).unwrap_or_default());
    let jobs = plan::jobs(binaries, args.also, &history, &args.only);
    if jobs.is_empty() {
        eprintln!("test-runner: no job matches --only {}", args.only.join(","));
        return ExitCode::from(2);
    }
    println!(
        "test-runner: {} jobs, {} at a time, longest first:",
        jobs.len(),
        args.jobs
    );
    for j in &jobs {
        let threads = j
            .threads
            .map(|t| format!(", {t} test threads"))
            .unwrap_or_default();
        println!("  {} (about {}{threads})", j.name, report::mmss(j.estimate));
    }
    if args.list {
        return ExitCode::SUCCESS;
    }

    let start = Instant::now();
    let mut rows = Vec::new();
    let logs = target.join("test-runner/logs");
    let ran = pool::run(jobs, args.jobs, &logs, args.timeout, |event| match event {
        pool::Event::Started { name, at } => println!("[{}] start {name}", report::mmss(at)),
        pool::Event::Running { at, names } => {
            println!("[{}] still running: {}", report::mmss(at), names.join(", "));
        }
        pool::Event::Finished(f) => {
            let text = std::fs::read_to_string(&f.log).unwrap_or_default();
            let outcome = libtest::read(&text);
            let verdict = match &f.result {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("FAILED: {e}"),
            };
            println!(
                "\n[{}] ======== {} {verdict} in {} ({} passed, {} failed) ========",
                report::mmss(f.at),
                f.name,
                report::mmss(f.took),
                outcome.passed,
                outcome.failed
            );
            print!("{text}");
            println!("======== end of {} ========\n", f.name);
            rows.push(report::Row {
                name: f.name,
                started: f.at.saturating_sub(f.took),
                took: f.took,
                result: f.result,
                outcome,
            });
        }
    });
    if let Err(e) = ran {
        eprintln!("test-runner: {e}");
        return ExitCode::from(1);
    }
    print!("{}", report::render(&rows, start.elapsed(), 20));
    let times: Vec<(String, Duration)> = rows.iter().map(|r| (r.name.clone(), r.took)).collect();
    let _ = std::fs::create_dir_all(target.join("test-runner"));
    if let Err(e) = std::fs::write(&times_file, plan::write_history(&history, &times)) {
        eprintln!(
            "test-runner: could not keep the times in {}: {e}",
            times_file.display()
        );
    }
    if rows.iter().all(|r| r.result.is_ok()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_and_cargo_args() {
        let a = args(&[
            "--jobs",
            "3",
            "--only",
            "kvm,e2e",
            "--also",
            "fuzz=tests/fuzz-api.sh x=1",
            "--",
            "--no-default-features",
            "--workspace",
        ])
        .unwrap();
        assert_eq!(a.jobs, 3);
        assert_eq!(a.only, ["kvm", "e2e"]);
        assert_eq!(
            a.also,
            [("fuzz".to_string(), "tests/fuzz-api.sh x=1".to_string())]
        );
        assert_eq!(a.cargo_args, ["--no-default-features", "--workspace"]);
    }

    #[test]
    fn bad_flags_say_which() {
        assert!(args(&["--jobs"])
            .unwrap_err()
            .contains("--jobs needs a value"));
        assert!(args(&["--also", "nocmd"])
            .unwrap_err()
            .contains("NAME=SHELL_COMMAND"));
        assert!(args(&["--frobnicate"])
            .unwrap_err()
            .contains("--frobnicate"));
    }
}
