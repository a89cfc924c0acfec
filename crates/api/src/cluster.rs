//! `PostgresCluster`: one highly available PostgreSQL cluster (a primary and its standbys).
//! This file holds version `v1alpha1`: its spec, and the sub-specs `v1beta1` takes over
//! as they are (storage, TLS, data durability, bootstrap).
//!
//! Every field's doc comment is what `kubectl explain` shows. Every schema rule (range,
//! pattern, CEL) has a twin in [`crate::validation`], so a spec that slips past one layer
//! is caught by the next with the same field named.
//!
//! The status, the same in both versions, is in `crate::cluster_status`, and the backup
//! stores both the spec and the status name are in `crate::backup_store`; this file
//! re-exports their types, so each keeps its path under `crate::cluster`.

use crate::affinity::AffinitySpec;
use crate::cel;
use crate::formats;
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::backup_store::{BackupStore, S3Credentials, S3Store, VolumeStore};
pub use crate::cluster_status::{
    AutoGrowStatus, ClusterPhase, InstanceRestart, InstanceRole, InstanceStatus, MajorUpgrade,
    MajorUpgradeMode, MajorUpgradePhase, PostgresClusterStatus, RecoverySource, RestartRequest,
};

pub use crate::reserved::{
    OWNED_PARAMETERS, RESERVED_NAME_PREFIX, RESERVED_NAMES, UNSUPPORTED_PARAMETER_PREFIX,
    UNSUPPORTED_PARAMETERS, is_owned_parameter, is_reserved_name, is_unsupported_parameter,
};

/// PostgreSQL major versions pgop runs (`spec.postgresVersion`).
pub const SUPPORTED_POSTGRES_VERSIONS: &[i32] = &[15, 18];
/// The major version of a cluster whose `spec.postgresVersion` is unset: the one every
/// cluster ran before the field meant anything, so that such a cluster keeps it.
pub const DEFAULT_POSTGRES_VERSION: i32 = 15;

pub use crate::reserved::{MAX_CLUSTER_NAME_LENGTH, MAX_PARAMETERS, MAX_REPLICAS};

/// The desired state of a highly available PostgreSQL cluster: one primary and
/// `replicas - 1` streaming standbys, each with its own volume.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "database.example.com",
    version = "v1alpha1",
    kind = "PostgresCluster",
    namespaced,
    doc = "A highly available PostgreSQL cluster managed by pgop: a primary, streaming standbys, their volumes, services, credentials and backups.",
    shortname = "pgc",
    category = "pgop",
    status = "PostgresClusterStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
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
#[x_kube(validation = cel::synchronous_below_replicas())]
#[x_kube(validation = cel::replica_source_is_entry())]
#[x_kube(validation = cel::replica_store_is_s3())]
#[x_kube(validation = cel::replica_without_recovery())]
#[serde(rename_all = "camelCase")]
pub struct PostgresClusterSpec {
    /// Number of PostgreSQL instances: one primary and `replicas - 1` streaming standbys
    /// (1 to 9). Each standby holds a WAL sender and a replication slot on the primary.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 9))]
    pub replicas: i32,

    /// Container image of the instances: the pgop image with PostgreSQL inside, as an image
    /// reference (`registry.example.com:5000/pgop:0.2.0`, optionally `@sha256:...`), at most
    /// 512 characters. Defaults to the operator's own image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), pattern(formats::IMAGE_PATTERN))]
    pub image: Option<String>,

    /// PostgreSQL major version the instances run: 15 (the default) or 18. It picks the
    /// binaries each instance manager runs (`/usr/lib/postgresql/<version>/bin`, or where
    /// `hack/install-postgres18.sh` puts 18 on the local node). Raising it on a running
    /// cluster upgrades the data in place (`status.majorUpgrade`); it is never lowered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = SUPPORTED_POSTGRES_VERSIONS))]
    pub postgres_version: Option<i32>,

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

    /// PostgreSQL configuration: parameters for postgresql.conf and extra pg_hba.conf rules.
    #[serde(default)]
    pub postgresql: PostgresqlSpec,

    /// Where the instance Pods may run and how strictly they are kept apart: pod
    /// anti-affinity `preferred` (the default) or `required` over a topology key (nodes by
    /// default), a node selector and tolerations.
    #[serde(default)]
    pub affinity: AffinitySpec,

