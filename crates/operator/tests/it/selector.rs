//! Two operators side by side with complementary `--cluster-selector`s (a canary release
//! and the stable one) against a real API server (testenv): each manages only its clusters,
//! and a cluster relabelled from one to the other changes hands. Each operator names a
//! different default instance image, so the Pods say which operator made them.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use pgop_testenv::wait;

const LABEL: &str = "pgop.example.com/channel";
const CANARY_IMAGE: &str = "registry.example/pgop:canary";
const STABLE_IMAGE: &str = "registry.example/pgop:stable";

fn operator(client: &kube::Client, ns: &str, selector: &str, image: &str) -> Result<Operator> {
    Ok(Operator::start_with(
        client,
        pgop_operator::Options {
            namespaces: vec![ns.to_string()],
            cluster_selector: Some(pgop_operator::selector::parse(selector)?),
            settings: pgop_operator::Settings {
                image: image.to_string(),
                ..pgop_operator::Settings::default()
            },
            ..pgop_operator::Options::default()
        },
    ))
}

/// The Pod's uid and the image of its first container, once the Pod exists.
async fn image_of(client: &kube::Client, ns: &str, pod: &str) -> Result<Option<(String, String)>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(api.get_opt(pod).await?.and_then(|p| {
        let uid = p.metadata.uid?;
        let image = p.spec?.containers.into_iter().next()?.image?;
        Some((uid, image))
    }))
}

/// Waits until the Pod runs `image`; returns its uid.
async fn wait_image(client: &kube::Client, ns: &str, pod: &str, image: &str) -> Result<String> {
    Ok(
        wait::until(&format!("{pod} runs {image}"), TIMEOUT, || async move {
            match image_of(client, ns, pod).await {
                Ok(Some((uid, i))) if i == image => Ok(uid),
                other => Err(format!("{other:?}")),
            }
        })
        .await?,
    )
}

#[tokio::test]
async fn complementary_selectors_split_the_clusters_and_a_relabelled_cluster_changes_hands()
-> Result {
    let (_plane, client, ns) = setup("selector").await?;
    let n = ns.name();
    let canary = operator(&client, n, &format!("{LABEL}=canary"), CANARY_IMAGE)?;
    let stable = operator(&client, n, &format!("{LABEL}!=canary"), STABLE_IMAGE)?;

    let mut labelled = cluster("canary-db", 1);
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert(LABEL.to_string(), "canary".to_string());
    create(&client, n, &labelled).await?;
    create(&client, n, &cluster("stable-db", 1)).await?;
    let canary_pod = wait_image(&client, n, "canary-db-1", CANARY_IMAGE).await?;
    wait_image(&client, n, "stable-db-1", STABLE_IMAGE).await?;
    // Both clusters have their status.
    for name in ["canary-db", "stable-db"] {
        wait_cluster(&client, n, name, "a status", |c| {
            c.status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .is_some()
        })
        .await?;
    }

    // Promote stable-db to the canary: the canary operator adopts it and rolls its Pod
    // onto its own image; the stable operator lets go.
    let clusters: Api<pgop_api::PostgresCluster> = Api::namespaced(client.clone(), n);
    clusters
        .patch(
            "stable-db",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {LABEL: "canary"}}})),
        )
        .await?;
    wait_image(&client, n, "stable-db-1", CANARY_IMAGE).await?;

    // And back: the stable operator takes it again.
    clusters
        .patch(
            "stable-db",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {LABEL: null}}})),
        )
        .await?;
    wait_image(&client, n, "stable-db-1", STABLE_IMAGE).await?;
    // Had the stable operator also managed canary-db, it would have replaced its Pod
    // with one of its image (and the canary operator again with one of its own).
    assert_eq!(
        image_of(&client, n, "canary-db-1").await?,
        Some((canary_pod, CANARY_IMAGE.to_string())),
        "canary-db's first Pod, untouched throughout"
    );

    canary.stop().await;
    stable.stop().await;
    ns.delete().await?;
    Ok(())
}
