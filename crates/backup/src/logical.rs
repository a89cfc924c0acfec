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
    #[error("failed to connect to the target server {target}")]
    TargetConnect {
        target: String,
        #[source]
        source: tokio_postgres::Error,
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

/// A libpq connection string value, quoted.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn source_conninfo(source: &Source, database: &str) -> String {
    format!(
        "host={} port={} user=postgres dbname={} application_name=pgop-logical-backup",
        conninfo_value(&source.socket_dir.display().to_string()),
        source.port,
        conninfo_value(database)
    )
}

/// What a dump is of, for its error.
enum Dumped<'a> {
    Globals,
    Database(&'a str),
}

/// Runs a dump program and streams its stdout into `key`; a nonzero exit fails with its
/// stderr and removes the object.
async fn dump_into(
    store: &Store,
    mut cmd: tokio::process::Command,
    program: &'static str,
    key: &str,
    what: Dumped<'_>,
) -> Result<LogicalObject, Error> {
    let spawn = |source| Error::Spawn { program, source };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| spawn(std::io::Error::other("no stdout")))?;
    let stderr_task = child.stderr.take().map(|mut stderr| {
        tokio::spawn(async move {
            let mut text = Vec::new();
            let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut text).await;
            // Drain the rest so that the program never blocks on a full pipe.
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
            String::from_utf8_lossy(&text).trim().to_string()
        })
    });
    // On a store error the reader is dropped: the program gets EPIPE and exits.
    let uploaded = store.put_stream(key, stdout).await;
    let status = child.wait().await.map_err(spawn)?;
    let stderr = match stderr_task {
        Some(task) => task.await.unwrap_or_default(),
        None => String::new(),
    };
    if !status.success() {
        store.delete(key).await.ok();
        let status = status.to_string();
        return Err(match what {
            Dumped::Globals => Error::DumpGlobals { status, stderr },
            Dumped::Database(database) => Error::Dump {
                database: database.to_string(),
                status,
                stderr,
            },
        });
    }
    let (footer, stored_bytes) = uploaded?;
    Ok(object_of(key, &footer, stored_bytes))
}

fn object_of(key: &str, footer: &Footer, stored_bytes: u64) -> LogicalObject {
    LogicalObject {
        object: key.to_string(),
        size_bytes: footer.content_len,
        stored_bytes,
        sha256: footer.content_sha256.clone(),
    }
}

