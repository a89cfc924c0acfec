//! The status of a `PostgresCluster` (`status`), the same in `v1alpha1` and `v1beta1`:
//! `PostgresClusterStatus` and what it holds (the instances and their roles, the phase, a
//! major upgrade as far as it got, the restarts asked for, the resolved recovery source,
//! what auto-grow did), and its `Default`, the status of a cluster pgop has not seen yet.
//! Written only by pgop. `crate::cluster` re-exports every type here.

use crate::backup_store::BackupStore;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The observed state of a PostgresCluster, written only by pgop.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PostgresClusterStatus {
    /// What the cluster is doing, in one word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,

    /// The conditions Ready, Progressing, Degraded, SpecValid and BackupSucceeded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The instance that is the primary now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,

    /// The instance that should be the primary; differs from `currentPrimary` during a
    /// failover or switchover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary: Option<String>,

    /// When `targetPrimary` last changed: the start of the current (or last) failover or
    /// switchover, which `spec.switchoverTimeout` counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary_since: Option<Time>,

    /// The trace of the operator's pass that last changed `targetPrimary` (a W3C Trace
    /// Context `traceparent`): the target's promotion is a span of that trace, so one
    /// trace shows a failover or switchover from decision to promotion. Informational;
    /// a value that is not a `traceparent` is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary_trace: Option<String>,

    /// Number of instances that exist (the scale subresource's replicas).
    #[serde(default)]
    pub replicas: i32,

    /// Number of instances that are ready.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Label selector of the instance Pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// One entry per instance, ordered by serial.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub instances: Vec<InstanceStatus>,

    /// The serial the next new instance gets. Serials are never reused, so a new instance
    /// never meets a volume or replication slot of an old one.
    #[serde(default = "default_next_serial")]
    pub next_serial: i32,

    /// Where the first instance restores from, resolved by pgop from
    /// `spec.bootstrap.recovery` (a PostgresBackup is looked up once, here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_source: Option<RecoverySource>,

    /// The instance asked to restart PostgreSQL now, to apply parameters that take effect
    /// only at start or for the restart annotation (a rolling restart: one instance at a
    /// time, standbys first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_instance: Option<String>,

    /// The last restart asked for with the annotation `database.example.com/restart`: its
    /// value, and when pgop first saw it. Every instance whose postmaster started before
    /// then is restarted, one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_requested: Option<RestartRequest>,

    /// Restarts of single instances asked for with the annotation
    /// `database.example.com/restart-instance` (which pgop removes once recorded here):
    /// each instance, and when pgop saw the request. An instance whose postmaster started
    /// before then is restarted through the rolling restart (a primary after a
    /// switchover); its entry goes once it has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_restarts: Vec<InstanceRestart>,

    /// How each role of `spec.roles` was applied by the primary's manager (and why not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<crate::roles::AppliedStatus>,

    /// What `spec.storage.autoGrow` did: the size it grew the volumes to, which the
    /// volumes keep (they are made at least this large, whatever `spec.storage.size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_grow: Option<AutoGrowStatus>,

    /// How each database of `spec.databases` was applied by the primary's manager (and
    /// why not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<crate::roles::AppliedStatus>,

    /// The pods of each pooler of `spec.poolers`, as its Deployment reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poolers: Vec<crate::pooler::PoolerStatus>,

    /// When the last base backup completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_time: Option<Time>,

    /// The earliest point in time the cluster can be restored to from its backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_recoverability_point: Option<Time>,

    /// When the last logical backup (`pg_dump`) completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_logical_backup_time: Option<Time>,

    /// When `instances[].receivedLsn` and `.replayedLsn` were read. They are published at
    /// most once a minute while nothing else about the instances changes (a role, a timeline,
    /// readiness, an instance coming or going), so that a cluster under write load does not
    /// rewrite its status every second; the live positions are on each manager's
    /// `/pg/status` and in its metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions_observed_at: Option<Time>,

    /// The PostgreSQL major version the cluster's data directories hold, which its
    /// instance Pods run: recorded when the first instance is built, or for a cluster
    /// made before the field, from what its instances run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<i32>,

    /// The in-place major upgrade asked for by raising `spec.postgresVersion`: how far it
    /// got, or how the last one ended (see the MajorUpgraded condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade: Option<MajorUpgrade>,

    /// A replica cluster (`spec.replica`): how its designated primary follows the source,
    /// as that instance's manager reports it (see the ReplicaFollowing condition). The
    /// positions and lags are published at most once a minute, as `instances[]`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<ReplicaStatus>,
}

