//! `docs/examples/crawler.py`, the crawler kit, as the tests run it.

use std::process::Command;

/// The example's path.
pub const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/crawler.py");

/// Panics with the reason unless `python3` with `requests` runs (never skips).
pub fn require_python_requests() {
    let ok = Command::new("python3")
        .args(["-c", "import requests"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 with the requests module is needed to run docs/examples/crawler.py (python3 -m pip install requests, or apt-get install python3-requests); .ci/run installs it"
    );
}

/// The example against the discovery API on `api` with `token`, with
/// `args` after those: the command, ready to run.
pub fn command(api: std::net::SocketAddr, token: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(EXAMPLE)
        .args(["--api", &format!("http://{api}")])
        .args(["--token", token])
        .args(args);
    cmd
}

/// Runs the example to its end (off the async runtime): whether it
/// succeeded, and its output lines.
pub async fn run(api: std::net::SocketAddr, token: &str, args: &[&str]) -> (bool, Vec<String>) {
    let mut cmd = command(api, token, args);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    for l in &lines {
        println!("crawler: {l}");
    }
    if !out.status.success() {
        eprintln!("crawler stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.success(), lines)
}

/// The gateway's crawler kit, `docs/examples/gateway/<name>`.
pub fn gateway_example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/examples/gateway")
        .join(name)
}

/// The python of the crawler venv (`make crawler-venv`: Scrapy and
/// Playwright); panics with the reason when it is missing (never skips).
pub fn venv_python() -> std::path::PathBuf {
    let venv = std::env::var_os("CRAWLER_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
            target.join("crawler-venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make crawler-venv` (Scrapy and Playwright from PyPI); make test does",
        python.display()
    );
    python
}

/// Panics with the reason unless Debian's chromium is installed.
pub fn require_chromium() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "/usr/bin/chromium is missing: apt-get install chromium; .ci/run does"
    );
}
