//! The hidden helper commands, run as `test-cluster __pod-<cmd> ...` by the
//! agent. They run single-threaded, before any runtime starts, so they may
//! change namespaces, mounts and credentials freely.
//!
//! - `__pod-pause <agent-pid> <hostname> <host-network 0|1>`: the Pod's
//!   sandbox. Unshares network, UTS and IPC namespaces, prints `ready`,
//!   configures the network when told `net <ip> <gateway>` on stdin, then
//!   sleeps until killed. Containers join its namespaces.
//! - `__pod-exec <spec.json>`: sets up one container (see [`ExecSpec`]) and
//!   execs its program.

use std::ffi::CString;
use std::fs;
use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use serde::{Deserialize, Serialize};

pub const PAUSE: &str = "__pod-pause";
pub const EXEC: &str = "__pod-exec";

/// One bind mount into the container.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MountSpec {
    /// The host path (a volume's directory, or a path below it).
    pub source: PathBuf,
    /// The absolute path in the container.
    pub path: String,
    pub read_only: bool,
}

/// What `__pod-exec` sets up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecSpec {
    /// The agent's pid: the helper exits if its parent is not this one.
    pub parent_pid: i32,
    /// The Pod's pause process, whose net/uts/ipc namespaces are joined.
    pub pause_pid: i32,
    /// The memory cgroup directory to join.
    pub cgroup: Option<PathBuf>,
    /// For `exec` probes: join this process's mount namespace instead of
    /// building a root.
    pub join_mount_of: Option<i32>,
    /// A host directory for the container's tmpfs (overlay upper/work and
    /// the merged root).
    pub scratch: PathBuf,
    /// Where setup errors are written (empty when the program started).
    pub error_file: PathBuf,
    pub mounts: Vec<MountSpec>,
    /// The lower layer of the container's root: a pulled image's root
    /// filesystem; none: the host's `/`.
    #[serde(default)]
    pub lower: Option<PathBuf>,
    pub read_only_root: bool,
    /// The contents of the container's /etc/hosts.
    pub hosts: Option<String>,
    pub working_dir: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub no_new_privs: bool,
    pub argv: Vec<String>,
    pub env: Vec<String>,
}

/// Runs a helper command, if `args` is one.
pub fn helper_main(args: &[String]) -> Option<i32> {
    let cmd = args.first()?;
    match cmd.as_str() {
        PAUSE => Some(match pause(&args[1..]) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{PAUSE}: {e:#}");
                1
            }
        }),
        EXEC => Some(exec_main(&args[1..])),
        _ => None,
    }
}

/// Kills this process when its parent goes, and checks the parent is the
/// agent (it may have gone before the call).
fn die_with_parent(parent: i32) -> anyhow::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and no
    // pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if rc != 0 {
        bail!(
            "prctl(PR_SET_PDEATHSIG): {}",
            std::io::Error::last_os_error()
        );
    }
    if nix::unistd::getppid().as_raw() != parent {
        bail!("the agent is gone");
    }
    Ok(())
}

fn pause(args: &[String]) -> anyhow::Result<()> {
    let [parent, hostname, host_network] = args else {
        bail!("usage: {PAUSE} <agent-pid> <hostname> <host-network 0|1>");
    };
    die_with_parent(parent.parse().context("agent pid")?)?;
    let mut flags = CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC;
    if host_network != "1" {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare(flags).context("unshare")?;
    nix::unistd::sethostname(hostname).context("sethostname")?;
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    let stdin = std::io::stdin();
    let mut line = String::new();
    while stdin.lock().read_line(&mut line)? > 0 {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["net", addr, gateway] => match configure_net(addr, gateway) {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("error {e:#}"),
            },
            _ => format!("error unknown request {:?}", line.trim()),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
        line.clear();
    }
    // The agent closed stdin: sleep until killed.
    loop {
        nix::unistd::pause();
    }
}

/// Configures the Pod's end of the veth (already moved in as eth0).
fn configure_net(addr: &str, gateway: &str) -> anyhow::Result<()> {
    use super::net::ip;
    ip(&["link", "set", "lo", "up"])?;
    ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
    ip(&["link", "set", "eth0", "up"])?;
    ip(&["route", "add", "default", "via", gateway])?;
    Ok(())
}

fn exec_main(args: &[String]) -> i32 {
    let [spec_path] = args else {
        eprintln!("usage: {EXEC} <spec.json>");
        return 128;
    };
    let spec: ExecSpec = match fs::read(spec_path)
        .context("reading the spec")
        .and_then(|b| serde_json::from_slice(&b).context("parsing the spec"))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{EXEC}: {e:#}");
            return 128;
        }
    };
    let mut error_file = fs::File::create(&spec.error_file).ok();
    let e = match exec(&spec) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    let msg = format!("{e:#}");
    eprintln!("test-cluster: starting the container: {msg}");
    if let Some(f) = error_file.as_mut() {
        let _ = f.write_all(msg.as_bytes());
    }
    128
}

