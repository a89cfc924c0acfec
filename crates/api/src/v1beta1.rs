//! `PostgresCluster` `v1beta1`, and its conversions to and from `v1alpha1`.
//!
//! Served beside `v1alpha1` and stored by the CRD of [`crate::crds`], with a conversion
//! webhook in the operator (`POST /convert`, [`review`]); the operator and the instance
//! managers read and write this version only. See docs/api.md, "v1beta1". Every change from
//! `v1alpha1` is a move or a rename, so both versions hold the same information and each
//! conversion is the other's inverse: nothing needs an annotation to survive a round trip.
//! The tests convert generated specs of each version there and back.
//!
//! | `v1alpha1` | `v1beta1` |
//! |---|---|
//! | `replicas` | `instances` |
//! | `failoverDelay`, `switchoverTimeout` | `ha.failoverDelay`, `ha.switchoverTimeout` |
//! | `replication.synchronous`, `replication.dataDurability` | `ha.synchronous.standbys`, `ha.synchronous.dataDurability` |
//! | `postgresVersion`, `postgresql.parameters`, `postgresql.pgHba` | `postgresql.version`, `postgresql.parameters`, `postgresql.pgHba` |
//! | `backup.schedule`, `backup.verify` | `backup.base.schedule`, `backup.base.verify` |
//! | `backup.logicalSchedule` | `backup.logical.schedule` |
//! | `backup.retentionDays` | `backup.retention.days` |
//! | `affinity` | `scheduling` |
//!
//! Why this file stays whole: it is one idea, `v1beta1` as the table above applied to
//! `v1alpha1`: its types, the conversions both ways and the moved field paths (`MOVED`) are
//! that table in three forms and change together; about 320 of its lines are the unit
//! tests.

use crate::affinity::AffinitySpec;
use crate::cel;
use crate::cluster::{
    self as v1alpha1, BackupStore, BootstrapSpec, DataDurability, INSTANCE_NAME_PATTERN,
    MAX_INSTANCE_NAME_LENGTH, MAX_PARAMETERS, MAX_REPLICAS, PostgresClusterStatus,
    SUPPORTED_POSTGRES_VERSIONS, StorageSpec, TlsSpec, WalStorageSpec,
};
use crate::credentials::CredentialsSpec;
use crate::formats;
use crate::network::NetworkPolicySpec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API version of this module's kind.
pub const API_VERSION: &str = crate::constants::CLUSTER_OWNER_API_VERSION;

/// The desired state of a highly available PostgreSQL cluster (`v1beta1`): one primary
/// and `instances - 1` streaming standbys, each with its own volume.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "database.example.com",
    version = "v1beta1",
    kind = "PostgresCluster",
    namespaced,
    doc = "A highly available PostgreSQL cluster managed by pgop: a primary, streaming standbys, their volumes, services, credentials and backups.",
    shortname = "pgc",
    category = "pgop",
    status = "PostgresClusterStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.instances",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Instances",
        type_ = "integer",
        json_path = ".spec.instances",
        description = "Desired number of instances"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Instances that are ready"
    ),
    printcolumn(
        name = "Primary",
        type_ = "string",
        json_path = ".status.currentPrimary",
        description = "The instance that accepts writes"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "What the cluster is doing"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = cel::cluster_name(),
    validation = cel::not_own_secret("tls.serverSecret"),
    validation = cel::not_own_secret("tls.clientCASecret"),
    validation = cel::not_own_secret("credentials.appSecret"),
    validation = cel::not_own_secret("credentials.superuserSecret"),
    validation = cel::fenced_instances_of_cluster(),
    validation = cel::pooler_names_fit()
)]
#[x_kube(validation = cel::standbys_below_instances())]
#[x_kube(validation = cel::replica_source_is_entry())]
#[x_kube(validation = cel::replica_store_is_s3())]
#[x_kube(validation = cel::replica_without_recovery())]
#[serde(rename_all = "camelCase")]
pub struct PostgresClusterSpec {
    /// Number of PostgreSQL instances: one primary and `instances - 1` streaming standbys
    /// (1 to 9). Each standby holds a WAL sender and a replication slot on the primary.
    #[serde(default = "default_instances")]
    #[schemars(range(min = 1, max = 9))]
    pub instances: i32,

    /// Container image of the instances: the pgop image with PostgreSQL inside, as an image
    /// reference (`registry.example.com:5000/pgop:0.2.0`, optionally `@sha256:...`), at most
    /// 512 characters. Defaults to the operator's own image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), pattern(formats::IMAGE_PATTERN))]
    pub image: Option<String>,

    /// The persistent volume of each instance.
    pub storage: StorageSpec,

    /// A second volume per instance for the write-ahead log (`pg_wal`), apart from the
    /// data: WAL writes do not compete with data files for the volume's throughput, and a
    /// WAL that piles up (archiving failing) fills its own volume, not the data's. May be
    /// added to a running cluster (each instance moves its WAL over at its next start, in
    /// a rolling restart), never removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_storage: Option<WalStorageSpec>,

    /// CPU and memory requests and limits of each instance's PostgreSQL container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// PostgreSQL itself: its major version, postgresql.conf parameters and extra
    /// pg_hba.conf rules.
    #[serde(default)]
    pub postgresql: PostgresqlSpec,

