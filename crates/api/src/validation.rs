//! Validation of specs in Rust, applying the same rules as the CRD schema and its CEL
//! rules, so that the operator can check a spec that slipped past the API server (an old
//! CRD, a disabled webhook) and report the field instead of looping on errors.
//!
//! Every check here has a twin in the schema (a range, pattern or required field in
//! [`crate::cluster`]) or in [`crate::cel`]; each error names the field the way the API
//! server does (`spec.backup.retentionDays`).
//!
//! Why this file stays whole: it is one idea, the Rust twin of the schema's and the CEL
//! rules: every check of a PostgresCluster or PostgresBackup spec, and of a change to one;
//! about 635 of its lines are the unit tests.

use crate::affinity::{
    AffinitySpec, MAX_NODE_AFFINITY_TERMS, MAX_NODE_EXPRESSIONS, MAX_NODE_SELECTOR,
    MAX_NODE_VALUES, MAX_TOLERATIONS, MAX_TOPOLOGY_SPREAD, NodeSelectorRequirement,
    SYSTEM_PRIORITY_CLASS_PREFIX, TaintEffect, TolerationOperator,
};
use crate::backup::PostgresBackupSpec;
use crate::cel;
use crate::cluster::{
    BackupSpec, BackupStore, BootstrapSpec, DataDurability, MAX_CLUSTER_NAME_LENGTH,
    MAX_INSTANCE_NAME_LENGTH, MAX_PARAMETERS, MAX_REPLICAS, PostgresCluster, PostgresClusterSpec,
    RecoverySpec, S3Store, SUPPORTED_POSTGRES_VERSIONS, is_owned_parameter, is_reserved_name,
    is_unsupported_parameter,
};
use crate::formats;
use crate::quantity;
use kube::ResourceExt;

/// One invalid field: its path (`spec.replicas`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Path of the field, as the API server writes it (`spec.postgresql.pgHba[2]`).
    pub field: String,
    /// What is wrong, for people.
    pub message: String,
}

