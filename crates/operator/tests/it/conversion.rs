//! `v1beta1` against a real API server (testenv): objects stored by the `v1alpha1`-only
//! CRD are read as `v1beta1` once the CRD serves both, and objects written as `v1beta1`
//! read as `v1alpha1`, each way through the operator's conversion webhook over HTTPS
//! (the certificate pgop made, the `caBundle` pgop wrote into the CRD). The admission
//! webhooks read `v1beta1` objects as well. The `v1beta1`
//! schema's own CEL rules refuse with `v1beta1` field names; `kubectl get` and `kubectl
//! explain` work in both versions. With the webhook down, `v1alpha1` (the stored version)
//! is still served and `v1beta1` is not.
//!
//! Its own control plane: the CRD it installs converts through this test's webhook, which
//! other tests must not depend on.

use crate::common;

use common::*;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgop_api::{PostgresCluster, v1beta1};
use pgop_operator::webhook::{self, Config, Webhook, cert};
use pgop_testenv::{ControlPlane, Options, TestNamespace, wait};
use std::time::Duration;

const CRD: &str = "postgresclusters.database.example.com";

/// `kubectl explain` of `field` in `version` shows `expected` (the published OpenAPI
/// document follows the CRD a moment after it changes).
async fn explained(plane: &ControlPlane, field: &str, version: &str, expected: &str) -> Result {
    let normalize = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let api_version = format!("--api-version=database.example.com/{version}");
    wait::until(
        &format!("kubectl explain {field} in {version} to show {expected:?}"),
        Duration::from_secs(30),
        || {
            let api_version = api_version.clone();
            async move {
                let out = kubectl(plane, &["explain", field, &api_version])
                    .await
                    .map_err(|e| e.to_string())?;
                let text = normalize(&out);
                if text.contains(&normalize(expected)) {
                    Ok(())
                } else {
                    Err(text)
                }
            }
        },
    )
    .await?;
    Ok(())
}

fn refused<T: std::fmt::Debug>(result: kube::Result<T>) -> Result<String> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(e.message),
        other => Err(format!("expected the API server to refuse, got {other:?}").into()),
    }
}

