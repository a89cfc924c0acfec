//! The CEL rules (`x-kubernetes-validations`) of the CRDs, and the messages they share with
//! [`crate::validation`].
//!
//! Rules see the object after defaulting, so fields with a schema default are always
//! present; the `has()` guards are for the optional ones. The API server puts the path of
//! the field in front of each message, so messages do not repeat it.

use crate::constants::OWN_SECRET_SUFFIXES;
use crate::formats::{
    DNS_LABEL_PATTERN, LABEL_KEY_PATTERN, MAX_LABEL_KEY_LENGTH, MAX_LABEL_KEY_PREFIX_LENGTH,
    MAX_PARAMETER_NAME_LENGTH, PARAMETER_NAME_PATTERN,
};
use crate::reserved::{
    MAX_CLUSTER_NAME_LENGTH, OWNED_PARAMETERS, RESERVED_NAME_PREFIX, RESERVED_NAMES,
    UNSUPPORTED_PARAMETER_PREFIX, UNSUPPORTED_PARAMETERS,
};
use kube::core::{Message, Reason, Rule};

/// `spec.replication.synchronous` against `spec.replicas`.
pub const MSG_SYNCHRONOUS_BELOW_REPLICAS: &str = "must be less than spec.replicas: every synchronous standby is one of the replicas - 1 standbys";
/// `spec.replication.dataDurability: required` without synchronous standbys.
pub const MSG_REQUIRED_NEEDS_SYNCHRONOUS: &str = "required needs spec.replication.synchronous of 1 or more: without synchronous standbys every commit exists only on the primary";
/// `v1beta1`: `spec.ha.synchronous.standbys` against `spec.instances`.
pub const MSG_STANDBYS_BELOW_INSTANCES: &str = "must be less than spec.instances: every synchronous standby is one of the instances - 1 standbys";
/// `v1beta1`: `spec.ha.synchronous.dataDurability: required` without synchronous standbys.
pub const MSG_REQUIRED_NEEDS_STANDBYS: &str = "required needs spec.ha.synchronous.standbys of 1 or more: without synchronous standbys every commit exists only on the primary";
/// `v1beta1`: a scheduled backup method without `spec.backup.store`.
pub const MSG_SCHEDULED_METHODS_NEED_STORE: &str =
    "is required when spec.backup.base.schedule or spec.backup.logical.schedule is set";
/// `spec.storage.storageClassName` changed or removed.
pub const MSG_STORAGE_CLASS_IMMUTABLE: &str =
    "is immutable once set: the instances' volumes were created with it";
/// `spec.backup.schedule` without `spec.backup.store`.
pub const MSG_SCHEDULE_NEEDS_STORE: &str =
    "is required when spec.backup.schedule or spec.backup.logicalSchedule is set";
/// A backup store with none or both of its kinds.
pub const MSG_STORE_EXACTLY_ONE: &str = "exactly one of s3 or volume must be set";
/// `spec.bootstrap` with both methods.
pub const MSG_BOOTSTRAP_AT_MOST_ONE: &str = "at most one of initdb or recovery may be set";
/// `spec.bootstrap.recovery` with none or both sources.
pub const MSG_RECOVERY_EXACTLY_ONE_SOURCE: &str = "exactly one of backup or store must be set";
/// `spec.bootstrap.recovery.store` without the cluster whose backups it holds.
pub const MSG_RECOVERY_STORE_NEEDS_SOURCE: &str =
    "store needs sourceCluster: the name the backed-up cluster had (its backups are kept under it)";
/// `spec.bootstrap.recovery` with two targets.
pub const MSG_RECOVERY_AT_MOST_ONE_TARGET: &str =
    "at most one of targetTime or targetLsn may be set";