    /// Streaming replication: how many standbys confirm each commit.
    #[serde(default)]
    pub replication: ReplicationSpec,

    /// TLS of PostgreSQL's connections. PostgreSQL always serves TLS (1.2 or later) with a
    /// certificate from the cluster's own authority, and standbys always replicate over it
    /// with a client certificate.
    #[serde(default)]
    pub tls: TlsSpec,

    /// Where the application owner's and the superuser's passwords come from, and whether
    /// the superuser may log in over the network (it may not by default).
    #[serde(default)]
    pub credentials: crate::credentials::CredentialsSpec,

    /// The NetworkPolicy pgop keeps for the instance Pods: PostgreSQL from the cluster's
    /// own instances and the selected clients (anyone by default), the manager's read-only
    /// port from anywhere, its mutual-TLS port from the operator only.
    #[serde(default)]
    pub network_policy: crate::network::NetworkPolicySpec,

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

    /// Scheduled base backups, their retention and the store they go to. WAL is archived
    /// to the same store.
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

/// Longest instance name: the longest cluster name, `-` and a serial of up to 10 digits.
pub const MAX_INSTANCE_NAME_LENGTH: usize = MAX_CLUSTER_NAME_LENGTH + 11;
/// An instance name: a cluster name, `-`, a serial.
pub const INSTANCE_NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[1-9][0-9]{0,9}$";

fn default_replicas() -> i32 {
    1
}

fn default_switchover_timeout() -> i32 {
    60
}

/// The persistent volume of each instance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::storage_class_immutable())]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Size of each instance's volume, as a Kubernetes quantity of bytes greater than zero,
    /// e.g. `10Gi` or `500M` (no exponent, no milli).
    #[schemars(pattern(formats::QUANTITY_PATTERN))]
    pub size: String,

    /// StorageClass of the instances' volumes; the cluster's default StorageClass when
    /// unset. Immutable once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub storage_class_name: Option<String>,

    /// Grow the volumes when they fill up: when an instance reports its data volume more
    /// than `thresholdPercent` full, every volume of the cluster is grown by
    /// `increasePercent`, up to `maxSize` (the StorageClass must allow expansion). Unset:
    /// volumes grow only when `size` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_grow: Option<AutoGrowSpec>,
}

/// A separate volume for each instance's write-ahead log (`spec.walStorage`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::storage_class_immutable())]
#[serde(rename_all = "camelCase")]
pub struct WalStorageSpec {
    /// Size of each instance's WAL volume, a Kubernetes quantity of bytes greater than
    /// zero (e.g. `2Gi`); it may grow, never shrink. It must hold `max_wal_size` (1GB by
    /// default) and the WAL kept for standbys and archiving.
    #[schemars(pattern(formats::QUANTITY_PATTERN))]
    pub size: String,

    /// StorageClass of the WAL volumes; the cluster's default StorageClass when unset.
    /// Immutable once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub storage_class_name: Option<String>,
}

/// Lowest `storage.autoGrow.thresholdPercent`.
pub const MIN_AUTO_GROW_THRESHOLD: i32 = 50;
/// Highest `storage.autoGrow.thresholdPercent`.
pub const MAX_AUTO_GROW_THRESHOLD: i32 = 95;
/// Lowest `storage.autoGrow.increasePercent`.
pub const MIN_AUTO_GROW_INCREASE: i32 = 10;
/// Highest `storage.autoGrow.increasePercent`.
pub const MAX_AUTO_GROW_INCREASE: i32 = 100;

/// `storage.autoGrow`: when and how far the volumes grow on their own.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoGrowSpec {
    /// Grow when an instance's data volume is more than this full, in percent (50 to 95,
    /// default 80).
    #[serde(default = "default_auto_grow_threshold")]
    #[schemars(range(min = MIN_AUTO_GROW_THRESHOLD, max = MAX_AUTO_GROW_THRESHOLD))]
    pub threshold_percent: i32,

    /// Each growth adds this share of the current size, in percent (10 to 100, default
    /// 50), rounded up to a whole MiB and capped at `maxSize`.
    #[serde(default = "default_auto_grow_increase")]
    #[schemars(range(min = MIN_AUTO_GROW_INCREASE, max = MAX_AUTO_GROW_INCREASE))]
    pub increase_percent: i32,

    /// The largest size auto-grow gives a volume, a quantity of bytes at least
    /// `storage.size`; past it, a volume over the threshold is reported (Warning Event
    /// `VolumeAutoGrowLimit`), not grown.
    #[schemars(pattern(formats::QUANTITY_PATTERN))]
    pub max_size: String,
}

