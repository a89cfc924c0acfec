//! Step 8: the status of an ordinary pass and the Events of its changes, decided from what
//! the pass observed and the decisions before it. [`super::super::write`] writes the status
//! and publishes the Events, in this order.

use super::Rollout;
use super::computed as status;
use super::serials as instances;
use super::{roles, storage, upgrade};
use crate::backup;
use crate::cluster::build;
use crate::cluster::notes::Note;
use crate::cluster::world::{self, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster::RecoverySource;
use pgop_api::instance_status::VolumeUsage;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;
use std::time::Duration;

/// What step 8 decides from.
pub(in crate::cluster) struct StatusInput<'a> {
    pub cluster: &'a PostgresCluster,
    pub defaulted: &'a PostgresCluster,
    pub plan: &'a instances::Plan,
    pub observed: &'a world::Observed,
    pub probes: &'a BTreeMap<String, Probe>,
    pub roles: &'a roles::Roles,
    pub rollout: &'a Rollout,
    pub backups: Option<&'a [pgop_api::backup::PostgresBackup]>,
    /// The recovery source resolved in this pass (`observe::recovery_source`).
    pub recovery: Option<Result<Option<RecoverySource>, String>>,
    pub major: i32,
    pub upgrade: &'a upgrade::Decision,
    pub storage: &'a storage::Storage,
    pub usage: &'a [(&'a str, VolumeUsage)],
}

/// Step 8's decision: the status, the Events of what changed (in the order they are
/// published), and when WAL positions held back from the status are due.
pub(in crate::cluster) struct StatusDecision {
    pub status: PostgresClusterStatus,
    pub notes: Vec<Note>,
    pub positions_due: Option<Duration>,
}

/// Step 8: the status (with the backup facts), and the Events of its changed conditions,
/// of an upgrade, of a hibernation's end, of refused roles and databases, of auto-grow, of
/// the instances and of the roles' decisions.
pub(in crate::cluster) fn status(input: StatusInput<'_>, now: &Time) -> StatusDecision {
    let StatusInput {
        cluster,
        defaulted,
        plan,
        observed,
        probes,
        roles,
        rollout,
        backups,
        recovery,
        major,
        upgrade,
        storage,
        usage,
    } = input;
    let seen = status::Observations {
        pods: &observed.pods,
        probes,
        roles,
    };
    let (mut status, positions_due) = status::compute(cluster, plan, &seen, now.clone());
    status.postgres_version = Some(major);
    upgrade::set_status(&mut status, upgrade, cluster.metadata.generation, now);
    let upgrade_event = upgrade::event(cluster.status.as_ref(), &status);
    status.restart_instance = rollout.restart_instance.clone();
    status.restart_requested = rollout.restart_requested.clone();
    status.instance_restarts = rollout.instance_restarts.clone();
    status::set_rollout_blocked(
        &mut status,
        rollout.blocked.clone(),
        cluster.metadata.generation,
        now.clone(),
    );
    backup_facts(
        defaulted,
        probes,
        roles,
        backups,
        recovery,
        &mut status,
        now,
    );
    super::replica::set_replica(defaulted, probes, cluster.status.as_ref(), &mut status, now);
    // Each condition with an Event: its type, the status that is bad, the Events' reasons
    // when it turns bad and when it turns good again.
    use pgop_api::conditions::{
        CONFIGURATION_APPLIED, INSTANCES_SCHEDULED, REPLICA_FOLLOWING, ROLLOUT_BLOCKED,
    };
    let conditions = [
        (
            CONFIGURATION_APPLIED,
            false,
            ("ConfigurationRefused", "ConfigurationApplied"),
        ),
        (ROLLOUT_BLOCKED, true, ("RolloutBlocked", "RolloutResumed")),
        (
            INSTANCES_SCHEDULED,
            false,
            ("InstancesUnschedulable", "InstancesScheduled"),
        ),
        (
            REPLICA_FOLLOWING,
            false,
            ("ReplicaNotFollowing", "ReplicaFollowing"),
        ),
    ]
    .map(|(type_, bad_when, reasons)| {
        let event = condition_event(cluster.status.as_ref(), &status, type_, bad_when, reasons)?;
        // ReplicaFollowing's reasons are told apart (the recorder keeps one series per
        // action: a source refusing for another reason is a new Event, with its own note).
        let action = (type_ == REPLICA_FOLLOWING)
            .then(|| pgop_api::conditions::find_condition(&status.conditions, type_))
            .flatten()
            .map(|c| c.reason.clone());
        Some((event, action))
    });
    status.auto_grow = storage.record.clone();
    status.poolers = build::pooler::status(
        &cluster.name_any(),
        &defaulted.spec.poolers,
        &observed.deployments,
    );
    set_volumes_resized(
        cluster,
        &mut status,
        storage,
        &observed.pvcs,
        usage,
        None,
        now,
    );
    let resumed = hibernation_event(cluster.status.as_ref(), &status);
    let promotion = super::replica::promotion_event(cluster.status.as_ref(), &status);
    let instance_events = status::instance_events(cluster.status.as_ref(), &status);
    let refused: Vec<(&str, String)> = [&status::ROLES, &status::DATABASES]
        .into_iter()
        .filter_map(|what| declared_event(what, cluster.status.as_ref(), &status))
        .collect();

    let mut notes = Vec::new();
    if let Some((kind, reason, message)) = upgrade_event {
        notes.push(Note::new(kind, reason, message));
    }
    for ((kind, reason, message), action) in conditions.into_iter().flatten() {
        let note = Note::new(kind, reason, message);
        notes.push(match action {
            Some(action) => note.action(action),
            None => note,
        });
    }
    if let Some((kind, reason, message)) = promotion {
        notes.push(Note::new(kind, reason, message));
    }
    if let Some((reason, message)) = resumed {
        notes.push(Note::new(EventType::Normal, reason, message));
    }
    for (reason, message) in refused {
        notes.push(Note::new(EventType::Warning, reason, message));
    }
    if let Some(message) = &storage.grown {
        notes.push(Note::new(EventType::Normal, "VolumeAutoGrown", message));
    }
    if let Some(message) = &storage.at_limit {
        notes.push(Note::new(
            EventType::Warning,
            "VolumeAutoGrowLimit",
            message,
        ));
    }
    for e in instance_events {
        let kind = if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        notes.push(
            Note::new(kind, e.reason, e.note)
                .action(e.action)
                .about(Some(e.instance)),
        );
    }
    for note in &roles.notes {
        let kind = if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        notes.push(Note::new(kind, note.reason, &note.message).about(note.instance.clone()));
    }
    StatusDecision {
        status,
        notes,
        positions_due,
    }
}

