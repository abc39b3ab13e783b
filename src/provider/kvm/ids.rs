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

/// The cached base volume of an image, named by what it holds so that an
/// edited catalogue entry lands in a volume of its own and never replaces
/// one that running domains' overlays are backed by: by the declared
/// checksum when there is one (the content itself; two entries of the
/// same content share it), else by the URL it comes from.
pub fn base_volume(url: &str, sha256: Option<&str>, f: ImageFormat) -> String {
    match sha256 {
        Some(sum) => base_volume_for_sha256(sum, f),
        None => base_volume_for_url(url, f),
    }
}

/// `base-sha256-` + the (64 hex) digest of the content.
pub fn base_volume_for_sha256(sum: &str, f: ImageFormat) -> String {
    format!(
        "base-sha256-{}.{}",
        sum.to_ascii_lowercase(),
        format_word(f)
    )
}

/// `base-` + 16 hex of SHA-256(URL): a source without a declared digest.
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
    fn base_volumes_are_named_by_content_or_source() {
        struct Case {
            name: &'static str,
            url: &'static str,
            sha256: Option<String>,
            format: ImageFormat,
            want: String,
        }
        let sum = "AB".repeat(32);
        let cases = [
            Case {
                name: "a declared digest names it (lowercased)",
                url: "https://a/x.img",
                sha256: Some(sum.clone()),
                format: ImageFormat::Qcow2,
                want: format!("base-sha256-{}.qcow2", "ab".repeat(32)),
            },
            Case {
                name: "the same content from another URL: the same volume",
                url: "https://mirror/x.img",
                sha256: Some(sum.clone()),
                format: ImageFormat::Qcow2,
                want: format!("base-sha256-{}.qcow2", "ab".repeat(32)),
            },
            Case {
                name: "no digest: named by the URL",
                url: "https://a/x.img",
                sha256: None,
                format: ImageFormat::Raw,
                want: base_volume_for_url("https://a/x.img", ImageFormat::Raw),
            },
        ];
        for c in cases {
            assert_eq!(
                base_volume(c.url, c.sha256.as_deref(), c.format),
                c.want,
                "{}",
                c.name
            );
        }
        // An edited entry never maps onto the volume it had.
        assert_ne!(
            base_volume("https://a/x.img", None, ImageFormat::Qcow2),
            base_volume("https://a/x2.img", None, ImageFormat::Qcow2)
        );
        assert_ne!(
            base_volume("https://a/x.img", Some(&"a".repeat(64)), ImageFormat::Qcow2),
            base_volume("https://a/x.img", Some(&"b".repeat(64)), ImageFormat::Qcow2)
        );
    }

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
        let u = base_volume_for_url("https://x/y.img", ImageFormat::Qcow2);
        assert_eq!(u.len(), "base-".len() + 16 + ".qcow2".len());
        assert_eq!(marker_volume("base-a.raw"), "base-a.raw.sha256");
    }
}
