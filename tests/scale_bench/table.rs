//! The table `make bench-scale` prints: a row per figure with the median
//! of its repeats (their range in brackets) and what limited it.

use std::time::Duration;

use crate::{median, pct, spread, BarePhase, LeasePhase, Mode, ProbePhase};

/// Everything the run measured.
pub struct Table {
    pub mode: Mode,
    pub n: usize,
    pub cores: usize,
    pub secs: u64,
    pub repeats: usize,
    pub responder_cpu: Option<usize>,
    pub applied_in: Duration,
    pub all_ready: Duration,
    pub ready_count: usize,
    pub per_proxy_ready: Vec<Duration>,
    pub idle_rss: f64,
    pub idle_anon: f64,
    pub peak_after_apply: f64,
    pub ops: Vec<ProbePhase>,
    pub bares: Vec<BarePhase>,
    pub limited_phases: Vec<ProbePhase>,
    pub limit_refused: Option<String>,
    pub survived: bool,
    pub metrics_size: usize,
    pub scrape_took: Duration,
    pub solo: Vec<Duration>,
    pub filled: usize,
    /// Anonymous memory the filled leases added.
    pub lease_bytes: f64,
    /// RSS with the leases filled, before the lease loads.
    pub rss_filled: f64,
    /// (probes held, the load).
    pub leases: Vec<(bool, LeasePhase)>,
    pub rate: f64,
    pub peak: f64,
}

