//! The gcp provider's backend: the real Compute client on the stand-in
//! (tests/gcp_standin), which answers as Compute Engine does, errors and
//! failed operations included.

use std::time::Duration;

use async_trait::async_trait;
use egress_proxies_operator::provider::gcp::build::format_id;
use egress_proxies_operator::provider::gcp::GcpProvider;
use egress_proxies_operator::provider::naming::name_from_uid;
use egress_proxies_operator::provider::{CreateRequest, ErrorClass, Op, Provider};
use serde_json::json;

use crate::gcp_standin::{self, StandIn, ZONE};
use crate::{closed_port, fresh_uid, Backend, ErrorCase};

const NAME: &str = "gcp";

pub struct Gcp {
    standin: StandIn,
    provider: GcpProvider,
}

impl Gcp {
    pub async fn start() -> Gcp {
        let standin = StandIn::start().await;
        let provider = GcpProvider::new(
            NAME,
            &gcp_standin::config(&standin.url),
            gcp_standin::options(false),
        )
        .unwrap();
        Gcp { standin, provider }
    }
}

#[async_trait]
impl Backend for Gcp {
    fn provider(&self) -> &dyn Provider {
        &self.provider
    }

    async fn request(&self, tag: &str) -> CreateRequest {
        let uid = fresh_uid(tag);
        gcp_standin::request(&name_from_uid(&uid), &uid, "#cloud-config\n")
    }

    fn id_of(&self, name: &str) -> String {
        format_id(ZONE, name)
    }

    async fn plant(&self, req: &CreateRequest, marked: bool) -> String {
        let labels = if marked {
            json!({
                "proxy-operator-managed": "true",
                "proxy-operator-uid": req.uid,
                "proxy-operator-installation": req.installation_id,
            })
        } else {
            json!({"team": "by-hand"})
        };
        self.standin.put(ZONE, &req.name, labels, "RUNNING");
        self.id_of(&req.name)
    }

    async fn errors(&self) -> Vec<ErrorCase> {
        let p = &self.provider;
        let s = &self.standin;
        let known = {
            let req = self.request("errors").await;
            p.create(&req).await.unwrap()
        };
        let mut cases = Vec::new();
        let mut no_zone = self.request("no-zone").await;
        no_zone.placement.zone.clear();
        cases.push(ErrorCase::new(
            "create with a placement GCE cannot build",
            ErrorClass::Permanent,
            Op::Create,
            p.create(&no_zone).await,
        ));
        s.inject("get", 403, "forbidden");
        cases.push(ErrorCase::new(
            "get answered 403 forbidden",
            ErrorClass::Unavailable,
            Op::Get,
            p.get(&known).await,
        ));
        s.inject("delete", 503, "backendError");
        cases.push(ErrorCase::new(
            "delete answered 503",
            ErrorClass::Transient,
            Op::Delete,
            p.delete(&known).await,
        ));
        let dead = GcpProvider::new(
            NAME,
            &gcp_standin::config(&format!("http://127.0.0.1:{}", closed_port())),
            gcp_standin::options(false),
        )
        .unwrap();
        cases.push(ErrorCase::new(
            "get from an endpoint that does not answer",
            ErrorClass::Transient,
            Op::Get,
            dead.get(&known).await,
        ));
        s.inject("insert", 429, "rateLimitExceeded");
        cases.push(ErrorCase::new(
            "insert answered 429",
            ErrorClass::QuotaExceeded,
            Op::Create,
            p.create(&self.request("rate").await).await,
        ));
        s.with(|st| {
            st.fail_next_insert_op = Some(("QUOTA_EXCEEDED".into(), "Quota 'CPUS' exceeded".into()))
        });
        let id = p.create(&self.request("quota").await).await.unwrap();
        cases.push(ErrorCase::new(
            "an insert whose operation failed on quota, reported by get as the create's",
            ErrorClass::QuotaExceeded,
            Op::Create,
            p.get(&id).await,
        ));
        p.delete(&known).await.unwrap();
        cases
    }

    fn cannot_produce(&self) -> Vec<(ErrorClass, &'static str)> {
        // None: the stand-in answers as Compute Engine does (404, 403, 503,
        // 429, a failed insert operation), and a closed port refuses.
        Vec::new()
    }

    fn settle(&self) -> Duration {
        Duration::from_secs(10)
    }
}