fn default_auto_grow_threshold() -> i32 {
    80
}

fn default_auto_grow_increase() -> i32 {
    50
}

/// PostgreSQL configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
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
    /// before its final catch-all rule; at most 64 lines of at most 1024 characters. A line
    /// is `local`, `host`, `hostssl`, `hostnossl` or `hostnogssenc`, two to four fields, a
    /// method (`trust`, `reject`, `scram-sha-256`, `md5`, `password`, `peer`, `ident`,
    /// `ldap`, `radius`, `pam`, `gss`; `cert` with `hostssl` only) and `name=value`
    /// options; a field is plain or one double-quoted string. No `@file`, no `#`, no
    /// control characters. The superuser `postgres` never logs in over the network, and
    /// connections without TLS are refused before these rules unless
    /// `spec.tls.allowPlaintext`, whatever the rules say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(max = 1024), pattern(formats::HBA_LINE_PATTERN))
    )]
    pub pg_hba: Vec<String>,
}

/// TLS of PostgreSQL's connections.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Accept client connections without TLS. Off by default: PostgreSQL refuses a
    /// connection that is not encrypted before any `spec.postgresql.pgHba` rule is read.
    /// Turning it on lets passwords and data cross the network in the clear; it is the
    /// user's choice. Replication uses TLS whatever this says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext: bool,

    /// A Secret of the cluster's namespace holding the server certificate PostgreSQL is to
    /// serve instead of one from the cluster's own authority, in the cert-manager shape:
    /// `tls.crt` (the certificate, then any intermediates), `tls.key` and `ca.crt` (the
    /// authority clients verify it with; the app Secret's `ca.crt` then holds it). It must
    /// be valid for the name `<cluster>-rw`, which the instances verify when they connect
    /// to each other. Read again at every reconcile: a renewed certificate is served
    /// without a restart. One that does not verify is refused with a `TLSSecretRefused`
    /// Event, and the certificate served so far stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub server_secret: Option<String>,

    /// A Secret of the cluster's namespace with `ca.crt`: an authority whose client
    /// certificates PostgreSQL accepts, for `hostssl ... cert` rules in
    /// `spec.postgresql.pgHba` (the certificate's common name is the user name).
    #[serde(
        default,
        rename = "clientCASecret",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub client_ca_secret: Option<String>,
}

/// Streaming replication settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = cel::required_durability_needs_synchronous())]
#[serde(rename_all = "camelCase")]
pub struct ReplicationSpec {
    /// Number of standbys that must confirm each commit before it is acknowledged
    /// (`ANY n` quorum over all standbys); 0 means asynchronous replication. Must be less
    /// than `spec.replicas`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 8))]
    pub synchronous: i32,

    /// What happens to commits when too few synchronous standbys are connected:
    /// `preferred` keeps accepting writes with fewer confirmations; `required` never
    /// acknowledges a commit that only the primary has (writes wait instead).
    #[serde(default)]
    pub data_durability: DataDurability,
}

/// What happens to commits when too few synchronous standbys are connected: `preferred`
/// keeps accepting writes with fewer confirmations; `required` never acknowledges a commit
/// that only the primary has (writes wait instead).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum DataDurability {
    /// Keep writing with fewer synchronous standbys than asked for.
    #[default]
    Preferred,
    /// Never acknowledge a commit that only the primary has.
    Required,
}

/// Base backups and WAL archiving.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::schedule_needs_store())]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// When to take a base backup: a five-field cron expression (minute hour day-of-month
    /// month day-of-week, numbers only, e.g. `0 2 * * *`). No scheduled backups when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::cron_pattern()))]
    pub schedule: Option<String>,

    /// When to take a logical backup (`pg_dump` of every database, plus the roles): a
    /// five-field cron expression like `schedule`. A second, independent method next to
    /// base backups; no scheduled logical backups when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::cron_pattern()))]
    pub logical_schedule: Option<String>,

    /// IANA time zone both schedules are read in, e.g. `Europe/Berlin`; UTC when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(formats::TIMEZONE_PATTERN))]
    pub timezone: Option<String>,

    /// Days a backup (and the WAL needed to restore it) is kept, 1 to 365; the newest
    /// completed backup of each method is kept whatever its age.
    #[serde(default = "default_retention_days")]
    #[schemars(range(min = 1, max = 365))]
    pub retention_days: i32,

    /// Where backups and archived WAL go. Required when `schedule` or `logicalSchedule`
    /// is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<BackupStore>,

    /// After each base backup, restore it into a scratch instance and check that
    /// PostgreSQL starts from it.
    #[serde(default)]
    pub verify: bool,
}

