//! The CustomResourceDefinitions, generated from the Rust types. `crdgen`
//! writes them to `crds/`; a test fails when the committed files drift.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;

use super::{ProviderHealth, Proxy};

/// The Proxy CRD.
pub fn proxy_crd() -> CustomResourceDefinition {
    let mut crd = Proxy::crd();
    server_owned_metadata(&mut crd);
    crd
}

/// The ProxyPool CRD.
pub fn proxy_pool_crd() -> CustomResourceDefinition {
    let mut crd = super::ProxyPool::crd();
    server_owned_metadata(&mut crd);
    crd
}

/// kube-apiserver owns the schema of the top-level `metadata`: a CRD whose
/// schema says anything about it beyond `type: object` (a description, a
/// title, nullable, properties other than name/generateName) is refused
/// with `must not specify anything other than name and generateName`. So
/// whatever the generator put there is reduced to `type: object`.
fn server_owned_metadata(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        let Some(props) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
        else {
            continue;
        };
        if let Some(metadata) = props.get_mut("metadata") {
            *metadata = JSONSchemaProps {
                type_: Some("object".into()),
                ..Default::default()
            };
        }
    }
}

/// The ProviderHealth CRD: cluster-scoped, status subresource, no spec.
pub fn provider_health_crd() -> CustomResourceDefinition {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .with_transform(kube::core::schema::OptionalEnum)
        .into_generator();
    let schema = generator.into_root_schema_for::<ProviderHealth>();
    // A schema generated from our own types always converts; a failure here
    // is a programming error caught by the crd tests.
    let props: JSONSchemaProps = serde_json::from_value(schema.to_value())
        .unwrap_or_else(|e| panic!("ProviderHealth schema is not a JSONSchemaProps: {e}"));
    let column = |name: &str, type_: &str, path: &str| CustomResourceColumnDefinition {
        name: name.into(),
        type_: type_.into(),
        json_path: path.into(),
        ..Default::default()
    };
    let mut crd = CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some("providerhealths.crawl.example.com".into()),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: "crawl.example.com".into(),
            names: CustomResourceDefinitionNames {
                kind: "ProviderHealth".into(),
                list_kind: Some("ProviderHealthList".into()),
                plural: "providerhealths".into(),
                singular: Some("providerhealth".into()),
                short_names: Some(vec!["ph".into()]),
                categories: Some(vec![super::constants::CATEGORY.into()]),
            },
            scope: "Cluster".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: "v1alpha1".into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(props),
                }),
                subresources: Some(CustomResourceSubresources {
                    status: Some(CustomResourceSubresourceStatus(serde_json::json!({}))),
                    scale: None,
                }),
                additional_printer_columns: Some(vec![
                    column("Type", "string", ".status.type"),
                    column(
                        "Ready",
                        "string",
                        ".status.conditions[?(@.type==\"Ready\")].status",
                    ),
                    column("Targets", "string", ".status.targetsReady"),
                    column("Last Check", "date", ".status.lastCheckTime"),
                    column("Age", "date", ".metadata.creationTimestamp"),
                ]),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    };
    server_owned_metadata(&mut crd);
    crd
}

/// Every CRD with the file name it is committed under in `crds/`.
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("proxies.crawl.example.com.yaml", proxy_crd()),
        ("proxypools.crawl.example.com.yaml", proxy_pool_crd()),
        (
            "providerhealths.crawl.example.com.yaml",
            provider_health_crd(),
        ),
    ]
}

/// Renders one CRD as the YAML committed in `crds/`.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_norway::Error> {
    let body = serde_norway::to_string(crd)?;
    Ok(format!(
        "# Generated by `make crds` from src/api; do not edit by hand.\n{body}"
    ))
}
