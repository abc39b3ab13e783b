//! The one Proxy store of the process (issue 19): a single watch fills a
//! kube-runtime reflector that the phase gauge, the discovery API, the
//! fleet view, the health engine and the Proxy controller all read, so
//! every Proxy is held once. Objects are stripped of what no reader uses
//! (`metadata.managedFields` and kubectl's last-applied annotation, often
//! larger than the spec itself) before they are cached.
//!
//! The controller restarts on every provider reload and leadership term,
//! while the watch runs for the life of the process; it is fed by
//! [`ProxyStore::triggers`], which replays the store on start (as the
//! controller's own first list would) and then follows the watch.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::{broadcast, watch};

use crate::api::Proxy;
use crate::proxy_ids::{key_of, split_key, Holder, ProxyIds};

/// The annotation `kubectl apply` writes: a copy of the whole applied
/// object, never read by the operator.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Change notices buffered for a controller that is busy; one that falls
/// further behind is handed the whole store instead (see
/// [`ProxyStore::triggers`]), so nothing is lost, only merged.
const TOUCH_CAPACITY: usize = 1024;

/// Drops the fields no reader of the store uses, before caching.
pub fn strip(p: &mut Proxy) {
    strip_meta(&mut p.metadata);
}

/// Drops `managedFields` and the last-applied annotation from any cached
/// object's metadata (the cloud-init Secret cache uses it too).
pub fn strip_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// What a watch event asks of the readers following the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touch {
    /// This Proxy was created or changed.
    One(ObjectRef<Proxy>),
    /// This Proxy left the store. The controllers need nothing of it (a
    /// Proxy with the operator's finalizer is seen as changed, its
    /// deletion timestamp, before it goes); readers that keep something
    /// per Proxy, such as the health engine, drop it.
    Gone(ObjectRef<Proxy>),
    /// A (re)list finished: every Proxy is looked at again, as a fresh
    /// watch would.
    All,
}

/// The touch a watch event makes, if any. Relisted objects are announced
/// together at the end of the list, once the store holds them.
pub fn touch_of(event: &watcher::Event<Proxy>) -> Option<Touch> {
    match event {
        watcher::Event::Apply(p) => Some(Touch::One(ObjectRef::from_obj(p))),
        watcher::Event::Delete(p) => Some(Touch::Gone(ObjectRef::from_obj(p))),
        watcher::Event::InitDone => Some(Touch::All),
        watcher::Event::Init | watcher::Event::InitApply(_) => None,
    }
}

/// Hands `f` each change `rx` holds now, a lag as [`Touch::All`] (the
/// follower missed changes, so it must look at every Proxy). `false`:
/// the store is gone and nothing more will come.
pub fn drain(rx: &mut broadcast::Receiver<Touch>, mut f: impl FnMut(Touch)) -> bool {
    loop {
        match rx.try_recv() {
            Ok(t) => f(t),
            Err(broadcast::error::TryRecvError::Lagged(_)) => f(Touch::All),
            Err(broadcast::error::TryRecvError::Empty) => return true,
            Err(broadcast::error::TryRecvError::Closed) => return false,
        }
    }
}

/// Tells the store's readers what a watch event did, once the reflector
/// has applied it.
#[derive(Clone)]
struct Announcer {
    touches: broadcast::Sender<Touch>,
    synced: Arc<watch::Sender<bool>>,
    changes: Arc<AtomicU64>,
    ids: ProxyIds,
    reader: Store<Proxy>,
}

