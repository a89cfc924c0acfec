//! A spec that got past the API server (here: the CRD installed without its schema, as
//! with an older CRD) is caught by the controller's own validation: phase Invalid,
//! SpecValid=False naming the field (in `v1beta1`, the version the operator reads), one
//! Warning event, and no retry loop.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use pgop_api::cluster::ClusterPhase;
use pgop_api::v1beta1::PostgresCluster;
use pgop_testenv::{ControlPlane, Options, TestNamespace};
use std::time::Duration;

/// The PostgresCluster CRD (`v1beta1` only) with its spec schema replaced by "anything
/// goes".
fn lax_crd() -> Result<CustomResourceDefinition> {
    let mut crd = PostgresCluster::crd();
    let version = crd.spec.versions.first_mut().ok_or("no version")?;
    let schema = version
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .ok_or("no schema")?;
    schema.x_kubernetes_validations = None;
    let props = schema.properties.as_mut().ok_or("no properties")?;
    props.insert(
        "spec".into(),
        JSONSchemaProps {
            type_: Some("object".into()),
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..JSONSchemaProps::default()
        },
    );
    Ok(crd)
}

#[tokio::test]
async fn an_invalid_spec_sets_phase_invalid_names_the_field_and_waits_for_a_change() -> Result {
    // Its own control plane: the lax CRD must not weaken other tests' validation.
    let plane = ControlPlane::start(Options::default().with_controller_manager()).await?;
    let client = plane.client()?;
    pgop_testenv::crds::install(&client, [lax_crd()?]).await?;
    let ns = TestNamespace::create(plane.config(), "invalid").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let op = Operator::start(&client, n);

    let bad: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
        "metadata": {"name": "bad"},
        "spec": {"instances": 12, "storage": {"size": "1Gi"}}
    }))?;
    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    api.create(&PostParams::default(), &bad).await?;
    let c = wait_cluster(&client, n, "bad", "phase Invalid", |c| {
        phase(c) == Some(ClusterPhase::Invalid)
    })
    .await?;
    let valid = condition(&c, "SpecValid").ok_or("no SpecValid")?;
    assert_eq!(valid.status, "False");
    assert_eq!(valid.reason, "InvalidSpec");
    assert!(
        valid.message.contains("spec.instances"),
        "{}",
        valid.message
    );
    assert!(
        names::<Pod>(&client, n, "bad").await?.is_empty(),
        "nothing is built from an invalid spec"
    );

    // No retry loop: the status is not rewritten and the event is not repeated.
    let version = c.resource_version();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(get(&client, n, "bad").await?.resource_version(), version);
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), n)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("InvalidSpec"))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(events[0].count.unwrap_or(1), 1);

    // The next change is picked up.
    api.patch(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"instances": 1}})),
    )
    .await?;
    wait_names::<Pod>(&client, n, "bad", &["bad-1"]).await?;
    let c = wait_cluster(&client, n, "bad", "SpecValid True", |c| {
        condition(c, "SpecValid").is_some_and(|v| v.status == "True")
    })
    .await?;
    assert_ne!(phase(&c), Some(ClusterPhase::Invalid));
    op.stop().await;
    ns.delete().await?;
    Ok(())
}
