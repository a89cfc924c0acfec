//! The validating webhooks against a real API server (testenv): the API server calls
//! pgop's webhook over HTTPS with the certificate pgop made and the `caBundle` pgop wrote
//! into the configuration, and every rule refuses with its field named. The serving
//! certificate is renewed at every check here (validity 1 day, renewed 2 days ahead), so
//! every request flows while certificates rotate. With the webhook down
//! (`failurePolicy: Ignore`) the API server admits a bad change, and the controller's own
//! validation stops it.
//!
//! The configuration matches only this test's namespace: the control plane is shared.

use crate::common;

use common::*;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pgop_api::cluster::ClusterPhase;
use pgop_api::{PostgresBackup, PostgresCluster};
use pgop_operator::webhook::{Config, Webhook, cert};
use std::time::Duration;

fn with_store(name: &str, secret: &str) -> Result<PostgresCluster> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "storage": {"size": "1Gi"},
            "backup": {"store": {"s3": {"bucket": "backups", "credentialsSecret": {"name": secret}}}}
        }
    }))?)
}

fn backup_of(name: &str, cluster: &str) -> Result<PostgresBackup> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresBackup",
        "metadata": {"name": name},
        "spec": {"cluster": {"name": cluster}}
    }))?)
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// The API server's refusal of a request pgop's webhook denied: its message.
fn denied<T: std::fmt::Debug>(result: kube::Result<T>) -> Result<String> {
    match result {
        Err(kube::Error::Api(e)) if e.message.contains("denied the request") => Ok(e.message),
        other => Err(format!("expected the webhook to refuse, got {other:?}").into()),
    }
}

