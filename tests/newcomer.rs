//! What a newcomer meets first: the README's commands work as written (the
//! test command is the one CI runs; the local run command starts the
//! operator and a sample becomes Ready), every flag of `--help` is in
//! docs/configuration.md, every Makefile target the docs promise exists,
//! no relative link in README.md or docs/ is broken, and every repository
//! path their code spans name exists. And the shape of
//! `src/` a newcomer can read: no import cycle, no file over 500 lines of
//! non-test code, no bare libvirt numbers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{free_port, repo};

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The first command in the README's "Test" section's code block.
fn readme_command(section: &str) -> String {
    let readme = read("README.md");
    let start = readme
        .find(&format!("## {section}"))
        .unwrap_or_else(|| panic!("README.md has no '## {section}' section"));
    let rest = &readme[start..];
    let block = rest.split("```").nth(1).expect("a code block");
    block
        .lines()
        .skip(1)
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .expect("a command")
        .to_string()
}

#[test]
fn ci_runs_the_readme_test_command() {
    let cmd = readme_command("Test");
    assert_eq!(cmd, "make test");
    let ci = read(".ci/run");
    let last = ci
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap();
    assert_eq!(last, cmd, ".ci/run must end with the README's test command");
}

/// One release number everywhere a user reads or installs it: Cargo.toml
/// (what `--version` prints), the chart's version and appVersion (the
/// image tag it installs), the tag kustomize and `make docker-build` use,
/// and every image tag the README and docs/operations.md show.
#[test]
fn the_release_number_agrees_everywhere() {
    let cargo = read("Cargo.toml");
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let chart = read("config/helm/egress-proxies-operator/Chart.yaml");
    let field = |k: &str| {
        chart
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .trim()
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(field("version:"), version, "Chart.yaml version");
    assert_eq!(field("appVersion:"), version, "Chart.yaml appVersion");
    for file in [
        "config/manager/kustomization.yaml",
        "config/components/gateway/kustomization.yaml",
    ] {
        let text = read(file);
        let tag = text.lines().find_map(|l| l.trim().strip_prefix("newTag:"));
        assert_eq!(tag.map(str::trim), Some(version.as_str()), "{file}");
    }
    let makefile = read("Makefile");
    let img = makefile
        .lines()
        .find_map(|l| l.strip_prefix("IMG ?= "))
        .unwrap();
    assert!(img.ends_with(&format!(":{version}")), "Makefile IMG {img}");
    for doc in ["README.md", "docs/operations.md"] {
        let text = read(doc);
        let tags: Vec<&str> = text
            .split("egress-proxies-operator:")
            .skip(1)
            .chain(text.split("image.tag=").skip(1))
            .map(|rest| {
                rest.split(|c: char| c.is_whitespace() || c == '`')
                    .next()
                    .unwrap()
            })
            .filter(|t| t.starts_with(|c: char| c.is_ascii_digit() || c == 'v'))
            .collect();
        assert!(!tags.is_empty(), "{doc} shows no image tag");
        for tag in tags {
            assert_eq!(tag, version, "{doc} shows the image tag {tag}");
        }
    }
}

fn get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A loopback HTTP server answering 200: the probe target (no internet here).
/// Once `cluster_json` names the Pods' gateway, answers 200 "ok" to every
/// request on gateway:port (for at most two minutes).
fn serve_on_gateway(cluster_json: &Path, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let gateway = loop {
        let g = std::fs::read_to_string(cluster_json)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["gateway"].as_str().map(String::from));
        if let Some(g) = g {
            break g;
        }
        if Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Ok(l) = std::net::TcpListener::bind((gateway.as_str(), port)) else {
        return;
    };
    for mut c in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        });
    }
}

/// The processes whose command line names `path` (the clone): none may
/// outlive `make run-local`.
fn processes_naming(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if line.contains(&needle) {
            found.push(line);
        }
    }
    found
}