/// All errors in one line, for a condition message.
pub fn summary(errors: &[FieldError]) -> String {
    let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
    all.join("; ")
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    fn check(&mut self, ok: bool, field: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.add(field, message());
        }
    }

    fn range(&mut self, field: &str, value: i32, min: i32, max: Option<i32>) {
        let ok = value >= min && max.is_none_or(|max| value <= max);
        self.check(ok, field, || match max {
            Some(max) => format!("must be between {min} and {max}, got {value}"),
            None => format!("must be {min} or more, got {value}"),
        });
    }

    fn format(&mut self, field: &str, value: &str, ok: fn(&str) -> bool, what: &str) {
        self.check(ok(value), field, || {
            format!("must be {what}, got {value:?}")
        });
    }

    fn name(&mut self, field: &str, value: &str) {
        self.check(
            value.len() <= 253 && formats::is_dns_subdomain(value),
            field,
            || {
                format!(
                    "must be an object name (at most 253 lower-case letters, digits, '-' and \
                     '.'), got {value:?}"
                )
            },
        );
    }

    fn into_result(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// Most lines in `spec.postgresql.pgHba`.
pub const MAX_HBA_LINES: usize = 64;

fn supported_versions() -> String {
    let all: Vec<String> = SUPPORTED_POSTGRES_VERSIONS
        .iter()
        .map(ToString::to_string)
        .collect();
    all.join(", ")
}

/// Validates a PostgresCluster spec on its own (what the API server checks at create).
pub fn validate(spec: &PostgresClusterSpec) -> Result<(), Vec<FieldError>> {
    let mut errors = Errors::default();
    validate_spec(spec, &mut errors);
    errors.into_result()
}

/// Validates an update: the new spec on its own, and the changes from the old one, whose
/// status (`status`) says which major the data holds and how far an upgrade got.
pub fn validate_update(
    old: &PostgresClusterSpec,
    new: &PostgresClusterSpec,
    status: Option<&crate::cluster::PostgresClusterStatus>,
) -> Result<(), Vec<FieldError>> {
    let mut errors = Errors::default();
    validate_spec(new, &mut errors);
    if let Some(old_class) = &old.storage.storage_class_name {
        errors.check(
            new.storage.storage_class_name.as_ref() == Some(old_class),
            "spec.storage.storageClassName",
            || cel::MSG_STORAGE_CLASS_IMMUTABLE.to_string(),
        );
    }
    let old_wal_class = old
        .wal_storage
        .as_ref()
        .and_then(|w| w.storage_class_name.as_ref());
    if let (Some(old_class), Some(new_wal)) = (old_wal_class, &new.wal_storage) {
        errors.check(
            new_wal.storage_class_name.as_ref() == Some(old_class),
            "spec.walStorage.storageClassName",
            || cel::MSG_STORAGE_CLASS_IMMUTABLE.to_string(),
        );
    }
    for e in transition_errors(old, new, status) {
        errors.0.push(e);
    }
    errors.into_result()
}

/// The changes from `old` to `new` that pgop cannot carry out, each naming its field:
/// - `spec.storage.size` may only grow (a volume cannot shrink);
/// - `spec.walStorage` may be added, not removed, and its size may only grow;
/// - `spec.bootstrap` is read once, when the cluster is created;
/// - `spec.replica` may not change yet (no promotion or demotion in this version);
/// - `spec.postgresVersion` ([`version_change_error`]) may be raised (an in-place major
///   upgrade), never set below the major the data holds, and not changed while an upgrade
///   is past the point where it can be called off.
///
/// The validating webhook refuses them; without it the operator catches what it can see
/// (a volume larger than the spec, a major below the data's) as phase Invalid.
pub fn transition_errors(
    old: &PostgresClusterSpec,
    new: &PostgresClusterSpec,
    status: Option<&crate::cluster::PostgresClusterStatus>,
) -> Vec<FieldError> {
    let mut errors = Errors::default();
    if let (Some(before), Some(after)) = (
        quantity::millis(&old.storage.size),
        quantity::millis(&new.storage.size),
    ) {
        errors.check(after >= before, "spec.storage.size", || {
            msg_storage_shrink(&new.storage.size, &old.storage.size)
        });
    }
    match (&old.wal_storage, &new.wal_storage) {
        (Some(_), None) => errors.0.push(FieldError {
            field: "spec.walStorage".to_string(),
            message: MSG_WAL_STORAGE_REMOVED.to_string(),
        }),
        (Some(before), Some(after)) => {
            if let (Some(b), Some(a)) = (
                quantity::millis(&before.size),
                quantity::millis(&after.size),
            ) {
                errors.check(a >= b, "spec.walStorage.size", || {
                    msg_storage_shrink(&after.size, &before.size)
                });
            }
        }
        _ => {}
    }
    errors.check(old.bootstrap == new.bootstrap, "spec.bootstrap", || {
        MSG_BOOTSTRAP_IMMUTABLE.to_string()
    });
    use crate::replica::ReplicaSpec;
    errors.check(
        ReplicaSpec::may_become(old.replica.as_ref(), new.replica.as_ref()),
        "spec.replica",
        || MSG_REPLICA_IMMUTABLE.to_string(),
    );
    let major = |v: Option<i32>| v.unwrap_or(crate::cluster::DEFAULT_POSTGRES_VERSION);
    let (before, after) = (major(old.postgres_version), major(new.postgres_version));
    if before != after {
        // The major the data holds: recorded in the status, else the old spec's.
        let held = status.and_then(|s| s.postgres_version).unwrap_or(before);
        let upgrade = status.and_then(|s| s.major_upgrade.as_ref());
        if let Some(message) = version_change_error(held, after, upgrade) {
            errors.0.push(FieldError {
                field: "spec.postgresVersion".to_string(),
                message,
            });
        }
    }
    errors.0
}

/// Why the major may not become `wanted` when the data holds `held` and `upgrade` is the
/// last in-place upgrade: never below the data's major; while an upgrade runs pg_upgrade
/// or clones the standbys, neither called off (back to `held`) nor sent elsewhere.
/// Raising starts an upgrade; going back to `held` before pg_upgrade runs calls it off.
pub fn version_change_error(
    held: i32,
    wanted: i32,
    upgrade: Option<&crate::cluster::MajorUpgrade>,
) -> Option<String> {
    use crate::cluster::MajorUpgradePhase as P;
    if wanted < held {
        return Some(format!(
            "may not be lowered to {wanted}: the data is PostgreSQL {held}'s, and PostgreSQL's data files cannot be downgraded (restore a logical backup into a new cluster instead)"
        ));
    }
    match upgrade {
        Some(u) if matches!(u.phase, P::Upgrading | P::Cloning) && wanted != u.to => Some(format!(
            "may not change while the upgrade from {} to {} is {}: pg_upgrade has started on {}'s volume (wait for status.majorUpgrade to end)",
            u.from,
            u.to,
            if u.phase == P::Upgrading {
                "running pg_upgrade"
            } else {
                "cloning the standbys"
            },
            u.primary
        )),
        _ => None,
    }
}

/// `spec.walStorage` removed from a cluster that has it.
pub const MSG_WAL_STORAGE_REMOVED: &str = "may not be removed once set: the instances' write-ahead log lives on those volumes (make a new cluster without walStorage from a backup to go back to one volume)";

/// `spec.bootstrap` changed after creation.
pub const MSG_BOOTSTRAP_IMMUTABLE: &str = "may not change after the cluster is created: it is read only once, to make the first instance's data (create a new cluster to bootstrap differently)";

/// `spec.replica` added, removed or changed on a cluster that exists.
pub const MSG_REPLICA_IMMUTABLE: &str = "may not be added or removed, nor its source changed, nor enabled set back to true, after the cluster is created in this version: a replica cluster may be promoted (enabled: false), but demoting a primary cluster is not built yet (docs/replica.md); the bounds may change";

/// `spec.storage.size` below the size the volumes have.
pub fn msg_storage_shrink(wanted: &str, current: &str) -> String {
    format!(
        "may only grow: {wanted} is smaller than {current}, and a volume cannot shrink (move the data to a new cluster with smaller volumes instead)"
    )
}

/// Validates a cluster's name: it becomes part of the names of its Pods and Services.
pub fn validate_cluster_name(name: &str) -> Result<(), FieldError> {
    if name.len() <= MAX_CLUSTER_NAME_LENGTH && formats::is_dns_label(name) {
        Ok(())
    } else {
        Err(FieldError {
            field: "metadata.name".to_string(),
            message: cel::msg_cluster_name(),
        })
    }
}

/// Validates a whole PostgresCluster at create: its name and its spec.
pub fn validate_cluster(cluster: &PostgresCluster) -> Result<(), Vec<FieldError>> {
    let mut errors = Errors::default();
    if let Err(e) = validate_cluster_name(&cluster.name_any()) {
        errors.0.push(e);
    }
    validate_spec(&cluster.spec, &mut errors);
    for (i, pooler) in cluster.spec.poolers.iter().enumerate() {
        errors.check(
            cluster.name_any().len() + pooler.name.len()
                <= crate::pooler::MAX_CLUSTER_AND_POOLER_NAME_LENGTH,
            "spec.poolers",
            || {
                format!(
                    "spec.poolers[{i}].name {:?} {}",
                    pooler.name,
                    cel::msg_pooler_name_length()
                )
            },
        );
    }
    for name in &cluster.spec.fenced_instances {
        errors.check(
            cel::is_instance_of(&cluster.name_any(), name),
            "spec.fencedInstances",
            || format!("{}, got {name:?}", cel::msg_fenced_instance()),
        );
    }
    // Not in CEL: a rule at the root over 32 roles and the cluster's name costs more than
    // the API server's budget; the webhook and the operator hold it.
    for role in &cluster.spec.roles {
        if let Some(secret) = &role.password_secret {
            errors.check(
                !cel::is_own_secret(&cluster.name_any(), &secret.name),
                "spec.roles",
                || format!("spec.roles[].passwordSecret.name {}", cel::msg_own_secret()),
            );
        }
    }
    // Not in CEL either, for the same reason: the Secrets of every external cluster.
    for (i, entry) in cluster.spec.external_clusters.iter().enumerate() {
        for (field, secret) in entry.secrets() {
            errors.check(
                !cel::is_own_secret(&cluster.name_any(), secret),
                &format!("spec.externalClusters[{i}].{field}"),
                cel::msg_own_secret,
            );
        }
    }
    for (field, secret) in user_secrets(&cluster.spec) {
        errors.check(
            !cel::is_own_secret(&cluster.name_any(), secret),
            field,
            cel::msg_own_secret,
        );
    }
    errors.into_result()
}

/// `spec.fencedInstances` on its own (the schema's twin): at most [`MAX_REPLICAS`] distinct
/// instance names, each `<name>-<serial>`.
fn validate_fenced_instances(fenced: &[String], errors: &mut Errors) {
    let max = usize::try_from(MAX_REPLICAS).unwrap_or(9);
    errors.check(fenced.len() <= max, "spec.fencedInstances", || {
        format!("must have at most {max} items, got {}", fenced.len())
    });
    for (i, name) in fenced.iter().enumerate() {
        let field = format!("spec.fencedInstances[{i}]");
        let shaped = name.len() <= MAX_INSTANCE_NAME_LENGTH
            && name.rsplit_once('-').is_some_and(|(cluster, serial)| {
                formats::is_dns_label(cluster)
                    && (1..=10).contains(&serial.len())
                    && !serial.starts_with('0')
                    && serial.bytes().all(|b| b.is_ascii_digit())
            });
        errors.check(shaped, &field, || {
            format!(
                "must be an instance name, <cluster name>-<serial> (at most \
                 {MAX_INSTANCE_NAME_LENGTH} characters), got {name:?}"
            )
        });
        errors.check(!fenced[..i].contains(name), &field, || {
            format!("duplicate value {name:?}")
        });
    }
}

/// `spec.roles` (the schema's and CEL's twins), and a rule only the webhook and the
/// operator hold: no declared role may be the application owner of
/// `spec.bootstrap.initdb` (default `app`), whose password pgop keeps.
fn validate_roles(spec: &PostgresClusterSpec, errors: &mut Errors) {
    use crate::roles::{FORBIDDEN_MEMBERSHIPS, MAX_CONNECTION_LIMIT, MAX_IN_ROLES, MAX_ROLES};
    errors.check(spec.roles.len() <= MAX_ROLES, "spec.roles", || {
        format!(
            "must have at most {MAX_ROLES} items, got {}",
            spec.roles.len()
        )
    });
    let owner = match &spec.bootstrap {
        None => Some("app".to_string()),
        Some(b) => b.initdb.as_ref().map(|i| i.owner.clone()),
    };
    for (i, role) in spec.roles.iter().enumerate() {
        let at = format!("spec.roles[{i}]");
        let name_field = format!("{at}.name");
        errors.format(
            &name_field,
            &role.name,
            formats::is_identifier,
            "a lower-case identifier (^[a-z_][a-z0-9_]{0,62}$)",
        );
        errors.check(
            !is_reserved_name(&role.name),
            &name_field,
            cel::msg_reserved_name,
        );
        errors.check(owner.as_deref() != Some(role.name.as_str()), &name_field, || {
            format!(
                "may not be the application owner {:?}: pgop keeps its password (spec.credentials.appSecret)",
                role.name
            )
        });
        errors.check(
            !spec.roles[..i].iter().any(|r| r.name == role.name),
            &at,
            || format!("duplicate value {:?}", role.name),
        );
        errors.range(
            &format!("{at}.connectionLimit"),
            role.connection_limit,
            -1,
            Some(MAX_CONNECTION_LIMIT),
        );
        if let Some(until) = &role.valid_until {
            errors.format(
                &format!("{at}.validUntil"),
                until,
                formats::is_timestamp,
                "an RFC 3339 time with a time zone, e.g. 2027-01-31T00:00:00Z",
            );
        }
        let in_roles = format!("{at}.inRoles");
        errors.check(role.in_roles.len() <= MAX_IN_ROLES, &in_roles, || {
            format!(
                "must have at most {MAX_IN_ROLES} items, got {}",
                role.in_roles.len()
            )
        });
        errors.check(!role.in_roles.contains(&role.name), &in_roles, || {
            cel::MSG_MEMBER_OF_ITSELF.to_string()
        });
        errors.check(
            !role
                .in_roles
                .iter()
                .any(|r| FORBIDDEN_MEMBERSHIPS.contains(&r.as_str())),
            &in_roles,
            cel::msg_forbidden_membership,
        );
        for (j, member_of) in role.in_roles.iter().enumerate() {
            let field = format!("{in_roles}[{j}]");
            errors.format(
                &field,
                member_of,
                formats::is_identifier,
                "a lower-case identifier (^[a-z_][a-z0-9_]{0,62}$)",
            );
            errors.check(!role.in_roles[..j].contains(member_of), &field, || {
                format!("duplicate value {member_of:?}")
            });
        }
        if let Some(secret) = &role.password_secret {
            errors.name(&format!("{at}.passwordSecret.name"), &secret.name);
        }
    }
}

/// `spec.poolers` (the schema's twins).
fn validate_poolers(spec: &PostgresClusterSpec, errors: &mut Errors) {
    use crate::pooler::{
        MAX_CLIENT_CONNECTIONS, MAX_POOL_SIZE, MAX_POOLER_INSTANCES, MAX_POOLER_NAME_LENGTH,
        MAX_POOLERS,
    };
    errors.check(spec.poolers.len() <= MAX_POOLERS, "spec.poolers", || {
        format!(
            "must have at most {MAX_POOLERS} items, got {}",
            spec.poolers.len()
        )
    });
    for (i, pooler) in spec.poolers.iter().enumerate() {
        let at = format!("spec.poolers[{i}]");
        errors.format(
            &format!("{at}.name"),
            &pooler.name,
            |n| n.len() <= MAX_POOLER_NAME_LENGTH && formats::is_dns_label(n),
            "a DNS label of at most 20 characters (^[a-z]([-a-z0-9]*[a-z0-9])?$)",
        );
        errors.check(
            !spec.poolers[..i].iter().any(|p| p.name == pooler.name),
            &at,
            || format!("duplicate value {:?}", pooler.name),
        );
        errors.range(
            &format!("{at}.instances"),
            pooler.instances,
            1,
            Some(MAX_POOLER_INSTANCES),
        );
        errors.range(
            &format!("{at}.maxClientConnections"),
            pooler.max_client_connections,
            1,
            Some(MAX_CLIENT_CONNECTIONS),
        );
        errors.range(
            &format!("{at}.defaultPoolSize"),
            pooler.default_pool_size,
            1,
            Some(MAX_POOL_SIZE),
        );
    }
}

/// `spec.databases` (the schema's and CEL's twins), and a rule only the webhook and the
/// operator hold: the application database of `spec.bootstrap.initdb` (default `app`) is
/// never `ensure: absent`.
fn validate_databases(spec: &PostgresClusterSpec, errors: &mut Errors) {
    use crate::databases::{
        MAX_DATABASES, MAX_EXTENSIONS, MAX_SCHEMAS, is_usable_owner, is_usable_schema_name,
    };
    use crate::roles::{Ensure, MAX_CONNECTION_LIMIT};
    const IDENTIFIER: &str = "a lower-case identifier (^[a-z_][a-z0-9_]{0,62}$)";
    errors.check(
        spec.databases.len() <= MAX_DATABASES,
        "spec.databases",
        || {
            format!(
                "must have at most {MAX_DATABASES} items, got {}",
                spec.databases.len()
            )
        },
    );
    let app_database = match &spec.bootstrap {
        None => Some("app".to_string()),
        Some(b) => b.initdb.as_ref().map(|i| i.database.clone()),
    };
    let owner = |errors: &mut Errors, field: &str, owner: &str| {
        errors.format(field, owner, formats::is_identifier, IDENTIFIER);
        errors.check(is_usable_owner(owner), field, cel::msg_unusable_owner);
    };
    for (i, db) in spec.databases.iter().enumerate() {
        let at = format!("spec.databases[{i}]");
        let name_field = format!("{at}.name");
        errors.format(&name_field, &db.name, formats::is_identifier, IDENTIFIER);
        errors.check(
            !is_reserved_name(&db.name),
            &name_field,
            cel::msg_reserved_name,
        );
        errors.check(
            !(db.ensure == Ensure::Absent && app_database.as_deref() == Some(db.name.as_str())),
            &format!("{at}.ensure"),
            || {
                format!(
                    "may not be absent for the application database {:?} \
                     (spec.bootstrap.initdb.database): pgop never drops it",
                    db.name
                )
            },
        );
        errors.check(
            !spec.databases[..i].iter().any(|d| d.name == db.name),
            &at,
            || format!("duplicate value {:?}", db.name),
        );
        owner(errors, &format!("{at}.owner"), &db.owner);
        if let Some(encoding) = &db.encoding {
            errors.format(
                &format!("{at}.encoding"),
                encoding,
                formats::is_encoding,
                "an encoding name, e.g. UTF8 (^[A-Za-z][A-Za-z0-9_]{0,31}$)",
            );
        }
        if let Some(locale) = &db.locale {
            errors.format(
                &format!("{at}.locale"),
                locale,
                formats::is_locale,
                "a locale name, e.g. C.UTF-8 (^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$)",
            );
        }
        errors.range(
            &format!("{at}.connectionLimit"),
            db.connection_limit,
            -1,
            Some(MAX_CONNECTION_LIMIT),
        );
        errors.check(
            db.schemas.len() <= MAX_SCHEMAS,
            &format!("{at}.schemas"),
            || {
                format!(
                    "must have at most {MAX_SCHEMAS} items, got {}",
                    db.schemas.len()
                )
            },
        );
        for (j, schema) in db.schemas.iter().enumerate() {
            let at = format!("{at}.schemas[{j}]");
            let name_field = format!("{at}.name");
            errors.format(
                &name_field,
                &schema.name,
                formats::is_identifier,
                IDENTIFIER,
            );
            errors.check(
                is_usable_schema_name(&schema.name),
                &name_field,
                cel::msg_reserved_schema,
            );
            errors.check(
                !db.schemas[..j].iter().any(|s| s.name == schema.name),
                &at,
                || format!("duplicate value {:?}", schema.name),
            );
            if let Some(o) = &schema.owner {
                owner(errors, &format!("{at}.owner"), o);
            }
        }
        errors.check(
            db.extensions.len() <= MAX_EXTENSIONS,
            &format!("{at}.extensions"),
            || {
                format!(
                    "must have at most {MAX_EXTENSIONS} items, got {}",
                    db.extensions.len()
                )
            },
        );
        for (j, ext) in db.extensions.iter().enumerate() {
            let at = format!("{at}.extensions[{j}]");
            errors.format(
                &format!("{at}.name"),
                &ext.name,
                formats::is_extension_name,
                "an extension name, e.g. pgcrypto or uuid-ossp (^[a-z_][a-z0-9_-]{0,62}$)",
            );
            errors.check(
                !db.extensions[..j].iter().any(|e| e.name == ext.name),
                &at,
                || format!("duplicate value {:?}", ext.name),
            );
            if let Some(version) = &ext.version {
                errors.format(
                    &format!("{at}.version"),
                    version,
                    formats::is_extension_version,
                    "an extension version, e.g. 1.3 (^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$)",
                );
            }
            if let Some(schema) = &ext.schema {
                errors.format(
                    &format!("{at}.schema"),
                    schema,
                    formats::is_identifier,
                    IDENTIFIER,
                );
            }
        }
    }
}

/// The Secrets a spec names that belong to the user, by field.
fn user_secrets(spec: &PostgresClusterSpec) -> Vec<(&'static str, &str)> {
    [
        ("spec.tls.serverSecret", &spec.tls.server_secret),
        ("spec.tls.clientCASecret", &spec.tls.client_ca_secret),
        ("spec.credentials.appSecret", &spec.credentials.app_secret),
        (
            "spec.credentials.superuserSecret",
            &spec.credentials.superuser_secret,
        ),
    ]
    .into_iter()
    .filter_map(|(field, name)| name.as_deref().map(|n| (field, n)))
    .collect()
}

/// Validates a PostgresBackup spec.
pub fn validate_backup(spec: &PostgresBackupSpec) -> Result<(), Vec<FieldError>> {
    let mut errors = Errors::default();
    errors.name("spec.cluster.name", &spec.cluster.name);
    errors.into_result()
}

/// Validates a PostgresBackup update: its spec never changes.
pub fn validate_backup_update(
    old: &PostgresBackupSpec,
    new: &PostgresBackupSpec,
) -> Result<(), Vec<FieldError>> {
    let mut errors = Errors::default();
    errors.name("spec.cluster.name", &new.cluster.name);
    errors.check(old == new, "spec", || {
        cel::MSG_BACKUP_SPEC_IMMUTABLE.to_string()
    });
    errors.into_result()
}

fn validate_spec(spec: &PostgresClusterSpec, errors: &mut Errors) {
    errors.range("spec.replicas", spec.replicas, 1, Some(MAX_REPLICAS));
    validate_fenced_instances(&spec.fenced_instances, errors);
    validate_roles(spec, errors);
    validate_databases(spec, errors);
    validate_poolers(spec, errors);
    if let Some(image) = &spec.image {
        errors.format(
            "spec.image",
            image,
            formats::is_image,
            "an image reference such as registry.example.com:5000/pgop:0.2.0 (at most 512 \
             characters)",
        );
    }
    if let Some(version) = spec.postgres_version {
        errors.check(
            SUPPORTED_POSTGRES_VERSIONS.contains(&version),
            "spec.postgresVersion",
            || {
                format!(
                    "must be a PostgreSQL major version pgop runs ({}), got {version}",
                    supported_versions()
                )
            },
        );
    }

    errors.format(
        "spec.storage.size",
        &spec.storage.size,
        formats::is_quantity,
        "a quantity of bytes greater than zero such as 10Gi or 500M",
    );
    if let Some(class) = &spec.storage.storage_class_name {
        errors.name("spec.storage.storageClassName", class);
    }
    if let Some(grow) = &spec.storage.auto_grow {
        use crate::cluster::{
            MAX_AUTO_GROW_INCREASE, MAX_AUTO_GROW_THRESHOLD, MIN_AUTO_GROW_INCREASE,
            MIN_AUTO_GROW_THRESHOLD,
        };
        errors.range(
            "spec.storage.autoGrow.thresholdPercent",
            grow.threshold_percent,
            MIN_AUTO_GROW_THRESHOLD,
            Some(MAX_AUTO_GROW_THRESHOLD),
        );
        errors.range(
            "spec.storage.autoGrow.increasePercent",
            grow.increase_percent,
            MIN_AUTO_GROW_INCREASE,
            Some(MAX_AUTO_GROW_INCREASE),
        );
        errors.format(
            "spec.storage.autoGrow.maxSize",
            &grow.max_size,
            formats::is_quantity,
            "a quantity of bytes greater than zero such as 100Gi",
        );
        // Not in CEL (quantities compare there only with the quantity library): the
        // webhook and the operator hold it.
        if let (Some(max), Some(size)) = (
            crate::quantity::millis(&grow.max_size),
            crate::quantity::millis(&spec.storage.size),
        ) {
            errors.check(max >= size, "spec.storage.autoGrow.maxSize", || {
                format!(
                    "must be at least spec.storage.size ({}), got {}",
                    spec.storage.size, grow.max_size
                )
            });
        }
    }

    if let Some(wal) = &spec.wal_storage {
        errors.format(
            "spec.walStorage.size",
            &wal.size,
            formats::is_quantity,
            "a quantity of bytes greater than zero such as 2Gi or 500M",
        );
        if let Some(class) = &wal.storage_class_name {
            errors.name("spec.walStorage.storageClassName", class);
        }
    }

    let parameters = &spec.postgresql.parameters;
    errors.check(
        parameters.len() <= MAX_PARAMETERS,
        "spec.postgresql.parameters",
        || format!("must have at most {MAX_PARAMETERS} entries"),
    );
    let bad_names: Vec<&str> = parameters
        .keys()
        .map(String::as_str)
        .filter(|k| !formats::is_parameter_name(k))
        .collect();
    errors.check(bad_names.is_empty(), "spec.postgresql.parameters", || {
        format!("{bad_names:?}: {}", cel::msg_parameter_names())
    });
    let owned: Vec<&str> = parameters
        .keys()
        .map(String::as_str)
        .filter(|k| is_owned_parameter(k))
        .collect();
    errors.check(owned.is_empty(), "spec.postgresql.parameters", || {
        cel::msg_owned_parameters(&owned)
    });
    let unsupported: Vec<&str> = parameters
        .keys()
        .map(String::as_str)
        .filter(|k| is_unsupported_parameter(k))
        .collect();
    errors.check(unsupported.is_empty(), "spec.postgresql.parameters", || {
        format!("{unsupported:?}: {}", cel::msg_unsupported_parameters())
    });
    for (name, value) in parameters {
        errors.check(
            formats::is_parameter_value(value),
            &format!("spec.postgresql.parameters.{name}"),
            || {
                format!(
                    "must be one line without control characters, at most {} characters",
                    formats::MAX_PARAMETER_VALUE_LENGTH
                )
            },
        );
    }
    errors.check(
        spec.postgresql.pg_hba.len() <= MAX_HBA_LINES,
        "spec.postgresql.pgHba",
        || format!("must have at most {MAX_HBA_LINES} lines"),
    );
    for (i, line) in spec.postgresql.pg_hba.iter().enumerate() {
        errors.check(
            line.chars().count() <= formats::MAX_HBA_LINE_LENGTH && formats::is_hba_line(line),
            &format!("spec.postgresql.pgHba[{i}]"),
            || {
                format!(
                    "must be one pg_hba.conf rule on one line (at most {} characters): local, \
                     host, hostnossl or hostnogssenc, two to four plain or double-quoted \
                     fields, a method (trust, reject, scram-sha-256, md5, password, peer, \
                     ident, ldap, radius, pam, gss) and name=value options; no @file, no #, no \
                     control characters; got {line:?}",
                    formats::MAX_HBA_LINE_LENGTH
                )
            },
        );
    }

    let replication = &spec.replication;
    errors.range(
        "spec.replication.synchronous",
        replication.synchronous,
        0,
        Some(MAX_REPLICAS - 1),
    );
    errors.check(
        replication.synchronous < spec.replicas,
        "spec.replication.synchronous",
        || cel::MSG_SYNCHRONOUS_BELOW_REPLICAS.to_string(),
    );
    errors.check(
        replication.data_durability != DataDurability::Required || replication.synchronous > 0,
        "spec.replication.dataDurability",
        || cel::MSG_REQUIRED_NEEDS_SYNCHRONOUS.to_string(),
    );

    errors.range("spec.failoverDelay", spec.failover_delay, 0, None);
    errors.range("spec.switchoverTimeout", spec.switchover_timeout, 1, None);

    validate_affinity(&spec.affinity, errors);
    validate_placement(&spec.affinity, errors);
    validate_network_policy(&spec.network_policy, errors);
    if let Some(name) = &spec.tls.server_secret {
        errors.name("spec.tls.serverSecret", name);
    }
    if let Some(name) = &spec.tls.client_ca_secret {
        errors.name("spec.tls.clientCASecret", name);
    }
    if let Some(name) = &spec.credentials.app_secret {
        errors.name("spec.credentials.appSecret", name);
    }
    if let Some(name) = &spec.credentials.superuser_secret {
        errors.name("spec.credentials.superuserSecret", name);
    }
    if let Some(backup) = &spec.backup {
        validate_backup_spec(backup, errors);
    }
    if let Some(bootstrap) = &spec.bootstrap {
        validate_bootstrap(bootstrap, errors);
    }
    validate_external_clusters(spec, errors);
    if let Some(replica) = &spec.replica {
        validate_replica(spec, replica, errors);
    }
}

/// `spec.replica` (the schema's and [`crate::cel`]'s twins).
fn validate_replica(
    spec: &PostgresClusterSpec,
    replica: &crate::replica::ReplicaSpec,
    errors: &mut Errors,
) {
    errors.format(
        "spec.replica.source",
        &replica.source,
        |n| n.len() <= crate::external::MAX_EXTERNAL_NAME_LENGTH && formats::is_dns_label(n),
        "a DNS label of at most 63 characters (^[a-z]([-a-z0-9]*[a-z0-9])?$)",
    );
    errors.check(
        spec.external_clusters
            .iter()
            .any(|e| e.name == replica.source && (e.connection.is_some() || e.store.is_some())),
        "spec.replica.source",
        || cel::MSG_REPLICA_SOURCE_IS_ENTRY.to_string(),
    );
    errors.check(
        spec.external_clusters
            .iter()
            .filter(|e| e.name == replica.source)
            .all(|e| e.store.as_ref().is_none_or(|s| s.s3.is_some())),
        "spec.replica.source",
        || cel::MSG_REPLICA_STORE_IS_S3.to_string(),
    );
    if let Some(max) = replica.max_lag_seconds {
        errors.range("spec.replica.maxLagSeconds", max, 1, Some(86400));
    }
    if let Some(max) = replica.promotion_max_lag_seconds {
        errors.range("spec.replica.promotionMaxLagSeconds", max, 0, Some(86400));
    }
    errors.check(
        !replica.enabled || spec.bootstrap.as_ref().is_none_or(|b| b.recovery.is_none()),
        "spec.bootstrap.recovery",
        || cel::MSG_REPLICA_WITHOUT_RECOVERY.to_string(),
    );
}

/// `spec.externalClusters` (the schema's and [`crate::external`]'s CEL twins).
fn validate_external_clusters(spec: &PostgresClusterSpec, errors: &mut Errors) {
    use crate::external::{MAX_EXTERNAL_CLUSTERS, MAX_EXTERNAL_NAME_LENGTH};
    let entries = &spec.external_clusters;
    errors.check(
        entries.len() <= MAX_EXTERNAL_CLUSTERS,
        "spec.externalClusters",
        || {
            format!(
                "must have at most {MAX_EXTERNAL_CLUSTERS} items, got {}",
                entries.len()
            )
        },
    );
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("spec.externalClusters[{i}]");
        errors.format(
            &format!("{at}.name"),
            &entry.name,
            |n| n.len() <= MAX_EXTERNAL_NAME_LENGTH && formats::is_dns_label(n),
            "a DNS label of at most 63 characters (^[a-z]([-a-z0-9]*[a-z0-9])?$)",
        );
        errors.check(
            !entries[..i].iter().any(|e| e.name == entry.name),
            &at,
            || format!("duplicate value {:?}", entry.name),
        );
        errors.check(
            entry.connection.is_some() || entry.store.is_some(),
            &at,
            || cel::MSG_EXTERNAL_CLUSTER_HAS_SOURCE.to_string(),
        );
        if let Some(c) = &entry.connection {
            let at = format!("{at}.connection");
            errors.format(
                &format!("{at}.host"),
                &c.host,
                |h| h.len() <= 253 && formats::is_dns_subdomain(h),
                "a host name or IPv4 address (lower-case DNS labels separated by '.', at \
                 most 253 characters)",
            );
            errors.range(&format!("{at}.port"), c.port, 1, Some(65535));
            for (field, value) in [("dbname", &c.dbname), ("user", &c.user)] {
                errors.format(
                    &format!("{at}.{field}"),
                    value,
                    formats::is_identifier,
                    "a lower-case PostgreSQL identifier of at most 63 characters",
                );
            }
            errors.check(
                !c.ssl_mode.verifies() || c.ca_secret.is_some(),
                &format!("{at}.caSecret"),
                || cel::MSG_VERIFIED_TLS_NEEDS_CA.to_string(),
            );
            if let Some(secret) = &c.password_secret {
                errors.name(&format!("{at}.passwordSecret.name"), &secret.name);
                secret_key(errors, &format!("{at}.passwordSecret.key"), &secret.key);
            }
            if let Some(secret) = &c.client_certificate_secret {
                errors.name(&format!("{at}.clientCertificateSecret.name"), &secret.name);
            }
            if let Some(secret) = &c.ca_secret {
                errors.name(&format!("{at}.caSecret.name"), &secret.name);
                secret_key(errors, &format!("{at}.caSecret.key"), &secret.key);
            }
        }
        if let Some(store) = &entry.store {
            let at = format!("{at}.store");
            validate_store(&at, &store.backup_store(), errors);
            errors.name(&format!("{at}.cluster"), &store.cluster);
        }
    }
}