/// An entry of `spec.externalClusters` with neither a connection nor a store.
pub const MSG_EXTERNAL_CLUSTER_HAS_SOURCE: &str = "at least one of connection or store must be set: an entry is a server to connect to, a backup store to read, or both";
/// A connection that verifies the server's certificate without an authority to verify it with.
pub const MSG_VERIFIED_TLS_NEEDS_CA: &str = "caSecret is required with sslMode verify-ca and verify-full: the authority the server's certificate is checked against";
/// `spec.replica.source` that names no entry of `spec.externalClusters` with a connection.
pub const MSG_REPLICA_SOURCE_IS_ENTRY: &str = "must name an entry of spec.externalClusters that has a connection or a store: the server, or the store, the replica cluster follows";
/// `spec.replica.source` naming an entry whose store is a volume.
pub const MSG_REPLICA_STORE_IS_S3: &str = "must name an entry whose store, if it has one, is s3: a volume store is not mounted in the instances";
/// `spec.replica` with `spec.bootstrap.recovery`.
pub const MSG_REPLICA_WITHOUT_RECOVERY: &str = "may not be set with spec.replica: a replica cluster's first instance is cloned from its source";
/// A PostgresBackup's spec changed.
pub const MSG_BACKUP_SPEC_IMMUTABLE: &str =
    "is immutable: a PostgresBackup is one backup; create a new one instead";

/// A toleration without a key whose operator is not `Exists`.
pub const MSG_TOLERATION_KEY_OR_EXISTS: &str =
    "must be Exists when key is unset: only Exists without a key tolerates every taint";
/// A toleration with `operator: Exists` and a value.
pub const MSG_TOLERATION_EXISTS_WITHOUT_VALUE: &str =
    "must be unset or empty with operator Exists, which matches any value";
/// `tolerationSeconds` without `effect: NoExecute`.
pub const MSG_TOLERATION_SECONDS_NEED_NO_EXECUTE: &str = "may only be set with effect NoExecute: it bounds how long a Pod stays on a node tainted NoExecute";

/// A PriorityClass of Kubernetes' own.
pub const MSG_SYSTEM_PRIORITY_CLASS: &str = "must not be one of Kubernetes' own system- PriorityClasses: Pods outside kube-system may not use them";
/// A node affinity expression whose values do not fit its operator.
pub const MSG_NODE_VALUES_MATCH_OPERATOR: &str = "must hold at least one value with In and NotIn, none with Exists and DoesNotExist, and one whole number (at most 18 digits) with Gt and Lt";

/// The message for a string that is no label key (`topologyKey`, a toleration's key).
pub fn msg_label_key() -> String {
    format!(
        "must be a label key: an optional prefix (a DNS subdomain of at most \
         {MAX_LABEL_KEY_PREFIX_LENGTH} characters) and '/', then a name of at most 63 letters, \
         digits, '-', '_' and '.' starting and ending with a letter or digit"
    )
}

/// The message for a node selector with a key that is no label key.
pub fn msg_label_keys() -> String {
    format!("every key {}", msg_label_key())
}

/// The message for a cluster name that cannot become Service and Pod names.
pub fn msg_cluster_name() -> String {
    format!(
        "must be at most {MAX_CLUSTER_NAME_LENGTH} characters of lower-case letters, digits and '-', \
         starting with a letter and ending with a letter or digit (it becomes part of Service names)"
    )
}

/// The CEL rule's message: every parameter pgop manages.
pub fn msg_owned_parameters_all() -> String {
    format!(
        "must not set parameters that pgop manages: {}",
        OWNED_PARAMETERS.join(", ")
    )
}

/// The Rust validation's message: the offending parameters, then the CEL rule's message.
pub fn msg_owned_parameters(offending: &[&str]) -> String {
    format!(
        "{} {} managed by pgop; {}",
        offending.join(", "),
        if offending.len() == 1 { "is" } else { "are" },
        msg_owned_parameters_all()
    )
}

/// The message for a parameter name that is no PostgreSQL parameter name.
pub fn msg_parameter_names() -> String {
    format!(
        "every name must be a PostgreSQL parameter name of at most {MAX_PARAMETER_NAME_LENGTH} \
         characters: letters, digits and '_', not starting with a digit, optionally two such \
         names joined by one '.' (no spaces, quotes, '=', '#' or line breaks)"
    )
}

