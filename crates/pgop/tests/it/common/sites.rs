//! Two sites for replica clusters: site B's cluster follows site A's, reaching it at its
//! primary's Pod address (a loopback address the harness owns) with site A's authority and
//! replication certificate, copied to site B as a user would copy them.

use super::{Env, Result, secret};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Creates cluster `name` of one instance in site `a` with `spec` (storage added), waits
/// until it is Ready, and returns its application password and its primary's address.
pub async fn source(a: &Env, name: &str, mut spec: serde_json::Value) -> Result<(String, String)> {
    spec["replicas"] = json!(1);
    spec["storage"] = json!({"size": "1Gi"});
    a.create(name, spec).await?;
    a.wait_ready(name, 1).await?;
    let password = a.password(name).await?;
    let ip = a.pod_ip(&a.current_primary(name).await?).await?;
    Ok((password, ip))
}

/// Secret `source` of site `from`, copied to site `to` as `name` (only `keys`).
pub async fn copy_secret(from: &Env, to: &Env, source: &str, name: &str, keys: &[&str]) -> Result {
    let original = Api::<Secret>::namespaced(from.client.clone(), from.n())
        .get(source)
        .await?;
    let data = original.data.unwrap_or_default();
    let mut copied = Vec::new();
    for key in keys {
        let value = data.get(*key).ok_or(format!("{source} has no {key}"))?;
        copied.push((*key, String::from_utf8(value.0.clone())?));
    }
    let pairs: Vec<(&str, &str)> = copied.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Api::<Secret>::namespaced(to.client.clone(), to.n())
        .create(&PostParams::default(), &secret(name, &pairs))
        .await?;
    Ok(())
}

/// The `site-a` entry of `spec.externalClusters` for a source at `host`: site A's
/// replication user with its certificate (`site-a-replication`), verified against its
/// authority (`site-a-ca`) only, since an address is no name its certificate carries.
pub fn site_a(host: &str) -> serde_json::Value {
    json!({"name": "site-a", "connection": {
        "host": host, "user": "streaming_replica", "sslMode": "verify-ca",
        "caSecret": {"name": "site-a-ca"},
        "clientCertificateSecret": {"name": "site-a-replication"}}})
}

/// Creates in site `b` a replica cluster `name` of `instances` that follows the ready
/// cluster `name` of site `a` (its Secrets copied first), and waits until it is Ready.
/// Returns the address of site A's primary.
pub async fn follow(a: &Env, b: &Env, name: &str, instances: i32) -> Result<String> {
    follow_with(a, b, name, instances, json!({})).await
}

/// [`follow`] with `extra` fields in the `site-a` entry (a `store`, say).
pub async fn follow_with(
    a: &Env,
    b: &Env,
    name: &str,
    instances: i32,
    extra: serde_json::Value,
) -> Result<String> {
    let source = a.pod_ip(&a.current_primary(name).await?).await?;
    copy_secret(a, b, &format!("{name}-app"), "site-a-ca", &["ca.crt"]).await?;
    copy_secret(
        a,
        b,
        &format!("{name}-replication-tls"),
        "site-a-replication",
        &["tls.crt", "tls.key"],
    )
    .await?;
    let mut entry = site_a(&source);
    if let (Some(entry), Some(extra)) = (entry.as_object_mut(), extra.as_object()) {
        entry.extend(extra.clone());
    }
    b.create(
        name,
        json!({
            "replicas": instances,
            "storage": {"size": "1Gi"},
            "externalClusters": [entry],
            "replica": {"source": "site-a"},
        }),
    )
    .await?;
    b.wait_ready(name, instances).await?;
    Ok(source)
}

/// The store of site A in `s3` (path `site-a`), with its keys as Secret `s3` in each of
/// `sites`; returned as `spec.backup.store` (add `cluster` for an entry's store).
pub async fn s3_store(
    s3: &pgop_testenv::s3::S3Server,
    sites: &[&Env],
) -> Result<serde_json::Value> {
    use pgop_testenv::s3::{ACCESS_KEY, BUCKET, SECRET_KEY};
    for env in sites {
        let keys = secret(
            "s3",
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ],
        );
        Api::<Secret>::namespaced(env.client.clone(), env.n())
            .create(&PostParams::default(), &keys)
            .await?;
    }
    Ok(
        json!({"s3": {"bucket": BUCKET, "endpoint": s3.endpoint(), "region": "us-east-1",
        "path": "site-a", "credentialsSecret": {"name": "s3"}}}),
    )
}

/// A connection as the superuser of cluster `db` of site `env` (its `spec.credentials`
/// `superuserAccess: true`) to `host`, its primary's address.
pub async fn superuser(env: &Env, host: &str) -> Result<tokio_postgres::Client> {
    let data = Api::<Secret>::namespaced(env.client.clone(), env.n())
        .get("db-superuser")
        .await?
        .data
        .and_then(|d| d.get("password").cloned())
        .ok_or("db-superuser has no password")?;
    let password = String::from_utf8(data.0)?;
    super::connect_to(
        host,
        "app",
        "postgres",
        &password,
        std::time::Duration::from_secs(5),
    )
    .await
}

/// A PostgresBackup `name` of cluster `db` in site `env`, waited for until Completed.
pub async fn base_backup(env: &Env, name: &str) -> Result {
    let backup: pgop_api::PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresBackup",
        "metadata": {"name": name}, "spec": {"cluster": {"name": "db"}}}))?;
    let backups: kube::Api<pgop_api::PostgresBackup> =
        kube::Api::namespaced(env.client.clone(), env.n());
    backups.create(&Default::default(), &backup).await?;
    let backups = &backups;
    pgop_testenv::wait::until("the base backup completed", super::TIMEOUT, || async move {
        let b = backups.get(name).await.map_err(|e| e.to_string())?;
        match b.status.unwrap_or_default().phase {
            Some(pgop_api::backup::BackupPhase::Completed) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}
