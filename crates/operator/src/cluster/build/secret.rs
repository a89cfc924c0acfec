//! The credentials Secrets: the application user and the replication user. Their
//! passwords are generated once, when the Secret is created, and never again; the
//! applier never rewrites the data of an existing Secret.

use super::Common;
use k8s_openapi::api::core::v1::Secret;
use pgop_api::PostgresClusterSpec;
use pgop_api::constants::POSTGRES_PORT;
use std::collections::BTreeMap;

pub const APP_SECRET_SUFFIX: &str = "-app";
pub const REPLICATION_SECRET_SUFFIX: &str = "-replication";
pub use pgop_api::constants::REPLICATION_USER;

fn secret(c: &Common, name: String, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: c.meta(&name, &[]),
        type_: Some("kubernetes.io/basic-auth".to_string()),
        string_data: Some(data),
        ..Secret::default()
    }
}

pub fn app(c: &Common, spec: &PostgresClusterSpec, password: &str) -> Secret {
    let (database, owner) = spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.initdb.as_ref())
        .map(|i| (i.database.clone(), i.owner.clone()))
        .unwrap_or_else(|| ("app".to_string(), "app".to_string()));
    let host = format!("{}-rw", c.cluster);
    let uri = format!(
        "postgresql://{owner}:{password}@{host}.{}:{POSTGRES_PORT}/{database}",
        c.namespace
    );
    let data = [
        ("username", owner.as_str()),
        ("password", password),
        ("dbname", database.as_str()),
        ("host", host.as_str()),
        ("port", &POSTGRES_PORT.to_string()),
        ("uri", uri.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    secret(c, format!("{}{APP_SECRET_SUFFIX}", c.cluster), data)
}

pub fn replication(c: &Common, password: &str) -> Secret {
    let data = [("username", REPLICATION_USER), ("password", password)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    secret(c, format!("{}{REPLICATION_SECRET_SUFFIX}", c.cluster), data)
}
