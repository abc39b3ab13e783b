//! Test harness of the kvm provider against the real thing: its own `sshd`
//! on 127.0.0.1, `virtlogd` and `libvirtd` (or a running libvirtd), a dir
//! storage pool and a Linux bridge, and an HTTP server on 127.0.0.1 serving
//! files. On request ([`Env::guest_network`], [`Env::serve_ipxe_disk`]) the
//! bridge gets a private /24 with `dnsmasq` handing out DHCP leases and a
//! TFTP file on it, and a boot disk whose firmware boot runs iPXE, so a
//! guest takes an address the host sees in its ARP table. Everything
//! started here is stopped when the [`Env`] drops.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use egress_proxies_operator::config::{DomainType, KvmConfig, KvmHost, MachineType};

const LIBVIRT_SOCK: &str = "/var/run/libvirt/libvirt-sock";
/// `kvm.allowedAddresses` of the test providers: the guest networks
/// [`Env::guest_network`] makes (10.213.n.0/24) and the address
/// kvm_lifecycle puts in the host's neighbour table. Private ranges, which
/// the operator otherwise never dials.
pub const GUEST_ADDRESSES: [&str; 2] = ["10.213.0.0/16", "10.199.77.0/24"];

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
    test_cluster::process::free_port().unwrap_or(0)
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
    dnsmasq: Mutex<Option<Child>>,
    daemons: Vec<PathBuf>,
    extra_pools: Mutex<Vec<String>>,
    mounts: Mutex<Vec<PathBuf>>,
    domains: Mutex<Vec<String>>,
    /// Held for the Env's life (released after its Drop has stopped the
    /// daemons): see [`Turn`].
    _turn: Turn,
}

/// One Env at a time per test binary. Every Env shares the host's system
/// libvirtd (`qemu:///system`): the first starts it when none answers and
/// stops it when it ends, so two at once would race to start it and one
/// would stop it under the other.
struct Turn;

static TURN: Mutex<bool> = Mutex::new(false);
static TURN_FREED: std::sync::Condvar = std::sync::Condvar::new();

impl Turn {
    fn take() -> Turn {
        let mut busy = TURN.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            busy = TURN_FREED.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy = true;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *TURN.lock().unwrap_or_else(|e| e.into_inner()) = false;
        TURN_FREED.notify_one();
    }
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

/// A part of the kvm suite is missing: the test fails with the reason, as
/// every other missing part does (a skip would hide a broken install).
pub fn unavailable(why: &str) -> ! {
    panic!("the kvm suite cannot run: {why} (.ci/run installs and starts it)");
}

/// A step of the harness itself failed (a temp dir, a file it writes): the
/// test fails with the step and the reason, never passes having tested
/// nothing.
fn broken(step: &str, why: impl std::fmt::Display) -> ! {
    panic!("the kvm harness could not {step}: {why}");
}

/// A path as text for a command's argument (the harness's own paths are
/// UTF-8; one that is not fails the test).
fn text(p: &Path) -> &str {
    p.to_str()
        .unwrap_or_else(|| broken("use a path", format!("{} is not UTF-8", p.display())))
}

impl Env {
    /// Starts everything; a missing part or a failed step fails the test
    /// with the reason.
    pub fn start(tag: &str) -> Env {
        Env::start_in(tag, Path::new("/tmp"))
    }

    /// [`Env::start`] with its state under `root`.
    pub fn start_in(tag: &str, root: &Path) -> Env {
        let turn = Turn::take();
        if let Some(why) = installed(&[
            "/usr/sbin/sshd",
            "/usr/sbin/libvirtd",
            "/usr/sbin/virtlogd",
            "/usr/bin/virsh",
            "/usr/bin/ssh-keygen",
            "/usr/bin/qemu-img",
        ]) {
            unavailable(&why);
        }
        let dir = tempfile::Builder::new()
            .prefix("epo-kvm-")
            .tempdir_in(root)
            .unwrap_or_else(|e| broken(&format!("make its temp dir in {}", root.display()), e));
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
            let (ok1, o1) = run("/usr/sbin/virtlogd", &["-d", "-p", text(&vl)]);
            let (ok2, o2) = run("/usr/sbin/libvirtd", &["-d", "-p", text(&lv)]);
            daemons.push(lv);
            daemons.push(vl);
            if !ok1 || !ok2 || !wait_for("libvirtd", Duration::from_secs(15), libvirt_answers) {
                for p in &daemons {
                    kill_pidfile(p);
                }
                unavailable(&format!("libvirtd did not start: {o1} {o2}"));
            }
        }

