//! The launcher leaves nothing behind: after SIGTERM with a Pod running, and
//! after its parent dies, no process of the cluster, no veth, bridge or
//! cgroup it made is left.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use test_cluster::{Options, TestCluster};

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie is gone for our purpose: it holds nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if alive(pid) && String::from_utf8_lossy(&cmd).contains(needle) {
            out.push(pid);
        }
    }
    out
}

fn links() -> String {
    let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bridge that carries `gateway`.
fn bridge_of(gateway: &str) -> String {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.contains(&format!("inet {gateway}/")))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no interface has {gateway}: {text}"))
        .to_string()
}

/// The memory cgroup directories under ours whose name mentions `pid`.
fn cgroups_of(pid: u32) -> Vec<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = own
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, c, path) = (p.next()?, p.next()?, p.next()?);
            c.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .unwrap_or_default();
    let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("testcluster-") && n.ends_with(&format!("-{pid}")))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_pod_running_leaves_nothing_behind() {
    let cluster = TestCluster::start(&Options {
        images: vec!["busybox".into()],
        ..Default::default()
    })
    .expect("the cluster starts");
    let info = cluster.info().unwrap().clone();
    let gateway = info.gateway.unwrap().to_string();
    let bridge = bridge_of(&gateway);

    let pods: Api<Pod> = Api::namespaced(cluster.client().await, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sleeper"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
            "command": ["/bin/sh", "-c", "sleep 600 & sleep 600"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = pods.get("sleeper").await.unwrap();
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            break;
        }
        assert!(Instant::now() < deadline, "the Pod never ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dir = info.kubeconfig.parent().unwrap().display().to_string();
    let before = processes_mentioning(&dir);
    assert!(
        before.len() >= 5,
        "the control plane and the Pod's helpers: {before:?}"
    );
    assert!(links().contains("veth") || links().contains(&bridge));
    // The launcher's own pid: the parent of the control plane.
    let agent_pid = std::fs::read_to_string(format!("/proc/{}/stat", info.pids["etcd"]))
        .unwrap()
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u32>()
        .unwrap();
    assert!(!cgroups_of(agent_pid).is_empty(), "the Pod has a cgroup");
    // By its interface index as well as its name: another test's cluster
    // starting meanwhile may take the freed name, never the index.
    let ours = links()
        .lines()
        .find_map(|l| {
            let (index, rest) = l.split_once(": ")?;
            rest.starts_with(&format!("{bridge}:"))
                .then(|| format!("{index}: {bridge}:"))
        })
        .expect("the bridge is listed");

    cluster.stop();
    let sleepers = || processes_mentioning("sleep 600 & sleep 600");
    wait_until("every process gone", Duration::from_secs(30), || {
        processes_mentioning(&dir).is_empty() && sleepers().is_empty()
    });
    for pid in info.pids.values() {
        assert!(!alive(*pid), "{pid} is still running");
    }
    assert!(
        !links().lines().any(|l| l.starts_with(&ours)),
        "the bridge is left: {}",
        links()
    );
    assert!(cgroups_of(agent_pid).is_empty(), "cgroups are left");
    assert!(!Path::new(&dir).exists(), "the state directory is left");
}

#[test]
fn the_cluster_stops_when_its_parent_dies() {
    let state = std::env::temp_dir().join(format!("tc-orphan-{}", std::process::id()));
    let launcher = test_cluster::bin("test-cluster");
    // A shell starts the launcher in the background and waits; killing the
    // shell orphans the launcher.
    let script = format!(
        "{} --dir {} --pods none --bin-dir {} --remove-dir & wait",
        launcher.display(),
        state.display(),
        test_cluster::bin_dir().display()
    );
    let mut shell = Command::new("/bin/sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(shell.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("cluster.json")).unwrap())
            .unwrap();
    let pids: Vec<u32> = info["pids"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        pids.len(),
        4,
        "etcd and three control-plane components: {info}"
    );
    shell.kill().unwrap();
    shell.wait().unwrap();
    wait_until(
        "the orphaned cluster to stop",
        Duration::from_secs(30),
        || {
            pids.iter().all(|p| !alive(*p))
                && processes_mentioning(&state.display().to_string()).is_empty()
        },
    );
    wait_until("its state removed", Duration::from_secs(10), || {
        !state.exists()
    });
}
