//! Domain and volume XML, and the GC mark in the domain `<metadata>`
//! (kvm.md §3, §5.6, §5.7). Values are always escaped.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::config::{DomainType, Firmware, ImageFormat};

use super::ids::format_word;

/// Namespace URI of the GC mark (unchanged from the reference, so domains
/// made by the Go operator are recognised).
pub const METADATA_URI: &str =
    "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm";

/// Escapes text or an attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Reverses [`escape`] (and numeric character references).
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find(';') else {
            out.push_str(tail);
            return out;
        };
        let ent = &tail[1..end];
        let rep = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match rep {
            Some(c) => out.push(c),
            None => out.push_str(&tail[..=end]),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The GC mark read back from a domain.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    /// `managed` is exactly `true`.
    pub managed: bool,
    /// The owning Proxy UID.
    pub uid: String,
    /// The installation identity (empty for domains of the Go operator).
    pub installation: String,
    /// Creation time; None when absent or malformed (GC treats it as old).
    pub created_at: Option<DateTime<Utc>>,
}

/// Everything the domain XML is built from.
#[derive(Clone, Debug)]
pub struct DomainSpec<'a> {
    /// Domain name.
    pub name: &'a str,
    /// Proxy UID.
    pub uid: &'a str,
    /// Installation identity.
    pub installation: &'a str,
    /// Creation time written in the mark.
    pub created_at: DateTime<Utc>,
    /// Memory in MiB.
    pub memory_mib: i64,
    /// vCPUs.
    pub vcpus: i32,
    /// Boot firmware.
    pub firmware: Firmware,
    /// kvm or qemu.
    pub domain_type: DomainType,
    /// Host path of the overlay.
    pub overlay_path: &'a str,
    /// Host path of the seed ISO.
    pub seed_path: &'a str,
    /// Host bridge.
    pub bridge: &'a str,
}

