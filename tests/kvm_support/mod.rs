//! Test harness of the kvm provider against the real thing: its own `sshd`
//! on 127.0.0.1, `virtlogd` and `libvirtd` (or a running libvirtd), a dir
//! storage pool and a Linux bridge, and an HTTP server on 127.0.0.1 serving
//! files. Everything started here is stopped when the [`Env`] drops.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use egress_proxies_operator::config::{DomainType, KvmConfig, KvmHost, MachineType};

const LIBVIRT_SOCK: &str = "/var/run/libvirt/libvirt-sock";

/// Runs a command, returning (success, stdout+stderr).
pub fn run(cmd: &str, args: &[&str]) -> (bool, String) {
    match Command::new(cmd).args(args).stdin(Stdio::null()).output() {
        Ok(o) => {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            (o.status.success(), s)
        }
        Err(e) => (false, e.to_string()),
    }
}

/// `virsh -c qemu:///system ARGS`.
pub fn virsh(args: &[&str]) -> (bool, String) {
    let mut all = vec!["-c", "qemu:///system", "-q"];
    all.extend_from_slice(args);
    run("virsh", &all)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("kvm harness: {what} not ready within {limit:?}");
    false
}

fn kill_pidfile(pidfile: &Path) {
    let Ok(text) = std::fs::read_to_string(pidfile) else {
        return;
    };
    let pid = text.trim().to_string();
    if pid.is_empty() {
        return;
    }
    let _ = run("kill", &[&pid]);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    wait_for("daemon exit", Duration::from_secs(10), || {
        // Gone, or a zombie waiting for a reaper that is not us.
        std::fs::read_to_string(proc_dir.join("stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    });
}

/// A tiny HTTP/1.1 file server on 127.0.0.1 that counts hits per path.
pub struct FileServer {
    pub url: String,
    files: Arc<Mutex<HashMap<String, PathBuf>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    delays: Arc<Mutex<HashMap<String, Duration>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    files: Arc<Mutex<HashMap<String, PathBuf>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    delays: Arc<Mutex<HashMap<String, Duration>>>,
    stop: Arc<AtomicBool>,
}

fn serve(mut s: TcpStream, sh: &Shared) -> std::io::Result<()> {
    let (files, hits) = (&sh.files, &sh.hits);
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let file = files.lock().unwrap().get(&path).cloned();
    let Some(file) = file else {
        s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        return Ok(());
    };
    let mut f = std::fs::File::open(&file)?;
    let len = f.metadata()?.len();
    write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
    )?;
    let delay = sh.delays.lock().unwrap().get(&path).copied();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 || sh.stop.load(Ordering::Relaxed) {
            break;
        }
        s.write_all(&buf[..n])?;
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    }
    Ok(())
}

impl FileServer {
    pub fn start() -> FileServer {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind http");
        l.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let files: Arc<Mutex<HashMap<String, PathBuf>>> = Arc::default();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let delays: Arc<Mutex<HashMap<String, Duration>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            files: files.clone(),
            hits: hits.clone(),
            delays: delays.clone(),
            stop: stop.clone(),
        });
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !shared.stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let sh = shared.clone();
                        workers.push(std::thread::spawn(move || {
                            let _ = serve(s, &sh);
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for w in workers {
                let _ = w.join();
            }
        });
        FileServer {
            url,
            files,
            hits,
            delays,
            stop,
            thread: Some(thread),
        }
    }

    /// Serves `file` at `path` (starting with '/'); returns the full URL.
    pub fn add(&self, path: &str, file: &Path) -> String {
        self.files
            .lock()
            .unwrap()
            .insert(path.to_string(), file.to_path_buf());
        format!("{}{path}", self.url)
    }

    /// Serves `file` at `path`, sleeping `delay` after every 64 KiB.
    pub fn add_slow(&self, path: &str, file: &Path, delay: Duration) -> String {
        self.delays.lock().unwrap().insert(path.to_string(), delay);
        self.add(path, file)
    }

    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The whole environment.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub ssh_port: u16,
    pub key_file: PathBuf,
    pub known_hosts: PathBuf,
    pub host_pub: String,
    pub pool: String,
    pub pool_dir: PathBuf,
    pub bridge: String,
    pub http: FileServer,
    sshd: Option<Child>,
    daemons: Vec<PathBuf>,
    extra_pools: Mutex<Vec<String>>,
    mounts: Mutex<Vec<PathBuf>>,
    domains: Mutex<Vec<String>>,
}

fn installed(bins: &[&str]) -> Option<String> {
    for b in bins {
        if !Path::new(b).exists() {
            return Some(format!("{b} is not installed"));
        }
    }
    None
}

fn libvirt_answers() -> bool {
    virsh(&["version"]).0
}

impl Env {
    /// Starts everything, or prints why the suite is skipped and returns None.
    pub fn start(tag: &str) -> Option<Env> {
        if let Some(why) = installed(&[
            "/usr/sbin/sshd",
            "/usr/sbin/libvirtd",
            "/usr/sbin/virtlogd",
            "/usr/bin/virsh",
            "/usr/bin/ssh-keygen",
            "/usr/bin/qemu-img",
        ]) {
            eprintln!("SKIPPING kvm suite: {why} (run .ci/run to install it)");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("epo-kvm-")
            .tempdir_in("/tmp")
            .ok()?;
        let d = dir.path().to_path_buf();
        let mut daemons = Vec::new();

        // Debian's udev gives /dev/kvm to root:kvm 0660; containers often
        // leave it root-only. libvirt then finds KVM "enabled when probing
        // but not available now" and re-probes QEMU (~50 s) on every define.
        if let Ok(md) = std::fs::metadata("/dev/kvm") {
            use std::os::unix::fs::MetadataExt;
            if md.mode() & 0o060 != 0o060 {
                eprintln!("kvm harness: giving /dev/kvm Debian's root:kvm 0660 so libvirt keeps its QEMU capability cache");
                let _ = run("chgrp", &["kvm", "/dev/kvm"]);
                let _ = run("chmod", &["0660", "/dev/kvm"]);
            }
        }

        // libvirt: use a running daemon, else start our own.
        if !(Path::new(LIBVIRT_SOCK).exists() && libvirt_answers()) {
            let vl = d.join("virtlogd.pid");
            let lv = d.join("libvirtd.pid");
            let (ok1, o1) = run("/usr/sbin/virtlogd", &["-d", "-p", vl.to_str()?]);
            let (ok2, o2) = run("/usr/sbin/libvirtd", &["-d", "-p", lv.to_str()?]);
            daemons.push(lv);
            daemons.push(vl);
            if !ok1 || !ok2 || !wait_for("libvirtd", Duration::from_secs(15), libvirt_answers) {
                eprintln!("SKIPPING kvm suite: libvirtd did not start: {o1} {o2}");
                for p in &daemons {
                    kill_pidfile(p);
                }
                return None;
            }
        }

        // sshd with generated keys.
        let key_file = d.join("id_ed25519");
        let host_key = d.join("host_ed25519");
        for k in [&key_file, &host_key] {
            let (ok, out) = run(
                "ssh-keygen",
                &["-q", "-t", "ed25519", "-N", "", "-f", k.to_str()?],
            );
            assert!(ok, "ssh-keygen: {out}");
        }
        std::fs::copy(d.join("id_ed25519.pub"), d.join("authorized_keys")).ok()?;
        let host_pub = std::fs::read_to_string(d.join("host_ed25519.pub")).ok()?;
        let ssh_port = free_port();
        let cfg = format!(
            "Port {ssh_port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\nAuthorizedKeysFile {ak}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nAllowStreamLocalForwarding yes\nX11Forwarding no\nLogLevel DEBUG1\n",
            hk = host_key.display(),
            pid = d.join("sshd.pid").display(),
            ak = d.join("authorized_keys").display(),
        );
        std::fs::write(d.join("sshd_config"), cfg).ok()?;
        let _ = std::fs::create_dir_all("/run/sshd");
        let sshd = Command::new("/usr/sbin/sshd")
            .args(["-D", "-E"])
            .arg(d.join("sshd.log"))
            .arg("-f")
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut sshd = match sshd {
            Ok(c) => c,
            Err(e) => {
                eprintln!("SKIPPING kvm suite: sshd did not start: {e}");
                for p in &daemons {
                    kill_pidfile(p);
                }
                return None;
            }
        };
        if !wait_for("sshd", Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", ssh_port)).is_ok()
        }) {
            let _ = sshd.kill();
            let _ = sshd.wait();
            for p in &daemons {
                kill_pidfile(p);
            }
            eprintln!("SKIPPING kvm suite: sshd is not listening");
            return None;
        }
        let known_hosts = d.join("known_hosts");
        let mut parts = host_pub.split_whitespace();
        let line = format!(
            "[127.0.0.1]:{ssh_port} {} {}\n",
            parts.next().unwrap_or(""),
            parts.next().unwrap_or("")
        );
        std::fs::write(&known_hosts, line).ok()?;
        // Hash it, as `ssh-keyscan -H` would.
        let (ok, out) = run("ssh-keygen", &["-H", "-f", known_hosts.to_str()?]);
        assert!(ok, "ssh-keygen -H: {out}");

        let suffix = format!("{tag}{}", std::process::id() % 100000);
        let pool = format!("epo-{suffix}");
        let pool_dir = d.join("pool");
        std::fs::create_dir_all(&pool_dir).ok()?;
        let (ok, out) = virsh(&[
            "pool-create-as",
            &pool,
            "dir",
            "--target",
            pool_dir.to_str()?,
        ]);
        assert!(ok, "pool-create-as: {out}");
        let bridge = format!("epobr{}", suffix.chars().rev().take(8).collect::<String>());
        let (ok, out) = run("ip", &["link", "add", &bridge, "type", "bridge"]);
        assert!(ok, "ip link add: {out}");
        let _ = run("ip", &["link", "set", &bridge, "up"]);

        Some(Env {
            dir,
            ssh_port,
            key_file,
            known_hosts,
            host_pub,
            pool,
            pool_dir,
            bridge,
            http: FileServer::start(),
            sshd: Some(sshd),
            daemons,
            extra_pools: Mutex::new(Vec::new()),
            mounts: Mutex::new(Vec::new()),
            domains: Mutex::new(Vec::new()),
        })
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.ssh_port)
    }

    /// A host entry for this environment.
    pub fn host(&self, name: &str) -> KvmHost {
        KvmHost {
            name: name.into(),
            address: self.address(),
            user: "root".into(),
            socket: LIBVIRT_SOCK.into(),
            pool: self.pool.clone(),
            bridge: self.bridge.clone(),
            domain_type: DomainType::Qemu,
        }
    }

    /// A provider block with one host `h1` and one machine type `small`.
    pub fn config(&self) -> KvmConfig {
        KvmConfig {
            ssh_key_file: self.key_file.display().to_string(),
            known_hosts_file: self.known_hosts.display().to_string(),
            insecure_ignore_host_key: false,
            disk_size_gb: 1,
            vendor_data: String::new(),
            install_guest_agent: None,
            images: Default::default(),
            machine_types: [(
                "small".to_string(),
                MachineType {
                    vcpus: 1,
                    memory_mib: 128,
                },
            )]
            .into_iter()
            .collect(),
            hosts: vec![self.host("h1")],
        }
    }

    /// Makes a qcow2 file of `size` (e.g. "64M") and serves it at `/<name>`.
    pub fn serve_qcow2(&self, name: &str, size: &str) -> (String, PathBuf) {
        let f = self.dir.path().join(name);
        let (ok, out) = run(
            "qemu-img",
            &["create", "-q", "-f", "qcow2", f.to_str().unwrap(), size],
        );
        assert!(ok, "qemu-img: {out}");
        (self.http.add(&format!("/{name}"), &f), f)
    }

    /// Records a domain for cleanup at drop.
    pub fn track(&self, domain: &str) {
        self.domains.lock().unwrap().push(domain.to_string());
    }

    /// Defines an extra persistent dir pool, left inactive.
    pub fn stopped_pool(&self, name: &str) -> String {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let (ok, out) = virsh(&[
            "pool-define-as",
            name,
            "dir",
            "--target",
            dir.to_str().unwrap(),
        ]);
        assert!(ok, "pool-define-as: {out}");
        self.extra_pools.lock().unwrap().push(name.to_string());
        name.to_string()
    }

    /// A running transient dir pool on a tmpfs of `size` (e.g. "8m"), or
    /// None when tmpfs cannot be mounted here.
    pub fn tiny_pool(&self, name: &str, size: &str) -> Option<String> {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).ok()?;
        let (ok, out) = run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir.to_str()?,
            ],
        );
        if !ok {
            eprintln!("kvm harness: no tmpfs ({out}); skipping the tiny-pool case");
            return None;
        }
        self.mounts.lock().unwrap().push(dir.clone());
        let (ok, out) = virsh(&["pool-create-as", name, "dir", "--target", dir.to_str()?]);
        assert!(ok, "pool-create-as: {out}");
        self.extra_pools.lock().unwrap().push(name.to_string());
        Some(name.to_string())
    }

    /// Volume names in the pool.
    pub fn volumes(&self) -> Vec<String> {
        let _ = virsh(&["pool-refresh", &self.pool]);
        let (ok, out) = virsh(&["vol-list", &self.pool]);
        assert!(ok, "vol-list: {out}");
        out.lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    }

    /// The pid of the libvirtd this harness started (None when it uses a
    /// daemon it does not own).
    pub fn own_libvirtd_pid(&self) -> Option<String> {
        let f = self.daemons.iter().find(|p| p.ends_with("libvirtd.pid"))?;
        std::fs::read_to_string(f)
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// The test sshd and its per-connection children.
    pub fn sshd_pids(&self) -> Vec<String> {
        let Some(root) = self.sshd.as_ref().map(|c| c.id().to_string()) else {
            return Vec::new();
        };
        let mut pids = vec![root.clone()];
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
                    // pid (comm) state ppid ...
                    let after = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
                    if after.split_whitespace().nth(1) == Some(root.as_str()) {
                        pids.push(name);
                    }
                }
            }
        }
        pids
    }

    pub fn domain_exists(&self, name: &str) -> bool {
        virsh(&["dominfo", name]).0
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Ok(log) = std::fs::read_to_string(self.dir.path().join("sshd.log")) {
            if std::env::var_os("KVM_TEST_SSHD_LOG").is_some() {
                eprintln!("sshd log:\n{log}");
            }
        }
        for d in self.domains.lock().unwrap().iter() {
            let _ = virsh(&["destroy", d]);
            let _ = virsh(&["undefine", d, "--nvram"]);
        }
        let _ = virsh(&["pool-destroy", &self.pool]);
        for p in self.extra_pools.lock().unwrap().iter() {
            let _ = virsh(&["pool-destroy", p]);
            let _ = virsh(&["pool-undefine", p]);
        }
        for m in self.mounts.lock().unwrap().iter() {
            let _ = run("umount", &[m.to_str().unwrap_or("")]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
        if let Some(mut c) = self.sshd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.daemons {
            kill_pidfile(p);
        }
    }
}

/// Freezes processes until dropped (SIGSTOP, then SIGCONT).
pub struct Frozen(pub Vec<String>);

impl Frozen {
    pub fn new(pid: &str) -> Frozen {
        Frozen::all(vec![pid.to_string()])
    }

    pub fn all(pids: Vec<String>) -> Frozen {
        for p in &pids {
            let _ = run("kill", &["-STOP", p]);
        }
        Frozen(pids)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = run("kill", &["-CONT", p]);
        }
    }
}

/// Peak resident set (VmHWM) of this process in KiB.
pub fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Logs the provider's debug lines when KVM_TEST_LOG is set (e.g. `debug`).
pub fn init_logs() {
    if let Ok(level) = std::env::var("KVM_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(format!("egress_proxies_operator={level}"))
            .with_test_writer()
            .try_init();
    }
}

/// A log sink shared with the subscriber installed by [`capture_logs`].
#[derive(Clone, Default)]
pub struct LogSink(pub Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogSink {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Captures every line of the crate at TRACE level, process-wide (one
/// test per binary), so a test can assert what never reaches the logs.
pub fn capture_logs() -> LogSink {
    let sink = LogSink::default();
    let w = sink.clone();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("egress_proxies_operator=trace")
        .with_ansi(false)
        .with_writer(move || w.clone())
        .try_init();
    sink
}

/// A fresh Proxy UID for a test.
pub fn uid(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}
