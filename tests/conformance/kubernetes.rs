//! The kubernetes provider's backend: the real API server of the test
//! cluster, whose node agent runs each Pod as a real Squid, in a namespace
//! of its own.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_proxies_operator::config::{DestinationRules, KubernetesConfig, DEFAULT_SQUID_IMAGE};
use egress_proxies_operator::provider::kubernetes::{build_pod, KubernetesProvider};
use egress_proxies_operator::provider::{
    CreateRequest, ErrorClass, Instance, Op, Provider, ProviderError,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams, VersionMatch};
use kube::{Api, Client};

use crate::support::{self, Ground};
use crate::{closed_port, plain_request, Backend, ErrorCase};

const NAME: &str = "kubernetes";

pub struct Kube {
    ground: Ground,
    provider: KubernetesProvider,
}

fn provider(client: Client) -> KubernetesProvider {
    let cfg = KubernetesConfig {
        image: DEFAULT_SQUID_IMAGE.to_string(),
        ..Default::default()
    };
    KubernetesProvider::new(NAME, &cfg, client, "test-cluster")
}

impl Kube {
    pub async fn start() -> Kube {
        support::require_squid_pods();
        let ground = support::ground("conformance").await;
        let provider = provider(ground.client.clone());
        Kube { ground, provider }
    }

    /// The admin kubeconfig as a client config, to derive clients from.
    async fn admin_config(&self) -> kube::Config {
        let kc = kube::config::Kubeconfig::read_from(self.ground.cluster.kubeconfig()).unwrap();
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap()
    }

