//! Pure pieces of the gcp provider: placement validation, the instance
//! builder, providerID parsing, state mapping and the read-back of an
//! instance. No I/O here; everything is tested by tables.

use chrono::{DateTime, Utc};
use google_cloud_compute_v1::model;
use sha2::{Digest, Sha256};

use crate::config::{allowed, GcpConfig};
use crate::provider::{CreateRequest, Instance, InstanceState};

/// Label carrying the managed mark.
pub const LABEL_MANAGED: &str = "proxy-operator-managed";
/// Label carrying the owning Proxy's UID.
pub const LABEL_UID: &str = "proxy-operator-uid";
/// Label carrying the installation identity.
pub const LABEL_INSTALLATION: &str = "proxy-operator-installation";
/// Instance label: the port it serves on (which firewall rule it needs).
pub const LABEL_PORT: &str = "proxy-operator-port";
/// The metadata key cloud-init reads.
pub const USER_DATA_KEY: &str = "user-data";
/// The aggregated-list filter shared by ListByTag and the check.
pub const MANAGED_FILTER: &str = "labels.proxy-operator-managed = true";

/// Where an instance lives, parsed from a providerID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceRef {
    /// Zone name, e.g. `europe-west1-b`.
    pub zone: String,
    /// Instance name.
    pub name: String,
}

impl InstanceRef {
    /// The providerID `zones/<zone>/instances/<name>`.
    pub fn id(&self) -> String {
        format_id(&self.zone, &self.name)
    }
}

/// The providerID for an instance.
pub fn format_id(zone: &str, name: &str) -> String {
    format!("zones/{zone}/instances/{name}")
}

fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Parses `zones/<zone>/instances/<name>` strictly: exactly four segments,
/// the literal words, non-empty zone and name of lowercase letters, digits,
/// `-` or `_`. Anything else is a message for a Permanent error.
pub fn parse_id(id: &str) -> Result<InstanceRef, String> {
    let parts: Vec<&str> = id.split('/').collect();
    match parts.as_slice() {
        ["zones", zone, "instances", name] if is_segment(zone) && is_segment(name) => {
            Ok(InstanceRef {
                zone: (*zone).to_string(),
                name: (*name).to_string(),
            })
        }
        _ => Err(format!(
            "malformed gcp providerID {id:?}: want zones/<zone>/instances/<name>"
        )),
    }
}

/// Refuses a placement GCE cannot build, or a port or placement the
/// provider's allowlists do not list, naming the field and value (C7). The
/// zone ends up in the providerID, so it must be one clean path segment
/// (C4). Runs before any call, the firewall rule's included, so a refused
/// port is never opened.
pub fn validate_placement(req: &CreateRequest, cfg: &GcpConfig) -> Result<(), String> {
    if !cfg.port_allowed(req.port) {
        return Err(format!(
            "spec.port {} is not allowed by this provider's allowedPorts ({})",
            req.port,
            cfg.allowed_ports_shown()
        ));
    }
    let p = &req.placement;
    if p.zone.trim().is_empty() {
        return Err("placement.zone is required".into());
    }
    if !is_segment(&p.zone) {
        return Err(format!(
            "placement.zone {:?} must be a zone name (lowercase letters, digits and '-')",
            p.zone
        ));
    }
    if p.machine_type.trim().is_empty() {
        return Err("placement.machineType is required".into());
    }
    if p.image.trim().is_empty() {
        return Err("placement.image is required".into());
    }
    if req.name.is_empty() {
        return Err("instance name is empty".into());
    }
    for (field, value, key, list) in [
        ("zone", &p.zone, "allowedZones", &cfg.allowed_zones),
        (
            "machineType",
            &p.machine_type,
            "allowedMachineTypes",
            &cfg.allowed_machine_types,
        ),
        ("image", &p.image, "allowedImages", &cfg.allowed_images),
    ] {
        if !allowed(list, value) {
            return Err(format!(
                "placement.{field} {value:?} is not allowed by this provider's {key} ({})",
                list.join(", ")
            ));
        }
    }
    Ok(())
}

