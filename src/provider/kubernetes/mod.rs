//! The `kubernetes` provider: each instance is a Squid Pod in the Proxy's
//! namespace. It ignores `placement` and cloud-init (documented), and
//! generates the Squid config from the port.

mod classify;
mod observe;
mod squid;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, KeyToPath, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

pub use classify::classify;
pub use observe::{owners, strip_pod};
pub use squid::{destination_access, squid_conf, vm_squid_conf};

use super::registry::ProviderType;
use super::{
    Changes, Checker, CreateRequest, ErrorClass, Instance, InstanceState, Listing, Observation, Op,
    Provider, ProviderError, TargetStatus,
};
use crate::api::constants::{INSTALLATION_MARK, MANAGED_MARK, MANAGED_MARK_VALUE, UID_MARK};
use crate::config::{DestinationRules, KubernetesConfig};
use crate::provider::error::plain_message;

/// Name of the Squid container.
pub const CONTAINER: &str = "squid";

/// The provider.
pub struct KubernetesProvider {
    name: String,
    image: String,
    destinations: DestinationRules,
    client: Client,
    api_url: String,
    pods: observe::PodObserver,
}

impl KubernetesProvider {
    /// Builds the provider; does not contact the API server.
    pub fn new(name: &str, cfg: &KubernetesConfig, client: Client, api_url: &str) -> Self {
        KubernetesProvider {
            name: name.to_string(),
            image: cfg.image.clone(),
            destinations: DestinationRules::of(&cfg.destinations),
            client,
            api_url: api_url.to_string(),
            pods: observe::PodObserver::default(),
        }
    }

    fn err(&self, op: Op, id: &str, e: kube::Error) -> ProviderError {
        ProviderError::classify_with(op, &self.name, id, e, classify)
    }

    fn parse_id(&self, op: Op, id: &str) -> Result<(String, String), ProviderError> {
        parse_id(id).ok_or_else(|| {
            ProviderError::new(
                ErrorClass::Permanent,
                op,
                &self.name,
                id,
                format!("malformed kubernetes providerID {id:?}, want <namespace>/<name>"),
            )
        })
    }
}

/// `<namespace>/<name>`, both non-empty.
pub fn parse_id(id: &str) -> Option<(String, String)> {
    let (ns, name) = id.split_once('/')?;
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        return None;
    }
    Some((ns.to_string(), name.to_string()))
}

/// The Pod for a create request.
pub fn build_pod(req: &CreateRequest, image: &str, destinations: &DestinationRules) -> Pod {
    let labels = BTreeMap::from([
        (MANAGED_MARK.to_string(), MANAGED_MARK_VALUE.to_string()),
        (UID_MARK.to_string(), req.uid.clone()),
        (INSTALLATION_MARK.to_string(), req.installation_id.clone()),
        (
            "app.kubernetes.io/name".to_string(),
            "egress-proxy".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "egress-proxies-operator".to_string(),
        ),
    ]);
    let quantity = |s: &str| Quantity(s.to_string());
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        // The image's own entrypoint knows nothing of SQUID_CONF: write it
        // to the /tmp emptyDir (the root filesystem is read-only) and run
        // Squid in the foreground.
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            "printf '%s' \"$SQUID_CONF\" > /tmp/squid.conf && exec squid -N -f /tmp/squid.conf"
                .into(),
        ]),
        env: Some(vec![EnvVar {
            name: "SQUID_CONF".into(),
            value: Some(squid_conf(
                req.port,
                destinations,
                req.credentials.is_some(),
            )),
            value_from: None,
        }]),
        ports: Some(vec![ContainerPort {
            name: Some("proxy".into()),
            container_port: i32::from(req.port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), quantity("50m")),
                ("memory".into(), quantity("64Mi")),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".into(), quantity("1")),
                ("memory".into(), quantity("256Mi")),
            ])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts(req)),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(req.name.clone()),
            namespace: Some(req.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "crawl.example.com/v1alpha1".into(),
                kind: "Proxy".into(),
                name: req.proxy_name.clone(),
                uid: req.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(false),
            }]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Always".into()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            volumes: Some(volumes(req)),
            ..Default::default()
        }),
        status: None,
    }
}

