//! An in-memory provider for in-process tests of everything above the
//! provider seam, and the fourth backend of the conformance suite
//! (`tests/provider_conformance.rs`), so it keeps the contract of
//! docs/providers.md as the real providers do: instances keyed by name carry
//! the managed, UID and installation marks of the request that made them;
//! `create` is idempotent by name and refuses another Proxy's instance with
//! Permanent; `get` is NotFound only once the instance is gone and never
//! Running without an IP; `delete` is idempotent; `list_by_tag` returns every
//! instance with the managed mark, whatever its installation, like the real
//! providers (a provider is never told its installation: keeping to it is
//! orphan GC's decision, `gc::select`).
//!
//! Configurable: how many gets an instance answers Provisioning before it is
//! Running, how many gets a deleted one stays visible (as a terminating Pod
//! does), faults per operation ("the next N creates fail Transient"), and
//! [`FakeProvider::plant`], which puts instances into the store the way a
//! person or another installation would.
//!
//! A `Clone` handle over one `std` mutex, so a test keeps a handle while the
//! registry owns another. Every call runs synchronously under the lock, so
//! dropping a call's future never leaves the store half-updated.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tracing::debug;

use super::registry::ProviderType;
use super::{
    Checker, CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider,
    ProviderError, TargetStatus,
};

/// Prefix of every providerID the fake hands out: `fake/<name>`.
pub const ID_PREFIX: &str = "fake/";

/// The address the fake's health check reports.
pub const CHECK_ADDRESS: &str = "memory";

/// An instance put into the store by hand ([`FakeProvider::plant`]), as
/// someone other than this operator's `create` would make it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seed {
    /// The instance name (the part after `fake/` in its ID).
    pub name: String,
    /// Whether it carries the managed mark (`list_by_tag` sees only those).
    pub managed: bool,
    /// The UID mark; empty for none.
    pub uid: String,
    /// The installation mark; empty for none.
    pub installation_id: String,
    /// The state `get` reports, fixed (no progression).
    pub state: InstanceState,
    /// The address `get` reports.
    pub ip: String,
    /// The creation time read back.
    pub created_at: Option<DateTime<Utc>>,
}

impl Seed {
    /// A managed, Running instance owned by Proxy `uid` of installation
    /// `installation_id`, created now.
    pub fn managed(name: &str, uid: &str, installation_id: &str) -> Self {
        Seed {
            name: name.to_string(),
            managed: true,
            uid: uid.to_string(),
            installation_id: installation_id.to_string(),
            state: InstanceState::Running,
            ip: "192.0.2.250".to_string(),
            created_at: Some(Utc::now()),
        }
    }

    /// An instance without any mark (made by hand, not by an operator).
    pub fn unmarked(name: &str) -> Self {
        Seed {
            managed: false,
            ..Seed::managed(name, "", "")
        }
    }
}

/// One stored instance.
#[derive(Clone, Debug)]
struct Entry {
    managed: bool,
    uid: String,
    installation_id: String,
    created_at: Option<DateTime<Utc>>,
    ip: String,
    /// Gets answered since creation (drives the progression).
    gets: u32,
    /// A state set by the test, which replaces the progression.
    fixed: Option<InstanceState>,
    /// Gets left before a deleted instance is gone; `None` while not deleted.
    deleting: Option<u32>,
}

/// An injected failure of one call: its class and message.
#[derive(Clone, Debug)]
struct Fault(ErrorClass, String);

/// Everything behind the lock.
#[derive(Debug)]
struct State {
    provider_type: ProviderType,
    instances: BTreeMap<String, Entry>,
    /// Gets an instance answers Provisioning before it is Running.
    provisioning_gets: u32,
    /// Gets a deleted instance stays visible (Provisioning) before NotFound.
    delete_gets: u32,
    /// The address every Running instance gets; `None`: one per instance.
    fixed_ip: Option<String>,
    next_ip: u32,
    faults: HashMap<Op, VecDeque<Fault>>,
    calls: HashMap<Op, usize>,
    unread_scopes: Vec<String>,
    /// `None` while the check passes; the failure message otherwise.
    unreachable: Option<String>,
}

/// The in-memory provider. Cheap to clone; clones share the store.
#[derive(Clone)]
pub struct FakeProvider {
    name: Arc<str>,
    state: Arc<Mutex<State>>,
}

