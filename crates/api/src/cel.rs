//! The CEL rules (`x-kubernetes-validations`) of the CRDs, and the messages they share with
//! [`crate::validation`].
//!
//! Rules see the object after defaulting, so fields with a schema default are always
//! present; the `has()` guards are for the optional ones. The API server puts the path of
//! the field in front of each message, so messages do not repeat it.

use crate::cluster::{MAX_CLUSTER_NAME_LENGTH, OWNED_PARAMETERS};
use crate::formats::DNS_LABEL_PATTERN;
use kube::core::{Message, Reason, Rule};

/// `spec.replication.synchronous` against `spec.replicas`.
pub const MSG_SYNCHRONOUS_BELOW_REPLICAS: &str = "must be less than spec.replicas: every synchronous standby is one of the replicas - 1 standbys";
/// `spec.replication.dataDurability: required` without synchronous standbys.
pub const MSG_REQUIRED_NEEDS_SYNCHRONOUS: &str = "required needs spec.replication.synchronous of 1 or more: without synchronous standbys every commit exists only on the primary";
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
/// A PostgresBackup's spec changed.
pub const MSG_BACKUP_SPEC_IMMUTABLE: &str =
    "is immutable: a PostgresBackup is one backup; create a new one instead";

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

/// `['port', 'listen_addresses', ...]` as a CEL list literal.
fn owned_parameters_cel_list() -> String {
    let quoted: Vec<String> = OWNED_PARAMETERS.iter().map(|p| format!("'{p}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Root of PostgresCluster: the name fits in the names of the cluster's children.
pub fn cluster_name() -> Rule {
    Rule::new(format!(
        "size(self.metadata.name) <= {MAX_CLUSTER_NAME_LENGTH} && self.metadata.name.matches('{DNS_LABEL_PATTERN}')"
    ))
    .message(Message::Message(format!("metadata.name {}", msg_cluster_name())))
    .reason(Reason::FieldValueInvalid)
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

/// spec.backup: a schedule needs somewhere to put the backups.
pub fn schedule_needs_store() -> Rule {
    Rule::new("!(has(self.schedule) || has(self.logicalSchedule)) || has(self.store)")
        .message(MSG_SCHEDULE_NEEDS_STORE)
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

/// PostgresBackup spec: never changes after creation.
pub fn backup_spec_immutable() -> Rule {
    Rule::new("self == oldSelf")
        .message(MSG_BACKUP_SPEC_IMMUTABLE)
        .reason(Reason::FieldValueForbidden)
}
