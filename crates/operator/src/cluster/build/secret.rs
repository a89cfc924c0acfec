//! The credentials Secrets: the application user and the replication user. Their
//! passwords are generated once, when the Secret is created, and never again; the
//! applier never rewrites the data of an existing Secret.

use super::{Certificates, Common};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use pgop_api::PostgresClusterSpec;
use pgop_api::constants::{
    ANNOTATION_NOT_AFTER, CA_SECRET_SUFFIX, MANAGER_TLS_SECRET_SUFFIX, POSTGRES_PORT,
};
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
        "postgresql://{}:{}@{host}.{}:{POSTGRES_PORT}/{}",
        percent_encode(&owner),
        percent_encode(password),
        c.namespace,
        percent_encode(&database)
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

/// `s` for one component of a URI: every byte but the unreserved ones (RFC 3986: letters,
/// digits, `-`, `.`, `_`, `~`) percent-encoded, so that a password a user chose (`@`, `:`,
/// `/`, `%`, quotes) cannot change the URI's structure.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The keys of the app Secret derived from its password (and the spec): kept in line
/// with the password when a user changes it.
pub const APP_DERIVED_KEYS: &[&str] = &["uri"];

pub fn replication(c: &Common, password: &str) -> Secret {
    let data = [("username", REPLICATION_USER), ("password", password)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    secret(c, format!("{}{REPLICATION_SECRET_SUFFIX}", c.cluster), data)
}

fn bytes(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

/// The cluster's authority for the operator-to-manager channel: only the operator reads
/// it (the instances' Role names only the next Secret).
pub fn authority(c: &Common, certs: &Certificates) -> Secret {
    Secret {
        metadata: c.meta(&format!("{}{CA_SECRET_SUFFIX}", c.cluster), &[]),
        type_: Some("Opaque".to_string()),
        data: Some(bytes(&[
            ("ca.crt", &certs.ca_cert),
            ("ca.key", &certs.ca_key),
        ])),
        ..Secret::default()
    }
}

/// The managers' serving certificate and the authority's certificate, which the managers
/// read; `data` (not `stringData`), so that an unchanged certificate is no drift.
pub fn manager_tls(c: &Common, certs: &Certificates) -> Secret {
    let mut metadata = c.meta(&format!("{}{MANAGER_TLS_SECRET_SUFFIX}", c.cluster), &[]);
    metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_NOT_AFTER.to_string(),
        certs.manager_not_after.clone(),
    )]));
    Secret {
        metadata,
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(bytes(&[
            ("tls.crt", &certs.manager_cert),
            ("tls.key", &certs.manager_key),
            ("ca.crt", &certs.ca_cert),
        ])),
        ..Secret::default()
    }
}