    /// A client of a user whose requests the API server's priority and
    /// fairness serves one at a time and rejects (429) instead of queueing:
    /// a priority level with no seats of its own, which admits a request
    /// only while none of its others executes. The user may read Pods.
    async fn throttled(&self) -> (Client, String) {
        let name = format!("{}-throttled", self.ground.ns);
        let yaml = format!(
            "apiVersion: flowcontrol.apiserver.k8s.io/v1\nkind: PriorityLevelConfiguration\nmetadata: {{name: {name}}}\nspec:\n  type: Limited\n  limited:\n    nominalConcurrencyShares: 0\n    lendablePercent: 0\n    borrowingLimitPercent: 0\n    limitResponse: {{type: Reject}}\n---\napiVersion: flowcontrol.apiserver.k8s.io/v1\nkind: FlowSchema\nmetadata: {{name: {name}}}\nspec:\n  priorityLevelConfiguration: {{name: {name}}}\n  matchingPrecedence: 50\n  rules:\n  - subjects: [{{kind: User, user: {{name: {name}}}}}]\n    resourceRules: [{{verbs: [\"*\"], apiGroups: [\"*\"], resources: [\"*\"], namespaces: [\"*\"], clusterScope: true}}]\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("apf.yaml");
        std::fs::write(&file, yaml).unwrap();
        let g = &self.ground;
        g.cluster
            .kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
        g.cluster.kubectl_ok(&[
            "create",
            "clusterrole",
            &name,
            "--verb=get,list",
            "--resource=pods",
        ]);
        g.cluster.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            &name,
            "--clusterrole",
            &name,
            "--user",
            &name,
        ]);
        (self.impersonating(&name).await, name)
    }

    /// A client acting as `user`, through the admin's right to impersonate.
    async fn impersonating(&self, user: &str) -> Client {
        let mut cfg = self.admin_config().await;
        cfg.auth_info.impersonate = Some(user.to_string());
        // kube's client retries a 429 (honouring Retry-After) up to 15 times
        // before the provider sees it; the provider's classification of the
        // 429 it is finally handed is what is under test.
        cfg.default_retry = false;
        Client::try_from(cfg).unwrap()
    }

    /// A create refused by a ResourceQuota of no Pods, in a namespace of its
    /// own (before the quota controller has counted it, the refusal says
    /// so, and is QuotaExceeded too).
    async fn over_quota(&self) -> Result<String, ProviderError> {
        let g = &self.ground;
        let ns = g.cluster.namespace(&g.client, "conformance-quota").await;
        g.cluster
            .kubectl_ok(&["-n", &ns, "create", "quota", "none", "--hard=pods=0"]);
        // The API server's quota admission learns of a new quota from its
        // own informer: a create right after it may still go through (a
        // busy machine showed it). Asked until refused, a Pod that went
        // through deleted again.
        let t = Instant::now();
        let mut i = 0;
        loop {
            i += 1;
            let req = plain_request(&format!("quota-{i}"), &ns);
            match self.provider.create(&req).await {
                Ok(id) if t.elapsed() < Duration::from_secs(30) => {
                    let _ = self.provider.delete(&id).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                r => return r,
            }
        }
    }

    /// A get the API server rejects with 429: while a list of the throttled
    /// user waits (3 s) for a resourceVersion the cache has not reached,
    /// holding the level's only turn, the provider's get of the same user is
    /// rejected. Polled, since the flow control configuration takes a moment
    /// to reach the request filter.
    async fn rejected_get(&self) -> Result<Instance, ProviderError> {
        let (client, name) = self.throttled().await;
        let throttled = provider(client.clone());
        let pods: Api<Pod> = Api::namespaced(client, &self.ground.ns);
        let t = Instant::now();
        let result = loop {
            let pods = pods.clone();
            let blocker = tokio::spawn(async move {
                let lp = ListParams::default()
                    .at("999999999")
                    .matching(VersionMatch::NotOlderThan);
                let _ = pods.list(&lp).await;
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
            let r = throttled.get(&self.id_of("proxy-unknown")).await;
            blocker.abort();
            let quota = matches!(&r, Err(e) if e.is(ErrorClass::QuotaExceeded));
            if quota || t.elapsed() > Duration::from_secs(30) {
                break r;
            }
        };
        let g = &self.ground.cluster;
        g.kubectl_ok(&[
            "delete",
            "flowschema,prioritylevelconfiguration,clusterrole,clusterrolebinding",
            &name,
            "--ignore-not-found",
        ]);
        result
    }
}

#[async_trait]
impl Backend for Kube {
    fn provider(&self) -> &dyn Provider {
        &self.provider
    }

    async fn request(&self, tag: &str) -> CreateRequest {
        // A real Proxy owns the Pod; without one the garbage collector
        // would delete the Pod as an orphan of its owner reference.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let proxy_name = format!("{tag}-{n}");
        let created = self
            .ground
            .proxies()
            .create(&PostParams::default(), &support::kube_proxy(&proxy_name))
            .await
            .unwrap();
        let uid = created.metadata.uid.clone().unwrap();
        CreateRequest {
            name: egress_proxies_operator::provider::naming::name_from_uid(&uid),
            uid,
            proxy_name,
            ..plain_request(tag, &self.ground.ns)
        }
    }

    fn id_of(&self, name: &str) -> String {
        format!("{}/{name}", self.ground.ns)
    }

    async fn plant(&self, req: &CreateRequest, marked: bool) -> String {
        let mut pod = build_pod(req, DEFAULT_SQUID_IMAGE, &DestinationRules::default());
        if !marked {
            // A Pod made by hand: no marks and no owner.
            pod.metadata.labels = None;
            pod.metadata.owner_references = None;
        }
        let pods: Api<Pod> = self.ground.api();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        self.id_of(&req.name)
    }

    async fn errors(&self) -> Vec<ErrorCase> {
        let p = &self.provider;
        let mut cases = Vec::new();
        let mut bad = plain_request("bad-name", &self.ground.ns);
        bad.name = "Not_A_Pod_Name".into();
        cases.push(ErrorCase::new(
            "create of a Pod the API server refuses (422)",
            ErrorClass::Permanent,
            Op::Create,
            p.create(&bad).await,
        ));

        let mut cfg = self.admin_config().await;
        cfg.cluster_url = format!("https://127.0.0.1:{}", closed_port())
            .parse()
            .unwrap();
        let dead = provider(Client::try_from(cfg).unwrap());
        cases.push(ErrorCase::new(
            "get from an API server that does not answer",
            ErrorClass::Transient,
            Op::Get,
            dead.get(&self.id_of("proxy-unknown")).await,
        ));

        let stranger = self
            .impersonating(&format!("{}-stranger", self.ground.ns))
            .await;
        cases.push(ErrorCase::new(
            "get by a user RBAC refuses (403)",
            ErrorClass::Unavailable,
            Op::Get,
            provider(stranger).get(&self.id_of("proxy-unknown")).await,
        ));
        cases.push(ErrorCase::new(
            "create refused by a ResourceQuota (403 exceeded quota)",
            ErrorClass::QuotaExceeded,
            Op::Create,
            self.over_quota().await,
        ));
        cases.push(ErrorCase::new(
            "get rejected by priority and fairness (429)",
            ErrorClass::QuotaExceeded,
            Op::Get,
            self.rejected_get().await,
        ));
        cases
    }

    fn cannot_produce(&self) -> Vec<(ErrorClass, &'static str)> {
        // None: 404, a 422 and a malformed ID, a refused connection, an RBAC
        // 403, a ResourceQuota's 403 and a 429 from priority and fairness
        // are all real answers.
        Vec::new()
    }

    fn settle(&self) -> Duration {
        // The node agent stops the Squid process, then the Pod goes.
        Duration::from_secs(90)
    }
}
