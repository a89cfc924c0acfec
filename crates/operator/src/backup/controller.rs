//! The PostgresBackup controller: one backup, taken by an instance manager
//! (`POST /pg/backups` on the chosen instance), followed until it completes or fails.
//!
//! Pending -> Running (instance chosen: for a base backup the most caught-up ready
//! standby, else the primary; for a logical backup the primary) -> Completed (backup id,
//! LSNs, times, sizes, databases) or Failed (`error`). A finished backup is never looked
//! at again. After a completed backup the cluster's retention runs on the instance that
//! took it (`POST /pg/retention`: the manager mounts the store, whatever its kind): backups
//! older than `retentionDays` and the WAL only they need are deleted from the store, and
//! so are the PostgresBackup objects of the backups deleted.

use crate::Context;
use crate::cluster::probe;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use pgop_api::PostgresClusterStatus;
use pgop_api::backup::{BackupMethod, BackupPhase, PostgresBackup, PostgresBackupStatus};
use pgop_api::cluster::InstanceRole;
use pgop_api::constants::{FIELD_MANAGER, MANAGER_TLS_PORT, PATH_BACKUPS, PATH_RETENTION};
use pgop_api::instance_status::{
    BackupJob, BackupJobPhase, BackupRequest, RetentionDone, RetentionRequest, parse_lsn,
};
use pgop_api::v1beta1::PostgresCluster;
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
    #[error("failed to rename the owner of PostgresBackup {name} to {version}")]
    RenameOwner {
        name: String,
        version: &'static str,
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
            Error::RenameOwner { .. } => "RenameOwner",
            Error::NoNamespace => "NoNamespace",
        }
    }
}