    /// Where the instance Pods may run and how strictly they are kept apart: pod
    /// anti-affinity `preferred` (the default) or `required` over a topology key (nodes by
    /// default), a node selector and tolerations.
    #[serde(default)]
    pub scheduling: AffinitySpec,

    /// High availability: when to fail over, how long a switchover may take, and how many
    /// standbys confirm each commit.
    #[serde(default)]
    pub ha: HaSpec,

    /// TLS of PostgreSQL's connections. PostgreSQL always serves TLS (1.2 or later) with a
    /// certificate from the cluster's own authority, and standbys always replicate over it
    /// with a client certificate.
    #[serde(default)]
    pub tls: TlsSpec,

    /// Where the application owner's and the superuser's passwords come from, and whether
    /// the superuser may log in over the network (it may not by default).
    #[serde(default)]
    pub credentials: CredentialsSpec,

    /// The NetworkPolicy pgop keeps for the instance Pods: PostgreSQL from the cluster's
    /// own instances and the selected clients (anyone by default), the manager's read-only
    /// port from anywhere, its mutual-TLS port from the operator only.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,

    /// Backups: the store they and the archived WAL go to, how long they are kept, and
    /// the schedule of each method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,

    /// How the first instance gets its data: a new database (initdb, the default) or a
    /// restore from a backup. Read only when the cluster is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,

    /// Stop reconciling this cluster: pgop changes nothing (no failover either) until this is
    /// false again. Nothing is deleted.
    #[serde(default)]
    pub paused: bool,

    /// Hibernate the cluster: its instance Pods are deleted (the primary first, once no
    /// backup runs), while the volumes, Services, Secrets and status stay. Set it back to
    /// false to resume: the Pods are created again on the same volumes and the instance
    /// that was the primary is the primary again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hibernate: bool,

    /// Instances to fence, by name (`<cluster>-<serial>`, at most 9): each stops
    /// PostgreSQL (a clean shutdown) and keeps it stopped while its Pod keeps running, for
    /// inspection. A fenced primary is not failed over (the cluster takes no writes until
    /// it is unfenced); a fenced standby is never promoted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_REPLICAS), extend("x-kubernetes-list-type" = "set", "items" = {
        "type": "string",
        "maxLength": MAX_INSTANCE_NAME_LENGTH,
        "pattern": INSTANCE_NAME_PATTERN,
    }))]
    pub fenced_instances: Vec<String>,

    /// PostgreSQL roles the primary's instance manager keeps as declared, at most 32 (see
    /// [`crate::roles`]): created, altered, their memberships granted and revoked, dropped
    /// with `ensure: absent`. Roles not named here are left alone; a role removed from
    /// the list is kept. `status.roles` says how each was applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::roles::MAX_ROLES), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub roles: Vec<crate::roles::RoleSpec>,

    /// PostgreSQL databases the primary's instance manager keeps as declared, at most 16
    /// (see [`crate::databases`]), with their owners, schemas and extensions; applied after
    /// `roles`. Databases not named here are left alone; one removed from the list is kept.
    /// `status.databases` says how each was applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::databases::MAX_DATABASES), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub databases: Vec<crate::databases::DatabaseSpec>,

    /// PgBouncer connection poolers in front of the cluster, at most 4 (see
    /// [`crate::pooler`]): each a Deployment and a Service `<cluster>-pooler-<name>`
    /// whose server connections follow the primary (`rw`) or the ready standbys (`ro`).
    /// `status.poolers` reports their pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::pooler::MAX_POOLERS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub poolers: Vec<crate::pooler::PoolerSpec>,

    /// PostgreSQL servers and backup stores outside the cluster, at most 8 (see
    /// [`crate::external`]), each under a name unique in the list: a connection (host,
    /// port, database, user, TLS, the Secrets of its password, client certificate and
    /// authority), a read-only backup store in pgop's layout, or both. pgop only reads from
    /// them. `spec.replica.source` names the entry a replica cluster follows (docs/api.md,
    /// "External clusters").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::external::MAX_EXTERNAL_CLUSTERS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub external_clusters: Vec<crate::external::ExternalCluster>,

    /// Make this a replica cluster (see [`crate::replica`]): its instances follow the
    /// entry of `spec.externalClusters` named by `source` (streaming replication from its
    /// `connection`) and take no writes; the first instance is cloned from it. Not
    /// changeable once the cluster exists in this version (docs/replica.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<crate::replica::ReplicaSpec>,
}

fn default_instances() -> i32 {
    1
}

