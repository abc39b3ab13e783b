//! The gateway's front door under ordinary misfortune and one careless or
//! hostile client (docs/gateway.md, "Failures" and "Signing in"), on the
//! world of e2e_gateway: the real operator with its gateway on the real
//! test cluster, three real Squids as External Proxies, real curl.
//!
//! - A dead site is the site's fault: CONNECTs to a closed port get
//!   Squid's own `503` marked `x-gateway-failure: target`, and no upstream
//!   is passed over for it, so rotation and sessions go on as before.
//! - Failed sign-ins from one address cannot keep another address's
//!   signed-in client out.
//! - A host name that resolves elsewhere after its probe passed (DNS
//!   rebinding) is not followed by the gateway.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use std::process::Command;

use crate::e2e_gateway::{curl_async, echo_targets, Seen, World, TOKEN};
use crate::support::squid;
use crate::support::{self, api_call, eventually, Operator};

/// Whether curl's dump of the headers carries `name: value` (any case).
fn has_header(seen: &Seen, name: &str, value: &str) -> bool {
    let want = format!("{name}: {value}").to_ascii_lowercase();
    seen.headers
        .to_ascii_lowercase()
        .lines()
        .any(|l| l.trim_end().starts_with(&want))
}

/// 45 CONNECTs to a closed port (a third of them on a session, the rest
/// rotating), then 30 rotated requests to a live https site: each of the
/// 45 is Squid's `503` relayed with `x-gateway-failure: target` and its
/// `X-Squid-Error`; all 30 are `200` and leave through all three Squids;
/// the session that met the dead site still leaves through its Squid and
/// was never told it moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_site_is_relayed_as_the_targets_failure_and_takes_no_upstream_out() {
    let w = World::build("gwdead", 1, (&["--gateway-max-connections", "1000"], &[])).await;
    let gw = w.gw;
    let live = format!("https://localhost:{}/", w.https.port());
    // A port nothing listens on: Squid's connect to it is refused.
    let dead = format!("https://127.0.0.1:{}/", support::free_port());
    let session = "default-session-login7";

    let first = curl_async(gw, session, &live).await;
    assert_eq!(first.status, 200, "{first:?}");
    let home = w.upstream_of(&first.body);

    let mut relayed = 0;
    for n in 0..45 {
        let user = if n % 3 == 0 { session } else { "default" };
        let seen = curl_async(gw, user, &dead).await;
        assert_eq!(seen.status, 503, "CONNECT {n} to the dead site: {seen:?}");
        assert!(
            has_header(&seen, "x-gateway-failure", "target"),
            "CONNECT {n}: the crawler is told it is the target's: {seen:?}"
        );
        assert!(
            has_header(&seen, "x-squid-error", "err_connect_fail"),
            "CONNECT {n}: Squid's own answer is relayed: {seen:?}"
        );
        assert!(
            !has_header(&seen, "x-gateway-session-moved", "true"),
            "CONNECT {n}: {seen:?}"
        );
        relayed += 1;
    }

    let mut exits = BTreeSet::new();
    for n in 0..30 {
        let seen = curl_async(gw, "default", &live).await;
        assert_eq!(
            seen.status, 200,
            "live request {n} after the dead site: {seen:?}"
        );
        exits.insert(w.upstream_of(&seen.body));
    }
    let after = curl_async(gw, session, &live).await;
    assert_eq!(after.status, 200, "{after:?}");
    println!(
        "dead site: {relayed} CONNECTs relayed as the target's 503; then 30 of 30 live \
         requests 200 through upstreams {exits:?}; the session stayed on up-{home}"
    );
    assert_eq!(
        exits.len(),
        3,
        "rotation still reaches all three Squids: {exits:?}"
    );
    assert_eq!(
        w.upstream_of(&after.body),
        home,
        "the session keeps its Squid: {after:?}"
    );
    assert!(
        !has_header(&after, "x-gateway-session-moved", "true"),
        "{after:?}"
    );
    drop(w.ground);
}