/// The message for parameters pgop refuses although it does not own them.
pub fn msg_unsupported_parameters() -> String {
    format!(
        "must not set {}, or any {UNSUPPORTED_PARAMETER_PREFIX}* parameter: include directives \
         would read other files, and pgop configures TLS itself",
        UNSUPPORTED_PARAMETERS.join(", ")
    )
}

/// The message for a reserved database or owner name.
pub fn msg_reserved_name() -> String {
    format!(
        "must not be a reserved name ({}) or start with {RESERVED_NAME_PREFIX}",
        RESERVED_NAMES.join(", ")
    )
}

/// `['port', 'listen_addresses', ...]` as a CEL list literal.
fn cel_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|p| format!("'{p}'")).collect();
    format!("[{}]", quoted.join(", "))
}

fn owned_parameters_cel_list() -> String {
    cel_list(OWNED_PARAMETERS)
}

/// Root of PostgresCluster: the name fits in the names of the cluster's children.
pub fn cluster_name() -> Rule {
    Rule::new(format!(
        "size(self.metadata.name) <= {MAX_CLUSTER_NAME_LENGTH} && self.metadata.name.matches('{DNS_LABEL_PATTERN}')"
    ))
    .message(Message::Message(format!("metadata.name {}", msg_cluster_name())))
    .reason(Reason::FieldValueInvalid)
}

/// What is wrong with an entry of `spec.fencedInstances` that names no instance of this
/// cluster.
pub fn msg_fenced_instance() -> String {
    "must name an instance of this cluster: <cluster name>-<serial>, as in status.instances"
        .to_string()
}

/// Whether `instance` is an instance name of the cluster `cluster`: `<cluster>-<serial>`.
pub fn is_instance_of(cluster: &str, instance: &str) -> bool {
    instance
        .strip_prefix(cluster)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|serial| {
            (1..=10).contains(&serial.len())
                && !serial.starts_with('0')
                && serial.bytes().all(|b| b.is_ascii_digit())
        })
}

/// spec.fencedInstances: every entry is `<cluster>-<serial>` of this cluster (the items'
/// pattern checks the shape; this, the cluster's name).
pub fn fenced_instances_of_cluster() -> Rule {
    Rule::new(
        "!has(self.spec.fencedInstances) || self.spec.fencedInstances.all(n, \
         n.startsWith(self.metadata.name + '-') && \
         n.substring(size(self.metadata.name) + 1).matches('^[1-9][0-9]{0,9}$'))",
    )
    .message(Message::Message(format!(
        "spec.fencedInstances {}",
        msg_fenced_instance()
    )))
    .field_path(".spec.fencedInstances")
    .reason(Reason::FieldValueInvalid)
}

/// What is wrong with a pooler whose name makes `<cluster>-pooler-<name>` too long.
pub fn msg_pooler_name_length() -> String {
    format!(
        "with the cluster's name must be at most {} characters: the Service \
         <cluster>-pooler-<name> is a DNS label of at most 63",
        crate::pooler::MAX_CLUSTER_AND_POOLER_NAME_LENGTH
    )
}

/// spec.poolers: the Service `<cluster>-pooler-<name>` of each fits in a DNS label.
pub fn pooler_names_fit() -> Rule {
    Rule::new(format!(
        "!has(self.spec.poolers) || self.spec.poolers.all(p, \
         size(self.metadata.name) + size(p.name) <= {})",
        crate::pooler::MAX_CLUSTER_AND_POOLER_NAME_LENGTH
    ))
    .message(Message::Message(format!(
        "spec.poolers[].name {}",
        msg_pooler_name_length()
    )))
    .field_path(".spec.poolers")
    .reason(Reason::FieldValueInvalid)
}

/// What is wrong with a membership in `postgres` or `streaming_replica`.
pub fn msg_forbidden_membership() -> String {
    format!(
        "may not name {}: membership would hand over their objects and privileges",
        crate::reserved::FORBIDDEN_MEMBERSHIPS.join(" or ")
    )
}

