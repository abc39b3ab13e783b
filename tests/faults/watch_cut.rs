//! Watches cut: the operator reaches the API server through a TCP relay
//! of the test's, which cuts every open connection (its watches with them)
//! again and again, the last time also refusing new ones for a while, as
//! when the API server restarts. Between the cuts Proxies are created,
//! given a new port and deleted through the admin client (not the relay).
//! Afterwards every one of those transitions has been carried out: each
//! new Proxy has its Pod, each changed Proxy's Pod has the new port, each
//! deleted Proxy and its Pod are gone. No transition is lost.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{eventually, Operator};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Cuts while Proxies change, one second apart.
const CUTS: usize = 4;
/// How long the last cut refuses new connections.
const DOWN_FOR: Duration = Duration::from_secs(10);
const PROXIES: usize = 6;

/// A TCP relay on 127.0.0.1 to `upstream`; lives as long as the test's
/// runtime.
struct Relay {
    addr: SocketAddr,
    /// Bumped to close every open connection.
    cut: watch::Sender<u64>,
    refusing: Arc<AtomicBool>,
    /// Connections accepted (and relayed) so far.
    relayed: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (cut, _) = watch::channel(0u64);
        let refusing = Arc::new(AtomicBool::new(false));
        let relayed = Arc::new(AtomicUsize::new(0));
        let (cuts, refuse, count) = (cut.clone(), refusing.clone(), relayed.clone());
        tokio::spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                if refuse.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                count.fetch_add(1, Ordering::SeqCst);
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay {
            addr,
            cut,
            refusing,
            relayed,
        }
    }

    /// Closes every open connection.
    fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }
}

/// What each Proxy should come to: its port, or gone.
pub type Want = BTreeMap<String, Option<i32>>;

/// The transitions not carried out yet: Proxies whose Pod is missing, has
/// another port, or (deleted) is still there, or whose Proxy lingers.
pub async fn unreconciled(proxies: &Api<Proxy>, pods: &Api<Pod>, want: &Want) -> Vec<String> {
    let live: BTreeMap<String, String> = proxies
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap()))
        .collect();
    let pod_ports: BTreeMap<String, i32> = pods
        .list(&ListParams::default().labels("proxy-operator-managed=true"))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let uid = p.labels().get("proxy-operator-uid")?.clone();
            let port = p.spec.as_ref()?.containers[0].ports.as_ref()?[0].container_port;
            Some((uid, port))
        })
        .collect();
    let mut missing = Vec::new();
    for (name, port) in want {
        let ok = match (port, live.get(name)) {
            (Some(port), Some(uid)) => pod_ports.get(uid) == Some(port),
            (None, None) => true,
            _ => false,
        };
        if !ok {
            missing.push(name.clone());
        }
    }
    // A Pod whose Proxy is gone was not cleaned up.
    let owners: Vec<&String> = live.values().collect();
    missing.extend(
        pod_ports
            .keys()
            .filter(|uid| !owners.contains(uid))
            .map(|uid| format!("pod of {uid}")),
    );
    missing
}

/// Creates kubernetes Proxies `<prefix>0` to `<prefix><n-1>` (port 3128)
/// and adds them to `want`.
pub async fn create_all(proxies: &Api<Proxy>, prefix: &str, n: usize, want: &mut Want) {
    for i in 0..n {
        let name = format!("{prefix}{i}");
        proxies
            .create(&PostParams::default(), &support::kube_proxy(&name))
            .await
            .unwrap();
        want.insert(name, Some(3128));
    }
}

/// Waits (up to 180 s) until every transition in `want` is carried out.
pub async fn carried_out(what: &str, proxies: &Api<Proxy>, pods: &Api<Pod>, want: &Want) {
    eventually(what, Duration::from_secs(180), || async {
        unreconciled(proxies, pods, want)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_watches_cut_lose_no_transition() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let ground = support::ground_without_pods("watch-cut").await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    // The operator's kubeconfig: the admin's, through the relay (the API
    // server's certificate names 127.0.0.1, the relay's address too).
    let admin = std::fs::read_to_string(ground.cluster.kubeconfig()).unwrap();
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("a server line in the admin kubeconfig")
        .to_string();
    let relay = Relay::start(server.parse().unwrap()).await;
    let kubeconfig = dir.join("relayed.kubeconfig");
    std::fs::write(&kubeconfig, admin.replace(&server, &relay.addr.to_string())).unwrap();
    let mut cmd = ground.operator(
        dir,
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
    );
    cmd.env("KUBECONFIG", &kubeconfig);
    let _op = Operator::spawn(cmd, &dir.join("operator.log"));
    let proxies: Api<Proxy> = ground.proxies();
    let pods: Api<Pod> = ground.api();

    let mut want = Want::new();
    create_all(&proxies, "w", PROXIES, &mut want).await;
    carried_out("every Pod made", &proxies, &pods, &want).await;

    // Cut, then change something, CUTS times; the relay keeps relaying
    // new connections in between.
    let mut changes = 0;
    for round in 0..CUTS {
        relay.cut();
        let last = round + 1 == CUTS;
        if last {
            relay.refuse(true);
        }
        let new = format!("n{round}");
        proxies
            .create(&PostParams::default(), &support::kube_proxy(&new))
            .await
            .unwrap();
        want.insert(new, Some(3128));
        let changed = format!("w{round}");
        proxies
            .patch(
                &changed,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"port": 3129}})),
            )
            .await
            .unwrap();
        want.insert(changed, Some(3129));
        changes += 2;
        if round % 2 == 1 {
            let deleted = format!("w{}", PROXIES - 1 - round / 2);
            proxies
                .delete(&deleted, &DeleteParams::default())
                .await
                .unwrap();
            want.insert(deleted, None);
            changes += 1;
        }
        tokio::time::sleep(if last {
            DOWN_FOR
        } else {
            Duration::from_secs(1)
        })
        .await;
    }
    relay.refuse(false);
    let back = Instant::now();
    let relayed_before = relay.relayed.load(Ordering::SeqCst);
    carried_out("every transition carried out", &proxies, &pods, &want).await;
    let recovered = back.elapsed();
    // The operator did reconnect through the relay (it was not idle).
    assert!(relay.relayed.load(Ordering::SeqCst) > relayed_before);
    println!(
        "| the operator's connections to the API server cut {CUTS} times, 1 s apart, the last time refusing new ones for {DOWN_FOR:?}; {changes} changes (creates, port changes, deletes) made meanwhile | lost transitions 0 of {changes}; all carried out {recovered:.1?} after connections were allowed again ({} connections relayed in all) |",
        relay.relayed.load(Ordering::SeqCst)
    );
}
