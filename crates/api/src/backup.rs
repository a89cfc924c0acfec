//! `PostgresBackup`: one backup of one cluster (a base backup or a logical one), taken on
//! demand or by a schedule.

use crate::cel;
use crate::formats;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One base backup of a PostgresCluster, written to the cluster's backup store. Its spec
/// cannot change after creation.
// clippy mistakes the repeated `type_ = ...` of separate printer columns for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "database.example.com",
    version = "v1alpha1",
    kind = "PostgresBackup",
    namespaced,
    doc = "One backup of a PostgresCluster (base or logical), taken on demand or by one of the cluster's backup schedules.",
    shortname = "pgb",
    category = "pgop",
    status = "PostgresBackupStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.cluster.name",
        description = "The PostgresCluster backed up"
    ),
    printcolumn(
        name = "Method",
        type_ = "string",
        json_path = ".spec.method",
        description = "baseBackup (when empty) or logical"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the backup is"
    ),
    printcolumn(
        name = "Started",
        type_ = "date",
        json_path = ".status.startedAt",
        description = "When the backup started"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = cel::backup_spec_immutable())]
#[serde(rename_all = "camelCase")]
pub struct PostgresBackupSpec {
    /// The PostgresCluster (in this namespace) to back up.
    pub cluster: ClusterReference,

    /// How to take the backup; `baseBackup` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<BackupMethod>,
}

/// A PostgresCluster in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReference {
    /// Name of the PostgresCluster.
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// How the backup is taken; `baseBackup` when unset.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum BackupMethod {
    /// A streamed base backup (`pg_basebackup`) from a standby when one is ready, else
    /// from the primary, uploaded to the cluster's backup store.
    #[default]
    BaseBackup,
    /// `pg_dump` of every database (custom format) and `pg_dumpall --globals-only` (roles),
    /// taken on the primary and uploaded to the cluster's backup store. Restores one
    /// database at a time with `pgop backup logical restore`; not a point-in-time method.
    Logical,
}

/// The observed state of a PostgresBackup, written only by pgop.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PostgresBackupStatus {
    /// Where the backup is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,

    /// When the backup started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When the backup completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<Time>,

    /// The LSN the backup starts at (WAL from here on is needed to restore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_lsn: Option<String>,

    /// The LSN the backup ends at (the earliest point it can be restored to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,

    /// Size of the backup in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,

    /// The backup's id in the store (`base/<id>/`, or `logical/<id>/` for a logical
    /// backup, under the cluster's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,

    /// The instance the backup was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,

    /// The timeline the backup was taken on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,

    /// Bytes stored (compressed) for the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<i64>,

    /// With the cluster's `spec.backup.verify`: whether the backup was restored into a
    /// scratch directory, replayed to its end and passed a checksum pass of every page
    /// (unset until checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,

    /// What the verification found (why a backup cannot be restored, or what was checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<String>,

    /// A logical backup: the databases dumped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<String>,

    /// Why the backup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where the backup is: Pending, Running, Completed or Failed (see `error`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupPhase {
    /// Accepted, not started yet.
    Pending,
    /// Being taken.
    Running,
    /// Done; it can be restored.
    Completed,
    /// Failed; see `error`.
    Failed,
}