/// Connections that fail to sign in, from 127.0.0.2.
const FLOOD: usize = 1000;
/// How often each flooding connection asks again once answered or closed.
const FLOOD_PAUSE: Duration = Duration::from_secs(1);

/// What the flood met.
#[derive(Default)]
struct Flood {
    /// `407` answers.
    refused: AtomicU64,
    /// Connections closed before any answer (or not accepted).
    closed: AtomicU64,
}

/// One flooding connection from `from`, asking without credentials
/// every [`FLOOD_PAUSE`] on the same connection while the gateway keeps
/// it open (as a client that holds its connections would), on a new one
/// once it is closed, until `stop`.
async fn flood_one(
    gw: SocketAddr,
    from: IpAddr,
    target: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Flood>,
) {
    let ask = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n");
    while !stop.load(Ordering::Relaxed) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_secs(5), socket.connect(gw)).await
        else {
            seen.closed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(FLOOD_PAUSE).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let answered = async {
                c.write_all(ask.as_bytes()).await.ok()?;
                // The 407 is small: one read takes it whole.
                let mut head = [0u8; 4096];
                let n = c.read(&mut head).await.ok()?;
                (n >= 12 && &head[9..12] == b"407").then_some(())
            };
            let got = tokio::time::timeout(Duration::from_secs(5), answered).await;
            if got.ok().flatten().is_none() {
                seen.closed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(FLOOD_PAUSE).await;
                break;
            }
            seen.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(FLOOD_PAUSE).await;
        }
    }
}

/// 1,000 connections from 127.0.0.2 keep asking without credentials
/// (each again a second after its answer, on the same connection while
/// it stays open: with `407`s kept alive they held every place of the
/// gateway's 1,000 and the client below got no answer); meanwhile a signed-in client
/// on 127.0.0.1 (curl, a new connection each time) gets its page within
/// 1 s, 20 times of 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_sign_ins_from_one_address_leave_a_signed_in_client_served() {
    let w = World::build("gwflood", 1, (&["--gateway-max-connections", "1000"], &[])).await;
    let (gw, http) = (w.gw, format!("http://{}/", w.http));
    // The same client's pages before the flood: the baseline of this run
    // on this machine, whatever its load.
    let mut before = Vec::new();
    for n in 0..10 {
        let started = Instant::now();
        let page = curl_async(gw, "default", &http).await;
        assert_eq!(page.status, 200, "request {n} before the flood: {page:?}");
        before.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Flood::default()));
    let attacker = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(tokio::spawn(flood_one(
            gw,
            attacker,
            w.http.to_string(),
            stop.clone(),
            seen.clone(),
        )));
    }
    // Every flooding connection has asked at least once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut took = Vec::new();
    for n in 0..20 {
        let started = Instant::now();
        let page = curl_async(gw, "default", &http).await;
        let t = started.elapsed();
        assert_eq!(page.status, 200, "request {n} during the flood: {page:?}");
        took.push(t);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        let _ = f.await;
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let worst = took.iter().max().copied().unwrap_or_default();
    let (base, during) = (median(&mut before), median(&mut took));
    println!(
        "sign-in flood from 127.0.0.2: {FLOOD} connections, {} answered 407, {} closed \
         unanswered; the signed-in client on 127.0.0.1: 20 of 20 pages, median {during:?} \
         (before the flood {base:?}), slowest {worst:?}",
        seen.refused.load(Ordering::Relaxed),
        seen.closed.load(Ordering::Relaxed)
    );
    // A starved client waits on every page (its sign-in queued behind
    // the flood's): its median grows by the flood's timeouts, seconds.
    // A loaded machine slows a page or two, not the median twentyfold.
    assert!(
        during <= base * 20,
        "the signed-in client's median page took {during:?} during the flood, {base:?} before: {took:?}"
    );
    assert!(
        seen.refused.load(Ordering::Relaxed) > 0,
        "the flood reached the gateway (else the test proves nothing)"
    );
    drop(w.ground);
}