/// The quickstart on a clean checkout: `git clone` of this HEAD, then the
/// README's first command, `make run-local`, as written, reusing the
/// built operator (OPERATOR_BIN) and test cluster (CLUSTER_BIN, `-o
/// test-cluster`) so nothing is rebuilt. The sample Proxy turns Ready, the
/// printed lease command leases it, and SIGTERM leaves no process behind.
#[test]
fn the_readme_run_command_starts_the_operator_without_a_cluster() {
    assert_eq!(readme_command("Run"), "make run-local");
    assert!(
        support::squid_present(),
        "/usr/sbin/squid is missing: install it (apt-get install squid); .ci/run does"
    );
    let operator = env!("CARGO_BIN_EXE_egress-proxies-operator");
    let state = tempfile::tempdir().unwrap();
    let clone = state.path().join("checkout");
    let out = Command::new("git")
        .args(["clone", "-q"])
        .arg(repo())
        .arg(&clone)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git clone: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster_dir = clone.join("target/run-local");
    let probes = format!("127.0.0.1:{}", free_port());
    // Squid runs in a Pod: the target listens on the Pods' gateway, which
    // the launcher substitutes for @GATEWAY@ once the cluster is up.
    let target_port = free_port();
    let cluster_json = cluster_dir.join("cluster.json");
    std::thread::spawn(move || serve_on_gateway(&cluster_json, target_port));
    let cluster_bin = std::fs::canonicalize(test_cluster::bin_dir()).unwrap();
    let stdout = state.path().join("run-local.out");
    let mut child = Command::new("make")
        .current_dir(&clone)
        // A newcomer's clone keeps its state in its own target/ (the suite
        // may share a CARGO_TARGET_DIR outside the clone).
        .env_remove("CARGO_TARGET_DIR")
        .args(["-s", "-o", "test-cluster", "run-local"])
        .arg(format!("OPERATOR_BIN={operator}"))
        .arg(format!("CLUSTER_BIN={}", cluster_bin.display()))
        .arg(format!("RUN_LOCAL_PROBE_ADDR={probes}"))
        .arg(format!("RUN_LOCAL_DISCOVERY_ADDR=127.0.0.1:{}", free_port()))
        .arg(format!("RUN_LOCAL_METRICS_ADDR=127.0.0.1:{}", free_port()))
        .arg(format!(
            "ARGS=--default-probe-url http://@GATEWAY@:{target_port}/ --default-probe-expected-status 200"
        ))
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(state.path().join("run-local.log")).unwrap())
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // The lease command it prints once the sample is Ready, run as printed.
        let lease = wait_for(
            "the printed lease command",
            Duration::from_secs(240),
            || {
                let text = std::fs::read_to_string(&stdout).ok()?;
                text.lines()
                    .map(str::trim)
                    .find(|l| l.starts_with("curl ") && l.contains("/v1/leases"))
                    .map(String::from)
            },
        );
        let out = Command::new("sh").args(["-c", &lease]).output().unwrap();
        let body: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{lease}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        assert_eq!(body["proxy"]["name"], "proxy-kubernetes-sample", "{body}");
        let url = body["proxy"]["url"].as_str().unwrap();
        assert!(
            url.starts_with("http://") && url.ends_with(":3128"),
            "{body}"
        );
        // The leased proxy is a working Squid: the local target through it.
        let gateway = serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(cluster_dir.join("cluster.json")).unwrap(),
        )
        .unwrap()["gateway"]
            .as_str()
            .unwrap()
            .to_string();
        let through = Command::new("curl")
            .args(["-s", "--max-time", "10", "-x", url])
            .arg(format!("http://{gateway}:{target_port}/"))
            .output()
            .expect("curl runs (apt-get install curl)");
        assert_eq!(
            String::from_utf8_lossy(&through.stdout),
            "ok",
            "curl -x {url}"
        );
        eprintln!(
            "make run-local printed:\n{}",
            std::fs::read_to_string(&stdout).unwrap()
        );
        assert!(
            get(&probes, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200")),
            "the operator's /readyz"
        );
        let row = Command::new(test_cluster::bin("kubectl"))
            .args(["get", "px", "proxy-kubernetes-sample", "--no-headers"])
            .env("KUBECONFIG", cluster_dir.join("admin.kubeconfig"))
            .output()
            .unwrap();
        let row = String::from_utf8_lossy(&row.stdout).into_owned();
        assert!(row.contains(" Ready "), "kubectl get px: {row}");
    }));
    // Ctrl-C's signal: the script stops the operator and the API server.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(state.path().join("run-local.log")).unwrap_or_default();
    if let Err(e) = result {
        eprintln!("run-local log:\n{log}");
        std::panic::resume_unwind(e);
    }
    assert!(
        status.is_some(),
        "run-local did not stop on SIGTERM:\n{log}"
    );
    let server = std::fs::read_to_string(cluster_dir.join("cluster.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["server"].as_str().map(String::from))
        .expect("the cluster wrote its server URL");
    let port: u16 = server.rsplit(':').next().unwrap().parse().unwrap();
    wait_for(
        "the API server port to close",
        Duration::from_secs(20),
        || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .is_err()
                .then_some(())
        },
    );
    let left = wait_for(
        "every process of the run gone",
        Duration::from_secs(20),
        || {
            let left = processes_naming(&clone);
            left.is_empty().then_some(left)
        },
    );
    assert!(left.is_empty());
}