/// The `<instance>` mark element with its default namespace declaration
/// (libvirt silently drops a metadata element without a namespace).
pub fn mark_xml(uid: &str, installation: &str, created_at: DateTime<Utc>) -> String {
    format!(
        "<instance xmlns=\"{}\"><managed>true</managed><uid>{}</uid><installation>{}</installation><createdAt>{}</createdAt></instance>",
        escape(METADATA_URI),
        escape(uid),
        escape(installation),
        created_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// The domain XML of kvm.md §5.6: file disks with host paths (never
/// pool/volume references), one bridged virtio NIC, serial console, guest
/// agent channel, no graphics.
pub fn domain_xml(s: &DomainSpec<'_>) -> String {
    let (dtype, cpu) = match s.domain_type {
        DomainType::Kvm => ("kvm", "host-passthrough"),
        DomainType::Qemu => ("qemu", "maximum"),
    };
    let os = match s.firmware {
        Firmware::Uefi => "  <os firmware=\"efi\">\n    <type arch=\"x86_64\" machine=\"q35\">hvm</type>\n    <firmware><feature enabled=\"no\" name=\"secure-boot\"/></firmware>\n    <boot dev=\"hd\"/>\n  </os>\n".to_string(),
        Firmware::Bios => "  <os>\n    <type arch=\"x86_64\" machine=\"q35\">hvm</type>\n    <boot dev=\"hd\"/>\n  </os>\n".to_string(),
    };
    format!(
        "<domain type=\"{dtype}\">\n  <name>{name}</name>\n  <metadata>\n    {mark}\n  </metadata>\n  <memory unit=\"MiB\">{mem}</memory>\n  <vcpu>{vcpus}</vcpu>\n{os}  <features><acpi/><apic/></features>\n  <cpu mode=\"{cpu}\"/>\n  <clock offset=\"utc\"/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n  <devices>\n    <disk type=\"file\" device=\"disk\">\n      <driver name=\"qemu\" type=\"qcow2\"/>\n      <source file=\"{overlay}\"/>\n      <target dev=\"vda\" bus=\"virtio\"/>\n    </disk>\n    <disk type=\"file\" device=\"cdrom\">\n      <driver name=\"qemu\" type=\"raw\"/>\n      <source file=\"{seed}\"/>\n      <target dev=\"sda\" bus=\"sata\"/>\n      <readonly/>\n    </disk>\n    <interface type=\"bridge\">\n      <source bridge=\"{bridge}\"/>\n      <model type=\"virtio\"/>\n    </interface>\n    <serial type=\"pty\"><target port=\"0\"/></serial>\n    <console type=\"pty\"><target type=\"serial\" port=\"0\"/></console>\n    <channel type=\"unix\"><target type=\"virtio\" name=\"org.qemu.guest_agent.0\"/></channel>\n    <rng model=\"virtio\"><backend model=\"random\">/dev/urandom</backend></rng>\n  </devices>\n</domain>\n",
        name = escape(s.name),
        mark = mark_xml(s.uid, s.installation, s.created_at),
        mem = s.memory_mib,
        vcpus = s.vcpus,
        overlay = escape(s.overlay_path),
        seed = escape(s.seed_path),
        bridge = escape(s.bridge),
    )
}

/// Volume XML; capacity always in bytes; `backing` only for overlays.
pub fn volume_xml(
    name: &str,
    capacity: u64,
    format: ImageFormat,
    backing: Option<(&str, ImageFormat)>,
) -> String {
    let mut x = format!(
        "<volume type=\"file\">\n  <name>{}</name>\n  <capacity unit=\"bytes\">{capacity}</capacity>\n  <target><format type=\"{}\"/></target>\n",
        escape(name),
        format_word(format)
    );
    if let Some((path, f)) = backing {
        x.push_str(&format!(
            "  <backingStore><path>{}</path><format type=\"{}\"/></backingStore>\n",
            escape(path),
            format_word(f)
        ));
    }
    x.push_str("</volume>\n");
    x
}

/// A start tag found by [`find_element`]: its local name and where its
/// content starts and ends (None for an empty element).
struct Found<'a> {
    local: &'a str,
    content: Option<&'a str>,
}

fn local_name(qname: &str) -> &str {
    qname.rsplit(':').next().unwrap_or(qname)
}

/// The first element (any depth) whose local name is `want`, or the first
/// element at all when `want` is empty.
fn find_element<'a>(xml: &'a str, want: &str) -> Option<Found<'a>> {
    let mut pos = 0;
    while let Some(off) = xml[pos..].find('<') {
        let start = pos + off;
        let rest = &xml[start + 1..];
        if rest.starts_with('?') || rest.starts_with('!') || rest.starts_with('/') {
            pos = start + 1;
            continue;
        }
        let end = start + 1 + rest.find('>')?;
        let tag = &xml[start + 1..end];
        let empty = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let qname = tag.split_whitespace().next().unwrap_or("");
        let local = local_name(qname);
        if want.is_empty() || local == want {
            if empty {
                return Some(Found {
                    local,
                    content: None,
                });
            }
            let close = format!("</{qname}>");
            let body_start = end + 1;
            let close_at = body_start + xml[body_start..].find(&close)?;
            return Some(Found {
                local,
                content: Some(&xml[body_start..close_at]),
            });
        }
        pos = end + 1;
    }
    None
}

/// The text of the first child element named `local` (bare or prefixed).
fn child_text(xml: &str, local: &str) -> Option<String> {
    find_element(xml, local).map(|f| unescape(f.content.unwrap_or("").trim()))
}

/// Parses the mark as libvirt returns it (bare, pretty-printed, or with a
/// prefix). The root must be `instance`.
pub fn parse_mark(xml: &str) -> Result<Mark, String> {
    let root = find_element(xml, "").ok_or_else(|| "metadata is not XML".to_string())?;
    if root.local != "instance" {
        return Err(format!(
            "metadata root element is {:?}, want instance",
            root.local
        ));
    }
    let body = root.content.unwrap_or("");
    let created_at = child_text(body, "createdAt")
        .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
        .map(|t| t.with_timezone(&Utc));
    Ok(Mark {
        managed: child_text(body, "managed").as_deref() == Some("true"),
        uid: child_text(body, "uid").unwrap_or_default(),
        installation: child_text(body, "installation").unwrap_or_default(),
        created_at,
    })
}

