//! The log filter as a user sets it: `RUST_LOG` applies when neither
//! `--log-level` nor `LOG_LEVEL` is set, and loses to either. The real
//! binary with no cluster: it logs its start (info) and then fails to build
//! a Kubernetes client (error), so the info line shows which filter won.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::support;

const STARTING: &str = "Starting egress-proxies-operator";
const NO_CLIENT: &str = "Cannot start";

/// The log of one start with `env` set (and LOG_LEVEL / RUST_LOG otherwise
/// unset) and `args` added.
fn log_of(env: &[(&str, &str)], args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = support::operator(
        dir.path(),
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
        &dir.path().join("absent"),
    );
    cmd.env_remove("LOG_LEVEL")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .args(args);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "no cluster: exit 1");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn rust_log_is_the_fallback_log_filter() {
    struct Case {
        name: &'static str,
        env: &'static [(&'static str, &'static str)],
        args: &'static [&'static str],
        info_logged: bool,
    }
    let cases = [
        Case {
            name: "nothing set: info",
            env: &[],
            args: &[],
            info_logged: true,
        },
        Case {
            name: "RUST_LOG=error alone applies",
            env: &[("RUST_LOG", "error")],
            args: &[],
            info_logged: false,
        },
        Case {
            name: "LOG_LEVEL wins over RUST_LOG",
            env: &[("RUST_LOG", "error"), ("LOG_LEVEL", "info")],
            args: &[],
            info_logged: true,
        },
        Case {
            name: "--log-level wins over RUST_LOG",
            env: &[("RUST_LOG", "error")],
            args: &["--log-level", "info"],
            info_logged: true,
        },
        Case {
            name: "--log-level=error, RUST_LOG=info",
            env: &[("RUST_LOG", "info")],
            args: &["--log-level", "error"],
            info_logged: false,
        },
    ];
    for c in cases {
        let log = log_of(c.env, c.args);
        assert!(
            log.contains(NO_CLIENT),
            "{}: no error logged:\n{log}",
            c.name
        );
        assert_eq!(
            log.contains(STARTING),
            c.info_logged,
            "{}: info lines logged?\n{log}",
            c.name
        );
    }
}