/// spec.roles[].inRoles: never the superuser or the replication role.
pub fn no_forbidden_memberships() -> Rule {
    Rule::new(format!(
        "self.all(r, !(r in {}))",
        cel_list(crate::reserved::FORBIDDEN_MEMBERSHIPS)
    ))
    .message(Message::Message(msg_forbidden_membership()))
    .reason(Reason::FieldValueForbidden)
}

/// What is wrong with a role listed among its own `inRoles`.
pub const MSG_MEMBER_OF_ITSELF: &str = "may not name the role itself";

/// spec.roles[]: a role is not a member of itself.
pub fn not_member_of_itself() -> Rule {
    Rule::new("!has(self.inRoles) || !(self.name in self.inRoles)")
        .message(MSG_MEMBER_OF_ITSELF)
        .field_path(".inRoles")
        .reason(Reason::FieldValueInvalid)
}

/// What is wrong with naming one of the cluster's own Secrets where the spec names a user's.
pub fn msg_own_secret() -> String {
    let own: Vec<String> = OWN_SECRET_SUFFIXES
        .iter()
        .map(|s| format!("<cluster>{s}"))
        .collect();
    format!(
        "may not name one of the cluster's own Secrets ({}): pgop writes those itself; \
         name a Secret of your own",
        own.join(", ")
    )
}

/// Whether `secret` is one of the Secrets pgop keeps for the cluster `cluster`.
pub fn is_own_secret(cluster: &str, secret: &str) -> bool {
    OWN_SECRET_SUFFIXES
        .iter()
        .any(|suffix| secret.strip_suffix(suffix) == Some(cluster))
}

/// Root of PostgresCluster: the user's Secret named at `path` (under `spec`, e.g.
/// `credentials.appSecret`) is not one of the cluster's own.
pub fn not_own_secret(path: &str) -> Rule {
    let (parent, _) = path.rsplit_once('.').unwrap_or(("", path));
    let own: Vec<String> = OWN_SECRET_SUFFIXES
        .iter()
        .map(|s| format!("self.metadata.name + '{s}'"))
        .collect();
    Rule::new(format!(
        "!has(self.spec.{parent}) || !has(self.spec.{path}) || !(self.spec.{path} in [{}])",
        own.join(", ")
    ))
    .message(Message::Message(msg_own_secret()))
    .field_path(format!(".spec.{path}"))
    .reason(Reason::FieldValueForbidden)
}

/// spec: fewer synchronous standbys than instances.
pub fn synchronous_below_replicas() -> Rule {
    Rule::new("self.replication.synchronous < self.replicas")
        .message(MSG_SYNCHRONOUS_BELOW_REPLICAS)
        .field_path(".replication.synchronous")
        .reason(Reason::FieldValueInvalid)
}

/// spec.replication: `dataDurability: required` needs synchronous standbys.
pub fn required_durability_needs_synchronous() -> Rule {
    Rule::new("self.dataDurability != 'required' || self.synchronous > 0")
        .message(MSG_REQUIRED_NEEDS_SYNCHRONOUS)
        .field_path(".dataDurability")
        .reason(Reason::FieldValueInvalid)
}

/// `v1beta1` spec: fewer synchronous standbys than instances.
pub fn standbys_below_instances() -> Rule {
    Rule::new("self.ha.synchronous.standbys < self.instances")
        .message(MSG_STANDBYS_BELOW_INSTANCES)
        .field_path(".ha.synchronous.standbys")
        .reason(Reason::FieldValueInvalid)
}

/// `v1beta1` spec.ha.synchronous: `dataDurability: required` needs standbys.
pub fn required_durability_needs_standbys() -> Rule {
    Rule::new("self.dataDurability != 'required' || self.standbys > 0")
        .message(MSG_REQUIRED_NEEDS_STANDBYS)
        .field_path(".dataDurability")
        .reason(Reason::FieldValueInvalid)
}