/// PostgreSQL itself: its major version and configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
    /// PostgreSQL major version the instances run: 15 (the default) or 18. It picks the
    /// binaries each instance manager runs (`/usr/lib/postgresql/<version>/bin`, or where
    /// `hack/install-postgres18.sh` puts 18 on the local node). Raising it on a running
    /// cluster upgrades the data in place (`status.majorUpgrade`); it is never lowered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = SUPPORTED_POSTGRES_VERSIONS))]
    pub version: Option<i32>,

    /// postgresql.conf parameters, name to value, e.g. `shared_buffers: 256MB`; at most 256
    /// entries. A name is a PostgreSQL parameter name (`work_mem`, or `ext.name` for an
    /// extension), at most 127 characters; a value is one line without control characters,
    /// at most 4096 characters. Refused: parameters that pgop sets itself (listening,
    /// replication, archiving, recovery, logging), `include` directives, and `ssl`/`ssl_*`
    /// (pgop configures TLS itself).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = MAX_PARAMETERS,
        "additionalProperties" = {
            "type": "string",
            "maxLength": formats::MAX_PARAMETER_VALUE_LENGTH,
            "pattern": formats::PARAMETER_VALUE_PATTERN,
        }
    ))]
    #[x_kube(validation = cel::parameter_names())]
    #[x_kube(validation = cel::no_owned_parameters())]
    #[x_kube(validation = cel::no_unsupported_parameters())]
    pub parameters: BTreeMap<String, String>,

    /// Extra pg_hba.conf lines, one rule each (e.g. `host all all 10.0.0.0/8
    /// scram-sha-256`), placed after pgop's rules for local and replication connections and
    /// before its final catch-all rule; at most 64 lines of at most 1024 characters. The
    /// rules for a line are those of `v1alpha1`'s `spec.postgresql.pgHba` (`kubectl explain
    /// pgc.v1alpha1.spec.postgresql.pgHba`): `local`, `host`, `hostssl`, `hostnossl` or
    /// `hostnogssenc`, two to four fields, a method and `name=value` options; no `@file`,
    /// no `#`, no control characters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(max = 1024), pattern(formats::HBA_LINE_PATTERN))
    )]
    pub pg_hba: Vec<String>,
}

/// High availability: when to fail over, how long a switchover may take, and the
/// synchronous standbys.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HaSpec {
    /// Seconds the primary must stay unready before pgop fails over to a standby (0: at
    /// once). A longer delay rides out short hiccups at the price of a longer outage.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub failover_delay: i32,

    /// Seconds a switchover (a planned change of primary) may take. Past it, pgop gives the
    /// switchover up and keeps the old primary when that one still runs as the primary;
    /// when it has already stepped down, the switchover becomes a failover.
    #[serde(default = "default_switchover_timeout")]
    #[schemars(range(min = 1))]
    pub switchover_timeout: i32,

    /// Synchronous replication: how many standbys confirm each commit.
    #[serde(default)]
    pub synchronous: SynchronousSpec,
}

impl Default for HaSpec {
    fn default() -> Self {
        Self {
            failover_delay: 0,
            switchover_timeout: default_switchover_timeout(),
            synchronous: SynchronousSpec::default(),
        }
    }
}

fn default_switchover_timeout() -> i32 {
    60
}

/// Synchronous replication.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = cel::required_durability_needs_standbys())]
#[serde(rename_all = "camelCase")]
pub struct SynchronousSpec {
    /// Number of standbys that must confirm each commit before it is acknowledged
    /// (`ANY n` quorum over all standbys); 0 means asynchronous replication. Must be less
    /// than `spec.instances`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 8))]
    pub standbys: i32,

    /// What happens to commits when too few synchronous standbys are connected:
    /// `preferred` keeps accepting writes with fewer confirmations; `required` never
    /// acknowledges a commit that only the primary has (writes wait instead).
    #[serde(default)]
    pub data_durability: DataDurability,
}

/// Backups: where they go, how long they are kept, and each method's schedule.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::scheduled_methods_need_store())]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Where backups and archived WAL go. Required when `base.schedule` or
    /// `logical.schedule` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<BackupStore>,

    /// IANA time zone every schedule is read in, e.g. `Europe/Berlin`; UTC when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(formats::TIMEZONE_PATTERN))]
    pub timezone: Option<String>,

    /// How long backups are kept.
    #[serde(default)]
    pub retention: RetentionSpec,

    /// Base backups (a copy of the data directory; with the archived WAL they restore to
    /// any point in time).
    #[serde(default)]
    pub base: BaseBackupSpec,

    /// Logical backups (`pg_dump` of every database, plus the roles): a second, independent
    /// method next to base backups.
    #[serde(default)]
    pub logical: LogicalBackupSpec,
}

/// How long backups are kept.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Days a backup (and the WAL needed to restore it) is kept, 1 to 365; the newest
    /// completed backup of each method is kept whatever its age.
    #[serde(default = "default_retention_days")]
    #[schemars(range(min = 1, max = 365))]
    pub days: i32,
}

impl Default for RetentionSpec {
    fn default() -> Self {
        Self {
            days: default_retention_days(),
        }
    }
}

fn default_retention_days() -> i32 {
    30
}

/// Base backups.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BaseBackupSpec {
    /// When to take a base backup: a five-field cron expression (minute hour day-of-month
    /// month day-of-week, numbers only, e.g. `0 2 * * *`). No scheduled base backups when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::cron_pattern()))]
    pub schedule: Option<String>,

    /// After each base backup, restore it into a scratch instance and check that
    /// PostgreSQL starts from it.
    #[serde(default)]
    pub verify: bool,
}

/// Logical backups.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LogicalBackupSpec {
    /// When to take a logical backup: a five-field cron expression like
    /// `base.schedule`. No scheduled logical backups when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::cron_pattern()))]
    pub schedule: Option<String>,
}