/// Takes a logical backup of every database of `source` that allows connections and is
/// not a template (`postgres` included), and of its globals; the manifest is written last.
/// Each database is dumped in its own snapshot, one after the other. On any error what was
/// written is removed again (best effort: a leftover has no manifest and is never listed).
pub async fn take(
    store: &Store,
    tools: &PgTools,
    source: &Source,
    cluster: &str,
) -> Result<LogicalManifest, Error> {
    let client = source.connect().await.map_err(Error::Connect)?;
    let row = client
        .query_one(
            "SELECT (SELECT system_identifier::text FROM pg_control_system()),
                    current_setting('server_version_num')::int",
            &[],
        )
        .await
        .map_err(Error::ListDatabases)?;
    let system_identifier: String = row.try_get(0).map_err(Error::ListDatabases)?;
    let server_version_num: i32 = row.try_get(1).map_err(Error::ListDatabases)?;
    let databases: Vec<String> = client
        .query(
            "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate
             ORDER BY datname",
            &[],
        )
        .await
        .map_err(Error::ListDatabases)?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(Error::ListDatabases)?;
    drop(client);

    // One backup per second: a second backup within the same second waits for the next.
    let mut begin = jiff::Timestamp::now();
    for _ in 0..3 {
        let id = base::backup_id(begin);
        let manifest_key = format!("{}{MANIFEST_FILE}", backup_dir(&id));
        if store.footer(&manifest_key).await?.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        begin = jiff::Timestamp::now();
    }
    let backup_id = base::backup_id(begin);
    let dir = backup_dir(&backup_id);
    tracing::info!(%backup_id, store = ?store, databases = ?databases, "taking a logical backup");
    let result = dump_all(store, tools, source, &backup_id, &databases).await;
    let (globals, dumps) = match result {
        Ok(done) => done,
        Err(err) => {
            remove_objects(store, &dir).await;
            return Err(err);
        }
    };
    // Every object is still there as written before the manifest says so: a backup under
    // way for longer than INCOMPLETE_GRACE looks like a leftover to retention.
    for object in std::iter::once(&globals).chain(dumps.iter().map(|d| &d.dump)) {
        let intact = match store.footer(&object.object).await {
            Ok(found) => found.is_some_and(|f| f.content_sha256 == object.sha256),
            Err(err) => {
                remove_objects(store, &dir).await;
                return Err(err.into());
            }
        };
        if !intact {
            remove_objects(store, &dir).await;
            return Err(Error::Vanished {
                object: store.name(&object.object),
            });
        }
    }
    let end = jiff::Timestamp::now();
    let manifest = LogicalManifest {
        format: LOGICAL_MANIFEST_FORMAT,
        backup_id: backup_id.clone(),
        cluster: cluster.to_string(),
        system_identifier,
        server_version_num,
        begin_time: begin.to_string(),
        end_time: end.to_string(),
        globals,
        databases: dumps,
    };
    let json = serde_json::to_vec_pretty(&manifest).map_err(Error::Encode)?;
    if let Err(err) = store
        .put(&format!("{dir}{MANIFEST_FILE}"), json.into(), false)
        .await
    {
        remove_objects(store, &dir).await;
        return Err(err.into());
    }
    tracing::info!(%backup_id, size = manifest.size_bytes(), stored = manifest.stored_bytes(), "logical backup completed");
    Ok(manifest)
}

async fn dump_all(
    store: &Store,
    tools: &PgTools,
    source: &Source,
    id: &str,
    databases: &[String],
) -> Result<(LogicalObject, Vec<LogicalDatabase>), Error> {
    let dir = backup_dir(id);
    let mut cmd = tools.command("pg_dumpall");
    cmd.arg("--globals-only")
        .arg("--no-password")
        .arg(format!("--dbname={}", source_conninfo(source, "postgres")));
    let globals = dump_into(
        store,
        cmd,
        "pg_dumpall",
        &format!("{dir}{GLOBALS_FILE}"),
        Dumped::Globals,
    )
    .await?;
    let mut dumps = Vec::with_capacity(databases.len());
    for name in databases {
        let mut cmd = tools.command("pg_dump");
        cmd.arg("--format=custom")
            .arg(format!("--compress={PG_DUMP_COMPRESSION}"))
            .arg("--no-password")
            .arg(format!("--dbname={}", source_conninfo(source, name)));
        let key = dump_key(id, name);
        let started = std::time::Instant::now();
        let dump = dump_into(store, cmd, "pg_dump", &key, Dumped::Database(name)).await?;
        tracing::info!(database = %name, size = dump.size_bytes, stored = dump.stored_bytes, elapsed = ?started.elapsed(), "database dumped");
        dumps.push(LogicalDatabase {
            name: name.clone(),
            dump,
        });
    }
    Ok((globals, dumps))
}

