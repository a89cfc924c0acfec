//! Logical backups: `pg_dumpall --globals-only` (roles, tablespaces) and one `pg_dump -Fc`
//! per database, each streamed from the program's stdout into the store (a multipart
//! upload with the store's gzip and SHA-256 footer: nothing lands on local disk), then the
//! manifest, last: a logical backup without manifest is incomplete by definition and
//! [`list`] ignores it.
//!
//! Layout, under `<prefix>/<cluster>/pgop-v1/`:
//! - `logical/<backup-id>/globals.sql`: `pg_dumpall --globals-only`, SQL;
//! - `logical/<backup-id>/db/<name>.dump`: `pg_dump -Fc -Z0` of one database, `<name>` its
//!   name with every byte outside `[A-Za-z0-9-]` written `_xx` (hex) and `_` as `__`;
//! - `logical/<backup-id>/manifest.json`: the [`LogicalManifest`], written last.
//!
//! Compression: the store gzips every streamed object (`Store::put_stream`), so pg_dump
//! runs with `-Z0` and the data is compressed once (docs/backup.md has the numbers).
//!
//! Restore downloads a dump into a temporary file and verifies its checksums before
//! `pg_restore` sees a byte of it, then restores it in one transaction
//! (`--single-transaction --exit-on-error`): a corrupt object or a failing restore leaves the
//! target database as it was. The target database must exist (restore does not create
//! it); owners and privileges are restored as dumped, so the roles must exist in the target
//! ([`restore_globals`] first).
//!
//! Modules: [`take`] (the dumps into the store), [`restore`] (a database or the globals
//! back into a server), [`retention`]; listing and deleting are here.

mod restore;
mod retention;
mod take;

pub use restore::{GlobalsRestored, LogicalTarget, restore, restore_globals};
pub use retention::{RetentionResult, apply_retention, plan_leftovers, plan_retention};
pub use take::take;

use crate::base::{self, PgTools, Source};
use crate::store::{self, Footer, Store};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The manifest's format version.
pub const LOGICAL_MANIFEST_FORMAT: u32 = 1;
/// The directory of logical backups under the cluster's root.
pub const LOGICAL_DIR: &str = "logical";
/// The manifest's file name inside `logical/<backup-id>/`.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The globals' file name inside `logical/<backup-id>/`.
pub const GLOBALS_FILE: &str = "globals.sql";
/// How old the newest object of an incomplete logical backup (no manifest) must be before
/// [`apply_retention`] deletes it: a logical backup under way is younger.
pub const INCOMPLETE_GRACE: Duration = Duration::from_secs(24 * 3600);
/// pg_dump's own compression: none, the store compresses (see the module documentation).
const PG_DUMP_COMPRESSION: &str = "0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Connect(base::Error),
    #[error("failed to list the databases to dump")]
    ListDatabases(#[source] tokio_postgres::Error),
    #[error("failed to run {program}")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("pg_dumpall --globals-only failed ({status}): {stderr}")]
    DumpGlobals { status: String, stderr: String },
    #[error("pg_dump of database {database:?} failed ({status}): {stderr}")]
    Dump {
        database: String,
        status: String,
        stderr: String,
    },
    #[error("failed to encode the logical backup manifest")]
    Encode(#[source] serde_json::Error),
    #[error("{0:?} is not a logical backup id (YYYYMMDDTHHMMSSZ)")]
    InvalidBackupId(String),
    #[error("logical backup {id} is not in {store} (or has no manifest: incomplete)")]
    UnknownBackup { id: String, store: String },
    #[error("logical backup {id} has no dump of database {database:?}; it has {available:?}")]
    UnknownDatabase {
        id: String,
        database: String,
        available: Vec<String>,
    },
    #[error("failed to write the temporary file {path}")]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{object} does not match the logical backup's manifest: its content's SHA-256 is {actual}, the manifest says {expected}"
    )]
    Mismatch {
        object: String,
        expected: String,
        actual: String,
    },
    #[error(
        "{object} is no longer in the store as written (removed while the backup ran, e.g. by retention of a backup under way for over a day); the backup is not completed"
    )]
    Vanished { object: String },
    #[error(
        "failed to connect to the target server {target} (a pgop cluster refuses connections \
         without TLS: pass its app Secret's ca.crt as --sslrootcert)"
    )]
    TargetConnect {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("failed to use {path} as the authority of the target server's certificate")]
    TargetTls {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to query the target server {target}")]
    TargetQuery {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(
        "pg_restore of {object} into database {database:?} failed ({status}), nothing was restored: {stderr}"
    )]
    Restore {
        object: String,
        database: String,
        status: String,
        stderr: String,
    },
    #[error("psql applying {object} to {target} failed ({status}): {stderr}")]
    RestoreGlobals {
        object: String,
        target: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// One completed logical backup, as its manifest in the store says (written last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogicalManifest {
    /// [`LOGICAL_MANIFEST_FORMAT`].
    pub format: u32,
    /// `YYYYMMDDTHHMMSSZ` of its begin time (UTC), as [`base::backup_id`].
    pub backup_id: String,
    pub cluster: String,
    /// PostgreSQL's `system_identifier` of the backed-up cluster.
    pub system_identifier: String,
    pub server_version_num: i32,
    /// RFC 3339.
    pub begin_time: String,
    /// RFC 3339.
    pub end_time: String,
    /// `pg_dumpall --globals-only` (roles, tablespaces) as SQL.
    pub globals: LogicalObject,
    /// One `pg_dump -Fc` per database, in name order.
    pub databases: Vec<LogicalDatabase>,
}

/// One object of a logical backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogicalObject {
    /// Its key relative to the cluster's directory (`logical/<backup-id>/...`).
    pub object: String,
    /// Size of the content (what pg_dump / pg_dumpall wrote).
    pub size_bytes: u64,
    /// Size in the store (compressed, with the footer).
    pub stored_bytes: u64,
    /// SHA-256 of the content (hex), as the object's footer also says.
    pub sha256: String,
}