/// The machine type URL: `zones/<zone>/machineTypes/<type>`, or the value
/// as given when it already is a path.
pub fn machine_type_url(zone: &str, machine_type: &str) -> String {
    if machine_type.contains('/') {
        machine_type.to_string()
    } else {
        format!("zones/{zone}/machineTypes/{machine_type}")
    }
}

/// The network URL: `global/networks/<network>`, or the value as given when
/// it already is a path.
pub fn network_url(network: &str) -> String {
    if network.contains('/') {
        network.to_string()
    } else {
        format!("global/networks/{network}")
    }
}

/// The instance resource create inserts. Pure: tested field by field.
pub fn build_instance(req: &CreateRequest, cfg: &GcpConfig) -> model::Instance {
    let zone = &req.placement.zone;
    let disk = model::AttachedDisk::new()
        .set_boot(true)
        .set_auto_delete(true)
        .set_initialize_params(
            model::AttachedDiskInitializeParams::new()
                .set_source_image(req.placement.image.clone())
                .set_disk_size_gb(cfg.disk_size_gb_or_default()),
        );
    let nic = model::NetworkInterface::new()
        .set_network(network_url(&cfg.network))
        .set_access_configs([model::AccessConfig::new()
            .set_name("External NAT")
            .set_type(model::access_config::Type::OneToOneNat)]);
    let labels = [
        (LABEL_MANAGED, "true".to_string()),
        (LABEL_UID, req.uid.clone()),
        (LABEL_INSTALLATION, req.installation_id.clone()),
        (LABEL_PORT, req.port.to_string()),
    ];
    let mut inst = model::Instance::new()
        .set_name(req.name.clone())
        .set_machine_type(machine_type_url(zone, &req.placement.machine_type))
        .set_disks([disk])
        .set_network_interfaces([nic])
        .set_labels(labels)
        .set_metadata(
            model::Metadata::new().set_items([model::metadata::Items::new()
                .set_key(USER_DATA_KEY)
                .set_value(req.cloud_init.expose().to_string())]),
        );
    if !cfg.network_tag.is_empty() {
        inst = inst.set_tags(model::Tags::new().set_items([cfg.network_tag.clone()]));
    }
    inst
}

/// A request id for a new insert attempt of `name`: unique per attempt
/// (the clock is mixed in), shaped as the UUID the API wants.
pub fn insert_request_id(name: &str, uid: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    request_id("insert", name, &format!("{uid}/{nanos}"))
}