/// Deletes every object under `dir`, best effort.
async fn remove_objects(store: &Store, dir: &str) {
    match store.list(dir).await {
        Ok(objects) => {
            for object in objects {
                if let Err(err) = store.delete(&object.key).await {
                    tracing::warn!(error = %err, "failed to remove a leftover of a failed logical backup");
                }
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "failed to list the leftovers of a failed logical backup")
        }
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

/// Where and as whom [`restore`] and [`restore_globals`] connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalTarget {
    /// A host name, an IP address, or a Unix socket directory (starts with `/`).
    pub host: String,
    pub port: u16,
    pub user: String,
    /// Passed to the programs as `PGPASSWORD`, never on a command line.
    pub password: Option<String>,
    /// The database to restore into (it must exist); the database [`restore_globals`]
    /// connects to.
    pub dbname: String,
}

impl LogicalTarget {
    fn conninfo(&self) -> String {
        format!(
            "host={} port={} user={} dbname={} application_name=pgop-logical-restore",
            conninfo_value(&self.host),
            self.port,
            conninfo_value(&self.user),
            conninfo_value(&self.dbname)
        )
    }

    /// How the target is named in messages (no password).
    fn describe(&self) -> String {
        format!(
            "{}:{} as {} (database {:?})",
            self.host, self.port, self.user, self.dbname
        )
    }

    fn command(&self, tools: &PgTools, program: &str) -> tokio::process::Command {
        let mut cmd = tools.command(program);
        // Only what this target says: nothing from the caller's environment.
        for var in ["PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGOPTIONS"] {
            cmd.env_remove(var);
        }
        if let Some(password) = &self.password {
            cmd.env("PGPASSWORD", password);
        }
        cmd
    }

    async fn connect(&self) -> Result<tokio_postgres::Client, Error> {
        let mut config = tokio_postgres::Config::new();
        if self.host.starts_with('/') {
            config.host_path(&self.host);
        } else {
            config.host(&self.host);
        }
        config
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name("pgop-logical-restore")
            .connect_timeout(Duration::from_secs(10));
        if let Some(password) = &self.password {
            config.password(password);
        }
        let (client, connection) =
            config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|source| Error::TargetConnect {
                    target: self.describe(),
                    source,
                })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

/// A temporary file under the scratch directory, removed on drop.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn create(scratch: &Path, id: &str, name: &str) -> Result<(Self, std::fs::File), Error> {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = scratch.join(format!(
            ".pgop-logical-{id}-{}-{}-{n}.tmp",
            encode_name(name),
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Error::Scratch {
                path: path.clone(),
                source,
            })?;
        Ok((Self(path), file))
    }

    fn open(&self) -> Result<std::fs::File, Error> {
        std::fs::File::open(&self.0).map_err(|source| Error::Scratch {
            path: self.0.clone(),
            source,
        })
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Downloads `object` into a new file under `scratch` and verifies it (the store's footer
/// and the manifest's SHA-256) before anything reads it.
async fn download(
    store: &Store,
    id: &str,
    name: &str,
    object: &LogicalObject,
    scratch: &Path,
) -> Result<ScratchFile, Error> {
    let (temp, file) = ScratchFile::create(scratch, id, name)?;
    let sink = std::io::BufWriter::with_capacity(1024 * 1024, file);
    let (footer, sink) = store.get_stream(&object.object, sink).await?;
    let scratch_error = |source| Error::Scratch {
        path: temp.0.clone(),
        source,
    };
    sink.into_inner()
        .map_err(|e| scratch_error(e.into_error()))?
        .sync_all()
        .map_err(scratch_error)?;
    if footer.content_sha256 != object.sha256 {
        return Err(Error::Mismatch {
            object: store.name(&object.object),
            expected: object.sha256.clone(),
            actual: footer.content_sha256,
        });
    }
    Ok(temp)
}

/// Runs a program with `input` as its stdin; its stderr (the start of it) on failure.
async fn run_with_input(
    mut cmd: tokio::process::Command,
    program: &'static str,
    input: std::fs::File,
) -> Result<Result<(), (String, String)>, Error> {
    let output = cmd
        .stdin(Stdio::from(input))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .map_err(|source| Error::Spawn { program, source })?;
    if output.status.success() {
        return Ok(Ok(()));
    }
    let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if stderr.len() > 16 * 1024 {
        let mut cut = 16 * 1024;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        stderr.push_str(" ...");
    }
    Ok(Err((output.status.to_string(), stderr)))
}

fn find_backup(
    manifest: Option<LogicalManifest>,
    store: &Store,
    backup_id: &str,
) -> Result<LogicalManifest, Error> {
    manifest.ok_or_else(|| Error::UnknownBackup {
        id: backup_id.to_string(),
        store: format!("{store:?}"),
    })
}

/// Restores the dump of `database` from logical backup `backup_id` into the existing
/// database `target.dbname`: the dump is downloaded into a temporary file under `scratch`
/// (removed afterwards) and verified first, then `pg_restore --single-transaction
/// --exit-on-error` applies it, all or nothing. Owners and privileges are restored as
/// dumped: the roles must exist (see [`restore_globals`]), and `target.user` must be
/// allowed to create objects owned by them (a superuser). Returns the dump's size.
pub async fn restore(
    store: &Store,
    tools: &PgTools,
    backup_id: &str,
    database: &str,
    target: &LogicalTarget,
    scratch: &Path,
) -> Result<u64, Error> {
    let manifest = find_backup(get(store, backup_id).await?, store, backup_id)?;
    let Some(entry) = manifest.database(database) else {
        return Err(Error::UnknownDatabase {
            id: backup_id.to_string(),
            database: database.to_string(),
            available: manifest.databases.iter().map(|d| d.name.clone()).collect(),
        });
    };
    let object = store.name(&entry.dump.object);
    tracing::info!(backup_id, database, target = %target.describe(), "restoring a logical backup");
    let temp = download(store, backup_id, database, &entry.dump, scratch).await?;
    let mut cmd = target.command(tools, "pg_restore");
    cmd.args([
        "--format=custom",
        "--single-transaction",
        "--exit-on-error",
        "--no-password",
    ])
    .arg(format!("--dbname={}", target.conninfo()));
    // The verified file as pg_restore's stdin: PostgreSQL's OS user needs no access to
    // the scratch directory.
    let result = run_with_input(cmd, "pg_restore", temp.open()?).await?;
    drop(temp);
    match result {
        Ok(()) => {
            tracing::info!(
                backup_id,
                database,
                size = entry.dump.size_bytes,
                "logical backup restored"
            );
            Ok(entry.dump.size_bytes)
        }
        Err((status, stderr)) => Err(Error::Restore {
            object,
            database: target.dbname.clone(),
            status,
            stderr,
        }),
    }
}

/// What [`restore_globals`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalsRestored {
    /// Roles of the backup that the target did not have: created, with their attributes,
    /// passwords, settings and comments as dumped.
    pub created_roles: Vec<String>,
    /// Roles the target already had: left as they are (never altered).
    pub existing_roles: Vec<String>,
    /// Tablespaces the target already had: left as they are.
    pub existing_tablespaces: Vec<String>,
}

/// Applies the globals (`pg_dumpall --globals-only`) of logical backup `backup_id` to the
/// target server with `psql -v ON_ERROR_STOP=1`, connected to `target.dbname`, after
/// downloading and verifying them into a temporary file under `scratch` like [`restore`].
/// Roles and tablespaces the target already has are left alone: their `CREATE`, `ALTER`
/// and `COMMENT` statements are skipped (the target's own superuser and replication roles
/// keep their passwords); the rest (new roles, role memberships, new tablespaces, whose
/// directories must exist on the target) is applied. Not one transaction: `CREATE
/// TABLESPACE` cannot run in one; a failure stops at the failing statement.
pub async fn restore_globals(
    store: &Store,
    tools: &PgTools,
    backup_id: &str,
    target: &LogicalTarget,
    scratch: &Path,
) -> Result<GlobalsRestored, Error> {
    let manifest = find_backup(get(store, backup_id).await?, store, backup_id)?;
    let object = store.name(&manifest.globals.object);
    let temp = download(store, backup_id, "globals", &manifest.globals, scratch).await?;
    let sql = std::fs::read(&temp.0).map_err(|source| Error::Scratch {
        path: temp.0.clone(),
        source,
    })?;
    drop(temp);
    let sql = String::from_utf8_lossy(&sql);

    let client = target.connect().await?;
    let query = |source| Error::TargetQuery {
        target: target.describe(),
        source,
    };
    let names = |rows: Vec<tokio_postgres::Row>| -> Result<Vec<String>, Error> {
        rows.iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<_, _>>()
            .map_err(query)
    };
    let roles = names(
        client
            .query("SELECT rolname::text FROM pg_roles", &[])
            .await
            .map_err(query)?,
    )?;
    let tablespaces = names(
        client
            .query("SELECT spcname::text FROM pg_tablespace", &[])
            .await
            .map_err(query)?,
    )?;
    drop(client);
    let filtered = filter_globals(&sql, &roles, &tablespaces);

    let (temp, mut file) = ScratchFile::create(scratch, backup_id, "globals-filtered")?;
    file.write_all(filtered.sql.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::Scratch {
            path: temp.0.clone(),
            source,
        })?;
    drop(file);
    let mut cmd = target.command(tools, "psql");
    cmd.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "--no-password"])
        .arg(format!("--dbname={}", target.conninfo()));
    let result = run_with_input(cmd, "psql", temp.open()?).await?;
    drop(temp);
    if let Err((status, stderr)) = result {
        return Err(Error::RestoreGlobals {
            object,
            target: target.describe(),
            status,
            stderr,
        });
    }
    tracing::info!(backup_id, created = ?filtered.restored.created_roles, "logical backup globals restored");
    Ok(filtered.restored)
}

