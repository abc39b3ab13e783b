//! The `kvm` provider block (kvm.md §2).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::validate::{http_url, is_identifier};

/// Settings of a `kvm` provider entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvmConfig {
    /// Which addresses the built-in Squid setup (`cloudInit.builtin:
    /// squid`) refuses to reach (`kvm.destinations`, as the kubernetes
    /// provider's).
    #[serde(default)]
    pub destinations: crate::config::Destinations,
    /// Private key used for every host.
    #[serde(default)]
    pub ssh_key_file: String,
    /// OpenSSH known_hosts used to verify host keys.
    #[serde(default)]
    pub known_hosts_file: String,
    /// Skip host-key verification (then `knownHostsFile` is ignored).
    #[serde(default)]
    pub insecure_ignore_host_key: bool,
    /// Overlay capacity in GiB; 0 means 10.
    #[serde(default)]
    pub disk_size_gb: i64,
    /// Extra cloud-init vendor-data put on every seed.
    #[serde(default)]
    pub vendor_data: String,
    /// Ship the vendor-data script that installs qemu-guest-agent (absent = true).
    #[serde(default)]
    pub install_guest_agent: Option<bool>,
    /// Addresses and CIDRs a guest's address may be in even inside the
    /// ranges the operator otherwise never dials (the default
    /// `--probe-deny-cidrs`, private ranges among them): the guests'
    /// network, e.g. `192.168.122.0/24`. A guest reporting any other such
    /// address has none (a guest runs what its cloud-init says, and its
    /// agent can report the cluster's Service range).
    #[serde(default)]
    pub allowed_addresses: Vec<String>,
    /// URL prefixes a direct `placement.image` URL must fall under; empty
    /// (the default) refuses direct URLs, only catalogue keys work.
    #[serde(default)]
    pub allowed_image_urls: Vec<String>,
    /// Image catalogue; `placement.image` names a key.
    #[serde(default)]
    pub images: BTreeMap<String, KvmImage>,
    /// Size profiles; `placement.machineType` names a key.
    #[serde(default)]
    pub machine_types: BTreeMap<String, MachineType>,
    /// The hypervisors; `placement.zone` names one.
    #[serde(default)]
    pub hosts: Vec<KvmHost>,
}

/// One catalogue image.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvmImage {
    /// http(s) URL of the cloud image.
    #[serde(default)]
    pub url: String,
    /// Expected hex SHA-256 of the file.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Disk format of the file.
    #[serde(default)]
    pub format: Option<String>,
    /// Boot firmware for VMs from this image.
    #[serde(default)]
    pub firmware: Option<String>,
}

/// Disk format of a base image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageFormat {
    /// qcow2 (default).
    Qcow2,
    /// raw.
    Raw,
}

/// Boot firmware.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Firmware {
    /// UEFI (default).
    Uefi,
    /// Legacy BIOS.
    Bios,
}

impl KvmImage {
    /// The format with the default applied (validated at load).
    pub fn image_format(&self) -> ImageFormat {
        match self.format.as_deref() {
            Some("raw") => ImageFormat::Raw,
            _ => ImageFormat::Qcow2,
        }
    }
    /// The firmware with the default applied (validated at load).
    pub fn image_firmware(&self) -> Firmware {
        match self.firmware.as_deref() {
            Some("bios") => Firmware::Bios,
            _ => Firmware::Uefi,
        }
    }
}

/// A size profile.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineType {
    /// Virtual CPUs.
    #[serde(default)]
    pub vcpus: i32,
    /// Memory in MiB.
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: i64,
}

/// libvirt domain type of the VMs on a host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainType {
    /// Hardware-accelerated (needs /dev/kvm); the default.
    #[default]
    Kvm,
    /// Software emulation, for hosts without KVM acceleration.
    Qemu,
}

/// One hypervisor.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvmHost {
    /// The `placement.zone` value selecting this host; part of the providerID.
    #[serde(default)]
    pub name: String,
    /// SSH endpoint, `host:port`.
    #[serde(default)]
    pub address: String,
    /// SSH user, allowed to open the libvirt socket.
    #[serde(default)]
    pub user: String,
    /// libvirt socket path on the host.
    #[serde(default = "default_socket")]
    pub socket: String,
    /// Storage pool for base images, overlays and seeds.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// Host bridge for the VM's NIC.
    #[serde(default)]
    pub bridge: String,
    /// `kvm` (default) or `qemu` for hosts without KVM acceleration.
    #[serde(default)]
    pub domain_type: DomainType,
}

/// Default libvirt socket on a host.
pub const DEFAULT_SOCKET: &str = "/var/run/libvirt/libvirt-sock";
/// Default storage pool.
pub const DEFAULT_POOL: &str = "default";

fn default_socket() -> String {
    DEFAULT_SOCKET.into()
}
fn default_pool() -> String {
    DEFAULT_POOL.into()
}