fn mib(v: f64) -> String {
    format!("{v:.1} MiB")
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn ms_f(v: f64) -> String {
    format!("{v:.2} ms")
}

fn us(v: f64) -> String {
    format!("{:.0} µs", v * 1e6)
}

fn n0(v: f64) -> String {
    format!("{v:.0}")
}

fn cores(v: f64) -> String {
    format!("{v:.2} cores")
}

struct Rows(Vec<[String; 3]>);

impl Rows {
    fn add(
        &mut self,
        figure: impl Into<String>,
        value: impl Into<String>,
        limit: impl Into<String>,
    ) {
        self.0.push([figure.into(), value.into(), limit.into()]);
    }
}

impl Table {
    /// The probing rows of some operator phases, named by `what`.
    fn probe_rows(&self, rows: &mut Rows, what: &str, phases: &[ProbePhase], quota: Option<f64>) {
        let of = |f: &dyn Fn(&ProbePhase) -> f64| phases.iter().map(f).collect::<Vec<_>>();
        let limit = phases
            .iter()
            .max_by(|a, b| a.cpu.machine.total_cmp(&b.cpu.machine))
            .map(|p| {
                let throttled = p
                    .cgroup
                    .is_some_and(|c| c.throttled_periods * 10 > c.periods.max(1));
                p.cpu.limit(quota, throttled)
            })
            .unwrap_or_default();
        rows.add(
            format!("{what}: probes per second (goal {})", self.n),
            spread(of(&|p| p.probes_per_sec), n0),
            limit.clone(),
        );
        rows.add(
            format!("{what}: probes landing at the targets per second"),
            spread(of(&|p| p.ages.requests as f64 / p.secs), n0),
            "",
        );
        let never: u64 = phases.iter().map(|p| p.ages.never).sum();
        rows.add(
            format!("{what}: newest probe's age per Proxy, p50 / p99 / max (goal p99 ≤ 2 s)"),
            format!(
                "{} / {} / {}{}",
                spread(of(&|p| p.ages.p50.as_secs_f64() * 1e3), |v| format!(
                    "{v:.0} ms"
                )),
                spread(of(&|p| p.ages.p99.as_secs_f64() * 1e3), |v| format!(
                    "{v:.0} ms"
                )),
                spread(of(&|p| p.ages.max.as_secs_f64() * 1e3), |v| format!(
                    "{v:.0} ms"
                )),
                if never > 0 {
                    format!("; {never} samples of Proxies never probed")
                } else {
                    String::new()
                },
            ),
            limit,
        );
        rows.add(
            format!("{what}: operator CPU, per probe"),
            format!(
                "{}, {}",
                spread(of(&|p| p.cpu.measured), cores),
                spread(of(&|p| p.cpu_per_probe()), us)
            ),
            "",
        );
        rows.add(
            format!("{what}: perf instructions per probe, context switches/s"),
            format!(
                "{}, {}",
                phases
                    .first()
                    .map(|p| p.perf.instructions_per(p.probes_per_sec * p.secs))
                    .unwrap_or_default(),
                spread(of(&|p| p.perf.context_switches.unwrap_or(0.0) / p.secs), n0)
            ),
            "",
        );
        rows.add(
            format!("{what}: CPU of the probe targets / load generator / machine"),
            format!(
                "{} / {} / {}",
                spread(of(&|p| p.cpu.responder), cores),
                spread(of(&|p| p.cpu.harness), cores),
                spread(of(&|p| p.cpu.machine), cores)
            ),
            "",
        );
        rows.add(
            format!("{what}: RSS, of it anonymous"),
            format!(
                "{}, {}",
                spread(of(&|p| p.rss), mib),
                spread(of(&|p| p.anon), mib)
            ),
            "",
        );
    }

    pub fn render(&self) -> String {
        let mut rows = Rows(Vec::new());
        let n = self.n;
        rows.add(
            match self.mode {
                Mode::External => "Proxies (External, on the probe-target process)",
                Mode::Kubernetes => "Proxies (kubernetes provider, a Squid Pod each)",
            },
            n.to_string(),
            "",
        );
        rows.add(
            "probe targets",
            match self.responder_cpu {
                Some(cpu) => format!("one process pinned to CPU {cpu}"),
                None => "one process, unpinned (one CPU)".into(),
            },
            "",
        );
        rows.add(
            "create calls done / apply to all Ready",
            format!(
                "{:.1} s / {}",
                self.applied_in.as_secs_f64(),
                if self.ready_count == n {
                    format!("{:.1} s", self.all_ready.as_secs_f64())
                } else {
                    format!(
                        "not reached: {} of {n} Ready after {:.0} s",
                        self.ready_count,
                        self.all_ready.as_secs_f64()
                    )
                }
            ),
            "",
        );
        rows.add(
            "create to Ready per Proxy, p50 / p99",
            format!(
                "{} / {}",
                ms(pct(&self.per_proxy_ready, 0.5)),
                ms(pct(&self.per_proxy_ready, 0.99))
            ),
            "",
        );
        rows.add(
            "RSS idle (no Proxy), of it anonymous",
            format!("{}, {}", mib(self.idle_rss), mib(self.idle_anon)),
            "",
        );
        rows.add("RSS peak after apply", mib(self.peak_after_apply), "");
        let steady = median(self.ops.iter().map(|p| p.rss).collect());
        rows.add(
            "bytes per Proxy (steady RSS - idle)",
            format!(
                "{:.0} B",
                (steady - self.idle_rss) * 1024.0 * 1024.0 / n as f64
            ),
            "",
        );
        self.probe_rows(&mut rows, "probing", &self.ops, None);
        let bare_per_probe: Vec<f64> = self
            .bares
            .iter()
            .map(|b| b.run.cpu / b.run.probes.max(1) as f64)
            .collect();
        if self.bares.is_empty() {
            rows.add(
                "bare probe loop",
                "not run: the Squid Pods ask for credentials it does not hold",
                "",
            );
        } else {
            let bare_limit = self
                .bares
                .iter()
                .map(|b| b.cpu.limit(None, false))
                .next()
                .unwrap_or_default();
            rows.add(
                "bare probe loop (operator stopped): probes/s, failed",
                format!(
                    "{}, {}",
                    spread(
                        self.bares
                            .iter()
                            .map(|b| b.run.probes as f64 / b.secs)
                            .collect(),
                        n0
                    ),
                    self.bares.iter().map(|b| b.run.failed).sum::<u64>()
                ),
                bare_limit,
            );
            rows.add(
                "bare probe loop: CPU per probe, age p99",
                format!(
                    "{}, {}",
                    spread(bare_per_probe.clone(), us),
                    spread(
                        self.bares
                            .iter()
                            .map(|b| b.ages.p99.as_secs_f64() * 1e3)
                            .collect(),
                        |v| format!("{v:.0} ms")
                    )
                ),
                "",
            );
            rows.add(
                "bare probe loop: perf instructions per probe",
                self.bares
                    .first()
                    .map(|b| b.run.perf.instructions_per(b.run.probes as f64))
                    .unwrap_or_default(),
                "",
            );
            let op = median(self.ops.iter().map(ProbePhase::cpu_per_probe).collect());
            let bare = median(bare_per_probe);
            rows.add(
                "operator CPU per probe / bare loop's (goal ≤ 2x)",
                format!("{:.1}x", op / bare.max(1e-12)),
                "",
            );
            rows.add(
                "probes/s one core carries at the measured CPU per probe: operator / bare",
                format!("{:.0} / {:.0}", 1.0 / op.max(1e-12), 1.0 / bare.max(1e-12)),
                "the figure where the CPU is not shared",
            );
        }
        match (&self.limit_refused, self.limited_phases.is_empty()) {
            (Some(why), _) => rows.add("inside 500m / 128Mi", format!("not run: {why}"), ""),
            (None, true) => rows.add(
                "inside 500m / 128Mi",
                "not run: the operator died entering the cgroup",
                "",
            ),
            (None, false) => {
                self.probe_rows(
                    &mut rows,
                    "inside 500m / 128Mi",
                    &self.limited_phases,
                    Some(crate::POD_CPU),
                );
                let of = |f: &dyn Fn(&crate::cgroup::Stats) -> f64| {
                    self.limited_phases
                        .iter()
                        .filter_map(|p| p.cgroup.as_ref().map(f))
                        .collect::<Vec<_>>()
                };
                rows.add(
                    "inside 500m / 128Mi: periods throttled, memory peak, limit hits, OOM kills",
                    format!(
                        "{}, {}, {}, {}",
                        spread(
                            of(&|c| 100.0 * c.throttled_periods as f64 / c.periods.max(1) as f64),
                            |v| format!("{v:.0}%")
                        ),
                        spread(of(&|c| c.memory_peak_mib), mib),
                        spread(of(&|c| c.memory_failcnt as f64), n0),
                        spread(of(&|c| c.oom_kills as f64), n0),
                    ),
                    if self.survived {
                        ""
                    } else {
                        "the operator was killed inside the limits"
                    },
                );
            }
        }
        let requests: f64 = self
            .ops
            .iter()
            .map(|p| p.requests.values().sum::<u64>() as f64 / p.secs)
            .sum::<f64>()
            / self.ops.len().max(1) as f64;
        rows.add(
            "API server requests/s while probing",
            format!("{requests:.2}"),
            "",
        );
        rows.add(
            "provider calls/s while probing",
            spread(self.ops.iter().map(|p| p.provider_calls).collect(), |v| {
                format!("{v:.2}")
            }),
            "",
        );
        rows.add(
            "/metrics size, scrape time",
            format!(
                "{:.0} KiB, {}",
                self.metrics_size as f64 / 1024.0,
                ms(self.scrape_took)
            ),
            "",
        );
        if !self.solo.is_empty() {
            let mut solo = self.solo.clone();
            solo.sort();
            rows.add(
                "one more kubernetes Proxy, apply to Ready (3 in turn: min / max)",
                format!("{} / {}", ms(solo[0]), ms(solo[solo.len() - 1])),
                "",
            );
        }
        rows.add(
            "live leases held during the lease loads, anonymous memory each",
            format!(
                "{}, {:.0} B",
                self.filled,
                self.lease_bytes / self.filled.max(1) as f64
            ),
            "",
        );
        rows.add(
            "RSS with the leases filled, before the lease loads",
            mib(self.rss_filled),
            "",
        );
        for held in [false, true] {
            let phases: Vec<&LeasePhase> = self
                .leases
                .iter()
                .filter(|(h, _)| *h == held)
                .map(|(_, p)| p)
                .collect();
            if phases.is_empty() {
                continue;
            }
            let what = if held {
                "probes held"
            } else {
                "probes running"
            };
            type Load = (crate::lease_load::Figures, crate::CpuShare);
            type Pick = dyn Fn(&LeasePhase) -> &Load;
            let of = |pick: &Pick, f: &dyn Fn(&Load) -> f64| {
                phases.iter().map(|p| f(pick(p))).collect::<Vec<_>>()
            };
            let limit = |pick: &Pick| {
                phases
                    .first()
                    .map(|p| pick(p).1.limit(None, false))
                    .unwrap_or_default()
            };
            let real: &Pick = &|p| &p.real;
            let bare: &Pick = &|p| &p.bare;
            let open: &Pick = &|p| &p.open;
            let rate = |l: &Load| l.0.rate();
            let p99 = |l: &Load| l.0.p99.as_secs_f64() * 1e3;
            rows.add(
                format!("leases, {what}: acquire+release/s, p99, 64 connections (operator)"),
                format!(
                    "{}, {}",
                    spread(of(real, &rate), n0),
                    spread(of(real, &p99), ms_f)
                ),
                limit(real),
            );
            rows.add(
                format!("leases, {what}: the same on the bare route of the same process"),
                format!(
                    "{}, {}",
                    spread(of(bare, &rate), n0),
                    spread(of(bare, &p99), ms_f)
                ),
                limit(bare),
            );
            let per_core = |l: &Load| l.0.rate() / l.1.measured.max(1e-9);
            rows.add(
                format!(
                    "leases, {what}: pairs/s per core the operator used (operator / bare route)"
                ),
                format!(
                    "{} / {}",
                    spread(of(real, &per_core), n0),
                    spread(of(bare, &per_core), n0)
                ),
                "the figure where the CPU is not shared",
            );
            rows.add(
                format!("leases, {what}: operator / bare route (goal ≥ 50%)"),
                spread(
                    phases
                        .iter()
                        .map(|p| 100.0 * p.real.0.rate() / p.bare.0.rate().max(1e-9))
                        .collect(),
                    |v| format!("{v:.0}%"),
                ),
                "",
            );
            rows.add(
                format!(
                    "leases, {what}: open loop at {:.0} pairs/s: achieved, p50 / p99 (goal ≤ 5 ms), errors, connections reopened",
                    self.rate
                ),
                format!(
                    "{}, {} / {}, {}, {}",
                    spread(of(open, &rate), n0),
                    spread(of(open, &|l| l.0.p50.as_secs_f64() * 1e3), ms_f),
                    spread(of(open, &p99), ms_f),
                    phases
                        .iter()
                        .map(|p| p.real.0.errors + p.bare.0.errors + p.open.0.errors)
                        .sum::<usize>(),
                    phases.iter().map(|p| p.open.0.reconnects).sum::<usize>()
                ),
                limit(open),
            );
        }
        rows.add("RSS peak (VmHWM)", mib(self.peak), "");
        let build = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        let provider = match self.mode {
            Mode::External => "",
            Mode::Kubernetes => " PROVIDER=kubernetes",
        };
        let mut table = format!(
            "`make bench-scale N={n}{provider}` ({build} build, {} cores, {} phases of {} s each, {} UTC)\n\n| figure | value: median (range) | limited by |\n|---|---|---|\n",
            self.cores,
            self.repeats,
            self.secs,
            chrono::Utc::now().format("%Y-%m-%d %H:%M")
        );
        for [k, v, l] in &rows.0 {
            table.push_str(&format!("| {k} | {v} | {l} |\n"));
        }
        table
    }
}