/// The globals' SQL without the statements about roles and tablespaces that exist.
struct FilteredGlobals {
    sql: String,
    restored: GlobalsRestored,
}

/// The identifier at the start of `s` (quoted or not), unquoted.
fn leading_ident(s: &str) -> Option<String> {
    if let Some(rest) = s.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    out.push('"');
                } else {
                    return Some(out);
                }
            } else {
                out.push(c);
            }
        }
        None
    } else {
        let end = s
            .find(|c: char| c.is_whitespace() || c == ';')
            .unwrap_or(s.len());
        (end > 0).then(|| s[..end].to_string())
    }
}

fn filter_globals(sql: &str, roles: &[String], tablespaces: &[String]) -> FilteredGlobals {
    let mut out = String::with_capacity(sql.len());
    let mut restored = GlobalsRestored::default();
    for line in sql.split_inclusive('\n') {
        let role = ["CREATE ROLE ", "ALTER ROLE ", "COMMENT ON ROLE "]
            .iter()
            .find_map(|p| line.strip_prefix(p))
            .and_then(leading_ident);
        let tablespace = [
            "CREATE TABLESPACE ",
            "ALTER TABLESPACE ",
            "COMMENT ON TABLESPACE ",
        ]
        .iter()
        .find_map(|p| line.strip_prefix(p))
        .and_then(leading_ident);
        if let Some(role) = role {
            let created = line.starts_with("CREATE ROLE ");
            if roles.contains(&role) {
                if created {
                    restored.existing_roles.push(role);
                }
                continue;
            }
            if created {
                restored.created_roles.push(role);
            }
        } else if let Some(tablespace) = tablespace
            && tablespaces.contains(&tablespace)
        {
            if line.starts_with("CREATE TABLESPACE ") {
                restored.existing_tablespaces.push(tablespace);
            }
            continue;
        }
        out.push_str(line);
    }
    FilteredGlobals { sql: out, restored }
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

/// The logical backups to delete, oldest first: those whose end time is more than
/// `retention_days` before `now`, never the newest completed one (by end time). A manifest
/// whose end time does not parse is kept. Pure.
pub fn plan_retention(
    manifests: &[LogicalManifest],
    now: jiff::Timestamp,
    retention_days: u32,
) -> Vec<String> {
    let window = jiff::SignedDuration::from_hours(24 * i64::from(retention_days));
    let cutoff = now.checked_sub(window).unwrap_or(jiff::Timestamp::MIN);
    let mut sorted: Vec<&LogicalManifest> = manifests.iter().collect();
    sorted.sort_by(|a, b| {
        a.end_time()
            .cmp(&b.end_time())
            .then(a.backup_id.cmp(&b.backup_id))
    });
    let newest = sorted.last().map(|m| m.backup_id.clone());
    sorted
        .iter()
        .filter(|m| Some(&m.backup_id) != newest.as_ref())
        .filter(|m| m.end_time().is_some_and(|end| end < cutoff))
        .map(|m| m.backup_id.clone())
        .collect()
}

/// Incomplete logical backups (no manifest) whose newest object is older than
/// [`INCOMPLETE_GRACE`]: leftovers of failed backups. Pure.
pub fn plan_leftovers(
    incomplete: &[(String, jiff::Timestamp)],
    now: jiff::Timestamp,
) -> Vec<String> {
    let grace = jiff::SignedDuration::try_from(INCOMPLETE_GRACE).unwrap_or_default();
    let cutoff = now.checked_sub(grace).unwrap_or(jiff::Timestamp::MIN);
    incomplete
        .iter()
        .filter(|(_, newest)| *newest < cutoff)
        .map(|(id, _)| id.clone())
        .collect()
}

/// What [`apply_retention`] did (or would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionResult {
    pub kept: Vec<String>,
    pub deleted: Vec<String>,
    /// Incomplete backups (no manifest) older than [`INCOMPLETE_GRACE`].
    pub deleted_incomplete: Vec<String>,
}

