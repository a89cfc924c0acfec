//! Raising `spec.postgresVersion` on a cluster that serves: an in-place major upgrade.
//!
//! The order, one pass at a time (each decided here as a pure function, recorded in
//! `status.majorUpgrade` and the MajorUpgraded condition):
//! 1. it starts only on a cluster that is Ready, with no change of primary under way,
//!    nothing fenced and no hibernation asked for; until then the condition says why
//!    (reason `Waiting`) and the cluster serves on its major;
//! 2. `BackingUp` (with `spec.backup.store`): a PostgresBackup is taken while the cluster
//!    still serves; pg_upgrade then runs with `--link` (fast; the old cluster cannot start
//!    once the new one has, and the backup is the way back). Without a store it runs with
//!    `--copy`, which leaves the old data files untouched until the new cluster is
//!    complete. A failed backup fails the upgrade, nothing else having been touched;
//! 3. `Stopping` (with no change of primary under way; the volume to upgrade is the
//!    primary's then, should a failover have happened during the backup): every instance
//!    Pod is deleted, the primary's first (as for a hibernation: its manager checkpoints
//!    and shuts down, and the walsenders ship the last WAL to the standbys), with no
//!    failover: the ordinary pass does not run;
//! 4. `Upgrading`: only the primary's Pod is created, for the new major, with
//!    `PGOP_UPGRADE_FROM` and `PGOP_UPGRADE_MODE`: its manager runs pg_upgrade
//!    (`--check` first; a failure rolls back) before it starts PostgreSQL. When it reports
//!    the new major running as the primary, `status.postgresVersion` becomes the new
//!    major; when it reports `majorUpgradeError` (or keeps exiting), the upgrade has
//!    `Failed`: its Pod is deleted and the old major runs again on the data pg_upgrade
//!    left as it was;
//! 5. `Cloning`: the ordinary pass again, every instance on the new major; the standbys'
//!    managers find data of the older major and clone the upgraded primary;
//! 6. `Completed` once every instance is ready on the new major; with a store, a base
//!    backup of the new major is taken (the earlier ones cannot be restored with its WAL).
//!
//! A `Failed` upgrade stays failed for that target (the cluster runs its old major):
//! setting `spec.postgresVersion` back to the data's major clears it (once a pass has seen
//! that: the MajorUpgraded condition goes), and raising it again starts a new attempt. Until pg_upgrade runs (`BackingUp`, `Stopping`) the upgrade
//! is called off by setting the version back; the webhook refuses any change of the
//! version while it runs pg_upgrade or clones.

use super::hibernation;
use crate::cluster::world::Probe;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use pgop_api::PostgresClusterStatus;
use pgop_api::backup::{BackupPhase, PostgresBackup};
use pgop_api::cluster::{
    ClusterPhase, InstanceStatus, MajorUpgrade, MajorUpgradeMode, MajorUpgradePhase,
};
use pgop_api::conditions::{self, new_condition, set_condition};
use pgop_api::instance_status::PgRole;
use pgop_api::v1beta1::PostgresCluster;

/// Restarts of the upgrading primary's container, without an answer from its manager,
/// after which the upgrade has failed (its binaries missing from the image, say).
pub const MAX_RESTARTS: i32 = 3;
/// The longest message kept from a manager's error (conditions and Events stay readable).
const MAX_MESSAGE: usize = 2000;

/// What the upgrade decision reads.
pub struct Input<'a> {
    /// The cluster, defaulted, with its last status.
    pub cluster: &'a PostgresCluster,
    /// The major the data holds (`status.postgresVersion`, see `immutable::held_major`).
    pub held: i32,
    /// The major the spec asks for.
    pub wanted: i32,
    /// How many instances the plan keeps.
    pub instances: usize,
    /// The cluster's instance Pods.
    pub pods: &'a [Pod],
    /// The cluster's PostgresBackups.
    pub backups: &'a [PostgresBackup],
    /// The upgrading primary's probe, during `Upgrading`.
    pub primary_probe: Option<&'a Probe>,
    pub now: Time,
}

