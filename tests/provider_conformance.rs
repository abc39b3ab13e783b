//! The provider conformance suite: the contract of docs/providers.md written
//! once, as async functions over a [`Backend`], and run by every provider
//! against its real backend — kubernetes on the real API server of the test
//! cluster (whose node agent runs the Pods), gcp with the real Compute client
//! on the stand-in (tests/gcp_standin), kvm on a real sshd and libvirtd
//! (tests/kvm_support) — and by the in-memory fake (`provider::fake`).
//!
//! Each backend's test runs every contract and reports every one that
//! fails, so one broken rule does not hide the others. A new provider adds a
//! `Backend` and one test (docs/providers.md, "Adding a provider").
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

#[cfg(feature = "gcp")]
mod gcp_standin;
#[cfg(feature = "kvm")]
mod kvm_support;
mod support;

// One file per real backend (a directory, so cargo does not take them for
// test binaries of their own).
#[cfg(feature = "gcp")]
#[path = "conformance/gcp.rs"]
mod gcp_backend;
#[path = "conformance/kubernetes.rs"]
mod kube_backend;
#[cfg(feature = "kvm")]
#[path = "conformance/kvm.rs"]
mod kvm_backend;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use egress_proxies_operator::gc::select::{verdict, Rules, Verdict};
use egress_proxies_operator::provider::fake::{FakeProvider, Seed};
use egress_proxies_operator::provider::naming::{instance_name, name_from_uid};
use egress_proxies_operator::provider::{
    CreateRequest, ErrorClass, Instance, InstanceState, Listing, Op, Provider, ProviderError,
    UserData,
};
use futures::future::BoxFuture;
use futures::FutureExt;

// ---------------------------------------------------------------------------
// What a backend gives the contract.

/// A provider under test together with what the contract cannot do through
/// the provider itself.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The provider, talking to its real backend.
    fn provider(&self) -> &dyn Provider;

    /// A create request this backend can satisfy, for a new Proxy (a fresh
    /// UID; on kubernetes a real Proxy object, so its Pods are not garbage
    /// collected as orphans). The contract sets the installation.
    async fn request(&self, tag: &str) -> CreateRequest;

    /// The providerID `create` returns for the instance named `name`.
    fn id_of(&self, name: &str) -> String;

    /// Makes the instance `req` describes through the backend's own API,
    /// never through the provider (as a person or another installation
    /// would): with the managed, UID and installation marks of `req` when
    /// `marked`, with none otherwise. Returns its providerID.
    async fn plant(&self, req: &CreateRequest, marked: bool) -> String;

    /// Calls that fail for real, one per way this backend fails beyond the
    /// two every backend has (a get of an unknown instance, NotFound; of a
    /// malformed ID, Permanent), each with the class and operation it must
    /// be reported with.
    async fn errors(&self) -> Vec<ErrorCase>;

    /// The classes this backend cannot produce for real, each with why.
    fn cannot_produce(&self) -> Vec<(ErrorClass, &'static str)>;

    /// How long a deleted instance may stay visible to `get`.
    fn settle(&self) -> Duration;
}

/// One real failure and how it must be classified.
pub struct ErrorCase {
    /// What was done, for messages.
    pub name: &'static str,
    /// The class the error must carry.
    pub class: ErrorClass,
    /// The operation it must name.
    pub op: Op,
    /// What the call returned.
    pub result: Result<(), ProviderError>,
}

impl ErrorCase {
    pub fn new<T>(
        name: &'static str,
        class: ErrorClass,
        op: Op,
        result: Result<T, ProviderError>,
    ) -> Self {
        ErrorCase {
            name,
            class,
            op,
            result: result.map(drop),
        }
    }
}

/// A fresh Proxy UID.
pub fn fresh_uid(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{tag}-{}-{n}-{}",
        std::process::id(),
        Utc::now().timestamp_millis()
    )
}

/// A request with a fresh UID and no placement (kubernetes and the fake).
pub fn plain_request(tag: &str, namespace: &str) -> CreateRequest {
    let uid = fresh_uid(tag);
    CreateRequest {
        name: name_from_uid(&uid),
        uid,
        namespace: namespace.into(),
        proxy_name: tag.into(),
        cloud_init: UserData::new("#cloud-config\n"),
        port: 3128,
        ..Default::default()
    }
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    test_cluster::process::free_port().expect("a free loopback port")
}

// ---------------------------------------------------------------------------
// The contract.