        // sshd with generated keys.
        let key_file = d.join("id_ed25519");
        let host_key = d.join("host_ed25519");
        for k in [&key_file, &host_key] {
            new_ed25519_key(k);
        }
        std::fs::copy(d.join("id_ed25519.pub"), d.join("authorized_keys"))
            .unwrap_or_else(|e| broken("write authorized_keys", e));
        let host_pub = std::fs::read_to_string(d.join("host_ed25519.pub"))
            .unwrap_or_else(|e| broken("read the host key", e));
        let ssh_port = free_port();
        let cfg = format!(
            "Port {ssh_port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\nAuthorizedKeysFile {ak}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nAllowStreamLocalForwarding yes\nX11Forwarding no\nLogLevel DEBUG1\n",
            hk = host_key.display(),
            pid = d.join("sshd.pid").display(),
            ak = d.join("authorized_keys").display(),
        );
        std::fs::write(d.join("sshd_config"), cfg)
            .unwrap_or_else(|e| broken("write sshd_config", e));
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
                for p in &daemons {
                    kill_pidfile(p);
                }
                unavailable(&format!("sshd did not start: {e}"));
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
            unavailable("sshd is not listening");
        }
        let known_hosts = d.join("known_hosts");
        let mut parts = host_pub.split_whitespace();
        let line = format!(
            "[127.0.0.1]:{ssh_port} {} {}\n",
            parts.next().unwrap_or(""),
            parts.next().unwrap_or("")
        );
        std::fs::write(&known_hosts, line).unwrap_or_else(|e| broken("write known_hosts", e));
        // Hash it, as `ssh-keyscan -H` would.
        let (ok, out) = run("ssh-keygen", &["-H", "-f", text(&known_hosts)]);
        assert!(ok, "ssh-keygen -H: {out}");

        let suffix = format!("{tag}{}", std::process::id() % 100000);
        let pool = format!("epo-{suffix}");
        let pool_dir = d.join("pool");
        std::fs::create_dir_all(&pool_dir).unwrap_or_else(|e| broken("make the pool's dir", e));
        let (ok, out) = virsh(&["pool-create-as", &pool, "dir", "--target", text(&pool_dir)]);
        assert!(ok, "pool-create-as: {out}");
        let bridge = format!("epobr{}", suffix.chars().rev().take(8).collect::<String>());
        let (ok, out) = run("ip", &["link", "add", &bridge, "type", "bridge"]);
        assert!(ok, "ip link add: {out}");
        let _ = run("ip", &["link", "set", &bridge, "up"]);

