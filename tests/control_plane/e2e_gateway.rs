//! The gateway (docs/gateway.md) inside the real operator on the real test
//! cluster. Its upstreams are three External Proxies, each a real Squid on
//! 127.0.0.1 that asks for credentials of its own and leaves from an
//! address of its own (`tcp_outgoing_address 127.0.0.1N`); the targets, a
//! plain-http and an https one, answer with the address a request came
//! from, so each answer tells which upstream carried it. Real curl is the
//! crawler, one process (one connection) per request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is its failure report

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::support::squid::{self, Squid};
use crate::support::{self, api_call, eventually, phase, Ground, Operator};

pub(crate) const TOKEN: &str = "gateway-token-of-the-tests";

/// Upstream `i`'s outgoing address.
pub(crate) fn exit_of(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 11 + i as u8)
}

/// What curl saw.
#[derive(Debug)]
pub(crate) struct Seen {
    /// The target's (or the gateway's) status; for a refused CONNECT, the
    /// CONNECT's.
    pub(crate) status: u16,
    pub(crate) body: String,
    pub(crate) headers: String,
}

/// `url` fetched by curl through the gateway at `gw`, signed in as
/// `user` (with the test's token unless `token` says otherwise).
pub(crate) fn curl(gw: SocketAddr, user: Option<(&str, &str)>, url: &str) -> Seen {
    let dir = tempfile::tempdir().unwrap();
    let (head, body) = (dir.path().join("head"), dir.path().join("body"));
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-k",
        "--max-time",
        "20",
        "-w",
        "%{http_code} %{http_connect}",
    ])
    .args(["-x", &format!("http://{gw}")])
    .arg("-D")
    .arg(&head)
    .arg("-o")
    .arg(&body)
    .arg(url);
    if let Some((user, token)) = user {
        cmd.args(["-U", &format!("{user}:{token}")]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("curl is required (apt-get install curl): {e}"));
    let codes = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut codes = codes
        .split_whitespace()
        .map(|c| c.parse::<u16>().unwrap_or(0));
    let (status, connect) = (codes.next().unwrap_or(0), codes.next().unwrap_or(0));
    Seen {
        status: if status == 0 { connect } else { status },
        body: std::fs::read_to_string(&body).unwrap_or_default(),
        headers: std::fs::read_to_string(&head).unwrap_or_default(),
    }
}

pub(crate) async fn curl_async(gw: SocketAddr, user: &str, url: &str) -> Seen {
    let (user, url) = (user.to_string(), url.to_string());
    tokio::task::spawn_blocking(move || curl(gw, Some((&user, TOKEN)), &url))
        .await
        .unwrap()
}

/// Targets that answer with the address of their client: plain http, and
/// https with a self-signed certificate (on `/slow`, after 3 s).
pub(crate) async fn echo_targets() -> (SocketAddr, SocketAddr) {
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addrs = (plain.local_addr().unwrap(), tls.local_addr().unwrap());
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key.into())
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    tokio::spawn(async move {
        while let Ok((mut c, peer)) = plain.accept().await {
            tokio::spawn(async move {
                support::read_head(&mut c).await;
                let _ = c.write_all(echo(peer).as_bytes()).await;
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((c, peer)) = tls.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut c) = acceptor.accept(c).await else {
                    return;
                };
                // `/slow` answers after 3 s: a request in flight.
                if support::read_head(&mut c).await.starts_with("GET /slow") {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                let _ = c.write_all(echo(peer).as_bytes()).await;
                let _ = c.shutdown().await;
            });
        }
    });
    addrs
}

fn echo(peer: SocketAddr) -> String {
    let ip = peer.ip().to_string();
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{ip}",
        ip.len()
    )
}