/// What this pass does about the upgrade.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The `status.majorUpgrade` to write.
    pub record: Option<MajorUpgrade>,
    /// Why an upgrade asked for has not started (the condition's message).
    pub waiting: Option<String>,
    /// The pass to run.
    pub pass: Pass,
    /// A PostgresBackup to create before the status is written (idempotent: its name is
    /// fixed by the record).
    pub create_backup: Option<String>,
}

/// The pass an upgrade asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Pass {
    /// The ordinary pass, every instance built for this major.
    Ordinary { major: i32 },
    /// `Stopping`: the next Pods to delete (as a hibernation deletes them).
    Stop(hibernation::Step),
    /// `Upgrading`: only the primary's Pod, for the new major, with the upgrade request.
    Upgrade,
    /// The upgrade failed while the primary's Pod ran pg_upgrade: that Pod goes; the next
    /// pass builds every instance on the old major again.
    RollBack,
}

impl Decision {
    fn ordinary(record: Option<MajorUpgrade>, major: i32) -> Self {
        Decision {
            record,
            waiting: None,
            pass: Pass::Ordinary { major },
            create_backup: None,
        }
    }
}

/// The next step of the upgrade (or none): see the module's comment.
pub fn decide(input: &Input) -> Decision {
    let old = input
        .cluster
        .status
        .as_ref()
        .and_then(|s| s.major_upgrade.clone());
    let active = old.clone().filter(|u| {
        !matches!(
            u.phase,
            MajorUpgradePhase::Completed | MajorUpgradePhase::Failed
        )
    });
    let mut record = match active {
        Some(u) => u,
        None => {
            let failed = old
                .as_ref()
                .is_some_and(|u| u.phase == MajorUpgradePhase::Failed);
            if input.wanted <= input.held {
                // Back on the data's major: a failed upgrade is over (its Event stays), and
                // raising the version again is a new attempt.
                return Decision::ordinary(old.filter(|_| !failed), input.held);
            }
            if failed && old.as_ref().is_some_and(|u| u.to == input.wanted) {
                return Decision::ordinary(old, input.held);
            }
            if let Some(why) = not_ready(input) {
                return Decision {
                    waiting: Some(why),
                    ..Decision::ordinary(old, input.held)
                };
            }
            start(input)
        }
    };
    // Called off before pg_upgrade (the version set back, or to another major): the old
    // major runs on; a new target starts anew on the next pass.
    if input.wanted != record.to
        && matches!(
            record.phase,
            MajorUpgradePhase::BackingUp | MajorUpgradePhase::Stopping
        )
    {
        record.phase = MajorUpgradePhase::Failed;
        record.finished_at = Some(input.now.clone());
        record.message = Some(format!(
            "called off: spec.postgresVersion is {} now",
            input.wanted
        ));
        return Decision::ordinary(Some(record), input.held);
    }
    if record.phase == MajorUpgradePhase::BackingUp {
        let name = record.backup.clone().unwrap_or_default();
        let backup = input.backups.iter().find(|b| b.name_any() == name);
        match backup.and_then(|b| b.status.as_ref()).and_then(|s| s.phase) {
            Some(BackupPhase::Completed) => {
                // The cluster served during the backup: the volume to upgrade is the
                // primary's now, and none is upgraded while the primary changes.
                let status = input.cluster.status.clone().unwrap_or_default();
                match status.current_primary {
                    Some(primary) if status.target_primary.as_ref() == Some(&primary) => {
                        record.primary = primary;
                        record.phase = MajorUpgradePhase::Stopping;
                    }
                    _ => {
                        return Decision::ordinary(Some(record), input.held);
                    }
                }
            }
            Some(BackupPhase::Failed) => {
                let why = backup
                    .and_then(|b| b.status.as_ref())
                    .and_then(|s| s.error.clone())
                    .unwrap_or_default();
                return Decision::ordinary(
                    Some(failed(
                        record,
                        &input.now,
                        format!("the base backup {name} before the upgrade failed: {why}"),
                    )),
                    input.held,
                );
            }
            _ => {
                return Decision {
                    create_backup: backup.is_none().then_some(name),
                    ..Decision::ordinary(Some(record), input.held)
                };
            }
        }
    }
    if record.phase == MajorUpgradePhase::Stopping {
        match hibernation::next(input.pods, &record.primary, input.backups) {
            hibernation::Step::Done => record.phase = MajorUpgradePhase::Upgrading,
            step => {
                return Decision {
                    pass: Pass::Stop(step),
                    ..Decision::ordinary(Some(record), input.held)
                };
            }
        }
    }
    if record.phase == MajorUpgradePhase::Upgrading {
        let status = input.primary_probe.and_then(Probe::status);
        if let Some(error) = status.and_then(|s| s.major_upgrade_error.clone()) {
            return Decision {
                pass: Pass::RollBack,
                ..Decision::ordinary(Some(failed(record, &input.now, cut(&error))), input.held)
            };
        }
        if status.is_some_and(|s| {
            s.running
                && s.role == PgRole::Primary
                && s.postgres_version_num.map(major_of) == Some(record.to)
        }) {
            record.phase = MajorUpgradePhase::Cloning;
            record.message = None;
            return Decision::ordinary(Some(record.clone()), record.to);
        }
        let pod = input.pods.iter().find(|p| p.name_any() == record.primary);
        if status.is_none()
            && let Some(exits) = pod.and_then(exits)
        {
            let why = format!(
                "the instance manager of {} exited {} times without answering ({}); are PostgreSQL {}'s and {}'s binaries in its image?",
                record.primary, exits.0, exits.1, record.from, record.to
            );
            return Decision {
                pass: Pass::RollBack,
                ..Decision::ordinary(Some(failed(record, &input.now, why)), input.held)
            };
        }
        return Decision {
            pass: Pass::Upgrade,
            ..Decision::ordinary(Some(record), input.held)
        };
    }
    // Cloning: the ordinary pass on the new major, until every instance is ready on it.
    let mut create_backup = None;
    if record.phase == MajorUpgradePhase::Cloning && all_ready_on(input, record.to) {
        record.phase = MajorUpgradePhase::Completed;
        record.finished_at = Some(input.now.clone());
        create_backup = has_store(input.cluster).then(|| after_backup_name(input.cluster, &record));
    }
    let major = record.to;
    Decision {
        create_backup,
        ..Decision::ordinary(Some(record), major)
    }
}

