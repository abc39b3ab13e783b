//! The test guest's cloud-config subset (`tests/kvm_guest/cloud-config.awk`)
//! run by the guest's own busybox awk (kept beside the built image) on
//! user-data of the shapes cloud-init users write: which files it writes,
//! with what content, and which hostname it reports.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use crate::kvm_support;

use std::path::Path;
use std::process::{Command, Stdio};

/// One user-data and what the guest makes of it. `@` in the user-data and
/// in the expected paths stands for the case's scratch directory.
struct Case {
    name: &'static str,
    user_data: &'static str,
    hostname: &'static str,
    files: &'static [(&'static str, &'static str)],
}

const CASES: &[Case] = &[
    Case {
        name: "the sample's shape: a literal block",
        user_data: "#cloud-config\nhostname: guest-one\npackages: [squid]\nwrite_files:\n  - path: @/etc/squid/conf.d/proxy-operator.conf\n    content: |\n      http_port 3128\n      http_access allow all\nruncmd:\n  - [systemctl, restart, squid]\n",
        hostname: "guest-one",
        files: &[(
            "@/etc/squid/conf.d/proxy-operator.conf",
            "http_port 3128\nhttp_access allow all\n",
        )],
    },
    Case {
        name: "two files, quoted scalars, other keys of an entry ignored",
        user_data: "#cloud-config\nhostname: \"quoted-name\"\nwrite_files:\n- path: '@/a.conf'\n  permissions: '0644'\n  content: \"http_port 8080\"\n- content: |\n    first\n\n      indented\n    last\n  owner: root:root\n  path: @/sub/dir/b.conf\n",
        hostname: "quoted-name",
        files: &[
            ("@/a.conf", "http_port 8080\n"),
            ("@/sub/dir/b.conf", "first\n\n  indented\nlast\n"),
        ],
    },
    Case {
        name: "no hostname and no files",
        user_data: "#cloud-config\npackages: [squid]\n",
        hostname: "",
        files: &[],
    },
];

fn run_case(busybox: &Path, awk: &Path, dir: &Path, case: &Case) -> (String, Vec<String>) {
    let root = dir.to_str().unwrap();
    let user_data = dir.join("user-data");
    std::fs::write(&user_data, case.user_data.replace('@', root)).unwrap();
    let out = Command::new(busybox)
        .arg("awk")
        .arg("-f")
        .arg(awk)
        .arg(&user_data)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {:?}", case.name, out);
    let mut written = Vec::new();
    for entry in walk(dir) {
        if entry != user_data.display().to_string() {
            written.push(entry.replacen(root, "@", 1));
        }
    }
    written.sort();
    (
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        written,
    )
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

#[test]
fn the_guest_applies_hostname_and_write_files_from_cloud_config() {
    let image = kvm_support::test_guest_image();
    let busybox = image.with_file_name("busybox");
    let awk = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kvm_guest/cloud-config.awk");
    for case in CASES {
        let dir = tempfile::tempdir().unwrap();
        let (hostname, written) = run_case(&busybox, &awk, dir.path(), case);
        assert_eq!(hostname, case.hostname, "{}", case.name);
        let mut want: Vec<String> = case.files.iter().map(|(p, _)| p.to_string()).collect();
        want.sort();
        assert_eq!(written, want, "{}: files written", case.name);
        for (path, content) in case.files {
            let real = path.replacen('@', dir.path().to_str().unwrap(), 1);
            assert_eq!(
                std::fs::read_to_string(&real).unwrap(),
                *content,
                "{}: {path}",
                case.name
            );
        }
    }
}
