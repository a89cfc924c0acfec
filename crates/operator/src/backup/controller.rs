//! The PostgresBackup controller: one base backup, taken by an instance manager
//! (`POST /pg/backups` on the chosen instance), followed until it completes or fails.
//!
//! Pending -> Running (instance chosen: the most caught-up ready standby, else the
//! primary) -> Completed (backup id, LSNs, times, sizes) or Failed (`error`). A finished
//! backup is never looked at again. After a completed backup the cluster's retention runs
//! (S3 stores): backups older than `retentionDays` and the WAL only they need are deleted
//! from the store, and so are the PostgresBackup objects of the backups deleted.

use crate::Context;
use crate::cluster::probe;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use pgop_api::backup::{BackupPhase, PostgresBackup, PostgresBackupStatus};
use pgop_api::cluster::{BackupStore, InstanceRole};
use pgop_api::constants::{FIELD_MANAGER, MANAGER_PORT, PATH_BACKUPS};
use pgop_api::instance_status::{BackupJob, BackupJobPhase, BackupRequest, parse_lsn};
use pgop_api::{PostgresCluster, PostgresClusterStatus};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read {what}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to patch the status of PostgresBackup {name}")]
    PatchStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the PostgresBackup has no namespace")]
    NoNamespace,
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Read { .. } => "Read",
            Error::PatchStatus { .. } => "PatchStatus",
            Error::NoNamespace => "NoNamespace",
        }
    }
}

/// How often a running backup is looked at.
const POLL: Duration = Duration::from_secs(2);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The instance to take a backup from: the ready standby that replayed the most WAL (ties:
/// the lower serial), else the current primary; `None` when neither is there.
pub fn choose_instance(status: &PostgresClusterStatus) -> Option<String> {
    let standby = status
        .instances
        .iter()
        .filter(|i| i.ready && i.role == Some(InstanceRole::Replica))
        .max_by_key(|i| {
            (
                i.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0),
                -i.serial,
            )
        });
    match standby {
        Some(s) => Some(s.name.clone()),
        None => status
            .current_primary
            .clone()
            .filter(|_| status.current_primary == status.target_primary)
            .filter(|p| status.instances.iter().any(|i| i.name == *p && i.ready)),
    }
}

