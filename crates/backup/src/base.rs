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
    #[error("pg_basebackup did not report the {0} of the backup: {1}")]
    Lsn(&'static str, String),
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
                    (SELECT setting::bigint FROM pg_settings WHERE name = 'wal_segment_size')",
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

    let mut cmd = tools.command("pg_basebackup");
    cmd.arg("-h")
        .arg(&source.socket_dir)
        .arg("-p")
        .arg(source.port.to_string())
        .args(["-U", "postgres", "-D", "-", "-F", "t", "-X", "none"])
        .args(["--checkpoint=fast", "--verbose", "--no-password"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, _registration) = crate::process::spawn(&mut cmd).map_err(Error::Spawn)?;
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
    let scanned = std::sync::Arc::new(std::sync::Mutex::new(TarScan::default()));
    let reader = ScanningReader {
        inner: stdout,
        scan: scanned.clone(),
    };
    let uploaded = store.put_stream(&tar_key, reader).await;
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
    let scan = std::mem::take(
        &mut *scanned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let missing = |what| Error::Lsn(what, stderr.trim().to_string());
    // backup_label (in the tar): where the backup begins and on which timeline.
    let (begin_lsn, timeline) = scan.begin().ok_or_else(|| missing("start point"))?;
    // backup_manifest's WAL range (injected into the tar since PostgreSQL 15); else the
    // server's position now, a conservative end.
    let end_lsn = match scan.end() {
        Some(end) => end,
        None => {
            let row = client
                .query_one(
                    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                 ELSE pg_current_wal_lsn() END::text",
                    &[],
                )
                .await
                .map_err(Error::Query)?;
            row.try_get(0).map_err(Error::Query)?
        }
    };
    let begin_pos = parse_lsn(&begin_lsn).ok_or_else(|| missing("start point"))?;
    let end_pos = parse_lsn(&end_lsn).ok_or_else(|| missing("end point"))?;
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

/// Watches the tar stream go by and keeps `backup_label` and the tail of
/// `backup_manifest`: where the backup begins and ends.
#[derive(Debug, Default)]
struct TarScan {
    header: Vec<u8>,
    /// Bytes of the current entry's data (then padding) still to come.
    remaining: u64,
    padding: u64,
    capture: Option<Captured>,
    label: Vec<u8>,
    manifest_tail: Vec<u8>,
    done: bool,
}

#[derive(Debug, Clone, Copy)]
enum Captured {
    Label,
    Manifest,
}

/// How much of the manifest's end is kept (its WAL range is at the very end).
const MANIFEST_TAIL: usize = 64 * 1024;

impl TarScan {
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() && !self.done {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining.min(data.len() as u64)).unwrap_or(0);
                match self.capture {
                    Some(Captured::Label) if self.label.len() < 64 * 1024 => {
                        self.label.extend_from_slice(&data[..n])
                    }
                    Some(Captured::Manifest) => {
                        self.manifest_tail.extend_from_slice(&data[..n]);
                        if self.manifest_tail.len() > 2 * MANIFEST_TAIL {
                            let cut = self.manifest_tail.len() - MANIFEST_TAIL;
                            self.manifest_tail.drain(..cut);
                        }
                    }
                    _ => {}
                }
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            if self.padding > 0 {
                let n = usize::try_from(self.padding.min(data.len() as u64)).unwrap_or(0);
                self.padding -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (512 - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() == 512 {
                let header = std::mem::take(&mut self.header);
                self.start_entry(&header);
            }
        }
    }

    fn start_entry(&mut self, header: &[u8]) {
        if header.iter().all(|b| *b == 0) {
            // End-of-archive blocks (or padding): nothing more of interest.
            return;
        }
        let field = |range: std::ops::Range<usize>| {
            let raw = &header[range];
            let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
            String::from_utf8_lossy(&raw[..end]).trim().to_string()
        };
        let name = field(0..100);
        let size = u64::from_str_radix(&field(124..136), 8).unwrap_or(0);
        self.remaining = size;
        self.padding = (512 - size % 512) % 512;
        self.capture = match name.trim_start_matches("./") {
            "backup_label" => Some(Captured::Label),
            "backup_manifest" => Some(Captured::Manifest),
            _ => None,
        };
    }

    /// `START WAL LOCATION: 0/2000028 (file ...)` and `START TIMELINE: 1`.
    fn begin(&self) -> Option<(String, u32)> {
        let label = String::from_utf8_lossy(&self.label);
        let lsn = label.lines().find_map(|l| {
            l.strip_prefix("START WAL LOCATION: ")?
                .split_whitespace()
                .next()
                .map(str::to_string)
        })?;
        let timeline = label
            .lines()
            .find_map(|l| l.strip_prefix("START TIMELINE: ")?.trim().parse().ok())?;
        Some((lsn, timeline))
    }

    /// The last `"End-LSN": "0/2000100"` of the manifest's WAL ranges.
    fn end(&self) -> Option<String> {
        let tail = String::from_utf8_lossy(&self.manifest_tail);
        let at = tail.rfind("\"End-LSN\"")?;
        let rest = &tail[at + "\"End-LSN\"".len()..];
        let start = rest.find('"')? + 1;
        let len = rest[start..].find('"')?;
        Some(rest[start..start + len].to_string())
    }
}

/// An `AsyncRead` that shows every byte to a [`TarScan`] on the way.
struct ScanningReader<R> {
    inner: R,
    scan: std::sync::Arc<std::sync::Mutex<TarScan>>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ScanningReader<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &poll {
            let new = &buf.filled()[before..];
            self.scan
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .feed(new);
        }
        poll
    }
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
    fn the_tar_stream_gives_the_begin_and_end_of_the_backup() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8]| {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o600);
            header.set_cksum();
            tar.append_data(&mut header, name, data).expect("append");
        };
        add("PG_VERSION", b"15\n");
        add(
            "backup_label",
            b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nSTART TIMELINE: 1\n",
        );
        add("base/1/1259", &vec![1u8; 10_000]);
        add(
            "backup_manifest",
            br#"{ "WAL-Ranges": [
{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" }
], "Manifest-Checksum": "x"}"#,
        );
        let bytes = tar.into_inner().expect("tar");
        let mut scan = TarScan::default();
        // In odd-sized pieces, as a pipe delivers them.
        for chunk in bytes.chunks(777) {
            scan.feed(chunk);
        }
        assert_eq!(scan.begin(), Some(("0/2000028".into(), 1)));
        assert_eq!(scan.end(), Some("0/2000100".into()));
        let at: jiff::Timestamp = "2025-01-31T12:03:04Z".parse().expect("time");
        assert_eq!(backup_id(at), "20250131T120304Z");
    }
}
