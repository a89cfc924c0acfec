//! `spec.poolers`: PgBouncer connection poolers in front of the cluster. Each is a
//! Deployment `<cluster>-pooler-<name>` of pods running `pgop pooler run` (PgBouncer and
//! its manager) behind a Service of the same name. An `rw` pooler sends every server
//! connection to the current primary, an `ro` pooler spreads them over the ready
//! standbys; the manager follows the cluster's status, so a failover moves the pooler's
//! server connections, never its clients' connections.
//!
//! Every string here is a name or an enumeration: nothing a user writes reaches
//! PgBouncer's configuration as text. Every schema rule has a twin in
//! [`crate::validation`].

use crate::formats;
use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most poolers in `spec.poolers`.
pub const MAX_POOLERS: usize = 4;
/// Longest pooler name.
pub const MAX_POOLER_NAME_LENGTH: usize = 20;
/// Most pods of one pooler.
pub const MAX_POOLER_INSTANCES: i32 = 10;
/// Most client connections one pooler pod accepts (`max_client_conn`).
pub const MAX_CLIENT_CONNECTIONS: i32 = 100_000;
/// Most server connections per user and database of one pooler pod (`default_pool_size`).
pub const MAX_POOL_SIZE: i32 = 10_000;
/// What joins the cluster's name and the pooler's into the Deployment's and Service's
/// name.
pub const POOLER_INFIX: &str = "-pooler-";
/// The longest cluster name plus pooler name: the Service name `<cluster>-pooler-<name>`
/// must be a DNS label (63 characters).
pub const MAX_CLUSTER_AND_POOLER_NAME_LENGTH: usize = 63 - POOLER_INFIX.len();

/// The role PgBouncer looks other users' passwords up as (`auth_user`): it may only call
/// [`AUTH_FUNCTION`], which the instance manager installs in every database. Reserved: its
/// `pgop_` prefix cannot be declared in `spec.roles`.
pub const AUTH_USER: &str = "pgop_pooler";
/// The schema of [`AUTH_FUNCTION`], in every database.
pub const AUTH_SCHEMA: &str = "pgop_pooler";
/// PgBouncer's `auth_query` calls it: the SCRAM verifier of a role that may log in and is
/// neither a superuser nor a replication role nor pgop's own.
pub const AUTH_FUNCTION: &str = "pgop_pooler.user_lookup";
/// PgBouncer's `auth_query`: [`AUTH_FUNCTION`] called with the client's user name.
pub const AUTH_QUERY: &str = "SELECT usename, passwd FROM pgop_pooler.user_lookup($1)";

/// `<cluster>.pooler`: the poolers' ServiceAccount, Role and RoleBinding, and the Secret
/// with [`AUTH_USER`]'s password (a dot: no cluster's name, nor any name pgop derives from
/// one with a dash, can be it).
pub fn identity_name(cluster: &str) -> String {
    format!("{cluster}.pooler")
}

/// The name of the Deployment, Service and pods' app label of pooler `pooler`.
pub fn pooler_name(cluster: &str, pooler: &str) -> String {
    format!("{cluster}{POOLER_INFIX}{pooler}")
}

/// One PgBouncer pooler of the cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolerSpec {
    /// The pooler's name, a DNS label of at most 20 characters (`^[a-z]([-a-z0-9]*[a-z0-9])?$`):
    /// its Deployment and Service are `<cluster>-pooler-<name>` (cluster and pooler name
    /// together at most 55 characters).
    #[schemars(length(min = 1, max = MAX_POOLER_NAME_LENGTH), pattern(formats::DNS_LABEL_PATTERN))]
    pub name: String,

    /// `rw` (the default): server connections go to the primary; `ro`: to the ready
    /// standbys, spread over them (none ready: the pooler pods are not ready).
    #[serde(default, rename = "type")]
    pub type_: PoolerType,

    /// PgBouncer's `pool_mode`: `transaction` (the default; a server connection is a
    /// client's for one transaction, so session state such as prepared statements by
    /// name, `SET` and advisory locks does not carry over) or `session` (for the whole
    /// client connection).
    #[serde(default)]
    pub pool_mode: PoolMode,

    /// Pods of the pooler (1 to 10, default 1). Each keeps its own pools.
    #[serde(default = "default_instances")]
    #[schemars(range(min = 1, max = MAX_POOLER_INSTANCES))]
    pub instances: i32,

    /// Client connections each pod accepts (`max_client_conn`, 1 to 100000, default 1000).
    #[serde(default = "default_max_client_connections")]
    #[schemars(range(min = 1, max = MAX_CLIENT_CONNECTIONS))]
    pub max_client_connections: i32,

    /// Server connections each pod opens per user and database (`default_pool_size`, 1 to
    /// 10000, default 20). Mind PostgreSQL's `max_connections` (100 unless set):
    /// pods × users × databases × this must fit in it.
    #[serde(default = "default_pool_size")]
    #[schemars(range(min = 1, max = MAX_POOL_SIZE))]
    pub default_pool_size: i32,

    /// CPU and memory requests and limits of the pooler's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

fn default_instances() -> i32 {
    1
}

fn default_max_client_connections() -> i32 {
    1000
}

fn default_pool_size() -> i32 {
    20
}

/// Where a pooler's server connections go.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PoolerType {
    /// The primary.
    #[default]
    Rw,
    /// The ready standbys.
    Ro,
}

/// PgBouncer's `pool_mode`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// A server connection per client connection, for its whole life.
    Session,
    /// A server connection per transaction.
    #[default]
    Transaction,
}

impl PoolMode {
    /// The value of PgBouncer's `pool_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// What the operator observes of one pooler (`status.poolers`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolerStatus {
    /// The pooler's name (`spec.poolers[].name`).
    pub name: String,
    /// Its Service (and Deployment): `<cluster>-pooler-<name>`.
    pub service: String,
    /// Pods of its Deployment.
    #[serde(default)]
    pub instances: i32,
    /// Of those, ready (PgBouncer up with a server to send connections to).
    #[serde(default)]
    pub ready_instances: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pooler_spec_takes_its_defaults() {
        let p: PoolerSpec =
            serde_json::from_value(serde_json::json!({"name": "rw"})).expect("a minimal pooler");
        assert_eq!(p.type_, PoolerType::Rw);
        assert_eq!(p.pool_mode, PoolMode::Transaction);
        assert_eq!(
            (p.instances, p.max_client_connections, p.default_pool_size),
            (1, 1000, 20)
        );
        let ro: PoolerSpec = serde_json::from_value(
            serde_json::json!({"name": "reports", "type": "ro", "poolMode": "session"}),
        )
        .expect("an ro pooler");
        assert_eq!(
            (ro.type_, ro.pool_mode),
            (PoolerType::Ro, PoolMode::Session)
        );
        assert_eq!(pooler_name("db", "reports"), "db-pooler-reports");
        assert_eq!(MAX_CLUSTER_AND_POOLER_NAME_LENGTH, 55);
    }
}
