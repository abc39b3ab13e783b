//! A tiny kubelet: every Pod whose first container has `SQUID_CONF` runs as a
//! real `squid -N` bound to its own loopback address 127.0.0.N.
//!
//! Policy: a squid that exits marks its Pod `Failed` (no restart). Pods without
//! `SQUID_CONF` stay `Pending`. Deleting a Pod (or setting its
//! deletionTimestamp) kills its process group.

use crate::store::{now_rfc3339, Store};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where squid lives; tests skip when it is absent.
pub const SQUID: &str = "/usr/sbin/squid";

/// Directives the kubelet owns; lines of the user's config starting with them are dropped.
const OWNED: &[&str] = &[
    "http_port",
    "https_port",
    "pid_filename",
    "cache_log",
    "access_log",
    "cache_store_log",
    "coredump_dir",
    "cache_dir",
    "cache",
    "cache_effective_user",
    "cache_effective_group",
    "icp_port",
    "htcp_port",
    "snmp_port",
    "pinger_enable",
    "shutdown_lifetime",
    "workers",
];

struct Running {
    child: Child,
    ip: u8,
    uid: String,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_group(&mut self.child);
        }
        remove_shm(&service_name(self.ip));
    }
}

type Key = (String, String);

#[derive(Default)]
struct State {
    pods: HashMap<Key, Running>,
    /// Pods that failed or are not runnable: never retried (by uid).
    done: HashMap<Key, String>,
}

/// The kubelet; dropping it kills every squid it started.
pub struct Kubelet {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A poisoned lock only means another thread panicked; the map is still valid.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(pod: &Value) -> Key {
    let s = |p: &str| {
        pod.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

fn squid_conf(pod: &Value) -> Option<String> {
    pod.pointer("/spec/containers/0/env")?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some("SQUID_CONF"))?
        .get("value")?
        .as_str()
        .map(String::from)
}

/// The port from containers[0].ports[0] or from the conf's http_port line (default 3128).
fn port_of(pod: &Value, conf: &str) -> u16 {
    if let Some(p) = pod
        .pointer("/spec/containers/0/ports/0/containerPort")
        .and_then(Value::as_u64)
    {
        return p as u16;
    }
    conf.lines()
        .map(str::trim)
        .find_map(|l| {
            let rest = l.strip_prefix("http_port")?;
            let first = rest.split_whitespace().next()?;
            first.rsplit(':').next()?.parse().ok()
        })
        .unwrap_or(3128)
}

/// The conf the kubelet runs: the user's lines minus owned directives, plus ours.
pub fn rewrite_conf(
    conf: &str,
    ip: Ipv4Addr,
    port: u16,
    dir: &std::path::Path,
    name: &str,
) -> String {
    let mut out: Vec<String> = conf
        .lines()
        .filter(|l| {
            let first = l.split_whitespace().next().unwrap_or_default();
            !OWNED.contains(&first)
        })
        .map(String::from)
        .collect();
    let d = dir.display();
    out.push(format!("http_port {ip}:{port}"));
    out.push(format!("pid_filename {d}/squid.pid"));
    out.push(format!("cache_log {d}/cache.log"));
    out.push(format!("access_log stdio:{d}/access.log"));
    out.push("cache_store_log none".into());
    out.push(format!("coredump_dir {d}"));
    out.push("cache deny all".into());
    out.push("cache_mem 8 MB".into());
    out.push("icp_port 0".into());
    out.push("htcp_port 0".into());
    out.push("pinger_enable off".into());
    out.push("shutdown_lifetime 0 seconds".into());
    if !conf
        .lines()
        .any(|l| l.trim_start().starts_with("visible_hostname"))
    {
        out.push(format!("visible_hostname {name}"));
    }
    // squid started as root switches to cache_effective_user (Debian: proxy); the
    // per-pod directory is world-writable so that works both as root and not.
    out.join("\n") + "\n"
}

fn pick_ip(st: &State, port: u16) -> Option<u8> {
    (2u8..=250).find(|n| {
        !st.pods.values().any(|r| r.ip == *n)
            && TcpListener::bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, *n), port))).is_ok()
    })
}

fn service_name(ip: u8) -> String {
    format!("tk{}n{ip}", std::process::id())
}

/// Remove the /dev/shm segments squid leaves behind for a service name.
fn remove_shm(service: &str) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("{service}-"))
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Kill a process group: TERM, a short grace, then KILL; reaps the child.
fn kill_group(child: &mut Child) {
    let pgid = child.id() as i32;
    // SAFETY: kill(2) with a negative pid signals a process group we created.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    for _ in 0..40 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above; the group may already be gone, which is harmless.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
}