impl From<v1alpha1::PostgresClusterSpec> for PostgresClusterSpec {
    fn from(s: v1alpha1::PostgresClusterSpec) -> Self {
        Self {
            instances: s.replicas,
            image: s.image,
            storage: s.storage,
            wal_storage: s.wal_storage,
            resources: s.resources,
            postgresql: PostgresqlSpec {
                version: s.postgres_version,
                parameters: s.postgresql.parameters,
                pg_hba: s.postgresql.pg_hba,
            },
            scheduling: s.affinity,
            ha: HaSpec {
                failover_delay: s.failover_delay,
                switchover_timeout: s.switchover_timeout,
                synchronous: SynchronousSpec {
                    standbys: s.replication.synchronous,
                    data_durability: s.replication.data_durability,
                },
            },
            tls: s.tls,
            credentials: s.credentials,
            network_policy: s.network_policy,
            backup: s.backup.map(|b| BackupSpec {
                store: b.store,
                timezone: b.timezone,
                retention: RetentionSpec {
                    days: b.retention_days,
                },
                base: BaseBackupSpec {
                    schedule: b.schedule,
                    verify: b.verify,
                },
                logical: LogicalBackupSpec {
                    schedule: b.logical_schedule,
                },
            }),
            bootstrap: s.bootstrap,
            paused: s.paused,
            hibernate: s.hibernate,
            fenced_instances: s.fenced_instances,
            roles: s.roles,
            databases: s.databases,
            poolers: s.poolers,
            external_clusters: s.external_clusters,
            replica: s.replica,
        }
    }
}

impl From<PostgresClusterSpec> for v1alpha1::PostgresClusterSpec {
    fn from(s: PostgresClusterSpec) -> Self {
        Self {
            replicas: s.instances,
            image: s.image,
            postgres_version: s.postgresql.version,
            storage: s.storage,
            wal_storage: s.wal_storage,
            resources: s.resources,
            postgresql: v1alpha1::PostgresqlSpec {
                parameters: s.postgresql.parameters,
                pg_hba: s.postgresql.pg_hba,
            },
            affinity: s.scheduling,
            replication: v1alpha1::ReplicationSpec {
                synchronous: s.ha.synchronous.standbys,
                data_durability: s.ha.synchronous.data_durability,
            },
            tls: s.tls,
            credentials: s.credentials,
            network_policy: s.network_policy,
            failover_delay: s.ha.failover_delay,
            switchover_timeout: s.ha.switchover_timeout,
            backup: s.backup.map(|b| v1alpha1::BackupSpec {
                schedule: b.base.schedule,
                logical_schedule: b.logical.schedule,
                timezone: b.timezone,
                retention_days: b.retention.days,
                store: b.store,
                verify: b.base.verify,
            }),
            bootstrap: s.bootstrap,
            paused: s.paused,
            hibernate: s.hibernate,
            fenced_instances: s.fenced_instances,
            roles: s.roles,
            databases: s.databases,
            poolers: s.poolers,
            external_clusters: s.external_clusters,
            replica: s.replica,
        }
    }
}

impl From<v1alpha1::PostgresCluster> for PostgresCluster {
    /// The same object in `v1beta1`: metadata and status as they are, the spec moved.
    fn from(c: v1alpha1::PostgresCluster) -> Self {
        Self {
            metadata: c.metadata,
            spec: c.spec.into(),
            status: c.status,
        }
    }
}

impl From<PostgresCluster> for v1alpha1::PostgresCluster {
    /// The same object in `v1alpha1`: metadata and status as they are, the spec moved.
    fn from(c: PostgresCluster) -> Self {
        Self {
            metadata: c.metadata,
            spec: c.spec.into(),
            status: c.status,
        }
    }
}

/// The spec with every default the schema cannot express filled in: those of
/// [`crate::with_defaults`], the same fields in their `v1beta1` places.
pub fn with_defaults(spec: PostgresClusterSpec) -> PostgresClusterSpec {
    crate::with_defaults(spec.into()).into()
}

/// Where each `v1alpha1` field that moved lives in `v1beta1` (the table above), longest
/// first where one is the prefix of another.
const MOVED: &[(&str, &str)] = &[
    ("spec.replicas", "spec.instances"),
    ("spec.postgresVersion", "spec.postgresql.version"),
    ("spec.affinity", "spec.scheduling"),
    ("spec.failoverDelay", "spec.ha.failoverDelay"),
    ("spec.switchoverTimeout", "spec.ha.switchoverTimeout"),
    (
        "spec.replication.synchronous",
        "spec.ha.synchronous.standbys",
    ),
    (
        "spec.replication.dataDurability",
        "spec.ha.synchronous.dataDurability",
    ),
    ("spec.replication", "spec.ha.synchronous"),
    ("spec.backup.schedule", "spec.backup.base.schedule"),
    ("spec.backup.verify", "spec.backup.base.verify"),
    (
        "spec.backup.logicalSchedule",
        "spec.backup.logical.schedule",
    ),
    ("spec.backup.retentionDays", "spec.backup.retention.days"),
];