/// A label key's prefix (before `/`) is at most 253 characters: the pattern cannot bound
/// it. `indexOf` is -1 without a prefix.
pub fn label_key_prefix_length() -> Rule {
    Rule::new(format!(
        "self.indexOf('/') <= {MAX_LABEL_KEY_PREFIX_LENGTH}"
    ))
    .message(Message::Message(msg_label_key()))
    .reason(Reason::FieldValueInvalid)
}

/// spec.affinity.nodeSelector: every key is a label key.
pub fn label_keys() -> Rule {
    Rule::new(format!(
        "self.all(k, size(k) <= {MAX_LABEL_KEY_LENGTH} && k.matches(r'{LABEL_KEY_PATTERN}') && k.indexOf('/') <= {MAX_LABEL_KEY_PREFIX_LENGTH})"
    ))
    .message(Message::Message(msg_label_keys()))
    .reason(Reason::FieldValueInvalid)
}

/// A toleration without a key tolerates every taint, which only `Exists` means.
pub fn toleration_key_or_exists() -> Rule {
    Rule::new("has(self.key) || self.operator == 'Exists'")
        .message(MSG_TOLERATION_KEY_OR_EXISTS)
        .field_path(".operator")
        .reason(Reason::FieldValueInvalid)
}

/// A toleration with `operator: Exists` has no value.
pub fn toleration_exists_without_value() -> Rule {
    Rule::new("self.operator != 'Exists' || !has(self.value) || self.value == ''")
        .message(MSG_TOLERATION_EXISTS_WITHOUT_VALUE)
        .field_path(".value")
        .reason(Reason::FieldValueInvalid)
}

/// `tolerationSeconds` only with `effect: NoExecute`.
pub fn toleration_seconds_need_no_execute() -> Rule {
    Rule::new("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')")
        .message(MSG_TOLERATION_SECONDS_NEED_NO_EXECUTE)
        .field_path(".tolerationSeconds")
        .reason(Reason::FieldValueInvalid)
}

/// spec.storage: storageClassName may be set once, then never changed or removed.
pub fn storage_class_immutable() -> Rule {
    Rule::new(
        "!has(oldSelf.storageClassName) || (has(self.storageClassName) && self.storageClassName == oldSelf.storageClassName)",
    )
    .message(MSG_STORAGE_CLASS_IMMUTABLE)
    .field_path(".storageClassName")
    .reason(Reason::FieldValueForbidden)
}

/// spec.postgresql.parameters: none of [`OWNED_PARAMETERS`], case-insensitively.
///
/// The message lists every owned parameter rather than only the offending ones: a message
/// expression that filters and joins the map's keys is estimated far over the API server's
/// CEL cost budget (map keys have no length limit in a schema).
pub fn no_owned_parameters() -> Rule {
    Rule::new(format!(
        "self.all(k, !(k.lowerAscii() in {}))",
        owned_parameters_cel_list()
    ))
    .message(Message::Message(msg_owned_parameters_all()))
    .reason(Reason::FieldValueForbidden)
}

/// spec.postgresql.parameters: every key is a parameter name (so none can add a line or
/// a directive to postgresql.conf).
pub fn parameter_names() -> Rule {
    Rule::new(format!(
        "self.all(k, size(k) <= {MAX_PARAMETER_NAME_LENGTH} && k.matches(r'{PARAMETER_NAME_PATTERN}'))"
    ))
    .message(Message::Message(msg_parameter_names()))
    .reason(Reason::FieldValueInvalid)
}

/// spec.postgresql.parameters: none of [`UNSUPPORTED_PARAMETERS`], nor `ssl_*`.
pub fn no_unsupported_parameters() -> Rule {
    Rule::new(format!(
        "self.all(k, !(k.lowerAscii() in {}) && !k.lowerAscii().startsWith('{UNSUPPORTED_PARAMETER_PREFIX}'))",
        cel_list(UNSUPPORTED_PARAMETERS)
    ))
    .message(Message::Message(msg_unsupported_parameters()))
    .reason(Reason::FieldValueForbidden)
}

