//! The word lists and name limits that the CRD's CEL rules ([`crate::cel`]), the
//! validation ([`crate::validation`]) and the types share: parameters pgop owns or refuses,
//! reserved names, roles that may not own or be joined, the Secret suffixes of a cluster,
//! PriorityClasses Kubernetes keeps. A leaf: it imports only [`crate::constants`], so that
//! the rules and the types that use them do not import each other for a list.

/// Most instances a cluster may have (one primary and eight standbys).
pub const MAX_REPLICAS: i32 = 9;
/// Most entries in `spec.postgresql.parameters` (bounds the cost of its CEL rule).
pub const MAX_PARAMETERS: usize = 256;
/// Longest cluster name: `<cluster>-<serial>` and `<cluster>-replication` must stay
/// valid object names of at most 63 characters.
pub const MAX_CLUSTER_NAME_LENGTH: usize = 50;

/// PostgreSQL parameters pgop sets itself. A cluster's `spec.postgresql.parameters` may not
/// name any of them (case-insensitively, as PostgreSQL reads parameter names): the CRD's CEL
/// rule and [`crate::validate`] are both generated from this one list.
pub const OWNED_PARAMETERS: &[&str] = &[
    // Where PostgreSQL listens and keeps its files: the pod layout depends on them.
    "port",
    "listen_addresses",
    "unix_socket_directories",
    "data_directory",
    "config_file",
    "hba_file",
    "ident_file",
    "external_pid_file",
    // Replication and failover: set from spec.replicas and spec.replication.
    "wal_level",
    "hot_standby",
    "wal_log_hints",
    "full_page_writes",
    "max_wal_senders",
    "max_replication_slots",
    "primary_conninfo",
    "primary_slot_name",
    "synchronous_standby_names",
    "cluster_name",
    // WAL archiving and recovery: set from spec.backup and spec.bootstrap.recovery.
    "archive_mode",
    "archive_command",
    "archive_library",
    "archive_cleanup_command",
    "restore_command",
    "recovery_end_command",
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
    // The instance manager collects the server log from stderr.
    "logging_collector",
    "log_destination",
];

/// Parameters pgop refuses although it does not set them, compared in lower case:
/// configuration-file directives (`include`, `include_dir`, `include_if_exists`: written as
/// a parameter they would make PostgreSQL read another file) and TLS (`ssl` and every
/// `ssl_*` name, one of which runs a shell command), which pgop configures itself. The CRD's
/// CEL rule and [`crate::validate`] are both generated from this list and
/// [`UNSUPPORTED_PARAMETER_PREFIX`].
pub const UNSUPPORTED_PARAMETERS: &[&str] = &["include", "include_dir", "include_if_exists", "ssl"];
/// Every parameter whose name starts with this is refused (TLS, see [`UNSUPPORTED_PARAMETERS`]).
pub const UNSUPPORTED_PARAMETER_PREFIX: &str = "ssl_";

/// Whether pgop refuses a parameter name it does not own (see [`UNSUPPORTED_PARAMETERS`]).
pub fn is_unsupported_parameter(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    UNSUPPORTED_PARAMETERS.contains(&lower.as_str())
        || lower.starts_with(UNSUPPORTED_PARAMETER_PREFIX)
}

/// Whether pgop sets this parameter itself (see [`OWNED_PARAMETERS`]), in any case.
pub fn is_owned_parameter(name: &str) -> bool {
    OWNED_PARAMETERS.contains(&name.to_ascii_lowercase().as_str())
}

/// Names `spec.bootstrap.initdb.database` and `.owner` may not take: pgop's superuser
/// (`postgres`, also the maintenance database) and replication role, the template
/// databases, and the role names PostgreSQL reserves. Names starting with
/// [`RESERVED_NAME_PREFIX`] are reserved too.
pub const RESERVED_NAMES: &[&str] = &[
    crate::constants::SUPERUSER,
    crate::constants::REPLICATION_USER,
    "template0",
    "template1",
    "public",
    "none",
    "current_user",
    "current_role",
    "session_user",
];
/// PostgreSQL reserves role names starting with this for its predefined roles.
pub const RESERVED_NAME_PREFIX: &str = "pg_";

/// Whether a database or role name is reserved (see [`RESERVED_NAMES`]).
pub fn is_reserved_name(name: &str) -> bool {
    RESERVED_NAMES.contains(&name) || name.starts_with(RESERVED_NAME_PREFIX)
}

/// Roles that may not own a declared database or schema: the replication role (its
/// password is pgop's and it only streams WAL). Predefined `pg_*` roles are refused too.
pub const FORBIDDEN_OWNERS: &[&str] = &[crate::constants::REPLICATION_USER];
/// Schema names PostgreSQL keeps besides those of [`RESERVED_NAMES`] and
/// the `pg_` prefix.
pub const RESERVED_SCHEMAS: &[&str] = &["information_schema"];

/// Roles no declared role may be a member of: the superuser and the replication role
/// (membership would hand over their objects and privileges).
pub const FORBIDDEN_MEMBERSHIPS: &[&str] = &["postgres", "streaming_replica"];

/// PriorityClass names Kubernetes keeps for its own Pods (`system-node-critical`,
/// `system-cluster-critical`): a Pod outside `kube-system` may not use them.
pub const SYSTEM_PRIORITY_CLASS_PREFIX: &str = "system-";