/// A Secret key (the schema's `SECRET_KEY_PATTERN`, at most 253 characters).
fn secret_key(errors: &mut Errors, field: &str, key: &str) {
    errors.check(
        key.len() <= 253 && formats::is_secret_key(key),
        field,
        || format!("must be a Secret key (letters, digits, '-', '_' and '.'), got {key:?}"),
    );
}

/// A map of labels (a selector): at most `max` entries, label keys and label values.
fn validate_labels(
    labels: &std::collections::BTreeMap<String, String>,
    max: usize,
    path: &str,
    errors: &mut Errors,
) {
    errors.check(labels.len() <= max, path, || {
        format!("must have at most {max} entries")
    });
    let bad_keys: Vec<&str> = labels
        .keys()
        .map(String::as_str)
        .filter(|k| !formats::is_label_key(k))
        .collect();
    errors.check(bad_keys.is_empty(), path, || {
        format!("{bad_keys:?}: {}", cel::msg_label_keys())
    });
    for (key, value) in labels {
        errors.check(
            formats::is_label_value(value),
            &format!("{path}.{key}"),
            || format!("must be a label value (at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, or empty), got {value:?}"),
        );
    }
}

fn validate_network_policy(policy: &crate::network::NetworkPolicySpec, errors: &mut Errors) {
    use crate::network::{MAX_CLIENTS, MAX_SELECTOR_LABELS};
    errors.check(
        policy.clients.len() <= MAX_CLIENTS,
        "spec.networkPolicy.clients",
        || format!("must have at most {MAX_CLIENTS} entries"),
    );
    for (i, client) in policy.clients.iter().enumerate() {
        let path = format!("spec.networkPolicy.clients[{i}]");
        validate_labels(
            &client.pod_labels,
            MAX_SELECTOR_LABELS,
            &format!("{path}.podLabels"),
            errors,
        );
        if let Some(labels) = &client.namespace_labels {
            validate_labels(
                labels,
                MAX_SELECTOR_LABELS,
                &format!("{path}.namespaceLabels"),
                errors,
            );
        }
    }
}

