//! libvirt sequences on one connection about existing domains: look up,
//! read the mark, observe (state and address), ensure running, list and
//! delete. Each runs inside [`super::conn::OpConn::call`].

use tracing::{debug, info};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;

use super::address::address_of;
use super::classify::{code, code_of};
use super::conn::{rpc, NO_FLAGS};
use super::ids::{overlay_volume, seed_volume};
use super::image::delete_if_exists;
use super::xml::{parse_mark, Mark, METADATA_URI};
use crate::provider::{Instance, InstanceState};

/// libvirt domain states (virDomainState).
mod dstate {
    use virt::sys;

    pub const NOSTATE: u32 = sys::VIR_DOMAIN_NOSTATE;
    pub const RUNNING: u32 = sys::VIR_DOMAIN_RUNNING;
    pub const BLOCKED: u32 = sys::VIR_DOMAIN_BLOCKED;
}

/// Maps a libvirt state and address to the provider state (kvm.md §6).
pub fn map_state(state: u32, ip: &str) -> InstanceState {
    match state {
        dstate::NOSTATE => InstanceState::Provisioning,
        dstate::RUNNING | dstate::BLOCKED if !ip.is_empty() => InstanceState::Running,
        dstate::RUNNING | dstate::BLOCKED => InstanceState::Provisioning,
        _ => InstanceState::Stopped,
    }
}

fn is_active(state: u32) -> bool {
    state == dstate::RUNNING || state == dstate::BLOCKED
}

/// What Get and ListByTag learn about a domain.
pub struct Observed {
    pub mark: Option<Mark>,
    pub state: u32,
    pub ip: String,
    /// The NICs' MACs of an active domain without an address yet.
    pub macs: Vec<String>,
}

/// The instance `id` as observed.
pub fn to_instance(id: String, obs: Observed) -> Instance {
    let mark = obs.mark.unwrap_or_default();
    Instance {
        id,
        state: map_state(obs.state, &obs.ip),
        ip: obs.ip,
        uid: mark.uid,
        installation_id: mark.installation,
        created_at: mark.created_at,
    }
}

/// The domain's mark: `Ok(None)` when it has none (not ours),
/// `Ok(Some(Err(_)))` when it does not parse.
pub type MarkRead = Option<Result<Mark, String>>;

/// Reads the domain's mark.
pub fn read_mark(d: &Domain) -> Result<MarkRead, virt::error::Error> {
    match rpc("virDomainGetMetadata", || {
        d.metadata(
            sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(METADATA_URI),
            sys::VIR_DOMAIN_AFFECT_CURRENT,
        )
    }) {
        Ok(x) => Ok(Some(parse_mark(&x))),
        Err(e) if code_of(&e) == code::NO_DOMAIN_METADATA => Ok(None),
        Err(e) => Err(e),
    }
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
            debug!("domain started");
            Ok(())
        }
        Err(e) if code_of(&e) == code::OPERATION_INVALID => {
            debug!("domain already running, start treated as success");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The domain `name`, if it exists.
pub fn lookup_domain(c: &Connect, name: &str) -> Result<Option<Domain>, virt::error::Error> {
    match rpc("virDomainLookupByName", || c.lookup_domain_by_name(name)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if code_of(&e) == code::NO_DOMAIN => Ok(None),
        Err(e) => Err(e),
    }
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
                debug!(domain = %name, error = %why, "skipping domain with unreadable metadata");
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                debug!(domain = %name, error = %e.message(), "skipping domain with unreadable metadata");
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
            Ok(()) => debug!("domain destroyed"),
            Err(e) if code_of(&e) == code::OPERATION_INVALID => {
                debug!("domain not running, destroy skipped")
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
        debug!("domain already gone");
    }
    let p = match rpc("virStoragePoolLookupByName", || {
        c.lookup_storage_pool_by_name(pool)
    }) {
        Ok(p) => p,
        Err(e) if code_of(&e) == code::NO_STORAGE_POOL => {
            info!(pool = %pool, "pool not found, no volumes to delete");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    delete_if_exists(&p, &overlay_volume(name))?;
    delete_if_exists(&p, &seed_volume(name))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_table() {
        assert_eq!(map_state(0, ""), InstanceState::Provisioning);
        assert_eq!(map_state(1, "10.0.0.5"), InstanceState::Running);
        assert_eq!(map_state(2, "10.0.0.5"), InstanceState::Running);
        assert_eq!(map_state(1, ""), InstanceState::Provisioning);
        for s in 3..=9 {
            assert_eq!(map_state(s, "10.0.0.5"), InstanceState::Stopped, "{s}");
        }
    }
}
