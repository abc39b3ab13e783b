//! Replicas with `--leader-elect` on a test's ground, and what their Lease
//! and logs say (the leader tests and the fault suite share these).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::{eventually, Ground, Operator};

/// The operator's leader election Lease.
pub const LEASE: &str = "egress-proxies-operator.crawl.example.com";
/// The discovery API token of the replicas.
pub const TOKEN: &str = "leader-test-token";

/// A replica named `name` (its identity starts with `name_`) with the
/// given lease duration and renew deadline, a 500 ms retry period, the
/// kubernetes provider, and `extra` flags; its log is `dir/<name>.log`.
pub fn replica(
    ground: &Ground,
    dir: &Path,
    name: &str,
    timing: [&str; 2],
    extra: &[&str],
) -> Operator {
    replica_with_env(ground, dir, name, timing, extra, &[])
}

/// [`replica`], with `env` set (a test hook).
pub fn replica_with_env(
    ground: &Ground,
    dir: &Path,
    name: &str,
    [lease, renew]: [&str; 2],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Operator {
    // The ground's operator keeps its Lease in the test's namespace.
    let mut cmd = ground.operator(
        dir,
        "providers:\n  - name: kubernetes\n    type: kubernetes\n",
    );
    cmd.args([
        "--leader-elect",
        "--leader-election-lease-duration",
        lease,
        "--leader-election-renew-deadline",
        renew,
        "--leader-election-retry-period",
        "500ms",
    ])
    .args(extra)
    .env("DISCOVERY_TOKEN", TOKEN)
    .env("POD_NAME", name)
    .envs(env.iter().copied());
    Operator::spawn(cmd, &dir.join(format!("{name}.log")))
}

/// A replica (4 s lease, 3 s renew deadline) whose discovery API serves
/// on `api` and is advertised there, probing `target` for a 200, with
/// `extra` flags and `env`.
pub fn serving_replica(
    ground: &Ground,
    dir: &Path,
    name: &str,
    (api, target): (std::net::SocketAddr, std::net::SocketAddr),
    extra: &[&str],
    env: &[(&str, &str)],
) -> Operator {
    serving_replica_for(ground, dir, name, (api, target), (extra, env), ["4s", "3s"])
}

/// [`serving_replica`] with its Lease's duration and renew deadline.
pub fn serving_replica_for(
    ground: &Ground,
    dir: &Path,
    name: &str,
    (api, target): (std::net::SocketAddr, std::net::SocketAddr),
    (extra, env): (&[&str], &[(&str, &str)]),
    timing: [&str; 2],
) -> Operator {
    let (bind, advertise, probe) = (
        api.to_string(),
        format!("http://{api}"),
        format!("http://{target}/"),
    );
    let mut args = vec![
        "--discovery-bind-address",
        &bind,
        "--discovery-advertise-url",
        &advertise,
        "--default-probe-url",
        &probe,
        "--default-probe-expected-status",
        "200",
    ];
    args.extend_from_slice(extra);
    replica_with_env(ground, dir, name, timing, &args, env)
}

/// SIGKILLs the leader `leader` (no chance to release the Lease) and waits
/// until a replica named `next` holds it; how long that took.
pub async fn kill_until_held_by(leader: Operator, leases: &Api<Lease>, next: &str) -> Duration {
    let killed = std::time::Instant::now();
    std::process::Command::new("kill")
        .args(["-KILL", &leader.pid().to_string()])
        .status()
        .unwrap();
    drop(leader);
    let prefix = format!("{next}_");
    eventually(
        &format!("{next} to take over"),
        Duration::from_secs(30),
        || async { holder(leases).await.filter(|h| h.starts_with(&prefix)) },
    )
    .await;
    killed.elapsed()
}

/// The Lease's holder.
pub async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt(LEASE).await.ok()??.spec?.holder_identity
}

/// Waits until the replica logging to `log` has started to campaign.
pub async fn campaigning(log: &Path) {
    eventually(
        "the replica to campaign",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(log)
                .ok()?
                .contains("Waiting to become the leader")
                .then_some(())
        },
    )
    .await;
}

/// Waits until the Proxy `name` has a providerID: it was reconciled.
pub async fn reconciled(proxies: &Api<egress_proxies_operator::api::Proxy>, name: &str) {
    eventually(
        &format!("{name} to get a providerID"),
        Duration::from_secs(60),
        || async {
            proxies
                .get(name)
                .await
                .ok()?
                .status?
                .provider_id
                .map(|_| ())
        },
    )
    .await;
}

/// The log line of a replica that became the leader.
pub const BECAME: &str = "Became the leader";
/// The log line of a replica whose leader-only work has stopped.
pub const STOPPED: &str = "Stopped leader-only work";

/// Whether the replica that wrote `log` leads now, by its log.
pub fn leads(log: &str) -> bool {
    log.matches(BECAME).count() > log.matches(STOPPED).count()
}

/// The value of `series` in the `/metrics` scrape of the server on `addr`.
pub async fn scraped(addr: std::net::SocketAddr, series: &str) -> Option<f64> {
    let (status, body) = super::api_call(addr, "GET", "/metrics", None, vec![]).await;
    assert_eq!(status, 200, "{body}");
    super::sample(body.as_str()?, series)
}

/// An External Proxy `name` on the Squid at `port`, Ready, and listed by
/// the leader's discovery API at `leader_api`: its status is written
/// before the leader's own watch brings it back, so a first acquire made
/// at Ready could still meet `no_proxy`.
pub async fn ready_and_listed(
    ground: &super::Ground,
    name: &str,
    port: u16,
    leader_api: std::net::SocketAddr,
) {
    use kube::api::PostParams;
    let proxies = ground.proxies();
    let p = super::proxy(
        name,
        serde_json::json!({"mode": "External", "endpoint": {"host": "127.0.0.1", "port": port}}),
    );
    proxies.create(&PostParams::default(), &p).await.unwrap();
    eventually("the Proxy Ready", Duration::from_secs(60), || async {
        (super::phase(&proxies.get(name).await.ok()?) == Some("Ready")).then_some(())
    })
    .await;
    eventually("the leader to list it", Duration::from_secs(10), || async {
        let (s, v) = super::api_call(leader_api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
        let listed = v["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|p| p["name"] == name));
        (s == 200 && listed).then_some(())
    })
    .await;
}