/// A `v1alpha1` field path (`spec.replication.synchronous`, `spec.affinity.tolerations[0]`)
/// as it is called in `v1beta1`; a path that did not move is returned as it is.
pub fn field_path(v1alpha1_path: &str) -> String {
    for (from, to) in MOVED {
        if let Some(rest) = v1alpha1_path.strip_prefix(from)
            && (rest.is_empty() || rest.starts_with(['.', '[']))
        {
            return format!("{to}{rest}");
        }
    }
    v1alpha1_path.to_string()
}

/// `text` (a message of pgop's validation) with every `v1alpha1` field path in it named as
/// in `v1beta1`: how a refusal reads to someone who wrote `v1beta1`.
pub fn with_field_paths(text: &str) -> String {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '[' | ']' | '_');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("spec.") {
        let starts_word = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'));
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail.find(|c| !is_path_char(c)).unwrap_or(tail.len());
        // A sentence's full stop is not part of the path.
        let path = tail[..end].trim_end_matches('.');
        if starts_word {
            out.push_str(&field_path(path));
        } else {
            out.push_str(path);
        }
        rest = &tail[path.len()..];
    }
    out.push_str(rest);
    out
}

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("the object has no apiVersion")]
    NoApiVersion,
    #[error("pgop converts PostgresCluster between {V1ALPHA1} and {API_VERSION}, not {0}")]
    Version(String),
    #[error("the object is not a {0} PostgresCluster")]
    Decode(String, #[source] serde_json::Error),
    #[error("the converted spec does not encode")]
    Encode(#[source] serde_json::Error),
}

/// The API version of `v1alpha1`.
pub const V1ALPHA1: &str = "database.example.com/v1alpha1";

/// Converts one PostgresCluster (as the API server sends it to the conversion webhook) to
/// `desired` (`database.example.com/v1alpha1` or `/v1beta1`): the spec is rewritten, and
/// everything else (`metadata`, `status`, any other field) is kept as it is. An object
/// already in `desired` comes back unchanged.
pub fn convert(
    mut object: serde_json::Value,
    desired: &str,
) -> Result<serde_json::Value, ConvertError> {
    let from = object
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .ok_or(ConvertError::NoApiVersion)?
        .to_string();
    for version in [&from, desired] {
        if version != V1ALPHA1 && version != API_VERSION {
            return Err(ConvertError::Version(version.to_string()));
        }
    }
    if from == desired {
        return Ok(object);
    }
    let spec = object
        .get_mut("spec")
        .map(serde_json::Value::take)
        .unwrap_or(serde_json::Value::Null);
    let converted = if from == V1ALPHA1 {
        let alpha: v1alpha1::PostgresClusterSpec =
            serde_json::from_value(spec).map_err(|e| ConvertError::Decode(from.clone(), e))?;
        serde_json::to_value(PostgresClusterSpec::from(alpha))
    } else {
        let beta: PostgresClusterSpec =
            serde_json::from_value(spec).map_err(|e| ConvertError::Decode(from.clone(), e))?;
        serde_json::to_value(v1alpha1::PostgresClusterSpec::from(beta))
    }
    .map_err(ConvertError::Encode)?;
    object["spec"] = converted;
    object["apiVersion"] = serde_json::Value::String(desired.to_string());
    Ok(object)
}

/// Answers a `ConversionReview`: every object of the request converted to the version
/// asked for, or a failure naming the first object that could not be converted (the API
/// server then fails the request it was serving, rather than hand out a half-converted
/// list). The second value is whether it converted. What the operator's `POST /convert`
/// serves.
pub fn review(review: ConversionReview) -> (ConversionReview, bool) {
    let mut request = match ConversionRequest::try_from(review) {
        Ok(request) => request,
        Err(e) => {
            let status = Status::failure(&e.to_string(), "BadRequest").with_code(400);
            return (ConversionResponse::invalid(status).into_review(), false);
        }
    };
    let desired = request.desired_api_version.clone();
    let objects = std::mem::take(&mut request.objects);
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    for object in objects {
        let name = object
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_string();
        match convert(object, &desired) {
            Ok(object) => converted.push(object),
            Err(e) => {
                let message = format!(
                    "pgop could not convert PostgresCluster {name:?} to {desired}: {}",
                    crate::error_chain(&e)
                );
                let status = Status::failure(&message, "Invalid").with_code(422);
                return (response.failure(status).into_review(), false);
            }
        }
    }
    (response.success(converted).into_review(), true)
}

/// [`review`] of a request body (JSON), answered as a response body (JSON): an
/// undecodable body is answered as an invalid review.
pub fn review_json(body: &[u8]) -> Vec<u8> {
    let answer = match serde_json::from_slice::<ConversionReview>(body) {
        Ok(request) => review(request).0,
        Err(e) => {
            let status = Status::failure(&format!("not a ConversionReview: {e}"), "BadRequest")
                .with_code(400);
            ConversionResponse::invalid(status).into_review()
        }
    };
    serde_json::to_vec(&answer).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A small deterministic generator (xorshift64*): the same seed, the same specs.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn coin(&mut self) -> bool {
            self.below(2) == 0
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            let i = usize::try_from(self.below(from.len() as u64)).unwrap_or(0);
            from[i]
        }
        fn int(&mut self, lo: i64, hi: i64) -> i64 {
            lo + i64::try_from(self.below(u64::try_from(hi - lo + 1).unwrap_or(1))).unwrap_or(0)
        }
        /// A value made by `value` under `key` in `object`, or nothing, by a coin.
        fn maybe(&mut self, object: &mut Value, key: &str, value: impl FnOnce(&mut Self) -> Value) {
            if self.coin() {
                object[key] = value(self);
            }
        }
    }

    fn store(g: &mut Gen) -> Value {
        if g.coin() {
            json!({"volume": {"claimName": g.pick(&["backups", "archive-1"])}})
        } else {
            json!({"s3": {
                "bucket": g.pick(&["backups", "pg.archive"]),
                "endpoint": g.pick(&["https://minio.storage:9000", "http://10.0.0.1"]),
                "path": g.pick(&["clusters/prod", "a/b"]),
                "credentialsSecret": {"name": "s3", "accessKeyIdKey": g.pick(&["AWS_ACCESS_KEY_ID", "id"])}
            }})
        }
    }

    fn scheduling(g: &mut Gen) -> Value {
        let mut v = json!({});
        g.maybe(&mut v, "podAntiAffinityType", |g| {
            json!(g.pick(&["preferred", "required"]))
        });
        g.maybe(&mut v, "topologyKey", |g| {
            json!(g.pick(&["kubernetes.io/hostname", "topology.kubernetes.io/zone"]))
        });
        g.maybe(
            &mut v,
            "nodeSelector",
            |g| json!({"disk": g.pick(&["ssd", "hdd"])}),
        );
        g.maybe(&mut v, "tolerations", |_| json!([{"key": "dedicated", "operator": "Equal", "value": "pg", "effect": "NoSchedule"}]));
        g.maybe(&mut v, "topologySpread", |g| json!([{"topologyKey": "topology.kubernetes.io/zone", "maxSkew": g.int(1, 9), "whenUnsatisfiable": g.pick(&["ScheduleAnyway", "DoNotSchedule"])}]));
        g.maybe(&mut v, "nodeAffinity", |g| json!({"required": [{"matchExpressions": [{"key": "disktype", "operator": g.pick(&["In", "NotIn"]), "values": ["ssd"]}]}], "preferred": [{"weight": g.int(1, 100), "matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}));
        g.maybe(&mut v, "priorityClassName", |g| {
            json!(g.pick(&["databases", "high"]))
        });
        v
    }

    fn common(g: &mut Gen, v: &mut Value) {
        v["storage"] = json!({"size": g.pick(&["1Gi", "10Gi", "1.5Ti", "500M"])});
        if g.coin() {
            v["storage"]["storageClassName"] = json!(g.pick(&["fast", "local-path"]));
        }
        if g.coin() {
            v["storage"]["autoGrow"] = json!({"thresholdPercent": g.int(50, 95), "maxSize": "2Ti"});
        }
        g.maybe(
            v,
            "walStorage",
            |g| json!({"size": g.pick(&["1Gi", "512Mi"]), "storageClassName": "fast"}),
        );
        g.maybe(v, "image", |g| {
            json!(g.pick(&["pgop:0.1.0", "registry.example.com:5000/pgop:0.2.0"]))
        });
        g.maybe(
            v,
            "resources",
            |_| json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}),
        );
        g.maybe(
            v,
            "tls",
            |g| json!({"allowPlaintext": g.coin(), "serverSecret": "tls-server"}),
        );
        g.maybe(
            v,
            "credentials",
            |g| json!({"appSecret": "app", "superuserAccess": g.coin()}),
        );
        g.maybe(
            v,
            "networkPolicy",
            |g| json!({"enabled": g.coin(), "clients": [{"podLabels": {"app": "web"}}]}),
        );
        match g.below(3) {
            0 => {}
            1 => v["bootstrap"] = json!({"initdb": {"database": "shop", "owner": "shop"}}),
            _ => {
                v["bootstrap"] =
                    json!({"recovery": {"backup": "nightly", "targetTime": "2026-01-31T12:00:00Z"}})
            }
        }
        g.maybe(v, "paused", |g| json!(g.coin()));
        g.maybe(v, "hibernate", |g| json!(g.coin()));
        g.maybe(v, "roles", |g| {
            json!([{"name": "reporting", "login": g.coin(), "inRoles": ["pg_monitor"],
                "connectionLimit": g.int(-1, 20), "passwordSecret": {"name": "reporting"}}])
        });
        g.maybe(v, "databases", |g| {
            json!([{"name": "shop", "owner": "reporting", "connectionLimit": g.int(-1, 20),
                "schemas": [{"name": "sales"}],
                "extensions": [{"name": "pgcrypto", "schema": "sales"}]}])
        });
        g.maybe(v, "fencedInstances", |g| match g.below(2) {
            0 => json!(["demo-1"]),
            _ => json!(["demo-2", "demo-3"]),
        });
        g.maybe(v, "externalClusters", |g| {
            let connection = json!({"host": "db.site-a.example.com", "port": g.int(1, 65535),
                "user": "streaming_replica", "sslMode": g.pick(&["verify-full", "verify-ca"]),
                "passwordSecret": {"name": "site-a"}, "caSecret": {"name": "site-a-ca"}});
            let store = json!({"s3": {"bucket": "site-a", "credentialsSecret": {"name": "s3"}},
                "cluster": "db"});
            match g.below(3) {
                0 => json!([{"name": "site-a", "connection": connection}]),
                1 => json!([{"name": "site-a", "store": store}]),
                _ => json!([{"name": "site-a", "connection": connection, "store": store},
                    {"name": "old-vm", "connection": {"host": "10.0.3.7", "user": "app",
                        "sslMode": "require", "dbname": "shop"}}]),
            }
        });
        // A replica of an entry with a connection, never with a restore.
        let followable = v["externalClusters"]
            .as_array()
            .and_then(|entries| entries.iter().find(|e| e.get("connection").is_some()))
            .and_then(|e| e["name"].as_str())
            .map(str::to_string);
        if let Some(source) = followable
            && v["bootstrap"].get("recovery").is_none()
        {
            g.maybe(v, "replica", |g| {
                json!({"source": source, "enabled": g.coin(), "maxLagSeconds": g.int(1, 86400),
                        "promotionMaxLagSeconds": g.int(0, 86400)})
            });
        }
    }

    fn alpha(g: &mut Gen) -> v1alpha1::PostgresClusterSpec {
        let replicas = g.int(1, 9);
        let mut v = json!({});
        common(g, &mut v);
        g.maybe(&mut v, "replicas", |_| json!(replicas));
        g.maybe(&mut v, "postgresVersion", |_| json!(15));
        g.maybe(&mut v, "postgresql", |_| json!({"parameters": {"work_mem": "8MB"}, "pgHba": ["host all all 10.0.0.0/8 scram-sha-256"]}));
        g.maybe(&mut v, "affinity", scheduling);
        g.maybe(&mut v, "replication", |g| json!({"synchronous": g.int(0, 8), "dataDurability": g.pick(&["preferred", "required"])}));
        g.maybe(&mut v, "failoverDelay", |g| json!(g.int(0, 30)));
        g.maybe(&mut v, "switchoverTimeout", |g| json!(g.int(1, 600)));
        if g.coin() {
            let mut b = json!({});
            g.maybe(&mut b, "schedule", |_| json!("0 2 * * *"));
            g.maybe(&mut b, "logicalSchedule", |_| json!("30 3 * * 0"));
            g.maybe(&mut b, "timezone", |g| {
                json!(g.pick(&["UTC", "Europe/Berlin"]))
            });
            g.maybe(&mut b, "retentionDays", |g| json!(g.int(1, 365)));
            g.maybe(&mut b, "verify", |g| json!(g.coin()));
            g.maybe(&mut b, "store", store);
            v["backup"] = b;
        }
        serde_json::from_value(v).expect("a generated v1alpha1 spec")
    }

    fn beta(g: &mut Gen) -> PostgresClusterSpec {
        let mut v = json!({});
        common(g, &mut v);
        g.maybe(&mut v, "instances", |g| json!(g.int(1, 9)));
        let mut pg = json!({});
        g.maybe(&mut pg, "version", |_| json!(15));
        g.maybe(
            &mut pg,
            "parameters",
            |_| json!({"shared_buffers": "256MB"}),
        );
        g.maybe(&mut pg, "pgHba", |_| {
            json!(["hostssl all all 0.0.0.0/0 cert"])
        });
        g.maybe(&mut v, "postgresql", move |_| pg);
        g.maybe(&mut v, "scheduling", scheduling);
        let mut ha = json!({});
        g.maybe(&mut ha, "failoverDelay", |g| json!(g.int(0, 30)));
        g.maybe(&mut ha, "switchoverTimeout", |g| json!(g.int(1, 600)));
        g.maybe(&mut ha, "synchronous", |g| json!({"standbys": g.int(0, 8), "dataDurability": g.pick(&["preferred", "required"])}));
        g.maybe(&mut v, "ha", move |_| ha);
        if g.coin() {
            let mut b = json!({});
            g.maybe(&mut b, "store", store);
            g.maybe(&mut b, "timezone", |_| json!("Asia/Tokyo"));
            g.maybe(&mut b, "retention", |g| json!({"days": g.int(1, 365)}));
            g.maybe(
                &mut b,
                "base",
                |g| json!({"schedule": "15 1 * * *", "verify": g.coin()}),
            );
            g.maybe(&mut b, "logical", |_| json!({"schedule": "0 4 1 * *"}));
            v["backup"] = b;
        }
        serde_json::from_value(v).expect("a generated v1beta1 spec")
    }

    #[test]
    fn v1alpha1_to_v1beta1_and_back_is_the_identity() {
        let mut g = Gen(0x5eed_1234_abcd_0001);
        for _ in 0..2000 {
            let a = alpha(&mut g);
            let b = PostgresClusterSpec::from(a.clone());
            assert_eq!(v1alpha1::PostgresClusterSpec::from(b), a);
        }
    }

    #[test]
    fn v1beta1_to_v1alpha1_and_back_is_the_identity() {
        let mut g = Gen(0x5eed_1234_abcd_0002);
        for _ in 0..2000 {
            let b = beta(&mut g);
            let a = v1alpha1::PostgresClusterSpec::from(b.clone());
            assert_eq!(PostgresClusterSpec::from(a), b);
        }
    }

    #[test]
    fn the_defaults_agree_and_each_field_lands_where_the_table_says() {
        let a: v1alpha1::PostgresClusterSpec =
            serde_json::from_value(json!({"storage": {"size": "1Gi"}})).expect("minimal");
        let b: PostgresClusterSpec =
            serde_json::from_value(json!({"storage": {"size": "1Gi"}})).expect("minimal");
        assert_eq!(PostgresClusterSpec::from(a), b, "the same defaults in both");

        let a: v1alpha1::PostgresClusterSpec = serde_json::from_value(json!({
            "replicas": 3, "postgresVersion": 15, "storage": {"size": "1Gi"},
            "replication": {"synchronous": 1, "dataDurability": "required"},
            "failoverDelay": 5, "switchoverTimeout": 90,
            "affinity": {"podAntiAffinityType": "required"},
            "backup": {"schedule": "0 2 * * *", "logicalSchedule": "0 3 * * *",
                       "retentionDays": 7, "verify": true}
        }))
        .expect("a v1alpha1 spec");
        let b = serde_json::to_value(PostgresClusterSpec::from(a)).expect("json");
        assert_eq!(b["instances"], 3);
        assert_eq!(b["postgresql"]["version"], 15);
        assert_eq!(
            b["ha"],
            json!({"failoverDelay": 5, "switchoverTimeout": 90, "synchronous": {"standbys": 1, "dataDurability": "required"}})
        );
        assert_eq!(b["scheduling"]["podAntiAffinityType"], "required");
        assert_eq!(
            b["backup"]["base"],
            json!({"schedule": "0 2 * * *", "verify": true})
        );
        assert_eq!(b["backup"]["logical"], json!({"schedule": "0 3 * * *"}));
        assert_eq!(b["backup"]["retention"], json!({"days": 7}));
    }

    #[test]
    fn convert_rewrites_the_spec_and_keeps_metadata_and_status() {
        let alpha = json!({
            "apiVersion": V1ALPHA1,
            "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "shop", "uid": "u-1",
                         "annotations": {"note": "a \"quoted\" value\nwith a newline"}},
            "spec": {"replicas": 3, "storage": {"size": "1Gi"},
                     "replication": {"synchronous": 1}},
            "status": {"phase": "Healthy", "readyReplicas": 3}
        });
        let beta = convert(alpha.clone(), API_VERSION).expect("to v1beta1");
        assert_eq!(beta["apiVersion"], API_VERSION);
        assert_eq!(beta["metadata"], alpha["metadata"]);
        assert_eq!(beta["status"], alpha["status"]);
        assert_eq!(beta["spec"]["instances"], 3);
        assert_eq!(beta["spec"]["ha"]["synchronous"]["standbys"], 1);
        assert!(beta["spec"].get("replicas").is_none());
        let back = convert(beta, V1ALPHA1).expect("to v1alpha1");
        assert_eq!(back["metadata"], alpha["metadata"]);
        let spec: v1alpha1::PostgresClusterSpec =
            serde_json::from_value(back["spec"].clone()).expect("a v1alpha1 spec");
        let original: v1alpha1::PostgresClusterSpec =
            serde_json::from_value(alpha["spec"].clone()).expect("a v1alpha1 spec");
        assert_eq!(spec, original);
        // Already in the version asked for: untouched, byte for byte.
        assert_eq!(convert(alpha.clone(), V1ALPHA1).expect("same"), alpha);
    }

    #[test]
    fn convert_refuses_other_versions_and_unreadable_specs_by_name() {
        let err = |v: Value, to: &str| convert(v, to).expect_err("refused").to_string();
        let obj = json!({"apiVersion": V1ALPHA1, "spec": {"storage": {"size": "1Gi"}}});
        assert!(
            err(obj.clone(), "database.example.com/v2").contains("not database.example.com/v2")
        );
        assert!(err(json!({"spec": {}}), API_VERSION).contains("no apiVersion"));
        let bad = json!({"apiVersion": V1ALPHA1, "spec": {"replicas": "three"}});
        assert!(
            err(bad, API_VERSION).contains("not a database.example.com/v1alpha1 PostgresCluster")
        );
    }

    #[test]
    fn v1alpha1_field_paths_are_named_as_in_v1beta1() {
        assert_eq!(field_path("spec.replicas"), "spec.instances");
        assert_eq!(field_path("spec.replication"), "spec.ha.synchronous");
        assert_eq!(
            field_path("spec.replication.synchronous"),
            "spec.ha.synchronous.standbys"
        );
        assert_eq!(
            field_path("spec.affinity.tolerations[0].key"),
            "spec.scheduling.tolerations[0].key"
        );
        assert_eq!(field_path("spec.backup.store.s3"), "spec.backup.store.s3");
        // A segment boundary, not a prefix of another name.
        assert_eq!(field_path("spec.replicasX"), "spec.replicasX");
        assert_eq!(
            with_field_paths(
                "spec.replication.synchronous: must be less than spec.replicas: every synchronous standby. Also spec.backup.schedule."
            ),
            "spec.ha.synchronous.standbys: must be less than spec.instances: every synchronous standby. Also spec.backup.base.schedule."
        );
        assert_eq!(
            with_field_paths("xspec.replicas and status.spec.replicas stay"),
            "xspec.replicas and status.spec.replicas stay"
        );
        assert_eq!(with_field_paths("no paths here"), "no paths here");
    }
}
