//! Base backups: `pg_basebackup -D - -Ft -X none` streamed, gzip-compressed and checksummed,
//! into `base/<backup-id>/base.tar.gz` (a multipart upload: nothing lands on local disk and
//! memory stays bounded), then the manifest, last: a backup without manifest is incomplete
//! by definition. The WAL it needs (from its begin LSN on) comes from the archive.

use crate::store::{self, Store};
use crate::wal::{self, WalName, segment_of};
use pgop_api::instance_status::parse_lsn;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The manifest's format version.
pub const MANIFEST_FORMAT: u32 = 1;
/// The manifest's file name inside `base/<backup-id>/`.
pub const MANIFEST_FILE: &str = "backup.manifest";
/// The base tar's file name inside `base/<backup-id>/`.
pub const BASE_TAR_FILE: &str = "base.tar.gz";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to connect to PostgreSQL at {socket_dir}:{port}")]
    Connect {
        socket_dir: PathBuf,
        port: u16,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("failed to query PostgreSQL")]
    Query(#[source] tokio_postgres::Error),
    #[error("failed to run pg_basebackup")]
    Spawn(#[source] std::io::Error),
    #[error("pg_basebackup failed ({status}): {stderr}")]
    BaseBackup { status: String, stderr: String },
    #[error("pg_basebackup did not report the {0} of the backup")]
    Lsn(&'static str),
    #[error(
        "WAL file {wal} that the backup needs did not reach the store within {waited:?}: is archiving working?"
    )]
    WalMissing { wal: String, waited: Duration },
    #[error("failed to encode the manifest")]
    Encode(#[source] serde_json::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Wal(#[from] wal::Error),
}

/// PostgreSQL's programs and the OS user they run as (when pgop runs as root).
#[derive(Debug, Clone)]
pub struct PgTools {
    pub bin_dir: PathBuf,
    /// (uid, gid) of PostgreSQL's OS user.
    pub run_as: Option<(u32, u32)>,
}

impl PgTools {
    pub(crate) fn command(&self, program: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.bin_dir.join(program));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd.env("LC_ALL", "C").kill_on_drop(true);
        cmd
    }
}

/// The server a backup is taken from: reached as the superuser over its Unix socket.
#[derive(Debug, Clone)]
pub struct Source {
    pub socket_dir: PathBuf,
    pub port: u16,
}

impl Source {
    pub(crate) async fn connect(&self) -> Result<tokio_postgres::Client, Error> {
        let (client, connection) = tokio_postgres::Config::new()
            .host_path(&self.socket_dir)
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .application_name("pgop-backup")
            .connect_timeout(Duration::from_secs(5))
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|source| Error::Connect {
                socket_dir: self.socket_dir.clone(),
                port: self.port,
                source,
            })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

/// One completed base backup, as its manifest in the store says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// `YYYYMMDDTHHMMSSZ` of its begin time (UTC).
    pub backup_id: String,
    pub cluster: String,
    /// PostgreSQL's `system_identifier` of the backed-up cluster.
    pub system_identifier: String,
    /// Timeline the backup began on.
    pub timeline: u32,
    pub begin_lsn: String,
    pub end_lsn: String,
    /// The first WAL file needed to restore it.
    pub begin_wal: String,
    /// The last WAL file needed to reach consistency.
    pub end_wal: String,
    /// RFC 3339.
    pub begin_time: String,
    /// RFC 3339; the earliest point in time it can be restored to.
    pub end_time: String,
    /// Size of the tar (uncompressed).
    pub size_bytes: u64,
    /// Size in the store (compressed, with footers).
    pub stored_bytes: u64,
    pub postgres_version_num: i32,
    /// Whether it was taken from a standby.
    pub from_standby: bool,
    pub files: Vec<ManifestFile>,
}

/// One object of a backup and its checksums (also in the object's own footer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub name: String,
    pub stored_sha256: String,
    pub content_sha256: String,
    pub content_bytes: u64,
}

impl Manifest {
    pub fn begin_time(&self) -> Option<jiff::Timestamp> {
        self.begin_time.parse().ok()
    }

