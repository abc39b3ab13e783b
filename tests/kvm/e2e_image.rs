//! The shipped image as users run it (issue 37): the OCI image `make image`
//! builds from the checkout's release binary, unpacked with umoci and run
//! by a real OCI runtime (runc) the way the Deployment runs it: read-only
//! root, uid 65532, no capabilities, only `/tmp` writable, the Pod's 128Mi
//! memory and 500m CPU limits. It must start, pass `/readyz`, and
//! reconcile a kubernetes Proxy to Ready (a real Squid Pod), a kvm Proxy
//! to a running domain (over SSH, through the image's libvirt helper; the
//! operator's own process never maps libvirt) and a gcp Proxy
//! to an instance (the Google client, against the Compute stand-in) on the
//! test cluster, inside its memory limit. Its size and RSS are printed.
#![cfg(feature = "kvm")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::gcp_standin::StandIn;
use crate::kvm_support::{self, virsh, Env};
use crate::support::{self, eventually, phase};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

/// The Pod's limits (config/manager/manager.yaml).
const MEMORY_LIMIT: u64 = 128 * 1024 * 1024;
const CPU_QUOTA_US: i64 = 50_000;
const NONROOT: u32 = 65532;

/// `make image`'s layout (the Makefile's `IMAGE_LAYOUT` default).
fn layout() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::repo().join("target"));
    target.join("image/oci")
}

fn tool(name: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        kvm_support::unavailable(&format!("{name} is not installed (apt-get install {name})"));
    }
}