/// How a replica cluster follows its source (`status.replica`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// The entry of `spec.externalClusters` followed.
    pub source: String,
    /// The instance that follows it (the others follow that one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub designated_primary: Option<String>,
    /// How it follows: `streaming` (the entry's connection), `archive` (its store alone,
    /// by `restore_command`) or `streamingWithArchive` (streaming, and the store for WAL
    /// the server no longer has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Whether the designated primary streams from the source now.
    #[serde(default)]
    pub streaming: bool,
    /// The last WAL segment restored from the source's store, and when (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restored_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restored_at: Option<String>,
    /// The end of the source's WAL as it last told the designated primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_end_lsn: Option<String>,
    /// What the designated primary has received and replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_lsn: Option<String>,
    /// Bytes of the source's WAL not replayed yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// Whole seconds replay is behind the source (0 once caught up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<i64>,
    /// While it does not stream: why the source refuses it (`SourceUnreachable`,
    /// `SourceTLSRefused`, `SourceAuthenticationFailed`, `SourceNoReplication`,
    /// `SourceRefused`, `SourceWalGone`, `SystemIdentifierMismatch`, `ArchiveGap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal_reason: Option<String>,
    /// What the source (or libpq) said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal_message: Option<String>,
    /// When the designated primary last heard from the source (RFC 3339): while it does
    /// not stream, the source's commits since then are not here. Like the lag and the
    /// positions, the last known value stays while the source does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message_at: Option<String>,
    /// The promotion asked for with `spec.replica.enabled: false`, once pgop approved it
    /// (`spec.replica.promotionMaxLagSeconds` checked): the designated primary is then
    /// promoted. Kept as the record of what the cluster had when it stopped following.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion: Option<ReplicaPromotion>,
}

/// A replica cluster's promotion (`status.replica.promotion`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaPromotion {
    /// When pgop approved it.
    pub approved_at: Time,
    /// Whether it was promoted while not streaming from the source (a site lost): the
    /// source's commits after `lastMessageAt` are not in this cluster.
    pub forced: bool,
    /// The lag last recorded (whole seconds; unset: never known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_lag_seconds: Option<i64>,
    /// When the designated primary first answered as a writable primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

impl ReplicaStatus {
    /// The same facts without the positions and lags (which are published at most once
    /// a minute).
    pub fn without_positions(&self) -> Self {
        Self {
            source_end_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            lag_bytes: None,
            lag_seconds: None,
            last_message_at: None,
            last_restored_wal: None,
            last_restored_at: None,
            ..self.clone()
        }
    }
}

/// What `spec.storage.autoGrow` did (`status.autoGrow`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoGrowStatus {
    /// The size the volumes were last grown to (a quantity, e.g. `1536Mi`).
    pub size: String,
    /// When (unset while auto-grow never grew them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown_at: Option<Time>,
    /// How many times auto-grow grew the volumes.
    pub count: i32,
    /// An instance was over the threshold at `maxSize`: auto-grow can do no more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_limit: bool,
}

/// An in-place major upgrade (`pg_upgrade` on the primary's volume, the standbys cloned
/// again), as far as it got.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MajorUpgrade {
    /// The major the data held when the upgrade started.
    pub from: i32,
    /// The major asked for.
    pub to: i32,
    /// How far it got.
    pub phase: MajorUpgradePhase,
    /// How pg_upgrade carries the data files over: `link` (hard links, fast; the old
    /// cluster cannot be started once the new one has) when a base backup was taken
    /// first, else `copy`.
    pub mode: MajorUpgradeMode,
    /// The instance whose volume is upgraded: the primary when the upgrade started.
    pub primary: String,
    /// When pgop started the upgrade.
    pub started_at: Time,
    /// When it completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The PostgresBackup taken before the upgrade (with `spec.backup.store`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// Why it failed, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How far an in-place major upgrade got: BackingUp (a base backup of the old major),
/// Stopping (every instance Pod deleted, the primary's first), Upgrading (the primary's
/// Pod runs pg_upgrade, then starts the new major), Cloning (the standbys are cloned from
/// the upgraded primary), Completed, or Failed (the old major runs again; see `message`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MajorUpgradePhase {
    BackingUp,
    Stopping,
    Upgrading,
    Cloning,
    Completed,
    Failed,
}

/// pg_upgrade's transfer mode: `link` or `copy`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MajorUpgradeMode {
    Link,
    Copy,
}

impl MajorUpgradeMode {
    /// The word `PGOP_UPGRADE_MODE` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            MajorUpgradeMode::Link => "link",
            MajorUpgradeMode::Copy => "copy",
        }
    }
}

/// A restart asked for with the annotation `database.example.com/restart`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RestartRequest {
    /// The annotation's value.
    pub value: String,
    /// When pgop first saw this value: RFC 3339 with microseconds (a `Time` would keep
    /// whole seconds only, and a postmaster started in the same second would look restarted).
    pub requested_at: String,
}

/// A restart of one instance asked for with `database.example.com/restart-instance`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRestart {
    /// The instance to restart.
    pub instance: String,
    /// When pgop saw the request: RFC 3339 with microseconds, as in `restartRequested`.
    pub requested_at: String,
}

/// A base backup to restore, with the store and the cluster name it is kept under.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySource {
    /// The cluster whose backups and WAL are read.
    pub cluster: String,
    /// The store they are in.
    pub store: BackupStore,
    /// The backup to restore; the latest one before the target when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
}

fn default_next_serial() -> i32 {
    1
}