/// A deterministic request id (UUID-shaped, version 5 bits) from `kind`,
/// the instance name and `salt`.
pub fn request_id(kind: &str, name: &str, salt: &str) -> String {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    h.update(b"/");
    h.update(name.as_bytes());
    h.update(b"/");
    h.update(salt.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Maps a GCE status (its wire name) to the contract's state.
pub fn map_state(status: Option<&str>, has_ip: bool) -> InstanceState {
    match status {
        // No status at all: undeterminable, treat as still coming up.
        None => InstanceState::Provisioning,
        Some("PROVISIONING" | "STAGING") => InstanceState::Provisioning,
        // REPAIRING recovers by itself (G4), so it is not Stopped.
        Some("REPAIRING") => InstanceState::Provisioning,
        Some("RUNNING") if has_ip => InstanceState::Running,
        Some("RUNNING") => InstanceState::Provisioning,
        Some("STOPPING" | "STOPPED" | "SUSPENDING" | "SUSPENDED") => InstanceState::Stopped,
        Some("TERMINATED") => InstanceState::Terminated,
        Some(_) => InstanceState::Stopped,
    }
}

/// The external NAT IP of the first interface that has one.
pub fn external_ip(inst: &model::Instance) -> String {
    inst.network_interfaces
        .iter()
        .flat_map(|n| n.access_configs.iter())
        .filter_map(|a| a.nat_ip.as_deref())
        .find(|ip| !ip.is_empty())
        .unwrap_or_default()
        .to_string()
}

/// The last path segment of a URL or path (`.../zones/z` → `z`).
pub fn last_segment(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Parses an RFC 3339 creation timestamp; `None` when unparseable.
pub fn parse_created(ts: Option<&str>) -> Option<DateTime<Utc>> {
    ts.and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// The contract's view of a GCE instance, everything read from the resource.
pub fn to_instance(id: String, inst: &model::Instance) -> Instance {
    let ip = external_ip(inst);
    let state = map_state(inst.status.as_ref().and_then(|s| s.name()), !ip.is_empty());
    Instance {
        id,
        ip,
        state,
        uid: inst.labels.get(LABEL_UID).cloned().unwrap_or_default(),
        installation_id: inst
            .labels
            .get(LABEL_INSTALLATION)
            .cloned()
            .unwrap_or_default(),
        created_at: parse_created(inst.creation_timestamp.as_deref()),
    }
}

/// Whether the instance carries the managed mark.
pub fn is_managed(inst: &model::Instance) -> bool {
    inst.labels.get(LABEL_MANAGED).map(String::as_str) == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Placement;
    use crate::provider::UserData;

    fn cfg() -> GcpConfig {
        GcpConfig {
            project: "p".into(),
            network: "default".into(),
            network_tag: "egress-proxy".into(),
            disk_size_gb: 0,
            endpoint: None,
            anonymous: false,
            allowed_zones: Vec::new(),
            allowed_machine_types: Vec::new(),
            allowed_images: Vec::new(),
            allowed_ports: crate::config::default_allowed_ports(),
            firewall: None,
            destinations: Default::default(),
        }
    }

    fn req() -> CreateRequest {
        CreateRequest {
            name: "proxy-abc".into(),
            uid: "uid-1".into(),
            namespace: "ns".into(),
            proxy_name: "px".into(),
            placement: Placement {
                region: "europe-west1".into(),
                zone: "europe-west1-b".into(),
                machine_type: "e2-micro".into(),
                image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into(),
            },
            cloud_init: UserData::new("#cloud-config\n"),
            port: 3128,
            installation_id: "inst-1".into(),
            credentials: None,
        }
    }

    #[test]
    fn builder_sets_every_field() {
        let i = build_instance(&req(), &cfg());
        assert_eq!(i.name.as_deref(), Some("proxy-abc"));
        assert_eq!(
            i.machine_type.as_deref(),
            Some("zones/europe-west1-b/machineTypes/e2-micro")
        );
        assert_eq!(i.disks.len(), 1);
        let d = &i.disks[0];
        assert_eq!(d.boot, Some(true));
        assert_eq!(d.auto_delete, Some(true));
        let ip = d.initialize_params.as_ref().unwrap();
        assert_eq!(
            ip.source_image.as_deref(),
            Some("projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64")
        );
        assert_eq!(ip.disk_size_gb, Some(10));
        assert_eq!(i.network_interfaces.len(), 1);
        let nic = &i.network_interfaces[0];
        assert_eq!(nic.network.as_deref(), Some("global/networks/default"));
        assert_eq!(nic.access_configs.len(), 1);
        assert_eq!(
            nic.access_configs[0].r#type,
            Some(model::access_config::Type::OneToOneNat)
        );
        assert_eq!(nic.access_configs[0].nat_ip, None);
        assert_eq!(
            i.tags.as_ref().unwrap().items,
            vec!["egress-proxy".to_string()]
        );
        assert_eq!(i.labels.len(), 4);
        assert_eq!(i.labels[LABEL_PORT], "3128");
        assert_eq!(i.labels[LABEL_MANAGED], "true");
        assert_eq!(i.labels[LABEL_UID], "uid-1");
        assert_eq!(i.labels[LABEL_INSTALLATION], "inst-1");
        let items = &i.metadata.as_ref().unwrap().items;
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].key.as_deref(), Some("user-data"));
        assert_eq!(items[0].value.as_deref(), Some("#cloud-config\n"));
        // Status, IPs and timestamps are the server's business.
        assert_eq!(i.status, None);
        assert_eq!(i.creation_timestamp, None);
    }

    #[test]
    fn builder_options() {
        let mut c = cfg();
        c.disk_size_gb = 25;
        c.network_tag.clear();
        c.network = "projects/x/global/networks/vpc".into();
        let mut r = req();
        r.placement.machine_type = "zones/z/machineTypes/custom-2-4096".into();
        let i = build_instance(&r, &c);
        assert_eq!(
            i.disks[0].initialize_params.as_ref().unwrap().disk_size_gb,
            Some(25)
        );
        assert_eq!(i.tags, None);
        assert_eq!(
            i.network_interfaces[0].network.as_deref(),
            Some("projects/x/global/networks/vpc")
        );
        assert_eq!(
            i.machine_type.as_deref(),
            Some("zones/z/machineTypes/custom-2-4096")
        );
    }

    #[test]
    fn allowlists_refuse_what_they_do_not_list_naming_field_and_value() {
        struct Case {
            name: &'static str,
            edit: fn(&mut GcpConfig),
            want: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "no allowlists",
                edit: |_| {},
                want: None,
            },
            Case {
                name: "zone listed",
                edit: |c| c.allowed_zones = vec!["europe-west1-*".into()],
                want: None,
            },
            Case {
                name: "zone not listed",
                edit: |c| c.allowed_zones = vec!["us-central1-*".into()],
                want: Some("placement.zone \"europe-west1-b\" is not allowed by this provider's allowedZones (us-central1-*)"),
            },
            Case {
                name: "machine type not listed",
                edit: |c| c.allowed_machine_types = vec!["e2-small".into(), "e2-medium".into()],
                want: Some("placement.machineType \"e2-micro\" is not allowed by this provider's allowedMachineTypes (e2-small, e2-medium)"),
            },
            Case {
                name: "a default port",
                edit: |c| c.allowed_ports = crate::config::default_allowed_ports(),
                want: None,
            },
            Case {
                name: "port not listed",
                edit: |c| {
                    c.allowed_ports = vec![
                        crate::config::PortEntry::Port(8080),
                        crate::config::PortEntry::Range("9000-9100".into()),
                    ]
                },
                want: Some("spec.port 3128 is not allowed by this provider's allowedPorts (8080, 9000-9100)"),
            },
            Case {
                name: "port in a listed range",
                edit: |c| c.allowed_ports = vec![crate::config::PortEntry::Range("3000-4000".into())],
                want: None,
            },
            Case {
                name: "image not listed",
                edit: |c| c.allowed_images = vec!["projects/debian-cloud/*".into()],
                want: Some("placement.image \"projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64\" is not allowed"),
            },
        ];
        for c in cases {
            let mut cfg = cfg();
            (c.edit)(&mut cfg);
            match (validate_placement(&req(), &cfg), c.want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{}: {e}", c.name),
                (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
            }
        }
    }

    #[test]
    fn placement_validation_names_the_field() {
        struct Case {
            name: &'static str,
            edit: fn(&mut CreateRequest),
            want: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "ok",
                edit: |_| {},
                want: None,
            },
            Case {
                name: "zone",
                edit: |r| r.placement.zone.clear(),
                want: Some("placement.zone"),
            },
            Case {
                name: "zone slash",
                edit: |r| r.placement.zone = "a/b".into(),
                want: Some("placement.zone \"a/b\""),
            },
            Case {
                name: "machineType",
                edit: |r| r.placement.machine_type.clear(),
                want: Some("placement.machineType is required"),
            },
            Case {
                name: "image",
                edit: |r| r.placement.image = " ".into(),
                want: Some("placement.image is required"),
            },
            Case {
                name: "region ignored",
                edit: |r| r.placement.region.clear(),
                want: None,
            },
        ];
        for c in cases {
            let mut r = req();
            (c.edit)(&mut r);
            match (validate_placement(&r, &cfg()), c.want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{}: {e}", c.name),
                (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
            }
        }
    }

    #[test]
    fn ids_parse_strictly() {
        let r = parse_id("zones/europe-west1-b/instances/proxy-abc").unwrap();
        assert_eq!(r.zone, "europe-west1-b");
        assert_eq!(r.name, "proxy-abc");
        assert_eq!(r.id(), "zones/europe-west1-b/instances/proxy-abc");
        for bad in [
            "",
            "zones/z/instances/",
            "zones//instances/n",
            "zone/z/instances/n",
            "zones/z/instance/n",
            "zones/z/instances/n/x",
            "/zones/z/instances/n",
            "projects/p/zones/z/instances/n",
            "ns/name",
            "zones/Z/instances/n",
        ] {
            let e = parse_id(bad).unwrap_err();
            assert!(e.contains("malformed gcp providerID"), "{bad}: {e}");
        }
    }

    #[test]
    fn request_ids_are_uuids_and_deterministic() {
        let a = request_id("insert", "proxy-a", "u1");
        assert_eq!(a, request_id("insert", "proxy-a", "u1"));
        assert_ne!(a, request_id("insert", "proxy-a", "u2"));
        assert_ne!(a, request_id("insert", "proxy-b", "u1"));
        assert_eq!(a.len(), 36);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, vec![8, 4, 4, 4, 12]);
        assert_eq!(&a[14..15], "5");
    }

    #[test]
    fn state_table() {
        use InstanceState::*;
        struct Case {
            name: &'static str,
            status: Option<&'static str>,
            has_ip: bool,
            want: InstanceState,
        }
        let cases = [
            Case {
                name: "provisioning",
                status: Some("PROVISIONING"),
                has_ip: false,
                want: Provisioning,
            },
            Case {
                name: "staging is still provisioning",
                status: Some("STAGING"),
                has_ip: false,
                want: Provisioning,
            },
            Case {
                name: "running with an ip",
                status: Some("RUNNING"),
                has_ip: true,
                want: Running,
            },
            Case {
                name: "running without an ip is not ready yet",
                status: Some("RUNNING"),
                has_ip: false,
                want: Provisioning,
            },
            Case {
                name: "repairing counts as provisioning",
                status: Some("REPAIRING"),
                has_ip: false,
                want: Provisioning,
            },
            Case {
                name: "stopping is stopped even with an ip",
                status: Some("STOPPING"),
                has_ip: true,
                want: Stopped,
            },
            Case {
                name: "stopped",
                status: Some("STOPPED"),
                has_ip: false,
                want: Stopped,
            },
            Case {
                name: "suspending is stopped",
                status: Some("SUSPENDING"),
                has_ip: false,
                want: Stopped,
            },
            Case {
                name: "suspended is stopped",
                status: Some("SUSPENDED"),
                has_ip: false,
                want: Stopped,
            },
            Case {
                name: "terminated",
                status: Some("TERMINATED"),
                has_ip: false,
                want: Terminated,
            },
            Case {
                name: "unknown status is stopped",
                status: Some("FROBNICATING"),
                has_ip: true,
                want: Stopped,
            },
            Case {
                name: "empty status is stopped",
                status: Some(""),
                has_ip: false,
                want: Stopped,
            },
            Case {
                name: "no status yet is provisioning",
                status: None,
                has_ip: false,
                want: Provisioning,
            },
            Case {
                name: "status is case sensitive",
                status: Some("running"),
                has_ip: true,
                want: Stopped,
            },
        ];
        for c in cases {
            assert_eq!(map_state(c.status, c.has_ip), c.want, "{}", c.name);
        }
    }

    #[test]
    fn read_back() {
        let inst = model::Instance::new()
            .set_status(model::instance::Status::Running)
            .set_creation_timestamp("2024-05-01T12:00:00.000-07:00")
            .set_labels([
                (LABEL_UID, "u"),
                (LABEL_INSTALLATION, "i"),
                (LABEL_MANAGED, "true"),
            ])
            .set_network_interfaces([model::NetworkInterface::new()
                .set_access_configs([model::AccessConfig::new().set_nat_ip("203.0.113.7")])]);
        let got = to_instance("zones/z/instances/n".into(), &inst);
        assert_eq!(got.state, InstanceState::Running);
        assert_eq!(got.ip, "203.0.113.7");
        assert_eq!(got.uid, "u");
        assert_eq!(got.installation_id, "i");
        assert_eq!(
            got.created_at.unwrap().to_rfc3339(),
            "2024-05-01T19:00:00+00:00"
        );
        assert!(is_managed(&inst));
        let bad = inst.clone().set_creation_timestamp("yesterday");
        assert_eq!(to_instance(String::new(), &bad).created_at, None);
        assert_eq!(
            last_segment("https://x/zones/europe-west1-b"),
            "europe-west1-b"
        );
        assert_eq!(last_segment("z"), "z");
    }
}