#[tokio::test]
async fn the_webhooks_refuse_with_the_field_named_while_certificates_rotate() -> Result {
    let (_plane, client, ns) = setup("webhook").await?;
    let n = ns.name();
    let vwc_name = format!("pgop-test-{n}");
    let webhook = Webhook::bind(
        client.clone(),
        Config {
            listen: "127.0.0.1:0".parse()?,
            certificate: cert::Source::Managed(cert::Managed {
                namespace: n.to_string(),
                secret: "pgop-webhook-tls".into(),
                names: vec!["127.0.0.1".into()],
                configurations: vec![vwc_name.clone()],
                conversion_crds: Vec::new(),
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
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    configurations
        .create(
            &PostParams::default(),
            &validating_configuration(&vwc_name, n, port)?,
        )
        .await?;
    let mutations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mutations
        .create(
            &PostParams::default(),
            &mutating_configuration(&vwc_name, n, port)?,
        )
        .await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(webhook.run(async move {
        let _ = stopped.await;
    }));
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    let backups: Api<PostgresBackup> = Api::namespaced(client.clone(), n);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), n);

    // Until pgop wrote the caBundle the API server cannot call it, and (Ignore) admits.
    let missing = with_store("nosecret", "s3-credentials")?;
    let message = pgop_testenv::wait::until("the webhook refusing", TIMEOUT, || async {
        denied(clusters.create(&dry_run(), &missing).await).map_err(|e| e.to_string())
    })
    .await?;
    assert!(
        message.contains(
            "spec.backup.store.s3.credentialsSecret.name: Secret \"s3-credentials\" does not exist"
        ),
        "{message}"
    );
    let first_cert = secrets.get("pgop-webhook-tls").await?.data;

    // A Secret without its keys; then with them, and the cluster is created.
    let mut s3: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s3-credentials"},
        "stringData": {"AWS_ACCESS_KEY_ID": "id"}
    }))?;
    secrets.create(&PostParams::default(), &s3).await?;
    let message = denied(clusters.create(&dry_run(), &missing).await)?;
    assert!(
        message.contains("spec.backup.store.s3.credentialsSecret: Secret \"s3-credentials\"")
            && message.contains("AWS_SECRET_ACCESS_KEY"),
        "{message}"
    );
    s3.string_data = Some(
        [
            ("AWS_ACCESS_KEY_ID".to_string(), "id".to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), "key".to_string()),
        ]
        .into(),
    );
    secrets
        .replace("s3-credentials", &PostParams::default(), &s3)
        .await?;
    let created = clusters.create(&PostParams::default(), &missing).await?;

    // Defaults the schema cannot express are written into the object, and two appliers
    // of the same manifest see no drift.
    let manifest = with_store("applied", "s3-credentials")?;
    pgop_testenv::wait::until("the defaulting webhook", TIMEOUT, || async {
        let c = clusters
            .create(&dry_run(), &manifest)
            .await
            .map_err(|e| e.to_string())?;
        c.spec
            .bootstrap
            .is_some()
            .then_some(())
            .ok_or_else(|| "no default yet".to_string())
    })
    .await?;
    let apply = |manager: &str| PatchParams::apply(manager);
    let first = clusters
        .patch("applied", &apply("alice"), &Patch::Apply(&manifest))
        .await?;
    assert_eq!(
        serde_json::to_value(&first.spec.bootstrap)?,
        serde_json::json!({"initdb": {"database": "app", "owner": "app"}})
    );
    assert_eq!(
        first
            .spec
            .backup
            .as_ref()
            .and_then(|b| b.timezone.as_deref()),
        Some("UTC")
    );
    for manager in ["bob", "alice", "bob"] {
        let again = clusters
            .patch("applied", &apply(manager), &Patch::Apply(&manifest))
            .await?;
        assert_eq!(again.spec, first.spec, "applied by {manager}: no drift");
        assert_eq!(again.metadata.generation, first.metadata.generation);
    }

    // Changes pgop cannot carry out, each refused by name; a label is fine.
    let patch = |v: serde_json::Value| Patch::Merge(v);
    let pp = PatchParams::default();
    let message = denied(
        clusters
            .patch(
                "nosecret",
                &pp,
                &patch(serde_json::json!({"spec": {"storage": {"size": "512Mi"}}})),
            )
            .await,
    )?;
    assert!(
        message.contains("spec.storage.size: may only grow: 512Mi is smaller than 1Gi"),
        "{message}"
    );
    let message = denied(
        clusters
            .patch(
                "nosecret",
                &pp,
                &patch(
                    serde_json::json!({"spec": {"bootstrap": {"initdb": null, "recovery": {"backup": "nightly"}}}}),
                ),
            )
            .await,
    )?;
    assert!(
        message.contains("spec.bootstrap: may not change"),
        "{message}"
    );
    clusters
        .patch(
            "nosecret",
            &pp,
            &patch(serde_json::json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await?;
    clusters
        .patch(
            "nosecret",
            &pp,
            &patch(serde_json::json!({"spec": {"storage": {"size": "2Gi"}}})),
        )
        .await?;

    // A restore from a backup that does not exist; backups of clusters that cannot take them.
    let mut restore = cluster("restored", 1);
    restore.spec.bootstrap = Some(serde_json::from_value(
        serde_json::json!({"recovery": {"backup": "nightly"}}),
    )?);
    let message = denied(clusters.create(&dry_run(), &restore).await)?;
    assert!(
        message
            .contains("spec.bootstrap.recovery.backup: PostgresBackup \"nightly\" does not exist"),
        "{message}"
    );
    let message = denied(
        backups
            .create(&dry_run(), &backup_of("b1", "elsewhere")?)
            .await,
    )?;
    assert!(
        message.contains("spec.cluster.name: PostgresCluster \"elsewhere\" does not exist"),
        "{message}"
    );
    clusters
        .create(&PostParams::default(), &cluster("nostore", 1))
        .await?;
    let message = denied(
        backups
            .create(&dry_run(), &backup_of("b2", "nostore")?)
            .await,
    )?;
    assert!(message.contains("has no spec.backup.store"), "{message}");
    backups
        .create(&dry_run(), &backup_of("b3", "nosecret")?)
        .await?;

    // Requests flow while the certificate is renewed every half second.
    for i in 0..20 {
        denied(clusters.create(&dry_run(), &restore).await)
            .map_err(|e| format!("request {i} during rotation: {e}"))?;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_ne!(
        secrets.get("pgop-webhook-tls").await?.data,
        first_cert,
        "the certificate was renewed"
    );

    // Every review counted by webhook and result, and the certificate's expiry reported.
    let scraped = pgop_operator::metrics::encode(&[], &[], &metrics, None)?;
    let count = |series: &str| -> u64 {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(
        count(
            r#"pgop_operator_webhook_reviews_total{webhook="validate-postgresclusters",result="refused"} "#
        ) >= 25,
        "{scraped}"
    );
    assert!(
        count(
            r#"pgop_operator_webhook_reviews_total{webhook="validate-postgresbackups",result="refused"} "#
        ) >= 2,
        "{scraped}"
    );
    assert!(
        count(
            r#"pgop_operator_webhook_reviews_total{webhook="default-postgresclusters",result="patched"} "#
        ) >= 1,
        "{scraped}"
    );
    assert!(
        scraped.contains("pgop_operator_webhook_certificate_expiry_timestamp_seconds "),
        "{scraped}"
    );

    // The webhook down: the API server admits (failurePolicy Ignore), and the controller
    // stops a spec below its volumes.
    let _ = stop.send(());
    serving.await??;
    let op = Operator::start(&client, n);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), n);
    pgop_testenv::wait::until("the volume", TIMEOUT, || async {
        match pvcs.get_opt("nosecret-1").await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    clusters.create(&dry_run(), &restore).await?;
    clusters
        .patch(
            "nosecret",
            &pp,
            &patch(serde_json::json!({"spec": {"storage": {"size": "1Gi"}}})),
        )
        .await?;
    let invalid = pgop_testenv::wait::until("phase Invalid", TIMEOUT, || async {
        let c = clusters.get("nosecret").await.map_err(|e| e.to_string())?;
        match c.status.as_ref().and_then(|s| s.phase) {
            Some(ClusterPhase::Invalid) => Ok(c),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let message = invalid
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == "SpecValid")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("spec.storage.size: may only grow: 1Gi is smaller than 2Gi"),
        "{message}"
    );
    op.stop().await;
    assert_eq!(created.name_any(), "nosecret");
    configurations
        .delete(&vwc_name, &DeleteParams::default())
        .await?;
    mutations
        .delete(&vwc_name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Two replicas starting at once, with no Secret yet: one authority wins, both serve the
/// certificate it signed, and the caBundle is that authority's, whichever replica wrote
/// the configuration last.
#[tokio::test]
async fn two_replicas_starting_at_once_agree_on_one_certificate() -> Result {
    let (_plane, client, ns) = setup("webhook-two").await?;
    let n = ns.name();
    let name = format!("pgop-test-{n}");
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    // Never called: nothing is created in the namespace it matches.
    configurations
        .create(
            &PostParams::default(),
            &validating_configuration(&name, n, 1)?,
        )
        .await?;
    let managed = cert::Managed {
        namespace: n.to_string(),
        secret: "pgop-webhook-tls".into(),
        names: vec!["127.0.0.1".into()],
        configurations: vec![name.clone()],
        conversion_crds: Vec::new(),
        conversion_client: None,
        validity_days: 90,
        renew_before_days: 30,
        check_every: Duration::from_secs(60),
    };
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let keeper = tokio::spawn(cert::keep(
            client.clone(),
            cert::Source::Managed(managed.clone()),
            tx,
            None,
        ));
        replicas.push((keeper, rx));
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), n);
    pgop_testenv::wait::until("one authority everywhere", TIMEOUT, || async {
        let secret = secrets
            .get_opt("pgop-webhook-tls")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no Secret yet")?;
        let data = secret.data.unwrap_or_default();
        let ca = data.get("ca.crt").map(|b| b.0.clone());
        let bundles: Vec<Option<Vec<u8>>> = configurations
            .get(&name)
            .await
            .map_err(|e| e.to_string())?
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0))
            .collect();
        let serving = replicas.iter().all(|(_, rx)| rx.borrow().is_some());
        if ca.is_some() && bundles.iter().all(|b| *b == ca) && serving {
            Ok(())
        } else {
            Err(format!(
                "serving {serving}, bundles agree {}",
                bundles.iter().all(|b| *b == ca)
            ))
        }
    })
    .await?;
    // Both stay with it: nothing is written again.
    let settled = secrets
        .get("pgop-webhook-tls")
        .await?
        .metadata
        .resource_version;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        secrets
            .get("pgop-webhook-tls")
            .await?
            .metadata
            .resource_version,
        settled
    );
    for (keeper, _) in replicas {
        keeper.abort();
    }
    configurations
        .delete(&name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// The operator serves the webhooks from the start, whether it leads or not: here another
/// replica holds the leader Lease, so the controllers wait, and the webhooks still refuse
/// a bad spec, counted on this replica's /metrics. With `--cluster-selector`, a cluster it
/// does not select is left to the release that manages it (allowed, counted as skipped).
#[tokio::test]
async fn a_replica_waiting_for_leadership_serves_the_webhooks() -> Result {
    use k8s_openapi::api::coordination::v1::Lease;
    let (_plane, client, ns) = setup("webhook-standby").await?;
    let n = ns.name();
    let leases: Api<Lease> = Api::namespaced(client.clone(), n);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pgop-operator"},
                "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
                         "acquireTime": now, "renewTime": now}
            }))?,
        )
        .await?;
    let name = format!("pgop-test-{n}");
    let operator = pgop_operator::Operator::bind(
        client.clone(),
        pgop_operator::Options {
            namespaces: vec![n.to_string()],
            metrics_bind_address: Some("127.0.0.1:0".parse()?),
            leader_election: Some(pgop_operator::LeaderElection::new(n, "this-replica")),
            cluster_selector: Some(pgop_operator::selector::parse("channel=canary")?),
            webhook: Some(Config {
                listen: "127.0.0.1:0".parse()?,
                certificate: cert::Source::Managed(cert::Managed {
                    namespace: n.to_string(),
                    secret: "pgop-webhook-tls".into(),
                    names: vec!["127.0.0.1".into()],
                    configurations: vec![name.clone()],
                    conversion_crds: Vec::new(),
                    conversion_client: None,
                    validity_days: 90,
                    renew_before_days: 30,
                    check_every: Duration::from_secs(60),
                }),
            }),
            ..pgop_operator::Options::default()
        },
    )
    .await?;
    let port = operator
        .webhook_address()
        .ok_or("no webhook address")?
        .port();
    let metrics = operator.metrics_address().ok_or("no metrics address")?;
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    configurations
        .create(
            &PostParams::default(),
            &validating_configuration(&name, n, port)?,
        )
        .await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(operator.run(async move {
        let _ = stopped.await;
    }));

    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), n);
    let mut missing = with_store("db", "s3-credentials")?;
    missing
        .labels_mut()
        .insert("channel".into(), "canary".into());
    let message = pgop_testenv::wait::until("the webhook refusing", TIMEOUT, || async {
        denied(clusters.create(&dry_run(), &missing).await).map_err(|e| e.to_string())
    })
    .await?;
    assert!(
        message.contains("spec.backup.store.s3.credentialsSecret.name"),
        "{message}"
    );
    // A cluster its --cluster-selector does not select is another release's to review.
    let others = with_store("theirs", "s3-credentials")?;
    clusters.create(&dry_run(), &others).await?;
    let (code, body) =
        pgop_operator::cluster::probe::request(&metrics.to_string(), "GET", "/metrics", None)
            .await?;
    assert_eq!(code, 200);
    let scraped = String::from_utf8_lossy(&body);
    assert!(scraped.contains("pgop_operator_leader 0"), "{scraped}");
    for result in ["refused", "skipped"] {
        assert!(
            scraped.contains(&format!(
                r#"pgop_operator_webhook_reviews_total{{webhook="validate-postgresclusters",result="{result}"}}"#
            )),
            "{scraped}"
        );
    }
    let _ = stop.send(());
    running.await??;
    configurations
        .delete(&name, &DeleteParams::default())
        .await?;
    Ok(())
}
