//! `spec.externalClusters`: PostgreSQL servers and backup stores outside the cluster, each
//! under a name the rest of the spec refers to. An entry is a connection (host, port,
//! database, user, TLS mode, and the Secrets of its password, client certificate and
//! authority), a read-only backup store in pgop's layout, or both.
//!
//! This is the one place every outside source is described and checked, alike in both API
//! versions (the same field at the same path): the features that read from another
//! PostgreSQL (following one as a replica cluster, cloning or importing one) name an entry
//! here. pgop only reads from an entry: it never writes to its server or its store.
//!
//! Every schema rule here has a twin in [`crate::validation`], like the rest of the spec;
//! the user's Secrets an entry names may not be the cluster's own (the webhook and the
//! operator check that, as for `spec.roles`: a rule at the root over every entry's Secrets
//! and the cluster's name would cost more than the API server's budget).

use crate::backup_store::{BackupStore, S3Store, VolumeStore};
use crate::cel;
use crate::formats;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most entries in `spec.externalClusters`.
pub const MAX_EXTERNAL_CLUSTERS: usize = 8;
/// Longest entry name: a DNS label.
pub const MAX_EXTERNAL_NAME_LENGTH: usize = 63;
/// The port PostgreSQL listens on unless an entry says otherwise.
pub const DEFAULT_PORT: i32 = 5432;

/// A PostgreSQL server or backup store outside the cluster: at least one of `connection`
/// or `store`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::external_cluster_has_source())]
#[serde(rename_all = "camelCase")]
pub struct ExternalCluster {
    /// The name the rest of the spec refers to this entry by: a DNS label (lower-case
    /// letters, digits and `-`, starting with a letter), at most 63 characters, unique in
    /// the list.
    #[schemars(length(min = 1, max = 63), pattern(formats::DNS_LABEL_PATTERN))]
    pub name: String,

    /// How to reach the server over the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ExternalConnection>,

    /// A backup store holding the server's base backups and archived WAL in pgop's layout
    /// (as another pgop cluster's `spec.backup.store` writes them), read only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<ExternalStore>,
}

/// A connection to a PostgreSQL server, always over TLS.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = cel::verified_tls_needs_ca())]
#[serde(rename_all = "camelCase")]
pub struct ExternalConnection {
    /// Host name or IPv4 address of the server: lower-case DNS labels separated by `.`, at
    /// most 253 characters (`db.site-a.example.com`, `10.0.3.7`).
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub host: String,

    /// TCP port of the server, 1 to 65535.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Database to connect to: a lower-case PostgreSQL identifier of at most 63
    /// characters. Replication connections ignore it.
    #[serde(default = "default_dbname")]
    #[schemars(pattern(formats::IDENTIFIER_PATTERN))]
    pub dbname: String,

    /// Role to log in as: a lower-case PostgreSQL identifier of at most 63 characters.
    /// Following the server by streaming replication needs a role with `REPLICATION`.
    #[schemars(pattern(formats::IDENTIFIER_PATTERN))]
    pub user: String,

    /// How the server's certificate is checked: `verify-full` (the default: signed by
    /// `caSecret`'s authority and issued for `host`), `verify-ca` (signed by it, any name)
    /// or `require` (encrypted, not checked: only where the network itself is trusted).
    /// Never without TLS.
    #[serde(default)]
    pub ssl_mode: SslMode,

    /// A Secret of the cluster's namespace holding the role's password. Unset: no
    /// password is sent (a client certificate, or a server that asks for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<SecretKey>,

    /// A Secret of the cluster's namespace holding a client certificate to log in with,
    /// in the `kubernetes.io/tls` shape (`tls.crt`, `tls.key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret: Option<SecretName>,

    /// A Secret of the cluster's namespace holding the authority (PEM) that signed the
    /// server's certificate. Required with `verify-ca` and `verify-full`.
    #[serde(default, rename = "caSecret", skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<CaSecretKey>,
}

fn default_port() -> i32 {
    DEFAULT_PORT
}

fn default_dbname() -> String {
    "postgres".to_string()
}

/// How a connection's TLS is checked (libpq's `sslmode`, the modes that always encrypt).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Encrypted; the server's certificate is not checked.
    Require,
    /// Encrypted; the certificate must be signed by `caSecret`'s authority.
    VerifyCa,
    /// Encrypted; the certificate must be signed by `caSecret`'s authority and issued for
    /// the host name.
    #[default]
    VerifyFull,
}

impl SslMode {
    /// libpq's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the server's certificate is checked against an authority.
    pub fn verifies(self) -> bool {
        !matches!(self, SslMode::Require)
    }
}

/// A key of a Secret holding a password (`password` unless `key` says otherwise).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKey {
    /// The Secret's name (an object name).
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// The key whose value is the password.
    #[serde(default = "default_password_key")]
    #[schemars(length(max = 253), pattern(formats::SECRET_KEY_PATTERN))]
    pub key: String,
}

fn default_password_key() -> String {
    "password".to_string()
}

/// A key of a Secret holding an authority's certificate (`ca.crt` unless `key` says
/// otherwise).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CaSecretKey {
    /// The Secret's name (an object name).
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// The key whose value is the authority's certificate (PEM).
    #[serde(default = "default_ca_key")]
    #[schemars(length(max = 253), pattern(formats::SECRET_KEY_PATTERN))]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".to_string()
}

/// A Secret named whole.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    /// The Secret's name (an object name).
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// A backup store outside this cluster's own: exactly one of `s3` or `volume` (the schema
/// of `spec.backup.store`), and the name the source keeps its backups and WAL under.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::store_exactly_one())]
#[serde(rename_all = "camelCase")]
pub struct ExternalStore {
    /// An S3-compatible object store bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Store>,

    /// A PersistentVolumeClaim in the cluster's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeStore>,

    /// The name of the cluster whose backups the store holds (a store keeps each
    /// cluster's backups and WAL under the cluster's name): an object name, at most 253
    /// characters.
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub cluster: String,
}

impl ExternalStore {
    /// The store as the backup code reads one.
    pub fn backup_store(&self) -> BackupStore {
        BackupStore {
            s3: self.s3.clone(),
            volume: self.volume.clone(),
        }
    }
}

impl ExternalCluster {
    /// The user's Secrets this entry names, each with its field under the entry (for
    /// messages: `connection.passwordSecret.name`).
    pub fn secrets(&self) -> Vec<(&'static str, &str)> {
        let mut out = Vec::new();
        if let Some(c) = &self.connection {
            if let Some(s) = &c.password_secret {
                out.push(("connection.passwordSecret.name", s.name.as_str()));
            }
            if let Some(s) = &c.client_certificate_secret {
                out.push(("connection.clientCertificateSecret.name", s.name.as_str()));
            }
            if let Some(s) = &c.ca_secret {
                out.push(("connection.caSecret.name", s.name.as_str()));
            }
        }
        if let Some(s3) = self.store.as_ref().and_then(|s| s.s3.as_ref()) {
            out.push((
                "store.s3.credentialsSecret.name",
                s3.credentials_secret.name.as_str(),
            ));
        }
        out
    }
}
