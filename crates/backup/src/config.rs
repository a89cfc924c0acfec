//! Where backups go, as plain values: an S3-compatible bucket (credentials already resolved
//! from their Secret) or a local directory (a mounted volume, or a scratch directory in
//! tests). The instance manager writes it to a file only PostgreSQL's OS user can read
//! (mode 0600); `pgop instance wal-archive` / `wal-restore` read it from there. Credentials
//! never appear on a command line and are never logged: `Debug` redacts them.

use pgop_api::cluster::{BackupStore, S3Store};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The version of the configuration file format.
pub const CONFIG_FORMAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the backup store configuration {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to parse the backup store configuration {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the backup store configuration {path} has format {found}; this pgop reads format {CONFIG_FORMAT}"
    )]
    Format { path: PathBuf, found: u32 },
    #[error("failed to write the backup store configuration {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spec.backup.store has neither s3 nor volume")]
    NoStore,
}

/// A backup store and the cluster whose backups it holds.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreConfig {
    /// [`CONFIG_FORMAT`].
    pub format: u32,
    pub location: Location,
    /// Key prefix (S3) or sub-directory (local) under which clusters are stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The cluster whose WAL and base backups these are: `<prefix>/<cluster>/pgop-v1/...`.
    pub cluster: String,
}

/// Where objects are kept.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Location {
    S3(S3Location),
    /// A directory: a mounted volume, or a scratch directory in tests.
    Local {
        path: PathBuf,
    },
}

/// An S3-compatible bucket with resolved credentials.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct S3Location {
    pub bucket: String,
    /// e.g. `https://minio.storage:9000`; AWS S3 when unset. `http://` is allowed (the
    /// scheme says so); TLS certificates are verified unless `insecure_skip_tls_verify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("location", &self.location)
            .field("prefix", &self.prefix)
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::S3(s3) => f
                .debug_struct("S3")
                .field("bucket", &s3.bucket)
                .field("endpoint", &s3.endpoint)
                .field("region", &s3.region)
                .field("access_key_id", &"<redacted>")
                .field("secret_access_key", &"<redacted>")
                .field("insecure_skip_tls_verify", &s3.insecure_skip_tls_verify)
                .finish(),
            Location::Local { path } => f.debug_struct("Local").field("path", path).finish(),
        }
    }
}

/// The two keys read from the S3 credentials Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("S3Keys(<redacted>)")
    }
}

impl StoreConfig {
    /// A local directory store (a volume, or tests).
    pub fn local(path: impl Into<PathBuf>, cluster: &str) -> Self {
        Self {
            format: CONFIG_FORMAT,
            location: Location::Local { path: path.into() },
            prefix: None,
            cluster: cluster.to_string(),
        }
    }

    /// From the API's `BackupStore`: `keys` are the S3 Secret's values (ignored for a
    /// volume), `volume_mount` is where the volume's claim is mounted in the pod.
    pub fn from_api(
        store: &BackupStore,
        cluster: &str,
        keys: Option<&S3Keys>,
        volume_mount: &Path,
    ) -> Result<Self, Error> {
        let location = match (&store.s3, &store.volume) {
            (Some(s3), _) => Location::S3(s3_location(s3, keys)),
            (None, Some(_)) => Location::Local {
                path: volume_mount.to_path_buf(),
            },
            (None, None) => return Err(Error::NoStore),
        };
        Ok(Self {
            format: CONFIG_FORMAT,
            location,
            prefix: store.s3.as_ref().and_then(|s| s.path.clone()),
            cluster: cluster.to_string(),
        })
    }

    /// Reads a configuration file written by [`StoreConfig::write`].
    pub fn read(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: Self = serde_json::from_slice(&text).map_err(|source| Error::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        if config.format != CONFIG_FORMAT {
            return Err(Error::Format {
                path: path.to_path_buf(),
                found: config.format,
            });
        }
        Ok(config)
    }

    /// Writes the file with mode 0600 (temp file + rename), owned by `owner` (uid, gid)
    /// when given: the archive command runs as PostgreSQL's OS user and reads it.
    pub fn write(&self, path: &Path, owner: Option<(u32, u32)>) -> Result<(), Error> {
        let write = || -> std::io::Result<()> {
            let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
            let tmp = path.with_extension("pgop-tmp");
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&json)?;
            file.sync_all()?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))?;
            }
            std::fs::rename(&tmp, path)
        };
        write().map_err(|source| Error::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The same store, for another cluster's objects (a restore reads the source's).
    pub fn for_cluster(&self, cluster: &str) -> Self {
        Self {
            cluster: cluster.to_string(),
            ..self.clone()
        }
    }
}

fn s3_location(s3: &S3Store, keys: Option<&S3Keys>) -> S3Location {
    S3Location {
        bucket: s3.bucket.clone(),
        endpoint: s3.endpoint.clone(),
        region: s3.region.clone(),
        access_key_id: keys.map(|k| k.access_key_id.clone()).unwrap_or_default(),
        secret_access_key: keys
            .map(|k| k.secret_access_key.clone())
            .unwrap_or_default(),
        insecure_skip_tls_verify: s3.insecure_skip_tls_verify,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_credentials() {
        let config = StoreConfig {
            format: CONFIG_FORMAT,
            location: Location::S3(S3Location {
                bucket: "b".into(),
                endpoint: None,
                region: None,
                access_key_id: "AKIDSECRET".into(),
                secret_access_key: "VERYSECRET".into(),
                insecure_skip_tls_verify: false,
            }),
            prefix: None,
            cluster: "c".into(),
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
    }

    #[test]
    fn the_file_round_trips_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgop-backup-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("store.json");
        let config = StoreConfig::local("/backups", "demo");
        config.write(&path, None).expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(StoreConfig::read(&path).expect("read"), config);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