/// Why an upgrade cannot start now, if it cannot.
fn not_ready(input: &Input) -> Option<String> {
    let c = input.cluster;
    let status = c.status.clone().unwrap_or_default();
    if c.spec.hibernate || hibernation::resuming_from(status.phase) {
        return Some("the cluster is hibernated or resuming".to_string());
    }
    if !c.spec.fenced_instances.is_empty() {
        return Some(format!(
            "spec.fencedInstances names {}: unfence them first",
            c.spec.fenced_instances.join(", ")
        ));
    }
    if status.current_primary.is_none() || status.target_primary != status.current_primary {
        return Some("a change of primary is under way".to_string());
    }
    if status.phase != Some(ClusterPhase::Ready) {
        return Some(format!(
            "the cluster is not Ready (phase {})",
            status
                .phase
                .and_then(|p| serde_json::to_value(p).ok())
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "unknown".to_string())
        ));
    }
    None
}

/// A new upgrade from the held major to the wanted one, of the current primary's volume.
fn start(input: &Input) -> MajorUpgrade {
    let store = has_store(input.cluster);
    let mut record = MajorUpgrade {
        from: input.held,
        to: input.wanted,
        phase: if store {
            MajorUpgradePhase::BackingUp
        } else {
            MajorUpgradePhase::Stopping
        },
        mode: if store {
            MajorUpgradeMode::Link
        } else {
            MajorUpgradeMode::Copy
        },
        primary: input
            .cluster
            .status
            .as_ref()
            .and_then(|s| s.current_primary.clone())
            .unwrap_or_default(),
        started_at: input.now.clone(),
        finished_at: None,
        backup: None,
        message: None,
    };
    if store {
        record.backup = Some(before_backup_name(input.cluster, &record));
    }
    record
}

