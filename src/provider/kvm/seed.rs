//! The NoCloud seed (kvm.md §5.5): meta-data, the user's cloud-init byte
//! for byte, and vendor-data carrying the guest-agent script.

use chrono::{DateTime, Utc};

use super::iso::{build_iso, IsoFile};

/// The vendor-data script that installs and starts qemu-guest-agent.
pub const AGENT_SCRIPT: &str = r#"#!/bin/sh
# Installed by egress-proxies-operator (kvm provider) so the host can learn
# this VM's address. Opt out with installGuestAgent: false in the provider.
set -e
if ! command -v qemu-ga >/dev/null 2>&1 && [ ! -x /usr/sbin/qemu-ga ]; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-guest-agent
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y qemu-guest-agent
  elif command -v yum >/dev/null 2>&1; then
    yum install -y qemu-guest-agent
  elif command -v zypper >/dev/null 2>&1; then
    zypper --non-interactive install qemu-guest-agent
  elif command -v apk >/dev/null 2>&1; then
    apk add qemu-guest-agent
  else
    echo "no known package manager to install qemu-guest-agent" >&2
    exit 1
  fi
fi
if command -v systemctl >/dev/null 2>&1; then
  systemctl enable --now qemu-guest-agent
else
  rc-update add qemu-guest-agent default
  rc-service qemu-guest-agent start
fi
"#;

const BOUNDARY: &str = "==egress-proxies-operator-vendor-data==";

/// `meta-data`: the deterministic name as instance-id and hostname.
pub fn meta_data(name: &str) -> String {
    format!("instance-id: {name}\nlocal-hostname: {name}\n")
}

/// `vendor-data` from the provider settings.
pub fn vendor_data(install_agent: bool, configured: &str) -> String {
    if !install_agent {
        return configured.to_string();
    }
    if configured.trim().is_empty() {
        return AGENT_SCRIPT.to_string();
    }
    format!(
        "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\r\n\r\n--{BOUNDARY}\r\nContent-Type: text/plain; charset=\"utf-8\"\r\n\r\n{configured}\r\n--{BOUNDARY}\r\nContent-Type: text/x-shellscript; charset=\"utf-8\"\r\n\r\n{AGENT_SCRIPT}\r\n--{BOUNDARY}--\r\n"
    )
}

/// The seed ISO image, label `cidata`.
pub fn seed_iso(
    name: &str,
    user_data: &str,
    vendor: &str,
    t: DateTime<Utc>,
) -> Result<Vec<u8>, String> {
    let meta = meta_data(name);
    build_iso(
        "cidata",
        &[
            IsoFile {
                name: "meta-data",
                data: meta.as_bytes(),
            },
            IsoFile {
                name: "user-data",
                data: user_data.as_bytes(),
            },
            IsoFile {
                name: "vendor-data",
                data: vendor.as_bytes(),
            },
        ],
        t,
    )
}

#[cfg(test)]
mod tests {
    use super::super::iso::read_root;
    use super::*;

    #[test]
    fn vendor_data_shapes() {
        assert_eq!(vendor_data(false, ""), "");
        assert_eq!(vendor_data(false, "#cloud-config\n"), "#cloud-config\n");
        assert_eq!(vendor_data(true, "  \n"), AGENT_SCRIPT);
        assert!(AGENT_SCRIPT.starts_with("#!"));
        let m = vendor_data(true, "#cloud-config\nfoo: 1\n");
        assert!(m.starts_with("MIME-Version: 1.0\r\n"));
        let parts: Vec<&str> = m.split(&format!("--{BOUNDARY}")).collect();
        // preamble, two parts, closing "--".
        assert_eq!(parts.len(), 4, "{m}");
        assert!(parts[1].contains("text/plain") && parts[1].contains("foo: 1"));
        assert!(parts[2].contains("text/x-shellscript") && parts[2].contains("qemu-guest-agent"));
        assert!(parts[3].starts_with("--"));
    }

    #[test]
    fn seed_carries_user_data_byte_for_byte() {
        let ud = "\n\n#cloud-config\n# comment\nversion: 1.10\n{{ jinja }}\n";
        let img = seed_iso("proxy-a", ud, "v", Utc::now()).unwrap();
        let (label, files) = read_root(&img, true).unwrap();
        assert_eq!(label, "cidata");
        assert_eq!(files[0].1, meta_data("proxy-a").as_bytes());
        assert_eq!(files[1].1, ud.as_bytes());
        assert_eq!(files[2].1, b"v");
    }
}