impl Announcer {
    fn applied(&self, ev: &watcher::Event<Proxy>) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        self.number(ev);
        if let Some(t) = touch_of(ev) {
            if t == Touch::All {
                self.synced.send_replace(true);
            }
            // No follower (a replica that does not lead) is no error.
            let _ = self.touches.send(t);
        }
    }

    /// Keeps the store's hold on the ids in step with the event: held
    /// from a Proxy's first event, let go at its delete or at a relist
    /// that no longer has it. Done before the event is announced, so a
    /// follower finds the id of every Proxy it is told of.
    fn number(&self, ev: &watcher::Event<Proxy>) {
        let key = |p: &Proxy| {
            key_of(
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default(),
            )
        };
        match ev {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                self.ids.hold(&key(p), Holder::Store);
            }
            watcher::Event::Delete(p) => {
                if let Some(id) = self.ids.get(&key(p)) {
                    self.ids.release(id, Holder::Store);
                }
            }
            watcher::Event::InitDone => {
                for (id, k) in self.ids.held_by(Holder::Store) {
                    let (ns, name) = split_key(&k);
                    if self.reader.get(&ObjectRef::new(name).within(ns)).is_none() {
                        self.ids.release(id, Holder::Store);
                    }
                }
            }
            watcher::Event::Init => {}
        }
    }
}

/// A read handle on the one Proxy store, and the feed of its changes.
#[derive(Clone)]
pub struct ProxyStore {
    reader: Store<Proxy>,
    touches: broadcast::Sender<Touch>,
    /// Set once the first list is in the store, before its `All` is sent.
    /// Not `Store::wait_until_ready`: its one-shot channel keeps only the
    /// last waiter's waker, and the controller waits on it, so any other
    /// waiter could sleep forever.
    synced: Arc<watch::Sender<bool>>,
    /// Counts the watch's events: the store is as it was while this is.
    changes: Arc<AtomicU64>,
    /// The id of every Proxy in the store ([`crate::proxy_ids`]).
    ids: ProxyIds,
}

impl ProxyStore {
    /// Changes seen so far: a reader that built something from the store
    /// need not build it again while this stays the same.
    pub fn version(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The process's Proxy ids: every Proxy in the store has one.
    pub fn ids(&self) -> ProxyIds {
        self.ids.clone()
    }

    /// The cached Proxies (stripped).
    pub fn reader(&self) -> Store<Proxy> {
        self.reader.clone()
    }

    /// Resolves once the first list is in the store (any number of
    /// waiters).
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The store's changes from now on, one [`Touch`] each; a reader that
    /// lags is told so by the channel (then it must look at everything).
    pub fn follow(&self) -> broadcast::Receiver<Touch> {
        self.touches.subscribe()
    }

    /// Every Proxy in the store once (when it has synced), then each Proxy
    /// the watch changes, then every Proxy again after each relist: the
    /// trigger stream a controller would get from its own watch, without
    /// opening one. A follower that lags is handed the whole store.
    pub fn triggers(&self) -> impl Stream<Item = Arc<Proxy>> + Send + 'static {
        // Subscribed before the readiness check: a store not yet synced
        // announces `All` once it is, after this point.
        let rx = self.touches.subscribe();
        let store = self.reader.clone();
        let first = if *self.synced.borrow() {
            store.state()
        } else {
            Vec::new()
        };
        let rest = futures::stream::unfold((rx, store), |(mut rx, store)| async move {
            let batch = match rx.recv().await {
                Ok(Touch::One(r)) => store.get(&r).into_iter().collect(),
                Ok(Touch::Gone(_)) => Vec::new(),
                Ok(Touch::All) | Err(broadcast::error::RecvError::Lagged(_)) => store.state(),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((batch, (rx, store)))
        });
        futures::stream::once(std::future::ready(first))
            .chain(rest)
            .flat_map(futures::stream::iter)
    }
}

/// The Proxy store (all namespaces, or `namespace`) and the future that
/// keeps it filled; run it until shutdown.
pub fn proxy_store(
    client: Client,
    namespace: Option<&str>,
) -> (ProxyStore, impl Future<Output = ()> + Send) {
    let api: Api<Proxy> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (reader, writer) = reflector::store();
    let (store, announcer) = ProxyStore::over(reader);
    let fill = watcher(api, watcher::Config::default())
        .modify(strip)
        .default_backoff()
        .reflect(writer)
        .for_each(move |ev| {
            match ev {
                Ok(ev) => announcer.applied(&ev),
                Err(e) => {
                    tracing::warn!(error = %crate::provider::error::plain_message(&e), "Proxy store watch error");
                }
            }
            std::future::ready(())
        });
    (store, fill)
}

impl ProxyStore {
    /// A store reading `reader`, not yet synced, and what announces the
    /// events applied to it.
    fn over(reader: Store<Proxy>) -> (ProxyStore, Announcer) {
        let (touches, _) = broadcast::channel(TOUCH_CAPACITY);
        let store = ProxyStore {
            reader,
            touches,
            synced: Arc::new(watch::Sender::new(false)),
            changes: Arc::new(AtomicU64::new(0)),
            ids: ProxyIds::new(),
        };
        let announcer = Announcer {
            touches: store.touches.clone(),
            synced: store.synced.clone(),
            changes: store.changes.clone(),
            ids: store.ids.clone(),
            reader: store.reader.clone(),
        };
        (store, announcer)
    }