fn has_store(cluster: &PostgresCluster) -> bool {
    cluster
        .spec
        .backup
        .as_ref()
        .is_some_and(|b| b.store.is_some())
}

/// `<cluster>-upgrade-<from>-<to>-<YYYYMMDDhhmmss>`: the backup before the upgrade.
pub fn before_backup_name(cluster: &PostgresCluster, record: &MajorUpgrade) -> String {
    format!(
        "{}-upgrade-{}-{}-{}",
        cluster.name_any(),
        record.from,
        record.to,
        stamp(&record.started_at)
    )
}

/// `<cluster>-upgraded-<to>-<YYYYMMDDhhmmss>`: the first backup of the new major.
pub fn after_backup_name(cluster: &PostgresCluster, record: &MajorUpgrade) -> String {
    format!(
        "{}-upgraded-{}-{}",
        cluster.name_any(),
        record.to,
        stamp(&record.started_at)
    )
}

fn stamp(time: &Time) -> String {
    time.0.strftime("%Y%m%d%H%M%S").to_string()
}

fn failed(mut record: MajorUpgrade, now: &Time, message: String) -> MajorUpgrade {
    record.phase = MajorUpgradePhase::Failed;
    record.finished_at = Some(now.clone());
    record.message = Some(message);
    record
}

/// `message` cut to about [`MAX_MESSAGE`] bytes, on character boundaries: its first
/// third and its last two thirds, `…` between. A failure report names the failing step
/// first and ends with the tail of the log that says why (pg_upgrade's dump log, say).
fn cut(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    let mut head = MAX_MESSAGE / 3;
    while !message.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = message.len() - (MAX_MESSAGE - head);
    while !message.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…{}", &message[..head], &message[tail..])
}

/// The major of `server_version_num` (180001 → 18).
fn major_of(version_num: i32) -> i32 {
    version_num / 10_000
}

/// How often the Pod's instance container exited, and the last exit, once at least
/// [`MAX_RESTARTS`].
fn exits(pod: &Pod) -> Option<(i32, String)> {
    let status = pod
        .status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "postgres")?;
    if status.restart_count < MAX_RESTARTS {
        return None;
    }
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| {
            let reason = t.reason.clone().unwrap_or_default();
            let message = t.message.clone().unwrap_or_default();
            format!("exit code {}: {reason} {message}", t.exit_code)
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| "no exit recorded".to_string());
    Some((status.restart_count, cut(&last)))
}

/// Whether every planned instance is ready on `major`, as the last status says.
fn all_ready_on(input: &Input, major: i32) -> bool {
    let instances: &[InstanceStatus] = input
        .cluster
        .status
        .as_ref()
        .map_or(&[], |s| s.instances.as_slice());
    let prefix = format!("{major}.");
    let ready = instances
        .iter()
        .filter(|i| {
            i.ready
                && i.postgres_version
                    .as_deref()
                    .is_some_and(|v| v.starts_with(&prefix))
        })
        .count();
    ready >= input.instances && input.instances > 0
}

/// The MajorUpgraded condition: its status, reason and message (none on a cluster never
/// upgraded and not waiting for one).
pub fn condition(
    record: Option<&MajorUpgrade>,
    waiting: Option<&str>,
) -> Option<(bool, &'static str, String)> {
    if let Some(why) = waiting {
        return Some((
            false,
            "Waiting",
            format!("spec.postgresVersion: the upgrade waits: {why}"),
        ));
    }
    let u = record?;
    let (status, reason, message) = match u.phase {
        MajorUpgradePhase::BackingUp => (
            false,
            "BackingUp",
            format!(
                "upgrading from PostgreSQL {} to {}: base backup {} first",
                u.from,
                u.to,
                u.backup.as_deref().unwrap_or_default()
            ),
        ),
        MajorUpgradePhase::Stopping => (
            false,
            "Stopping",
            format!(
                "upgrading from PostgreSQL {} to {}: stopping every instance, {} first",
                u.from, u.to, u.primary
            ),
        ),
        MajorUpgradePhase::Upgrading => (
            false,
            "Upgrading",
            format!(
                "upgrading from PostgreSQL {} to {}: pg_upgrade --{} on {}'s volume",
                u.from,
                u.to,
                u.mode.as_str(),
                u.primary
            ),
        ),
        MajorUpgradePhase::Cloning => (
            false,
            "Cloning",
            format!(
                "upgraded {} to PostgreSQL {}: the standbys are cloned from it",
                u.primary, u.to
            ),
        ),
        MajorUpgradePhase::Completed => (
            true,
            "Completed",
            format!(
                "upgraded from PostgreSQL {} to {}: every instance runs {}",
                u.from, u.to, u.to
            ),
        ),
        MajorUpgradePhase::Failed => (
            false,
            "Failed",
            format!(
                "the upgrade from PostgreSQL {} to {} failed; the cluster runs {} (set spec.postgresVersion back to {} to try again later): {}",
                u.from,
                u.to,
                u.from,
                u.from,
                u.message.as_deref().unwrap_or_default()
            ),
        ),
    };
    Some((status, reason, message))
}

