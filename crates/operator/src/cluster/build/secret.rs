//! The credentials Secrets: the application user and the replication user. Their
//! passwords are generated once, when the Secret is created, and never again; the
//! applier never rewrites the data of an existing Secret (but for the app Secret's keys
//! derived from the password and the certificates, [`APP_DERIVED_KEYS`]). Then the
//! certificates' Secrets (see `cluster::pki`).

use super::{Certificates, Common};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use pgop_api::constants::{
    ANNOTATION_NOT_AFTER, CA_SECRET_SUFFIX, MANAGER_TLS_SECRET_SUFFIX, POSTGRES_CA_SECRET_SUFFIX,
    POSTGRES_PORT, REPLICATION_TLS_SECRET_SUFFIX, SERVER_TLS_SECRET_SUFFIX,
};
use pgop_api::v1beta1::PostgresClusterSpec;
use std::collections::BTreeMap;

pub use pgop_api::constants::REPLICATION_USER;
use pgop_api::constants::{
    APP_SECRET_SUFFIX, REPLICATION_SECRET_SUFFIX, SUPERUSER, SUPERUSER_SECRET_SUFFIX,
};

fn secret(c: &Common, name: String, data: BTreeMap<String, String>) -> Secret {
    Secret {
        metadata: c.meta(&name, &[]),
        type_: Some("kubernetes.io/basic-auth".to_string()),
        string_data: Some(data),
        ..Secret::default()
    }
}

/// The `sslmode` of the app Secret's URI: always encrypted (PostgreSQL refuses
/// plaintext unless `spec.tls.allowPlaintext`); verifying the server needs the Secret's
/// `ca.crt` as a file, which the URI cannot carry (see docs/security.md).
pub const APP_SSLMODE: &str = "require";

pub fn app(c: &Common, spec: &PostgresClusterSpec, password: &str, certs: &Certificates) -> Secret {
    let (database, owner) = spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.initdb.as_ref())
        .map(|i| (i.database.clone(), i.owner.clone()))
        .unwrap_or_else(|| ("app".to_string(), "app".to_string()));
    login(c, APP_SECRET_SUFFIX, (&owner, password, &database), certs)
}

/// `<cluster>-superuser` (with `spec.credentials.superuserAccess`): as the app Secret, for
/// the superuser and the `postgres` database.
pub fn superuser(c: &Common, password: &str, certs: &Certificates) -> Secret {
    login(
        c,
        SUPERUSER_SECRET_SUFFIX,
        (SUPERUSER, password, "postgres"),
        certs,
    )
}

/// `<cluster>-superuser`.
pub fn superuser_name(c: &Common) -> String {
    format!("{}{SUPERUSER_SECRET_SUFFIX}", c.cluster)
}