/// A Squid that asks for `user`:`password` and leaves from `exit`.
async fn upstream(tag: &str, exit: Ipv4Addr, user: &str, password: &str) -> Squid {
    let creds = egress_proxies_operator::credentials::Credentials::new(user, password);
    let line = creds.htpasswd().unwrap();
    let file = tempfile::Builder::new()
        .prefix("gateway-htpasswd-")
        .tempfile()
        .unwrap()
        .into_temp_path()
        .keep()
        .unwrap();
    std::fs::write(&file, format!("{line}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let access = format!(
        "auth_param basic program /usr/lib/squid/basic_ncsa_auth {}\n\
         auth_param basic realm upstream\n\
         acl authed proxy_auth REQUIRED\n\
         http_access allow authed\n\
         tcp_outgoing_address {exit}",
        file.display()
    );
    squid::start(Ipv4Addr::LOCALHOST, support::free_port(), tag, &access).await
}

/// The upstream a session report's answer names (`ns/up-N`: N).
fn reported_upstream(v: &serde_json::Value) -> usize {
    let proxy = v["proxy"].as_str().unwrap();
    proxy.rsplit("/up-").next().unwrap().parse().unwrap()
}

/// `egress-proxies-operator gateway` named `name` (its `POD_NAME`), as
/// the gateway Deployment runs it, confined to the test's namespace:
/// discovery API on `api`, the gateway on `gw`, the leader's lease flags.
fn gateway_process(
    ground: &Ground,
    dir: &std::path::Path,
    name: &str,
    (api, gw): (SocketAddr, SocketAddr),
) -> Operator {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_egress-proxies-operator"));
    cmd.arg("gateway")
        .args(["--health-probe-bind-address", "0", "--metrics-secure=false"])
        .args(["--probe-deny-cidrs", &support::deny_but_loopback()])
        .args(["--discovery-bind-address", &api.to_string()])
        .args(["--gateway-bind-address", &gw.to_string()])
        .args([
            "--proxy-namespace",
            &ground.ns,
            "--operator-namespace",
            &ground.ns,
        ])
        .args(["--leader-election-lease-duration", "4s"])
        .args(["--leader-election-renew-deadline", "3s"])
        .args(["--leader-election-retry-period", "500ms"])
        .args(["--max-leases-per-proxy", "1"])
        .env("KUBECONFIG", ground.cluster.kubeconfig())
        .env("DISCOVERY_TOKEN", TOKEN)
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", &ground.ns)
        .env("TMPDIR", dir)
        .env_remove("KUBERNETES_SERVICE_HOST");
    Operator::spawn(cmd, &dir.join(format!("{name}.log")))
}

/// The operator with its gateway, three upstream Proxies Ready.
pub(crate) struct World {
    pub(crate) ground: Ground,
    api: SocketAddr,
    pub(crate) gw: SocketAddr,
    pub(crate) http: SocketAddr,
    pub(crate) https: SocketAddr,
    squids: Vec<Option<Squid>>,
    /// Every replica's gateway (the first is `gw`).
    gws: Vec<SocketAddr>,
    /// The discovery API of each gateway process (none in-process).
    gw_apis: Vec<SocketAddr>,
    _ops: Vec<Operator>,
    _dir: tempfile::TempDir,
}

impl World {
    async fn new(prefix: &str) -> World {
        World::with_replicas(prefix, 1).await
    }

    async fn with_replicas(prefix: &str, replicas: usize) -> World {
        World::build(prefix, replicas, (&[], &[])).await
    }

    /// With one replica: the operator with its gateway inside. With more:
    /// an operator replica that leads (`--leader-elect`, no gateway) and
    /// `replicas` gateway processes (`egress-proxies-operator gateway`, as
    /// the gateway Deployment runs them), each with its discovery API.
    /// The in-process operator also gets `extra` flags and env.
    pub(crate) async fn build(
        prefix: &str,
        replicas: usize,
        extra: (&[&str], &[(&str, &str)]),
    ) -> World {
        squid::require();
        let ground = support::ground_without_pods(prefix).await;
        let (http, https) = echo_targets().await;
        let secrets: Api<Secret> = Api::namespaced(ground.client.clone(), &ground.ns);
        let proxies = ground.proxies();
        let mut squids = Vec::new();
        for i in 0..3 {
            let (user, password) = (format!("up{i}"), format!("pass-of-up{i}"));
            let sq = upstream(&format!("{prefix}{i}"), exit_of(i), &user, &password).await;
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": format!("up-{i}"),
                    "labels": {"crawl.example.com/proxy-credentials": "true"}},
                "stringData": {"username": user, "password": password},
            }))
            .unwrap();
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .unwrap();
            let spec = json!({"mode": "External",
                "endpoint": {"host": "127.0.0.1", "port": sq.port},
                "auth": {"secretRef": {"name": format!("up-{i}")}}});
            proxies
                .create(
                    &PostParams::default(),
                    &support::proxy(&format!("up-{i}"), spec),
                )
                .await
                .unwrap();
            squids.push(Some(sq));
        }
        let dir = tempfile::tempdir().unwrap();
        let (mut apis, mut gws, mut ops) = (Vec::new(), Vec::new(), Vec::new());
        // The operator's discovery API (where crawlers lease).
        let api = support::loopback();
        if replicas == 1 {
            let gw = support::loopback();
            let mut cmd = ground.discovery_operator(dir.path(), "providers: []\n", api, TOKEN);
            cmd.args(["--default-probe-url", &format!("http://{http}/")])
                .args(["--default-probe-expected-status", "200"])
                .args(["--max-leases-per-proxy", "1"])
                .args(["--gateway-bind-address", &gw.to_string()])
                .args(extra.0)
                .envs(extra.1.iter().copied());
            ops.push(Operator::spawn(cmd, &dir.path().join("operator.log")));
            gws.push(gw);
        } else {
            ops.push(crate::support::leader::serving_replica(
                &ground,
                dir.path(),
                "op0",
                (api, http),
                &["--max-leases-per-proxy", "1"],
                &[("DISCOVERY_TOKEN", TOKEN)],
            ));
            let leases = Api::namespaced(ground.client.clone(), &ground.ns);
            eventually("the operator to lead", Duration::from_secs(30), || async {
                crate::support::leader::holder(&leases)
                    .await
                    .filter(|h| h.starts_with("op0_"))
            })
            .await;
            for r in 0..replicas {
                let (gw_api, gw) = (support::loopback(), support::loopback());
                let name = format!("gw{r}");
                ops.push(gateway_process(&ground, dir.path(), &name, (gw_api, gw)));
                apis.push(gw_api);
                gws.push(gw);
            }
        }
        let gw_apis = apis.clone();
        apis.insert(0, api);
        let gw = gws[0];
        eventually("three upstreams Ready", Duration::from_secs(90), || async {
            let list = proxies.list(&Default::default()).await.ok()?;
            (list
                .items
                .iter()
                .filter(|p| phase(p) == Some("Ready"))
                .count()
                == 3)
                .then_some(())
        })
        .await;
        // Ready in status is listed by each API within its cache's lag.
        for api in apis {
            eventually(
                "three upstreams listed",
                Duration::from_secs(30),
                || async {
                    let (s, v) = api_call(api, "GET", "/v1/proxies", Some(TOKEN), vec![]).await;
                    (s == 200 && v["items"].as_array().map(Vec::len) == Some(3)).then_some(())
                },
            )
            .await;
        }
        World {
            ground,
            api,
            gw,
            http,
            https,
            squids,
            gws,
            gw_apis,
            _ops: ops,
            _dir: dir,
        }
    }

    /// A lease from the operator's API for two minutes: its id, and the
    /// upstream it holds.
    async fn lease(&self) -> (String, usize) {
        let (s, lease) = api_call(
            self.api,
            "POST",
            "/v1/leases",
            Some(TOKEN),
            br#"{"ttlSeconds": 120}"#.to_vec(),
        )
        .await;
        assert_eq!(s, 201, "{lease}");
        let name = lease["proxy"]["name"].as_str().unwrap();
        let id = lease["id"].as_str().unwrap().to_string();
        (id, name["up-".len()..].parse().unwrap())
    }

    async fn release(&self, id: &str) {
        let path = format!("/v1/leases/{id}");
        let (s, _) = api_call(self.api, "DELETE", &path, Some(TOKEN), vec![]).await;
        assert_eq!(s, 204);
    }

    /// `url` fetched as `user` through the first two gateways, both `200`
    /// from the same upstream: its exit address.
    async fn on_both_gateways(&self, user: &str, url: &str) -> String {
        let a = curl_async(self.gws[0], user, url).await;
        let b = curl_async(self.gws[1], user, url).await;
        assert_eq!((a.status, b.status), (200, 200), "{a:?} {b:?}");
        assert_eq!(a.body, b.body, "{user}: the gateways disagree");
        a.body
    }

    /// The upstream whose exit address is `ip`.
    pub(crate) fn upstream_of(&self, ip: &str) -> usize {
        (0..3)
            .find(|&i| exit_of(i).to_string() == ip)
            .unwrap_or_else(|| panic!("{ip:?} is no upstream's exit address"))
    }
}