/// One database's dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogicalDatabase {
    pub name: String,
    #[serde(flatten)]
    pub dump: LogicalObject,
}

impl LogicalManifest {
    pub fn begin_time(&self) -> Option<jiff::Timestamp> {
        self.begin_time.parse().ok()
    }

    pub fn end_time(&self) -> Option<jiff::Timestamp> {
        self.end_time.parse().ok()
    }

    /// Content bytes of the globals and every dump.
    pub fn size_bytes(&self) -> u64 {
        self.objects().map(|o| o.size_bytes).sum()
    }

    /// Bytes in the store of the globals and every dump (the manifest not counted).
    pub fn stored_bytes(&self) -> u64 {
        self.objects().map(|o| o.stored_bytes).sum()
    }

    /// The dump of `name`.
    pub fn database(&self, name: &str) -> Option<&LogicalDatabase> {
        self.databases.iter().find(|d| d.name == name)
    }

    fn objects(&self) -> impl Iterator<Item = &LogicalObject> {
        std::iter::once(&self.globals).chain(self.databases.iter().map(|d| &d.dump))
    }
}

/// The key of a logical backup's directory, with a trailing `/`.
fn backup_dir(id: &str) -> String {
    format!("{LOGICAL_DIR}/{id}/")
}

/// The key of `database`'s dump in backup `id`.
pub fn dump_key(id: &str, database: &str) -> String {
    format!("{}db/{}.dump", backup_dir(id), encode_name(database))
}

/// A database name as a key segment: `[A-Za-z0-9-]` as is, `_` as `__`, every other byte
/// as `_xx` (lower-case hex). One name, one segment, and two names never share one.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' => out.push(char::from(b)),
            b'_' => out.push_str("__"),
            other => out.push_str(&format!("_{other:02x}")),
        }
    }
    out
}

/// Whether `id` looks like `YYYYMMDDTHHMMSSZ`: ids go into keys, where `..` or `/` would
/// reach other objects.
fn check_id(id: &str) -> Result<(), Error> {
    let b = id.as_bytes();
    let ok = b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit);
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidBackupId(id.to_string()))
    }
}