/// A login Secret: user, password, database, the `-rw` Service, a URI and the authority.
fn login(
    c: &Common,
    suffix: &str,
    (owner, password, database): (&str, &str, &str),
    certs: &Certificates,
) -> Secret {
    let host = format!("{}-rw", c.cluster);
    let uri = format!(
        "postgresql://{}:{}@{host}.{}:{POSTGRES_PORT}/{}?sslmode={APP_SSLMODE}",
        percent_encode(owner),
        percent_encode(password),
        c.namespace,
        percent_encode(database)
    );
    let data = [
        ("username", owner),
        ("password", password),
        ("dbname", database),
        ("host", host.as_str()),
        ("port", &POSTGRES_PORT.to_string()),
        ("uri", uri.as_str()),
        ("sslmode", APP_SSLMODE),
        ("ca.crt", certs.server_ca_cert.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    secret(c, format!("{}{suffix}", c.cluster), data)
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

/// The keys of the app Secret derived from its password (and the spec) or the PostgreSQL
/// authority: kept in line with them when a user changes the password (or when the keys
/// are new to a Secret made by an older pgop).
pub const APP_DERIVED_KEYS: &[&str] = &["uri", "sslmode", "ca.crt"];

/// The keys of a login Secret kept in line at every reconcile: [`APP_DERIVED_KEYS`], and
/// `password` when it is copied from a Secret the user named.
pub fn derived_keys(copied: bool) -> Vec<&'static str> {
    let mut keys = APP_DERIVED_KEYS.to_vec();
    if copied {
        keys.push("password");
    }
    keys
}

pub fn replication(c: &Common, password: &str) -> Secret {
    user_and_password(
        c,
        format!("{}{REPLICATION_SECRET_SUFFIX}", c.cluster),
        &[],
        (REPLICATION_USER, password),
    )
}

/// A Secret with a role's `username` and `password` only, labelled with `extra_labels`.
pub fn user_and_password(
    c: &Common,
    name: String,
    extra_labels: &[(&str, &str)],
    (username, password): (&str, &str),
) -> Secret {
    let data = [("username", username), ("password", password)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Secret {
        metadata: c.meta(&name, extra_labels),
        ..secret(c, name, data)
    }
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
    tls(
        c,
        MANAGER_TLS_SECRET_SUFFIX,
        [&certs.manager_cert, &certs.manager_key, &certs.ca_cert],
        &[(ANNOTATION_NOT_AFTER, &certs.manager_not_after)],
    )
}

/// A `kubernetes.io/tls` Secret: certificate, key and authority (`[tls.crt, tls.key,
/// ca.crt]`), annotated.
fn tls(
    c: &Common,
    suffix: &str,
    [crt, key, ca]: [&str; 3],
    annotations: &[(&str, &str)],
) -> Secret {
    let mut metadata = c.meta(&format!("{}{suffix}", c.cluster), &[]);
    metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    Secret {
        metadata,
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(bytes(&[("tls.crt", crt), ("tls.key", key), ("ca.crt", ca)])),
        ..Secret::default()
    }
}

/// PostgreSQL's authority: only the operator reads it.
pub fn postgres_authority(c: &Common, certs: &Certificates) -> Secret {
    Secret {
        metadata: c.meta(&format!("{}{POSTGRES_CA_SECRET_SUFFIX}", c.cluster), &[]),
        type_: Some("Opaque".to_string()),
        data: Some(bytes(&[
            ("ca.crt", &certs.postgres_ca_cert),
            ("ca.key", &certs.postgres_ca_key),
        ])),
        ..Secret::default()
    }
}

/// PostgreSQL's server certificate, which every instance serves: pgop's, or the one
/// `spec.tls.serverSecret` brings.
pub fn server_tls(c: &Common, certs: &Certificates) -> Secret {
    let annotations: Vec<(&str, &str)> = certs
        .server_annotations
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    tls(
        c,
        SERVER_TLS_SECRET_SUFFIX,
        [
            &certs.server.cert_pem,
            &certs.server.key_pem,
            &certs.server_ca_cert,
        ],
        &annotations,
    )
}

/// The replication user's client certificate, with which standbys connect, and
/// (`client-ca.crt`) the authorities PostgreSQL accepts client certificates from.
pub fn replication_tls(c: &Common, certs: &Certificates) -> Secret {
    let not_after = certs.replication.not_after.to_string();
    let mut secret = tls(
        c,
        REPLICATION_TLS_SECRET_SUFFIX,
        [
            &certs.replication.cert_pem,
            &certs.replication.key_pem,
            &certs.postgres_ca_cert,
        ],
        &[(ANNOTATION_NOT_AFTER, &not_after)],
    );
    if let Some(data) = secret.data.as_mut() {
        data.insert(
            CLIENT_CA_KEY.to_string(),
            ByteString(certs.client_ca_cert.as_bytes().to_vec()),
        );
    }
    secret
}

/// The key of the replication certificate's Secret that holds the authorities PostgreSQL
/// accepts client certificates from (`ssl_ca_file`).
pub const CLIENT_CA_KEY: &str = "client-ca.crt";
