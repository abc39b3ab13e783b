//! The OpenAPI 3 document, generated from the handlers and the wire types
//! (served at `/openapi.json`).

use std::time::Duration;

use utoipa::OpenApi;

use super::handlers;
use super::model::*;

#[derive(OpenApi)]
#[openapi(
    info(title = "egress-proxies-operator discovery and lease API", description = "Lists healthy proxies and leases them to crawlers. See docs/api.md."),
    paths(handlers::healthz, handlers::list_proxies, handlers::acquire, handlers::get_lease, handlers::renew, handlers::release, handlers::report, super::replace::replace, super::sessions::report_session),
    components(schemas(ProxyItem, ProxyList, Filters, AcquireBody, RenewBody, ReportBody, SessionReportBody, ReportResult, LeaseResponse, ErrorBody, ErrorDetail, super::sessions::SessionReport)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI 3 document, generated from the handlers and types, with
/// the `ttlSeconds` maximum of this deployment (`--max-lease-ttl`).
pub fn openapi_json(max_ttl: Duration) -> String {
    let Ok(mut doc) = serde_json::to_value(ApiDoc::openapi()) else {
        return "{}".to_string();
    };
    for schema in ["AcquireBody", "RenewBody"] {
        if let Some(ttl) = doc
            .pointer_mut(&format!(
                "/components/schemas/{schema}/properties/ttlSeconds"
            ))
            .and_then(|v| v.as_object_mut())
        {
            ttl.insert("maximum".into(), max_ttl.as_secs().into());
        }
    }
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".to_string())
}

/// The document as the operator serves it with the default flags: what
/// `docs/openapi.json` holds (`make openapi`; a test checks it).
pub fn served_openapi_json() -> String {
    use clap::Parser;
    let max_ttl = crate::cli::Flags::try_parse_from(["egress-proxies-operator"])
        .map(|f| f.max_lease_ttl)
        .unwrap_or(Duration::from_secs(3600));
    openapi_json(max_ttl)
}