/// The code block under the README's heading `### {heading}`.
fn readme_block(heading: &str) -> String {
    let readme = read("README.md");
    let start = readme
        .find(&format!("### {heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no '### {heading}' section"));
    let block = readme[start..].split("```").nth(1).expect("a code block");
    block
        .split_once('\n')
        .map_or("", |(_, rest)| rest)
        .to_string()
}

/// A registry as users run one: Debian's docker-registry on 127.0.0.1,
/// storing in `dir`, plain HTTP; killed on drop.
struct Registry(std::process::Child);

impl Registry {
    fn start(dir: &Path, port: u16) -> Registry {
        let config = dir.join("registry.yml");
        let storage = dir.join("registry");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("docker-registry is required (apt-get install docker-registry): {e}")
            });
        let registry = Registry(child);
        let addr = format!("127.0.0.1:{port}");
        wait_for("the registry", Duration::from_secs(30), || {
            get(&addr, "/v2/").filter(|r| r.starts_with("HTTP/1.1 200"))
        });
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The README's "Installing into a real cluster", run as written against
/// the test cluster: `make image image-push` to a real registry (Debian's
/// docker-registry on loopback), `helm install` naming that image, which
/// the node agent pulls from the registry and runs (its root filesystem,
/// read-only, as 65532), the rollout, the sample Proxy Ready, and the
/// generated token printed. Three things differ from a user's run, each
/// named in the README: REGISTRY is the loopback registry,
/// `PUSH_TLS_VERIFY=false` (it serves plain HTTP), and `helm install` gets
/// the offline probe target (`-f`: no route to www.gstatic.com here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_real_cluster_install_reaches_a_ready_proxy() {
    support::require_squid_pods();
    let c = support::cluster();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let port = free_port();
    let _registry = Registry::start(dir, port);
    let registry = format!("127.0.0.1:{port}/crawling");

    let target = support::http_target_on(c.host_ip()).await;
    let providers = support::kubernetes_reaching("kubernetes", "", target.ip());
    let providers: serde_json::Value = serde_norway::from_str(&providers).unwrap();
    let values = dir.join("offline.json");
    let offline = serde_json::json!({
        "providers": providers["providers"],
        "extraArgs": [format!("--default-probe-url=http://{target}/"), "--default-probe-expected-status=200"],
    });
    std::fs::write(&values, offline.to_string()).unwrap();

    let block = readme_block("Installing into a real cluster");
    let export = block
        .lines()
        .find(|l| l.starts_with("export REGISTRY="))
        .expect("the README sets REGISTRY");
    let offline_flag = format!(" -f {}", values.display());
    let script = block
        .replace(export, &format!("export REGISTRY={registry}"))
        .replacen(
            "--set discoveryToken.generate=true",
            &format!("--set discoveryToken.generate=true{offline_flag}"),
            1,
        );
    assert!(
        script.contains(&offline_flag),
        "the README's helm install sets discoveryToken.generate=true"
    );
    let path = format!(
        "{}:{}",
        test_cluster::bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // helm's cache and config in the test's directory, never the user's.
    let helm_home = dir.join("helm");
    let helm_env = ["cache", "config", "data"]
        .map(|d| (format!("HELM_{}_HOME", d.to_uppercase()), helm_home.join(d)));
    let mut shell = Command::new("timeout");
    // A user's shell: none of the variables `cargo test` and the test
    // runner give this process (the crate's, its build script's,
    // RUSTC_BOOTSTRAP for the runner's test timings), which build scripts
    // watch: the README's `make image` would rebuild the release binary
    // and every dependency from scratch (10 min in CI).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let cargos = key.starts_with("CARGO") && key != "CARGO_TARGET_DIR" && key != "CARGO_HOME";
        if cargos || key.starts_with("EPO_") || key.starts_with("RUSTC") {
            shell.env_remove(&*key);
        }
    }
    let out = shell
        .args(["1500", "bash", "-euo", "pipefail", "-c", &script])
        .current_dir(repo())
        .env("PATH", path)
        .env("KUBECONFIG", c.kubeconfig())
        .env("PUSH_TLS_VERIFY", "false")
        // Its own image layout: the image test unpacks the shared one.
        .env("IMAGE_LAYOUT", dir.join("oci"))
        .envs(helm_env.clone())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let pods = c
        .kubectl()
        .args(["-n", "egress-proxies-operator-system", "describe", "pods"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        out.status.success(),
        "the README's commands failed ({}):\n{stdout}\n{stderr}\npods:\n{pods}",
        out.status
    );
    println!("{stderr}");

    // The manager runs the image from the registry, not a host program.
    let manager_pods = |jsonpath: &str| {
        let jsonpath = format!("jsonpath={jsonpath}");
        let ns = ["-n", "egress-proxies-operator-system", "get", "pods"];
        let select = ["-l", "control-plane=controller-manager", "-o", &jsonpath];
        c.kubectl_ok(&[&ns[..], &select[..]].concat())
    };
    let image = manager_pods("{.items[*].spec.containers[0].image}");
    for one in image.split_whitespace() {
        assert_eq!(one, format!("{registry}/egress-proxies-operator:0.1.0"));
    }
    let tags = get(
        &format!("127.0.0.1:{port}"),
        "/v2/crawling/egress-proxies-operator/tags/list",
    )
    .unwrap();
    assert!(tags.contains("\"0.1.0\""), "the pushed tag: {tags}");

    // The last line printed the generated token; it opens the discovery API.
    let token = stdout.lines().last().unwrap_or_default().trim().to_string();
    assert!(token.len() >= 32, "a generated token: {stdout}");
    if c.is_local() {
        let pod_ip = manager_pods("{.items[0].status.podIP}");
        let addr = std::net::SocketAddr::new(pod_ip.parse().unwrap(), 8090);
        let (status, body) =
            support::api_call(addr, "GET", "/v1/proxies", Some(&token), vec![]).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.to_string().contains("proxy-kubernetes-sample"),
            "{body}"
        );
    }

    c.kubectl_ok(&[
        "delete",
        "px",
        "proxy-kubernetes-sample",
        "--wait",
        "--timeout=120s",
    ]);
    let uninstall = Command::new(test_cluster::bin("helm"))
        .args([
            "uninstall",
            "egress-proxies-operator",
            "-n",
            "egress-proxies-operator-system",
            "--wait",
            "--timeout=120s",
        ])
        .env("KUBECONFIG", c.kubeconfig())
        .envs(helm_env)
        .output()
        .unwrap();
    assert!(
        uninstall.status.success(),
        "{}",
        String::from_utf8_lossy(&uninstall.stderr)
    );
}