/// A writable `/tmp`, and the credentials Secret's `htpasswd` key when the
/// instance asks for credentials.
fn volumes(req: &CreateRequest) -> Vec<Volume> {
    let mut volumes = vec![Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("64Mi".into())),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if let Some(c) = &req.credentials {
        volumes.push(Volume {
            name: "auth".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(c.secret_name.clone()),
                items: Some(vec![KeyToPath {
                    key: crate::credentials::HTPASSWD_KEY.into(),
                    path: "htpasswd".into(),
                    mode: None,
                }]),
                default_mode: Some(0o444),
                optional: Some(false),
            }),
            ..Default::default()
        });
    }
    volumes
}

fn volume_mounts(req: &CreateRequest) -> Vec<VolumeMount> {
    let mut mounts = vec![VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    }];
    if req.credentials.is_some() {
        mounts.push(VolumeMount {
            name: "auth".into(),
            mount_path: squid::HTPASSWD_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    mounts
}

/// The contract's view of a Pod.
pub fn pod_instance(pod: &Pod) -> Instance {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let state = if pod.metadata.deletion_timestamp.is_some() {
        // Going away: never Running, and not NotFound until it is gone.
        InstanceState::Provisioning
    } else {
        match phase.as_str() {
            "Running" if !ip.is_empty() => InstanceState::Running,
            "Running" | "Pending" | "" => InstanceState::Provisioning,
            "Succeeded" | "Failed" => InstanceState::Terminated,
            _ => InstanceState::Stopped,
        }
    };
    Instance {
        ip,
        state,
        ..meta_instance(&pod.metadata)
    }
}

/// A Pod as GC sees it, from its metadata alone (ID, marks, creation
/// time): the state is undeterminable without the status, so
/// Provisioning, and there is no address.
pub fn meta_instance(meta: &ObjectMeta) -> Instance {
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let mark = |key: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(key).cloned())
            .unwrap_or_default()
    };
    Instance {
        id: format!("{ns}/{name}"),
        ip: String::new(),
        state: InstanceState::Provisioning,
        uid: mark(UID_MARK),
        installation_id: mark(INSTALLATION_MARK),
        created_at: crate::api::created_at(meta),
    }
}

#[async_trait]
impl Provider for KubernetesProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider_type(&self) -> ProviderType {
        ProviderType::Kubernetes
    }

    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        let id = format!("{}/{}", req.namespace, req.name);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &req.namespace);
        let pod = build_pod(req, &self.image, &self.destinations);
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => Ok(id),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Idempotent by name, but never adopt another Proxy's Pod.
                let existing = api
                    .get(&req.name)
                    .await
                    .map_err(|e| self.err(Op::Create, &id, e))?;
                let owner = pod_instance(&existing).uid;
                if owner == req.uid {
                    Ok(id)
                } else {
                    Err(ProviderError::new(
                        ErrorClass::Permanent,
                        Op::Create,
                        &self.name,
                        &id,
                        format!(
                            "Pod {id} exists but belongs to Proxy UID {owner:?}, not {:?}",
                            req.uid
                        ),
                    ))
                }
            }
            Err(e) => Err(self.err(Op::Create, &id, e)),
        }
    }

    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        let (ns, name) = self.parse_id(Op::Get, id)?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let pod = api.get(&name).await.map_err(|e| self.err(Op::Get, id, e))?;
        Ok(pod_instance(&pod))
    }

    fn observed(&self, id: &str) -> Observation {
        match parse_id(id) {
            Some((ns, name)) => self.pods.observed(&ns, &name),
            None => Observation::Unknown,
        }
    }

    fn observe(
        &self,
        namespace: Option<&str>,
        _proxies: &kube::runtime::reflector::Store<crate::api::Proxy>,
    ) -> Option<Changes> {
        Some(self.pods.start(self.client.clone(), namespace))
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        let (ns, name) = self.parse_id(Op::Delete, id)?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.err(Op::Delete, id, e)),
        }
    }

    async fn list_by_tag(&self) -> Result<Listing, ProviderError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().labels(&format!("{MANAGED_MARK}={MANAGED_MARK_VALUE}"));
        // GC reads marks and creation times only: metadata, in pages.
        let pods = crate::paged::list_metadata(&api, &lp)
            .await
            .map_err(|e| self.err(Op::List, "", e))?;
        Ok(Listing {
            instances: pods.iter().map(|p| meta_instance(&p.metadata)).collect(),
            unread_scopes: Vec::new(),
        })
    }

    fn checker(&self) -> Option<Arc<dyn Checker>> {
        Some(Arc::new(ApiServerCheck {
            client: self.client.clone(),
            api_url: self.api_url.clone(),
        }))
    }
}

