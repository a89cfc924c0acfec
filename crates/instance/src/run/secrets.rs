//! What a pass reads of the cluster's Secrets, from their watch ([`super::watch`]): the
//! passwords of the application and replication users and of `spec.roles`, the manager's and
//! PostgreSQL's certificates, and the stores of WAL archiving and of a recovery with their
//! keys.

use super::watch::Inputs;
use super::{Error, RESTORE_TIMEOUT, Settings};
use crate::bootstrap::Credentials;
use crate::error_chain;
use crate::instance::{self, Instance};
use k8s_openapi::api::core::v1::Secret;
use pgop_api::cluster::{BackupStore, RecoverySource, RecoverySpec};
use pgop_api::v1beta1::PostgresCluster;
use std::sync::Arc;
use std::time::Duration;

/// WAL archiving as `spec.backup.store` asks: the store with its credentials read from the
/// Secret the spec names (S3) or the volume's mount path.
pub(super) async fn archiving(
    inputs: &Inputs,
    settings: &Settings,
    cluster: &PostgresCluster,
) -> Result<Option<instance::Archiving>, Error> {
    let Some(store) = cluster.spec.backup.as_ref().and_then(|b| b.store.as_ref()) else {
        return Ok(None);
    };
    let config = store_config(inputs, settings, store, &settings.cluster).await?;
    Ok(Some(instance::Archiving {
        store: config,
        pgop_binary: settings.pgop_binary.clone(),
    }))
}

/// What `spec.bootstrap.recovery` and `status.recoverySource` ask to restore: the source
/// cluster's store (credentials from the Secret its `s3.credentialsSecret` names, in this
/// namespace), the backup, the target.
pub(super) async fn recovery_of(
    inputs: &Inputs,
    settings: &Settings,
    spec: &RecoverySpec,
    source: &RecoverySource,
) -> Result<instance::Recovery, Error> {
    let config = store_config(inputs, settings, &source.store, &source.cluster).await?;
    Ok(instance::Recovery {
        source: config,
        backup_id: source.backup_id.clone(),
        target: recovery_target(spec),
        pgop_binary: settings.pgop_binary.clone(),
        timeout: RESTORE_TIMEOUT,
    })
}

/// The recovery target of `spec.bootstrap.recovery`: a time, an LSN, else the end of WAL.
pub fn recovery_target(spec: &RecoverySpec) -> pgop_backup::Target {
    match (&spec.target_time, &spec.target_lsn) {
        (Some(time), _) => pgop_backup::Target::Time(time.clone()),
        (None, Some(lsn)) => pgop_backup::Target::Lsn(lsn.clone()),
        (None, None) => pgop_backup::Target::EndOfWal,
    }
}

/// A store of the API resolved for `cluster`'s objects: S3 keys read from the Secret the
/// store names (in this namespace), a volume at its mount path.
pub(super) async fn store_config(
    inputs: &Inputs,
    settings: &Settings,
    store: &BackupStore,
    cluster: &str,
) -> Result<pgop_backup::StoreConfig, Error> {
    let keys = match &store.s3 {
        Some(s3) => {
            let name = &s3.credentials_secret.name;
            let (_, secret) = read_secret(inputs, name.clone()).await?;
            let (access_key_id, secret_access_key) = s3
                .credentials_secret
                .keys_in(&secret)
                .map_err(|key| Error::ReadStoreSecretKey {
                    name: name.clone(),
                    key,
                })?;
            Some(pgop_backup::S3Keys {
                access_key_id,
                secret_access_key,
            })
        }
        None => None,
    };
    pgop_backup::StoreConfig::from_api(store, cluster, keys.as_ref(), &settings.backup_volume_path)
        .map_err(Error::StoreConfig)
}