impl Kubelet {
    pub fn start(store: Arc<Store>) -> Kubelet {
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let task = tokio::spawn(async move { run(store, st).await });
        Kubelet { state, task }
    }

    /// Kill every squid (also done on drop).
    pub fn stop_all(&self) {
        let mut st = lock(&self.state);
        for (_, mut r) in st.pods.drain() {
            kill_group(&mut r.child);
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
        self.stop_all();
    }
}

async fn run(store: Arc<Store>, state: Arc<Mutex<State>>) {
    let Some(def) = store.def("", "pods").cloned() else {
        return;
    };
    let mut changes = store.subscribe();
    let mut last = 0u64;
    let mut resync = true;
    loop {
        changes.mark_unchanged();
        if resync {
            let (pods, rv) = store.list(&def, &Default::default());
            last = rv;
            resync = false;
            let live: Vec<Key> = pods.iter().map(key).collect();
            {
                let mut st = lock(&state);
                let gone: Vec<Key> = st
                    .pods
                    .keys()
                    .filter(|k| !live.contains(k))
                    .cloned()
                    .collect();
                for k in gone {
                    if let Some(mut r) = st.pods.remove(&k) {
                        kill_group(&mut r.child);
                    }
                }
            }
            for p in pods {
                sync_pod(&store, &state, &p, false);
            }
        } else {
            match store.events_since(&def.key(), last) {
                Err(_) => {
                    resync = true;
                    continue;
                }
                Ok(evs) => {
                    for ev in evs {
                        last = ev.rv;
                        sync_pod(&store, &state, &ev.object, ev.etype == "DELETED");
                    }
                }
            }
        }
        check_exits(&store, &state);
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
}

fn stop(state: &Mutex<State>, k: &Key) {
    let r = lock(state).pods.remove(k);
    if let Some(mut r) = r {
        kill_group(&mut r.child);
    }
}

fn sync_pod(store: &Arc<Store>, state: &Arc<Mutex<State>>, pod: &Value, deleted: bool) {
    let k = key(pod);
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
    if deleted || deleting {
        stop(state, &k);
        lock(state).done.remove(&k);
        return;
    }
    {
        let mut st = lock(state);
        if let Some(r) = st.pods.get(&k) {
            if r.uid == uid {
                return;
            }
            // Same name, new object: the old one is gone.
            if let Some(mut r) = st.pods.remove(&k) {
                kill_group(&mut r.child);
            }
        }
        if st.done.get(&k) == Some(&uid) {
            return;
        }
    }
    let Some(conf) = squid_conf(pod) else {
        lock(state).done.insert(k, uid);
        return;
    };
    let port = port_of(pod, &conf);
    let started = spawn_squid(state, &k, &uid, &conf, port);
    match started {
        Ok(ip) => {
            let store = store.clone();
            let state = state.clone();
            tokio::spawn(async move { wait_ready(store, state, k, uid, ip, port).await });
        }
        Err(msg) => {
            lock(state).done.insert(k.clone(), uid);
            set_failed(store, &k, &msg, -1);
        }
    }
}

fn spawn_squid(
    state: &Mutex<State>,
    k: &Key,
    uid: &str,
    conf: &str,
    port: u16,
) -> Result<u8, String> {
    let mut st = lock(state);
    let ip = pick_ip(&st, port).ok_or("no free loopback address")?;
    let dir = tempfile::Builder::new()
        .prefix("test-kubelet-")
        .tempdir()
        .map_err(|e| format!("tempdir: {e}"))?;
    let mode = |p: &std::path::Path, m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
    };
    mode(dir.path(), 0o777).map_err(|e| format!("chmod: {e}"))?;
    let conf_path: PathBuf = dir.path().join("squid.conf");
    let text = rewrite_conf(conf, Ipv4Addr::new(127, 0, 0, ip), port, dir.path(), &k.1);
    std::fs::write(&conf_path, text).map_err(|e| format!("writing conf: {e}"))?;
    mode(&conf_path, 0o644).map_err(|e| format!("chmod: {e}"))?;
    let log = std::fs::File::create(dir.path().join("stderr.log")).map_err(|e| e.to_string())?;
    // A shell watchdog runs squid and kills it when this process disappears, so
    // even a SIGKILLed test leaves nothing behind (squid drops privileges, which
    // clears PR_SET_PDEATHSIG, so that alone would not do).
    // A per-pod service name keeps squid's shared-memory segments (/dev/shm) apart.
    let service = service_name(ip);
    remove_shm(&service);
    let script = r#"squid="$1"; conf="$2"; parent="$3"; service="$4"
"$squid" -N -n "$service" -f "$conf" & s=$!
trap 'kill -KILL "$s" 2>/dev/null; wait "$s"; exit 143' TERM INT
while kill -0 "$parent" 2>/dev/null && kill -0 "$s" 2>/dev/null; do sleep 0.3; done
if kill -0 "$s" 2>/dev/null; then kill -TERM "$s"; sleep 0.5; kill -KILL "$s" 2>/dev/null; fi
wait "$s""#;
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg("squid-watchdog")
        .arg(SQUID)
        .arg(&conf_path)
        .arg(std::process::id().to_string())
        .arg(&service)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("spawning squid: {e}"))?;
    st.pods.insert(
        k.clone(),
        Running {
            child,
            ip,
            uid: uid.to_string(),
            _dir: dir,
        },
    );
    Ok(ip)
}

