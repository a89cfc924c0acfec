//! What backups add to a PostgresCluster's reconcile: the recovery source of a restored
//! cluster, the schedules (base and logical), and the backup facts of its status
//! (`lastBackupTime`, `firstRecoverabilityPoint`, `lastLogicalBackupTime`, conditions
//! BackupSucceeded and ContinuousArchiving).

use super::schedule::Schedule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use pgop_api::backup::{
    BackupMethod, BackupPhase, ClusterReference, PostgresBackup, PostgresBackupSpec,
};
use pgop_api::cluster::RecoverySource;
use pgop_api::conditions::{self, new_condition, set_condition};
use pgop_api::constants::ANNOTATION_SCHEDULED;
use pgop_api::instance_status::PgStatus;
use pgop_api::v1beta1::PostgresCluster;
use pgop_api::{PostgresClusterStatus, labels};

/// The PostgresBackups of `cluster` among `all`.
pub fn of_cluster<'a>(all: &'a [PostgresBackup], cluster: &str) -> Vec<&'a PostgresBackup> {
    all.iter()
        .filter(|b| b.spec.cluster.name == cluster)
        .collect()
}

/// `lastBackupTime`, `firstRecoverabilityPoint` (base backups), `lastLogicalBackupTime`
/// and BackupSucceeded (false while the latest backup of either method failed) from the
/// cluster's backups (pure).
pub fn backup_status(
    backups: &[&PostgresBackup],
    status: &mut PostgresClusterStatus,
    generation: Option<i64>,
    now: Time,
) {
    let finished = |method, phase| {
        backups
            .iter()
            .filter(move |b| b.spec.method.unwrap_or_default() == method)
            .filter(move |b| b.status.as_ref().and_then(|s| s.phase) == Some(phase))
            .filter_map(|b| Some((b, b.status.as_ref()?.stopped_at.clone()?)))
    };
    let base = BackupMethod::BaseBackup;
    let logical = BackupMethod::Logical;
    status.last_backup_time = finished(base, BackupPhase::Completed).map(|(_, t)| t).max();
    status.first_recoverability_point =
        finished(base, BackupPhase::Completed).map(|(_, t)| t).min();
    status.last_logical_backup_time = finished(logical, BackupPhase::Completed)
        .map(|(_, t)| t)
        .max();
    let latest = |method| {
        finished(method, BackupPhase::Completed)
            .chain(finished(method, BackupPhase::Failed))
            .max_by_key(|(_, t)| t.clone())
    };
    // A failed latest backup of one method is not hidden by a success of the other.
    let latest = match (latest(base), latest(logical)) {
        (Some(a), Some(b)) => {
            let failed = |x: &(&&PostgresBackup, Time)| {
                x.0.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Failed)
            };
            match (failed(&a), failed(&b)) {
                (true, false) => Some(a),
                (false, true) => Some(b),
                _ => Some(if a.1 >= b.1 { a } else { b }),
            }
        }
        (a, b) => a.or(b),
    };
    if let Some((b, _)) = latest {
        let s = b.status.clone().unwrap_or_default();
        let condition = if s.phase == Some(BackupPhase::Completed) {
            new_condition(
                conditions::BACKUP_SUCCEEDED,
                true,
                "BackupCompleted",
                format!("the last backup, {}, completed", b.name_any()),
                generation,
                now.clone(),
            )
        } else {
            new_condition(
                conditions::BACKUP_SUCCEEDED,
                false,
                "BackupFailed",
                format!(
                    "the last backup, {}, failed: {}",
                    b.name_any(),
                    s.error.unwrap_or_default()
                ),
                generation,
                now.clone(),
            )
        };
        set_condition(&mut status.conditions, condition, now);
    }
}

