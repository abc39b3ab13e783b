//! The create sequences on one connection: what the host already has
//! ([`existing`]), then overlay, seed, define and start ([`Build::run`]).

use chrono::Utc;
use tracing::debug;
use virt::connect::Connect;
use virt::storage_vol::StorageVol;
use virt::sys;

use super::classify::{code, code_of};
use super::conn::{rpc, NO_FLAGS};
use super::domain::{ensure_running, lookup_domain, read_mark};
use super::ids::{overlay_volume, seed_volume};
use super::image::{delete_if_exists, upload_small};
use super::xml::{self, domain_xml, volume_xml, DomainSpec};
use crate::config::{DomainType, Firmware, ImageFormat};

/// Outcome of the first Create step.
pub enum Existing {
    /// The domain exists, carries the UID and runs.
    Done,
    /// The domain exists with another (or no) UID.
    Foreign(String),
    /// No domain; the pool is active.
    Build,
    /// The pool exists but is not running.
    PoolInactive(u32),
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

/// Everything the build sequence needs, owned (it runs on the blocking
/// pool).
pub struct Build {
    pub name: String,
    pub uid: String,
    pub installation: String,
    pub pool: String,
    pub bridge: String,
    /// Overlay capacity in bytes.
    pub capacity: u64,
    pub base_path: String,
    pub base_format: ImageFormat,
    pub firmware: Firmware,
    pub domain_type: DomainType,
    pub memory_mib: i64,
    pub vcpus: i32,
    /// The NoCloud seed image.
    pub iso: Vec<u8>,
}

impl Build {
    /// Overlay (reused when it backs onto the right base, else rebuilt), a
    /// fresh seed, define, start.
    pub fn run(&self, c: &Connect) -> Result<(), virt::error::Error> {
        let (name, base_path) = (&self.name, &self.base_path);
        let p = rpc("virStoragePoolLookupByName", || {
            c.lookup_storage_pool_by_name(&self.pool)
        })?;
        let ov_name = overlay_volume(name);
        let ov_xml = volume_xml(
            &ov_name,
            self.capacity,
            ImageFormat::Qcow2,
            Some((base_path.as_str(), self.base_format)),
        );
        let overlay = match rpc("virStorageVolCreateXML", || {
            StorageVol::create_xml(&p, &ov_xml, NO_FLAGS)
        }) {
            Ok(v) => {
                debug!(volume = %ov_name, "overlay volume created");
                v
            }
            Err(e) if code_of(&e) == code::STORAGE_VOL_EXIST => {
                debug!(volume = %ov_name, "overlay volume already exists");
                let v = rpc("virStorageVolLookupByName", || {
                    p.lookup_storage_vol_by_name(&ov_name)
                })?;
                let vx = rpc("virStorageVolGetXMLDesc", || v.xml_desc(NO_FLAGS))?;
                if xml::backing_path(&vx).as_deref() == Some(base_path.as_str()) {
                    v
                } else {
                    // No domain uses it yet: rebuild it on the right base.
                    debug!(volume = %ov_name, "overlay backed by another image, recreating");
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
        upload_small(c, &self.pool, &seed_name, &self.iso)?;
        debug!(volume = %seed_name, bytes = self.iso.len(), "seed volume uploaded");
        let seed = rpc("virStorageVolLookupByName", || {
            p.lookup_storage_vol_by_name(&seed_name)
        })?;
        let overlay_path = rpc("virStorageVolGetPath", || overlay.path())?;
        let seed_path = rpc("virStorageVolGetPath", || seed.path())?;
        let dx = domain_xml(&DomainSpec {
            name,
            uid: &self.uid,
            installation: &self.installation,
            created_at: Utc::now(),
            memory_mib: self.memory_mib,
            vcpus: self.vcpus,
            firmware: self.firmware,
            domain_type: self.domain_type,
            overlay_path: &overlay_path,
            seed_path: &seed_path,
            bridge: &self.bridge,
        });
        let d = rpc("virDomainDefineXML", || c.define_domain_xml(&dx))?;
        debug!(uid = %self.uid, "domain defined");
        ensure_running(&d)
    }
}