        Env {
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
            dnsmasq: Mutex::new(None),
            daemons,
            extra_pools: Mutex::new(Vec::new()),
            mounts: Mutex::new(Vec::new()),
            domains: Mutex::new(Vec::new()),
            _turn: turn,
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.ssh_port)
    }

    /// A host entry for this environment.
    /// A providers file with one kvm entry `provider` whose single host is
    /// `host` (this harness's sshd and libvirtd), image `image` at `url`
    /// and machine type `small`: what the system tests give the binary.
    pub fn providers_yaml(&self, provider: &str, host: &str, image: &str, url: &str) -> String {
        let h = self.host(host);
        format!(
            "providers:\n  - name: {provider}\n    type: kvm\n    kvm:\n      sshKeyFile: {key}\n      knownHostsFile: {known}\n      allowedAddresses: [{allowed}]\n      diskSizeGb: 1\n      images:\n        {image}: {{url: \"{url}\"}}\n      machineTypes:\n        small: {{vcpus: 1, memoryMiB: 128}}\n      hosts:\n        - {{name: {host}, address: \"{addr}\", user: root, socket: {socket}, pool: {pool}, bridge: {bridge}, domainType: qemu}}\n",
            key = self.key_file.display(),
            known = self.known_hosts.display(),
            allowed = GUEST_ADDRESSES.join(", "),
            addr = h.address,
            socket = h.socket,
            pool = h.pool,
            bridge = h.bridge,
        )
    }

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
            allowed_addresses: GUEST_ADDRESSES.iter().map(|a| a.to_string()).collect(),
            allowed_image_urls: Vec::new(),
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
            destinations: Default::default(),
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

    /// A running transient dir pool on a tmpfs of `size` (e.g. "8m"); a
    /// machine that cannot mount tmpfs fails the test.
    pub fn tiny_pool(&self, name: &str, size: &str) -> String {
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| broken("make the tiny pool's dir", e));
        let (ok, out) = run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                text(&dir),
            ],
        );
        if !ok {
            // The case must really run.
            unavailable(&format!("no tmpfs for the tiny-pool case: {out}"));
        }
        self.mounts.lock().unwrap().push(dir.clone());
        let (ok, out) = virsh(&["pool-create-as", name, "dir", "--target", text(&dir)]);
        assert!(ok, "pool-create-as: {out}");
        self.extra_pools.lock().unwrap().push(name.to_string());
        name.to_string()
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

    /// Gives the bridge a private /24 (10.213.N.0/24, N free on this
    /// machine) and runs `dnsmasq` on it alone: DHCP without router or DNS
    /// options, and TFTP serving [`GUEST_SCRIPT`], which the DHCP answer
    /// names as boot file. Killed when the Env drops. The bridge has no
    /// uplink and forwards nowhere: only the host and its guests are on it.
    pub fn guest_network(&self) -> GuestNet {
        let d = self.dir.path();
        let n = free_subnet(&self.bridge).expect("no free /24 in 10.213.0.0/16");
        let host_ip = Ipv4Addr::new(10, 213, n, 1);
        let (first, last) = (
            Ipv4Addr::new(10, 213, n, 100),
            Ipv4Addr::new(10, 213, n, 199),
        );
        let (ok, out) = run(
            "ip",
            &["addr", "add", &format!("{host_ip}/24"), "dev", &self.bridge],
        );
        assert!(ok, "ip addr add: {out}");
        pin_bridge_mac(&self.bridge);
        pad_neighbour_dump(d, &self.bridge);

        let tftp = d.join("tftp");
        std::fs::create_dir_all(&tftp).unwrap();
        // iPXE runs this after DHCP: fetching it over TFTP is the exchange
        // that puts the guest in the host's ARP table; then it idles.
        std::fs::write(
            tftp.join(GUEST_SCRIPT),
            "#!ipxe\necho epo test guest: ${net0/ip} is up\n:idle\nsleep 60\ngoto idle\n",
        )
        .unwrap();
        let pid_file = d.join("dnsmasq.pid");
        let log = d.join("dnsmasq.log");
        let leases = d.join("dnsmasq.leases");
        // dnsmasq lists the host's interfaces over netlink at start; a
        // dump that races another test adding or removing a bridge fails
        // it ("failed to find list of interfaces"): start it again.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let _ = std::fs::remove_file(&pid_file);
            let child = self.spawn_dnsmasq((first, last), (&tftp, &pid_file, &leases, &log));
            *self.dnsmasq.lock().unwrap() = Some(child);
            let ready = wait_for("dnsmasq", Duration::from_secs(10), || {
                let alive = self
                    .dnsmasq
                    .lock()
                    .unwrap()
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
                alive
                    && std::fs::read_to_string(&pid_file)
                        .map(|p| !p.trim().is_empty())
                        .unwrap_or(false)
            });
            if ready {
                break;
            }
            let said = format!(
                "{} {}",
                std::fs::read_to_string(d.join("dnsmasq.out")).unwrap_or_default(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            if let Some(mut c) = self.dnsmasq.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            assert!(
                attempt < 3 && said.contains("failed to find list of interfaces"),
                "dnsmasq did not start (attempt {attempt}): {said}"
            );
            eprintln!("dnsmasq start {attempt} raced an interface change: {said}");
            std::thread::sleep(Duration::from_millis(300));
        }
        GuestNet {
            host_ip,
            first,
            last,
            leases,
            log,
        }
    }

    /// dnsmasq on this bridge alone (see [`Env::guest_network`]).
    fn spawn_dnsmasq(
        &self,
        (first, last): (Ipv4Addr, Ipv4Addr),
        (tftp, pid_file, leases, log): (&Path, &Path, &Path, &Path),
    ) -> Child {
        let out = std::fs::File::create(self.dir.path().join("dnsmasq.out")).unwrap();
        Command::new(DNSMASQ)
            .arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null")
            // The temp dir is 0700: stay root to read the TFTP root.
            .arg("--user=root")
            .arg(format!("--pid-file={}", pid_file.display()))
            .arg("--bind-interfaces")
            .arg(format!("--interface={}", self.bridge))
            .arg("--except-interface=lo")
            // No DNS server at all, no resolv.conf, no /etc/hosts.
            .arg("--port=0")
            .arg("--no-resolv")
            .arg("--no-hosts")
            .arg(format!("--dhcp-range={first},{last},255.255.255.0,1h"))
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            // No default route and no DNS server for the guest.
            .arg("--dhcp-option=3")
            .arg("--dhcp-option=6")
            .arg("--enable-tftp")
            .arg(format!("--tftp-root={}", tftp.display()))
            .arg(format!("--dhcp-boot={GUEST_SCRIPT}"))
            .arg("--log-dhcp")
            .arg(format!("--log-facility={}", log.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start dnsmasq")
    }

    /// Builds a disk whose firmware boot runs iPXE (a FAT file system,
    /// without partition table, holding iPXE's EFI binary at the removable
    /// media path `EFI/BOOT/BOOTX64.EFI`, as qcow2) and serves it at
    /// `/<name>`; returns its URL. See [`guest_tools_missing`].
    pub fn serve_ipxe_disk(&self, name: &str) -> String {
        let efi = IPXE_EFI
            .iter()
            .find(|p| Path::new(p).exists())
            .expect("iPXE's EFI binary");
        let raw = self.dir.path().join("ipxe-fat.img");
        let img = raw.to_str().unwrap();
        let f = std::fs::File::create(&raw).unwrap();
        f.set_len(8 << 20).unwrap();
        drop(f);
        // 8 MiB: 16384 sectors of 512 bytes, 2 heads x 32 sectors a track.
        for (cmd, args) in [
            (
                "mformat",
                vec![
                    "-i", img, "-T", "16384", "-h", "2", "-s", "32", "-v", "EPOIPXE", "::",
                ],
            ),
            ("mmd", vec!["-i", img, "::/EFI", "::/EFI/BOOT"]),
            ("mcopy", vec!["-i", img, efi, "::/EFI/BOOT/BOOTX64.EFI"]),
        ] {
            let (ok, out) = run(cmd, &args);
            assert!(ok, "{cmd}: {out}");
        }
        let qcow2 = self.dir.path().join(name);
        let (ok, out) = run(
            "qemu-img",
            &["convert", "-q", "-O", "qcow2", img, qcow2.to_str().unwrap()],
        );
        assert!(ok, "qemu-img convert: {out}");
        self.http.add(&format!("/{name}"), &qcow2)
    }
}

const DNSMASQ: &str = "/usr/sbin/dnsmasq";

/// Where Debian's `ipxe` package puts iPXE's EFI binary.
const IPXE_EFI: [&str; 2] = ["/usr/lib/ipxe/ipxe.efi", "/boot/ipxe.efi"];

/// The file the guest fetches over TFTP after DHCP.
pub const GUEST_SCRIPT: &str = "epo-guest.ipxe";

/// Why a guest that takes an address cannot run here, or None when it can:
/// dnsmasq, iPXE, mtools, QEMU and OVMF (libvirt and sshd are checked by
/// [`Env::start`]).
pub fn guest_tools_missing() -> Option<String> {
    if !IPXE_EFI.iter().any(|p| Path::new(p).exists()) {
        return Some(format!(
            "iPXE's EFI binary ({}) is not installed",
            IPXE_EFI[0]
        ));
    }
    if !Path::new("/usr/share/OVMF/OVMF_CODE_4M.fd").exists()
        && !Path::new("/usr/share/OVMF/OVMF_CODE.fd").exists()
    {
        return Some("OVMF is not installed".to_string());
    }
    installed(&[
        DNSMASQ,
        "/usr/bin/mformat",
        "/usr/bin/mmd",
        "/usr/bin/mcopy",
        "/usr/bin/qemu-system-x86_64",
    ])
}

/// The DHCP side of [`Env::guest_network`].
pub struct GuestNet {
    /// The bridge's own address (DHCP and TFTP server).
    pub host_ip: Ipv4Addr,
    /// First address of the DHCP range.
    pub first: Ipv4Addr,
    /// Last address of the DHCP range.
    pub last: Ipv4Addr,
    /// dnsmasq's lease file.
    pub leases: PathBuf,
    /// dnsmasq's log.
    pub log: PathBuf,
}

impl GuestNet {
    /// Whether `ip` is in the DHCP range.
    pub fn in_range(&self, ip: &str) -> bool {
        ip.parse::<Ipv4Addr>()
            .map(|a| a >= self.first && a <= self.last)
            .unwrap_or(false)
    }

    /// The MAC that holds a lease on `ip`, if any (`expiry mac ip ...`).
    pub fn lease_mac(&self, ip: &str) -> Option<String> {
        let text = std::fs::read_to_string(&self.leases).ok()?;
        text.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let (_expiry, mac, addr) = (f.next()?, f.next()?, f.next()?);
            (addr == ip).then(|| mac.to_string())
        })
    }

    /// dnsmasq's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The N of a 10.213.N.0/24 that no interface or route of this machine
/// uses, starting from one derived from the bridge name.
fn free_subnet(bridge: &str) -> Option<u8> {
    let (_, addrs) = run("ip", &["-4", "-o", "addr", "show"]);
    let (_, routes) = run("ip", &["-4", "route", "show", "table", "all"]);
    let start = bridge
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    (0..250u32)
        .map(|i| ((start + i) % 250 + 1) as u8)
        .find(|n| {
            let p = format!("10.213.{n}.");
            !addrs.contains(&p) && !routes.contains(&p)
        })
}

/// Sets the bridge's MAC to the one it has. A bridge whose MAC was never
/// set takes its lowest port's, so the guest's tap joining it would change
/// it, and a MAC change flushes every neighbour entry of the device, the
/// permanent ones of [`pad_neighbour_dump`] included.
fn pin_bridge_mac(bridge: &str) {
    let mac = std::fs::read_to_string(format!("/sys/class/net/{bridge}/address")).unwrap();
    let (ok, out) = run("ip", &["link", "set", "dev", bridge, "address", mac.trim()]);
    assert!(ok, "ip link set address: {out}");
}

/// Puts `n` (at most 150) permanent IPv4 neighbour entries on `bridge`,
/// outside `net`'s DHCP range, as a busy host has them: libvirt 9.0's ARP
/// source reads one netlink batch of the host's table (about 45 entries),
/// so a guest's entry is then mostly out of its sight. They go with the
/// bridge.
pub fn crowd_neighbours(dir: &Path, bridge: &str, net: &GuestNet, n: usize) {
    let o = net.host_ip.octets();
    let lines: String = (2..=99u8)
        .chain(200..=254)
        .take(n)
        .map(|h| {
            format!(
                "neigh add {}.{}.{}.{h} lladdr 02:00:5e:ee:{:02x}:{h:02x} dev {bridge} nud permanent\n",
                o[0], o[1], o[2], o[2]
            )
        })
        .collect();
    let batch = dir.join("neigh4.batch");
    std::fs::write(&batch, lines).unwrap();
    let (ok, out) = run("ip", &["-4", "-batch", batch.to_str().unwrap()]);
    assert!(ok, "ip -batch (IPv4 crowd): {out}");
}

/// Works around libvirt 9.0 (Debian 12) reading the neighbour table for
/// `virDomainInterfaceAddresses(ARP)`: it takes one netlink receive of the
/// dump and fails with "wrong nlmsg len" when that receive also holds the
/// closing NLMSG_DONE, which newer kernels put right after the last
/// entries when they all fit in the first batch (a small table always
/// does). The dump lists IPv4 entries before IPv6 ones, so permanent IPv6
/// entries on this bridge (never used: nothing on it has these addresses)
/// fill the first batch with the ARP entries at its head and push NLMSG_DONE
/// into a later batch, which libvirt never reads; it skips IPv6 entries.
/// They go with the bridge.
fn pad_neighbour_dump(dir: &Path, bridge: &str) {
    let batch = dir.join("neigh.batch");
    let lines: String = (1..=200u32)
        .map(|i| {
            format!(
                "neigh add fe80::e90:{i:x} lladdr 02:00:5e:e9:{:02x}:{:02x} dev {bridge} nud permanent\n",
                i >> 8,
                i & 0xff
            )
        })
        .collect();
    std::fs::write(&batch, lines).unwrap();
    let (ok, out) = run("ip", &["-6", "-batch", batch.to_str().unwrap()]);
    assert!(ok, "ip -batch (neighbour padding): {out}");
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
        if let Some(mut c) = self.dnsmasq.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
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

/// Writes a new passphrase-less ed25519 key pair at `path` (and
/// `path.pub`).
pub fn new_ed25519_key(path: &Path) {
    let path = path.to_string_lossy();
    let (ok, out) = run(
        "ssh-keygen",
        &["-q", "-t", "ed25519", "-N", "", "-f", &path],
    );
    assert!(ok, "ssh-keygen: {out}");
}

/// An image served at `url`, booted with BIOS firmware.
pub fn bios_image(url: String) -> egress_proxies_operator::config::KvmImage {
    egress_proxies_operator::config::KvmImage {
        url,
        sha256: None,
        format: None,
        firmware: Some("bios".into()),
    }
}

/// A create request for Proxy `uid`: image key `image`, machine type
/// `small`, a minimal cloud-config, installation `installation`.
pub fn request(
    uid: &str,
    image: &str,
    installation: &str,
) -> egress_proxies_operator::provider::CreateRequest {
    use egress_proxies_operator::api::Placement;
    use egress_proxies_operator::provider::{naming::name_from_uid, CreateRequest, UserData};
    CreateRequest {
        name: name_from_uid(uid),
        uid: uid.to_string(),
        namespace: "default".into(),
        proxy_name: "p".into(),
        placement: Placement {
            image: image.into(),
            machine_type: "small".into(),
            ..Default::default()
        },
        cloud_init: UserData::new("#cloud-config\n"),
        port: 3128,
        installation_id: installation.into(),
        credentials: None,
    }
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

/// Builds (or finds cached) the real Linux test guest of
/// `tests/kvm_guest/build-guest.sh` under the target directory and returns
/// the qcow2's path. A failure (a missing package or tool) fails the test
/// with the script's reason.
pub fn test_guest_image() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    let script = repo.join("tests/kvm_guest/build-guest.sh");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .arg(target.join("kvm-guest"))
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        unavailable(&format!(
            "the test guest could not be built: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    let versions = std::fs::read_to_string(path.with_file_name("versions")).unwrap_or_default();
    println!(
        "test guest {} ({:?}):\n{versions}",
        path.display(),
        started.elapsed()
    );
    path
}