/// ContinuousArchiving from what the primary reports; unchanged when it does not answer.
pub fn archiving_status(
    primary: Option<&PgStatus>,
    status: &mut PostgresClusterStatus,
    generation: Option<i64>,
    now: Time,
) {
    let Some(pg) = primary else {
        return;
    };
    let (ok, reason, message) = match &pg.archiving {
        Some(a) if a.configured && !a.failing => (
            true,
            "Archiving",
            match &a.last_archived_wal {
                Some(wal) => format!("WAL is archived; the last file was {wal}"),
                None => "WAL archiving is on; nothing archived yet".to_string(),
            },
        ),
        Some(a) if a.configured => (
            false,
            "ArchivingFailing",
            format!(
                "archiving {} failed ({} failures so far); PostgreSQL keeps the WAL and retries",
                a.last_failed_wal.as_deref().unwrap_or("a WAL file"),
                a.failed_count
            ),
        ),
        _ if pg.pending_restart => (
            false,
            "RestartPending",
            "archive_mode takes effect once the primary restarts".to_string(),
        ),
        _ => (
            false,
            "NotConfigured",
            "the primary does not archive WAL yet".to_string(),
        ),
    };
    set_condition(
        &mut status.conditions,
        new_condition(
            conditions::CONTINUOUS_ARCHIVING,
            ok,
            reason,
            message,
            generation,
            now.clone(),
        ),
        now,
    );
}

/// The recovery source of `spec.bootstrap.recovery`: a completed PostgresBackup (and its
/// cluster's store), or a store with the source cluster's name. `Err` says what is missing.
pub async fn resolve_recovery_source(
    client: &kube::Client,
    namespace: &str,
    cluster: &PostgresCluster,
) -> Result<Option<RecoverySource>, String> {
    let Some(recovery) = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.recovery.as_ref())
    else {
        return Ok(None);
    };
    if let (Some(store), Some(source)) = (&recovery.store, &recovery.source_cluster) {
        return Ok(Some(RecoverySource {
            cluster: source.clone(),
            store: store.clone(),
            backup_id: None,
        }));
    }
    let Some(name) = &recovery.backup else {
        return Err("spec.bootstrap.recovery names no backup and no store".to_string());
    };
    let backups: Api<PostgresBackup> = Api::namespaced(client.clone(), namespace);
    let backup = backups
        .get_opt(name)
        .await
        .map_err(|e| format!("failed to read PostgresBackup {name}: {e}"))?
        .ok_or_else(|| {
            format!("spec.bootstrap.recovery.backup: PostgresBackup {name} does not exist")
        })?;
    let status = backup.status.clone().unwrap_or_default();
    let Some(id) = status
        .backup_id
        .filter(|_| status.phase == Some(BackupPhase::Completed))
    else {
        return Err(format!(
            "spec.bootstrap.recovery.backup: PostgresBackup {name} has not completed"
        ));
    };
    let source = backup.spec.cluster.name.clone();
    let clusters: Api<crate::ApiCluster> = Api::namespaced(client.clone(), namespace);
    let source_cluster = clusters
        .get_opt(&source)
        .await
        .map_err(|e| format!("failed to read PostgresCluster {source}: {e}"))?
        .ok_or_else(|| {
            format!("PostgresCluster {source}, whose backup {name} is, no longer exists; restore from its store with spec.bootstrap.recovery.store and sourceCluster")
        })?;
    let store = source_cluster
        .spec
        .backup
        .and_then(|b| b.store)
        .ok_or_else(|| format!("PostgresCluster {source} has no spec.backup.store"))?;
    Ok(Some(RecoverySource {
        cluster: source,
        store,
        backup_id: Some(id),
    }))
}

/// The schedule of `method` in the cluster's spec: `schedule` or `logicalSchedule`.
pub fn schedule_of(cluster: &PostgresCluster, method: BackupMethod) -> Option<&str> {
    let spec = cluster.spec.backup.as_ref()?;
    match method {
        BackupMethod::BaseBackup => spec.base.schedule.as_deref(),
        BackupMethod::Logical => spec.logical.schedule.as_deref(),
    }
}