impl FakeProvider {
    /// An empty fake named `name`, of type kubernetes (the type only shows in
    /// metrics and provider health; nothing branches on it). An instance
    /// answers Provisioning to its first get and Running with an IP after
    /// that; a deleted instance is gone at once.
    pub fn new(name: &str) -> Self {
        FakeProvider {
            name: Arc::from(name),
            state: Arc::new(Mutex::new(State {
                provider_type: ProviderType::Kubernetes,
                instances: BTreeMap::new(),
                provisioning_gets: 1,
                delete_gets: 0,
                fixed_ip: None,
                next_ip: 0,
                faults: HashMap::new(),
                calls: HashMap::new(),
                unread_scopes: Vec::new(),
                unreachable: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock can only come from a test's own
        // assertion elsewhere; every update here is a plain insert/remove,
        // so the store stays consistent and usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The same fake reporting another provider type.
    pub fn with_type(self, provider_type: ProviderType) -> Self {
        self.lock().provider_type = provider_type;
        self
    }

    /// Instances answer Provisioning to their first `gets` gets, then
    /// Running (0: Running at the first get; `u32::MAX`: never).
    pub fn with_provisioning_gets(self, gets: u32) -> Self {
        self.lock().provisioning_gets = gets;
        self
    }

    /// A deleted instance stays visible, Provisioning, for `gets` gets
    /// before it is NotFound (0: gone at once).
    pub fn with_delete_gets(self, gets: u32) -> Self {
        self.lock().delete_gets = gets;
        self
    }

    /// Every instance created from now on is Running at `ip` (e.g. a local
    /// Squid's address for probes); by default each gets its own 192.0.2.N.
    pub fn with_ip(self, ip: &str) -> Self {
        self.lock().fixed_ip = Some(ip.to_string());
        self
    }

    /// The next `n` calls of `op` fail with `class` and change nothing.
    pub fn fail_next(&self, op: Op, n: usize, class: ErrorClass) {
        self.fail_next_with(op, n, class, &format!("injected {class} fault"));
    }

    /// Like [`Self::fail_next`], with the error message given.
    pub fn fail_next_with(&self, op: Op, n: usize, class: ErrorClass, message: &str) {
        let mut s = self.lock();
        let queue = s.faults.entry(op).or_default();
        queue.extend(std::iter::repeat_n(Fault(class, message.to_string()), n));
    }

    /// How many calls of `op` were made, failed ones included.
    pub fn calls(&self, op: Op) -> usize {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Puts an instance into the store as the backend's own user would,
    /// replacing one of the same name; returns its ID.
    pub fn plant(&self, seed: Seed) -> String {
        let entry = Entry {
            managed: seed.managed,
            uid: seed.uid,
            installation_id: seed.installation_id,
            created_at: seed.created_at,
            ip: seed.ip,
            gets: 0,
            fixed: Some(seed.state),
            deleting: None,
        };
        self.lock().instances.insert(seed.name.clone(), entry);
        provider_id(&seed.name)
    }

    /// Fixes the state (and address) `get` reports for `id` from now on,
    /// as when a VM is stopped out of band. Returns false when it does not
    /// exist.
    pub fn set_state(&self, id: &str, state: InstanceState, ip: &str) -> bool {
        let Some(name) = parse_id(id) else {
            return false;
        };
        let mut s = self.lock();
        match s.instances.get_mut(name) {
            Some(e) => {
                e.fixed = Some(state);
                e.ip = ip.to_string();
                true
            }
            None => false,
        }
    }

    /// Removes `id` without a delete, as when an instance vanishes out of
    /// band. Returns whether it existed.
    pub fn vanish(&self, id: &str) -> bool {
        parse_id(id).is_some_and(|name| self.lock().instances.remove(name).is_some())
    }

    /// Every stored instance as `get` would show it now (without counting as
    /// a get), managed or not, by name.
    pub fn instances(&self) -> Vec<Instance> {
        let s = self.lock();
        s.instances
            .iter()
            .map(|(name, e)| view(name, e, s.provisioning_gets))
            .collect()
    }

    /// Scopes the next listings report as unread.
    pub fn set_unread_scopes(&self, scopes: &[&str]) {
        self.lock().unread_scopes = scopes.iter().map(|s| s.to_string()).collect();
    }

    /// Makes the health check fail with `message` (`None`: pass again).
    pub fn set_unreachable(&self, message: Option<&str>) {
        self.lock().unreachable = message.map(str::to_string);
    }

    fn error(&self, class: ErrorClass, op: Op, id: &str, message: String) -> ProviderError {
        ProviderError::new(class, op, &self.name, id, message)
    }

    /// Counts the call and pops its injected fault, if any.
    fn begin(&self, s: &mut State, op: Op, id: &str) -> Result<(), ProviderError> {
        *s.calls.entry(op).or_default() += 1;
        match s.faults.get_mut(&op).and_then(VecDeque::pop_front) {
            Some(Fault(class, message)) => {
                debug!(provider = %self.name, op = op.as_str(), id, %class, "injected fault");
                Err(self.error(class, op, id, message))
            }
            None => Ok(()),
        }
    }

    fn name_of<'a>(&self, op: Op, id: &'a str) -> Result<&'a str, ProviderError> {
        parse_id(id).ok_or_else(|| {
            self.error(
                ErrorClass::Permanent,
                op,
                id,
                format!("malformed fake providerID {id:?}, want {ID_PREFIX}<name>"),
            )
        })
    }
}

/// The providerID of instance `name`.
pub fn provider_id(name: &str) -> String {
    format!("{ID_PREFIX}{name}")
}

/// The instance name in `fake/<name>`, non-empty and without `/`.
pub fn parse_id(id: &str) -> Option<&str> {
    id.strip_prefix(ID_PREFIX)
        .filter(|n| !n.is_empty() && !n.contains('/'))
}

/// The state an entry shows after `gets` gets, under the progression.
fn state_of(e: &Entry, provisioning_gets: u32) -> InstanceState {
    if e.deleting.is_some() {
        // Going away: never Running, and not NotFound until it is gone.
        return InstanceState::Provisioning;
    }
    let state = e.fixed.unwrap_or(if e.gets > provisioning_gets {
        InstanceState::Running
    } else {
        InstanceState::Provisioning
    });
    // The contract: Running only ever with an address.
    if state == InstanceState::Running && e.ip.is_empty() {
        InstanceState::Provisioning
    } else {
        state
    }
}

fn view(name: &str, e: &Entry, provisioning_gets: u32) -> Instance {
    let state = state_of(e, provisioning_gets);
    Instance {
        id: provider_id(name),
        // Like the gcp and kubernetes backends, an address shows only once
        // the instance runs.
        ip: if state == InstanceState::Running {
            e.ip.clone()
        } else {
            String::new()
        },
        state,
        uid: e.uid.clone(),
        installation_id: e.installation_id.clone(),
        created_at: e.created_at,
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider_type(&self) -> ProviderType {
        self.lock().provider_type
    }

    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        let id = provider_id(&req.name);
        let mut s = self.lock();
        self.begin(&mut s, Op::Create, "")?;
        if req.name.is_empty() || req.name.contains('/') {
            return Err(self.error(
                ErrorClass::Permanent,
                Op::Create,
                "",
                format!("instance name {:?} is not a valid name", req.name),
            ));
        }
        if let Some(existing) = s.instances.get(&req.name) {
            // Idempotent by name, but never adopt another Proxy's instance.
            if existing.uid == req.uid {
                return Ok(id);
            }
            return Err(self.error(
                ErrorClass::Permanent,
                Op::Create,
                &id,
                format!(
                    "instance {} exists but belongs to Proxy UID {:?}, not {:?}",
                    req.name, existing.uid, req.uid
                ),
            ));
        }
        let ip = match &s.fixed_ip {
            Some(ip) => ip.clone(),
            None => {
                s.next_ip = s.next_ip % 254 + 1;
                format!("192.0.2.{}", s.next_ip)
            }
        };
        s.instances.insert(
            req.name.clone(),
            Entry {
                managed: true,
                uid: req.uid.clone(),
                installation_id: req.installation_id.clone(),
                created_at: Some(Utc::now()),
                ip,
                gets: 0,
                fixed: None,
                deleting: None,
            },
        );
        debug!(provider = %self.name, id, cloud_init_bytes = req.cloud_init.len(), "fake instance created");
        Ok(id)
    }

    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::Get, id)?;
        let name = self.name_of(Op::Get, id)?;
        let provisioning_gets = s.provisioning_gets;
        let found = match s.instances.get_mut(name) {
            Some(e) if e.deleting != Some(0) => {
                match e.deleting.as_mut() {
                    Some(left) => *left -= 1,
                    None => e.gets = e.gets.saturating_add(1),
                }
                Some(view(name, e, provisioning_gets))
            }
            _ => None,
        };
        found.ok_or_else(|| {
            s.instances.remove(name);
            let message = format!("instance {name} does not exist");
            self.error(ErrorClass::NotFound, Op::Get, id, message)
        })
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::Delete, id)?;
        let name = self.name_of(Op::Delete, id)?;
        let delete_gets = s.delete_gets;
        if delete_gets == 0 {
            s.instances.remove(name);
        } else if let Some(e) = s.instances.get_mut(name) {
            // A delete in flight is not restarted by a second one.
            e.deleting.get_or_insert(delete_gets);
        }
        Ok(())
    }

    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::List, "")?;
        let instances = s
            .instances
            .iter()
            .filter(|(_, e)| e.managed)
            .map(|(name, e)| view(name, e, s.provisioning_gets))
            .collect();
        Ok(Listing {
            instances,
            unread_scopes: s.unread_scopes.clone(),
        })
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(self.clone()))
    }
}

#[async_trait]
impl Checker for FakeProvider {
    async fn check(&self) -> Vec<TargetStatus> {
        let unreachable = self.lock().unreachable.clone();
        let reason = match unreachable {
            Some(_) => "Unreachable",
            None => "Reachable",
        };
        vec![TargetStatus {
            name: self.name.to_string(),
            address: CHECK_ADDRESS.to_string(),
            ready: unreachable.is_none(),
            reason: reason.to_string(),
            message: unreachable.unwrap_or_default(),
            latency: Duration::ZERO,
            details: BTreeMap::new(),
        }]
    }
}

// Compile-time proof the fake satisfies both contracts.
const _: fn() = || {
    fn provider<T: Provider + Checker + Clone + 'static>() {}
    provider::<FakeProvider>();
};

#[cfg(test)]
#[path = "fake_tests.rs"]
mod tests;