/// Ids of logical backups: which have a manifest, and the time of their newest object.
async fn scan(store: &Store) -> Result<Vec<(String, bool, jiff::Timestamp)>, Error> {
    let objects = store.list(&format!("{LOGICAL_DIR}/")).await?;
    let mut ids: std::collections::BTreeMap<String, (bool, jiff::Timestamp)> =
        std::collections::BTreeMap::new();
    for object in &objects {
        let Some((id, file)) = object
            .key
            .strip_prefix(LOGICAL_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        let entry = ids
            .entry(id.to_string())
            .or_insert((false, object.last_modified));
        entry.0 |= file == MANIFEST_FILE;
        entry.1 = entry.1.max(object.last_modified);
    }
    Ok(ids
        .into_iter()
        .map(|(id, (complete, newest))| (id, complete, newest))
        .collect())
}

/// Every completed logical backup (manifest read and verified), oldest first.
pub async fn list(store: &Store) -> Result<Vec<LogicalManifest>, Error> {
    let mut out = Vec::new();
    for (id, complete, _) in scan(store).await? {
        if !complete || check_id(&id).is_err() {
            continue;
        }
        if let Some(manifest) = get(store, &id).await? {
            out.push(manifest);
        }
    }
    out.sort_by(|a, b| a.backup_id.cmp(&b.backup_id));
    Ok(out)
}

/// Logical backups without manifest (failed or under way) and the time of their newest
/// object.
pub async fn incomplete(store: &Store) -> Result<Vec<(String, jiff::Timestamp)>, Error> {
    Ok(scan(store)
        .await?
        .into_iter()
        .filter(|(_, complete, _)| !complete)
        .map(|(id, _, newest)| (id, newest))
        .collect())
}

/// The manifest of logical backup `backup_id`; `None` when it has none.
pub async fn get(store: &Store, backup_id: &str) -> Result<Option<LogicalManifest>, Error> {
    check_id(backup_id)?;
    let key = format!("{}{MANIFEST_FILE}", backup_dir(backup_id));
    let Some(bytes) = store.get(&key, false).await? else {
        return Ok(None);
    };
    let manifest: LogicalManifest =
        serde_json::from_slice(&bytes).map_err(|e| store::Error::Corrupt {
            object: store.name(&key),
            reason: format!("not a pgop logical backup manifest: {e}"),
        })?;
    Ok(Some(manifest))
}

/// Deletes logical backup `backup_id`: its manifest first (it is no longer listed, never a
/// manifest without its data), then its objects. Deleting an absent backup is fine.
pub async fn delete(store: &Store, backup_id: &str) -> Result<(), Error> {
    check_id(backup_id)?;
    let dir = backup_dir(backup_id);
    store.delete(&format!("{dir}{MANIFEST_FILE}")).await?;
    for object in store.list(&dir).await? {
        store.delete(&object.key).await?;
    }
    tracing::info!(backup_id, "logical backup deleted");
    Ok(())
}

/// A libpq connection string value, quoted.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(object: &str, size: u64, stored: u64) -> LogicalObject {
        LogicalObject {
            object: object.into(),
            size_bytes: size,
            stored_bytes: stored,
            sha256: "ab".repeat(32),
        }
    }

    fn manifest(id: &str, end: &str) -> LogicalManifest {
        LogicalManifest {
            format: LOGICAL_MANIFEST_FORMAT,
            backup_id: id.into(),
            cluster: "c".into(),
            system_identifier: "7400000000000000001".into(),
            server_version_num: 150010,
            begin_time: end.into(),
            end_time: end.into(),
            globals: object(&format!("logical/{id}/globals.sql"), 10, 100),
            databases: vec![
                LogicalDatabase {
                    name: "app".into(),
                    dump: object(&dump_key(id, "app"), 1000, 300),
                },
                LogicalDatabase {
                    name: "postgres".into(),
                    dump: object(&dump_key(id, "postgres"), 2000, 400),
                },
            ],
        }
    }

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().expect("time")
    }

    #[test]
    fn the_manifest_round_trips_as_camel_case_json_with_flattened_dumps_and_sums_sizes() {
        let m = manifest("20250131T120304Z", "2025-01-31T12:05:00Z");
        let json = serde_json::to_value(&m).expect("encode");
        assert_eq!(json["backupId"], "20250131T120304Z");
        assert_eq!(json["serverVersionNum"], 150010);
        assert_eq!(
            json["globals"]["object"],
            "logical/20250131T120304Z/globals.sql"
        );
        assert_eq!(json["globals"]["storedBytes"], 100);
        let db = &json["databases"][0];
        assert_eq!(db["name"], "app");
        assert_eq!(db["object"], "logical/20250131T120304Z/db/app.dump");
        assert_eq!(db["sizeBytes"], 1000);
        assert!(db.get("dump").is_none(), "flattened: {db}");
        let back: LogicalManifest = serde_json::from_value(json).expect("decode");
        assert_eq!(back, m);
        assert_eq!(m.size_bytes(), 10 + 1000 + 2000);
        assert_eq!(m.stored_bytes(), 100 + 300 + 400);
        assert_eq!(m.end_time(), Some(t("2025-01-31T12:05:00Z")));
        assert_eq!(
            m.database("postgres").map(|d| d.dump.size_bytes),
            Some(2000)
        );
        assert!(m.database("none").is_none());
    }

    #[test]
    fn database_names_become_distinct_safe_key_segments() {
        assert_eq!(encode_name("app"), "app");
        assert_eq!(encode_name("shop-eu"), "shop-eu");
        assert_eq!(encode_name("my_db"), "my__db");
        assert_eq!(encode_name("bäckerei"), "b_c3_a4ckerei");
        assert_eq!(encode_name("a/b c"), "a_2fb_20c");
        assert_eq!(encode_name(".."), "_2e_2e");
        // `_` is escaped too: these two never collide.
        assert_ne!(encode_name("a_2f"), encode_name("a/"));
        assert_eq!(
            dump_key("20250131T120304Z", "x y"),
            "logical/20250131T120304Z/db/x_20y.dump"
        );
    }

    #[test]
    fn only_well_formed_backup_ids_are_accepted() {
        assert!(check_id("20250131T120304Z").is_ok());
        for bad in [
            "",
            "..",
            "2025013T1203045Z",
            "20250131T120304",
            "../../wal/0000",
            "20250131X120304Z",
        ] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn retention_keeps_the_newest_and_recent_ones_and_deletes_older_ones() {
        let now = t("2025-02-10T00:00:00Z");
        let manifests = vec![
            manifest("20250101T000000Z", "2025-01-01T01:00:00Z"),
            manifest("20250120T000000Z", "2025-01-20T01:00:00Z"),
            manifest("20250205T000000Z", "2025-02-05T01:00:00Z"),
            manifest("20250209T000000Z", "2025-02-09T01:00:00Z"),
        ];
        // Ten days: the two January ones go.
        assert_eq!(
            plan_retention(&manifests, now, 10),
            vec!["20250101T000000Z", "20250120T000000Z"]
        );
        // Thirty days: only the first of January is older.
        assert_eq!(
            plan_retention(&manifests, now, 30),
            vec!["20250101T000000Z"]
        );
        // Everything is newer than a year: nothing goes.
        assert!(plan_retention(&manifests, now, 365).is_empty());
        // One day: everything older goes but the newest, even though it is older too.
        let old = &manifests[..2];
        assert_eq!(plan_retention(old, now, 1), vec!["20250101T000000Z"]);
        // Whatever the order of the input.
        let mut reversed = manifests.clone();
        reversed.reverse();
        assert_eq!(
            plan_retention(&reversed, now, 10),
            vec!["20250101T000000Z", "20250120T000000Z"]
        );
        assert!(plan_retention(&[], now, 1).is_empty());
        // An end time that does not parse: kept.
        let mut odd = manifest("20240101T000000Z", "yesterday");
        odd.begin_time = "2024-01-01T00:00:00Z".into();
        assert!(plan_retention(&[odd, manifests[3].clone()], now, 1).is_empty());
    }

    #[test]
    fn leftovers_of_failed_backups_go_after_a_day() {
        let now = t("2025-02-10T00:00:00Z");
        let incomplete = vec![
            ("20250208T000000Z".to_string(), t("2025-02-08T00:10:00Z")),
            ("20250209T230000Z".to_string(), t("2025-02-09T23:30:00Z")),
        ];
        assert_eq!(plan_leftovers(&incomplete, now), vec!["20250208T000000Z"]);
    }
}