/// The scheduled backup of `method` due now, if any: its name
/// (`<cluster>-<YYYYMMDDhhmm>`, `<cluster>-logical-<YYYYMMDDhhmm>` for a logical one) and
/// firing time. The schedule counts from the newest scheduled backup of the same method
/// (or the cluster's creation), so an operator that was down catches up with one backup,
/// not one per missed firing.
pub fn due_backup(
    cluster: &PostgresCluster,
    backups: &[&PostgresBackup],
    method: BackupMethod,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Option<(String, k8s_openapi::jiff::Timestamp)>, super::schedule::Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(None);
    };
    let (Some(schedule), Some(_)) = (schedule_of(cluster, method), &spec.store) else {
        return Ok(None);
    };
    let field = match method {
        BackupMethod::BaseBackup => super::schedule::BASE_FIELD,
        BackupMethod::Logical => super::schedule::LOGICAL_FIELD,
    };
    let schedule = Schedule::parse(schedule, spec.timezone.as_deref()).map_err(|e| e.at(field))?;
    let created = |meta: &ObjectMeta| meta.creation_timestamp.as_ref().map(|t| t.0);
    let since = backups
        .iter()
        .filter(|b| b.annotations().contains_key(ANNOTATION_SCHEDULED))
        .filter(|b| b.spec.method.unwrap_or_default() == method)
        .filter_map(|b| created(&b.metadata))
        .max()
        .or_else(|| created(&cluster.metadata));
    let Some(since) = since else {
        return Ok(None);
    };
    match schedule.next_after(since) {
        Some(at) if at <= now => {
            let stamp = at.strftime("%Y%m%d%H%M").to_string();
            let name = match method {
                BackupMethod::BaseBackup => format!("{}-{stamp}", cluster.name_any()),
                BackupMethod::Logical => format!("{}-logical-{stamp}", cluster.name_any()),
            };
            Ok(Some((name, at)))
        }
        _ => Ok(None),
    }
}