/// curl through the gateway with the client's token reaches plain-http
/// and https targets (the https one through a CONNECT tunnel) from one of
/// the upstreams' addresses; without credentials, with a wrong token, or
/// with a username the grammar refuses, the answer is a 407 that says
/// why; a username whose filters match no proxy gets a 503 saying so.
/// Traced at a sample ratio of 1, each request is a `gateway.request`
/// span naming its client, session and upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_http_and_https_targets_through_the_gateway_with_a_token_only() {
    const SERVICE: &str = "epo-gateway-curl";
    let otel = support::otel_to_jaeger("http/protobuf", SERVICE);
    let env: Vec<(&str, &str)> = otel.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let w = World::build("gwcurl", 1, (&["--gateway-trace-sample-ratio", "1"], &env)).await;
    let gw = w.gw;
    let (http, https) = (
        format!("http://{}/", w.http),
        format!("https://localhost:{}/", w.https.port()),
    );
    for url in [&http, &https] {
        let seen = curl_async(gw, "default", url).await;
        assert_eq!(seen.status, 200, "{url}: {seen:?}");
        w.upstream_of(&seen.body);
        assert!(
            !seen
                .headers
                .to_ascii_lowercase()
                .contains("proxy-authenticate"),
            "{seen:?}"
        );
    }
    let http2 = http.clone();
    let anonymous = tokio::task::spawn_blocking(move || curl(gw, None, &http2))
        .await
        .unwrap();
    assert_eq!(anonymous.status, 407, "{anonymous:?}");
    assert!(
        anonymous.body.contains("proxy credentials required"),
        "{anonymous:?}"
    );
    assert!(
        anonymous.headers.contains("Basic realm="),
        "a 407 names its scheme: {anonymous:?}"
    );
    let https2 = https.clone();
    let anonymous_tls = tokio::task::spawn_blocking(move || curl(gw, None, &https2))
        .await
        .unwrap();
    assert_eq!(
        anonymous_tls.status, 407,
        "the CONNECT refused: {anonymous_tls:?}"
    );
    let http3 = http.clone();
    let wrong =
        tokio::task::spawn_blocking(move || curl(gw, Some(("default", "not-the-token")), &http3))
            .await
            .unwrap();
    assert_eq!(wrong.status, 407, "{wrong:?}");
    assert!(wrong.body.contains("not a discovery token"), "{wrong:?}");
    for (user, reason) in [
        ("default-sesion-a1", "unknown parameter \"sesion\""),
        ("default-session-a_1", "letters and digits"),
        ("someone-else", "must be the client name \"default\""),
    ] {
        let seen = curl_async(gw, user, &http).await;
        assert_eq!(seen.status, 407, "{user}: {seen:?}");
        assert!(seen.body.contains(reason), "{user}: {seen:?}");
    }
    let none = curl_async(gw, "default-pool-nowhere", &http).await;
    assert_eq!(none.status, 503, "{none:?}");
    assert!(
        none.body
            .contains("no healthy proxy matches pool \"nowhere\""),
        "{none:?}"
    );
    assert!(
        none.headers.to_ascii_lowercase().contains("retry-after: 5"),
        "{none:?}"
    );
    // The upstreams' credentials never reach the crawler.
    for seen in [&anonymous, &wrong, &none] {
        assert!(!seen.body.contains("pass-of-up") && !seen.headers.contains("pass-of-up"));
    }
    // Found in Jaeger by service and operation: a trace of its own for
    // each served request, its root span naming the client, the method,
    // the session and the upstream.
    let served = |t: &support::Trace| {
        t.named("gateway.request")
            .any(|s| s.tags.contains_key("upstream"))
    };
    let found = support::jaeger()
        .wait_find(SERVICE, "gateway.request", Duration::from_secs(30), |f| {
            f.iter().filter(|t| served(t)).count() >= 2
        })
        .await;
    for s in found.iter().flat_map(|t| t.named("gateway.request")) {
        if !s.tags.contains_key("upstream") {
            continue;
        }
        assert_eq!(s.service, SERVICE, "{s:?}");
        assert_eq!(s.tag("client").as_deref(), Some("default"), "{s:?}");
        for key in ["method", "session"] {
            assert!(s.tags.contains_key(key), "{key} on {s:?}");
        }
    }
    drop(w.ground);
}

