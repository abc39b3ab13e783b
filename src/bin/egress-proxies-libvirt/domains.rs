//! The libvirt sequences about domains: look up, read the mark, observe
//! (state and address), ensure running, list, delete, and the create
//! steps (what the host already has, then overlay, seed, define, start).

use chrono::Utc;
use egress_proxies_operator::config::ImageFormat;
use egress_proxies_operator::provider::kvm::classify::code;
use egress_proxies_operator::provider::kvm::domain::is_active;
use egress_proxies_operator::provider::kvm::ids::{overlay_volume, seed_volume};
use egress_proxies_operator::provider::kvm::protocol::{Build, Existing, Observed};
use egress_proxies_operator::provider::kvm::xml::{
    self, domain_xml, parse_mark, volume_xml, DomainSpec, Mark, METADATA_URI,
};
use egress_proxies_operator::provider::kvm::{own_nic, pick_ipv4};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_vol::StorageVol;
use virt::sys;

use crate::volumes::{delete_if_exists, upload_small};
use crate::wire::{absent, code_of, note, rpc};
use crate::NO_FLAGS;

/// The domain's mark: `Ok(None)` when it has none (not ours),
/// `Ok(Some(Err(_)))` when it does not parse.
pub type MarkRead = Option<Result<Mark, String>>;

/// Reads the domain's mark.
pub fn read_mark(d: &Domain) -> Result<MarkRead, virt::error::Error> {
    let read = rpc("virDomainGetMetadata", || {
        d.metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(METADATA_URI),
            sys::VIR_DOMAIN_AFFECT_CURRENT,
        )
    });
    Ok(absent(read, code::NO_DOMAIN_METADATA)?.map(|x| parse_mark(&x)))
}

/// State and, for an active domain, address.
pub fn observe(d: &Domain, mark: Option<Mark>) -> Result<Observed, virt::error::Error> {
    let info = rpc("virDomainGetInfo", || d.info())?;
    let state = info.state.to_raw();
    let (ip, macs) = if is_active(state) {
        address_of(d)
    } else {
        (String::new(), Vec::new())
    };
    let macs = if ip.is_empty() { macs } else { Vec::new() };
    Ok(Observed {
        mark,
        state,
        ip,
        macs,
    })
}