fn validate_affinity(affinity: &AffinitySpec, errors: &mut Errors) {
    errors.check(
        formats::is_label_key(&affinity.topology_key),
        "spec.affinity.topologyKey",
        || format!("{}, got {:?}", cel::msg_label_key(), affinity.topology_key),
    );
    validate_labels(
        &affinity.node_selector,
        MAX_NODE_SELECTOR,
        "spec.affinity.nodeSelector",
        errors,
    );
    errors.check(
        affinity.tolerations.len() <= MAX_TOLERATIONS,
        "spec.affinity.tolerations",
        || format!("must have at most {MAX_TOLERATIONS} entries"),
    );
    for (i, t) in affinity.tolerations.iter().enumerate() {
        let path = format!("spec.affinity.tolerations[{i}]");
        if let Some(key) = &t.key {
            errors.check(formats::is_label_key(key), &format!("{path}.key"), || {
                format!("{}, got {key:?}", cel::msg_label_key())
            });
        }
        if let Some(value) = &t.value {
            errors.check(
                formats::is_label_value(value),
                &format!("{path}.value"),
                || format!("must be a label value (at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, or empty), got {value:?}"),
            );
        }
        let exists = t.operator == TolerationOperator::Exists;
        errors.check(
            t.key.is_some() || exists,
            &format!("{path}.operator"),
            || cel::MSG_TOLERATION_KEY_OR_EXISTS.to_string(),
        );
        errors.check(
            !exists || t.value.as_deref().is_none_or(str::is_empty),
            &format!("{path}.value"),
            || cel::MSG_TOLERATION_EXISTS_WITHOUT_VALUE.to_string(),
        );
        if let Some(seconds) = t.toleration_seconds {
            errors.check(seconds >= 0, &format!("{path}.tolerationSeconds"), || {
                format!("must be 0 or more, got {seconds}")
            });
            errors.check(
                t.effect == Some(TaintEffect::NoExecute),
                &format!("{path}.tolerationSeconds"),
                || cel::MSG_TOLERATION_SECONDS_NEED_NO_EXECUTE.to_string(),
            );
        }
    }
}