/// The source a replica cluster follows (`spec.replica`), made ready to connect to: the
/// entry's Secrets read from their watch, its files written in the socket directory
/// (outside PGDATA: a copy of the data never carries them). `Ok(None)`: no replica
/// cluster. `Err` names `spec.replica.source`, the field, the Secret and the key, never a
/// value.
pub(super) async fn replica_source(
    inputs: &Inputs,
    settings: &Settings,
    cluster: &PostgresCluster,
) -> Result<Option<crate::external::Source>, Error> {
    let Some(replica) = cluster
        .spec
        .replica
        .as_ref()
        .filter(|_| super::observe::replica_cluster(cluster))
    else {
        return Ok(None);
    };
    let unusable = |message: String| Error::ReplicaSource {
        source_name: replica.source.clone(),
        message,
    };
    let entry = cluster
        .spec
        .external_clusters
        .iter()
        .find(|e| e.name == replica.source)
        .filter(|e| e.connection.is_some() || e.store.is_some())
        .ok_or_else(|| {
            unusable(
                "no entry of spec.externalClusters with a connection or a store has this name"
                    .into(),
            )
        })?;
    let source = match &entry.connection {
        Some(connection) => {
            let mut secrets = std::collections::BTreeMap::new();
            let names = [
                connection.password_secret.as_ref().map(|s| &s.name),
                connection.ca_secret.as_ref().map(|s| &s.name),
                connection
                    .client_certificate_secret
                    .as_ref()
                    .map(|s| &s.name),
            ];
            for name in names.into_iter().flatten() {
                if let Ok(Some(secret)) = inputs.secrets.get(name).await {
                    secrets.insert(name.clone(), secret);
                }
            }
            let credentials = crate::external::Credentials::from_secrets(connection, |name| {
                secrets.get(name).map(|s| s.as_ref())
            })
            .map_err(unusable)?;
            crate::external::prepare(
                &settings.socket_dir,
                &replica.source,
                connection,
                &credentials,
                settings.run_as,
            )
            .map_err(|e| unusable(e.to_string()))?
        }
        None => crate::external::prepare_store_only(
            &settings.socket_dir,
            &replica.source,
            settings.run_as,
        )
        .map_err(|e| unusable(e.to_string()))?,
    };
    // The entry's store (S3): for WAL the source no longer has, or all it follows.
    let store = cluster
        .spec
        .external_clusters
        .iter()
        .find(|e| e.name == replica.source)
        .and_then(|e| e.store.as_ref())
        .filter(|s| s.s3.is_some());
    let Some(store) = store else {
        return Ok(Some(source));
    };
    let config = store_config(inputs, settings, &store.backup_store(), &store.cluster)
        .await
        .map_err(|e| unusable(format!("store: {}", crate::error_chain(&e))))?;
    let path = source.store_config_path();
    let owner = settings.run_as.map(|u| (u.uid, u.gid));
    config
        .write(&path, owner)
        .map_err(|e| unusable(format!("store: {e}")))?;
    Ok(Some(
        source.with_archive(path, settings.pgop_binary.clone()),
    ))
}

