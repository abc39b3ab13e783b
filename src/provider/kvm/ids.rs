//! providerIDs and the names of what lands in a host's pool (kvm.md §3).

use sha2::{Digest, Sha256};

use crate::config::ImageFormat;

/// A parsed providerID `hosts/<host>/domains/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRef {
    /// Configured host name.
    pub host: String,
    /// libvirt domain name.
    pub name: String,
}

impl DomainRef {
    /// Parses a providerID; anything but exactly four non-empty parts with
    /// `hosts` and `domains` in positions 0 and 2 is refused.
    pub fn parse(id: &str) -> Result<DomainRef, String> {
        let parts: Vec<&str> = id.split('/').collect();
        match parts.as_slice() {
            ["hosts", host, "domains", name] if !host.is_empty() && !name.is_empty() => {
                Ok(DomainRef {
                    host: (*host).to_string(),
                    name: (*name).to_string(),
                })
            }
            _ => Err(format!(
                "malformed kvm providerID {id:?}, want hosts/<host>/domains/<name>"
            )),
        }
    }

    /// The providerID.
    pub fn id(&self) -> String {
        provider_id(&self.host, &self.name)
    }
}

/// `hosts/<host>/domains/<name>`.
pub fn provider_id(host: &str, name: &str) -> String {
    format!("hosts/{host}/domains/{name}")
}

/// The overlay volume of a domain.
pub fn overlay_volume(name: &str) -> String {
    format!("{name}.qcow2")
}

/// The NoCloud seed volume of a domain.
pub fn seed_volume(name: &str) -> String {
    format!("{name}-seed.iso")
}

/// File suffix of a disk format.
pub fn format_word(f: ImageFormat) -> &'static str {
    match f {
        ImageFormat::Qcow2 => "qcow2",
        ImageFormat::Raw => "raw",
    }
}

/// The cached base volume of a catalogue image.
pub fn base_volume_for_key(key: &str, f: ImageFormat) -> String {
    format!("base-{key}.{}", format_word(f))
}

/// The cached base volume of a direct URL: `base-` + 16 hex of SHA-256(URL).
pub fn base_volume_for_url(url: &str, f: ImageFormat) -> String {
    let d = Sha256::digest(url.as_bytes());
    let mut hex = String::with_capacity(16);
    for b in &d[..8] {
        hex.push_str(&format!("{b:02x}"));
    }
    format!("base-{hex}.{}", format_word(f))
}

/// The digest marker written next to a base volume, last.
pub fn marker_volume(base: &str) -> String {
    format!("{base}.sha256")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_id_round_trip_and_refusals() {
        let r = DomainRef::parse("hosts/nas1/domains/proxy-abc").unwrap();
        assert_eq!(r.host, "nas1");
        assert_eq!(r.name, "proxy-abc");
        assert_eq!(r.id(), "hosts/nas1/domains/proxy-abc");
        for bad in [
            "",
            "proxy-abc",
            "zones/a/instances/b",
            "hosts/nas1/domains/proxy-abc/x",
            "hosts//domains/x",
            "hosts/nas1/domains/",
            "host/nas1/domains/x",
        ] {
            let e = DomainRef::parse(bad).unwrap_err();
            assert!(e.contains("malformed kvm providerID"), "{bad}: {e}");
        }
    }

    #[test]
    fn volume_names() {
        assert_eq!(overlay_volume("proxy-a"), "proxy-a.qcow2");
        assert_eq!(seed_volume("proxy-a"), "proxy-a-seed.iso");
        assert_eq!(
            base_volume_for_key("debian12", ImageFormat::Qcow2),
            "base-debian12.qcow2"
        );
        let u = base_volume_for_url("https://x/y.img", ImageFormat::Qcow2);
        assert_eq!(u.len(), "base-".len() + 16 + ".qcow2".len());
        assert_eq!(marker_volume("base-a.raw"), "base-a.raw.sha256");
    }
}