    /// A store filled by hand with watch events, as the watch fills the
    /// real one (tests of its readers, in this crate and beside it).
    pub fn by_hand() -> (ProxyStore, HandFill) {
        let (reader, writer) = reflector::store();
        let (store, announcer) = ProxyStore::over(reader);
        (store, HandFill { writer, announcer })
    }
}

/// The writing end of [`ProxyStore::by_hand`].
pub struct HandFill {
    writer: reflector::store::Writer<Proxy>,
    announcer: Announcer,
}

impl HandFill {
    /// Applies `ev` to the store, then announces it.
    pub fn apply(&mut self, ev: watcher::Event<Proxy>) {
        self.writer.apply_watcher_event(&ev);
        self.announcer.applied(&ev);
    }

    /// A first list of `proxies`, as a watch's start.
    pub fn list(&mut self, proxies: impl IntoIterator<Item = Proxy>) {
        self.apply(watcher::Event::Init);
        for p in proxies {
            self.apply(watcher::Event::InitApply(p));
        }
        self.apply(watcher::Event::InitDone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProxySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use std::collections::BTreeMap;

    fn proxy(annotations: &[(&str, &str)]) -> Proxy {
        let mut p = Proxy::new("p", ProxySpec::default());
        p.metadata.namespace = Some("ns".into());
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        if !annotations.is_empty() {
            p.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        p
    }

    struct StripCase {
        name: &'static str,
        annotations: &'static [(&'static str, &'static str)],
        kept: Option<&'static [&'static str]>,
    }

    #[test]
    fn strip_drops_managed_fields_and_last_applied_only() {
        let cases = [
            StripCase {
                name: "no annotations",
                annotations: &[],
                kept: None,
            },
            StripCase {
                name: "only last-applied: the map goes",
                annotations: &[(LAST_APPLIED, "{\"spec\":{}}")],
                kept: None,
            },
            StripCase {
                name: "others are kept",
                annotations: &[(LAST_APPLIED, "{}"), ("team", "crawl")],
                kept: Some(&["team"]),
            },
        ];
        for c in cases {
            let mut p = proxy(c.annotations);
            strip(&mut p);
            assert_eq!(p.metadata.managed_fields, None, "{}", c.name);
            let keys: Option<Vec<&str>> = p
                .metadata
                .annotations
                .as_ref()
                .map(|a| a.keys().map(String::as_str).collect());
            assert_eq!(keys.as_deref(), c.kept, "{}", c.name);
        }
    }

    struct TouchCase {
        name: &'static str,
        event: watcher::Event<Proxy>,
        touch: Option<Touch>,
    }

    #[test]
    fn watch_events_touch_one_proxy_or_all_after_a_list_and_a_delete_says_gone() {
        let p = proxy(&[]);
        let one = Some(Touch::One(ObjectRef::new("p").within("ns")));
        let cases = [
            TouchCase {
                name: "apply",
                event: watcher::Event::Apply(p.clone()),
                touch: one,
            },
            TouchCase {
                name: "list start",
                event: watcher::Event::Init,
                touch: None,
            },
            TouchCase {
                name: "listed object (not in the store yet)",
                event: watcher::Event::InitApply(p.clone()),
                touch: None,
            },
            TouchCase {
                name: "list done",
                event: watcher::Event::InitDone,
                touch: Some(Touch::All),
            },
            TouchCase {
                name: "delete",
                event: watcher::Event::Delete(p),
                touch: Some(Touch::Gone(ObjectRef::new("p").within("ns"))),
            },
        ];
        for c in cases {
            assert_eq!(touch_of(&c.event), c.touch, "{}", c.name);
        }
    }

    #[tokio::test]
    async fn triggers_replay_the_synced_store_then_follow_changes() {
        let (reader, mut writer) = reflector::store::<Proxy>();
        let (touches, _) = broadcast::channel(4);
        let mut a = proxy(&[]);
        a.metadata.name = Some("a".into());
        let mut b = proxy(&[]);
        b.metadata.name = Some("b".into());
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(a.clone()),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&ev);
        }
        let store = ProxyStore {
            reader,
            touches: touches.clone(),
            synced: Arc::new(watch::Sender::new(true)),
            changes: Arc::default(),
            ids: ProxyIds::new(),
        };
        let mut triggers = Box::pin(store.triggers());
        let first = triggers.next().await.map(|p| p.metadata.name.clone());
        assert_eq!(first, Some(Some("a".into())));
        let ev = watcher::Event::Apply(b.clone());
        writer.apply_watcher_event(&ev);
        touches.send(touch_of(&ev).unwrap()).unwrap();
        let next = triggers.next().await.map(|p| p.metadata.name.clone());
        assert_eq!(next, Some(Some("b".into())));
        // A follower that lagged gets the whole store.
        for _ in 0..8 {
            let _ = touches.send(Touch::One(ObjectRef::new("gone").within("ns")));
        }
        let mut names: Vec<String> = Vec::new();
        for _ in 0..2 {
            names.extend(triggers.next().await.and_then(|p| p.metadata.name.clone()));
        }
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }

    #[tokio::test]
    async fn triggers_of_a_store_not_yet_synced_wait_for_the_list() {
        let (reader, mut writer) = reflector::store::<Proxy>();
        let (touches, _) = broadcast::channel(4);
        let store = ProxyStore {
            reader,
            touches: touches.clone(),
            synced: Arc::new(watch::Sender::new(false)),
            changes: Arc::default(),
            ids: ProxyIds::new(),
        };
        let mut triggers = Box::pin(store.triggers());
        let early = futures::FutureExt::now_or_never(triggers.next());
        assert!(early.is_none(), "nothing before the first list");
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(proxy(&[])),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&ev);
            if let Some(t) = touch_of(&ev) {
                touches.send(t).unwrap();
            }
        }
        let first = triggers.next().await.and_then(|p| p.metadata.name.clone());
        assert_eq!(first.as_deref(), Some("p"));
    }

    #[test]
    fn the_store_holds_an_id_for_each_proxy_it_has_and_lets_go_of_the_gone() {
        let named = |n: &str| {
            let mut p = proxy(&[]);
            p.metadata.name = Some(n.into());
            p
        };
        let (store, mut fill) = ProxyStore::by_hand();
        let ids = store.ids();
        fill.list([named("a"), named("b")]);
        let a = ids.get("ns/a").expect("a listed Proxy has an id");
        assert!(ids.held(a, Holder::Store));
        fill.apply(watcher::Event::Apply(named("a")));
        assert_eq!(ids.get("ns/a"), Some(a), "an update keeps the id");
        fill.apply(watcher::Event::Delete(named("a")));
        assert_eq!(ids.key(a), None, "a delete frees it");
        // A relist without b (deleted while the watch was down) lets go of
        // b, and c, new, has one.
        let b = ids.get("ns/b").expect("b");
        fill.list([named("c")]);
        assert_eq!(ids.key(b), None);
        assert!(ids.get("ns/c").is_some());
        assert_eq!(ids.len(), 1);
    }
}
