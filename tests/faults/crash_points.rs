//! kill -9 at chosen points: the operator binary aborts (the crash-point
//! hook, `PROXY_OPERATOR_CRASH_AT`) after a create returned and before the
//! status write, between recording a new spec hash and clearing the old
//! instance, and during finalizer release; each time a fresh process takes
//! over. Meanwhile a Proxy whose create crashed is deleted while no
//! operator runs, which leaks its instance (no providerID was written), and
//! two foreign instances are planted: another installation's and an
//! unmarked one. Counted on each provider: duplicate instances of one
//! Proxy (0), instances of ours left after one GC sweep (0), foreign
//! instances deleted (0).

use crate::gcp_standin::{self, StandIn};
#[cfg(feature = "kvm")]
use crate::kvm_support::{virsh, Env};
use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use egress_proxies_operator::api::constants::SPEC_HASH_ANNOTATION;
use egress_proxies_operator::api::Proxy;
use egress_proxies_operator::crashpoint;
#[cfg(feature = "kvm")]
use egress_proxies_operator::provider::{kvm::xml::mark_xml, naming::name_from_uid};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{eventually, Ground, Operator};

/// One instance as the backend itself holds it (not as the operator sees
/// it): its ID and its owner and installation marks.
#[derive(Clone, Debug)]
struct Held {
    id: String,
    uid: String,
    installation: String,
}

/// Where the instances live.
#[allow(clippy::large_enum_variant)] // one per test, never moved about
enum Backend {
    Kubernetes(Api<Pod>),
    Gcp(StandIn),
    /// The harness's sshd and libvirtd, the image's URL, and a prefix
    /// that keeps planted domain names apart from other tests'.
    #[cfg(feature = "kvm")]
    Kvm(Env, String, String),
}