/// The backup facts of the status: the recovery source of a restored cluster (`recovery`,
/// resolved once: while it cannot be, Progressing says why), a failed bootstrap, and with a
/// backup section lastBackupTime, firstRecoverabilityPoint, BackupSucceeded and
/// ContinuousArchiving.
fn backup_facts(
    cluster: &PostgresCluster,
    probes: &BTreeMap<String, Probe>,
    roles: &roles::Roles,
    backups: Option<&[pgop_api::backup::PostgresBackup]>,
    recovery: Option<Result<Option<RecoverySource>, String>>,
    status: &mut PostgresClusterStatus,
    now: &Time,
) {
    let generation = cluster.metadata.generation;
    let spec = &cluster.spec;
    match recovery {
        Some(Ok(source)) if status.recovery_source.is_none() => status.recovery_source = source,
        Some(Err(why)) if status.recovery_source.is_none() => {
            pgop_api::conditions::set_condition(
                &mut status.conditions,
                pgop_api::conditions::new_condition(
                    pgop_api::conditions::PROGRESSING,
                    true,
                    "WaitingForRecoverySource",
                    why,
                    generation,
                    now.clone(),
                ),
                now.clone(),
            );
        }
        _ => {}
    }
    // A restore (or another bootstrap) that fails shows here, not only in the pod's log.
    let bootstrap_error = probes
        .get(&roles.target)
        .and_then(Probe::status)
        .and_then(|s| s.bootstrap_error.clone());
    if let Some(error) = bootstrap_error {
        pgop_api::conditions::set_condition(
            &mut status.conditions,
            pgop_api::conditions::new_condition(
                pgop_api::conditions::PROGRESSING,
                true,
                "BootstrapFailed",
                format!("{}: {error}", roles.target),
                generation,
                now.clone(),
            ),
            now.clone(),
        );
    }
    let Some(backups) = backups else {
        return;
    };
    let mine: Vec<&pgop_api::backup::PostgresBackup> = backups.iter().collect();
    backup::cluster::backup_status(&mine, status, generation, now.clone());
    if spec.backup.as_ref().is_some_and(|b| b.store.is_some()) && !roles.in_transition() {
        let primary = probes.get(&roles.current).and_then(Probe::status);
        backup::cluster::archiving_status(primary, status, generation, now.clone());
    }
}

/// The `VolumesResized` condition (see [`storage::resized`]), once the cluster has claims.
/// `refused` is the API server's refusal in this pass; without it, a refusal on record
/// stands while the claims still ask for less.
pub(in crate::cluster) fn set_volumes_resized(
    cluster: &PostgresCluster,
    status: &mut PostgresClusterStatus,
    storage: &storage::Storage,
    pvcs: &[k8s_openapi::api::core::v1::PersistentVolumeClaim],
    usage: &[(&str, VolumeUsage)],
    refused: Option<&str>,
    now: &Time,
) -> bool {
    use pgop_api::conditions::{VOLUMES_RESIZED, find_condition, new_condition, set_condition};
    if pvcs.is_empty() {
        return false;
    }
    let on_record = cluster
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, VOLUMES_RESIZED))
        .filter(|c| c.reason == "ResizeRefused")
        .map(|c| c.message.as_str());
    let (ok, reason, message) = storage::resized(storage, pvcs, usage, refused.or(on_record));
    let generation = cluster.metadata.generation;
    set_condition(
        &mut status.conditions,
        new_condition(
            VOLUMES_RESIZED,
            ok,
            reason,
            message,
            generation,
            now.clone(),
        ),
        now.clone(),
    )
}