/// The kubernetes check: can the operator list Pods (the verb GC uses)?
struct ApiServerCheck {
    client: Client,
    /// The API server the client talks to, shown as the target's address.
    api_url: String,
}

#[async_trait]
impl Checker for ApiServerCheck {
    async fn check(&self) -> Vec<TargetStatus> {
        let started = Instant::now();
        let api: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default()
            .labels(&format!("{MANAGED_MARK}={MANAGED_MARK_VALUE}"))
            .limit(1);
        let (ready, reason, message) = match api.list(&lp).await {
            Ok(_) => (true, "Reachable", String::new()),
            Err(kube::Error::Api(s)) if s.code == 401 => (false, "Unauthorized", s.message),
            Err(kube::Error::Api(s)) if s.code == 403 => (false, "Forbidden", s.message),
            Err(kube::Error::Api(s)) => (false, "APIError", s.message),
            Err(e) => (false, "Unreachable", plain_message(&e)),
        };
        vec![TargetStatus {
            name: "apiserver".into(),
            address: self.api_url.clone(),
            ready,
            reason: reason.into(),
            message,
            latency: started.elapsed(),
            details: BTreeMap::new(),
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn req() -> CreateRequest {
        CreateRequest {
            name: "proxy-abcdefghijklmnop".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            proxy_name: "p1".into(),
            port: 3128,
            installation_id: "inst1".into(),
            cloud_init: crate::provider::UserData::new("ignored"),
            ..Default::default()
        }
    }

    #[test]
    fn pod_carries_marks_owner_limits_and_squid_conf() {
        let pod = build_pod(&req(), "squid:test", &DestinationRules::default());
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels[MANAGED_MARK], "true");
        assert_eq!(labels[UID_MARK], "uid-1");
        assert_eq!(labels[INSTALLATION_MARK], "inst1");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Proxy", "p1", "uid-1")
        );
        let spec = pod.spec.unwrap();
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("squid:test"));
        let env = c.env.as_ref().unwrap();
        assert_eq!(env[0].name, "SQUID_CONF");
        assert!(env[0].value.as_ref().unwrap().contains("http_port 3128"));
        assert!(
            !env[0].value.as_ref().unwrap().contains("ignored"),
            "cloud-init is not used"
        );
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 3128);
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(),
            &["ALL"]
        );
        assert!(c
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()
            .contains_key("memory"));
        let psc = spec.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }

    fn pod(phase: &str, ip: Option<&str>, deleting: bool) -> Pod {
        let mut p = build_pod(&req(), "img", &DestinationRules::default());
        p.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            pod_ip: ip.map(Into::into),
            ..Default::default()
        });
        p
    }

    #[test]
    fn pod_state_table() {
        let cases = [
            ("Pending", None, false, InstanceState::Provisioning),
            ("Running", None, false, InstanceState::Provisioning),
            ("Running", Some("10.1.2.3"), false, InstanceState::Running),
            (
                "Running",
                Some("10.1.2.3"),
                true,
                InstanceState::Provisioning,
            ),
            ("Succeeded", None, false, InstanceState::Terminated),
            ("Failed", Some("10.1.2.3"), false, InstanceState::Terminated),
            ("Unknown", None, false, InstanceState::Stopped),
            ("SomethingNew", None, false, InstanceState::Stopped),
        ];
        for (phase, ip, deleting, want) in cases {
            let i = pod_instance(&pod(phase, ip, deleting));
            assert_eq!(i.state, want, "{phase} {ip:?} deleting={deleting}");
            assert_eq!(i.id, "default/proxy-abcdefghijklmnop");
            assert_eq!(i.uid, "uid-1");
            assert_eq!(i.installation_id, "inst1");
            assert!(i.created_at.is_some());
        }
    }

    #[test]
    fn gc_reads_the_same_marks_from_metadata_alone() {
        let running = pod("Running", Some("10.1.2.3"), false);
        let (full, meta) = (pod_instance(&running), meta_instance(&running.metadata));
        assert_eq!(
            (&meta.id, &meta.uid, &meta.installation_id, meta.created_at),
            (&full.id, &full.uid, &full.installation_id, full.created_at)
        );
        assert!(meta.created_at.is_some());
        assert_eq!(
            (meta.ip.as_str(), meta.state),
            ("", InstanceState::Provisioning)
        );
    }

    #[test]
    fn ids_parse_strictly() {
        assert_eq!(parse_id("ns/name"), Some(("ns".into(), "name".into())));
        for bad in ["", "ns/", "/name", "name", "a/b/c", "zones/z/instances/n"] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
    }
}