fn default_retention_days() -> i32 {
    30
}

/// How the first instance gets its data: at most one of `initdb` or `recovery`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::bootstrap_at_most_one())]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Create a new, empty database cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb: Option<InitdbSpec>,

    /// Restore from a base backup, optionally to a point in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,
}

/// A new database cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::unreserved_name("database"))]
#[x_kube(validation = cel::unreserved_name("owner"))]
#[serde(rename_all = "camelCase")]
pub struct InitdbSpec {
    /// Name of the application database to create: a lower-case PostgreSQL identifier of
    /// at most 63 characters, not reserved (`postgres`, `template0`, `template1`,
    /// `streaming_replica`, `public`, `none`, `current_user`, `current_role`,
    /// `session_user`, or anything starting with `pg_`).
    #[serde(default = "default_app")]
    #[schemars(pattern(formats::IDENTIFIER_PATTERN))]
    pub database: String,

    /// Name of the role that owns the application database; its password is stored in the
    /// Secret `<cluster>-app`. A lower-case identifier, not reserved (as `database`): the
    /// application never gets the superuser or the replication role.
    #[serde(default = "default_app")]
    #[schemars(pattern(formats::IDENTIFIER_PATTERN))]
    pub owner: String,
}

impl Default for InitdbSpec {
    fn default() -> Self {
        Self {
            database: default_app(),
            owner: default_app(),
        }
    }
}

fn default_app() -> String {
    "app".to_string()
}

/// A restore from a base backup: exactly one of `backup` or `store`, and at most one
/// recovery target (the end of the archived WAL when none).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::recovery_exactly_one_source())]
#[x_kube(validation = cel::recovery_at_most_one_target())]
#[x_kube(validation = cel::recovery_store_needs_source())]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Name of a completed PostgresBackup in this namespace to restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub backup: Option<String>,

    /// A backup store to restore from: the latest base backup before the target is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<BackupStore>,

    /// With `store`: the name of the cluster whose backups it holds (a store keeps each
    /// cluster's backups and WAL under the cluster's name). The restored cluster archives
    /// under its own name, so it never writes over the source's WAL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub source_cluster: Option<String>,

    /// Replay WAL up to this time (RFC 3339 with a time zone, e.g.
    /// `2025-01-31T12:00:00Z`; the day must exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::TIMESTAMP_PATTERN), extend("format" = "date-time"))]
    pub target_time: Option<String>,

    /// Replay WAL up to this LSN (e.g. `0/3000060`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(formats::LSN_PATTERN))]
    pub target_lsn: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance manager reads its cluster as the operator wrote it: one of another pgop
    /// version (an upgrade, a pinned `spec.image`) may have written fields this one does
    /// not know, or not yet those this one added.
    #[test]
    fn a_cluster_written_by_another_pgop_version_parses() {
        let newer: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "a", "generation": 3},
            "spec": {"replicas": 2, "storage": {"size": "1Gi"}},
            "status": {
                "currentPrimary": "db-1", "targetPrimary": "db-2", "nextSerial": 3,
                "aStatusFieldFromTheFuture": true,
                "instances": [{"name": "db-1", "serial": 1, "role": "primary",
                               "managerVersion": "0.2.0", "somethingNew": 1}]
            }
        }))
        .expect("unknown status fields are ignored");
        let status = newer.status.expect("status");
        assert_eq!(status.target_primary.as_deref(), Some("db-2"));
        assert_eq!(
            status.instances[0].manager_version.as_deref(),
            Some("0.2.0")
        );
        let older: PostgresClusterStatus = serde_json::from_value(serde_json::json!({
            "currentPrimary": "db-1", "targetPrimary": "db-1",
            "instances": [{"name": "db-1", "serial": 1, "role": "primary", "ready": true}]
        }))
        .expect("an older operator's status parses");
        assert_eq!(older.instances[0].manager_version, None);
    }
}