#[test]
fn every_flag_in_help_is_documented() {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let docs = read("docs/configuration.md");
    let flags: Vec<&str> = help
        .lines()
        .map(str::trim_start)
        .filter_map(|l| l.strip_prefix("-h, ").or(Some(l)))
        .filter(|l| l.starts_with("--"))
        .filter_map(|l| l.split([' ', '=', ',']).next())
        .filter(|f| *f != "--help" && *f != "--version")
        .collect();
    assert!(flags.len() > 20, "parsed {flags:?}");
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|f| !docs.contains(&format!("`{f}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "flags missing from docs/configuration.md: {missing:?}"
    );
}

#[test]
fn the_promised_make_targets_exist() {
    for target in [
        "build",
        "test",
        "test-e2e",
        "lint",
        "fmt",
        "crds",
        "manifests",
        "run",
        "run-local",
        "install",
        "uninstall",
        "deploy",
        "undeploy",
        "docker-build",
        "kvm-ssh-secret",
        "check-config",
        "bench-lease",
        "bench-idle",
        "fuzz-api",
    ] {
        let out = Command::new("make")
            .args(["-n", target, "IMG=registry.example:5000/epo:t"])
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "make -n {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // deploy installs the image it is given.
    let out = Command::new("make")
        .args(["-s", "render", "IMG=registry.example:5000/team/epo:1.2.3"])
        .arg(format!(
            "KUBECTL={}",
            test_cluster::bin("kubectl").display()
        ))
        .current_dir(repo())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("image: registry.example:5000/team/epo:1.2.3"),
        "{text}"
    );
    assert!(!text.contains("controller:latest"));
}

#[test]
fn relative_links_in_readme_and_docs_resolve() {
    let files = doc_files();
    let link = regex_lite::Regex::new(r"\]\(([^)#\s]+)(#[^)]*)?\)").unwrap();
    let mut broken = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !f.parent().unwrap().join(target).exists() {
                broken.push(format!("{}: {target}", f.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

/// README.md and every Markdown file in docs/.
fn doc_files() -> Vec<std::path::PathBuf> {
    let mut files = vec![repo().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    files.sort();
    files
}

/// Top-level files a doc may name on their own in a code span.
const TOP_LEVEL_FILES: &[&str] = &[
    "Makefile",
    "Cargo.toml",
    "Cargo.lock",
    "Dockerfile",
    "README.md",
    "CHANGELOG.md",
];

/// The repository paths named in `text`'s inline code spans (fenced blocks
/// left out), with a trailing `:LINE`, `::item` or `#anchor` cut off. A
/// span counts as a path when it starts with a top-level directory or is a
/// top-level file; spans with spaces, globs or placeholders are examples,
/// not paths.
fn repo_paths_in(text: &str) -> Vec<String> {
    // A span may run over a line break (Markdown reads it as a space).
    let span = regex_lite::Regex::new(r"`([^`]+)`").unwrap();
    let line_number = regex_lite::Regex::new(r":\d+(-\d+)?$").unwrap();
    let mut prose = String::new();
    let mut fenced = false;
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            prose.push_str(l);
            prose.push('\n');
        }
    }
    let mut found = Vec::new();
    for c in span.captures_iter(&prose) {
        let s = &c[1];
        if s.contains(char::is_whitespace) || s.contains(['*', '{', '<', '…']) || s.contains("...")
        {
            continue;
        }
        let s = s.split('#').next().unwrap();
        let s = s.split("::").next().unwrap();
        let s = line_number.replace(s, "").into_owned();
        let is_path = ["src/", "tests/", "config/", "docs/", "crds/", ".ci/"]
            .iter()
            .any(|d| s.starts_with(d))
            || TOP_LEVEL_FILES.contains(&s.as_str());
        if is_path {
            found.push(s);
        }
    }
    found
}

#[test]
fn paths_in_code_spans_of_readme_and_docs_exist() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.strip_prefix(repo()).unwrap().display().to_string();
        for path in repo_paths_in(&text) {
            checked += 1;
            if !repo().join(&path).exists() {
                missing.push(format!("{name}: `{path}`"));
            }
        }
    }
    assert!(checked > 50, "only {checked} paths found in the docs");
    assert!(
        missing.is_empty(),
        "{} paths in code spans name nothing in the repository:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn the_path_finder_reads_code_spans_as_paths() {
    let text = "See `src/lease/bounds.rs:24`, `src/leader/mod.rs::decide`, \
                `docs/api.md#acquire` and `Makefile`; not `make test`, \
                `tests/*.rs`, `src/{a,b}.rs`, `docs/<name>.md`, `src/…`, \
                `config/...` or `kubectl get px`. `make\n docker-build` is not \
                one either, and `Cargo.lock` after it is.\n\
                ```\n`src/in/a/fence.rs`\n```\n`.ci/run`\n";
    assert_eq!(
        repo_paths_in(text),
        [
            "src/lease/bounds.rs",
            "src/leader/mod.rs",
            "docs/api.md",
            "Makefile",
            "Cargo.lock",
            ".ci/run",
        ]
    );
}

/// The top level is the project card's: nothing else but dot files.
#[test]
fn the_top_level_is_the_cards() {
    let out = Command::new("git")
        .args(["ls-files"])
        .current_dir(repo())
        .output()
        .expect("git runs");
    assert!(out.status.success());
    let mut top: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split('/').next())
        .filter(|e| !e.starts_with('.'))
        .map(String::from)
        .collect();
    top.sort();
    top.dedup();
    assert_eq!(
        top,
        [
            "CHANGELOG.md",
            "Cargo.lock",
            "Cargo.toml",
            "Dockerfile",
            "Makefile",
            "README.md",
            "config",
            "crds",
            "docs",
            "src",
            "tests",
        ]
    );
}

// The shape of `src/`: the `crate::` imports between its top-level
// modules form no cycle, so each module can be read (and tested) on top of
// the ones it names.

/// Every `.rs` file below `dir`.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module → the top-level modules it names as `crate::X`.
fn import_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = support::repo().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // The crate roots and binaries wire modules together; they are not
        // modules others import.
        if matches!(top.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let entry = graph.entry(top.clone()).or_default();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != top {
                entry.insert(name);
            }
        }
    }
    graph
}