/// spec.bootstrap.initdb: `field` (database or owner) is not a reserved name.
pub fn unreserved_name(field: &str) -> Rule {
    Rule::new(format!(
        "!(self.{field} in {}) && !self.{field}.startsWith('{RESERVED_NAME_PREFIX}')",
        cel_list(RESERVED_NAMES)
    ))
    .message(Message::Message(msg_reserved_name()))
    .field_path(format!(".{field}"))
    .reason(Reason::FieldValueForbidden)
}

/// The message for an owner of a declared database or schema that may not own one.
pub fn msg_unusable_owner() -> String {
    format!(
        "may not be {} or start with {RESERVED_NAME_PREFIX}: pgop keeps the replication \
         role, and PostgreSQL the predefined roles",
        crate::reserved::FORBIDDEN_OWNERS.join(" or ")
    )
}

/// spec.databases[] and its schemas[]: the owner (when set) is neither the replication
/// role nor a predefined `pg_*` role.
pub fn usable_owner(field: &str) -> Rule {
    Rule::new(format!(
        "!has(self.{field}) || (!(self.{field} in {}) && !self.{field}.startsWith('{RESERVED_NAME_PREFIX}'))",
        cel_list(crate::reserved::FORBIDDEN_OWNERS)
    ))
    .message(Message::Message(msg_unusable_owner()))
    .field_path(format!(".{field}"))
    .reason(Reason::FieldValueForbidden)
}