/// The Event for a change of a condition: a Warning (`reasons.0`) when it turns bad (its
/// status is `bad_when`) or stays bad with another message, a Normal one (`reasons.1`)
/// when it turns good again.
pub(in crate::cluster) fn condition_event(
    old: Option<&PostgresClusterStatus>,
    new: &PostgresClusterStatus,
    type_: &str,
    bad_when: bool,
    reasons: (&'static str, &'static str),
) -> Option<(EventType, &'static str, String)> {
    use pgop_api::conditions::{FALSE, TRUE, find_condition};
    let bad = if bad_when { TRUE } else { FALSE };
    let before = old.and_then(|s| find_condition(&s.conditions, type_));
    let after = find_condition(&new.conditions, type_)?;
    let was_bad = before.is_some_and(|c| c.status == bad);
    if after.status == bad {
        let same = before.is_some_and(|c| c.status == bad && c.message == after.message);
        (!same).then(|| (EventType::Warning, reasons.0, after.message.clone()))
    } else {
        was_bad.then(|| (EventType::Normal, reasons.1, after.message.clone()))
    }
}

/// The Event for a change of the Hibernated condition's reason (Hibernating, Hibernated,
/// Resuming, Resumed): Normal, the reason and message of the condition.
pub(in crate::cluster) fn hibernation_event(
    old: Option<&PostgresClusterStatus>,
    new: &PostgresClusterStatus,
) -> Option<(String, String)> {
    use pgop_api::conditions::{HIBERNATED, find_condition};
    let before = old.and_then(|s| find_condition(&s.conditions, HIBERNATED));
    let after = find_condition(&new.conditions, HIBERNATED)?;
    if before.is_some_and(|b| b.reason == after.reason) {
        return None;
    }
    Some((after.reason.clone(), after.message.clone()))
}

/// The Warning Event when PostgreSQL refuses a declared role or database (the condition of
/// `what` turns to, or stays with another message at, its failed reason).
pub(in crate::cluster) fn declared_event(
    what: &status::Declared,
    old: Option<&PostgresClusterStatus>,
    new: &PostgresClusterStatus,
) -> Option<(&'static str, String)> {
    use pgop_api::conditions::find_condition;
    let after = find_condition(&new.conditions, what.condition)?;
    if after.reason != what.failed {
        return None;
    }
    let before = old.and_then(|s| find_condition(&s.conditions, what.condition));
    let same = before.is_some_and(|b| b.reason == after.reason && b.message == after.message);
    (!same).then(|| (what.failed, format!("{}: {}", what.field, after.message)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unschedulable_instance_raises_a_warning_once_and_a_normal_event_when_placed() {
        use pgop_api::conditions::{INSTANCES_SCHEDULED, new_condition, set_condition};
        use pgop_api::{PostgresClusterStatus, conditions::whole_seconds};
        let now = whole_seconds(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        let with = |ok: bool, message: &str| {
            let mut s = PostgresClusterStatus::default();
            let reason = if ok { "Scheduled" } else { "Unschedulable" };
            let c = new_condition(INSTANCES_SCHEDULED, ok, reason, message, None, now.clone());
            set_condition(&mut s.conditions, c, now.clone());
            s
        };
        let reasons = ("InstancesUnschedulable", "InstancesScheduled");
        let event = |old: &PostgresClusterStatus, new: &PostgresClusterStatus| {
            super::condition_event(Some(old), new, INSTANCES_SCHEDULED, false, reasons).map(
                |(kind, reason, message)| {
                    (
                        kind == kube::runtime::events::EventType::Warning,
                        reason,
                        message,
                    )
                },
            )
        };
        let fine = with(true, "all placed");
        let stuck = with(false, "pod db-3 cannot be scheduled: \"0/3 nodes\"");
        assert_eq!(
            event(&fine, &stuck),
            Some((
                true,
                "InstancesUnschedulable",
                "pod db-3 cannot be scheduled: \"0/3 nodes\"".into()
            ))
        );
        assert_eq!(
            event(&stuck, &stuck),
            None,
            "no second Event while nothing changed"
        );
        assert_eq!(
            event(&stuck, &fine),
            Some((false, "InstancesScheduled", "all placed".into()))
        );
        assert_eq!(event(&fine, &fine), None);
    }
}