/// Starts the domain unless it runs.
pub fn ensure_running(d: &Domain) -> Result<(), virt::error::Error> {
    let info = rpc("virDomainGetInfo", || d.info())?;
    if is_active(info.state.to_raw()) {
        return Ok(());
    }
    match rpc("virDomainCreate", || d.create()) {
        Ok(()) => {
            note("domain started", None);
            Ok(())
        }
        Err(e) if code_of(&e) == code::OPERATION_INVALID => {
            note("domain already running, start treated as success", None);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The domain `name`, if it exists.
pub fn lookup_domain(c: &Connect, name: &str) -> Result<Option<Domain>, virt::error::Error> {
    let found = rpc("virDomainLookupByName", || c.lookup_domain_by_name(name));
    absent(found, code::NO_DOMAIN)
}

/// Observes the domain `name` (NotFound when it is missing); `Ok(Err(_))`
/// when its mark does not parse.
pub fn read_domain(
    c: &Connect,
    name: &str,
) -> Result<Result<Observed, String>, virt::error::Error> {
    let d = rpc("virDomainLookupByName", || c.lookup_domain_by_name(name))?;
    match read_mark(&d)? {
        Some(Err(why)) => Ok(Err(why)),
        Some(Ok(mark)) => observe(&d, Some(mark)).map(Ok),
        None => observe(&d, None).map(Ok),
    }
}

/// The managed domains, by name; unreadable ones are skipped.
pub fn list_managed(c: &Connect) -> Result<Vec<(String, Observed)>, virt::error::Error> {
    let doms = rpc("virConnectListAllDomains", || c.list_all_domains(NO_FLAGS))?;
    let mut out = Vec::new();
    for d in doms {
        let Ok(name) = d.name() else { continue };
        let mark = match read_mark(&d) {
            Ok(Some(Ok(m))) if m.managed => m,
            Ok(Some(Err(why))) => {
                note(
                    &format!("skipping domain with unreadable metadata: {why}"),
                    Some(&name),
                );
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                note(
                    &format!("skipping domain with unreadable metadata: {}", e.message()),
                    Some(&name),
                );
                continue;
            }
        };
        let Ok(obs) = observe(&d, Some(mark)) else {
            continue;
        };
        out.push((name, obs));
    }
    Ok(out)
}

/// Destroys and undefines the domain `name` (with managed save, snapshot
/// metadata and NVRAM), then deletes its overlay and seed from `pool`.
/// What is already gone counts as deleted.
pub fn delete_domain(c: &Connect, name: &str, pool: &str) -> Result<(), virt::error::Error> {
    if let Some(d) = lookup_domain(c, name)? {
        match rpc("virDomainDestroy", || d.destroy()) {
            Ok(()) => note("domain destroyed", Some(name)),
            Err(e) if code_of(&e) == code::OPERATION_INVALID => {
                note("domain not running, destroy skipped", Some(name))
            }
            Err(e) if code_of(&e) == code::NO_DOMAIN => {}
            Err(e) => return Err(e),
        }
        match rpc("virDomainUndefineFlags", || {
            d.undefine_flags(
                sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                    | sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                    | sys::VIR_DOMAIN_UNDEFINE_NVRAM,
            )
        }) {
            Ok(()) => {}
            Err(e) if code_of(&e) == code::NO_DOMAIN => {}
            Err(e) => return Err(e),
        }
    } else {
        note("domain already gone", Some(name));
    }
    let p = match rpc("virStoragePoolLookupByName", || {
        c.lookup_storage_pool_by_name(pool)
    }) {
        Ok(p) => p,
        Err(e) if code_of(&e) == code::NO_STORAGE_POOL => {
            note("pool not found, no volumes to delete", Some(pool));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    delete_if_exists(&p, &overlay_volume(name))?;
    delete_if_exists(&p, &seed_volume(name))?;
    Ok(())
}

/// The domain's address (empty when it has none yet) and its NICs' MACs
/// (for the host's neighbour table, `neighbours.rs`).
pub fn address_of(d: &Domain) -> (String, Vec<String>) {
    // Only the domain's own NICs count (a bridge inside the guest must not
    // win); without the XML every interface counts.
    let macs = rpc("virDomainGetXMLDesc", || d.xml_desc(NO_FLAGS))
        .map(|x| xml::interface_macs(&x))
        .unwrap_or_default();
    // Lease (libvirt networks), ARP, then the guest agent; errors mean "no
    // address yet", never a failure.
    for (source, name) in [
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
            "virDomainInterfaceAddresses(lease)",
        ),
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            "virDomainInterfaceAddresses(arp)",
        ),
        (
            sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
            "virDomainInterfaceAddresses(agent)",
        ),
    ] {
        if let Ok(ifaces) = rpc(name, || d.interface_addresses(source, NO_FLAGS)) {
            let view: Vec<(String, Vec<(i64, String)>)> = ifaces
                .into_iter()
                .filter(|i| own_nic(&macs, i.hwaddr.as_deref()))
                .map(|i| {
                    (
                        i.name,
                        i.addrs.into_iter().map(|a| (a.typed, a.addr)).collect(),
                    )
                })
                .collect();
            if let Some(ip) = pick_ipv4(&view) {
                return (ip, macs);
            }
        }
    }
    (String::new(), macs)
}

/// Looks up the domain `name`: one carrying `uid` is started if stopped;
/// without one, the pool must be running.
pub fn existing(
    c: &Connect,
    name: &str,
    uid: &str,
    pool: &str,
) -> Result<Existing, virt::error::Error> {
    if let Some(d) = lookup_domain(c, name)? {
        let got = match read_mark(&d)? {
            Some(Ok(m)) => m.uid,
            _ => String::new(),
        };
        if got != uid {
            return Ok(Existing::Foreign(got));
        }
        ensure_running(&d)?;
        return Ok(Existing::Done);
    }
    let p = rpc("virStoragePoolLookupByName", || {
        c.lookup_storage_pool_by_name(pool)
    })?;
    let info = rpc("virStoragePoolGetInfo", || p.info())?;
    if info.state != sys::VIR_STORAGE_POOL_RUNNING {
        return Ok(Existing::PoolInactive(info.state));
    }
    Ok(Existing::Build)
}

/// Overlay (reused when it backs onto the right base, else rebuilt), a
/// fresh seed, define, start.
pub fn build(c: &Connect, b: &Build) -> Result<(), virt::error::Error> {
    let (name, base_path) = (&b.name, &b.base_path);
    let p = rpc("virStoragePoolLookupByName", || {
        c.lookup_storage_pool_by_name(&b.pool)
    })?;
    let ov_name = overlay_volume(name);
    let ov_xml = volume_xml(
        &ov_name,
        b.capacity,
        ImageFormat::Qcow2,
        Some((base_path.as_str(), b.base_format)),
    );
    let overlay = match rpc("virStorageVolCreateXML", || {
        StorageVol::create_xml(&p, &ov_xml, NO_FLAGS)
    }) {
        Ok(v) => {
            note("overlay volume created", Some(&ov_name));
            v
        }
        Err(e) if code_of(&e) == code::STORAGE_VOL_EXIST => {
            note("overlay volume already exists", Some(&ov_name));
            let v = rpc("virStorageVolLookupByName", || {
                p.lookup_storage_vol_by_name(&ov_name)
            })?;
            let vx = rpc("virStorageVolGetXMLDesc", || v.xml_desc(NO_FLAGS))?;
            if xml::backing_path(&vx).as_deref() == Some(base_path.as_str()) {
                v
            } else {
                // No domain uses it yet: rebuild it on the right base.
                note(
                    "overlay backed by another image, recreating",
                    Some(&ov_name),
                );
                rpc("virStorageVolDelete", || v.delete(NO_FLAGS))?;
                rpc("virStorageVolCreateXML", || {
                    StorageVol::create_xml(&p, &ov_xml, NO_FLAGS)
                })?
            }
        }
        Err(e) => return Err(e),
    };
    let seed_name = seed_volume(name);
    delete_if_exists(&p, &seed_name)?;
    upload_small(c, &b.pool, &seed_name, &b.iso)?;
    note("seed volume uploaded", Some(&seed_name));
    let seed = rpc("virStorageVolLookupByName", || {
        p.lookup_storage_vol_by_name(&seed_name)
    })?;
    let overlay_path = rpc("virStorageVolGetPath", || overlay.path())?;
    let seed_path = rpc("virStorageVolGetPath", || seed.path())?;
    let dx = domain_xml(&DomainSpec {
        name,
        uid: &b.uid,
        installation: &b.installation,
        created_at: Utc::now(),
        memory_mib: b.memory_mib,
        vcpus: b.vcpus,
        firmware: b.firmware,
        domain_type: b.domain_type,
        overlay_path: &overlay_path,
        seed_path: &seed_path,
        bridge: &b.bridge,
    });
    let d = rpc("virDomainDefineXML", || c.define_domain_xml(&dx))?;
    note("domain defined", Some(&b.name));
    ensure_running(&d)
}
