//! Names shared by the operator and the instance manager: API group, field manager,
//! annotations, ports and HTTP paths. Both sides import them from here so they cannot drift.

/// The API group of pgop's custom resources.
pub const GROUP: &str = "database.example.com";
/// The served and stored version of pgop's custom resources.
pub const VERSION: &str = "v1alpha1";
/// `group/version`, as written in `apiVersion`: the only version of PostgresBackup, and the
/// first of PostgresCluster (see [`crate::v1beta1`]).
pub const API_VERSION: &str = "database.example.com/v1alpha1";

/// The version of PostgresCluster that the ownerReferences of a cluster's children (and
/// of its instance managers' Lease and its scheduled backups) and its Events name:
/// `v1beta1`, the stored version. Children made by a pgop before it name `v1alpha1` and are
/// rewritten ([`crate::owner`]), so that `v1alpha1` can stop being served without leaving
/// children the garbage collector cannot resolve (docs/api.md, "Upgrading to v1beta1").
pub const CLUSTER_OWNER_API_VERSION: &str = "database.example.com/v1beta1";

/// The one field manager pgop uses for every server-side apply (children and status).
pub const FIELD_MANAGER: &str = "pgop";

/// The finalizer pgop puts on a PostgresCluster to clean up what ownerReferences cannot.
pub const CLUSTER_FINALIZER: &str = "database.example.com/finalizer";

/// Annotation on a PostgresCluster: set to an instance name to ask for a switchover to it.
pub const ANNOTATION_SWITCHOVER_TO: &str = "database.example.com/switchover-to";
/// Annotation on a PostgresCluster: set to any new value to ask the instances to restart.
pub const ANNOTATION_RESTART: &str = "database.example.com/restart";
/// Annotation on a PostgresCluster: instance names (one, or several separated by commas)
/// to restart, one at a time through the rolling restart; removed by pgop once recorded in
/// `status.instanceRestarts`.
pub const ANNOTATION_RESTART_INSTANCE: &str = "database.example.com/restart-instance";
/// Annotation on a child: a hash of the spec it was built from, to detect drift cheaply.
pub const ANNOTATION_SPEC_HASH: &str = "database.example.com/spec-hash";
/// Annotation on a PostgresBackup created by the schedule (value: the schedule that made it).
pub const ANNOTATION_SCHEDULED: &str = "database.example.com/scheduled";
/// Annotation on a PostgresBackup taken for an in-place major upgrade (value:
/// `<from>-to-<to>`), before it starts or once it completed.
pub const ANNOTATION_MAJOR_UPGRADE: &str = "database.example.com/major-upgrade";

/// PostgreSQL's superuser in every instance: the manager's role over the local socket only.
pub const SUPERUSER: &str = "postgres";
/// The role standbys replicate (and pg_rewind reads) with.
pub const REPLICATION_USER: &str = "streaming_replica";

