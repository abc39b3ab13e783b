//! The kvm provider's backend: a real sshd and libvirtd with a dir pool and
//! an image served over HTTP (tests/kvm_support); domains run under QEMU's
//! TCG. Nothing answers DHCP on the bridge, so instances stay Provisioning.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use egress_proxies_operator::config::KvmConfig;
use egress_proxies_operator::provider::kvm::ids::provider_id;
use egress_proxies_operator::provider::kvm::xml::mark_xml;
use egress_proxies_operator::provider::kvm::KvmProvider;
use egress_proxies_operator::provider::{CreateRequest, ErrorClass, Op, Provider};

use crate::kvm_support::{self, uid, virsh, Env};
use crate::{closed_port, Backend, ErrorCase};

const NAME: &str = "kvm";
const IMAGE: &str = "img";

pub struct Kvm {
    /// The pool too small for the image, made once.
    tiny: std::sync::OnceLock<String>,
    env: Env,
    cfg: KvmConfig,
    provider: KvmProvider,
}

impl Kvm {
    /// A missing kvm part or a failed harness step fails the test inside
    /// `Env::start`, with the reason.
    pub fn start() -> Kvm {
        let env = Env::start("cf");
        let (url, _) = env.serve_qcow2("base.qcow2", "16M");
        let mut cfg = env.config();
        cfg.images
            .insert(IMAGE.into(), kvm_support::bios_image(url));
        let provider = KvmProvider::new(NAME, &cfg).unwrap();
        Kvm {
            tiny: std::sync::OnceLock::new(),
            env,
            cfg,
            provider,
        }
    }

    /// From now on a provider whose creates all go on in the background at
    /// once, as when the first download of an image on a host outlasts
    /// create's wait.
    pub fn background_creates(&mut self) {
        self.provider = KvmProvider::new(NAME, &self.cfg)
            .unwrap()
            .with_create_wait(Duration::ZERO);
    }
}

#[async_trait]
impl Backend for Kvm {
    fn provider(&self) -> &dyn Provider {
        &self.provider
    }

    async fn request(&self, tag: &str) -> CreateRequest {
        let req = kvm_support::request(&uid(tag), IMAGE, "");
        self.env.track(&req.name);
        req
    }

    fn id_of(&self, name: &str) -> String {
        provider_id("h1", name)
    }

    async fn plant(&self, req: &CreateRequest, marked: bool) -> String {
        self.env.track(&req.name);
        let meta = if marked {
            format!(
                "<metadata>{}</metadata>",
                mark_xml(&req.uid, &req.installation_id, Utc::now())
            )
        } else {
            String::new()
        };
        let file = self.env.dir.path().join(format!("{}.xml", req.name));
        std::fs::write(
            &file,
            format!(
                "<domain type=\"qemu\"><name>{}</name>{meta}<memory unit=\"MiB\">64</memory><os><type arch=\"x86_64\">hvm</type></os></domain>",
                req.name
            ),
        )
        .unwrap();
        let (ok, out) = virsh(&["define", file.to_str().unwrap()]);
        assert!(ok, "virsh define: {out}");
        self.id_of(&req.name)
    }

    async fn errors(&self) -> Vec<ErrorCase> {
        let p = &self.provider;
        let mut cases = vec![ErrorCase::new(
            "get on a host that is not configured",
            ErrorClass::Permanent,
            Op::Get,
            p.get("hosts/nope/domains/x").await,
        )];
        let mut huge = self.request("huge").await;
        huge.placement.machine_type = "huge".into();
        cases.push(ErrorCase::new(
            "create with an unknown machine type",
            ErrorClass::Permanent,
            Op::Create,
            p.create(&huge).await,
        ));

        let mut refused = self.cfg.clone();
        refused.hosts[0].address = format!("127.0.0.1:{}", closed_port());
        let dead = KvmProvider::new(NAME, &refused).unwrap();
        cases.push(ErrorCase::new(
            "get on a host whose SSH port refuses",
            ErrorClass::Transient,
            Op::Get,
            dead.get(&self.id_of("proxy-unknown")).await,
        ));

        // A key the host's sshd does not accept.
        let stranger = self.env.dir.path().join("stranger_key");
        if !stranger.exists() {
            kvm_support::new_ed25519_key(&stranger);
        }
        let mut rejected = self.cfg.clone();
        rejected.ssh_key_file = stranger.display().to_string();
        let refused_key = KvmProvider::new(NAME, &rejected).unwrap();
        cases.push(ErrorCase::new(
            "get with a key the host refuses",
            ErrorClass::Unavailable,
            Op::Get,
            refused_key.get(&self.id_of("proxy-unknown")).await,
        ));

        // A pool too small for the base image: the host's own "no room".
        let tiny = self
            .tiny
            .get_or_init(|| self.env.tiny_pool(&format!("{}-tiny", self.env.pool), "8m"));
        let big = self.env.dir.path().join("big16.raw");
        std::fs::write(&big, vec![1u8; 16 << 20]).unwrap();
        let mut small = self.cfg.clone();
        small.hosts[0].pool = tiny.clone();
        let mut image = kvm_support::bios_image(self.env.http.add("/big16.raw", &big));
        image.format = Some("raw".into());
        small.images.insert(IMAGE.into(), image);
        let full = KvmProvider::new(NAME, &small).unwrap();
        cases.push(ErrorCase::new(
            "create on a pool without room for the image",
            ErrorClass::QuotaExceeded,
            Op::Create,
            full.create(&self.request("full").await).await,
        ));
        cases
    }

    fn cannot_produce(&self) -> Vec<(ErrorClass, &'static str)> {
        // None: libvirt's own "no domain", refused SSH, a refused key and a
        // full pool are real; malformed IDs and placements are refused
        // before any call.
        Vec::new()
    }

    fn settle(&self) -> Duration {
        // Delete destroys and undefines before it returns.
        Duration::from_secs(10)
    }
}