#[tokio::test]
async fn objects_convert_between_v1alpha1_and_v1beta1_through_the_operators_webhook() -> Result {
    let plane = ControlPlane::start(Options::default()).await?;
    let client = plane.client()?;
    // The CRD of before: v1alpha1 only, and an object stored in it.
    pgop_testenv::crds::install(&client, pgop_api::crds_v1alpha1()).await?;
    let ns = TestNamespace::create(plane.config(), "conversion").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    let alpha: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    let old: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "old", "annotations": {"note": "a \"quoted\"\nvalue = # $(id)"}},
        "spec": {
            "replicas": 3, "postgresVersion": 15, "storage": {"size": "1Gi"},
            "replication": {"synchronous": 1, "dataDurability": "required"},
            "failoverDelay": 5,
            "affinity": {"podAntiAffinityType": "required"},
            "backup": {
                "schedule": "0 2 * * *", "logicalSchedule": "30 3 * * 0", "retentionDays": 7,
                "store": {"volume": {"claimName": "backups"}}
            }
        }
    }))?;
    alpha.create(&PostParams::default(), &old).await?;
    alpha
        .patch_status(
            "old",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Ready", "readyReplicas": 3}})),
        )
        .await?;

    // The operator's webhook server (conversion, and the admission webhooks for this
    // namespace), its certificate renewed at every check (the authority,
    // and so the CRD's caBundle, stays).
    let hooks = format!("pgop-conversion-{n}");
    let webhook = Webhook::bind(
        client.clone(),
        Config {
            listen: "127.0.0.1:0".parse()?,
            certificate: cert::Source::Managed(cert::Managed {
                namespace: n.to_string(),
                secret: "pgop-webhook-tls".into(),
                names: vec!["127.0.0.1".into()],
                configurations: vec![hooks.clone()],
                conversion_crds: vec![CRD.into()],
                conversion_client: None,
                validity_days: 1,
                renew_before_days: 2,
                check_every: Duration::from_millis(500),
            }),
        },
    )
    .await?;
    let metrics = std::sync::Arc::new(pgop_operator::metrics::Metrics::default());
    let webhook = webhook.with_metrics(metrics.clone());
    let port = webhook.local_addr().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook.run(async move {
        let _ = stopped.await;
    }));

    // The CRD upgraded: both versions served, conversion by the webhook.
    pgop_testenv::crds::install(
        &client,
        pgop_api::crds_with_v1beta1(
            WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}{}", webhook::CONVERT)),
                ..WebhookClientConfig::default()
            },
            pgop_api::StorageVersion::V1alpha1,
        ),
    )
    .await?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    validating
        .create(
            &PostParams::default(),
            &validating_configuration(&hooks, n, port)?,
        )
        .await?;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutating
        .create(
            &PostParams::default(),
            &mutating_configuration(&hooks, n, port)?,
        )
        .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let beta: Api<v1beta1::PostgresCluster> = Api::namespaced(client.clone(), n);
    let read = wait::until(
        "the old object to read as v1beta1 (the keeper wrote the caBundle)",
        TIMEOUT,
        || {
            let beta = beta.clone();
            async move { beta.get("old").await.map_err(|e| e.to_string()) }
        },
    )
    .await?;
    let bundle = crds
        .get(CRD)
        .await?
        .spec
        .conversion
        .and_then(|c| c.webhook)
        .and_then(|w| w.client_config)
        .and_then(|c| c.ca_bundle);
    assert!(
        bundle.is_some_and(|b| String::from_utf8_lossy(&b.0).contains("BEGIN CERTIFICATE")),
        "the keeper wrote the CRD's caBundle"
    );
    assert_eq!(
        read.spec,
        v1beta1::PostgresClusterSpec::from(old.spec.clone())
    );
    assert_eq!(read.spec.instances, 3);
    assert_eq!(read.spec.ha.failover_delay, 5);
    assert_eq!(read.spec.ha.synchronous.standbys, 1);
    let backup = read.spec.backup.clone().ok_or("a backup section")?;
    assert_eq!(backup.base.schedule.as_deref(), Some("0 2 * * *"));
    assert_eq!(backup.logical.schedule.as_deref(), Some("30 3 * * 0"));
    assert_eq!(backup.retention.days, 7);
    assert_eq!(read.metadata.annotations, old.metadata.annotations);
    assert_eq!(
        read.status.as_ref().map(|s| s.ready_replicas),
        Some(3),
        "the status converted with the object"
    );

    // Written as v1beta1, read as v1alpha1 and back.
    let new: v1beta1::PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": v1beta1::API_VERSION, "kind": "PostgresCluster",
        "metadata": {"name": "new"},
        "spec": {
            "instances": 2, "storage": {"size": "2Gi"},
            "postgresql": {"version": 15, "parameters": {"work_mem": "8MB"}},
            "ha": {"failoverDelay": 7, "synchronous": {"standbys": 1}},
            "scheduling": {"topologyKey": "topology.kubernetes.io/zone"},
            "backup": {
                "store": {"volume": {"claimName": "backups"}},
                "retention": {"days": 9}, "logical": {"schedule": "0 4 1 * *"}
            }
        }
    }))?;
    // The admission webhooks read v1beta1 too: the defaults written, and a refusal.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait::until("the defaulting webhook on v1beta1", TIMEOUT, || async {
        let c = beta
            .create(&dry_run, &new)
            .await
            .map_err(|e| e.to_string())?;
        c.spec
            .bootstrap
            .is_some()
            .then_some(())
            .ok_or_else(|| "no default yet".to_string())
    })
    .await?;
    let mut missing = new.clone();
    missing.spec.credentials.app_secret = Some("nowhere".into());
    let message = wait::until("the validating webhook on v1beta1", TIMEOUT, || async {
        match beta.create(&dry_run, &missing).await {
            Err(kube::Error::Api(e)) if e.message.contains("denied the request") => Ok(e.message),
            other => Err(format!("not refused yet: {other:?}")),
        }
    })
    .await?;
    assert!(
        message.contains("spec.credentials.appSecret") && message.contains("nowhere"),
        "{message}"
    );
    let created = beta.create(&PostParams::default(), &new).await?;
    let mut expected = new.spec.clone();
    expected.bootstrap = created.spec.bootstrap.clone();
    assert_eq!(
        serde_json::to_value(&created.spec.bootstrap)?,
        serde_json::json!({"initdb": {"database": "app", "owner": "app"}})
    );
    assert_eq!(
        created
            .spec
            .backup
            .as_ref()
            .and_then(|b| b.timezone.as_deref()),
        Some("UTC")
    );
    if let Some(backup) = expected.backup.as_mut() {
        backup.timezone = Some("UTC".into());
    }
    assert_eq!(
        created.spec, expected,
        "v1beta1 written and read unchanged but for the defaults"
    );
    let as_alpha = alpha.get("new").await?;
    assert_eq!(as_alpha.spec.replicas, 2);
    assert_eq!(as_alpha.spec.postgres_version, Some(15));
    assert_eq!(as_alpha.spec.failover_delay, 7);
    assert_eq!(as_alpha.spec.replication.synchronous, 1);
    assert_eq!(
        as_alpha.spec.affinity.topology_key,
        "topology.kubernetes.io/zone"
    );
    let alpha_backup = as_alpha.spec.backup.clone().ok_or("a backup section")?;
    assert_eq!(alpha_backup.retention_days, 9);
    assert_eq!(alpha_backup.logical_schedule.as_deref(), Some("0 4 1 * *"));
    assert_eq!(alpha_backup.schedule, None);
    // A change through v1alpha1 shows in v1beta1.
    alpha
        .patch(
            "new",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3, "switchoverTimeout": 120}})),
        )
        .await?;
    let changed = beta.get("new").await?;
    assert_eq!(changed.spec.instances, 3);
    assert_eq!(changed.spec.ha.switchover_timeout, 120);
    assert_eq!(changed.spec.ha.failover_delay, 7);

    // v1beta1's own rules, with v1beta1's field names.
    let mut bad = new.clone();
    bad.metadata.name = Some("bad".into());
    bad.spec.ha.synchronous.standbys = 2;
    let message = refused(beta.create(&PostParams::default(), &bad).await)?;
    assert!(
        message.contains("spec.ha.synchronous.standbys")
            && message.contains(pgop_api::cel::MSG_STANDBYS_BELOW_INSTANCES),
        "{message}"
    );
    let mut bad = new.clone();
    bad.metadata.name = Some("bad".into());
    bad.spec.backup =
        serde_json::from_value(serde_json::json!({"base": {"schedule": "0 1 * * *"}}))?;
    let message = refused(beta.create(&PostParams::default(), &bad).await)?;
    assert!(
        message.contains("spec.backup.store")
            && message.contains(pgop_api::cel::MSG_SCHEDULED_METHODS_NEED_STORE),
        "{message}"
    );
    let mut bad = new.clone();
    bad.metadata.name = Some("bad".into());
    bad.spec.instances = 12;
    let message = refused(beta.create(&PostParams::default(), &bad).await)?;
    assert!(message.contains("spec.instances"), "{message}");

    // kubectl, by either version (by the plural: kubectl drops the version of a short
    // name, `pgc.v1alpha1...` lists in the preferred version).
    let names = kubectl(
        &plane,
        &[
            "get",
            "pgc.v1alpha1.database.example.com",
            "-n",
            n,
            "-o",
            "name",
        ],
    )
    .await?;
    assert!(
        names.contains("postgrescluster.database.example.com/old")
            && names.contains("postgrescluster.database.example.com/new"),
        "{names}"
    );
    let replicas = kubectl(
        &plane,
        &[
            "get",
            "postgresclusters.v1alpha1.database.example.com",
            "new",
            "-n",
            n,
            "-o",
            "jsonpath={.apiVersion} {.spec.replicas}",
        ],
    )
    .await?;
    assert_eq!(replicas, "database.example.com/v1alpha1 3");
    let instances = kubectl(
        &plane,
        &[
            "get",
            "pgc.v1beta1.database.example.com",
            "new",
            "-n",
            n,
            "-o",
            "jsonpath={.spec.instances}",
        ],
    )
    .await?;
    assert_eq!(instances, "3");
    explained(
        &plane,
        "pgc.spec.ha.synchronous.standbys",
        "v1beta1",
        "Must be less than `spec.instances`.",
    )
    .await?;
    explained(
        &plane,
        "pgc.spec.replicas",
        "v1alpha1",
        "Each standby holds a WAL sender and a replication slot on the primary.",
    )
    .await?;

    let scraped = pgop_operator::metrics::encode(&[], &[], &metrics, None)?;
    assert!(
        scraped.lines().any(|l| l.starts_with(
            r#"pgop_operator_webhook_reviews_total{webhook="convert-postgresclusters",result="converted"} "#
        )),
        "{scraped}"
    );

    // The webhook down: the stored version is still served, v1beta1 is not.
    let _ = stop.send(());
    server.await??;
    assert_eq!(alpha.list(&Default::default()).await?.items.len(), 2);
    let err = beta
        .get("new")
        .await
        .expect_err("v1beta1 needs the conversion webhook");
    assert!(err.to_string().contains("conversion webhook"), "{err}");
    Ok(())
}