/// The PostgreSQL port every instance listens on.
pub const POSTGRES_PORT: u16 = 5432;
/// Name of the PostgreSQL port in Pods and Services.
pub const POSTGRES_PORT_NAME: &str = "postgres";
/// The instance manager's HTTP port (health, readiness, status, metrics).
pub const MANAGER_PORT: u16 = 8000;
/// Name of the instance manager's port in Pods.
pub const MANAGER_PORT_NAME: &str = "manager";
/// The instance manager's HTTPS port with mutual TLS: every route, the state-changing
/// ones (backups, retention) only here, answered only to the operator's certificate.
pub const MANAGER_TLS_PORT: u16 = 8001;
/// Name of the instance manager's TLS port in Pods.
pub const MANAGER_TLS_PORT_NAME: &str = "manager-tls";
/// Suffix of the Secret holding the application owner's credentials, which the instances
/// read (`username`, `password`, `dbname`, `uri`, ...).
pub const APP_SECRET_SUFFIX: &str = "-app";
/// Suffix of the Secret holding the replication user's password.
pub const REPLICATION_SECRET_SUFFIX: &str = "-replication";
/// Suffix of the Secret holding the superuser's credentials, with
/// `spec.credentials.superuserAccess` only.
pub const SUPERUSER_SECRET_SUFFIX: &str = "-superuser";
/// Suffix of the Secret holding a cluster's certificate authority (`ca.crt`, `ca.key`):
/// only the operator reads it.
pub const CA_SECRET_SUFFIX: &str = "-ca";
/// Suffix of the Secret holding the instance managers' serving certificate (`tls.crt`,
/// `tls.key`) and the authority's certificate (`ca.crt`), which the instances read.
pub const MANAGER_TLS_SECRET_SUFFIX: &str = "-manager-tls";
/// Suffix of the Secret holding a cluster's PostgreSQL authority (`ca.crt`, `ca.key`),
/// which signs PostgreSQL's server and client certificates: only the operator reads it.
pub const POSTGRES_CA_SECRET_SUFFIX: &str = "-postgres-ca";
/// Suffix of the Secret holding PostgreSQL's serving certificate (`tls.crt`, `tls.key`,
/// `ca.crt`), which the instances read.
pub const SERVER_TLS_SECRET_SUFFIX: &str = "-server-tls";
/// Suffix of the Secret holding the replication user's client certificate (`tls.crt`,
/// `tls.key`, `ca.crt`), with which standbys connect to their primary.
pub const REPLICATION_TLS_SECRET_SUFFIX: &str = "-replication-tls";
/// Every Secret pgop keeps for a cluster, by suffix of the cluster's name: none of them may
/// be named where the spec names a user's Secret (pgop would copy a Secret onto itself, or
/// pin a certificate it should renew).
pub const OWN_SECRET_SUFFIXES: &[&str] = &[
    APP_SECRET_SUFFIX,
    REPLICATION_SECRET_SUFFIX,
    SUPERUSER_SECRET_SUFFIX,
    CA_SECRET_SUFFIX,
    MANAGER_TLS_SECRET_SUFFIX,
    POSTGRES_CA_SECRET_SUFFIX,
    SERVER_TLS_SECRET_SUFFIX,
    REPLICATION_TLS_SECRET_SUFFIX,
];
/// Annotation on a certificate's Secret: when the certificate expires (RFC 3339); the
/// operator renews it ahead of that.
pub const ANNOTATION_NOT_AFTER: &str = "database.example.com/not-after";
/// Annotation on PostgreSQL's server certificate Secret: the DNS names the certificate
/// holds, comma-separated; a new certificate is issued when the wanted names change.
pub const ANNOTATION_DNS_NAMES: &str = "database.example.com/dns-names";
/// Annotation on PostgreSQL's server certificate Secret when the certificate is the user's
/// (`spec.tls.serverSecret`): the Secret it was copied from.
pub const ANNOTATION_BROUGHT_FROM: &str = "database.example.com/copied-from";
/// The DNS domain of the Kubernetes cluster, in the fully qualified Service names of
/// PostgreSQL's server certificate.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Liveness of the instance manager.
pub const PATH_HEALTHZ: &str = "/healthz";
/// Readiness of the instance (PostgreSQL accepts connections in its expected role).
pub const PATH_READYZ: &str = "/readyz";
/// The instance's PostgreSQL status: role, timeline, LSNs, lag, pending restart.
pub const PATH_PG_STATUS: &str = "/pg/status";
/// The instance's metrics in the OpenMetrics text format (Prometheus), on [`MANAGER_PORT`].
pub const PATH_METRICS: &str = "/metrics";
/// Base backups run by the instance manager: `POST` a [`crate::instance_status::BackupRequest`]
/// to start one, `GET {PATH_BACKUPS}/<name>` for its [`crate::instance_status::BackupJob`].
pub const PATH_BACKUPS: &str = "/pg/backups";
/// Retention run by the instance manager (which mounts the store, whatever its kind): `POST`
/// a [`crate::instance_status::RetentionRequest`], answered with a
/// [`crate::instance_status::RetentionDone`].
pub const PATH_RETENTION: &str = "/pg/retention";

/// The primary Lease (coordination.k8s.io/v1) is named after its cluster. Only its holder
/// may run PostgreSQL as a primary, so two primaries can never accept writes at once.
pub fn primary_lease_name(cluster: &str) -> String {
    cluster.to_string()
}
/// `leaseDurationSeconds` of the primary Lease: another instance may take it over only
/// after seeing it unchanged for this long (a holder that vanished without releasing it).
pub const PRIMARY_LEASE_DURATION_SECONDS: i32 = 10;
/// How often the primary renews its Lease.
pub const PRIMARY_LEASE_RENEW_SECONDS: u64 = 2;
/// A primary that has not renewed its Lease for this long stops PostgreSQL (self-fencing),
/// well before anyone else may take the Lease over.
pub const PRIMARY_LEASE_FENCE_AFTER_SECONDS: u64 = 7;

/// The operator's HTTP port (`/metrics`, `/healthz`, `/readyz`) when `pgop operator` is
/// given no `--metrics-bind-address`.
pub const OPERATOR_METRICS_PORT: u16 = 8080;
/// Name of the operator's HTTP port in its Deployment (for a PodMonitor).
pub const OPERATOR_METRICS_PORT_NAME: &str = "metrics";