/// `spec.affinity`'s spread, node affinity and priority (the twins of their schema rules).
fn validate_placement(affinity: &AffinitySpec, errors: &mut Errors) {
    errors.check(
        affinity.topology_spread.len() <= MAX_TOPOLOGY_SPREAD,
        "spec.affinity.topologySpread",
        || format!("must have at most {MAX_TOPOLOGY_SPREAD} entries"),
    );
    for (i, spread) in affinity.topology_spread.iter().enumerate() {
        let path = format!("spec.affinity.topologySpread[{i}]");
        errors.check(
            formats::is_label_key(&spread.topology_key),
            &format!("{path}.topologyKey"),
            || format!("{}, got {:?}", cel::msg_label_key(), spread.topology_key),
        );
        errors.check(
            (1..=9).contains(&spread.max_skew),
            &format!("{path}.maxSkew"),
            || format!("must be 1 to 9, got {}", spread.max_skew),
        );
        let twin = affinity.topology_spread[..i].iter().any(|other| {
            other.topology_key == spread.topology_key
                && other.when_unsatisfiable == spread.when_unsatisfiable
        });
        errors.check(!twin, &path, || {
            format!(
                "duplicate entry: another one has topologyKey {:?} and whenUnsatisfiable {}",
                spread.topology_key,
                spread.when_unsatisfiable.as_str()
            )
        });
    }
    if let Some(node_affinity) = &affinity.node_affinity {
        let required = node_affinity
            .required
            .iter()
            .map(|t| ("required", &t.match_expressions));
        let preferred = node_affinity
            .preferred
            .iter()
            .map(|t| ("preferred", &t.match_expressions));
        for (which, count) in [
            ("required", node_affinity.required.len()),
            ("preferred", node_affinity.preferred.len()),
        ] {
            errors.check(
                count <= MAX_NODE_AFFINITY_TERMS,
                &format!("spec.affinity.nodeAffinity.{which}"),
                || format!("must have at most {MAX_NODE_AFFINITY_TERMS} entries"),
            );
        }
        let mut index = std::collections::BTreeMap::<&str, usize>::new();
        for (which, expressions) in required.chain(preferred) {
            let i = index.entry(which).or_default();
            let path = format!("spec.affinity.nodeAffinity.{which}[{i}].matchExpressions");
            *i += 1;
            errors.check(
                (1..=MAX_NODE_EXPRESSIONS).contains(&expressions.len()),
                &path,
                || format!("must have 1 to {MAX_NODE_EXPRESSIONS} entries"),
            );
            for (j, e) in expressions.iter().enumerate() {
                validate_node_requirement(e, &format!("{path}[{j}]"), errors);
            }
        }
        for (i, term) in node_affinity.preferred.iter().enumerate() {
            errors.check(
                (1..=100).contains(&term.weight),
                &format!("spec.affinity.nodeAffinity.preferred[{i}].weight"),
                || format!("must be 1 to 100, got {}", term.weight),
            );
        }
    }
    if let Some(class) = &affinity.priority_class_name {
        let path = "spec.affinity.priorityClassName";
        errors.check(
            !class.is_empty() && class.len() <= 253 && formats::is_dns_subdomain(class),
            path,
            || format!("must be a PriorityClass name (a DNS subdomain of at most 253 characters), got {class:?}"),
        );
        errors.check(
            !class.starts_with(SYSTEM_PRIORITY_CLASS_PREFIX),
            path,
            || cel::MSG_SYSTEM_PRIORITY_CLASS.to_string(),
        );
    }
}

fn validate_node_requirement(e: &NodeSelectorRequirement, path: &str, errors: &mut Errors) {
    errors.check(
        formats::is_label_key(&e.key),
        &format!("{path}.key"),
        || format!("{}, got {:?}", cel::msg_label_key(), e.key),
    );
    errors.check(
        e.values.len() <= MAX_NODE_VALUES,
        &format!("{path}.values"),
        || format!("must have at most {MAX_NODE_VALUES} entries"),
    );
    for value in &e.values {
        errors.check(
            formats::is_label_value(value),
            &format!("{path}.values"),
            || format!("must be label values (at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, or empty), got {value:?}"),
        );
    }
    errors.check(
        e.operator.fits(&e.values),
        &format!("{path}.values"),
        || cel::MSG_NODE_VALUES_MATCH_OPERATOR.to_string(),
    );
}

fn validate_backup_spec(backup: &BackupSpec, errors: &mut Errors) {
    if let Some(schedule) = &backup.schedule
        && let Some(problem) = formats::cron_problem(schedule)
    {
        errors.add(
            "spec.backup.schedule",
            format!("must be a five-field cron expression such as \"0 2 * * *\": {problem}"),
        );
    }
    if let Some(schedule) = &backup.logical_schedule
        && let Some(problem) = formats::cron_problem(schedule)
    {
        errors.add(
            "spec.backup.logicalSchedule",
            format!("must be a five-field cron expression such as \"0 3 * * *\": {problem}"),
        );
    }
    if let Some(timezone) = &backup.timezone {
        errors.check(
            timezone.len() <= 64 && formats::is_timezone(timezone),
            "spec.backup.timezone",
            || format!("must be an IANA time zone name such as Europe/Berlin, got {timezone:?}"),
        );
    }
    errors.range(
        "spec.backup.retentionDays",
        backup.retention_days,
        1,
        Some(365),
    );
    errors.check(
        (backup.schedule.is_none() && backup.logical_schedule.is_none()) || backup.store.is_some(),
        "spec.backup.store",
        || cel::MSG_SCHEDULE_NEEDS_STORE.to_string(),
    );
    if let Some(store) = &backup.store {
        validate_store("spec.backup.store", store, errors);
    }
}

fn validate_store(path: &str, store: &BackupStore, errors: &mut Errors) {
    errors.check(store.s3.is_some() != store.volume.is_some(), path, || {
        cel::MSG_STORE_EXACTLY_ONE.to_string()
    });
    if let Some(s3) = &store.s3 {
        validate_s3(&format!("{path}.s3"), s3, errors);
    }
    if let Some(volume) = &store.volume {
        errors.name(&format!("{path}.volume.claimName"), &volume.claim_name);
    }
}

fn validate_s3(path: &str, s3: &S3Store, errors: &mut Errors) {
    errors.format(
        &format!("{path}.bucket"),
        &s3.bucket,
        formats::is_bucket,
        "an S3 bucket name (3 to 63 lower-case letters, digits, '.' and '-', in labels that \
         start and end with a letter or digit)",
    );
    if let Some(endpoint) = &s3.endpoint {
        errors.format(
            &format!("{path}.endpoint"),
            endpoint,
            |e| e.len() <= 255 && formats::is_url(e),
            "an http:// or https:// URL of a server: host name or IP address, optional port, \
             no path (at most 255 characters)",
        );
    }
    if let Some(region) = &s3.region {
        errors.format(
            &format!("{path}.region"),
            region,
            formats::is_region,
            "a region name such as eu-central-1 (letters, digits, '-' and '_', at most 63)",
        );
    }
    if let Some(prefix) = &s3.path {
        errors.format(
            &format!("{path}.path"),
            prefix,
            formats::is_store_path,
            "a relative key prefix such as clusters/prod: '/'-separated segments of letters, \
             digits, '.', '_' and '-' that do not start with '.' (no '..'), at most 256 \
             characters",
        );
    }
    let secret = &s3.credentials_secret;
    errors.name(&format!("{path}.credentialsSecret.name"), &secret.name);
    for (field, key) in [
        ("accessKeyIdKey", &secret.access_key_id_key),
        ("secretAccessKeyKey", &secret.secret_access_key_key),
    ] {
        secret_key(errors, &format!("{path}.credentialsSecret.{field}"), key);
    }
}

fn validate_bootstrap(bootstrap: &BootstrapSpec, errors: &mut Errors) {
    errors.check(
        !(bootstrap.initdb.is_some() && bootstrap.recovery.is_some()),
        "spec.bootstrap",
        || cel::MSG_BOOTSTRAP_AT_MOST_ONE.to_string(),
    );
    if let Some(initdb) = &bootstrap.initdb {
        for (field, value) in [
            ("spec.bootstrap.initdb.database", &initdb.database),
            ("spec.bootstrap.initdb.owner", &initdb.owner),
        ] {
            errors.format(
                field,
                value,
                formats::is_identifier,
                "a lower-case PostgreSQL identifier of at most 63 characters",
            );
            errors.check(!is_reserved_name(value), field, cel::msg_reserved_name);
        }
    }
    if let Some(recovery) = &bootstrap.recovery {
        validate_recovery(recovery, errors);
    }
}

