//! `perf stat` counters of a process: its CPU time and, where the machine
//! exposes them (a virtual machine often does not), instructions and
//! cycles. perf missing or refused: every counter reads "not measured".

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

const EVENTS: &str = "task-clock,instructions,cycles,context-switches";

/// What perf counted; none: not counted (not supported, or no perf).
#[derive(Clone, Copy, Default, Debug)]
pub struct Counters {
    pub task_clock_ms: Option<f64>,
    pub instructions: Option<f64>,
    pub cycles: Option<f64>,
    pub context_switches: Option<f64>,
}

/// The words before a command that perf counts into `file`.
pub fn stat_prefix(file: &Path) -> Vec<OsString> {
    ["perf", "stat", "-x", ",", "-e", EVENTS, "-o"]
        .into_iter()
        .map(OsString::from)
        .chain([file.as_os_str().to_owned(), "--".into()])
        .collect()
}

/// perf attached to a running process for a while.
pub struct Running {
    child: Option<std::process::Child>,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    /// The counters, once the window has passed.
    pub fn wait(mut self) -> Counters {
        match self.child.take() {
            Some(mut c) => {
                let _ = c.wait();
                Counters::read(&self.file)
            }
            None => Counters::default(),
        }
    }
}

impl Counters {
    /// Counts `pid` for `window`.
    pub fn during(pid: u32, window: Duration) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("perf.csv");
        let child = std::process::Command::new("perf")
            .args(["stat", "-x", ",", "-e", EVENTS, "-o"])
            .arg(&file)
            .args(["-p", &pid.to_string(), "--", "sleep"])
            .arg(format!("{:.3}", window.as_secs_f64()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok();
        Running {
            child,
            file,
            _dir: dir,
        }
    }

    /// Reads perf's CSV output.
    pub fn read(file: &Path) -> Counters {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        Counters::parse(&text)
    }

    fn parse(text: &str) -> Counters {
        let mut c = Counters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split(',').collect();
            let (Some(value), Some(event)) = (f.first(), f.get(2)) else {
                continue;
            };
            let v = value.parse::<f64>().ok();
            match event.split(':').next().unwrap_or("") {
                "task-clock" => c.task_clock_ms = v,
                "instructions" => c.instructions = v,
                "cycles" => c.cycles = v,
                "context-switches" => c.context_switches = v,
                _ => {}
            }
        }
        c
    }

    /// Instructions per unit of work, or why not.
    pub fn instructions_per(&self, work: f64) -> String {
        match self.instructions {
            Some(i) if work > 0.0 => format!("{:.0}", i / work),
            Some(_) => "no work".into(),
            None => "not counted here".into(),
        }
    }
}

#[test]
fn perf_csv_is_read_and_unsupported_counters_stay_unknown() {
    let text = "# started on x\n\n1534.51,msec,task-clock,1534510000,100.00,1.530,CPUs utilized\n<not supported>,,instructions,0,100.00,,\n812345,,cycles,1534510000,100.00,,\n120,,context-switches,1534510000,100.00,78.2,/sec\n";
    let c = Counters::parse(text);
    assert_eq!(c.task_clock_ms, Some(1534.51));
    assert_eq!(c.instructions, None);
    assert_eq!(c.cycles, Some(812345.0));
    assert_eq!(c.context_switches, Some(120.0));
    assert_eq!(c.instructions_per(10.0), "not counted here");
}