pub async fn reconcile(backup: Arc<PostgresBackup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = backup.namespace().ok_or(Error::NoNamespace)?;
    let name = backup.name_any();
    let status = backup.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(BackupPhase::Completed | BackupPhase::Failed)
    ) {
        return Ok(Action::await_change());
    }
    let clusters: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let cluster_name = &backup.spec.cluster.name;
    let cluster = clusters
        .get_opt(cluster_name)
        .await
        .map_err(|source| Error::Read {
            what: format!("PostgresCluster {cluster_name}"),
            source,
        })?;
    let Some(cluster) = cluster else {
        return fail(
            &ctx,
            &backup,
            status,
            format!("spec.cluster.name: PostgresCluster {cluster_name} does not exist in namespace {namespace}"),
        )
        .await;
    };
    if cluster
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.store.as_ref())
        .is_none()
    {
        return fail(
            &ctx,
            &backup,
            status,
            format!(
                "PostgresCluster {cluster_name} has no spec.backup.store to write the backup to"
            ),
        )
        .await;
    }

    // Pending -> Running: choose the instance once and keep it.
    let (instance, status) = match (&status.phase, &status.instance) {
        (Some(BackupPhase::Running), Some(instance)) => (instance.clone(), status),
        _ => {
            let cluster_status = cluster.status.clone().unwrap_or_default();
            let Some(instance) = choose_instance(&cluster_status) else {
                let mut pending = status.clone();
                pending.phase = Some(BackupPhase::Pending);
                pending.error = Some(format!(
                    "waiting for a ready instance of PostgresCluster {cluster_name}"
                ));
                patch_status(&ctx, &backup, &pending).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            };
            let mut running = status.clone();
            running.phase = Some(BackupPhase::Running);
            running.started_at = Some(now());
            running.instance = Some(instance.clone());
            running.error = None;
            patch_status(&ctx, &backup, &running).await?;
            publish(
                &ctx,
                &backup,
                EventType::Normal,
                "Started",
                &format!("taking a base backup of {cluster_name} on {instance}"),
            )
            .await;
            (instance, running)
        }
    };

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let pod = pods
        .get_opt(&instance)
        .await
        .map_err(|source| Error::Read {
            what: format!("Pod {instance}"),
            source,
        })?;
    let Some(ip) = pod.and_then(|p| p.status).and_then(|s| s.pod_ip) else {
        return fail(
            &ctx,
            &backup,
            status,
            format!("instance {instance} disappeared during the backup"),
        )
        .await;
    };
    let host = format!("{ip}:{MANAGER_PORT}");
    let verify = cluster.spec.backup.as_ref().is_some_and(|b| b.verify);
    let body = serde_json::to_vec(&BackupRequest {
        name: name.clone(),
        verify,
    })
    .unwrap_or_default();
    // The request is idempotent: the same name returns the same job.
    let answer = probe::request(&host, "POST", PATH_BACKUPS, Some(&body)).await;
    let job: BackupJob = match answer {
        Ok((200 | 202, body)) => match serde_json::from_slice(&body) {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(backup = %name, error = %e, "unreadable backup job; retrying");
                return Ok(Action::requeue(POLL));
            }
        },
        Ok((400, body)) => {
            return fail(
                &ctx,
                &backup,
                status,
                String::from_utf8_lossy(&body).trim().to_string(),
            )
            .await;
        }
        Ok((code, body)) => {
            // 409: another backup runs there; 503: PostgreSQL is not running. Both pass.
            tracing::info!(backup = %name, %instance, code, answer = %String::from_utf8_lossy(&body).trim(), "backup not started yet");
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        Err(e) => {
            tracing::info!(backup = %name, %instance, error = %e, "instance manager unreachable; retrying");
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    match job.phase {
        BackupJobPhase::Running => Ok(Action::requeue(POLL)),
        BackupJobPhase::Failed => {
            let error = job
                .error
                .unwrap_or_else(|| "the instance manager reported a failure".to_string());
            fail(&ctx, &backup, status, error).await
        }
        BackupJobPhase::Completed => {
            let mut done = status;
            done.phase = Some(BackupPhase::Completed);
            done.stopped_at = Some(now());
            done.backup_id = job.backup_id.clone();
            done.begin_lsn = job.begin_lsn.clone();
            done.end_lsn = job.end_lsn.clone();
            done.timeline = job.timeline;
            done.size_bytes = job.size_bytes;
            done.stored_bytes = job.stored_bytes;
            done.verified = job.verified;
            done.verification = job.verification.clone();
            done.error = None;
            patch_status(&ctx, &backup, &done).await?;
            publish(
                &ctx,
                &backup,
                EventType::Normal,
                "Completed",
                &format!(
                    "base backup {} of {cluster_name} completed on {instance}: {} bytes, WAL {} to {}",
                    job.backup_id.as_deref().unwrap_or("?"),
                    job.size_bytes.unwrap_or(0),
                    job.begin_lsn.as_deref().unwrap_or("?"),
                    job.end_lsn.as_deref().unwrap_or("?"),
                ),
            )
            .await;
            if job.verified == Some(false) {
                let note = format!(
                    "backup {name} cannot be restored: {}",
                    job.verification.as_deref().unwrap_or("verification failed")
                );
                publish(
                    &ctx,
                    &backup,
                    EventType::Warning,
                    "VerificationFailed",
                    &note,
                )
                .await;
            }
            retention(&ctx, &cluster, &namespace).await;
            Ok(Action::await_change())
        }
    }
}

pub fn error_policy(backup: Arc<PostgresBackup>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "backup/{}/{}",
        backup.namespace().unwrap_or_default(),
        backup.name_any()
    );
    let delay = ctx.backoff.next_delay(&key);
    tracing::warn!(backup = %key, reason = error.metric_label(), error = %crate::error_chain(error), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn fail(
    ctx: &Context,
    backup: &PostgresBackup,
    mut status: PostgresBackupStatus,
    error: String,
) -> Result<Action, Error> {
    status.phase = Some(BackupPhase::Failed);
    status.stopped_at = Some(now());
    status.error = Some(error.clone());
    patch_status(ctx, backup, &status).await?;
    publish(ctx, backup, EventType::Warning, "Failed", &error).await;
    Ok(Action::await_change())
}

async fn patch_status(
    ctx: &Context,
    backup: &PostgresBackup,
    status: &PostgresBackupStatus,
) -> Result<(), Error> {
    if backup.status.as_ref() == Some(status) {
        return Ok(());
    }
    let namespace = backup.namespace().unwrap_or_default();
    let api: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": pgop_api::constants::API_VERSION,
        "kind": "PostgresBackup",
        "status": status,
    });
    api.patch_status(
        &backup.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| Error::PatchStatus {
        name: backup.name_any(),
        source,
    })?;
    Ok(())
}