impl KvmConfig {
    /// The addresses a guest may report: the default `--probe-deny-cidrs`
    /// less `allowedAddresses`. An error names the entry and the reason.
    pub fn guest_addresses(&self) -> Result<crate::tenancy::ProbeDenylist, String> {
        let allowed = self
            .allowed_addresses
            .iter()
            .enumerate()
            .map(|(i, a)| {
                crate::tenancy::parse_cidrs(&format!("kvm.allowedAddresses[{i}]"), a)
                    .and_then(|nets| match nets[..] {
                        [net] => Ok(net),
                        _ => Err(format!(
                            "kvm.allowedAddresses[{i}]: {a:?} is not one IP address or CIDR (e.g. 192.168.122.0/24)"
                        )),
                    })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(crate::tenancy::ProbeDenylist::default_list().allowing(allowed))
    }
}

const KEY_RULE: &str =
    "letters, digits, dots, dashes or underscores, starting with a letter or digit";

impl KvmConfig {
    /// Load-time checks in the order of kvm.md §2.2, first error wins.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.ssh_key_file.is_empty() {
            return Err("kvm.sshKeyFile is required".into());
        }
        if self.known_hosts_file.is_empty() && !self.insecure_ignore_host_key {
            return Err(
                "kvm.knownHostsFile is required unless kvm.insecureIgnoreHostKey is true".into(),
            );
        }
        if self.disk_size_gb < 0 {
            return Err(format!(
                "kvm.diskSizeGb must not be negative (got {})",
                self.disk_size_gb
            ));
        }
        self.guest_addresses()?;
        for (i, p) in self.allowed_image_urls.iter().enumerate() {
            http_url(p).map_err(|why| format!("kvm.allowedImageUrls[{i}] {why} (got {p:?})"))?;
        }
        for (key, img) in &self.images {
            if !is_identifier(key) {
                return Err(format!(
                    "kvm.images[{key:?}]: key must be {KEY_RULE}: it names the image in Proxies and messages"
                ));
            }
            http_url(&img.url)
                .map_err(|why| format!("kvm.images[{key:?}].url {why} (got {:?})", img.url))?;
            if let Some(sum) = &img.sha256 {
                if sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "kvm.images[{key:?}].sha256 must be 64 hex characters"
                    ));
                }
            }
            if let Some(f) = &img.format {
                if f != "qcow2" && f != "raw" {
                    return Err(format!(
                        "kvm.images[{key:?}].format must be qcow2 or raw (got {f:?})"
                    ));
                }
            }
            if let Some(f) = &img.firmware {
                if f != "uefi" && f != "bios" {
                    return Err(format!(
                        "kvm.images[{key:?}].firmware must be uefi or bios (got {f:?})"
                    ));
                }
            }
        }
        if self.machine_types.is_empty() {
            return Err("kvm.machineTypes must define at least one profile".into());
        }
        for (key, mt) in &self.machine_types {
            if mt.vcpus <= 0 || mt.memory_mib <= 0 {
                return Err(format!(
                    "kvm.machineTypes[{key:?}] needs vcpus > 0 and memoryMiB > 0"
                ));
            }
        }
        if self.hosts.is_empty() {
            return Err("kvm.hosts must list at least one host".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, h) in self.hosts.iter().enumerate() {
            if h.name.is_empty() {
                return Err(format!("kvm.hosts[{i}]: name is required"));
            }
            if !is_identifier(&h.name) {
                return Err(format!(
                    "kvm.hosts[{i}]: name {:?} must be {KEY_RULE}: it becomes part of the providerID hosts/<name>/domains/<vm>, which is split on '/'",
                    h.name
                ));
            }
            if !seen.insert(h.name.as_str()) {
                return Err(format!("duplicate host name {:?}", h.name));
            }
            let at = format!("kvm.hosts[{i}] {:?}", h.name);
            if h.address.is_empty() {
                return Err(format!("{at}: address is required"));
            }
            check_host_port(&h.address)
                .map_err(|why| format!("{at}: address {:?} {why}", h.address))?;
            if h.user.is_empty() {
                return Err(format!("{at}: user is required"));
            }
            if h.bridge.is_empty() {
                return Err(format!("{at}: bridge is required"));
            }
            if h.socket.is_empty() || !h.socket.starts_with('/') {
                return Err(format!(
                    "{at}: socket must be an absolute path (got {:?})",
                    h.socket
                ));
            }
            if h.pool.is_empty() {
                return Err(format!("{at}: pool must not be empty"));
            }
        }
        Ok(())
    }

    /// Overlay size with the default applied.
    pub fn disk_size_gb_or_default(&self) -> i64 {
        if self.disk_size_gb == 0 {
            10
        } else {
            self.disk_size_gb
        }
    }

    /// Whether the guest-agent vendor-data is shipped (absent = true).
    pub fn installs_guest_agent(&self) -> bool {
        self.install_guest_agent.unwrap_or(true)
    }
}

/// `host:port` or `[v6]:port` with a port 1-65535; a value without a port
/// would otherwise fail at every dial, forever.
fn check_host_port(addr: &str) -> Result<(), String> {
    let (host, port) = match addr.rsplit_once(':') {
        Some(parts) => parts,
        None => return Err("must be host:port".into()),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(':') && !addr.starts_with('[') {
        return Err("must be host:port (IPv6 in brackets)".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err("must end in a port from 1 to 65535".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::check_host_port;

    #[test]
    fn host_port_shapes() {
        for ok in ["nas1.home.lan:22", "127.0.0.1:2222", "[::1]:22"] {
            check_host_port(ok).unwrap();
        }
        for bad in [
            "nas1",
            "nas1:",
            ":22",
            "nas1:0",
            "nas1:99999",
            "::1:22",
            "h:ssh",
        ] {
            assert!(check_host_port(bad).is_err(), "{bad}");
        }
    }
}