/// `cmd` run in a mount namespace of its own where `hosts` is mounted
/// over /etc/hosts: its host names are the test's to change (the system
/// resolver reads the file at each lookup), and no other process sees
/// them. Root only, as the test cluster is.
fn with_hosts_file(cmd: &Command, hosts: &std::path::Path) -> Command {
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
        .arg(hosts)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    wrapped
}

/// Writes `hosts` with `name` at `ip`, in place (the same file, so the
/// bind mount sees it).
fn point(hosts: &std::path::Path, name: &str, ip: Ipv4Addr) {
    let base = "127.0.0.1 localhost\n::1 localhost\n";
    std::fs::write(hosts, format!("{base}{ip} {name}\n")).unwrap();
}

/// An External Proxy whose endpoint is a host name (`rebind.test`, a
/// Squid on 127.0.0.7) passes its probe and serves gateway requests;
/// then the name is pointed at 127.0.0.1, where a listener on the same
/// port records every request. The probe follows the name (the recorder
/// sees it, and the Proxy leaves the fleet), but the gateway never
/// dials the new address: none of its requests reach the recorder, each
/// is answered through the Squid the probe passed or refused `503`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_resolves_elsewhere_after_its_probe_passed_is_not_dialled() {
    squid::require();
    let ground = support::ground_without_pods("gwrebind").await;
    let (http, _) = echo_targets().await;
    let port = support::free_port();
    let squid_ip = Ipv4Addr::new(127, 0, 0, 7);
    let _squid = squid::start(squid_ip, port, "gwrebind", "http_access allow me").await;
    // The recorder: where the name points after the rebinding.
    let recorder = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .await
        .unwrap();
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = recorder.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let head = support::read_head(&mut c).await;
                log.lock()
                    .unwrap()
                    .push(head.lines().next().unwrap_or("").to_string());
                let _ = c
                    .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    point(&hosts, "rebind.test", squid_ip);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let spec = serde_json::json!({"mode": "External",
        "endpoint": {"host": "rebind.test", "port": port},
        "healthCheck": {"url": format!("http://{http}/"), "expectedStatus": 200,
            "intervalSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 3, "successThreshold": 1}});
    ground
        .proxies()
        .create(&Default::default(), &support::proxy("rebind", spec))
        .await
        .unwrap();
    let (api, gw) = (support::loopback(), support::loopback());
    let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
    cmd.args(["--gateway-bind-address", &gw.to_string()])
        .args(["--probe-dns-ttl", "1s"])
        .args(["--max-leases-per-proxy", "1"]);
    let _op = Operator::spawn(
        with_hosts_file(&cmd, &hosts),
        &dir.path().join("operator.log"),
    );
    let proxies = ground.proxies();
    eventually("the proxy Ready", Duration::from_secs(90), || async {
        let p = proxies.get("rebind").await.ok()?;
        (support::phase(&p) == Some("Ready")).then_some(())
    })
    .await;
    eventually("the proxy listed", Duration::from_secs(30), || async {
        let (s, v) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
        (s == 200 && v["items"].as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await;
    let before = curl_async(gw, "default", &format!("http://{http}/before")).await;
    assert_eq!(
        before.status, 200,
        "through the Squid the probe passed: {before:?}"
    );

    point(&hosts, "rebind.test", Ipv4Addr::LOCALHOST);
    let mut answers = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let n = answers.len();
        let seen = curl_async(gw, "default", &format!("http://{http}/gw-marker-{n}")).await;
        answers.push(seen.status);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let recorded = seen.lock().unwrap().clone();
    println!(
        "rebinding: gateway answers after it {answers:?}; the address the name moved to saw {recorded:?}"
    );
    assert!(
        !recorded.is_empty(),
        "the probe follows the name to 127.0.0.1 (else the rebinding did not happen)"
    );
    assert!(
        recorded.iter().all(|line| !line.contains("gw-marker")),
        "the gateway dialled the address the name moved to: {recorded:?}"
    );
    assert!(
        answers.iter().all(|s| *s == 200 || *s == 503),
        "each answered through the checked Squid or refused for want of one: {answers:?}"
    );
    drop(ground);
}
