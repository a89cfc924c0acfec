//! `pgop migrate-storage` against a real API server (testenv): objects stored as
//! `v1alpha1` by the CRD of before are written again as `v1beta1` once the upgraded CRD
//! stores `v1beta1`, while another client keeps changing one of them, and `v1alpha1`
//! leaves the CRD's `status.storedVersions`. Run twice, the second run changes nothing.
//!
//! What etcd holds is read through the API server: with the conversion webhook down, a GET
//! (read from etcd) succeeds only in the version the object is stored in, so a GET in
//! `v1beta1` that succeeds while one in `v1alpha1` fails shows the object stored as
//! `v1beta1`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgop_api::{PostgresBackup, PostgresCluster, StorageVersion, v1beta1};
use pgop_operator::webhook::{self, Config, Webhook, cert};
use pgop_testenv::{ControlPlane, Options, TestNamespace, wait};
use std::time::Duration;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const CRD: &str = "postgresclusters.database.example.com";
const TIMEOUT: Duration = Duration::from_secs(60);

fn cluster(name: &str, replicas: i32) -> Result<PostgresCluster> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "storage": {"size": "1Gi"},
                 "backup": {"schedule": "0 2 * * *", "retentionDays": 3,
                            "store": {"volume": {"claimName": "backups"}}}}
    }))?)
}

/// `pgop migrate-storage` with the control plane's kubeconfig: its standard output.
async fn migrate(plane: &ControlPlane) -> Result<String> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgop"))
        .arg("migrate-storage")
        .env("KUBECONFIG", plane.kubeconfig())
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "pgop migrate-storage failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn stored_versions(crds: &Api<CustomResourceDefinition>) -> Result<Vec<String>> {
    Ok(crds
        .get(CRD)
        .await?
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default())
}

#[tokio::test]
async fn objects_stored_as_v1alpha1_are_migrated_to_v1beta1_while_they_are_written() -> Result {
    let plane = ControlPlane::start(Options::default()).await?;
    let client = plane.client()?;
    // The CRD of before, and objects it stored in v1alpha1, in two namespaces.
    pgop_testenv::crds::install(&client, pgop_api::crds_v1alpha1()).await?;
    let one = TestNamespace::create(plane.config(), "migrate-a").await?;
    let two = TestNamespace::create(plane.config(), "migrate-b").await?;
    let alpha_one: Api<PostgresCluster> = Api::namespaced(client.clone(), one.name());
    let alpha_two: Api<PostgresCluster> = Api::namespaced(client.clone(), two.name());
    alpha_one
        .create(&PostParams::default(), &cluster("a1", 1)?)
        .await?;
    alpha_one
        .create(&PostParams::default(), &cluster("a2", 2)?)
        .await?;
    alpha_two
        .create(&PostParams::default(), &cluster("b1", 3)?)
        .await?;
    let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresBackup",
        "metadata": {"name": "nightly"}, "spec": {"cluster": {"name": "a1"}}
    }))?;
    Api::<PostgresBackup>::namespaced(client.clone(), one.name())
        .create(&PostParams::default(), &backup)
        .await?;

    // The operator's conversion webhook, and the CRD upgraded to store v1beta1.
    let webhook = Webhook::bind(
        client.clone(),
        Config {
            listen: "127.0.0.1:0".parse()?,
            certificate: cert::Source::Managed(cert::Managed {
                namespace: one.name().to_string(),
                secret: "pgop-webhook-tls".into(),
                names: vec!["127.0.0.1".into()],
                configurations: Vec::new(),
                conversion_crds: vec![CRD.into()],
                conversion_client: None,
                validity_days: 30,
                renew_before_days: 10,
                check_every: Duration::from_millis(500),
            }),
        },
    )
    .await?;
    let port = webhook.local_addr().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook.run(async move {
        let _ = stopped.await;
    }));
    pgop_testenv::crds::install(
        &client,
        pgop_api::crds_with_v1beta1(
            WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}{}", webhook::CONVERT)),
                ..WebhookClientConfig::default()
            },
            StorageVersion::V1beta1,
        ),
    )
    .await?;
    let beta_all: Api<v1beta1::PostgresCluster> = Api::all(client.clone());
    wait::until("v1beta1 to be served through the webhook", TIMEOUT, || {
        let beta_all = beta_all.clone();
        async move {
            let items = beta_all
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            (items.len() == 3)
                .then_some(())
                .ok_or_else(|| format!("{} clusters", items.len()))
        }
    })
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert_eq!(stored_versions(&crds).await?, ["v1alpha1", "v1beta1"]);

    // Another client changes a1 all along, through v1alpha1.
    let writer = {
        let api = alpha_one.clone();
        let (done, mut finish) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut last = None;
            for i in 0u32.. {
                if finish.try_recv().is_ok() {
                    break;
                }
                let patch =
                    serde_json::json!({"metadata": {"annotations": {"counter": i.to_string()}}});
                if api
                    .patch("a1", &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .is_ok()
                {
                    last = Some(i);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            last
        });
        (done, task)
    };
    let first = migrate(&plane).await?;
    let (done, task) = writer;
    let _ = done.send(());
    let last = task.await?.ok_or("the writer wrote")?;
    assert!(
        first.contains(&format!(
            "{CRD}: 3 objects written in v1beta1, 0 changed by others meanwhile"
        )) || first.contains(&format!(
            "{CRD}: 2 objects written in v1beta1, 1 changed by others meanwhile"
        )),
        "{first}"
    );
    assert!(
        first.contains("storedVersions [v1alpha1, v1beta1] -> [v1beta1]"),
        "{first}"
    );
    assert!(
        first.contains(
            "postgresbackups.database.example.com: 1 objects written in v1alpha1, 0 changed by others meanwhile; storedVersions [v1alpha1] -> [v1alpha1]"
        ),
        "{first}"
    );
    assert_eq!(stored_versions(&crds).await?, ["v1beta1"]);
    let a1 = alpha_one.get("a1").await?;
    assert_eq!(
        a1.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("counter")),
        Some(&last.to_string()),
        "no write of the other client was lost"
    );

    // Again: nothing left to do, the same outcome.
    let second = migrate(&plane).await?;
    assert!(
        second.contains(&format!(
            "{CRD}: 3 objects written in v1beta1, 0 changed by others meanwhile; storedVersions [v1beta1] -> [v1beta1]"
        )),
        "{second}"
    );
    assert_eq!(stored_versions(&crds).await?, ["v1beta1"]);

    // The webhook down: every object reads from etcd (a GET; lists may come from a watch
    // cache of each version) in v1beta1 with no conversion, so each is stored as v1beta1;
    // in v1alpha1 each needs the webhook.
    let _ = stop.send(());
    server.await??;
    for (ns, name, instances) in [
        (one.name(), "a1", 1),
        (one.name(), "a2", 2),
        (two.name(), "b1", 3),
    ] {
        let beta: Api<v1beta1::PostgresCluster> = Api::namespaced(client.clone(), ns);
        let stored = beta.get(name).await?;
        assert_eq!(stored.spec.instances, instances);
        assert_eq!(
            stored.spec.backup.as_ref().map(|b| b.retention.days),
            Some(3)
        );
        let alpha: Api<PostgresCluster> = Api::namespaced(client.clone(), ns);
        let err = alpha
            .get(name)
            .await
            .expect_err("v1alpha1 needs the conversion webhook now");
        assert!(
            err.to_string().contains("conversion webhook"),
            "{name}: {err}"
        );
    }
    Ok(())
}