fn run_ok(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn du_bytes(path: &Path) -> u64 {
    let out = run_ok("du", &["-sb", path.to_str().unwrap()]);
    out.split_whitespace().next().unwrap().parse().unwrap()
}

/// The image's one tag, from the layout's index.
fn tag(layout: &Path) -> String {
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A container run by runc under a state root of the test's own; killed
/// and deleted on drop.
struct Container {
    id: String,
    root: PathBuf,
    runc: Child,
}

impl Container {
    fn runc(&self, args: &[&str]) -> std::process::Output {
        Command::new("runc")
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .output()
            .unwrap()
    }

    fn pid(&self) -> u32 {
        let out = self.runc(&["state", &self.id]);
        let state: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        state["pid"].as_u64().unwrap_or(0) as u32
    }

    fn running(&mut self) -> bool {
        self.runc.try_wait().unwrap().is_none()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.runc(&["kill", &self.id, "KILL"]);
        let _ = self.runc.wait();
        let _ = self.runc(&["delete", "--force", &self.id]);
    }
}

/// `/proc/<pid>/status`'s `key` line, e.g. `VmRSS:  23456 kB`.
fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The image's bundle made into the Deployment's container: `args` after
/// the entrypoint, `env` added, host network (the test cluster and the kvm
/// host listen on loopback), and `shared` bind-mounted read-only at its own
/// path (kubeconfig, providers file, SSH key, all readable by 65532).
fn as_the_pod_runs_it(config: &mut Value, args: &[String], env: &[String], shared: &Path) {
    let process = &mut config["process"];
    let entrypoint = process["args"][0].clone();
    process["args"] = json!([entrypoint]
        .into_iter()
        .chain(args.iter().map(|a| json!(a)))
        .collect::<Vec<_>>());
    let image_env = process["env"].as_array().cloned().unwrap_or_default();
    process["env"] = json!(image_env
        .into_iter()
        .chain(env.iter().map(|e| json!(e)))
        .collect::<Vec<_>>());
    process["terminal"] = json!(false);
    // securityContext: drop ALL, allowPrivilegeEscalation false.
    process["capabilities"] =
        json!({"bounding": [], "effective": [], "permitted": [], "inheritable": [], "ambient": []});
    process["noNewPrivileges"] = json!(true);
    config["root"]["readonly"] = json!(true);
    let mounts = config["mounts"].as_array_mut().unwrap();
    // The Deployment's emptyDir at /tmp, the one writable path.
    mounts.retain(|m| m["destination"] != "/tmp");
    mounts.push(json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]}));
    let dir = shared.to_str().unwrap();
    mounts.push(
        json!({"destination": dir, "type": "bind", "source": dir, "options": ["rbind", "ro"]}),
    );
    let linux = &mut config["linux"];
    linux["namespaces"]
        .as_array_mut()
        .unwrap()
        .retain(|n| n["type"] != "network" && n["type"] != "user");
    linux.as_object_mut().unwrap().remove("uidMappings");
    linux.as_object_mut().unwrap().remove("gidMappings");
    linux["resources"] = json!({
        "memory": {"limit": MEMORY_LIMIT, "swap": MEMORY_LIMIT},
        "cpu": {"quota": CPU_QUOTA_US, "period": 100_000},
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_read_only_as_nonroot_under_the_pods_limits_and_reconciles() {
    for t in ["umoci", "runc"] {
        tool(t);
    }
    support::require_squid_pods();
    let layout = layout();
    if !layout.join("index.json").exists() {
        kvm_support::unavailable(&format!(
            "no image at {} (make image builds it; make test does)",
            layout.display()
        ));
    }
    let tag = tag(&layout);
    let scratch = tempfile::tempdir().unwrap();
    let bundle = scratch.path().join("bundle");
    let image = format!("{}:{tag}", layout.display());
    run_ok(
        "umoci",
        &["unpack", "--image", &image, bundle.to_str().unwrap()],
    );
    let packed = du_bytes(&layout.join("blobs"));
    let unpacked = du_bytes(&bundle.join("rootfs"));
    println!(
        "image {image}: {:.1} MiB compressed, {:.1} MiB unpacked",
        packed as f64 / 1048576.0,
        unpacked as f64 / 1048576.0
    );

    // The image's own config, as the Dockerfile writes it.
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["process"]["user"]["uid"], NONROOT, "{config}");
    assert_eq!(
        config["process"]["args"][0],
        "/usr/local/bin/egress-proxies-operator"
    );
    let rootfs = bundle.join("rootfs");
    for path in ["bin/sh", "usr/bin/apt", "usr/bin/dpkg"] {
        assert!(
            !rootfs.join(path).exists(),
            "a distroless image has no {path}"
        );
    }
    let version = run_ok(
        "/usr/sbin/chroot",
        &[
            "--userspec=65532:65532",
            rootfs.to_str().unwrap(),
            "/usr/local/bin/egress-proxies-operator",
            "--version",
        ],
    );
    println!("{}", version.trim());

    // The kvm host and the probe target, then the files the container
    // reads, owned by 65532 as a Secret volume with fsGroup gives them.
    let env = Env::start("image");
    let (url, _) = env.serve_qcow2("base.qcow2", "64M");
    let ground = support::ground("image").await;
    let target = support::http_target_on(ground.cluster.host_ip()).await;
    let shared = scratch.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let kvm = env.providers_yaml("kvm-test", "h1", "test-image", &url);
    let key = shared.join("id_ed25519");
    let known = shared.join("known_hosts");
    let kvm = kvm
        .replace(env.key_file.to_str().unwrap(), key.to_str().unwrap())
        .replace(env.known_hosts.to_str().unwrap(), known.to_str().unwrap());
    std::fs::copy(&env.key_file, &key).unwrap();
    std::fs::copy(&env.known_hosts, &known).unwrap();
    std::fs::copy(ground.cluster.kubeconfig(), shared.join("kubeconfig")).unwrap();
    let kubernetes = support::kubernetes_reaching("kubernetes", "", target.ip());
    let kvm_entry = kvm.strip_prefix("providers:\n").unwrap();
    let gcp = StandIn::start().await;
    let gcp_entry = gcp.providers_yaml().replacen("providers:\n", "", 1);
    std::fs::write(
        shared.join("providers.yaml"),
        format!("{kubernetes}{kvm_entry}{gcp_entry}"),
    )
    .unwrap();
    run_ok("chown", &["-R", "65532:65532", shared.to_str().unwrap()]);
    run_ok("chmod", &["0755", scratch.path().to_str().unwrap()]);

    let probes = support::free_port();
    let args: Vec<String> = [
        format!(
            "--providers-config={}",
            shared.join("providers.yaml").display()
        ),
        format!("--health-probe-bind-address=127.0.0.1:{probes}"),
        "--discovery-bind-address=0".into(),
        "--metrics-secure=false".into(),
        "--metrics-bind-address=0".into(),
        format!("--proxy-namespace={}", ground.ns),
        format!("--operator-namespace={}", ground.ns),
        format!("--default-probe-url=http://{target}/"),
        "--default-probe-expected-status=200".into(),
    ]
    .into();
    let env_vars = [
        format!("KUBECONFIG={}", shared.join("kubeconfig").display()),
        format!("INSTALLATION_ID={}", ground.ns),
        format!("POD_NAMESPACE={}", ground.ns),
    ];
    as_the_pod_runs_it(&mut config, &args, &env_vars, &shared);
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();

    let root = scratch.path().join("runc");
    let id = format!("epo-image-{}", std::process::id());
    let log = scratch.path().join("operator.log");
    let runc = Command::new("runc")
        .arg("--root")
        .arg(&root)
        .args(["run", "--bundle", bundle.to_str().unwrap(), &id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut container = Container { id, root, runc };
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    let ready = format!("http://127.0.0.1:{probes}/readyz");
    let started = std::time::Instant::now();
    loop {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &ready])
            .output()
            .unwrap();
        if out.stdout == b"200" {
            break;
        }
        assert!(
            container.running() && started.elapsed() < Duration::from_secs(90),
            "no /readyz from the image's operator (running: {}):\n{}",
            container.running(),
            logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let pid = container.pid();
    assert!(pid > 0, "runc state names no pid:\n{}", logs());
    // As the Pod's securityContext asks: uid 65532, read-only root.
    assert!(
        status_field(pid, "Uid:").starts_with(&format!("{NONROOT}\t")),
        "{}",
        status_field(pid, "Uid:")
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_mount = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .unwrap();
    assert!(
        root_mount
            .split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{root_mount}"
    );

    // A kubernetes Proxy Ready through its Squid Pod, a kvm Proxy with its
    // domain running, a gcp Proxy with its instance: every provider's code
    // (the libvirt helper and the Google client) at work.
    let proxies: Api<Proxy> = ground.proxies();
    proxies
        .create(&PostParams::default(), &support::kube_proxy("pod"))
        .await
        .unwrap();
    let k1 = support::proxy(
        "vm",
        json!({"provider": "kvm-test", "port": 3128,
               "placement": {"zone": "h1", "machineType": "small", "image": "test-image"},
               "cloudInit": {"inline": "#cloud-config\n"}}),
    );
    let created = proxies.create(&PostParams::default(), &k1).await.unwrap();
    let domain = egress_proxies_operator::provider::naming::name_from_uid(
        created.metadata.uid.as_deref().unwrap(),
    );
    env.track(&domain);
    let sample = support::repo_yaml("config/samples/proxy_gcp.yaml");
    let vm_on_gcp = support::proxy("gce", serde_json::to_value(&sample["spec"]).unwrap());
    proxies
        .create(&PostParams::default(), &vm_on_gcp)
        .await
        .unwrap();
    eventually(
        "the kubernetes Proxy Ready",
        Duration::from_secs(180),
        || async { (phase(&proxies.get("pod").await.ok()?) == Some("Ready")).then_some(()) },
    )
    .await;
    eventually(
        "the kvm Proxy's domain recorded",
        Duration::from_secs(180),
        || async { proxies.get("vm").await.ok()?.status?.provider_id },
    )
    .await;
    let (ok, state) = virsh(&["domstate", &domain]);
    assert!(ok && state.trim() == "running", "domain state: {state}");
    eventually(
        "the gcp Proxy's instance",
        Duration::from_secs(120),
        || async { proxies.get("gce").await.ok()?.status?.provider_id },
    )
    .await;
    assert_eq!(
        gcp.instance_count(),
        1,
        "one instance inserted on the stand-in"
    );
    // The domain was made by the image's libvirt helper, in a process of
    // its own: the operator's never maps libvirt.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps.contains("libc.so"),
        "the operator's memory map is readable: {maps}"
    );
    assert!(
        !maps.contains("libvirt"),
        "libvirt's client is not loaded in the operator's process"
    );

    let memory = |file: &str| {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let path = cgroup
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()));
        path.and_then(|p| std::fs::read_to_string(format!("/sys/fs/cgroup/memory{p}/{file}")).ok())
            .map(|t| t.trim().to_string())
            .unwrap_or_default()
    };
    println!(
        "the image's operator after reconciling all three: RSS {}, peak {}; its cgroup: limit {}, peak usage {} bytes, hit the limit {} times",
        status_field(pid, "VmRSS:"),
        status_field(pid, "VmHWM:"),
        memory("memory.limit_in_bytes"),
        memory("memory.max_usage_in_bytes"),
        memory("memory.failcnt"),
    );
    assert_eq!(
        memory("memory.limit_in_bytes"),
        MEMORY_LIMIT.to_string(),
        "the 128Mi limit applies"
    );

    // Deleting both: the operator removes the Pod and the domain.
    for name in ["pod", "vm", "gce"] {
        proxies
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("the Proxies released", Duration::from_secs(120), || async {
        let left = proxies.list(&Default::default()).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    assert!(!env.domain_exists(&domain), "the domain must be gone");
    assert!(
        container.running(),
        "the container must still run:\n{}",
        logs()
    );
    let text = logs();
    assert!(!text.contains("panicked"), "{text}");
}