/// Applies [`plan_retention`] and [`plan_leftovers`] to the store (nothing is deleted when
/// `dry_run`).
pub async fn apply_retention(
    store: &Store,
    now: jiff::Timestamp,
    retention_days: u32,
    dry_run: bool,
) -> Result<RetentionResult, Error> {
    let manifests = list(store).await?;
    let deleted = plan_retention(&manifests, now, retention_days);
    let leftovers = incomplete(store).await?;
    let deleted_incomplete: Vec<String> = plan_leftovers(&leftovers, now)
        .into_iter()
        .filter(|id| check_id(id).is_ok())
        .collect();
    let kept = manifests
        .iter()
        .map(|m| m.backup_id.clone())
        .filter(|id| !deleted.contains(id))
        .collect();
    if !dry_run {
        for id in deleted.iter().chain(&deleted_incomplete) {
            delete(store, id).await?;
        }
    }
    Ok(RetentionResult {
        kept,
        deleted,
        deleted_incomplete,
    })
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

    #[test]
    fn globals_of_existing_roles_and_tablespaces_are_skipped() {
        let sql = "--\n-- Roles\n--\n\nCREATE ROLE app;\nALTER ROLE app WITH NOSUPERUSER LOGIN PASSWORD 'x';\nCREATE ROLE \"Report \"\"Reader\"\"\";\nALTER ROLE \"Report \"\"Reader\"\"\" WITH LOGIN;\nCOMMENT ON ROLE \"Report \"\"Reader\"\"\" IS 'r';\nCREATE ROLE postgres;\nALTER ROLE postgres WITH SUPERUSER PASSWORD 'secret';\nGRANT app TO \"Report \"\"Reader\"\"\" GRANTED BY postgres;\nCREATE TABLESPACE fast OWNER postgres LOCATION '/fast';\nCREATE TABLESPACE slow OWNER postgres LOCATION '/slow';\n";
        let out = filter_globals(
            sql,
            &["postgres".into(), "app".into()],
            &["pg_default".into(), "fast".into()],
        );
        assert_eq!(out.restored.created_roles, vec!["Report \"Reader\""]);
        assert_eq!(out.restored.existing_roles, vec!["app", "postgres"]);
        assert_eq!(out.restored.existing_tablespaces, vec!["fast"]);
        assert!(!out.sql.contains("PASSWORD 'secret'"), "{}", out.sql);
        assert!(!out.sql.contains("CREATE ROLE app;"), "{}", out.sql);
        assert!(out.sql.contains("CREATE ROLE \"Report \"\"Reader\"\"\";\n"));
        assert!(out.sql.contains("COMMENT ON ROLE \"Report"));
        assert!(out.sql.contains("GRANT app TO"));
        assert!(!out.sql.contains("/fast"));
        assert!(out.sql.contains("LOCATION '/slow'"));
    }
}