const FOREIGN_INSTALLATION: &str = "someone-else";
/// The owner of the foreign instance: a Proxy UID that exists nowhere.
const FOREIGN_UID: &str = "00000000-0000-0000-0000-00000000f00d";

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Kubernetes(_) => "kubernetes",
            Backend::Gcp(_) => "gcp",
            #[cfg(feature = "kvm")]
            Backend::Kvm(..) => "kvm",
        }
    }

    fn providers(&self) -> String {
        match self {
            Backend::Kubernetes(_) => {
                "providers:\n  - name: kubernetes\n    type: kubernetes\n".into()
            }
            Backend::Gcp(s) => format!(
                "providers:\n  - name: gcp\n    type: gcp\n    gcp:\n      project: my-project\n      networkTag: egress-proxy\n      endpoint: {}\n      anonymous: true\n      allowedPorts: [\"1-65535\"]\n",
                s.url
            ),
            #[cfg(feature = "kvm")]
            Backend::Kvm(env, url, _) => env.providers_yaml("kvm", "h1", "test-image", url),
        }
    }

    fn proxy(&self, name: &str) -> Proxy {
        match self {
            Backend::Kubernetes(_) => support::kube_proxy(name),
            Backend::Gcp(_) => support::proxy(
                name,
                json!({
                    "provider": "gcp",
                    "port": 3128,
                    "placement": {"zone": gcp_standin::ZONE, "machineType": "e2-micro", "image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
                    "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
                }),
            ),
            #[cfg(feature = "kvm")]
            Backend::Kvm(..) => support::proxy(
                name,
                json!({
                    "provider": "kvm", "port": 3128,
                    "placement": {"zone": "h1", "machineType": "small", "image": "test-image"},
                    "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
                }),
            ),
        }
    }

    /// Lets the backend clean up after the test what a Proxy's instance
    /// leaves (libvirt domains outlive the test otherwise).
    fn track(&self, _p: &Proxy) {
        #[cfg(feature = "kvm")]
        if let Backend::Kvm(env, ..) = self {
            env.track(&name_from_uid(&_p.uid().unwrap()));
        }
    }

    /// Every instance the backend holds, marked or not, but not those
    /// being deleted (Pods: those of the test's namespace).
    async fn held(&self) -> Vec<Held> {
        match self {
            Backend::Kubernetes(pods) => pods
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| {
                    let labels = p.labels().clone();
                    let mark = |k: &str| labels.get(k).cloned().unwrap_or_default();
                    Held {
                        id: p.name_any(),
                        uid: mark("proxy-operator-uid"),
                        installation: mark("proxy-operator-installation"),
                    }
                })
                .collect(),
            Backend::Gcp(s) => s
                .held()
                .into_iter()
                .filter(|(_, _, deleting)| !deleting)
                .map(|(id, labels, _)| {
                    let mark = |k: &str| labels[k].as_str().unwrap_or_default().to_string();
                    Held {
                        id,
                        uid: mark("proxy-operator-uid"),
                        installation: mark("proxy-operator-installation"),
                    }
                })
                .collect(),
            #[cfg(feature = "kvm")]
            Backend::Kvm(..) => {
                let (ok, names) = virsh(&["list", "--all", "--name"]);
                assert!(ok, "virsh list: {names}");
                let between = |xml: &str, tag: &str| {
                    let open = format!("<{tag}>");
                    let start = xml.find(&open).map(|i| i + open.len());
                    let end = xml.find(&format!("</{tag}>"));
                    match (start, end) {
                        (Some(s), Some(e)) if s <= e => xml[s..e].to_string(),
                        _ => String::new(),
                    }
                };
                names
                    .lines()
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .filter_map(|n| {
                        // A domain undefined since the list is gone.
                        let (ok, xml) = virsh(&["dumpxml", n]);
                        ok.then(|| Held {
                            id: n.to_string(),
                            uid: between(&xml, "uid"),
                            installation: between(&xml, "installation"),
                        })
                    })
                    .collect()
            }
        }
    }

    /// Plants another installation's instance (owned by a Proxy UID that
    /// exists nowhere, so only its installation mark protects it) and an
    /// unmarked one; returns their IDs.
    async fn plant_foreign(&self) -> Vec<String> {
        let prefix = match self {
            #[cfg(feature = "kvm")]
            Backend::Kvm(_, _, prefix) => prefix.as_str(),
            _ => "",
        };
        let ids = vec![
            format!("{prefix}foreign-installation"),
            format!("{prefix}unmarked"),
        ];
        let marks = json!({
            "proxy-operator-managed": "true",
            "proxy-operator-uid": FOREIGN_UID,
            "proxy-operator-installation": FOREIGN_INSTALLATION,
        });
        match self {
            Backend::Kubernetes(pods) => {
                for (id, labels) in ids.iter().zip([marks, json!({})]) {
                    let pod: Pod = serde_json::from_value(json!({
                        "metadata": {"name": id, "labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "example.com/other"}]},
                    }))
                    .unwrap();
                    pods.create(&PostParams::default(), &pod).await.unwrap();
                }
            }
            Backend::Gcp(s) => {
                for (id, labels) in ids.iter().zip([marks, json!({})]) {
                    s.put(gcp_standin::ZONE, id, labels, "RUNNING");
                }
                // Old enough for any min-age: only the marks protect them.
                for id in &ids {
                    s.set_creation_timestamp(id, "2020-01-01T00:00:00Z");
                }
            }
            #[cfg(feature = "kvm")]
            Backend::Kvm(env, ..) => {
                let old = chrono::DateTime::parse_from_rfc3339("2020-01-01T00:00:00Z")
                    .unwrap()
                    .to_utc();
                let foreign_mark = format!(
                    "<metadata>{}</metadata>",
                    mark_xml(FOREIGN_UID, FOREIGN_INSTALLATION, old)
                );
                for (id, meta) in ids.iter().zip([foreign_mark, String::new()]) {
                    env.track(id);
                    let file = env.dir.path().join(format!("{id}.xml"));
                    std::fs::write(
                        &file,
                        format!("<domain type=\"qemu\"><name>{id}</name>{meta}<memory unit=\"MiB\">64</memory><os><type arch=\"x86_64\">hvm</type></os></domain>"),
                    )
                    .unwrap();
                    let (ok, out) = virsh(&["define", file.to_str().unwrap()]);
                    assert!(ok, "virsh define: {out}");
                }
            }
        }
        ids
    }
}

/// Counts kept across the phases.
#[derive(Default)]
struct Tally {
    /// The most instances one Proxy UID had at any checkpoint.
    most_per_uid: usize,
}