impl Default for PostgresClusterStatus {
    /// The status of a cluster pgop has not seen yet; the same as deserializing `{}`.
    fn default() -> Self {
        Self {
            phase: None,
            conditions: Vec::new(),
            observed_generation: None,
            current_primary: None,
            target_primary: None,
            target_primary_since: None,
            target_primary_trace: None,
            replicas: 0,
            ready_replicas: 0,
            selector: None,
            instances: Vec::new(),
            next_serial: default_next_serial(),
            recovery_source: None,
            restart_instance: None,
            restart_requested: None,
            instance_restarts: Vec::new(),
            roles: Vec::new(),
            databases: Vec::new(),
            poolers: Vec::new(),
            auto_grow: None,
            last_backup_time: None,
            first_recoverability_point: None,
            last_logical_backup_time: None,
            positions_observed_at: None,
            postgres_version: None,
            major_upgrade: None,
            replica: None,
        }
    }
}

/// What the cluster is doing, in one word: Pending, Creating, Ready, Degraded,
/// FailingOver, SwitchingOver, Hibernating, Hibernated, Resuming, Upgrading, Invalid (see
/// the SpecValid condition) or Deleting.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterPhase {
    /// Accepted; nothing created yet.
    Pending,
    /// Creating the first instances.
    Creating,
    /// Every desired instance is ready.
    Ready,
    /// Serving with fewer ready instances than desired.
    Degraded,
    /// Promoting a standby because the primary failed.
    FailingOver,
    /// Moving the primary role on request or for an update.
    SwitchingOver,
    /// The spec is invalid; see the SpecValid condition. pgop waits for a change.
    Invalid,
    /// The cluster is being deleted.
    Deleting,
    /// `spec.hibernate`: the instance Pods are being deleted (see the Hibernated
    /// condition).
    Hibernating,
    /// `spec.hibernate`: no instance Pod is left; the volumes are kept.
    Hibernated,
    /// Back from hibernation: the instances start again on their volumes; the primary is
    /// not failed over until it has served again.
    Resuming,
    /// An in-place major upgrade stops, upgrades and restarts the cluster (see
    /// `status.majorUpgrade` and the MajorUpgraded condition).
    Upgrading,
}

/// The state of one instance as reported by its instance manager.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Instance name, `<cluster>-<serial>` (also its Pod's and PVC's name).
    pub name: String,

    /// The serial in the instance's name.
    pub serial: i32,

    /// The role the instance runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<InstanceRole>,

    /// Whether the instance's Pod is ready.
    #[serde(default)]
    pub ready: bool,

    /// PostgreSQL timeline the instance is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,

    /// Primary: the current WAL write LSN. Standby: the last LSN received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_lsn: Option<String>,

    /// Standby: the last LSN replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_lsn: Option<String>,

    /// The version of the instance manager (the pgop binary in the instance's Pod), as it
    /// reports it on `/pg/status`; unset while it does not answer, and for managers that
    /// predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager_version: Option<String>,

    /// The instance is fenced (`spec.fencedInstances`): its manager keeps PostgreSQL
    /// stopped, as it reports.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,

    /// The version of the PostgreSQL server the instance runs (`server_version`, e.g.
    /// `15.14 (Debian 15.14-0+deb12u1)`), as its manager reports it while PostgreSQL
    /// answers; unset otherwise, and from managers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,

    /// Why the instance is not ready, as its manager last said: `StartFailed`,
    /// `VolumeFull`, `WalVolumeFull`, `BootstrapFailed`, `MajorUpgradeFailed`, `WalGone` or
    /// `NotStreaming` (docs/troubleshooting.md). Kept until the instance is ready again
    /// (while it restarts, its manager says nothing); unset while it is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// With `reason`: PostgreSQL's own last words (its last FATAL/PANIC lines) or the
    /// manager's error, and the parameters of the restart that left the instance down;
    /// at most 1 KiB, control characters escaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// With `reason`: since when (RFC 3339) the instance has been down for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_since: Option<String>,
}

/// The role the instance runs in: `primary` or `replica` (the same values as the
/// `database.example.com/role` label).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum InstanceRole {
    /// Accepts writes.
    Primary,
    /// Streams WAL from the primary and serves reads.
    Replica,
}

impl InstanceRole {
    /// The `database.example.com/role` label value.
    pub fn label_value(self) -> &'static str {
        match self {
            Self::Primary => crate::labels::ROLE_PRIMARY,
            Self::Replica => crate::labels::ROLE_REPLICA,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_status_is_the_default_status_and_serials_start_at_one() {
        let empty: PostgresClusterStatus =
            serde_json::from_value(serde_json::json!({})).expect("parses");
        assert_eq!(empty, PostgresClusterStatus::default());
        assert_eq!(empty.next_serial, 1);
    }

    #[test]
    fn instance_roles_are_the_role_label_values() {
        for role in [InstanceRole::Primary, InstanceRole::Replica] {
            assert_eq!(
                serde_json::to_value(role).expect("serializes"),
                serde_json::json!(role.label_value())
            );
        }
    }
}