async fn publish(
    ctx: &Context,
    backup: &PostgresBackup,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: "Backup".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &backup.object_ref(&())).await {
        tracing::warn!(backup = %backup.name_any(), reason, error = %e, "failed to publish event");
    }
}

/// The S3 keys of `store`, from the Secret it names.
pub async fn s3_keys(
    client: &kube::Client,
    namespace: &str,
    store: &BackupStore,
) -> Result<Option<pgop_backup::S3Keys>, String> {
    let Some(s3) = &store.s3 else {
        return Ok(None);
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let name = &s3.credentials_secret.name;
    let secret = secrets
        .get(name)
        .await
        .map_err(|e| format!("failed to read Secret {name}: {e}"))?;
    let (access_key_id, secret_access_key) = s3
        .credentials_secret
        .keys_in(&secret)
        .map_err(|key| format!("Secret {name} has no key {key}"))?;
    Ok(Some(pgop_backup::S3Keys {
        access_key_id,
        secret_access_key,
    }))
}

/// Retention of an S3 store after a completed backup; failures are logged and retried
/// after the next backup (the data stays, which is the safe side).
async fn retention(ctx: &Context, cluster: &PostgresCluster, namespace: &str) {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return;
    };
    let Some(store) = spec.store.as_ref().filter(|s| s.s3.is_some()) else {
        return; // a volume store is not mounted in the operator: see docs/backup.md
    };
    let cluster_name = cluster.name_any();
    let result = async {
        let keys = s3_keys(&ctx.client, namespace, store).await?;
        let config = pgop_backup::StoreConfig::from_api(
            store,
            &cluster_name,
            keys.as_ref(),
            std::path::Path::new("/nonexistent"),
        )
        .map_err(|e| crate::error_chain(&e))?;
        let store = pgop_backup::Store::open(&config).map_err(|e| crate::error_chain(&e))?;
        let days = u32::try_from(spec.retention_days).unwrap_or(1).max(1);
        pgop_backup::retention::apply(&store, k8s_openapi::jiff::Timestamp::now(), days)
            .await
            .map_err(|e| crate::error_chain(&e))
    }
    .await;
    let plan = match result {
        Ok(plan) => plan,
        Err(e) => {
            tracing::warn!(cluster = %cluster_name, error = %e, "retention failed; the data is kept");
            return;
        }
    };
    if plan.delete_backups.is_empty() {
        return;
    }
    tracing::info!(cluster = %cluster_name, deleted = ?plan.delete_backups, wal = plan.delete_wal.len(), "retention removed old backups");
    // The objects of backups that are gone from the store go too.
    let backups: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), namespace);
    let Ok(list) = backups.list(&ListParams::default()).await else {
        return;
    };
    for b in list.items {
        let gone = b.spec.cluster.name == cluster_name
            && b.status
                .as_ref()
                .and_then(|s| s.backup_id.as_ref())
                .is_some_and(|id| plan.delete_backups.contains(id));
        if gone
            && let Err(e) = backups
                .delete(&b.name_any(), &DeleteParams::default())
                .await
        {
            tracing::warn!(backup = %b.name_any(), error = %e, "failed to delete the object of a removed backup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(yaml: &str) -> PostgresClusterStatus {
        serde_yaml::from_str(yaml).expect("status")
    }

    #[test]
    fn the_most_caught_up_ready_standby_else_the_primary() {
        let s = status(
            "{currentPrimary: db-1, targetPrimary: db-1, instances: [
              {name: db-1, serial: 1, role: primary, ready: true},
              {name: db-2, serial: 2, role: replica, ready: true, replayedLsn: 0/5000000},
              {name: db-3, serial: 3, role: replica, ready: true, replayedLsn: 0/6000000},
              {name: db-4, serial: 4, role: replica, ready: false, replayedLsn: 0/7000000}]}",
        );
        assert_eq!(choose_instance(&s).as_deref(), Some("db-3"));
        let s = status(
            "{currentPrimary: db-1, targetPrimary: db-1, instances: [
              {name: db-1, serial: 1, role: primary, ready: true},
              {name: db-2, serial: 2, ready: false}]}",
        );
        assert_eq!(choose_instance(&s).as_deref(), Some("db-1"));
        let s = status(
            "{currentPrimary: db-1, targetPrimary: db-2, instances: [{name: db-1, serial: 1, ready: true}]}",
        );
        assert_eq!(
            choose_instance(&s),
            None,
            "no backup during a change of primary"
        );
    }
}