/// A cycle through `start`, if any, as the path of modules.
fn cycle_from(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    start: &str,
) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = std::collections::BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                let mut p = path.clone();
                p.push(start.to_string());
                return Some(p);
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push((next.clone(), p));
            }
        }
    }
    None
}

#[test]
fn the_module_imports_have_no_cycle() {
    let graph = import_graph();
    assert!(graph.len() > 5, "the source tree was read: {graph:?}");
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|p| p.join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_cycle_finder_finds_one() {
    let graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = [
        (
            "a".to_string(),
            std::collections::BTreeSet::from(["b".to_string()]),
        ),
        (
            "b".to_string(),
            std::collections::BTreeSet::from(["c".to_string()]),
        ),
        (
            "c".to_string(),
            std::collections::BTreeSet::from(["a".to_string()]),
        ),
        (
            "d".to_string(),
            std::collections::BTreeSet::from(["a".to_string()]),
        ),
    ]
    .into();
    assert_eq!(cycle_from(&graph, "a").unwrap(), ["a", "b", "c", "a"]);
    assert!(cycle_from(&graph, "d").is_none());
}

// Inside a module directory: `discovery/` (issue 52) and `gateway/` (issue
// 51) are laid out so that a file names the siblings it builds on and
// none of those names it back; a request passes the gateway's layers in
// one direction, and the lease transaction (`discovery/grant.rs`) is one
// module the routes call, not helpers they take from `handlers.rs`.

/// The files of `src/<dir>` (test files and test modules left out) → the
/// siblings each names as `super::X` or `crate::<dir>::X` outside comments.
fn sibling_graph(
    dir: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let root = support::repo().join("src").join(dir);
    let mut files = Vec::new();
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "rs") && !is_test_file(&p) {
            files.push(p);
        }
    }
    let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().to_string();
    let names: std::collections::BTreeSet<String> = files.iter().map(|p| stem(p)).collect();
    let mut graph = std::collections::BTreeMap::new();
    for f in &files {
        let me = stem(f);
        if me == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut named = std::collections::BTreeSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for prefix in ["super::".to_string(), format!("crate::{dir}::")] {
                for (at, _) in line.match_indices(&prefix) {
                    let after = &line[at + prefix.len()..];
                    let name: String = after
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if names.contains(&name) && name != me && name != "mod" {
                        named.insert(name);
                    }
                }
            }
        }
        graph.insert(me, named);
    }
    graph
}