type Contract = for<'a> fn(&'a dyn Backend) -> BoxFuture<'a, ()>;

/// Every rule, in the order they run.
const CONTRACTS: &[(&str, Contract)] = &[
    ("create is idempotent by name", |b| {
        Box::pin(create_is_idempotent_by_name(b))
    }),
    (
        "a Proxy's instances coexist under their serial names",
        |b| Box::pin(instances_of_one_proxy_coexist(b)),
    ),
    ("adoption refuses another owner's UID", |b| {
        Box::pin(adoption_refuses_another_owner(b))
    }),
    ("get after delete is NotFound", |b| {
        Box::pin(get_after_delete_is_not_found(b))
    }),
    ("delete twice is fine", |b| {
        Box::pin(delete_twice_is_fine(b))
    }),
    ("list returns this installation's marked instances", |b| {
        Box::pin(list_returns_this_installations_instances(b))
    }),
    ("each error class is produced and classified", |b| {
        Box::pin(errors_are_classified(b))
    }),
];

/// Runs every contract on `b`; fails naming each one that failed.
async fn conform(b: &dyn Backend) {
    let who = b.provider().name().to_string();
    let mut failed = Vec::new();
    for (rule, contract) in CONTRACTS {
        let t = Instant::now();
        match AssertUnwindSafe(contract(b)).catch_unwind().await {
            Ok(()) => eprintln!("{who}: {rule}: ok ({:?})", t.elapsed()),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("{who}: {rule}: FAILED: {why}");
                failed.push(format!("- {rule}: {why}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "provider {who} breaks the contract:\n{}",
        failed.join("\n")
    );
}

/// A per-process installation identity for one contract, so what another
/// contract (or test process) leaves behind is never counted as its own.
fn installation(rule: &str) -> String {
    format!("conf-{}-{rule}", std::process::id())
}

async fn request(b: &dyn Backend, tag: &str, installation: &str) -> CreateRequest {
    let mut r = b.request(tag).await;
    r.installation_id = installation.to_string();
    r
}

/// What every answer of `get` must satisfy.
fn sane(what: &str, i: &Instance) {
    if i.state == InstanceState::Running {
        assert!(!i.ip.is_empty(), "{what}: Running without an IP: {i:?}");
    }
    let created = i
        .created_at
        .unwrap_or_else(|| panic!("{what}: no creation time read back: {i:?}"));
    let now = Utc::now();
    assert!(
        created > now - chrono::Duration::minutes(10)
            && created < now + chrono::Duration::minutes(1),
        "{what}: creation time {created} is not about now ({now})"
    );
}

/// Polls `get` until NotFound; every answer before it is the same instance.
async fn until_gone(b: &dyn Backend, id: &str, uid: &str) {
    let p = b.provider();
    let t = Instant::now();
    loop {
        match p.get(id).await {
            Err(e) if e.is(ErrorClass::NotFound) => return,
            Err(e) => panic!("get {id} after delete: {e}"),
            Ok(i) => {
                assert_eq!(i.uid, uid, "get {id} while deleting: {i:?}");
                sane("get while deleting", &i);
            }
        }
        assert!(
            t.elapsed() < b.settle(),
            "{id} still there {:?} after its delete",
            b.settle()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lists until every one of `ids` is there: a create may return before the
/// backend holds the instance (kvm's background creates), and nothing can
/// carry a mark before it exists.
async fn listing_with(b: &dyn Backend, ids: &[&str]) -> Listing {
    let t = Instant::now();
    loop {
        let listing = b.provider().list_by_tag().await.expect("list");
        let missing: Vec<&&str> = ids
            .iter()
            .filter(|id| listing.instances.iter().all(|i| i.id != **id))
            .collect();
        if missing.is_empty() {
            return listing;
        }
        assert!(
            t.elapsed() < b.settle(),
            "created instances {missing:?} are not listed after {:?}",
            b.settle()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create_is_idempotent_by_name(b: &dyn Backend) {
    let p = b.provider();
    let req = request(b, "idem", &installation("idem")).await;
    let id = p.create(&req).await.expect("create");
    assert_eq!(id, b.id_of(&req.name), "the providerID");
    let again = p.create(&req).await.expect("create again");
    assert_eq!(again, id, "a repeated create returns the same ID");

    let got = p.get(&id).await.expect("get");
    assert_eq!(got.id, id);
    assert_eq!(got.uid, req.uid, "UID read back");
    assert_eq!(
        got.installation_id, req.installation_id,
        "installation read back"
    );
    sane("get", &got);

    let listing = listing_with(b, &[&id]).await;
    let same: Vec<&Instance> = listing
        .instances
        .iter()
        .filter(|i| i.uid == req.uid)
        .collect();
    assert_eq!(same.len(), 1, "one instance for one name: {same:?}");
    assert_eq!(same[0].id, id);

    p.delete(&id).await.expect("delete");
    until_gone(b, &id, &req.uid).await;
}

/// The refusal of a create: its error, or, for a create that returns once
/// submitted with its work going on (kvm in the background, gcp's
/// operations), the error of the first get that reports the failure. Until
/// then a get may only show the submitted create itself: Provisioning with
/// the request's UID, never the existing instance as if it were adopted.
async fn refusal(b: &dyn Backend, req: &CreateRequest, what: &str) -> ProviderError {
    let p = b.provider();
    let id = match p.create(req).await {
        Err(e) => return e,
        Ok(id) => id,
    };
    let t = Instant::now();
    loop {
        match p.get(&id).await {
            Err(e) => {
                // Reported as the create's failure, since it is one.
                assert_eq!(e.op(), Op::Create, "{what}: {e}");
                return e;
            }
            Ok(i) => assert!(
                i.uid == req.uid && i.state == InstanceState::Provisioning,
                "{what}: create returned {id} and get shows it adopted: {i:?}"
            ),
        }
        assert!(
            t.elapsed() < b.settle(),
            "{what}: no refusal within {:?}",
            b.settle()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn adoption_refuses_another_owner(b: &dyn Backend) {
    let p = b.provider();
    let inst = installation("adopt");
    let mine = request(b, "adopt", &inst).await;
    let id = p.create(&mine).await.expect("create");

    // Another Proxy's create under the same name.
    let mut other = request(b, "adopt-other", &inst).await;
    other.name = mine.name.clone();
    let e = refusal(b, &other, "a create for another UID").await;
    assert!(e.is(ErrorClass::Permanent), "want Permanent: {e}");
    let text = e.to_string();
    assert!(
        text.contains(&mine.uid) && text.contains(&other.uid),
        "the message names both UIDs: {text}"
    );
    let still = p.get(&id).await.expect("get");
    assert_eq!(still.uid, mine.uid, "the instance is untouched");

    // Instances this provider never made: another owner's, and one with no
    // mark at all (nobody's, so never anyone's to adopt).
    for marked in [true, false] {
        let theirs = request(b, "planted", &inst).await;
        let planted = b.plant(&theirs, marked).await;
        assert_eq!(planted, b.id_of(&theirs.name));
        let mut me = request(b, "planted-me", &inst).await;
        me.name = theirs.name.clone();
        let e = refusal(b, &me, "a create over an instance it did not make").await;
        assert!(
            e.is(ErrorClass::Permanent),
            "marked={marked}: want Permanent: {e}"
        );
        let got = p.get(&planted).await.expect("get the planted instance");
        let want = if marked { theirs.uid.as_str() } else { "" };
        assert_eq!(got.uid, want, "the planted instance is untouched");
        p.delete(&planted)
            .await
            .expect("delete the planted instance");
        until_gone(b, &planted, want).await;
    }

    p.delete(&id).await.expect("delete");
    until_gone(b, &id, &mine.uid).await;
}

/// A surge replacement (issue 32): a Proxy's next instance is created
/// under its serial name while the current one still exists; both carry
/// the Proxy's UID, are listed, and go separately.
async fn instances_of_one_proxy_coexist(b: &dyn Backend) {
    let p = b.provider();
    let current = request(b, "surge", &installation("surge")).await;
    let mut next = current.clone();
    next.name = instance_name(&current.uid, 1);
    let id0 = p
        .create(&current)
        .await
        .expect("create the current instance");
    let id1 = p.create(&next).await.expect("create the surge instance");
    assert_ne!(id0, id1, "two names, two instances");
    assert_eq!(id1, b.id_of(&next.name), "the surge instance's providerID");
    let listing = listing_with(b, &[&id0, &id1]).await;
    let mine: Vec<&str> = listing
        .instances
        .iter()
        .filter(|i| i.uid == current.uid)
        .map(|i| i.id.as_str())
        .collect();
    assert_eq!(mine.len(), 2, "both listed with the Proxy's UID: {mine:?}");
    p.delete(&id0).await.expect("delete the current instance");
    until_gone(b, &id0, &current.uid).await;
    let kept = p.get(&id1).await.expect("the surge instance outlives it");
    assert_eq!(kept.uid, current.uid);
    p.delete(&id1).await.expect("delete the surge instance");
    until_gone(b, &id1, &current.uid).await;
}

async fn get_after_delete_is_not_found(b: &dyn Backend) {
    let p = b.provider();
    let req = request(b, "gone", &installation("gone")).await;
    let id = p.create(&req).await.expect("create");
    p.delete(&id).await.expect("delete");
    until_gone(b, &id, &req.uid).await;
    let e = p.get(&id).await.expect_err("gone stays gone");
    assert!(e.is(ErrorClass::NotFound), "{e}");
    assert_eq!(e.op(), Op::Get);
    let listing = p.list_by_tag().await.expect("list");
    assert!(
        listing.instances.iter().all(|i| i.id != id),
        "a deleted instance is not listed"
    );
}

async fn delete_twice_is_fine(b: &dyn Backend) {
    let p = b.provider();
    let req = request(b, "twice", &installation("twice")).await;
    let id = p.create(&req).await.expect("create");
    p.delete(&id).await.expect("delete");
    p.delete(&id)
        .await
        .expect("delete again, the first still in flight");
    until_gone(b, &id, &req.uid).await;
    p.delete(&id).await.expect("delete what is gone");
    let never = b.id_of(&name_from_uid(&fresh_uid("never")));
    p.delete(&never).await.expect("delete what never existed");
}

async fn list_returns_this_installations_instances(b: &dyn Backend) {
    let p = b.provider();
    let ours = installation("list");
    let mut mine = Vec::new();
    for tag in ["list-a", "list-b"] {
        let req = request(b, tag, &ours).await;
        let id = p.create(&req).await.expect("create");
        mine.push((id, req));
    }
    // Through the backend's own API: another installation's instance and
    // an unmarked one.
    let foreign_req = request(b, "list-foreign", &installation("other")).await;
    let foreign = b.plant(&foreign_req, true).await;
    let by_hand_req = request(b, "list-by-hand", &ours).await;
    let by_hand = b.plant(&by_hand_req, false).await;

    let ids: Vec<&str> = mine.iter().map(|(id, _)| id.as_str()).collect();
    let listing = listing_with(b, &ids).await;
    assert!(
        listing.unread_scopes.is_empty(),
        "{:?}",
        listing.unread_scopes
    );
    let by_id: HashMap<&str, &Instance> = listing
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i))
        .collect();
    assert!(
        !by_id.contains_key(by_hand.as_str()),
        "an unmarked instance is never listed"
    );
    // The trait promises every managed instance, marks read back from the
    // backend; keeping to this installation is GC's decision on them.
    let f = by_id
        .get(foreign.as_str())
        .unwrap_or_else(|| panic!("another installation's managed instance {foreign} is listed"));
    assert_eq!(
        (f.uid.as_str(), f.installation_id.as_str()),
        (
            foreign_req.uid.as_str(),
            foreign_req.installation_id.as_str()
        ),
        "its marks are read back"
    );
    let rules = Rules {
        installation_id: &ours,
        live: &HashSet::new(),
        now: Utc::now(),
        min_age: Duration::ZERO,
        first_seen: &HashMap::new(),
    };
    let this: BTreeSet<&str> = listing
        .instances
        .iter()
        .filter(|i| verdict(i, &rules) != Verdict::OtherInstallation)
        .map(|i| i.id.as_str())
        .collect();
    let want: BTreeSet<&str> = mine.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        this, want,
        "this installation's instances, as GC reads the listing"
    );
    for (id, req) in &mine {
        let i = by_id[id.as_str()];
        assert_eq!(i.uid, req.uid, "{id}: UID read back");
        sane("listed", i);
    }

    for (id, req) in &mine {
        p.delete(id).await.expect("delete");
        until_gone(b, id, &req.uid).await;
    }
    for (id, uid) in [(&foreign, foreign_req.uid.as_str()), (&by_hand, "")] {
        p.delete(id).await.expect("delete a planted instance");
        until_gone(b, id, uid).await;
    }
}

async fn errors_are_classified(b: &dyn Backend) {
    let p = b.provider();
    let name = p.name().to_string();
    let unknown = b.id_of(&name_from_uid(&fresh_uid("unknown")));
    let mut cases = vec![
        ErrorCase::new(
            "get of an instance that does not exist",
            ErrorClass::NotFound,
            Op::Get,
            p.get(&unknown).await,
        ),
        ErrorCase::new(
            "get of a malformed ID",
            ErrorClass::Permanent,
            Op::Get,
            p.get("not-a-provider-id").await,
        ),
    ];
    cases.extend(b.errors().await);
    let mut produced = BTreeSet::new();
    for c in &cases {
        let e = c
            .result
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{}: the call succeeded", c.name));
        assert_eq!(e.class(), c.class, "{}: {e}", c.name);
        assert_eq!(e.op(), c.op, "{}: {e}", c.name);
        assert_eq!(e.provider(), name, "{}: {e}", c.name);
        let text = e.to_string();
        for dump in ["Status {", "Error {", "Some("] {
            assert!(!text.contains(dump), "{}: not plain words: {text}", c.name);
        }
        produced.insert(format!("{:?}", c.class));
    }
    let impossible: BTreeSet<String> = b
        .cannot_produce()
        .into_iter()
        .map(|(class, _why)| format!("{class:?}"))
        .collect();
    assert!(
        produced.is_disjoint(&impossible),
        "classes claimed impossible were produced: {produced:?} {impossible:?}"
    );
    let all: BTreeSet<String> = ErrorClass::ALL.iter().map(|c| format!("{c:?}")).collect();
    let covered: BTreeSet<String> = produced.union(&impossible).cloned().collect();
    assert_eq!(
        covered, all,
        "every class is produced or said to be impossible"
    );
}

// ---------------------------------------------------------------------------
// The backends' tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_provider_conforms() {
    let b = kube_backend::Kube::start().await;
    conform(&b).await;
}

#[cfg(feature = "gcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_provider_conforms() {
    let b = gcp_backend::Gcp::start().await;
    conform(&b).await;
}

#[cfg(feature = "kvm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvm_provider_conforms() {
    // A missing part fails the test inside start, with the reason.
    let mut b = kvm_backend::Kvm::start();
    conform(&b).await;
    // Again with create returning while its work goes on, the path of a
    // slow first image download (one libvirtd per process: the same Env).
    b.background_creates();
    conform(&b).await;
}

#[tokio::test]
async fn fake_provider_conforms() {
    conform(&Fake::new()).await;
}

/// The in-memory fake: its store is its backend.
struct Fake {
    provider: FakeProvider,
}

impl Fake {
    fn new() -> Self {
        // A deleted instance stays visible for a get, as a terminating Pod
        // does, so the contract sees the in-flight delete too.
        Fake {
            provider: FakeProvider::new("fake").with_delete_gets(1),
        }
    }
}

#[async_trait]
impl Backend for Fake {
    fn provider(&self) -> &dyn Provider {
        &self.provider
    }

    async fn request(&self, tag: &str) -> CreateRequest {
        plain_request(tag, "default")
    }

    fn id_of(&self, name: &str) -> String {
        egress_proxies_operator::provider::fake::provider_id(name)
    }

    async fn plant(&self, req: &CreateRequest, marked: bool) -> String {
        let seed = if marked {
            Seed::managed(&req.name, &req.uid, &req.installation_id)
        } else {
            Seed::unmarked(&req.name)
        };
        self.provider.plant(seed)
    }

    async fn errors(&self) -> Vec<ErrorCase> {
        let p = &self.provider;
        let unknown = self.id_of("proxy-unknown");
        let mut cases = Vec::new();
        // The fake's failures of the backend itself are its injected ones.
        p.fail_next(Op::Get, 1, ErrorClass::Transient);
        cases.push(ErrorCase::new(
            "an injected outage",
            ErrorClass::Transient,
            Op::Get,
            p.get(&unknown).await,
        ));
        p.fail_next(Op::Delete, 1, ErrorClass::Unavailable);
        cases.push(ErrorCase::new(
            "injected refused credentials",
            ErrorClass::Unavailable,
            Op::Delete,
            p.delete(&unknown).await,
        ));
        p.fail_next(Op::Create, 1, ErrorClass::QuotaExceeded);
        let req = plain_request("quota", "default");
        cases.push(ErrorCase::new(
            "an injected quota",
            ErrorClass::QuotaExceeded,
            Op::Create,
            p.create(&req).await,
        ));
        cases
    }

    fn cannot_produce(&self) -> Vec<(ErrorClass, &'static str)> {
        // None: a store has no outage or quota of its own, so the fake's
        // injected faults are its real ones.
        Vec::new()
    }

    fn settle(&self) -> Duration {
        Duration::from_secs(2)
    }
}