async fn wait_ready(
    store: Arc<Store>,
    state: Arc<Mutex<State>>,
    k: Key,
    uid: String,
    ip: u8,
    port: u16,
) {
    let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, ip), port));
    for _ in 0..200 {
        let alive = lock(&state).pods.get(&k).is_some_and(|r| r.uid == uid);
        if !alive {
            return;
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            set_running(&store, &k, &uid, ip);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(&state, &k);
    lock(&state).done.insert(k.clone(), uid);
    set_failed(
        &store,
        &k,
        "squid did not accept connections within 20s",
        -1,
    );
}

fn write_status(store: &Store, k: &Key, f: impl FnOnce(&mut Value)) {
    let Some(def) = store.def("", "pods") else {
        return;
    };
    let _ = store.update(def, Some(&k.0), &k.1, true, |cur| {
        let mut new = cur.clone();
        f(&mut new);
        Ok(new)
    });
}

fn container_name(pod: &Value) -> (String, String) {
    let s = |p: &str| {
        pod.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (s("/spec/containers/0/name"), s("/spec/containers/0/image"))
}

fn set_running(store: &Store, k: &Key, uid: &str, ip: u8) {
    let ip = format!("127.0.0.{ip}");
    let now = now_rfc3339();
    write_status(store, k, |pod| {
        if pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return;
        }
        let (name, image) = container_name(pod);
        let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
        pod["status"] = json!({
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": now,
            "qosClass": "BestEffort",
            "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                           cond("ContainersReady"), cond("PodScheduled")],
            "containerStatuses": [{
                "name": name, "image": image, "imageID": "", "ready": true, "started": true,
                "restartCount": 0, "containerID": format!("squid://{ip}"),
                "state": {"running": {"startedAt": now}},
            }],
        });
    });
}

fn set_failed(store: &Store, k: &Key, msg: &str, code: i32) {
    let now = now_rfc3339();
    write_status(store, k, |pod| {
        let (name, image) = container_name(pod);
        let st = pod.get("status").cloned().unwrap_or_else(|| json!({}));
        let mut st = st;
        st["phase"] = json!("Failed");
        st["message"] = json!(msg);
        st["reason"] = json!("Error");
        st["conditions"] = json!([{"type": "Ready", "status": "False", "lastTransitionTime": now,
            "reason": "PodFailed"}]);
        st["containerStatuses"] = json!([{
            "name": name, "image": image, "imageID": "", "ready": false, "started": false,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": "Error", "message": msg, "finishedAt": now}},
        }]);
        pod["status"] = st;
    });
}

/// Mark Pods whose squid exited as Failed.
fn check_exits(store: &Store, state: &Mutex<State>) {
    let mut exited = Vec::new();
    {
        let mut st = lock(state);
        let keys: Vec<Key> = st.pods.keys().cloned().collect();
        for k in keys {
            let status = st
                .pods
                .get_mut(&k)
                .and_then(|r| r.child.try_wait().ok().flatten());
            if let Some(status) = status {
                if let Some(r) = st.pods.remove(&k) {
                    let log = std::fs::read_to_string(r._dir.path().join("cache.log"))
                        .unwrap_or_default();
                    let fatal = log
                        .lines()
                        .find(|l| l.contains("FATAL"))
                        .unwrap_or("squid exited")
                        .to_string();
                    st.done.insert(k.clone(), r.uid.clone());
                    exited.push((k, fatal, status.code().unwrap_or(-1)));
                }
            }
        }
    }
    for (k, msg, code) in exited {
        set_failed(store, &k, &msg, code);
    }
}
