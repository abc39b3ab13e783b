//! A real Squid process on the host (`/usr/sbin/squid`), for tests that
//! probe through it without a Pod: the health probe tests, and the fault
//! suite's stand-in instances (a gcp instance's NAT IP on 127.0.0.0/8).

use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where the tests expect Squid.
pub const SQUID: &str = "/usr/sbin/squid";

/// Panics with the reason unless Squid is installed (never skips).
pub fn require() {
    assert!(
        std::path::Path::new(SQUID).exists(),
        "{SQUID} is missing: install it (apt-get install squid); .ci/run does"
    );
}

/// A squid process; killed (and its shared memory removed) when dropped.
pub struct Squid {
    child: Child,
    pub port: u16,
    service: String,
    _dir: tempfile::TempDir,
}

impl Drop for Squid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(dir) = std::fs::read_dir("/dev/shm") {
            for e in dir.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", self.service))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// A Squid on a free port of 127.0.0.1 that serves loopback clients: what
/// an External Proxy's endpoint points at. Returns its port.
pub async fn on_loopback(tag: &str) -> (u16, Squid) {
    let port = super::free_port();
    (
        port,
        start(Ipv4Addr::LOCALHOST, port, tag, "http_access allow me").await,
    )
}

/// Starts Squid on `ip:port` with the `access` lines (before a final
/// `http_access deny all`; the acls `me` and `clients` match
/// 127.0.0.0/8), and waits until it listens. `tag` keeps its shared
/// memory apart from other Squids of the process.
pub async fn start(ip: Ipv4Addr, port: u16, tag: &str, access: &str) -> Squid {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("probe-squid-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let d = dir.path().display();
    let conf = format!(
        "http_port {ip}:{port}\n\
acl me src 127.0.0.0/8\n\
acl clients src 127.0.0.0/8\n\
{access}\n\
http_access deny all\n\
pid_filename {d}/squid.pid\ncache_log {d}/cache.log\naccess_log none\ncache_store_log none\n\
coredump_dir {d}\ncache deny all\ncache_mem 8 MB\nicp_port 0\nhtcp_port 0\npinger_enable off\n\
shutdown_lifetime 0 seconds\nvisible_hostname probe-test\nvia off\nforwarded_for delete\n\
max_filedescriptors 20000\n"
    );
    let path = dir.path().join("squid.conf");
    std::fs::write(&path, conf).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let service = format!("hp{}{tag}", std::process::id());
    let child = Command::new(SQUID)
        .args(["-N", "-n", &service, "-f"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let squid = Squid {
        child,
        port,
        service,
        _dir: dir,
    };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect((ip, port)).await.is_ok() {
            return squid;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("squid did not listen on {ip}:{port} within 10s");
}