/// How often a running backup is looked at.
const POLL: Duration = Duration::from_secs(2);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The instance to take a backup from: for a base backup the ready standby that replayed
/// the most WAL (ties: the lower serial), else the current primary; for a logical backup
/// the primary (a long `pg_dump` on a hot standby can be cancelled by recovery conflicts).
/// `None` when none is there, or during a change of primary.
pub fn choose_instance(status: &PostgresClusterStatus, method: BackupMethod) -> Option<String> {
    let standby = status
        .instances
        .iter()
        .filter(|_| method == BackupMethod::BaseBackup)
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

/// How often a backup of a cluster that another operator manages is looked at again.
const NOT_MANAGED_RECHECK: Duration = Duration::from_secs(60);

pub async fn reconcile(backup: Arc<PostgresBackup>, ctx: Arc<Context>) -> Result<Action, Error> {
    use tracing::Instrument;
    // A trace per pass, as the cluster's (pgop_telemetry): the manager's side of
    // `POST /pg/backups` joins it.
    let span = tracing::info_span!(
        parent: None,
        "reconcile backup",
        backup = %backup.name_any(),
        namespace = %backup.namespace().unwrap_or_default(),
        trace_id = tracing::field::Empty,
    );
    pgop_telemetry::record_trace_id(&span);
    reconcile_backup(backup, ctx).instrument(span).await
}

async fn reconcile_backup(backup: Arc<PostgresBackup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = backup.namespace().ok_or(Error::NoNamespace)?;
    let name = backup.name_any();
    let status = backup.status.clone().unwrap_or_default();
    // A scheduled backup made before v1beta1 names its cluster in v1alpha1: renamed first,
    // finished or not, so that v1alpha1 can stop being served (pgop_api::owner). The same
    // owner under another name, so whichever operator manages the cluster may do it.
    if rename_owner(&ctx, &backup, &namespace).await? {
        return Ok(Action::await_change());
    }
    if matches!(
        status.phase,
        Some(BackupPhase::Completed | BackupPhase::Failed)
    ) {
        return Ok(Action::await_change());
    }
    let clusters: Api<crate::ApiCluster> = Api::namespaced(ctx.client.clone(), &namespace);
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
    // Another operator's cluster (--cluster-selector): its operator takes the backup. Look
    // again later, in case the cluster is relabelled into this operator's selection.
    if !crate::selector::manages(ctx.cluster_selector.as_ref(), cluster.labels()) {
        tracing::debug!(backup = %name, cluster = %cluster_name, "the cluster is not managed here");
        return Ok(Action::requeue(NOT_MANAGED_RECHECK));
    }
    if let Some(replica) = cluster.spec.replica.as_ref().filter(|_| {
        pgop_api::replica::ReplicaSpec::follows_now(
            cluster.spec.replica.as_ref(),
            cluster.status.as_ref(),
        )
    }) {
        return fail(
            &ctx,
            &backup,
            status,
            format!(
                "PostgresCluster {cluster_name} is a replica cluster following {}: it takes no backups of its own until it is promoted (back up its source instead)",
                replica.source
            ),
        )
        .await;
    }

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
    let method = backup.spec.method.unwrap_or_default();
    let what = match method {
        BackupMethod::BaseBackup => "base backup",
        BackupMethod::Logical => "logical backup",
    };
    let (instance, status) = match (&status.phase, &status.instance) {
        (Some(BackupPhase::Running), Some(instance)) => (instance.clone(), status),
        _ => {
            let cluster_status = cluster.status.clone().unwrap_or_default();
            let Some(instance) = choose_instance(&cluster_status, method) else {
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
                &format!("taking a {what} of {cluster_name} on {instance}"),
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
    // State-changing requests go to the manager's mutual-TLS port only.
    let host = format!("{ip}:{MANAGER_TLS_PORT}");
    let tls = match ctx
        .manager_clients
        .for_cluster(&ctx.client, &namespace, cluster_name)
        .await
    {
        Ok(tls) => tls,
        Err(e) => {
            tracing::info!(backup = %name, error = %crate::error_chain(&e), "no client certificate for the instance managers yet; retrying");
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let verify = cluster.spec.backup.as_ref().is_some_and(|b| b.base.verify);
    let body = serde_json::to_vec(&BackupRequest {
        name: name.clone(),
        verify: verify && method == BackupMethod::BaseBackup,
        method,
    })
    .unwrap_or_default();
    // The request is idempotent: the same name returns the same job.
    let answer = probe::request_tls(&tls, &host, "POST", PATH_BACKUPS, Some(&body)).await;
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
            done.databases = job.databases.clone();
            done.error = None;
            patch_status(&ctx, &backup, &done).await?;
            let note = match method {
                BackupMethod::BaseBackup => format!(
                    "base backup {} of {cluster_name} completed on {instance}: {} bytes, WAL {} to {}",
                    job.backup_id.as_deref().unwrap_or("?"),
                    job.size_bytes.unwrap_or(0),
                    job.begin_lsn.as_deref().unwrap_or("?"),
                    job.end_lsn.as_deref().unwrap_or("?"),
                ),
                BackupMethod::Logical => format!(
                    "logical backup {} of {cluster_name} completed on {instance}: {} bytes, databases {}",
                    job.backup_id.as_deref().unwrap_or("?"),
                    job.size_bytes.unwrap_or(0),
                    job.databases.join(", "),
                ),
            };
            publish(&ctx, &backup, EventType::Normal, "Completed", &note).await;
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
            retention(&ctx, &cluster, &namespace, &tls, &host).await;
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

/// Renames the backup's ownerReference to its cluster to the current version
/// ([`pgop_api::owner::renamed`]); `true` when it wrote (the change wakes the backup again).
/// The patch carries the resourceVersion read, so that nobody else's change of the list
/// is lost: on a conflict the newer object comes through the watch and is looked at again.
async fn rename_owner(
    ctx: &Context,
    backup: &PostgresBackup,
    namespace: &str,
) -> Result<bool, Error> {
    let Some(owners) = pgop_api::owner::renamed(backup.owner_references()) else {
        return Ok(false);
    };
    let api: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": backup.resource_version(),
        "ownerReferences": owners,
    }});
    match api
        .patch(
            &backup.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(true),
        Err(source) => Err(Error::RenameOwner {
            name: backup.name_any(),
            version: pgop_api::constants::CLUSTER_OWNER_API_VERSION,
            source,
        }),
    }
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

/// Retention after a completed backup, run by the instance manager at `host` (it mounts
/// the store, whatever its kind); failures are logged and retried after the next backup
/// (the data stays, which is the safe side).
async fn retention(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    tls: &std::sync::Arc<rustls::ClientConfig>,
    host: &str,
) {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return;
    };
    let cluster_name = cluster.name_any();
    let request = RetentionRequest {
        retention_days: u32::try_from(spec.retention.days).unwrap_or(1).max(1),
    };
    let body = serde_json::to_vec(&request).unwrap_or_default();
    let done: RetentionDone = match probe::request_tls(
        tls,
        host,
        "POST",
        PATH_RETENTION,
        Some(&body),
    )
    .await
    {
        Ok((200, body)) => match serde_json::from_slice(&body) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(cluster = %cluster_name, error = %e, "unreadable retention answer");
                return;
            }
        },
        Ok((code, body)) => {
            tracing::warn!(cluster = %cluster_name, code, answer = %String::from_utf8_lossy(&body).trim(), "retention failed; the data is kept");
            return;
        }
        Err(e) => {
            tracing::warn!(cluster = %cluster_name, error = %e, "retention failed; the data is kept");
            return;
        }
    };
    if done.base_backups.is_empty() && done.logical_backups.is_empty() {
        return;
    }
    tracing::info!(cluster = %cluster_name, base = ?done.base_backups, logical = ?done.logical_backups, wal = done.wal_files, "retention removed old backups");
    // The objects of backups that are gone from the store go too.
    let backups: Api<PostgresBackup> = Api::namespaced(ctx.client.clone(), namespace);
    let Ok(list) = backups.list(&ListParams::default()).await else {
        return;
    };
    for b in list.items {
        if b.spec.cluster.name == cluster_name
            && removed_by(&done, &b)
            && let Err(e) = backups
                .delete(&b.name_any(), &DeleteParams::default())
                .await
        {
            tracing::warn!(backup = %b.name_any(), error = %e, "failed to delete the object of a removed backup");
        }
    }
}

/// Whether retention removed `backup`'s data (ids are per method: a base and a logical
/// backup taken in the same second share one).
fn removed_by(done: &RetentionDone, backup: &PostgresBackup) -> bool {
    let Some(id) = backup.status.as_ref().and_then(|s| s.backup_id.as_ref()) else {
        return false;
    };
    match backup.spec.method.unwrap_or_default() {
        BackupMethod::BaseBackup => done.base_backups.contains(id),
        BackupMethod::Logical => done.logical_backups.contains(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(yaml: &str) -> PostgresClusterStatus {
        serde_yaml::from_str(yaml).expect("status")
    }

    #[test]
    fn retention_removes_the_objects_of_its_own_method_only() {
        let backup = |method: &str, id: &str| -> PostgresBackup {
            serde_yaml::from_str(&format!(
                "apiVersion: database.example.com/v1alpha1\nkind: PostgresBackup\nmetadata: {{name: x}}\nspec: {{cluster: {{name: db}}{method}}}\nstatus: {{phase: Completed, backupId: '{id}'}}\n"
            ))
            .expect("backup")
        };
        let done = RetentionDone {
            base_backups: vec!["20261101T020000Z".into()],
            logical_backups: vec!["20261102T030000Z".into()],
            wal_files: 3,
        };
        assert!(removed_by(&done, &backup("", "20261101T020000Z")));
        assert!(!removed_by(
            &done,
            &backup(", method: logical", "20261101T020000Z")
        ));
        assert!(removed_by(
            &done,
            &backup(", method: logical", "20261102T030000Z")
        ));
        assert!(!removed_by(&done, &backup("", "20261102T030000Z")));
        assert!(!removed_by(&done, &backup("", "20261201T020000Z")));
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
        assert_eq!(
            choose_instance(&s, BackupMethod::BaseBackup).as_deref(),
            Some("db-3")
        );
        assert_eq!(
            choose_instance(&s, BackupMethod::Logical).as_deref(),
            Some("db-1"),
            "pg_dump runs on the primary"
        );
        let s = status(
            "{currentPrimary: db-1, targetPrimary: db-1, instances: [
              {name: db-1, serial: 1, role: primary, ready: true},
              {name: db-2, serial: 2, ready: false}]}",
        );
        assert_eq!(
            choose_instance(&s, BackupMethod::BaseBackup).as_deref(),
            Some("db-1")
        );
        let s = status(
            "{currentPrimary: db-1, targetPrimary: db-2, instances: [{name: db-1, serial: 1, ready: true}]}",
        );
        assert_eq!(
            choose_instance(&s, BackupMethod::BaseBackup),
            None,
            "no backup during a change of primary"
        );
    }
}