/// The cluster's Secrets, retried until the operator has created them.
pub(super) async fn wait_for_credentials(inputs: &Inputs, settings: &Settings) -> Credentials {
    loop {
        match read_credentials(inputs, settings).await {
            Ok(credentials) => return credentials,
            Err(err) => {
                tracing::info!(error = %error_chain(&err), "waiting for the cluster's Secrets")
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Secret `name` of the cluster's namespace, as its watch last saw it.
pub(super) async fn read_secret(
    inputs: &Inputs,
    name: String,
) -> Result<(String, Arc<Secret>), Error> {
    match inputs.secrets.get(&name).await {
        Ok(Some(secret)) => Ok((name, secret)),
        Ok(None) => Err(Error::NoSecret { name }),
        Err(source) => Err(Error::ReadSecret { name, source }),
    }
}

/// The password of each role of `spec.roles` with a `passwordSecret`, or why it could
/// not be read (reported for that role).
pub(super) async fn role_passwords(
    inputs: &Inputs,
    roles: &[pgop_api::roles::RoleSpec],
) -> std::collections::BTreeMap<String, crate::instance::RolePassword> {
    let mut out = std::collections::BTreeMap::new();
    for role in roles {
        let Some(secret) = &role.password_secret else {
            continue;
        };
        let password = read_secret(inputs, secret.name.clone())
            .await
            .and_then(|s| secret_text(&s, "password"))
            .map_err(|e| error_chain(&e));
        out.insert(role.name.clone(), password);
    }
    out
}

/// The text of `key` in a Secret read by [`read_secret`].
pub(super) fn secret_text(
    (name, secret): &(String, Arc<Secret>),
    key: &'static str,
) -> Result<String, Error> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .ok_or_else(|| Error::ReadSecretKey {
            name: name.clone(),
            key,
        })
}

/// The manager certificate, its key and the authority's certificate (PEM), from the
/// Secret `<cluster>-manager-tls` the operator keeps.
pub(super) async fn read_manager_tls(
    inputs: &Inputs,
    settings: &Settings,
) -> Result<(String, String, String), Error> {
    let name = format!(
        "{}{}",
        settings.cluster,
        pgop_api::constants::MANAGER_TLS_SECRET_SUFFIX
    );
    let secret = read_secret(inputs, name).await?;
    Ok((
        secret_text(&secret, "tls.crt")?,
        secret_text(&secret, "tls.key")?,
        secret_text(&secret, "ca.crt")?,
    ))
}

/// PostgreSQL's certificates from the Secrets `<cluster>-server-tls` and
/// `<cluster>-replication-tls` the operator keeps.
pub(super) async fn read_postgres_tls(
    inputs: &Inputs,
    settings: &Settings,
    allow_plaintext: bool,
) -> Result<crate::config::Tls, Error> {
    use pgop_api::constants::{REPLICATION_TLS_SECRET_SUFFIX, SERVER_TLS_SECRET_SUFFIX};
    let cluster = &settings.cluster;
    let server = read_secret(inputs, format!("{cluster}{SERVER_TLS_SECRET_SUFFIX}")).await?;
    let replication =
        read_secret(inputs, format!("{cluster}{REPLICATION_TLS_SECRET_SUFFIX}")).await?;
    Ok(crate::config::Tls {
        server_cert: secret_text(&server, "tls.crt")?,
        server_key: secret_text(&server, "tls.key")?,
        server_ca: secret_text(&server, "ca.crt")?,
        // The authorities of client certificates (an older operator's Secret has only
        // the replication certificate's).
        client_ca: secret_text(&replication, "client-ca.crt")
            .or_else(|_| secret_text(&replication, "ca.crt"))?,
        replication_cert: secret_text(&replication, "tls.crt")?,
        replication_key: secret_text(&replication, "tls.key")?,
        server_name: format!("{cluster}-rw"),
        allow_plaintext,
    })
}

pub(super) async fn read_credentials(
    inputs: &Inputs,
    settings: &Settings,
) -> Result<Credentials, Error> {
    let read = |name: String| read_secret(inputs, name);
    let key = secret_text;
    let app = read(format!("{}-app", settings.cluster)).await?;
    let replication = read(format!("{}-replication", settings.cluster)).await?;
    Ok(Credentials {
        app_user: key(&app, "username")?,
        app_password: key(&app, "password")?,
        app_database: key(&app, "dbname")?,
        replication_user: key(&replication, "username")?,
        replication_password: key(&replication, "password")?,
    })
}

/// Refreshes what the pass takes from the cluster's Secrets: the passwords (the Secrets may
/// have been generated anew), the superuser's (with `spec.credentials.superuserAccess`),
/// the TLS endpoint's certificate and PostgreSQL's certificates (renewed by the operator
/// ahead of their expiry). What cannot be read keeps what is known; false while
/// PostgreSQL's certificates were never read (PostgreSQL never starts without them).
pub(super) async fn refresh(
    inputs: &Inputs,
    settings: &Settings,
    instance: &Instance,
    material: &crate::tls::Material,
    cluster: &PostgresCluster,
) -> bool {
    // The Secrets may have been generated anew (deleted by hand): their passwords win.
    match read_credentials(inputs, settings).await {
        Ok(c) => instance.set_passwords(&c.app_password, &c.replication_password),
        Err(err) => {
            tracing::warn!(error = %error_chain(&err), "failed to read the cluster's Secrets; keeping the passwords known")
        }
    }
    // The superuser's password, with spec.credentials.superuserAccess only.
    if cluster.spec.credentials.superuser_access {
        let name = format!(
            "{}{}",
            settings.cluster,
            pgop_api::constants::SUPERUSER_SECRET_SUFFIX
        );
        match read_secret(inputs, name)
            .await
            .and_then(|secret| secret_text(&secret, "password"))
        {
            Ok(password) => instance.set_superuser(Some(&password)),
            Err(err) => {
                tracing::info!(error = %error_chain(&err), "failed to read the superuser Secret; keeping the superuser password known")
            }
        }
    } else {
        instance.set_superuser(None);
    }
    // The TLS endpoint's certificate: renewed by the operator ahead of its expiry.
    match read_manager_tls(inputs, settings).await {
        Ok((cert, key, ca)) => match material.load(&cert, &key, &ca) {
            Ok(true) => {
                tracing::info!("the TLS endpoint uses the certificate of the Secret from now on")
            }
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(error = %error_chain(&err), "the manager certificate's Secret holds no usable certificate; keeping the one in use")
            }
        },
        Err(err) if material.is_loaded() => {
            tracing::warn!(error = %error_chain(&err), "failed to read the manager certificate; keeping the one in use")
        }
        Err(err) => {
            tracing::info!(error = %error_chain(&err), "no manager certificate yet: backups wait for it")
        }
    }
    // PostgreSQL's certificates: renewed by the operator ahead of their expiry, reloaded
    // without a restart. PostgreSQL never starts without them.
    let allow_plaintext = cluster.spec.tls.allow_plaintext;
    match read_postgres_tls(inputs, settings, allow_plaintext).await {
        Ok(tls) => match instance.set_tls(tls) {
            Ok(true) => tracing::info!(
                allow_plaintext,
                "PostgreSQL's TLS files are written; PostgreSQL reads them at its next start or reload"
            ),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(error = %error_chain(&err), "failed to write PostgreSQL's TLS files")
            }
        },
        Err(err) if instance.has_tls() => {
            tracing::warn!(error = %error_chain(&err), "failed to read PostgreSQL's certificates; keeping the ones in use")
        }
        Err(err) => {
            tracing::info!(error = %error_chain(&err), "waiting for PostgreSQL's certificates");
            return false;
        }
    }
    true
}