/// 30 connections of one session all leave from one upstream (plain
/// http and https alike); 30 without a session leave from all three; a
/// proxy under an exclusive lease carries none of them; once the
/// session's upstream Squid is killed, the session goes on through
/// another upstream with no failed request, the first answer after the
/// move saying the session moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_rotation_spreads_leases_exclude_and_a_dead_upstream_moves_its_sessions() {
    let mut w = World::new("gwsess").await;
    let (gw, http) = (w.gw, format!("http://{}/", w.http));
    let https = format!("https://localhost:{}/", w.https.port());
    let mut exits = BTreeSet::new();
    for n in 0..30 {
        let url = if n % 2 == 0 { &http } else { &https };
        let seen = curl_async(gw, "default-session-s81", url).await;
        assert_eq!(seen.status, 200, "{url}: {seen:?}");
        exits.insert(seen.body);
    }
    assert_eq!(exits.len(), 1, "one session, one upstream: {exits:?}");
    let session_exit = exits.into_iter().next().unwrap();

    let mut rotated = BTreeSet::new();
    for _ in 0..30 {
        let seen = curl_async(gw, "default", &http).await;
        assert_eq!(seen.status, 200, "{seen:?}");
        rotated.insert(seen.body);
    }
    assert_eq!(
        rotated.len(),
        3,
        "rotation reaches every upstream: {rotated:?}"
    );

    // An exclusive lease takes one proxy out of the gateway's rotation.
    let (lease, leased) = w.lease().await;
    let mut while_leased = BTreeSet::new();
    for _ in 0..30 {
        let seen = curl_async(gw, "default", &http).await;
        assert_eq!(seen.status, 200, "{seen:?}");
        while_leased.insert(w.upstream_of(&seen.body));
    }
    assert!(
        !while_leased.contains(&leased),
        "up-{leased} is leased exclusively, yet the gateway used it: {while_leased:?}"
    );
    assert_eq!(while_leased.len(), 2, "{while_leased:?}");
    w.release(&lease).await;

    // The session's upstream dies: nothing fails, the session moves once.
    let dead = w.upstream_of(&session_exit);
    drop(w.squids[dead].take());
    let mut after = Vec::new();
    for n in 0..10 {
        let url = if n % 2 == 0 { &http } else { &https };
        let seen = curl_async(gw, "default-session-s81", url).await;
        assert_eq!(seen.status, 200, "request {n} after the kill: {seen:?}");
        after.push(seen);
    }
    let moved_to: BTreeSet<&str> = after.iter().map(|s| s.body.as_str()).collect();
    assert_eq!(
        moved_to.len(),
        1,
        "the session moved to one upstream: {moved_to:?}"
    );
    assert!(!moved_to.contains(session_exit.as_str()), "{moved_to:?}");
    assert!(
        after[0]
            .headers
            .to_ascii_lowercase()
            .contains("x-gateway-session-moved: true"),
        "the first answer after the move says so: {:?}",
        after[0]
    );
    assert!(
        !after[1]
            .headers
            .to_ascii_lowercase()
            .contains("x-gateway-session-moved"),
        "only the first: {:?}",
        after[1]
    );
    drop(w.ground);
}