/// The message for a reserved schema name.
pub fn msg_reserved_schema() -> String {
    format!(
        "must not be a reserved name ({}) or start with {RESERVED_NAME_PREFIX}",
        RESERVED_NAMES
            .iter()
            .chain(crate::reserved::RESERVED_SCHEMAS)
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// spec.databases[].schemas[]: not a schema PostgreSQL keeps.
pub fn unreserved_schema_name() -> Rule {
    let names: Vec<&str> = RESERVED_NAMES
        .iter()
        .chain(crate::reserved::RESERVED_SCHEMAS)
        .copied()
        .collect();
    Rule::new(format!(
        "!(self.name in {}) && !self.name.startsWith('{RESERVED_NAME_PREFIX}')",
        cel_list(&names)
    ))
    .message(Message::Message(msg_reserved_schema()))
    .field_path(".name")
    .reason(Reason::FieldValueForbidden)
}

/// spec.backup: a schedule needs somewhere to put the backups.
pub fn schedule_needs_store() -> Rule {
    Rule::new("!(has(self.schedule) || has(self.logicalSchedule)) || has(self.store)")
        .message(MSG_SCHEDULE_NEEDS_STORE)
        .field_path(".store")
        .reason(Reason::FieldValueRequired)
}

/// `v1beta1` spec.backup: a scheduled method needs somewhere to put the backups.
pub fn scheduled_methods_need_store() -> Rule {
    Rule::new("!(has(self.base.schedule) || has(self.logical.schedule)) || has(self.store)")
        .message(MSG_SCHEDULED_METHODS_NEED_STORE)
        .field_path(".store")
        .reason(Reason::FieldValueRequired)
}

/// A backup store is exactly one of its kinds.
pub fn store_exactly_one() -> Rule {
    Rule::new("has(self.s3) != has(self.volume)")
        .message(MSG_STORE_EXACTLY_ONE)
        .reason(Reason::FieldValueInvalid)
}

/// spec.bootstrap: one method at most.
pub fn bootstrap_at_most_one() -> Rule {
    Rule::new("!(has(self.initdb) && has(self.recovery))")
        .message(MSG_BOOTSTRAP_AT_MOST_ONE)
        .reason(Reason::FieldValueInvalid)
}

/// spec.bootstrap.recovery: one source.
pub fn recovery_exactly_one_source() -> Rule {
    Rule::new("has(self.backup) != has(self.store)")
        .message(MSG_RECOVERY_EXACTLY_ONE_SOURCE)
        .reason(Reason::FieldValueInvalid)
}

/// spec.bootstrap.recovery: a store names the cluster whose backups it holds.
pub fn recovery_store_needs_source() -> Rule {
    Rule::new("!has(self.store) || has(self.sourceCluster)")
        .message(MSG_RECOVERY_STORE_NEEDS_SOURCE)
        .reason(Reason::FieldValueRequired)
}

/// spec.bootstrap.recovery: one target at most.
pub fn recovery_at_most_one_target() -> Rule {
    Rule::new("!(has(self.targetTime) && has(self.targetLsn))")
        .message(MSG_RECOVERY_AT_MOST_ONE_TARGET)
        .reason(Reason::FieldValueInvalid)
}

/// spec.externalClusters[]: a connection, a store or both.
pub fn external_cluster_has_source() -> Rule {
    Rule::new("has(self.connection) || has(self.store)")
        .message(MSG_EXTERNAL_CLUSTER_HAS_SOURCE)
        .reason(Reason::FieldValueRequired)
}

/// spec.externalClusters[].connection: a verifying TLS mode names the authority.
pub fn verified_tls_needs_ca() -> Rule {
    Rule::new("self.sslMode == 'require' || has(self.caSecret)")
        .message(MSG_VERIFIED_TLS_NEEDS_CA)
        .field_path(".caSecret")
        .reason(Reason::FieldValueRequired)
}

/// spec: `replica.source` names an entry of `externalClusters` with a connection (a list
/// of at most 8: cheap).
pub fn replica_source_is_entry() -> Rule {
    Rule::new(
        "!has(self.replica) || (has(self.externalClusters) && \
         self.externalClusters.exists(e, e.name == self.replica.source && \
         (has(e.connection) || has(e.store))))",
    )
    .message(MSG_REPLICA_SOURCE_IS_ENTRY)
    .field_path(".replica.source")
    .reason(Reason::FieldValueInvalid)
}

/// spec: the store of the entry a replica cluster follows is S3 (read by its instances).
pub fn replica_store_is_s3() -> Rule {
    Rule::new(
        "!has(self.replica) || !has(self.externalClusters) || \
         self.externalClusters.all(e, e.name != self.replica.source || !has(e.store) || has(e.store.s3))",
    )
    .message(MSG_REPLICA_STORE_IS_S3)
    .field_path(".replica.source")
    .reason(Reason::FieldValueInvalid)
}

/// spec: a replica cluster is not restored from a backup.
pub fn replica_without_recovery() -> Rule {
    Rule::new(
        "!has(self.replica) || !self.replica.enabled || !has(self.bootstrap) || \
         !has(self.bootstrap.recovery)",
    )
    .message(MSG_REPLICA_WITHOUT_RECOVERY)
    .field_path(".bootstrap.recovery")
    .reason(Reason::FieldValueForbidden)
}

/// PostgresBackup spec: never changes after creation.
pub fn backup_spec_immutable() -> Rule {
    Rule::new("self == oldSelf")
        .message(MSG_BACKUP_SPEC_IMMUTABLE)
        .reason(Reason::FieldValueForbidden)
}

/// `priorityClassName`: not a `system-` class.
pub fn not_system_priority_class() -> Rule {
    Rule::new(format!(
        "!self.startsWith('{}')",
        crate::reserved::SYSTEM_PRIORITY_CLASS_PREFIX
    ))
    .message(MSG_SYSTEM_PRIORITY_CLASS)
    .reason(Reason::FieldValueForbidden)
}

/// A node affinity expression: its values fit its operator.
pub fn node_values_match_operator() -> Rule {
    Rule::new(
        "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : \
         (self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || size(self.values) == 0) : \
         (has(self.values) && size(self.values) == 1 && self.values[0].matches('^[0-9]{1,18}$')))",
    )
    .message(MSG_NODE_VALUES_MATCH_OPERATOR)
    .field_path(".values")
    .reason(Reason::FieldValueInvalid)
}
