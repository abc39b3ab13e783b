//! The standard `process_*` series (CPU, resident memory, file
//! descriptors, start time) and `proxy_operator_build_info`, read from
//! /proc/self at every scrape. prometheus-client has no process collector;
//! the few /proc files are parsed here rather than pulling in a crate.
//! Off Linux (no /proc) the process series are simply not printed.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::Registrar;

/// Clock ticks per second of the times in /proc/<pid>/stat. The kernel
/// reports them in USER_HZ, which is 100 on every architecture this
/// operator is built for (the same constant Prometheus' Go procfs uses).
const USER_HZ: f64 = 100.0;

const BUILD_INFO: &str = "proxy_operator_build_info";
const CPU: &str = "process_cpu_seconds";
const RSS: &str = "process_resident_memory_bytes";
const OPEN_FDS: &str = "process_open_fds";
const MAX_FDS: &str = "process_max_fds";
const START: &str = "process_start_time_seconds";

/// A /proc file that does not read as expected: which file, and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{file}: {reason}")]
pub struct ParseError {
    file: &'static str,
    reason: &'static str,
}

fn bad(file: &'static str, reason: &'static str) -> ParseError {
    ParseError { file, reason }
}

/// What the process series print, in their units.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Resident set size.
    pub resident_bytes: i64,
    /// Entries of /proc/self/fd.
    pub open_fds: i64,
    /// The soft limit on open files; `None` when unlimited.
    pub max_fds: Option<i64>,
    /// Unix time the process started.
    pub start_time_seconds: f64,
}

/// CPU ticks (utime + stime) and the start time in ticks since boot, from
/// /proc/self/stat. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
pub fn parse_stat(stat: &str) -> Result<(u64, u64), ParseError> {
    const FILE: &str = "/proc/self/stat";
    let after = stat
        .rsplit_once(')')
        .ok_or_else(|| bad(FILE, "no command name"))?
        .1;
    // After the name: field 3 (state) is index 0, so field N is N - 3.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Result<u64, ParseError> {
        fields
            .get(n - 3)
            .ok_or_else(|| bad(FILE, "too few fields"))?
            .parse()
            .map_err(|_| bad(FILE, "a field is not a number"))
    };
    Ok((field(14)? + field(15)?, field(22)?))
}

/// `VmRSS` of /proc/self/status, in bytes.
pub fn parse_rss(status: &str) -> Result<i64, ParseError> {
    const FILE: &str = "/proc/self/status";
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or_else(|| bad(FILE, "no VmRSS line"))?;
    let kib: i64 = line
        .trim()
        .strip_suffix("kB")
        .ok_or_else(|| bad(FILE, "VmRSS is not in kB"))?
        .trim()
        .parse()
        .map_err(|_| bad(FILE, "VmRSS is not a number"))?;
    Ok(kib.saturating_mul(1024))
}

/// The soft `Max open files` of /proc/self/limits; `None` when unlimited.
pub fn parse_max_fds(limits: &str) -> Result<Option<i64>, ParseError> {
    const FILE: &str = "/proc/self/limits";
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .ok_or_else(|| bad(FILE, "no Max open files line"))?;
    match rest.split_whitespace().next() {
        Some("unlimited") => Ok(None),
        Some(n) => n
            .parse()
            .map(Some)
            .map_err(|_| bad(FILE, "Max open files is not a number")),
        None => Err(bad(FILE, "Max open files has no value")),
    }
}

/// `btime` (boot time, Unix seconds) of /proc/stat.
pub fn parse_boot_time(stat: &str) -> Result<u64, ParseError> {
    const FILE: &str = "/proc/stat";
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .ok_or_else(|| bad(FILE, "no btime line"))?
        .trim()
        .parse()
        .map_err(|_| bad(FILE, "btime is not a number"))
}