/// Two gateway processes (`egress-proxies-operator gateway`, as the
/// gateway Deployment runs them) next to the operator that leads. They
/// share no state beyond what they watch: every one of 20 sessions
/// leaves from the same upstream through either (asked in turn, a new
/// connection each), and the sessions spread over more than one upstream.
/// A lease granted by the operator keeps its proxy out of both (each
/// copies the leader's lease table), and they never take or join the
/// leadership: the Lease stays the operator's and no grant waits for them.
/// A session report sent to the gateway that did not carry the session
/// finds it from its username; a reported session moves alike on both
/// gateways and stays moved after the next copies of the table (the
/// cooldown is the leader's). With the operator killed they go on serving
/// every session from the same upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_agree_follow_the_leaders_leases_and_outlive_it() {
    let mut w = World::with_replicas("gwtwo", 2).await;
    let http = format!("http://{}/", w.http);
    let https = format!("https://localhost:{}/", w.https.port());
    let mut exits = Vec::new();
    for n in 0..20 {
        let user = format!("default-session-agree{n}");
        let (url_a, url_b) = if n % 2 == 0 {
            (&http, &https)
        } else {
            (&https, &http)
        };
        let a = curl_async(w.gws[0], &user, url_a).await;
        let b = curl_async(w.gws[1], &user, url_b).await;
        assert_eq!((a.status, b.status), (200, 200), "{a:?} {b:?}");
        assert_eq!(a.body, b.body, "session {n}: the gateways disagree");
        exits.push(a.body);
    }
    let spread: BTreeSet<&String> = exits.iter().collect();
    assert!(spread.len() >= 2, "20 sessions, one upstream: {spread:?}");

    // A lease from the operator's API: neither gateway uses its proxy.
    let (lease, leased) = w.lease().await;
    // A copy follows a change of the table within one long poll's answer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (g, gw) in w.gws.iter().enumerate() {
        let mut used = BTreeSet::new();
        for _ in 0..20 {
            let seen = curl_async(*gw, "default", &http).await;
            assert_eq!(seen.status, 200, "gateway {g}: {seen:?}");
            used.insert(w.upstream_of(&seen.body));
        }
        assert!(
            !used.contains(&leased),
            "up-{leased} is leased exclusively by the operator, yet gateway {g} used it: {used:?}"
        );
    }

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(w.ground.client.clone(), &w.ground.ns);
    let lease_obj = leases.get(crate::support::leader::LEASE).await.unwrap();
    let holder = lease_obj
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone());
    assert!(
        holder.as_deref().is_some_and(|h| h.starts_with("op0_")),
        "the operator leads: {holder:?}"
    );
    let synced = lease_obj
        .metadata
        .annotations
        .unwrap_or_default()
        .get("crawl.example.com/lease-synced-replicas")
        .cloned()
        .unwrap_or_default();
    // `<feed> <id>,<id>…`: the feed's random nonce may hold any letters.
    let waited: Vec<&str> = synced
        .split_once(' ')
        .map_or("", |(_, ids)| ids)
        .split(',')
        .filter(|id| !id.is_empty())
        .collect();
    assert!(
        waited.iter().all(|id| !id.starts_with("gw")),
        "grants never wait for a gateway: {synced}"
    );

    // A report may reach a gateway that never carried the session (a
    // Service spreads connections): with the session's username it finds
    // the session's upstream; the site's cooldown then moves the session
    // on both gateways.
    let lonely = curl_async(w.gws[1], "default-session-lonely", &https).await;
    assert_eq!(lonely.status, 200, "{lonely:?}");
    let report = |body: &'static [u8]| {
        api_call(
            w.gw_apis[0],
            "POST",
            "/v1/sessions/lonely/report",
            Some(TOKEN),
            body.to_vec(),
        )
    };
    let (s, v) = report(br#"{"result": "blocked", "site": "localhost"}"#).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("session_not_found")),
        "{v}"
    );
    let (s, v) = report(
        br#"{"result": "blocked", "site": "localhost", "username": "default-session-lonely"}"#,
    )
    .await;
    assert_eq!((s, &v["moved"]), (200, &json!(true)), "{v}");
    let banned = reported_upstream(&v);
    assert_eq!(
        banned,
        w.upstream_of(&lonely.body),
        "the session's upstream: {v}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let exit = w.on_both_gateways("default-session-lonely", &https).await;
    assert_ne!(
        w.upstream_of(&exit),
        banned,
        "the session did not leave the banned upstream"
    );

    // A session reported blocked to one gateway moves on both, and stays
    // moved after the table changed again (the leader holds the cooldown).
    let (s, v) = api_call(
        w.gw_apis[0],
        "POST",
        "/v1/sessions/agree19/report",
        Some(TOKEN),
        br#"{"result": "blocked"}"#.to_vec(),
    )
    .await;
    assert_eq!((s, &v["moved"]), (200, &json!(true)), "{v}");
    let cooled = reported_upstream(&v);
    assert_eq!(
        cooled,
        w.upstream_of(&exits[19]),
        "the report names the session's upstream: {v}"
    );
    w.release(&lease).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let exit = w.on_both_gateways("default-session-agree19", &http).await;
    assert_ne!(
        w.upstream_of(&exit),
        cooled,
        "the reported session did not move"
    );

    // A lease held when the operator dies: the gateways' copies withhold
    // its proxy while they are fresh.
    let (_held, x) = w.lease().await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The operator dies; the gateways serve on from the Proxies they watch,
    // each session on its upstream (those on the cooled one, and on the
    // one leased, have moved).
    let op = w._ops.remove(0);
    Command::new("kill")
        .args(["-KILL", &op.pid().to_string()])
        .status()
        .unwrap();
    drop(op);
    let kept = exits
        .iter()
        .enumerate()
        .filter(|(_, e)| w.upstream_of(e) != cooled && w.upstream_of(e) != x);
    for (n, exit) in kept {
        let user = format!("default-session-agree{n}");
        for (g, gw) in w.gws.iter().enumerate() {
            let seen = curl_async(*gw, &user, &http).await;
            assert_eq!(seen.status, 200, "gateway {g}, session {n}: {seen:?}");
            assert_eq!(&seen.body, exit, "gateway {g}, session {n} moved");
        }
    }
    for g in 0..2 {
        let log = std::fs::read_to_string(w._dir.path().join(format!("gw{g}.log"))).unwrap();
        assert!(
            log.contains("Following the leader without campaigning"),
            "gw{g}: {log}"
        );
        assert!(!log.contains("Became the leader"), "gw{g}: {log}");
    }
    let holder = crate::support::leader::holder(&leases).await;
    assert!(
        holder.as_deref().is_some_and(|h| h.starts_with("op0_")),
        "no gateway took the Lease: {holder:?}"
    );

    // Issue 52: with no answer from a leader for 10 s the copies are
    // stale; the gateways say so and withhold nothing by the leases in
    // them (the leased proxy carries connections again).
    for g in 0..2 {
        let path = w._dir.path().join(format!("gw{g}.log"));
        eventually("the stale copy said", Duration::from_secs(30), || async {
            let log = std::fs::read_to_string(&path).ok()?;
            log.contains("the gateway does not withhold proxies by the leases in it")
                .then_some(())
        })
        .await;
    }
    for (g, gw) in w.gws.iter().enumerate() {
        let mut used = BTreeSet::new();
        for _ in 0..20 {
            let seen = curl_async(*gw, "default", &http).await;
            assert_eq!(seen.status, 200, "gateway {g}: {seen:?}");
            used.insert(w.upstream_of(&seen.body));
        }
        assert!(
            used.contains(&x),
            "gateway {g} still withholds up-{x} by a stale copy: {used:?}"
        );
    }
    drop(w.ground);
}