#[test]
fn the_discovery_and_gateway_files_name_each_other_without_a_cycle() {
    for dir in ["discovery", "gateway"] {
        let graph = sibling_graph(dir);
        assert!(graph.len() > 10, "{dir} was read: {graph:?}");
        let cycles: Vec<String> = graph
            .keys()
            .filter_map(|m| cycle_from(&graph, m))
            .map(|p| p.join(" -> "))
            .collect();
        assert!(cycles.is_empty(), "import cycles in src/{dir}: {cycles:#?}");
    }
}

/// The files directly in the repository's `dir`, with their text.
fn files_of(dir: &str) -> Vec<(std::path::PathBuf, String)> {
    std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

/// Issue 52: the replicas' protocol has one home below the discovery API
/// and the gateway, and names neither (nor the composition root).
#[test]
fn the_replica_module_names_neither_the_discovery_api_nor_the_gateway() {
    let files = files_of("src/replica");
    for (path, text) in &files {
        for above in [
            "crate::discovery",
            "crate::gateway",
            "crate::operator",
            "super::super",
        ] {
            assert!(!text.contains(above), "{} names {above}", path.display());
        }
    }
    assert!(
        files.len() >= 10,
        "src/replica was read: {} files",
        files.len()
    );
    // And the protocol files are no longer where they were.
    for gone in [
        "src/discovery/internal.rs",
        "src/discovery/forward.rs",
        "src/discovery/replicas.rs",
        "src/operator/handover.rs",
        "src/operator/lease_key.rs",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(gone);
        assert!(!path.exists(), "{gone} moved to src/replica/");
    }
    // The members' copy loops live beside the protocol too; discovery/
    // keeps the routes that answer them.
    for (file, loop_fn) in [
        ("src/discovery/feed.rs", "async fn follow"),
        (
            "src/discovery/credentials_feed.rs",
            "async fn follow_credentials",
        ),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(loop_fn), "{file}: {loop_fn} is replica/'s");
    }
}