/// One reading of /proc for this process.
fn read() -> Result<Sample, ParseError> {
    let file =
        |path: &'static str| std::fs::read_to_string(path).map_err(|_| bad(path, "cannot be read"));
    let (cpu_ticks, start_ticks) = parse_stat(&file("/proc/self/stat")?)?;
    let open = std::fs::read_dir("/proc/self/fd")
        .map_err(|_| bad("/proc/self/fd", "cannot be listed"))?
        .count();
    // Tick counts stay far below 2^53: the conversion to f64 is exact.
    #[allow(clippy::cast_precision_loss)]
    let start = parse_boot_time(&file("/proc/stat")?)? as f64 + start_ticks as f64 / USER_HZ;
    #[allow(clippy::cast_precision_loss)]
    let cpu_seconds = cpu_ticks as f64 / USER_HZ;
    Ok(Sample {
        cpu_seconds,
        resident_bytes: parse_rss(&file("/proc/self/status")?)?,
        // The listing's own descriptor is counted, as Prometheus' Go client does.
        open_fds: i64::try_from(open).unwrap_or(i64::MAX),
        max_fds: parse_max_fds(&file("/proc/self/limits")?)?,
        start_time_seconds: start,
    })
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// `proxy_operator_build_info{version} 1` and the `process_*` series.
#[derive(Debug, Default)]
struct ProcessCollector;

impl ProcessCollector {
    fn encode_process(
        sample: &Sample,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let cpu = ConstCounter::new(sample.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            CPU,
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                RSS,
                "Resident memory size in bytes.",
                Some(sample.resident_bytes),
            ),
            (
                OPEN_FDS,
                "Number of open file descriptors.",
                Some(sample.open_fds),
            ),
            (
                MAX_FDS,
                "Maximum number of open file descriptors.",
                sample.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                ConstGauge::new(v).encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    MetricType::Gauge,
                )?)?;
            }
        }
        ConstGauge::new(sample.start_time_seconds).encode(encoder.encode_descriptor(
            START,
            "Start time of the process since unix epoch in seconds.",
            None,
            MetricType::Gauge,
        )?)
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut info = encoder.encode_descriptor(
            BUILD_INFO,
            "The operator's version; always 1.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1).encode(info.encode_family(&BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_string(),
        })?)?;
        match read() {
            Ok(sample) => Self::encode_process(&sample, &mut encoder),
            // A scrape must not fail for want of /proc: the process series
            // are left out and the reason logged (rarely: only off Linux or
            // with /proc hidden).
            Err(e) => {
                tracing::debug!(error = %e, "Process metrics unavailable");
                Ok(())
            }
        }
    }
}

/// Registers `proxy_operator_build_info` and the process series.
pub fn register(registry: &mut Registrar) {
    registry.register_collector(
        &[BUILD_INFO, CPU, RSS, OPEN_FDS, MAX_FDS, START],
        ProcessCollector,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Case {
        name: &'static str,
        stat: &'static str,
        want: Result<(u64, u64), ParseError>,
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let cases = [
            Case {
                name: "plain",
                stat: "4242 (egress-proxies-) S 1 4242 4242 0 -1 4194560 2500 0 0 0 \
                       730 215 0 0 20 0 9 0 123456 51200000 3000 18446744073709551615",
                want: Ok((945, 123456)),
            },
            Case {
                name: "spaces and parentheses in the name",
                stat: "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 99 0 0",
                want: Ok((3, 99)),
            },
            Case {
                name: "truncated",
                stat: "7 (x) R 1 7 7",
                want: Err(bad("/proc/self/stat", "too few fields")),
            },
            Case {
                name: "no name",
                stat: "7 x R",
                want: Err(bad("/proc/self/stat", "no command name")),
            },
        ];
        for c in cases {
            assert_eq!(parse_stat(c.stat), c.want, "{}", c.name);
        }
    }

    #[test]
    fn status_limits_and_boot_time_parse() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t   10240 kB\nThreads:\t9\n";
        assert_eq!(parse_rss(status), Ok(10_485_760));
        assert_eq!(
            parse_rss("Name:\tx\n"),
            Err(bad("/proc/self/status", "no VmRSS line"))
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63455                63455                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Ok(Some(1024)));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            Ok(None)
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"),
            Ok(1_700_000_000)
        );
    }

    #[test]
    fn this_process_reads_as_itself() {
        let s = read().unwrap();
        assert!(s.resident_bytes > 0 && s.open_fds > 0, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started before now, and not before the test binary was built.
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0,
            "{s:?}"
        );
        let mut registry = Registrar::new();
        register(&mut registry);
        let text = registry.finish().encode().unwrap();
        for want in [
            "proxy_operator_build_info{version=\"",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
