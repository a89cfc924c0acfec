//! Where backups and archived WAL are kept: `BackupStore`, an S3-compatible bucket
//! (`S3Store`, with the Secret of its keys, `S3Credentials`) or a PersistentVolumeClaim
//! (`VolumeStore`). The spec names one to write to (`spec.backup.store`) and one to
//! restore from (`spec.bootstrap.recovery.store`), the status the one resolved for the
//! restore (`status.recoverySource.store`), alike in both API versions. `crate::cluster`
//! re-exports every type here.

use crate::cel;
use crate::formats;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A place for backups and archived WAL: exactly one of `s3` or `volume`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::store_exactly_one())]
#[serde(rename_all = "camelCase")]
pub struct BackupStore {
    /// An S3-compatible object store bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Store>,

    /// A PersistentVolumeClaim in the cluster's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeStore>,
}

/// An S3-compatible bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Store {
    /// Bucket name: 3 to 63 lower-case letters, digits, dots and hyphens, in dot-separated
    /// labels that start and end with a letter or digit.
    #[schemars(length(min = 3, max = 63), pattern(formats::BUCKET_PATTERN))]
    pub bucket: String,

    /// Endpoint URL of an S3-compatible server, e.g. `https://minio.storage:9000`: `http`
    /// or `https`, a host name or IP address, an optional port, no path; AWS S3 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255), pattern(formats::URL_PATTERN))]
    pub endpoint: Option<String>,

    /// Region of the bucket, e.g. `eu-central-1`: letters, digits, `-` and `_`, at most 63.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(formats::REGION_PATTERN))]
    pub region: Option<String>,

    /// Key prefix inside the bucket under which this cluster's backups and WAL are
    /// stored (`clusters/prod`); the bucket's root when unset. Relative, `/`-separated
    /// segments of letters, digits, `.`, `_` and `-` that do not start with `.` (so no
    /// `..`), at most 256 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(formats::STORE_PATH_PATTERN))]
    pub path: Option<String>,

    /// The Secret (in the cluster's namespace) holding the access keys.
    pub credentials_secret: S3Credentials,

    /// Accept any TLS certificate from the endpoint. Only for tests.
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
}

/// Keys of a Secret that hold S3 credentials.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// Name of the Secret.
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub name: String,

    /// Key in the Secret whose value is the access key id.
    #[serde(default = "default_access_key_id_key")]
    #[schemars(length(max = 253), pattern(formats::SECRET_KEY_PATTERN))]
    pub access_key_id_key: String,

    /// Key in the Secret whose value is the secret access key.
    #[serde(default = "default_secret_access_key_key")]
    #[schemars(length(max = 253), pattern(formats::SECRET_KEY_PATTERN))]
    pub secret_access_key_key: String,
}

fn default_access_key_id_key() -> String {
    "AWS_ACCESS_KEY_ID".to_string()
}

fn default_secret_access_key_key() -> String {
    "AWS_SECRET_ACCESS_KEY".to_string()
}

impl S3Credentials {
    /// The access key id and secret access key in `secret` (values trimmed); `Err` names
    /// the key that is missing or not UTF-8.
    pub fn keys_in(
        &self,
        secret: &k8s_openapi::api::core::v1::Secret,
    ) -> Result<(String, String), String> {
        let value = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .map(|v| v.trim().to_string())
                .ok_or_else(|| key.to_string())
        };
        Ok((
            value(&self.access_key_id_key)?,
            value(&self.secret_access_key_key)?,
        ))
    }
}

/// A PersistentVolumeClaim used as backup store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStore {
    /// Name of the PersistentVolumeClaim, in the cluster's namespace. It must allow
    /// ReadWriteMany access if instances on different nodes archive to it.
    #[schemars(length(max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    pub claim_name: String,
}