/// Issue 52: the gateway stands beside the discovery API on the lease
/// service (`replica::lease_service`) and the API's listing and tokens,
/// never on the API's state; what a gateway tells the leader is sent
/// from `replica::to_leader`, and discovery/ keeps only the routes that
/// take it.
#[test]
fn the_gateway_stands_beside_the_discovery_api_not_on_its_state() {
    let files = files_of("src/gateway");
    for (path, text) in files.iter().filter(|(p, _)| !is_test_file(p)) {
        // Its unit tests may build an API to take the parts from.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        assert!(
            !code.contains("ApiState"),
            "{} names the discovery API's state",
            path.display()
        );
    }
    assert!(
        files.len() >= 10,
        "src/gateway was read: {} files",
        files.len()
    );
    let to_leader = read("src/discovery/to_leader.rs");
    assert!(
        !to_leader.contains("async fn deliver"),
        "the delivery loop is replica/to_leader.rs's"
    );
}

#[test]
fn only_the_router_and_the_openapi_document_name_the_route_handlers() {
    let graph = sibling_graph("discovery");
    let naming: Vec<&String> = graph
        .iter()
        .filter(|(_, named)| named.contains("handlers"))
        .map(|(f, _)| f)
        .collect();
    assert_eq!(naming, ["openapi", "serving"], "{graph:#?}");
    // The transaction is its own module, which the lease routes share.
    for f in ["handlers", "replace"] {
        assert!(graph[f].contains("grant"), "{f} goes through grant.rs");
    }
}

// Files small enough to read in one sitting: no file under `src/` holds
// more than 500 lines of non-test code. Test code lives in `tests.rs` /
// `*_tests.rs` files or after the file's `#[cfg(test)]` module.

const MAX_LINES: usize = 500;

/// Files still over the limit, with the ceiling they may not grow past.
/// The list only shrinks: an entry whose file is back under the limit
/// fails the test until it is removed.
const OVER_THE_LIMIT: &[(&str, usize)] = &[];

/// Whether a file is test code as a whole (a test module of its parent,
/// or one of a `tests/` folder beside it).
fn is_test_file(p: &Path) -> bool {
    let name = p.file_name().unwrap().to_string_lossy();
    let in_tests = p
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|d| d == "tests");
    name == "tests.rs" || name.ends_with("_tests.rs") || in_tests
}

/// The discovery API's unit tests are split by concern (issue 52): the
/// harness and the crawler-facing routes in `discovery/tests.rs`, the
/// replicas, the replace route and the listing in `discovery/tests/`;
/// none is a file too long to find one's way in.
#[test]
fn the_discovery_tests_are_split_by_concern() {
    let root = repo().join("src/discovery");
    let mut files = vec![root.join("tests.rs")];
    for concern in ["listing", "replace", "replica"] {
        files.push(root.join("tests").join(format!("{concern}.rs")));
    }
    for f in files {
        let n = std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .lines()
            .count();
        assert!(n <= 1_200, "{}: {n} lines of tests", f.display());
    }
}

/// Lines before the first top-level `#[cfg(test)]`.
fn non_test_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .count()
}