impl Tally {
    /// Records the instances of this installation per owner UID.
    fn check(&mut self, held: &[Held], installation: &str) -> BTreeMap<String, usize> {
        let mut per_uid = BTreeMap::new();
        for h in held.iter().filter(|h| h.installation == installation) {
            *per_uid.entry(h.uid.clone()).or_insert(0) += 1;
        }
        self.most_per_uid = self
            .most_per_uid
            .max(per_uid.values().copied().max().unwrap_or(0));
        per_uid
    }
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// Starts an operator process `name` (log `dir/<name>.log`) with GC off
/// and, when given, a crash point armed.
fn start(ground: &Ground, backend: &Backend, dir: &Path, name: &str, crash: &str) -> Operator {
    let mut cmd = ground.operator(dir, &backend.providers());
    cmd.args(["--gc-interval", "0"]);
    if !crash.is_empty() {
        cmd.env(crashpoint::ENV, crash);
    }
    Operator::spawn(cmd, &dir.join(format!("{name}.log")))
}

/// Waits for the armed process `name` to abort at `point`.
async fn crashed(op: &mut Operator, dir: &Path, name: &str, point: &str) {
    op.aborted_at(&dir.join(format!("{name}.log")), point).await;
}

/// `series` on the `/metrics` of the process `pid` (log `log`): `None`
/// while nothing answers there yet; a panic with its log once the process
/// has ended or its metrics server failed, so a failure says why.
async fn scraped_live(
    (pid, log): &(u32, std::path::PathBuf),
    addr: std::net::SocketAddr,
    series: &str,
) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(") ").and_then(|(_, s)| s.chars().next());
    let text = || std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !matches!(state, None | Some('Z' | 'X')),
        "the operator (pid {pid}) has ended; its log:\n{}",
        text()
    );
    assert!(
        !text().contains("Metrics server failed"),
        "the operator serves no /metrics; its log:\n{}",
        text()
    );
    tokio::net::TcpStream::connect(addr).await.ok()?;
    support::leader::scraped(addr, series).await
}

async fn get(proxies: &Api<Proxy>, name: &str) -> Proxy {
    proxies.get(name).await.unwrap()
}

fn provider_id(p: &Proxy) -> Option<String> {
    p.status.as_ref()?.provider_id.clone()
}

/// Starts process `op` armed at `after-create`, creates Proxy `name`, and
/// waits for the crash; returns the Proxy's UID.
async fn create_and_crash(
    ground: &Ground,
    backend: &Backend,
    dir: &Path,
    op: &str,
    name: &str,
) -> String {
    let mut process = start(ground, backend, dir, op, crashpoint::AFTER_CREATE);
    let created = ground
        .proxies()
        .create(&PostParams::default(), &backend.proxy(name))
        .await
        .unwrap();
    backend.track(&created);
    crashed(&mut process, dir, op, crashpoint::AFTER_CREATE).await;
    created.uid().unwrap()
}