/// The backing path of a volume XML (`<backingStore><path>`), if any.
pub fn backing_path(vol_xml: &str) -> Option<String> {
    let bs = find_element(vol_xml, "backingStore")?;
    child_text(bs.content?, "path").filter(|p| !p.is_empty())
}

/// The MAC addresses of a domain's interfaces, in order.
pub fn interface_macs(dom_xml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = dom_xml;
    while let Some(i) = rest.find("<mac ") {
        let tail = &rest[i..];
        if let Some(a) = tail.find("address=") {
            let v = &tail[a + 8..];
            let q = v.chars().next().unwrap_or('"');
            if let Some(end) = v[1..].find(q) {
                out.push(v[1..1 + end].to_ascii_lowercase());
            }
        }
        rest = &tail[1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn spec(fw: Firmware) -> DomainSpec<'static> {
        DomainSpec {
            name: "proxy-abc",
            uid: "u-1",
            installation: "inst",
            created_at: Utc.with_ymd_and_hms(2026, 9, 4, 12, 0, 0).unwrap(),
            memory_mib: 1024,
            vcpus: 2,
            firmware: fw,
            domain_type: DomainType::Qemu,
            overlay_path: "/p/proxy-abc.qcow2",
            seed_path: "/p/proxy-abc-seed.iso",
            bridge: "br\"0<&>",
        }
    }

    #[test]
    fn domain_xml_uefi_and_bios() {
        let x = domain_xml(&spec(Firmware::Uefi));
        for part in [
            "<domain type=\"qemu\">",
            "firmware=\"efi\"",
            "<acpi/>",
            "cpu mode=\"maximum\"",
            "<installation>inst</installation>",
            "<createdAt>2026-09-04T12:00:00Z</createdAt>",
            &format!("xmlns=\"{METADATA_URI}\""),
            "bridge=\"br&quot;0&lt;&amp;&gt;\"",
        ] {
            assert!(x.contains(part), "{part} missing in {x}");
        }
        assert!(!x.contains("type=\"volume\"") && !x.contains("pool="));
        let b = domain_xml(&spec(Firmware::Bios));
        assert!(!b.contains("firmware"), "{b}");
        assert!(b.contains("<acpi/>"));
    }

    #[test]
    fn mark_round_trips_in_every_shape() {
        let t = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        let m = parse_mark(&mark_xml("u<1>", "inst", t)).unwrap();
        assert_eq!(
            m,
            Mark {
                managed: true,
                uid: "u<1>".into(),
                installation: "inst".into(),
                created_at: Some(t)
            }
        );
        let bare = "<instance>\n  <managed>true</managed>\n  <uid>x</uid>\n  <createdAt>garbage</createdAt>\n</instance>";
        let m = parse_mark(bare).unwrap();
        assert!(m.managed && m.uid == "x" && m.created_at.is_none() && m.installation.is_empty());
        let prefixed = format!(
            "<op:instance xmlns:op=\"{METADATA_URI}\"><op:managed>true</op:managed><op:uid>y</op:uid></op:instance>"
        );
        assert_eq!(parse_mark(&prefixed).unwrap().uid, "y");
        assert!(
            !parse_mark("<instance><managed>yes</managed></instance>")
                .unwrap()
                .managed
        );
        assert!(parse_mark("<other/>").is_err());
        assert!(parse_mark("not xml").is_err());
    }

    #[test]
    fn volume_xml_and_backing() {
        let v = volume_xml(
            "proxy-a.qcow2",
            10 << 30,
            ImageFormat::Qcow2,
            Some(("/pool/base-x.qcow2", ImageFormat::Qcow2)),
        );
        assert!(v.contains("<capacity unit=\"bytes\">10737418240</capacity>"));
        assert_eq!(backing_path(&v).as_deref(), Some("/pool/base-x.qcow2"));
        let r = volume_xml("s.iso", 2048, ImageFormat::Raw, None);
        assert!(!r.contains("backingStore"));
        assert_eq!(backing_path(&r), None);
        assert_eq!(
            interface_macs("<interface><mac address='52:54:00:AA:bb:cc'/></interface>"),
            vec!["52:54:00:aa:bb:cc".to_string()]
        );
    }
}