#[test]
fn no_source_file_is_over_500_lines_of_non_test_code() {
    let src = repo().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut problems = Vec::new();
    for f in files.iter().filter(|f| !is_test_file(f)) {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let n = non_test_lines(&std::fs::read_to_string(f).unwrap());
        match OVER_THE_LIMIT.iter().find(|(p, _)| *p == rel) {
            Some((_, ceiling)) if n <= MAX_LINES => problems.push(format!(
                "{rel}: {n} lines, back under {MAX_LINES}: drop it from OVER_THE_LIMIT (was {ceiling})"
            )),
            Some((_, ceiling)) if n > *ceiling => {
                problems.push(format!("{rel}: {n} lines, grew past its ceiling {ceiling}"))
            }
            Some(_) => {}
            None if n > MAX_LINES => problems.push(format!(
                "{rel}: {n} lines of non-test code, over {MAX_LINES}: split it by job"
            )),
            None => {}
        }
    }
    for (p, _) in OVER_THE_LIMIT {
        if !files
            .iter()
            .any(|f| f.strip_prefix(&src).unwrap().to_string_lossy() == *p)
        {
            problems.push(format!("{p}: listed in OVER_THE_LIMIT but gone: drop it"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_line_counter_stops_at_the_test_module() {
    assert_eq!(non_test_lines("a\nb\n#[cfg(test)]\nmod tests {\n}\n"), 2);
    assert_eq!(non_test_lines("a\n    #[cfg(test)]\nb\n"), 3);
    assert!(is_test_file(Path::new("src/controller/plan_tests.rs")));
    assert!(is_test_file(Path::new("src/discovery/tests.rs")));
    assert!(!is_test_file(Path::new("src/controller/plan.rs")));
}

// libvirt's states, flags and error codes appear by their `virt` names
// (`sys::VIR_…`, `NO_FLAGS`), never as bare numbers: a reader should not
// need the C headers open to follow the kvm provider.

/// The text of every `rpc("vir…", …)` call in `text`, up to its closing
/// parenthesis.
fn libvirt_calls(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("rpc(\"vir") {
        let call = &rest[at..];
        let mut depth = 0usize;
        let mut end = call.len();
        for (i, c) in call.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push(&call[..end]);
        rest = &call[end..];
    }
    out
}

/// Bare integer literals in libvirt calls and in comparisons of libvirt
/// states and codes.
fn bare_libvirt_numbers(text: &str) -> Vec<String> {
    let number = regex_lite::Regex::new(r"(^|[^A-Za-z0-9_.])(\d+)([^A-Za-z0-9_.]|$)").unwrap();
    let strings = regex_lite::Regex::new(r#""[^"]*""#).unwrap();
    let compare =
        regex_lite::Regex::new(r"\b(state|code|kind|reason)\s*(==|!=|>=|<=|>|<)\s*\d").unwrap();
    let mut found = Vec::new();
    for call in libvirt_calls(text) {
        let code = strings.replace_all(call, "\"\"");
        if number.is_match(&code) {
            found.push(call.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    for l in text.lines().filter(|l| compare.is_match(l)) {
        found.push(l.trim().to_string());
    }
    found
}

#[test]
fn libvirt_numbers_go_by_their_names() {
    let kvm = repo().join("src/provider/kvm");
    let mut files = Vec::new();
    sources(&kvm, &mut files);
    assert!(files.len() > 5, "the kvm provider was read: {files:?}");
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !is_test_file(f)) {
        let text = std::fs::read_to_string(f).unwrap();
        let code = &text[..text.find("\n#[cfg(test)]").unwrap_or(text.len())];
        for hit in bare_libvirt_numbers(code) {
            found.push(format!("{}: {hit}", f.display()));
        }
    }
    assert!(found.is_empty(), "bare libvirt numbers: {found:#?}");
}

#[test]
fn the_libvirt_number_finder_finds_them() {
    let bad = "let v = rpc(\"virStorageVolDelete\", || v.delete(0))?;\n\
               if info.state == 2 { }\n\
               rpc(\"virDomainGetMetadata\", || {\n d.metadata(2, Some(URI), NO_FLAGS)\n })";
    assert_eq!(
        bare_libvirt_numbers(bad).len(),
        3,
        "{:?}",
        bare_libvirt_numbers(bad)
    );
    let good = "let v = rpc(\"virStorageVolDelete\", || v.delete(NO_FLAGS))?;\n\
                if info.state == sys::VIR_STORAGE_POOL_RUNNING { }\n\
                rpc(\"virStorageVolCreateXML\", || StorageVol::create_xml(&p, \"vol-1\", NO_FLAGS))";
    assert!(
        bare_libvirt_numbers(good).is_empty(),
        "{:?}",
        bare_libvirt_numbers(good)
    );
}