    pub fn end_time(&self) -> Option<jiff::Timestamp> {
        self.end_time.parse().ok()
    }

    pub fn begin_wal_name(&self) -> Option<WalName> {
        WalName::parse(&self.begin_wal)
    }
}

/// How long [`take`] waits for the WAL a backup needs to be archived.
#[derive(Debug, Clone)]
pub struct TakeOptions {
    pub wait_for_wal: Duration,
}

impl Default for TakeOptions {
    fn default() -> Self {
        Self {
            wait_for_wal: Duration::from_secs(120),
        }
    }
}

/// Takes a base backup of `source` into the store; the manifest is written last. From a
/// standby the WAL it needs reaches the archive through the primary (`archive_timeout`
/// bounds the wait); `options.wait_for_wal` bounds it here.
pub async fn take(
    store: &Store,
    tools: &PgTools,
    source: &Source,
    cluster: &str,
    options: &TakeOptions,
) -> Result<Manifest, Error> {
    let client = source.connect().await?;
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()),
                    current_setting('server_version_num')::int,
                    pg_is_in_recovery(),
                    current_setting('wal_segment_size')::bigint",
            &[],
        )
        .await
        .map_err(Error::Query)?;
    let system_identifier: String = row.try_get(0).map_err(Error::Query)?;
    let version: i32 = row.try_get(1).map_err(Error::Query)?;
    let from_standby: bool = row.try_get(2).map_err(Error::Query)?;
    let segment_size =
        u64::try_from(row.try_get::<_, i64>(3).map_err(Error::Query)?).unwrap_or(16 * 1024 * 1024);
    let begin = jiff::Timestamp::now();
    let backup_id = backup_id(begin);
    let dir = format!("base/{backup_id}");
    tracing::info!(%backup_id, store = ?store, "taking a base backup");

    let mut child = tools
        .command("pg_basebackup")
        .arg("-h")
        .arg(&source.socket_dir)
        .arg("-p")
        .arg(source.port.to_string())
        .args(["-U", "postgres", "-D", "-", "-F", "t", "-X", "none"])
        .args(["--checkpoint=fast", "--verbose", "--no-password"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::Spawn)?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Spawn(std::io::Error::other("pg_basebackup has no stdout")))?;
    let mut stderr = child
        .stderr
        .take()
        .ok_or_else(|| Error::Spawn(std::io::Error::other("pg_basebackup has no stderr")))?;
    let stderr_task = tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = (&mut stderr).take(1024 * 1024).read_to_end(&mut text).await;
        String::from_utf8_lossy(&text).into_owned()
    });
    let tar_key = format!("{dir}/{BASE_TAR_FILE}");
    let uploaded = store.put_stream(&tar_key, stdout).await;
    let status = child.wait().await.map_err(Error::Spawn)?;
    let stderr = stderr_task.await.unwrap_or_default();
    if !status.success() {
        store.delete(&tar_key).await.ok();
        return Err(Error::BaseBackup {
            status: status.to_string(),
            stderr: stderr.trim().to_string(),
        });
    }
    let (footer, stored_bytes) = uploaded?;
    let (begin_lsn, timeline) = parse_start(&stderr).ok_or(Error::Lsn("start point"))?;
    let end_lsn = parse_end(&stderr).ok_or(Error::Lsn("end point"))?;
    let begin_pos = parse_lsn(&begin_lsn).ok_or(Error::Lsn("start point"))?;
    let end_pos = parse_lsn(&end_lsn).ok_or(Error::Lsn("end point"))?;
    let begin_wal = segment_of(timeline, begin_pos, segment_size);
    let end_wal = segment_of(
        timeline,
        end_pos.saturating_sub(1).max(begin_pos),
        segment_size,
    );

    // The backup is only restorable with its WAL: wait for the last file it needs.
    let started = std::time::Instant::now();
    loop {
        if wal::exists(store, &end_wal).await? {
            break;
        }
        if started.elapsed() >= options.wait_for_wal {
            return Err(Error::WalMissing {
                wal: end_wal.name,
                waited: options.wait_for_wal,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let end = jiff::Timestamp::now();
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        backup_id: backup_id.clone(),
        cluster: cluster.to_string(),
        system_identifier,
        timeline,
        begin_lsn,
        end_lsn,
        begin_wal: begin_wal.name,
        end_wal: end_wal.name,
        begin_time: begin.to_string(),
        end_time: end.to_string(),
        size_bytes: footer.content_len,
        stored_bytes,
        postgres_version_num: version,
        from_standby,
        files: vec![ManifestFile {
            name: BASE_TAR_FILE.into(),
            stored_sha256: footer.stored_sha256,
            content_sha256: footer.content_sha256,
            content_bytes: footer.content_len,
        }],
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(Error::Encode)?;
    store
        .put(&format!("{dir}/{MANIFEST_FILE}"), json.into(), false)
        .await?;
    tracing::info!(%backup_id, size = manifest.size_bytes, stored = manifest.stored_bytes, begin_lsn = %manifest.begin_lsn, end_lsn = %manifest.end_lsn, "base backup completed");
    Ok(manifest)
}

/// `YYYYMMDDTHHMMSSZ` (UTC): sorts by time.
pub fn backup_id(at: jiff::Timestamp) -> String {
    at.strftime("%Y%m%dT%H%M%SZ").to_string()
}

/// `pg_basebackup: write-ahead log start point: 0/2000028 on timeline 1`
fn parse_start(stderr: &str) -> Option<(String, u32)> {
    stderr.lines().find_map(|line| {
        let rest = line.split("write-ahead log start point: ").nth(1)?;
        let (lsn, tli) = rest.split_once(" on timeline ")?;
        Some((lsn.trim().to_string(), tli.trim().parse().ok()?))
    })
}

/// `pg_basebackup: write-ahead log end point: 0/2000100`
fn parse_end(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|line| {
        let rest = line.split("write-ahead log end point: ").nth(1)?;
        Some(rest.trim().to_string())
    })
}

/// Every completed backup (manifest read and verified), oldest first, and the ids of
/// incomplete ones (objects without manifest) with the time of their newest object.
pub async fn list(store: &Store) -> Result<(Vec<Manifest>, Vec<(String, jiff::Timestamp)>), Error> {
    let objects = store.list("base/").await?;
    let mut ids: std::collections::BTreeMap<String, (bool, jiff::Timestamp)> =
        std::collections::BTreeMap::new();
    for object in &objects {
        let Some((id, file)) = object
            .key
            .strip_prefix("base/")
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
    let mut complete = Vec::new();
    let mut incomplete = Vec::new();
    for (id, (has_manifest, newest)) in ids {
        if !has_manifest {
            incomplete.push((id, newest));
            continue;
        }
        let key = format!("base/{id}/{MANIFEST_FILE}");
        let Some(bytes) = store.get(&key, false).await? else {
            incomplete.push((id, newest));
            continue;
        };
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| store::Error::Corrupt {
                object: store.name(&key),
                reason: format!("not a pgop backup manifest: {e}"),
            })?;
        complete.push(manifest);
    }
    complete.sort_by(|a, b| a.backup_id.cmp(&b.backup_id));
    Ok((complete, incomplete))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_basebackup_progress_lines_give_the_lsns() {
        let stderr = "pg_basebackup: initiating base backup, waiting for checkpoint to complete\n\
            pg_basebackup: checkpoint completed\n\
            pg_basebackup: write-ahead log start point: 0/2000028 on timeline 1\n\
            pg_basebackup: write-ahead log end point: 0/2000100\n\
            pg_basebackup: base backup completed\n";
        assert_eq!(parse_start(stderr), Some(("0/2000028".into(), 1)));
        assert_eq!(parse_end(stderr), Some("0/2000100".into()));
        let at: jiff::Timestamp = "2025-01-31T12:03:04Z".parse().expect("time");
        assert_eq!(backup_id(at), "20250131T120304Z");
    }
}