fn validate_recovery(recovery: &RecoverySpec, errors: &mut Errors) {
    let path = "spec.bootstrap.recovery";
    errors.check(
        recovery.backup.is_some() != recovery.store.is_some(),
        path,
        || cel::MSG_RECOVERY_EXACTLY_ONE_SOURCE.to_string(),
    );
    errors.check(
        !(recovery.target_time.is_some() && recovery.target_lsn.is_some()),
        path,
        || cel::MSG_RECOVERY_AT_MOST_ONE_TARGET.to_string(),
    );
    errors.check(
        recovery.store.is_none() || recovery.source_cluster.is_some(),
        path,
        || cel::MSG_RECOVERY_STORE_NEEDS_SOURCE.to_string(),
    );
    if let Some(source) = &recovery.source_cluster {
        errors.name(&format!("{path}.sourceCluster"), source);
    }
    if let Some(backup) = &recovery.backup {
        errors.name(&format!("{path}.backup"), backup);
    }
    if let Some(store) = &recovery.store {
        validate_store(&format!("{path}.store"), store, errors);
    }
    if let Some(time) = &recovery.target_time {
        errors.format(
            &format!("{path}.targetTime"),
            time,
            formats::is_timestamp,
            "an RFC 3339 time with a time zone such as 2025-01-31T12:00:00Z",
        );
    }
    if let Some(lsn) = &recovery.target_lsn {
        errors.format(
            &format!("{path}.targetLsn"),
            lsn,
            formats::is_lsn,
            "a PostgreSQL LSN such as 0/3000060",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::OWNED_PARAMETERS;

    fn spec(yaml: &str) -> PostgresClusterSpec {
        serde_yaml::from_str(yaml).expect("test spec parses")
    }

    fn fields(result: Result<(), Vec<FieldError>>) -> Vec<String> {
        result
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    const MINIMAL: &str = "storage: {size: 1Gi}";

    #[test]
    fn declared_roles_may_not_be_the_owner_nor_read_the_clusters_own_secrets() {
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi}\nroles: [{name: app}, {name: reporting, inRoles: [pg_monitor]}]"
            ))),
            ["spec.roles[0].name"]
        );
        // The owner is the one initdb creates; a restore brings its own.
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi}\nbootstrap: {initdb: {owner: shop}}\nroles: [{name: app}, {name: shop}]"
            ))),
            ["spec.roles[1].name"]
        );
        let cluster: PostgresCluster = serde_yaml::from_str(
            "apiVersion: database.example.com/v1alpha1\nkind: PostgresCluster\nmetadata: {name: db}\n\
             spec: {storage: {size: 1Gi}, roles: [{name: reporting, passwordSecret: {name: db-superuser}}]}",
        )
        .expect("cluster");
        assert_eq!(fields(validate_cluster(&cluster)), ["spec.roles"]);
    }

    #[test]
    fn wal_storage_is_checked_and_may_be_added_grown_never_removed_or_shrunk() {
        let with = |size: &str| {
            spec(&format!(
                "storage: {{size: 1Gi}}\nwalStorage: {{size: {size:?}, storageClassName: fast}}"
            ))
        };
        assert_eq!(validate(&with("2Gi")), Ok(()));
        for hostile in ["0", "-1Gi", "1Gi\n#", "$(id)", "1Gi; x", "1e3"] {
            assert_eq!(
                fields(validate(&with(hostile))),
                ["spec.walStorage.size"],
                "{hostile:?}"
            );
        }
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi}\nwalStorage: {size: 1Gi, storageClassName: \"a/../b\"}"
            ))),
            ["spec.walStorage.storageClassName"]
        );
        let without = spec(MINIMAL);
        assert_eq!(validate_update(&without, &with("1Gi"), None), Ok(()));
        assert_eq!(validate_update(&with("1Gi"), &with("2Gi"), None), Ok(()));
        assert_eq!(
            fields(validate_update(&with("2Gi"), &with("1Gi"), None)),
            ["spec.walStorage.size"]
        );
        let removed = validate_update(&with("1Gi"), &without, None).expect_err("removed");
        assert_eq!(removed[0].field, "spec.walStorage");
        assert_eq!(removed[0].message, MSG_WAL_STORAGE_REMOVED);
        let other_class =
            spec("storage: {size: 1Gi}\nwalStorage: {size: 1Gi, storageClassName: slow}");
        assert_eq!(
            fields(validate_update(&with("1Gi"), &other_class, None)),
            ["spec.walStorage.storageClassName"]
        );
    }

    #[test]
    fn auto_grow_is_checked_naming_the_field() {
        assert_eq!(
            validate(&spec(
                "storage: {size: 1Gi, autoGrow: {thresholdPercent: 75, increasePercent: 25, maxSize: 10Gi}}"
            )),
            Ok(())
        );
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi, autoGrow: {thresholdPercent: 40, increasePercent: 200, maxSize: 512Mi}}"
            ))),
            [
                "spec.storage.autoGrow.thresholdPercent",
                "spec.storage.autoGrow.increasePercent",
                "spec.storage.autoGrow.maxSize",
            ]
        );
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi, autoGrow: {maxSize: \"1Gi\\n#\"}}"
            ))),
            ["spec.storage.autoGrow.maxSize"]
        );
    }

    #[test]
    fn declared_databases_are_checked_naming_the_field() {
        assert_eq!(
            validate(&spec(
                "storage: {size: 1Gi}\ndatabases: [{name: shop, owner: reporting, encoding: UTF8, \
                 locale: C.UTF-8, schemas: [{name: sales}], extensions: [{name: uuid-ossp, \
                 version: '1.1', schema: sales}]}, {name: app, owner: app, \
                 extensions: [{name: pgcrypto}]}]"
            )),
            Ok(())
        );
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi}\ndatabases: [{name: template1, owner: streaming_replica, \
                 encoding: \"UTF8'; --\", locale: \"C\\n\", connectionLimit: -2, \
                 schemas: [{name: public}, {name: s, owner: pg_monitor}, {name: s}], \
                 extensions: [{name: \"x$(id)\", version: \"1 ; drop\", schema: \"a.b\"}]}, \
                 {name: template1, owner: app}]"
            ))),
            [
                "spec.databases[0].name",
                "spec.databases[0].owner",
                "spec.databases[0].encoding",
                "spec.databases[0].locale",
                "spec.databases[0].connectionLimit",
                "spec.databases[0].schemas[0].name",
                "spec.databases[0].schemas[1].owner",
                "spec.databases[0].schemas[2]",
                "spec.databases[0].extensions[0].name",
                "spec.databases[0].extensions[0].version",
                "spec.databases[0].extensions[0].schema",
                "spec.databases[1].name",
                "spec.databases[1]",
            ]
        );
        // The application database is never dropped: the default one, or initdb's.
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi}\ndatabases: [{name: app, owner: app, ensure: absent}]"
            ))),
            ["spec.databases[0].ensure"]
        );
        assert_eq!(
            fields(validate(&spec(
                "storage: {size: 1Gi}\nbootstrap: {initdb: {database: shop}}\n\
                 databases: [{name: app, owner: app, ensure: absent}, {name: shop, owner: app, ensure: absent}]"
            ))),
            ["spec.databases[1].ensure"]
        );
    }

    #[test]
    fn a_minimal_spec_is_valid_and_defaulted() {
        let s = spec(MINIMAL);
        assert_eq!(validate(&s), Ok(()));
        assert_eq!(s.replicas, 1);
        assert_eq!(s.switchover_timeout, 60);
        assert_eq!(s.replication.synchronous, 0);
    }

    #[test]
    fn a_full_spec_is_valid() {
        let s = spec(
            r#"
replicas: 3
postgresVersion: 15
storage: {size: 10Gi, storageClassName: fast}
postgresql:
  parameters: {shared_buffers: 256MB, work_mem: 8MB}
  pgHba: ["host all all 10.0.0.0/8 scram-sha-256"]
replication: {synchronous: 1, dataDurability: required}
failoverDelay: 5
backup:
  schedule: "0 2 * * *"
  timezone: Europe/Berlin
  retentionDays: 7
  store:
    s3:
      bucket: pg-backups
      endpoint: https://minio:9000
      credentialsSecret: {name: s3-creds}
bootstrap:
  recovery: {backup: nightly, targetTime: "2025-01-31T12:00:00Z"}
"#,
        );
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn external_clusters_are_checked_naming_the_field() {
        let good = spec(
            r#"
storage: {size: 1Gi}
externalClusters:
- name: site-a
  connection:
    host: db.site-a.example.com
    user: streaming_replica
    passwordSecret: {name: site-a}
    caSecret: {name: site-a-ca}
  store:
    s3: {bucket: site-a, credentialsSecret: {name: s3}}
    cluster: db
- name: old-vm
  connection: {host: 10.0.3.7, user: app, sslMode: require}
"#,
        );
        assert_eq!(validate(&good), Ok(()));
        let c = &good.external_clusters[1];
        let conn = c.connection.as_ref().expect("connection");
        assert_eq!((conn.port, conn.dbname.as_str()), (5432, "postgres"));
        let bad = spec(
            r#"
storage: {size: 1Gi}
externalClusters:
- name: Site-A
  connection:
    host: "db;id"
    port: 0
    dbname: "x'y"
    user: "a\nb"
    passwordSecret: {name: ok, key: "../x"}
- name: Site-A
- name: archive
  store:
    s3: {bucket: site-a, credentialsSecret: {name: s3}}
    volume: {claimName: wal}
    cluster: "a b"
"#,
        );
        assert_eq!(
            fields(validate(&bad)),
            [
                "spec.externalClusters[0].name",
                "spec.externalClusters[0].connection.host",
                "spec.externalClusters[0].connection.port",
                "spec.externalClusters[0].connection.dbname",
                "spec.externalClusters[0].connection.user",
                "spec.externalClusters[0].connection.caSecret",
                "spec.externalClusters[0].connection.passwordSecret.key",
                "spec.externalClusters[1].name",
                "spec.externalClusters[1]",
                "spec.externalClusters[1]",
                "spec.externalClusters[2].store",
                "spec.externalClusters[2].store.cluster",
            ]
        );
        // The Secrets an entry names may not be the cluster's own: its password would be
        // sent to the outside server.
        let mut cluster = PostgresCluster::new("db", good);
        if let Some(c) = cluster.spec.external_clusters[0].connection.as_mut() {
            c.password_secret = Some(crate::external::SecretKey {
                name: "db-superuser".into(),
                key: "password".into(),
            });
        }
        assert_eq!(
            fields(validate_cluster(&cluster)),
            ["spec.externalClusters[0].connection.passwordSecret.name"]
        );
    }

    #[test]
    fn a_replica_cluster_follows_an_entry_with_a_connection_and_does_not_change() {
        let entries = r#"
storage: {size: 1Gi}
externalClusters:
- name: site-a
  connection: {host: db.site-a.example.com, user: streaming_replica, sslMode: require}
- name: archive
  store: {volume: {claimName: wal}, cluster: db}
"#;
        let good = spec(&format!("{entries}replica: {{source: site-a}}"));
        assert_eq!(validate(&good), Ok(()));
        assert!(crate::replica::ReplicaSpec::follows_now(
            good.replica.as_ref(),
            None
        ));
        for (replica, field) in [
            ("{source: site-b}", "spec.replica.source"),
            // A store alone is not followed in this version.
            ("{source: archive}", "spec.replica.source"),
            ("{source: \"Site-A\"}", "spec.replica.source"),
            ("{source: \"a\\nb\"}", "spec.replica.source"),
        ] {
            let bad = spec(&format!("{entries}replica: {replica}"));
            assert!(
                fields(validate(&bad)).contains(&field.to_string()),
                "{replica}: {:?}",
                validate(&bad)
            );
        }
        // A connection with an S3 store is followed (the store for WAL the server no
        // longer has); with a volume store it is not: no instance mounts that volume.
        let both = |store: &str| {
            spec(&format!(
                "storage: {{size: 1Gi}}\nexternalClusters:\n- name: site-a\n  connection: {{host: db, user: streaming_replica, sslMode: require}}\n  store: {{{store}, cluster: db}}\nreplica: {{source: site-a}}"
            ))
        };
        assert_eq!(
            validate(&both("s3: {bucket: site-a, credentialsSecret: {name: s3}}")),
            Ok(())
        );
        let volume = validate(&both("volume: {claimName: wal}"));
        assert!(
            volume
                .as_ref()
                .err()
                .is_some_and(|e| e.iter().any(|e| e.message == cel::MSG_REPLICA_STORE_IS_S3)),
            "{volume:?}"
        );
        let restored = spec(&format!(
            "{entries}replica: {{source: site-a}}\nbootstrap: {{recovery: {{backup: b}}}}"
        ));
        assert_eq!(fields(validate(&restored)), ["spec.bootstrap.recovery"]);
        // Not a replica: the rule does not apply.
        let ordinary = spec(&format!(
            "{entries}replica: {{source: site-a, enabled: false}}\nbootstrap: {{recovery: {{backup: b}}}}"
        ));
        assert_eq!(validate(&ordinary), Ok(()));
        // Neither added, removed, re-pointed nor demoted on a cluster that exists; promoted.
        let plain = spec(entries);
        let promoted = spec(&format!(
            "{entries}replica: {{source: site-a, enabled: false}}"
        ));
        let elsewhere = spec(&format!(
            "{entries}- name: site-b\n  connection: {{host: db.site-b, user: streaming_replica, sslMode: require}}\nreplica: {{source: site-b}}"
        ));
        assert_eq!(validate(&elsewhere), Ok(()));
        assert_eq!(validate_update(&good, &promoted, None), Ok(()));
        for (old, new) in [
            (&plain, &good),
            (&good, &plain),
            (&promoted, &good),
            (&good, &elsewhere),
        ] {
            let errors = validate_update(old, new, None).err().unwrap_or_default();
            assert!(
                errors
                    .iter()
                    .any(|e| e.field == "spec.replica" && e.message == MSG_REPLICA_IMMUTABLE),
                "{errors:?}"
            );
        }
        assert_eq!(validate_update(&good, &good, None), Ok(()));
        // The bound may change.
        let bounded = spec(&format!(
            "{entries}replica: {{source: site-a, maxLagSeconds: 30}}"
        ));
        assert_eq!(validate_update(&good, &bounded, None), Ok(()));
        let unbounded = spec(&format!(
            "{entries}replica: {{source: site-a, maxLagSeconds: 0}}"
        ));
        assert_eq!(fields(validate(&unbounded)), ["spec.replica.maxLagSeconds"]);
        let negative = spec(&format!(
            "{entries}replica: {{source: site-a, promotionMaxLagSeconds: -1}}"
        ));
        assert_eq!(
            fields(validate(&negative)),
            ["spec.replica.promotionMaxLagSeconds"]
        );
    }

    #[test]
    fn out_of_range_numbers_name_their_field() {
        let s = spec(
            "replicas: 10\nstorage: {size: 1Gi}\nfailoverDelay: -1\nswitchoverTimeout: 0\npostgresVersion: 9",
        );
        let f = fields(validate(&s));
        for field in [
            "spec.replicas",
            "spec.failoverDelay",
            "spec.switchoverTimeout",
            "spec.postgresVersion",
        ] {
            assert!(f.contains(&field.to_string()), "{field} in {f:?}");
        }
    }

    #[test]
    fn synchronous_standbys_must_be_fewer_than_replicas() {
        let s = spec("replicas: 2\nstorage: {size: 1Gi}\nreplication: {synchronous: 2}");
        assert_eq!(
            fields(validate(&s)),
            vec!["spec.replication.synchronous".to_string()]
        );
        let s = spec("replicas: 3\nstorage: {size: 1Gi}\nreplication: {synchronous: 2}");
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn required_durability_needs_synchronous_standbys() {
        let s = spec("storage: {size: 1Gi}\nreplication: {dataDurability: required}");
        assert_eq!(
            fields(validate(&s)),
            vec!["spec.replication.dataDurability".to_string()]
        );
    }

    #[test]
    fn owned_parameters_are_refused_by_name_and_case_insensitively() {
        let s = spec(
            "storage: {size: 1Gi}\npostgresql: {parameters: {Wal_Level: logical, port: '5433', work_mem: 4MB}}",
        );
        let errors = validate(&s).err().unwrap_or_default();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.postgresql.parameters");
        assert!(errors[0].message.contains("Wal_Level"), "{}", errors[0]);
        assert!(errors[0].message.contains("port"), "{}", errors[0]);
        assert!(!errors[0].message.contains("work_mem"), "{}", errors[0]);
    }

    #[test]
    fn every_owned_parameter_is_lower_case_and_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for p in OWNED_PARAMETERS {
            assert_eq!(p.to_ascii_lowercase(), *p);
            assert!(seen.insert(p), "{p} twice");
        }
    }

    #[test]
    fn a_schedule_needs_a_store_and_a_store_one_kind() {
        let s = spec("storage: {size: 1Gi}\nbackup: {schedule: '0 2 * * *'}");
        assert_eq!(fields(validate(&s)), vec!["spec.backup.store".to_string()]);
        let s = spec(
            "storage: {size: 1Gi}\nbackup: {store: {volume: {claimName: b}, s3: {bucket: abc, credentialsSecret: {name: c}}}}",
        );
        assert_eq!(fields(validate(&s)), vec!["spec.backup.store".to_string()]);
        let s = spec("storage: {size: 1Gi}\nbackup: {store: {}}");
        assert_eq!(fields(validate(&s)), vec!["spec.backup.store".to_string()]);
        let s = spec("storage: {size: 1Gi}\nbackup: {logicalSchedule: '0 3 * * *'}");
        assert_eq!(fields(validate(&s)), vec!["spec.backup.store".to_string()]);
        let s = spec(
            "storage: {size: 1Gi}\nbackup: {logicalSchedule: '0 3 * *', store: {volume: {claimName: b}}}",
        );
        assert_eq!(
            fields(validate(&s)),
            vec!["spec.backup.logicalSchedule".to_string()]
        );
    }

    #[test]
    fn bootstrap_and_recovery_choices() {
        let s = spec("storage: {size: 1Gi}\nbootstrap: {initdb: {}, recovery: {backup: b}}");
        assert_eq!(fields(validate(&s)), vec!["spec.bootstrap".to_string()]);
        let s = spec(
            "storage: {size: 1Gi}\nbootstrap: {recovery: {targetLsn: '0/1', targetTime: '2025-01-01T00:00:00Z'}}",
        );
        assert_eq!(
            fields(validate(&s)),
            vec![
                "spec.bootstrap.recovery".to_string(),
                "spec.bootstrap.recovery".to_string()
            ]
        );
    }

    #[test]
    fn storage_class_is_immutable_once_set() {
        let old = spec("storage: {size: 1Gi, storageClassName: fast}");
        let changed = spec("storage: {size: 1Gi, storageClassName: slow}");
        let removed = spec("storage: {size: 1Gi}");
        assert_eq!(
            fields(validate_update(&old, &changed, None)),
            vec!["spec.storage.storageClassName".to_string()]
        );
        assert_eq!(
            fields(validate_update(&old, &removed, None)),
            vec!["spec.storage.storageClassName".to_string()]
        );
        assert_eq!(validate_update(&old, &old, None), Ok(()));
        // Setting it for the first time is allowed.
        assert_eq!(validate_update(&removed, &old, None), Ok(()));
    }

    #[test]
    fn storage_only_grows_bootstrap_never_changes_and_the_version_never_goes_down() {
        let old = spec("storage: {size: 1.5Gi}\npostgresVersion: 15");
        let grown = spec("storage: {size: 2048Mi}\npostgresVersion: 15");
        let same_in_other_words = spec("storage: {size: 1536Mi}\npostgresVersion: 15");
        let shrunk = spec("storage: {size: 1G}\npostgresVersion: 15");
        assert_eq!(validate_update(&old, &grown, None), Ok(()));
        assert_eq!(validate_update(&old, &same_in_other_words, None), Ok(()));
        let errors = validate_update(&old, &shrunk, None).expect_err("a shrink");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.storage.size");
        assert!(
            errors[0].message.contains("1G is smaller than 1.5Gi"),
            "{errors:?}"
        );

        let restored = spec(
            "storage: {size: 1.5Gi}\npostgresVersion: 15\nbootstrap: {recovery: {backup: b1}}",
        );
        assert_eq!(
            fields(validate_update(&old, &restored, None)),
            vec!["spec.bootstrap".to_string()]
        );
        assert_eq!(
            fields(validate_update(&restored, &old, None)),
            vec!["spec.bootstrap".to_string()]
        );
        assert_eq!(validate_update(&restored, &restored, None), Ok(()));

        let mut lower = old.clone();
        lower.postgres_version = Some(14);
        let errors = transition_errors(&old, &lower, None);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.postgresVersion");
        assert!(errors[0].message.contains("lowered to 14"), "{errors:?}");
        assert!(errors[0].message.contains("PostgreSQL 15's"), "{errors:?}");
        // Raising is an in-place upgrade.
        let mut higher = old.clone();
        higher.postgres_version = Some(18);
        assert!(transition_errors(&old, &higher, None).is_empty());
        // Unset is 15: naming it, or no longer naming it, changes nothing.
        let mut unset = old.clone();
        unset.postgres_version = None;
        assert!(transition_errors(&old, &unset, None).is_empty());
        assert!(transition_errors(&unset, &old, None).is_empty());
        assert!(transition_errors(&unset, &higher, None).is_empty());
        assert!(transition_errors(&higher, &higher, None).is_empty());
    }

    fn upgrade(phase: crate::cluster::MajorUpgradePhase) -> crate::cluster::PostgresClusterStatus {
        serde_json::from_value(serde_json::json!({
            "postgresVersion": 15,
            "majorUpgrade": {"from": 15, "to": 18, "phase": phase, "mode": "link",
                             "primary": "db-1", "startedAt": "2026-12-04T00:00:00Z"}
        }))
        .expect("status")
    }

    #[test]
    fn the_version_goes_up_or_back_to_the_data_s_until_pg_upgrade_runs() {
        use crate::cluster::MajorUpgradePhase as P;
        let on = |v: i32| {
            let mut s = spec("storage: {size: 1Gi}");
            s.postgres_version = Some(v);
            s
        };
        let held = |v: i32| crate::cluster::PostgresClusterStatus {
            postgres_version: Some(v),
            ..Default::default()
        };
        // Below what the data holds, whatever the old spec said.
        let errors = transition_errors(&on(18), &on(16), Some(&held(17)));
        assert_eq!(
            fields(Err(errors.clone())),
            vec!["spec.postgresVersion".to_string()]
        );
        assert!(errors[0].message.contains("lowered to 16"), "{errors:?}");
        assert!(transition_errors(&on(18), &on(17), Some(&held(17))).is_empty());
        // Called off before pg_upgrade runs; after, held until it ends.
        for phase in [P::BackingUp, P::Stopping, P::Failed, P::Completed] {
            assert!(
                transition_errors(&on(18), &on(15), Some(&upgrade(phase))).is_empty(),
                "{phase:?}"
            );
        }
        for phase in [P::Upgrading, P::Cloning] {
            let errors = transition_errors(&on(18), &on(15), Some(&upgrade(phase)));
            assert_eq!(errors.len(), 1, "{phase:?}");
            assert_eq!(errors[0].field, "spec.postgresVersion");
            assert!(errors[0].message.contains("db-1"), "{errors:?}");
            assert_eq!(
                transition_errors(&on(18), &on(17), Some(&upgrade(phase))).len(),
                1
            );
        }
        // The upgrade's own target stays accepted (a no-op re-apply).
        assert!(transition_errors(&on(18), &on(18), Some(&upgrade(P::Upgrading))).is_empty());
    }

    #[test]
    fn cluster_names_must_fit_in_child_names() {
        assert!(validate_cluster_name("main").is_ok());
        assert!(validate_cluster_name(&"a".repeat(50)).is_ok());
        assert!(validate_cluster_name(&"a".repeat(51)).is_err());
        assert!(validate_cluster_name("1main").is_err());
        assert!(validate_cluster_name("my.cluster").is_err());
    }

    #[test]
    fn a_backup_spec_cannot_change() {
        let a: PostgresBackupSpec = serde_yaml::from_str("cluster: {name: main}").expect("parses");
        let b: PostgresBackupSpec = serde_yaml::from_str("cluster: {name: other}").expect("parses");
        assert_eq!(validate_backup(&a), Ok(()));
        assert_eq!(validate_backup_update(&a, &a), Ok(()));
        assert_eq!(
            fields(validate_backup_update(&a, &b)),
            vec!["spec".to_string()]
        );
    }

    #[test]
    fn the_summary_lists_every_field() {
        let s = spec("replicas: 0\nstorage: {size: big}");
        let errors = validate(&s).err().unwrap_or_default();
        let line = summary(&errors);
        assert!(
            line.contains("spec.replicas: must be between 1 and 9, got 0"),
            "{line}"
        );
        assert!(line.contains("spec.storage.size"), "{line}");
    }

    #[test]
    fn hostile_parameter_names_and_values_are_refused_naming_the_field() {
        let p = "storage: {size: 1Gi}\npostgresql: {parameters: {";
        for (entry, field) in [
            (
                r#""pgop.x = 'y'\narchive_cleanup_command": "id""#,
                "spec.postgresql.parameters",
            ),
            (r#""work_mem = 1": "x""#, "spec.postgresql.parameters"),
            (r#""a#b": "x""#, "spec.postgresql.parameters"),
            (r#""": "x""#, "spec.postgresql.parameters"),
            (r#"include: /etc/passwd"#, "spec.postgresql.parameters"),
            (r#"INCLUDE_DIR: /tmp"#, "spec.postgresql.parameters"),
            (r#"ssl: "on""#, "spec.postgresql.parameters"),
            (
                r#"ssl_passphrase_command: id"#,
                "spec.postgresql.parameters",
            ),
            (
                r#"archive_cleanup_command: id"#,
                "spec.postgresql.parameters",
            ),
            (
                r#"application_name: "x\nport = '5433'""#,
                "spec.postgresql.parameters.application_name",
            ),
            (
                r#"application_name: "x\u0000y""#,
                "spec.postgresql.parameters.application_name",
            ),
            (
                r#"application_name: "x\ry""#,
                "spec.postgresql.parameters.application_name",
            ),
        ] {
            let s = spec(&format!("{p}{entry}}}}}"));
            let f = fields(validate(&s));
            assert!(f.contains(&field.to_string()), "{entry}: {f:?}");
        }
        let fine = spec(&format!(
            "{p}pg_stat_statements.max: '5000', search_path: '\"$user\", public', work_mem: 8MB}}}}"
        ));
        assert_eq!(validate(&fine), Ok(()));
    }

    #[test]
    fn reserved_database_and_owner_names_are_refused() {
        for name in [
            "postgres",
            "streaming_replica",
            "template0",
            "template1",
            "pg_monitor",
            "public",
            "none",
        ] {
            let s = spec(&format!(
                "storage: {{size: 1Gi}}\nbootstrap: {{initdb: {{database: {name}, owner: {name}}}}}"
            ));
            assert_eq!(
                fields(validate(&s)),
                vec![
                    "spec.bootstrap.initdb.database".to_string(),
                    "spec.bootstrap.initdb.owner".to_string()
                ],
                "{name}"
            );
        }
    }

    #[test]
    fn versions_images_times_and_stores_are_checked() {
        let s = spec(
            r#"
storage: {size: 1Gi}
postgresVersion: 99
image: "pgop:1; rm -rf /"
backup:
  store:
    s3:
      bucket: "a..b"
      endpoint: "https://x/$(id)"
      region: "eu`id`"
      path: "../../other"
      credentialsSecret: {name: s3}
bootstrap:
  recovery: {backup: nightly, targetTime: "2026-02-30T00:00:00Z"}
"#,
        );
        let f = fields(validate(&s));
        for field in [
            "spec.postgresVersion",
            "spec.image",
            "spec.backup.store.s3.bucket",
            "spec.backup.store.s3.endpoint",
            "spec.backup.store.s3.region",
            "spec.backup.store.s3.path",
            "spec.bootstrap.recovery.targetTime",
        ] {
            assert!(f.contains(&field.to_string()), "{field} in {f:?}");
        }
    }

    #[test]
    fn affinity_defaults_are_valid_and_both_types_are_accepted() {
        for yaml in [
            "storage: {size: 1Gi}",
            "storage: {size: 1Gi}\naffinity: {podAntiAffinityType: required}",
            "storage: {size: 1Gi}\naffinity: {podAntiAffinityType: preferred, topologyKey: topology.kubernetes.io/zone}",
            "storage: {size: 1Gi}\naffinity: {nodeSelector: {disktype: ssd, example.com/pool: ''}, tolerations: [{key: dedicated, value: db, effect: NoSchedule}, {operator: Exists}, {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 30}]}",
        ] {
            assert_eq!(validate(&spec(yaml)), Ok(()), "{yaml}");
        }
    }

    #[test]
    fn hostile_topology_keys_are_refused_naming_the_field() {
        let long_prefix = format!("{}/x", "a".repeat(254));
        let long_name = "a".repeat(64);
        for key in [
            "",
            "kubernetes.io/hostname\nx",
            "\"kubernetes.io/hostname\"",
            "'zone'",
            "..",
            "../zone",
            "$(id)",
            "a$(reboot)b",
            "a b",
            "/",
            "zone/",
            "a/b/c",
            "Kubernetes.io/hostname",
            long_prefix.as_str(),
            long_name.as_str(),
            "h\u{43e}stname",
        ] {
            let mut s = spec("storage: {size: 1Gi}");
            s.affinity.topology_key = key.to_string();
            assert_eq!(
                fields(validate(&s)),
                vec!["spec.affinity.topologyKey".to_string()],
                "{key:?}"
            );
        }
    }

    #[test]
    fn node_selectors_and_tolerations_are_checked_naming_the_field() {
        for (yaml, field) in [
            (
                "affinity: {nodeSelector: {\"a b\": x}}",
                "spec.affinity.nodeSelector",
            ),
            (
                "affinity: {nodeSelector: {disktype: \"ssd\\nx\"}}",
                "spec.affinity.nodeSelector.disktype",
            ),
            (
                "affinity: {tolerations: [{key: \"$(id)\"}]}",
                "spec.affinity.tolerations[0].key",
            ),
            (
                "affinity: {tolerations: [{key: a, value: \"..\"}]}",
                "spec.affinity.tolerations[0].value",
            ),
            (
                "affinity: {tolerations: [{value: x}]}",
                "spec.affinity.tolerations[0].operator",
            ),
            (
                "affinity: {tolerations: [{key: a, operator: Exists, value: x}]}",
                "spec.affinity.tolerations[0].value",
            ),
            (
                "affinity: {tolerations: [{key: a, effect: NoSchedule, tolerationSeconds: 5}]}",
                "spec.affinity.tolerations[0].tolerationSeconds",
            ),
            (
                "affinity: {tolerations: [{key: a, effect: NoExecute, tolerationSeconds: -1}]}",
                "spec.affinity.tolerations[0].tolerationSeconds",
            ),
        ] {
            let s = spec(&format!("storage: {{size: 1Gi}}\n{yaml}"));
            let f = fields(validate(&s));
            assert!(f.contains(&field.to_string()), "{yaml}: {f:?}");
        }
        let mut many = spec("storage: {size: 1Gi}");
        many.affinity.node_selector = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(
            fields(validate(&many)),
            vec!["spec.affinity.nodeSelector".to_string()]
        );
    }
}