/// Sets the MajorUpgraded condition and `majorUpgrade` of `status` from a decision.
pub fn set_status(
    status: &mut PostgresClusterStatus,
    decision: &Decision,
    generation: Option<i64>,
    now: &Time,
) {
    status.major_upgrade = decision.record.clone();
    match condition(decision.record.as_ref(), decision.waiting.as_deref()) {
        Some((ok, reason, message)) => {
            set_condition(
                &mut status.conditions,
                new_condition(
                    conditions::MAJOR_UPGRADED,
                    ok,
                    reason,
                    message,
                    generation,
                    now.clone(),
                ),
                now.clone(),
            );
        }
        None => status
            .conditions
            .retain(|c| c.type_ != conditions::MAJOR_UPGRADED),
    }
}

/// The status while the upgrade replaces the ordinary pass (`Stopping`, `Upgrading`, a
/// roll-back): phase Upgrading, no instance ready, the primary unavailable.
pub fn status_while_down(
    cluster: &PostgresCluster,
    pods: &[Pod],
    decision: &Decision,
    now: &Time,
) -> PostgresClusterStatus {
    let generation = cluster.metadata.generation;
    let mut status = cluster.status.clone().unwrap_or_default();
    for instance in &mut status.instances {
        instance.role = None;
        instance.ready = false;
    }
    status.replicas = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    status.ready_replicas = 0;
    status.observed_generation = generation;
    status.phase = Some(ClusterPhase::Upgrading);
    status.restart_instance = None;
    set_status(&mut status, decision, generation, now);
    let message = condition(decision.record.as_ref(), None)
        .map(|(_, _, m)| m)
        .unwrap_or_default();
    for (type_, what) in [
        (conditions::READY, "the cluster is down for a major upgrade"),
        (
            conditions::PRIMARY_AVAILABLE,
            "the primary is down for a major upgrade",
        ),
    ] {
        set_condition(
            &mut status.conditions,
            new_condition(
                type_,
                false,
                "Upgrading",
                format!("{what}: {message}"),
                generation,
                now.clone(),
            ),
            now.clone(),
        );
    }
    super::computed::set_spec_valid(&mut status.conditions, generation, now);
    status
}

/// The Event for a new phase of the upgrade (or a new reason to wait): Warning for
/// `Failed` and `Waiting`, Normal otherwise; reason `MajorUpgrade<Phase>`.
pub fn event(
    old: Option<&PostgresClusterStatus>,
    new: &PostgresClusterStatus,
) -> Option<(EventType, String, String)> {
    let find = |s: &PostgresClusterStatus| {
        conditions::find_condition(&s.conditions, conditions::MAJOR_UPGRADED).cloned()
    };
    let after = find(new)?;
    let before = old.and_then(find);
    if before.is_some_and(|b| b.reason == after.reason && b.message == after.message) {
        return None;
    }
    let kind = if matches!(after.reason.as_str(), "Failed" | "Waiting") {
        EventType::Warning
    } else {
        EventType::Normal
    };
    Some((kind, format!("MajorUpgrade{}", after.reason), after.message))
}

#[cfg(test)]
mod tests;