/// Runs the crash phases against `backend`; prints the table row.
async fn crash_at_chosen_points(ground: &Ground, backend: &Backend) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let proxies: Api<Proxy> = ground.proxies();
    let ours = ground.ns.as_str();
    let mut tally = Tally::default();
    let foreign = backend.plant_foreign().await;

    // 1. A create returns; the process dies before the status says so.
    let keep_uid = create_and_crash(ground, backend, dir, "op1", "keep").await;
    let per_uid = tally.check(&backend.held().await, ours);
    assert_eq!(per_uid.get(&keep_uid), Some(&1), "{per_uid:?}");
    assert_eq!(provider_id(&get(&proxies, "keep").await), None);

    // 2. The next process finds the instance instead of making another.
    let op = start(ground, backend, dir, "op2", "");
    let first_id = eventually("keep recorded", Duration::from_secs(90), || async {
        provider_id(&get(&proxies, "keep").await)
    })
    .await;
    drop(op);
    tally.check(&backend.held().await, ours);

    // 3. Another create crashes, and its Proxy is deleted while no
    // operator runs: the next process releases it with nothing recorded,
    // and its instance is left to GC.
    let gone_uid = create_and_crash(ground, backend, dir, "op3", "gone").await;
    proxies
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();

    // 4. A spec change: the new hash is recorded, the old instance is gone,
    // and the process dies before the status forgets it.
    let mut op = start(ground, backend, dir, "op4", crashpoint::AFTER_RECORD_HASH);
    eventually("gone released", Duration::from_secs(90), || async {
        proxies
            .get_opt("gone")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    // Kubernetes' own garbage collector may take the Pod first (its
    // owner reference names the deleted Proxy); elsewhere only GC can.
    let leaked_before = backend
        .held()
        .await
        .iter()
        .filter(|h| h.uid == gone_uid)
        .count();
    if backend.name() != "kubernetes" {
        assert_eq!(leaked_before, 1, "the instance of the released Proxy");
    }
    let hash_before = get(&proxies, "keep").await.annotations()[SPEC_HASH_ANNOTATION].clone();
    proxies
        .patch(
            "keep",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    crashed(&mut op, dir, "op4", crashpoint::AFTER_RECORD_HASH).await;
    drop(op);
    let p = get(&proxies, "keep").await;
    assert_ne!(p.annotations()[SPEC_HASH_ANNOTATION], hash_before);
    assert_eq!(provider_id(&p).as_ref(), Some(&first_id));
    tally.check(&backend.held().await, ours);

    // 5. The next process creates the replacement; then keep is deleted and
    // the process dies after the cleanup, before the finalizer is removed.
    let mut op = start(ground, backend, dir, "op5", crashpoint::BEFORE_RELEASE);
    eventually("keep replaced", Duration::from_secs(90), || async {
        let created = log_of(dir, "op5").contains("Instance created");
        (created && provider_id(&get(&proxies, "keep").await).is_some()).then_some(())
    })
    .await;
    tally.check(&backend.held().await, ours);
    proxies
        .delete("keep", &DeleteParams::default())
        .await
        .unwrap();
    crashed(&mut op, dir, "op5", crashpoint::BEFORE_RELEASE).await;
    drop(op);
    let p = get(&proxies, "keep").await;
    assert!(p.metadata.deletion_timestamp.is_some() && !p.finalizers().is_empty());

    // 6. A last process releases keep, and one GC sweep collects the leak.
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut cmd = ground.operator(dir, &backend.providers());
    // A sweep running past half the min-age deletes nothing ("aborted"):
    // 1 s left a kvm listing over SSH half a second on a loaded machine,
    // and no sweep ever ended ok. The leaked instance is far older than
    // 6 s by now (it was made before phase 4).
    cmd.args([
        "--gc-interval",
        "10s",
        "--gc-min-age",
        "6s",
        "--metrics-bind-address",
        &metrics,
    ]);
    let op = Operator::spawn(cmd, &dir.join("op6.log"));
    let metrics = metrics.parse().unwrap();
    let provider = backend.name();
    let sweeps = format!("proxy_operator_gc_sweeps_total{{provider=\"{provider}\",result=\"ok\"}}");
    let started = Instant::now();
    eventually("keep released", Duration::from_secs(60), || async {
        proxies
            .get_opt("keep")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let released = started.elapsed();
    let op6 = (op.pid(), dir.join("op6.log"));
    eventually("one GC sweep", Duration::from_secs(60), || async {
        let n = scraped_live(&op6, metrics, &sweeps).await?;
        (n >= 1.0).then_some(())
    })
    .await;
    let held = backend.held().await;
    let swept = scraped_live(&op6, metrics, &sweeps).await;
    let gc_deleted = scraped_live(
        &op6,
        metrics,
        &format!("proxy_operator_gc_deleted_total{{provider=\"{provider}\"}}"),
    )
    .await
    .unwrap_or(0.0);
    drop(op);
    assert_eq!(swept, Some(1.0), "checked after exactly one sweep");
    let per_uid = tally.check(&held, ours);
    let leaked: Vec<&Held> = held.iter().filter(|h| h.installation == ours).collect();
    let foreign_deleted = foreign
        .iter()
        .filter(|id| !held.iter().any(|h| &h.id == *id))
        .count();
    assert_eq!(tally.most_per_uid, 1, "duplicate instances of one Proxy");
    assert!(
        leaked.is_empty(),
        "leaked after one sweep: {leaked:?} ({per_uid:?})"
    );
    assert_eq!(foreign_deleted, 0, "foreign instances deleted: {held:?}");
    assert!(
        !held.iter().any(|h| h.uid == gone_uid || h.uid == keep_uid),
        "{held:?}"
    );
    println!(
        "| kill -9 (abort) on {provider}: after-create (twice), after-record-hash, before-release; a Proxy deleted while its create's ID was unrecorded; 2 foreign instances planted | duplicates {}; leaked before GC {leaked_before}, after one GC sweep {} (GC deleted {gc_deleted}); foreign deleted {foreign_deleted}; last Proxy released {released:.1?} after the restart |",
        tally.most_per_uid - 1,
        leaked.len(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kill_at_chosen_points_on_kubernetes_leaves_no_duplicate_leak_or_foreign_loss() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let ground = support::ground_without_pods("crash-kube").await;
    let backend = Backend::Kubernetes(ground.api());
    crash_at_chosen_points(&ground, &backend).await;
}

#[cfg(feature = "gcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kill_at_chosen_points_on_gcp_leaves_no_duplicate_leak_or_foreign_loss() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let ground = support::ground_without_pods("crash-gcp").await;
    let standin = StandIn::start_for(Duration::from_secs(600)).await;
    standin.with(|s| s.running_after_gets = 1);
    let backend = Backend::Gcp(standin);
    crash_at_chosen_points(&ground, &backend).await;
}

#[cfg(feature = "kvm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kill_at_chosen_points_on_kvm_leaves_no_duplicate_leak_or_foreign_loss() {
    let _one_fault = crate::EXCLUSIVE.lock().await;
    let env = Env::start("crash");
    let (url, _) = env.serve_qcow2("base.qcow2", "64M");
    let ground = support::ground_without_pods("crash-kvm").await;
    let prefix = format!("{}-", ground.ns);
    let backend = Backend::Kvm(env, url, prefix);
    crash_at_chosen_points(&ground, &backend).await;
}
