//! System test of configuration without restarts (issue 21): the real
//! operator binary on the real test cluster (control plane only: a
//! kubernetes Proxy's Pod is created, which is all "goes on" needs), its
//! providers file laid out and rewritten as the kubelet does a ConfigMap
//! volume (`..data` symlink swapped atomically).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::path::{Path, PathBuf};
use std::time::Duration;

use egress_proxies_operator::api::Proxy;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::PostParams;
use kube::Api;
use serde_json::json;

use crate::support::leader::scraped;
use crate::support::{self, eventually, Operator};

const OPERATOR_POD: &str = "operator-reload";
const FAILURES: &str = "proxy_operator_config_reload_failures_total";
const LAST_OK: &str = "proxy_operator_config_last_reload_successful";

/// A ConfigMap volume as the kubelet lays it out: the file is a symlink
/// through `..data` into a timestamped directory; an update writes a new
/// directory and renames a new `..data` link over the old one.
struct Volume {
    root: PathBuf,
    version: u32,
}

impl Volume {
    fn new(root: &Path, providers: &str) -> Volume {
        std::fs::create_dir_all(root).unwrap();
        let mut v = Volume {
            root: root.to_path_buf(),
            version: 0,
        };
        v.update(providers);
        std::os::unix::fs::symlink("..data/providers.yaml", root.join("providers.yaml")).unwrap();
        v
    }

    fn update(&mut self, providers: &str) {
        self.version += 1;
        let dir = format!("..2026_12_03_{}", self.version);
        std::fs::create_dir(self.root.join(&dir)).unwrap();
        std::fs::write(self.root.join(&dir).join("providers.yaml"), providers).unwrap();
        let tmp = self.root.join("..data_tmp");
        std::os::unix::fs::symlink(&dir, &tmp).unwrap();
        std::fs::rename(&tmp, self.root.join("..data")).unwrap();
    }

    fn file(&self) -> PathBuf {
        self.root.join("providers.yaml")
    }
}

fn providers(names: &[&str], extra: &str) -> String {
    let mut s = "providers:\n".to_string();
    for n in names {
        s.push_str(&format!("  - name: {n}\n    type: kubernetes\n"));
    }
    s + extra
}

fn on(name: &str, provider: &str) -> Proxy {
    support::proxy(name, json!({"provider": provider, "port": 3128}))
}

async fn get(api: &Api<Proxy>, name: &str) -> Proxy {
    api.get(name).await.unwrap()
}

fn message(p: &Proxy) -> String {
    support::condition(p, "Provisioned")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn provider_id(p: &Proxy) -> Option<String> {
    p.status
        .as_ref()?
        .provider_id
        .clone()
        .filter(|s| !s.is_empty())
}

/// Starts with `k8s-a` only: a Proxy on `k8s-b` waits with "not
/// configured"; the file gains `k8s-b` and the Proxy is created by the same
/// process. A broken rewrite is refused naming the key (log, Warning Event
/// shown by `kubectl get events`, metrics) while `k8s-b` stays usable; a
/// rewrite that removes `k8s-a` reports its Proxy as no longer configured
/// and leaves its Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_configmap_edit_takes_effect_without_a_restart() {
    let ground = support::ground_without_pods("reload").await;
    let dir = tempfile::tempdir().unwrap();
    let mut volume = Volume::new(&dir.path().join("volume"), &providers(&["k8s-a"], ""));
    let port = support::free_port();
    let metrics_at: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cmd = ground.operator(dir.path(), "providers: []\n");
    cmd.arg("--providers-config")
        .arg(volume.file())
        .args(["--providers-config-reload-interval", "1s"])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
        .env("POD_NAME", OPERATOR_POD)
        .env("LOG_LEVEL", "info");
    let log = dir.path().join("operator.log");
    let mut op = Operator::spawn(cmd, &log);
    let pid = op.pid();
    let proxies = ground.proxies();
    let wait = Duration::from_secs(90);

    proxies
        .create(&PostParams::default(), &on("early", "k8s-a"))
        .await
        .unwrap();
    proxies
        .create(&PostParams::default(), &on("late", "k8s-b"))
        .await
        .unwrap();
    eventually("early created on k8s-a", wait, || async {
        provider_id(&get(&proxies, "early").await).map(|_| ())
    })
    .await;
    eventually("late waiting: k8s-b not configured", wait, || async {
        message(&get(&proxies, "late").await)
            .contains("\"k8s-b\" is not configured")
            .then_some(())
    })
    .await;

    // The edit adding k8s-b: the waiting Proxy goes on by itself.
    volume.update(&providers(&["k8s-a", "k8s-b"], ""));
    let id = eventually("late created once k8s-b is configured", wait, || async {
        provider_id(&get(&proxies, "late").await)
    })
    .await;
    println!("late created as {id} without a restart");
    assert!(op.0.try_wait().unwrap().is_none(), "the operator exited");
    assert_eq!(op.pid(), pid);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("providers config reloaded") && l.contains("added: k8s-b")),
        "no reload line naming k8s-b in the log:\n{text}"
    );

    // A broken edit: refused, named, and the last good config stays.
    volume.update(&providers(&["k8s-a", "k8s-b"], "    createsPerMinut: 3\n"));
    let events: Api<Event> = ground.api();
    let note = eventually("the ConfigReloadFailed Event", wait, || {
        support::event_note(&events, OPERATOR_POD, "ConfigReloadFailed")
    })
    .await;
    assert!(
        note.contains("createsPerMinut"),
        "the Event does not name the key: {note}"
    );
    assert!(note.contains("last good config stays"), "{note}");
    let shown = ground.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=ConfigReloadFailed",
    ]);
    assert!(
        shown.contains("Warning") && shown.contains(OPERATOR_POD),
        "{shown}"
    );
    eventually("the refusal in the metrics", wait, || async {
        (scraped(metrics_at, FAILURES).await == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(scraped(metrics_at, LAST_OK).await, Some(0.0));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().any(|l| l.contains("providers config reload refused")
            && l.contains("createsPerMinut")),
        "no refusal line naming the key in the log:\n{text}"
    );
    proxies
        .create(&PostParams::default(), &on("after", "k8s-b"))
        .await
        .unwrap();
    eventually("after created on the last good config", wait, || async {
        provider_id(&get(&proxies, "after").await).map(|_| ())
    })
    .await;

    // Removing k8s-a: its Proxy is reported, its Pod is left.
    volume.update(&providers(&["k8s-b"], ""));
    eventually("early reported as no longer configured", wait, || async {
        message(&get(&proxies, "early").await)
            .contains("\"k8s-a\" is not configured")
            .then_some(())
    })
    .await;
    // A kubernetes instance id is namespace/Pod.
    let early_pod = provider_id(&get(&proxies, "early").await).unwrap();
    let (_, pod_name) = early_pod.rsplit_once('/').unwrap();
    let pods: Api<Pod> = ground.api();
    assert!(
        pods.get_opt(pod_name).await.unwrap().is_some(),
        "the Pod {early_pod} of the removed provider's Proxy was deleted"
    );
    assert_eq!(scraped(metrics_at, LAST_OK).await, Some(1.0));
    assert_eq!(scraped(metrics_at, FAILURES).await, Some(1.0));
    assert!(op.0.try_wait().unwrap().is_none(), "the operator exited");
}