/// A site that bans the first address it sees: `403` to it, its own
/// address to everyone else.
async fn banning_site() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let banned = Arc::new(std::sync::Mutex::new(None));
    tokio::spawn(async move {
        while let Ok((mut c, peer)) = l.accept().await {
            let banned = banned.clone();
            tokio::spawn(async move {
                support::read_head(&mut c).await;
                let ban = *banned.lock().unwrap().get_or_insert(peer.ip()) == peer.ip();
                let answer = if ban {
                    "HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\nConnection: close\r\n\r\nbanned"
                        .to_string()
                } else {
                    echo(peer)
                };
                let _ = c.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// A site that answers `403` bans the session's upstream for that site
/// only: the `403` is relayed marked `x-gateway-upstream-banned`, and the
/// session's next request to the site leaves from another upstream (said
/// moved), while another site still sees the first. A tunnel's session
/// reported `blocked` through `POST /v1/sessions/{id}/report` moves at its
/// next CONNECT (said on the CONNECT's `200`); an unknown session is a
/// `404 session_not_found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_ban_and_a_session_report_move_the_session() {
    let w = World::new("gwban").await;
    let gw = w.gw;
    let ban = format!("http://{}/", banning_site().await);
    let first = curl_async(gw, "default-session-b1", &ban).await;
    assert_eq!(first.status, 403, "{first:?}");
    assert!(
        first
            .headers
            .to_ascii_lowercase()
            .contains("x-gateway-upstream-banned: true"),
        "{first:?}"
    );
    let second = curl_async(gw, "default-session-b1", &ban).await;
    assert_eq!(
        second.status, 200,
        "the next upstream is not banned: {second:?}"
    );
    assert!(
        second
            .headers
            .to_ascii_lowercase()
            .contains("x-gateway-session-moved: true"),
        "{second:?}"
    );
    let https = format!("https://localhost:{}/", w.https.port());
    let elsewhere = curl_async(gw, "default-session-b1", &https).await;
    assert_eq!(elsewhere.status, 200, "{elsewhere:?}");
    assert_eq!(
        elsewhere.body, second.body,
        "the session stays where it moved"
    );

    let tunnel = curl_async(gw, "default-session-t1", &https).await;
    assert_eq!(tunnel.status, 200, "{tunnel:?}");
    let body = br#"{"result": "blocked"}"#.to_vec();
    let (s, v) = api_call(
        w.api,
        "POST",
        "/v1/sessions/t1/report",
        Some(TOKEN),
        body.clone(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["moved"], true, "{v}");
    let reported = v["proxy"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let up: usize = reported["up-".len()..].parse().unwrap();
    assert_eq!(
        exit_of(up).to_string(),
        tunnel.body,
        "the report names the session's upstream: {v}"
    );
    let after = curl_async(gw, "default-session-t1", &https).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_ne!(
        after.body, tunnel.body,
        "the reported upstream is left: {after:?}"
    );
    assert!(
        after
            .headers
            .to_ascii_lowercase()
            .contains("x-gateway-session-moved: true"),
        "the CONNECT's answer says so: {after:?}"
    );
    let (s, v) = api_call(
        w.api,
        "POST",
        "/v1/sessions/nobody/report",
        Some(TOKEN),
        body,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("session_not_found")),
        "{v}"
    );
    drop(w.ground);
}

/// A small site on 127.0.0.1: `/` links to five pages, each page says the
/// address its request came from.
async fn site() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, peer)) = l.accept().await {
            tokio::spawn(async move {
                let head = support::read_head(&mut c).await;
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let body = if path.ends_with('/') {
                    let links: String = (1..=5)
                        .map(|i| format!("<a href=\"/p{i}\">p{i}</a> "))
                        .collect();
                    format!(
                        "<html><body>{links}<p>index {}</p></body></html>",
                        peer.ip()
                    )
                } else {
                    format!("<html><body><p>{}</p></body></html>", peer.ip())
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// Runs `python` with `args` (at most two minutes): whether it succeeded
/// and its standard output.
async fn python(python: std::path::PathBuf, args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new("timeout")
            .arg("120")
            .arg(&python)
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            eprintln!(
                "{args:?}: {}\n{}",
                stdout,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (out.status.success(), stdout)
    })
    .await
    .unwrap()
}

/// The crawler kit of docs/gateway.md, run as a crawler developer runs
/// it: Python requests fetches http and https targets in one session,
/// all from one upstream; Scrapy crawls a local site (an index and five
/// pages) with a sticky session, every page from one upstream; a real
/// headless Chromium (Debian's, driven by Playwright) loads an https page
/// through the gateway, answering its 407 with the proxy credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_scrapy_and_a_real_chromium_use_the_gateway() {
    use crate::support::crawler;
    crawler::require_python_requests();
    crawler::require_chromium();
    let venv = crawler::venv_python();
    let w = World::new("gwclients").await;
    let gateway = format!("http://{}", w.gw);
    let common = |script: &str| -> Vec<String> {
        vec![
            crawler::gateway_example(script).display().to_string(),
            "--gateway".into(),
            gateway.clone(),
            "--client".into(),
            "default".into(),
            "--token".into(),
            TOKEN.into(),
        ]
    };

    let mut args = common("fetch_requests.py");
    args.extend(["--session".into(), "req1".into(), "--insecure".into()]);
    for n in 0..3 {
        args.push(format!("http://{}/?n={n}", w.http));
        args.push(format!("https://localhost:{}/?n={n}", w.https.port()));
    }
    let (ok, out) = python("python3".into(), args).await;
    assert!(ok, "fetch_requests.py failed: {out}");
    let exits: BTreeSet<&str> = out
        .lines()
        .map(|l| {
            assert!(l.starts_with("200 "), "{l}");
            l.rsplit('\'').nth(1).unwrap()
        })
        .collect();
    assert_eq!(out.lines().count(), 6, "{out}");
    assert_eq!(exits.len(), 1, "one session, one exit: {out}");
    w.upstream_of(exits.first().unwrap());

    let site = site().await;
    let mut args = common("crawl_scrapy.py");
    args.extend([
        "--session".into(),
        "scrapy1".into(),
        "--start".into(),
        format!("http://{site}/"),
    ]);
    let (ok, out) = python(venv.clone(), args).await;
    assert!(ok, "crawl_scrapy.py failed: {out}");
    let pages: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(pages.len(), 6, "the index and five pages: {out}");
    let exits: BTreeSet<String> = pages
        .iter()
        .map(|p| {
            let text = p["text"].as_str().unwrap();
            text.trim_start_matches("index ").to_string()
        })
        .collect();
    assert_eq!(exits.len(), 1, "one sticky session, one exit: {out}");
    w.upstream_of(exits.first().unwrap());

    let mut args = common("browse_playwright.py");
    args.extend([
        "--session".into(),
        "chrome1".into(),
        "--insecure".into(),
        format!("https://localhost:{}/", w.https.port()),
    ]);
    let (ok, out) = python(venv, args).await;
    assert!(ok, "browse_playwright.py failed: {out}");
    w.upstream_of(out.trim());
    drop(w.ground);
}

/// A gateway told to stop (SIGTERM) takes no new connection but lets the
/// tunnel open through it finish its request (answered 3 s later), then
/// exits once nothing is open, long before its drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_gateway_lets_the_tunnel_in_flight_finish() {
    let mut w = World::new("gwdrain").await;
    let (gw, http) = (w.gw, format!("http://{}/", w.http));
    let slow = format!("https://localhost:{}/slow", w.https.port());
    let in_flight = tokio::spawn(async move { curl_async(gw, "default", &slow).await });
    // The tunnel is up and its request sent before the stop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut op = w._ops.remove(0);
    Command::new("kill")
        .args(["-TERM", &op.pid().to_string()])
        .status()
        .unwrap();
    let log = w._dir.path().join("operator.log");
    eventually(
        "the gateway to stop accepting",
        Duration::from_secs(10),
        || async {
            std::fs::read_to_string(&log)
                .ok()?
                .contains("Gateway stopping")
                .then_some(())
        },
    )
    .await;
    let refused = curl_async(gw, "default", &http).await;
    assert_eq!(
        refused.status, 0,
        "a new connection while stopping: {refused:?}"
    );
    let done = in_flight.await.unwrap();
    assert_eq!(done.status, 200, "the request in flight: {done:?}");
    w.upstream_of(&done.body);
    let stopped = std::time::Instant::now();
    let status = loop {
        if let Some(status) = op.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "still running 10 s after its last tunnel ended (the drain timeout is 20 s):\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("Gateway drained"), "{text}");
    drop(w.ground);
}