/// How long from `now` until the next firing of either of the cluster's backup schedules
/// (plus a second, so that the firing is due when the pass comes); `None` without one.
pub fn until_next_firing(
    cluster: &PostgresCluster,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<std::time::Duration> {
    let spec = cluster.spec.backup.as_ref()?;
    spec.store.as_ref()?;
    [BackupMethod::BaseBackup, BackupMethod::Logical]
        .into_iter()
        .filter_map(|method| schedule_of(cluster, method))
        .filter_map(|schedule| Schedule::parse(schedule, spec.timezone.as_deref()).ok())
        .filter_map(|schedule| schedule.next_after(now))
        .filter_map(|at| std::time::Duration::try_from(at.duration_since(now)).ok())
        .min()
        .map(|d| d + std::time::Duration::from_secs(1))
}

/// Creates the scheduled PostgresBackup `name` of `method` (owned by the cluster, so that
/// the objects go with it; the data in the store stays). An existing one is fine.
pub async fn create_scheduled(
    client: &kube::Client,
    namespace: &str,
    cluster: &PostgresCluster,
    name: &str,
    method: BackupMethod,
) -> Result<bool, kube::Error> {
    let schedule = schedule_of(cluster, method).unwrap_or_default().to_string();
    create_owned(
        client,
        namespace,
        cluster,
        name,
        method,
        (ANNOTATION_SCHEDULED, schedule),
    )
    .await
}

/// Creates the PostgresBackup `name` of `cluster` (owned by it, not as controller, and
/// labelled with it) carrying `annotation`, which says who asked for it; `false` when it
/// exists already.
pub async fn create_owned(
    client: &kube::Client,
    namespace: &str,
    cluster: &PostgresCluster,
    name: &str,
    method: BackupMethod,
    annotation: (&str, String),
) -> Result<bool, kube::Error> {
    let owner = cluster
        .controller_owner_ref(&())
        .map(|mut o: OwnerReference| {
            // The version the cluster's other children name too (served by every CRD).
            o.api_version = pgop_api::constants::CLUSTER_OWNER_API_VERSION.to_string();
            o.controller = Some(false);
            o
        });
    let backup = PostgresBackup {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some([(labels::CLUSTER.to_string(), cluster.name_any())].into()),
            annotations: Some([(annotation.0.to_string(), annotation.1)].into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: PostgresBackupSpec {
            cluster: ClusterReference {
                name: cluster.name_any(),
            },
            method: (method != BackupMethod::BaseBackup).then_some(method),
        },
        status: None,
    };
    let api: Api<PostgresBackup> = Api::namespaced(client.clone(), namespace);
    match api.create(&PostParams::default(), &backup).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn backup(name: &str, yaml_status: &str, scheduled_at: Option<&str>) -> PostgresBackup {
        let mut b: PostgresBackup = serde_yaml::from_str(&format!(
            "apiVersion: database.example.com/v1alpha1\nkind: PostgresBackup\nmetadata: {{name: {name}}}\nspec: {{cluster: {{name: db}}}}\nstatus: {yaml_status}\n"
        ))
        .expect("backup");
        if let Some(at) = scheduled_at {
            b.metadata.creation_timestamp = Some(Time(at.parse().expect("time")));
            b.metadata.annotations =
                Some([(ANNOTATION_SCHEDULED.to_string(), "x".to_string())].into());
        }
        b
    }

    fn at(s: &str) -> Time {
        Time(s.parse().expect("time"))
    }

    #[test]
    fn last_backup_time_first_point_and_the_latest_outcome() {
        let a = backup(
            "a",
            "{phase: Completed, stoppedAt: '2026-11-01T02:00:00Z'}",
            None,
        );
        let b = backup(
            "b",
            "{phase: Completed, stoppedAt: '2026-11-02T02:00:00Z'}",
            None,
        );
        let c = backup(
            "c",
            "{phase: Failed, stoppedAt: '2026-11-03T02:00:00Z', error: disk on fire}",
            None,
        );
        let d = backup("d", "{phase: Running}", None);
        let mut s = PostgresClusterStatus::default();
        backup_status(&[&a, &b, &d], &mut s, Some(1), at("2026-11-03T00:00:00Z"));
        assert_eq!(s.last_backup_time, Some(at("2026-11-02T02:00:00Z")));
        assert_eq!(
            s.first_recoverability_point,
            Some(at("2026-11-01T02:00:00Z"))
        );
        assert!(conditions::is_true(
            &s.conditions,
            conditions::BACKUP_SUCCEEDED
        ));
        backup_status(
            &[&a, &b, &c, &d],
            &mut s,
            Some(1),
            at("2026-11-03T03:00:00Z"),
        );
        let cond = conditions::find_condition(&s.conditions, conditions::BACKUP_SUCCEEDED)
            .expect("condition");
        assert_eq!(cond.status, "False");
        assert!(cond.message.contains("disk on fire"), "{}", cond.message);
        assert_eq!(s.last_backup_time, Some(at("2026-11-02T02:00:00Z")));
    }

    #[test]
    fn logical_backups_have_their_own_time_and_a_failure_of_either_method_shows() {
        let base = backup(
            "base",
            "{phase: Completed, stoppedAt: '2026-11-02T02:00:00Z'}",
            None,
        );
        let mut dump = backup(
            "dump",
            "{phase: Completed, stoppedAt: '2026-11-01T03:00:00Z', databases: [app]}",
            None,
        );
        dump.spec.method = Some(BackupMethod::Logical);
        let mut s = PostgresClusterStatus::default();
        backup_status(&[&base, &dump], &mut s, None, at("2026-11-02T04:00:00Z"));
        assert_eq!(s.last_backup_time, Some(at("2026-11-02T02:00:00Z")));
        assert_eq!(
            s.first_recoverability_point,
            Some(at("2026-11-02T02:00:00Z")),
            "a logical backup is no recoverability point"
        );
        assert_eq!(s.last_logical_backup_time, Some(at("2026-11-01T03:00:00Z")));
        assert!(conditions::is_true(
            &s.conditions,
            conditions::BACKUP_SUCCEEDED
        ));
        // An older failed logical backup still shows, though a base backup succeeded since.
        let mut failed = backup(
            "dump2",
            "{phase: Failed, stoppedAt: '2026-11-01T04:00:00Z', error: pg_dump exited with 1}",
            None,
        );
        failed.spec.method = Some(BackupMethod::Logical);
        backup_status(
            &[&base, &dump, &failed],
            &mut s,
            None,
            at("2026-11-02T05:00:00Z"),
        );
        let c = conditions::find_condition(&s.conditions, conditions::BACKUP_SUCCEEDED)
            .expect("condition");
        assert_eq!(c.status, "False");
        assert!(c.message.contains("dump2"), "{}", c.message);
    }

    #[test]
    fn continuous_archiving_follows_the_primarys_archiver() {
        use pgop_api::instance_status::{ArchiveStatus, PgStatus};
        let mut pg = PgStatus::stopped("db-1", false);
        let archive = |failing: bool| ArchiveStatus {
            configured: true,
            failing,
            archived_count: 3,
            last_archived_wal: Some("000000010000000000000003".into()),
            last_archived_time: None,
            failed_count: if failing { 2 } else { 0 },
            last_failed_wal: failing.then(|| "000000010000000000000004".into()),
            last_failed_time: None,
        };
        let mut s = PostgresClusterStatus::default();
        pg.archiving = Some(archive(false));
        archiving_status(Some(&pg), &mut s, None, at("2026-11-29T10:00:00Z"));
        assert!(conditions::is_true(
            &s.conditions,
            conditions::CONTINUOUS_ARCHIVING
        ));
        pg.archiving = Some(archive(true));
        archiving_status(Some(&pg), &mut s, None, at("2026-11-29T10:01:00Z"));
        let c = conditions::find_condition(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
            .expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ArchivingFailing")
        );
        assert!(
            c.message.contains("000000010000000000000004"),
            "{}",
            c.message
        );
        // A primary that does not answer changes nothing.
        archiving_status(None, &mut s, None, at("2026-11-29T10:02:00Z"));
        let again = conditions::find_condition(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
            .expect("condition");
        assert_eq!(again.reason, "ArchivingFailing");
    }

    fn cluster(schedule: &str) -> PostgresCluster {
        let mut c: PostgresCluster = serde_yaml::from_str(&format!(
            "apiVersion: database.example.com/v1beta1\nkind: PostgresCluster\nmetadata: {{name: db, uid: u1}}\nspec: {{storage: {{size: 1Gi}}, backup: {{base: {{schedule: '{schedule}'}}, store: {{volume: {{claimName: b}}}}}}}}\n"
        ))
        .expect("cluster");
        c.metadata.creation_timestamp = Some(at("2026-11-29T10:00:30Z"));
        c
    }

    #[test]
    fn the_schedule_fires_once_per_time_and_catches_up_only_once() {
        let c = cluster("0 * * * *");
        let now = |s: &str| s.parse::<Timestamp>().expect("time");
        assert_eq!(
            due_backup(
                &c,
                &[],
                BackupMethod::BaseBackup,
                now("2026-11-29T10:59:00Z")
            )
            .expect("ok"),
            None
        );
        let (name, when) = due_backup(
            &c,
            &[],
            BackupMethod::BaseBackup,
            now("2026-11-29T11:00:01Z"),
        )
        .expect("ok")
        .expect("due");
        assert_eq!(name, "db-202611291100");
        assert_eq!(when.to_string(), "2026-11-29T11:00:00Z");
        // Made at 11:00:02: the next is at 12:00.
        let made = backup("db-202611291100", "{}", Some("2026-11-29T11:00:02Z"));
        assert_eq!(
            due_backup(
                &c,
                &[&made],
                BackupMethod::BaseBackup,
                now("2026-11-29T11:30:00Z")
            )
            .expect("ok"),
            None
        );
        // Down from 11:30 to 15:10: one backup, for 12:00, then the schedule goes on from it.
        let (name, _) = due_backup(
            &c,
            &[&made],
            BackupMethod::BaseBackup,
            now("2026-11-29T15:10:00Z"),
        )
        .expect("ok")
        .expect("due");
        assert_eq!(name, "db-202611291200");
        // The logical schedule counts its own backups only.
        let mut both = cluster("0 * * *");
        if let Some(b) = both.spec.backup.as_mut() {
            b.base.schedule = Some("0 * * * *".into());
            b.logical.schedule = Some("30 * * * *".into());
        }
        let logical = BackupMethod::Logical;
        let (name, _) = due_backup(&both, &[&made], logical, now("2026-11-29T11:31:00Z"))
            .expect("ok")
            .expect("due");
        assert_eq!(name, "db-logical-202611291030");
        let mut dumped = backup(
            "db-logical-202611291130",
            "{}",
            Some("2026-11-29T11:30:01Z"),
        );
        dumped.spec.method = Some(logical);
        assert_eq!(
            due_backup(
                &both,
                &[&made, &dumped],
                logical,
                now("2026-11-29T12:10:00Z")
            )
            .expect("ok"),
            None
        );
        assert_eq!(
            due_backup(
                &both,
                &[&made, &dumped],
                BackupMethod::BaseBackup,
                now("2026-11-29T12:10:00Z")
            )
            .expect("ok")
            .map(|(n, _)| n),
            Some("db-202611291200".to_string()),
            "a logical backup does not move the base schedule"
        );
        let bad = cluster("0 * * *");
        assert!(
            due_backup(
                &bad,
                &[],
                BackupMethod::BaseBackup,
                now("2026-11-29T15:10:00Z")
            )
            .is_err()
        );
    }
}
