//! The node agent behaves like a kubelet where the operator's tests rely on
//! it, on the real control plane: an unmapped image stays Pending with a
//! reason naming it; env from the downward API and Secrets, the projected
//! service-account token and the user come from the Pod spec; the memory
//! limit is enforced (OOMKilled); a crashing container restarts; a
//! readiness probe gates Ready; deletion is graceful (SIGTERM, then the
//! object goes).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use test_cluster::{Options, TestCluster};

fn cluster() -> &'static TestCluster {
    static C: OnceLock<TestCluster> = OnceLock::new();
    C.get_or_init(|| {
        TestCluster::start(&Options {
            images: vec!["busybox".into()],
            ..Default::default()
        })
        .expect("the cluster starts")
    })
}

async fn pods(prefix: &str) -> (Api<Pod>, String) {
    let c = cluster();
    let client = c.client().await;
    let ns = c.namespace(&client, prefix).await;
    (Api::namespaced(client, &ns), ns)
}

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(spec).unwrap()
}

async fn wait_for<T>(
    what: &str,
    api: &Api<Pod>,
    name: &str,
    mut f: impl FnMut(&Pod) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(p) = api.get(name).await {
            if let Some(v) = f(&p) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                p.status
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn container(p: &Pod) -> Option<&ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.first()
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

#[tokio::test]
async fn an_unmapped_image_stays_pending_naming_it() {
    let (api, _) = pods("unmapped").await;
    let p = pod(serde_json::json!({"metadata": {"name": "u"},
        "spec": {"containers": [{"name": "c", "image": "registry.example/nope:1", "command": ["/bin/true"]}]}}));
    api.create(&PostParams::default(), &p).await.unwrap();
    // Like the kubelet, the agent reports ContainerCreating before it has
    // looked the image up; the verdict is the reason that follows it.
    let (reason, message) = wait_for("the image verdict", &api, "u", |p| {
        let w = container(p)?.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.clone().filter(|r| r != "ContainerCreating")?;
        Some((reason, w.message.clone().unwrap_or_default()))
    })
    .await;
    assert_eq!(reason, "ErrImageNeverPull");
    assert!(message.contains("registry.example/nope:1"), "{message}");
    assert_eq!(phase(&api.get("u").await.unwrap()), Some("Pending"));
}

#[tokio::test]
async fn env_token_and_user_come_from_the_spec() {
    let (api, ns) = pods("env").await;
    let secrets: Api<Secret> = Api::namespaced(cluster().client().await, &ns);
    let s: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s"}, "stringData": {"k": "from-secret"}}))
    .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let script = "test -s /var/run/secrets/kubernetes.io/serviceaccount/token || exit 7; \
                  test \"$(id -u)\" = 4242 || exit 8; \
                  test \"$FROM_SECRET\" = from-secret || exit 9; \
                  test \"$ME\" = e || exit 10; \
                  test -n \"$KUBERNETES_SERVICE_HOST\" || exit 11";
    let p = pod(serde_json::json!({"metadata": {"name": "e"},
    "spec": {"restartPolicy": "Never",
        "securityContext": {"runAsUser": 4242, "runAsGroup": 4242},
        "containers": [{"name": "c", "image": "busybox", "command": ["/bin/sh", "-c", script],
            "env": [
                {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            ]}]}}));
    api.create(&PostParams::default(), &p).await.unwrap();
    let (ph, code) = wait_for("the container to finish", &api, "e", |p| {
        let t = container(p)?.state.as_ref()?.terminated.as_ref()?;
        Some((phase(p)?.to_string(), t.exit_code))
    })
    .await;
    assert_eq!(
        (ph.as_str(), code),
        ("Succeeded", 0),
        "exit code 7-11 name the check that failed"
    );
}

#[tokio::test]
async fn the_memory_limit_is_enforced() {
    let (api, _) = pods("oom").await;
    // The shell itself grows a string past the limit.
    let p = pod(serde_json::json!({"metadata": {"name": "o"},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox",
                "command": ["/bin/sh", "-c", "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done"],
                "resources": {"limits": {"memory": "32Mi"}}}]}}));
    api.create(&PostParams::default(), &p).await.unwrap();
    let (reason, code) = wait_for("the OOM kill", &api, "o", |p| {
        let t = container(p)?.state.as_ref()?.terminated.as_ref()?;
        Some((t.reason.clone().unwrap_or_default(), t.exit_code))
    })
    .await;
    assert_eq!((reason.as_str(), code), ("OOMKilled", 137));
}

#[tokio::test]
async fn a_crashing_container_restarts() {
    let (api, _) = pods("crash").await;
    let p = pod(serde_json::json!({"metadata": {"name": "c"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["/bin/sh", "-c", "exit 3"]}]}}));
    api.create(&PostParams::default(), &p).await.unwrap();
    let last = wait_for("a restart", &api, "c", |p| {
        let s = container(p)?;
        (s.restart_count >= 1).then(|| s.last_state.clone())?
    })
    .await;
    assert_eq!(last.terminated.map(|t| t.exit_code), Some(3));
}

#[tokio::test]
async fn readiness_gates_ready_and_deletion_is_graceful() {
    let (api, _) = pods("ready").await;
    // Ready once /tmp/ready exists; on SIGTERM it writes a mark and exits.
    let p = pod(serde_json::json!({"metadata": {"name": "r"},
        "spec": {"terminationGracePeriodSeconds": 20,
            "containers": [{"name": "c", "image": "busybox",
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 2; touch /tmp/ready; while :; do sleep 0.2; done"],
                "readinessProbe": {"exec": {"command": ["/bin/test", "-e", "/tmp/ready"]}, "periodSeconds": 1}}]}}));
    api.create(&PostParams::default(), &p).await.unwrap();
    wait_for("Running and not yet Ready", &api, "r", |p| {
        let s = container(p)?;
        (s.state.as_ref()?.running.is_some() && !s.ready).then_some(())
    })
    .await;
    wait_for("Ready", &api, "r", |p| container(p)?.ready.then_some(())).await;
    let started = Instant::now();
    api.delete("r", &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get_opt("r").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the Pod object never went");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It trapped SIGTERM and exited at once: far sooner than the 20 s grace
    // period a SIGKILL would have waited for.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "deletion took {:?}: SIGTERM did not reach the container",
        started.elapsed()
    );
}