fn join_ns(pid: i32, ns: &str, flag: CloneFlags) -> anyhow::Result<()> {
    let path = format!("/proc/{pid}/ns/{ns}");
    let f = fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    setns(f.as_fd(), flag).with_context(|| format!("joining {path}"))
}

/// Sets everything up and execs; returns only on error.
fn exec(spec: &ExecSpec) -> anyhow::Result<std::convert::Infallible> {
    die_with_parent(spec.parent_pid)?;
    if let Some(cg) = &spec.cgroup {
        let procs = cg.join("cgroup.procs");
        fs::write(&procs, std::process::id().to_string())
            .with_context(|| format!("joining the cgroup {}", cg.display()))?;
    }
    // Opened before any namespace changes, since /proc differs afterwards.
    let mnt = match spec.join_mount_of {
        Some(pid) => {
            let path = format!("/proc/{pid}/ns/mnt");
            Some(fs::File::open(&path).with_context(|| format!("opening {path}"))?)
        }
        None => None,
    };
    join_ns(spec.pause_pid, "net", CloneFlags::CLONE_NEWNET)?;
    join_ns(spec.pause_pid, "uts", CloneFlags::CLONE_NEWUTS)?;
    join_ns(spec.pause_pid, "ipc", CloneFlags::CLONE_NEWIPC)?;
    match mnt {
        Some(f) => setns(f.as_fd(), CloneFlags::CLONE_NEWNS).context("joining the container")?,
        None => build_root(spec)?,
    }
    let dir = spec.working_dir.as_deref().unwrap_or("/");
    if nix::unistd::chdir(dir).is_err() {
        let _ = fs::create_dir_all(dir);
        nix::unistd::chdir(dir).with_context(|| format!("chdir to {dir}"))?;
    }
    fix_stdio(spec.uid, spec.gid);
    let groups: Vec<nix::unistd::Gid> = spec
        .groups
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    nix::unistd::setgroups(&groups).context("setgroups")?;
    nix::unistd::setgid(nix::unistd::Gid::from_raw(spec.gid)).context("setgid")?;
    nix::unistd::setuid(nix::unistd::Uid::from_raw(spec.uid)).context("setuid")?;
    // Credential changes clear the parent-death signal: set it again.
    die_with_parent(spec.parent_pid)?;
    if spec.no_new_privs {
        // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integers only.
        let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        if rc != 0 {
            bail!(
                "prctl(PR_SET_NO_NEW_PRIVS): {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let program = resolve(&spec.argv, &spec.env)?;
    let cstr = |s: &str| CString::new(s).with_context(|| format!("NUL in {s:?}"));
    let program = cstr(&program)?;
    let argv = spec
        .argv
        .iter()
        .map(|a| cstr(a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let env = spec
        .env
        .iter()
        .map(|a| cstr(a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let e = nix::unistd::execve(&program, &argv, &env).err();
    bail!(
        "exec {:?}: {}",
        spec.argv[0],
        e.map(|e| e.desc()).unwrap_or("failed")
    )
}

/// Hands the stdio pipes to the container's user (as runc does), so that
/// programs reopening `/dev/stdout` may write to them.
fn fix_stdio(uid: u32, gid: u32) {
    for fd in 0..3 {
        // SAFETY: fstat on a plain fd number with a valid out-pointer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::fstat(fd, &mut st) };
        if rc == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO {
            // SAFETY: fchown on a plain fd number.
            unsafe { libc::fchown(fd, uid, gid) };
        }
    }
}

/// The program to exec: argv[0] itself when it has a slash, else the first
/// match on the container's PATH.
fn resolve(argv: &[String], env: &[String]) -> anyhow::Result<String> {
    let Some(arg0) = argv.first() else {
        bail!("no command");
    };
    if arg0.contains('/') {
        return Ok(arg0.clone());
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(super::env::DEFAULT_PATH);
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(arg0);
        if let Ok(md) = fs::metadata(&candidate) {
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return Ok(candidate.to_string_lossy().into_owned());
            }
        }
    }
    bail!("executable file {arg0:?} not found in $PATH")
}

fn mnt(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> anyhow::Result<()> {
    mount(source, target, fstype, flags, data).with_context(|| {
        format!(
            "mounting {} on {}",
            source.or(fstype).unwrap_or("(remount)"),
            target.display()
        )
    })
}

/// `path` inside `root`, following symlinks as if `root` were `/`, so that
/// a link like `/var/run -> /run` stays inside the container's root.
fn in_root(root: &Path, path: &str) -> PathBuf {
    use std::collections::VecDeque;
    let split = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_string)
            .collect()
    };
    let mut parts: VecDeque<String> = split(path).into();
    let mut cur = PathBuf::new();
    let mut hops = 0;
    while let Some(part) = parts.pop_front() {
        if part == ".." {
            cur.pop();
            continue;
        }
        let candidate = cur.join(&part);
        let full = root.join(&candidate);
        let link = fs::symlink_metadata(&full)
            .ok()
            .filter(|md| md.file_type().is_symlink() && hops < 40)
            .and_then(|_| fs::read_link(&full).ok());
        match link {
            Some(target) => {
                hops += 1;
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    cur = PathBuf::new();
                }
                for c in split(&target).into_iter().rev() {
                    parts.push_front(c);
                }
            }
            None => cur = candidate,
        }
    }
    root.join(cur)
}

/// The mount targets that get a fresh tmpfs unless a volume covers them.
const FRESH_TMPFS: &[&str] = &["/run", "/tmp"];

/// Where a host program that the container's own mounts would hide is
/// bound, read-only, so the container can still run it.
pub const PROGRAM_DIR: &str = "/.test-node/bin";

/// Whether `program` (a host path) is hidden in the container: it lies
/// under a fresh tmpfs (`/run`, `/tmp`) or a volume's mount path. A
/// checkout under /tmp maps an image to a binary there, and the Pod's /tmp
/// would cover it.
pub fn program_hidden(program: &str, mounts: &[MountSpec]) -> bool {
    let under = |dir: &str| {
        let dir = dir.trim_end_matches('/');
        program
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    FRESH_TMPFS.iter().any(|d| under(d)) || mounts.iter().any(|m| under(&m.path))
}

/// A private mount namespace with an overlay of the host root, the
/// container's volumes, and pivot_root into it.
fn build_root(spec: &ExecSpec) -> anyhow::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
    mnt(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;
    let scratch = &spec.scratch;
    fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    mnt(
        Some("tmpfs"),
        scratch,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0755"),
    )?;
    let (upper, work, root) = (
        scratch.join("upper"),
        scratch.join("work"),
        scratch.join("root"),
    );
    for d in [&upper, &work, &root] {
        fs::create_dir(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let lower = spec.lower.as_deref().unwrap_or(Path::new("/"));
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    mnt(
        Some("overlay"),
        &root,
        Some("overlay"),
        MsFlags::empty(),
        Some(&opts),
    )?;
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let proc = in_root(&root, "/proc");
    fs::create_dir_all(&proc)?;
    mnt(Some("proc"), &proc, Some("proc"), nosuid, None)?;
    let dev = in_root(&root, "/dev");
    fs::create_dir_all(&dev)?;
    mnt(
        Some("/dev"),
        &dev,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )?;
    let shm = in_root(&root, "/dev/shm");
    fs::create_dir_all(&shm)?;
    mnt(
        Some("shm"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=64m"),
    )?;
    let sys = in_root(&root, "/sys");
    fs::create_dir_all(&sys)?;
    mnt(
        Some("/sys"),
        &sys,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )?;
    mnt(
        None,
        &sys,
        None,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
        None,
    )?;
    for path in FRESH_TMPFS {
        if spec
            .mounts
            .iter()
            .any(|m| m.path.trim_end_matches('/') == *path)
        {
            continue;
        }
        let target = in_root(&root, path);
        fs::create_dir_all(&target)?;
        mnt(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        )?;
    }
    if let Some(hosts) = &spec.hosts {
        if !spec.mounts.iter().any(|m| m.path == "/etc/hosts") {
            let p = in_root(&root, "/etc/hosts");
            fs::write(&p, hosts).with_context(|| format!("writing {}", p.display()))?;
        }
    }
    // Parents first, so nested mount points are made inside the parent
    // volume before anything becomes read-only.
    let mut mounts: Vec<&MountSpec> = spec.mounts.iter().collect();
    mounts.sort_by_key(|m| m.path.trim_end_matches('/').matches('/').count());
    for m in &mounts {
        let target = in_root(&root, &m.path);
        let md = fs::metadata(&m.source)
            .with_context(|| format!("volume source {}", m.source.display()))?;
        if md.is_dir() {
            fs::create_dir_all(&target)
                .with_context(|| format!("creating mount point {}", m.path))?;
        } else {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("creating mount point {}", m.path))?;
            }
            if !target.exists() {
                fs::File::create(&target)
                    .with_context(|| format!("creating mount point {}", m.path))?;
            }
        }
        let src = m.source.to_string_lossy();
        mnt(
            Some(&src),
            &target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )?;
    }
    if spec.read_only_root {
        mnt(
            None,
            &root,
            None,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
            None,
        )?;
    }
    for m in mounts.iter().filter(|m| m.read_only) {
        let target = in_root(&root, &m.path);
        mnt(
            None,
            &target,
            None,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
            None,
        )?;
    }
    nix::unistd::chdir(&root).context("chdir to the new root")?;
    nix::unistd::pivot_root(".", ".").context("pivot_root")?;
    umount2(".", MntFlags::MNT_DETACH).context("detaching the old root")?;
    nix::unistd::chdir("/").context("chdir /")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_under_the_containers_own_mounts_are_hidden() {
        struct Case {
            name: &'static str,
            program: &'static str,
            hidden: bool,
        }
        let volume = MountSpec {
            source: PathBuf::from("/var/lib/x"),
            path: "/data/".into(),
            read_only: false,
        };
        for c in [
            Case {
                name: "a checkout under /tmp",
                program: "/tmp/cl/target/debug/op",
                hidden: true,
            },
            Case {
                name: "under /run",
                program: "/run/x/op",
                hidden: true,
            },
            Case {
                name: "under a volume",
                program: "/data/op",
                hidden: true,
            },
            Case {
                name: "a system program",
                program: "/usr/sbin/squid",
                hidden: false,
            },
            Case {
                name: "a sibling of /tmp",
                program: "/tmpfoo/op",
                hidden: false,
            },
            Case {
                name: "a checkout elsewhere",
                program: "/work/main/target/debug/op",
                hidden: false,
            },
        ] {
            assert_eq!(
                program_hidden(c.program, std::slice::from_ref(&volume)),
                c.hidden,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn resolves_symlinks_inside_the_root() {
        let root = std::env::temp_dir().join(format!("tc-root-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("run")).unwrap();
        fs::create_dir_all(root.join("var")).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/run", root.join("var/run")).unwrap();
        std::os::unix::fs::symlink("../../..", root.join("etc/up")).unwrap();
        let cases = [
            ("/var/run/secrets/x", "run/secrets/x"),
            ("/etc/hosts", "etc/hosts"),
            ("/etc/up/etc/up/run", "run"),
            ("/../../tmp", "tmp"),
            ("/", ""),
        ];
        for (path, want) in cases {
            assert_eq!(in_root(&root, path), root.join(want), "{path}");
        }
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn resolves_on_path() {
        let env = vec!["PATH=/nonexistent:/bin:/usr/bin".to_string()];
        let sh = resolve(&["sh".to_string()], &env).unwrap();
        assert!(sh.ends_with("/sh"), "{sh}");
        assert_eq!(
            resolve(&["/x/y".to_string()], &env).unwrap(),
            "/x/y".to_string()
        );
        assert!(resolve(&["no-such-program-xyz".to_string()], &env).is_err());
    }

    #[test]
    fn spec_roundtrips() {
        let spec = ExecSpec {
            parent_pid: 1,
            pause_pid: 2,
            cgroup: None,
            join_mount_of: None,
            scratch: "/s".into(),
            error_file: "/e".into(),
            mounts: vec![MountSpec {
                source: "/v".into(),
                path: "/etc/x".into(),
                read_only: true,
            }],
            lower: None,
            read_only_root: true,
            hosts: None,
            working_dir: None,
            uid: 65532,
            gid: 65532,
            groups: vec![],
            no_new_privs: false,
            argv: vec!["sh".into()],
            env: vec![],
        };
        let back: ExecSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back.mounts, spec.mounts);
        assert_eq!(back.uid, 65532);
    }
}
