//! Restore: a base backup fetched, verified and unpacked into an empty data directory,
//! then PostgreSQL run in archive recovery (`restore_command = pgop instance wal-restore`)
//! to the end of the archived WAL or to a target time / LSN, promoted, checkpointed and
//! stopped cleanly. The result is a data directory ready to start as a primary on a new
//! timeline, or an error: a target that cannot be reached, a missing or corrupt object,
//! a store that does not answer. Never a half-recovered primary: on any error the data
//! directory is emptied again.

use crate::base::{self, BASE_TAR_FILE, Manifest, PgTools};
use crate::config::StoreConfig;
use crate::store::{self, Store};
use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the recovery target {0:?} is no RFC 3339 time or LSN")]
    InvalidTarget(String),
    #[error("no completed backup in {store}{}", .target.as_deref().map(|t| format!(" that ends before the target {t}")).unwrap_or_default())]
    NoBackup {
        store: String,
        target: Option<String>,
    },
    #[error("backup {id} is not in {store} (or has no manifest: incomplete)")]
    UnknownBackup { id: String, store: String },
    #[error("the data directory {0} is not empty")]
    NotEmpty(PathBuf),
    #[error("failed to prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to unpack the base backup")]
    Unpack(#[source] std::io::Error),
    #[error("the backup store configuration for restore_command")]
    Config(#[source] crate::config::Error),
    #[error("failed to start PostgreSQL for recovery")]
    Start(#[source] std::io::Error),
    #[error("recovery failed: PostgreSQL exited ({status}); its last lines:\n{log}")]
    RecoveryFailed { status: String, log: String },
    #[error("recovery did not finish within {timeout:?}; PostgreSQL's last lines:\n{log}")]
    Timeout { timeout: Duration, log: String },
    #[error("failed to query the recovered server")]
    Query(#[source] tokio_postgres::Error),
    #[error(transparent)]
    Base(#[from] base::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// Where recovery stops.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Target {
    /// The end of the archived WAL.
    #[default]
    EndOfWal,
    /// `recovery_target_time`, RFC 3339 with a time zone.
    Time(String),
    /// `recovery_target_lsn`, e.g. `0/3000060`.
    Lsn(String),
    /// `recovery_target = 'immediate'`: the backup's consistent end, no further WAL (the
    /// restore check).
    Immediate,
}

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// A backup id; else the latest completed backup that ends before the target.
    pub backup_id: Option<String>,
    pub target: Target,
    /// The `pgop` binary `restore_command` runs (`pgop instance wal-restore`).
    pub pgop_binary: PathBuf,
    /// Where to write the store configuration `restore_command` reads (mode 0600, owned by
    /// PostgreSQL's OS user); outside the data directory, removed afterwards.
    pub store_config_file: PathBuf,
    /// How long recovery may take.
    pub timeout: Duration,
    /// Where the recovering server's Unix socket goes (it listens on nothing else); the
    /// data directory when unset. A socket path is limited to 107 bytes, which a deep data
    /// directory can exceed.
    pub socket_dir: Option<PathBuf>,
}

/// What a restore produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub backup: Manifest,
    /// The new timeline after promotion.
    pub timeline: i64,
    /// `pg_current_wal_lsn()` after promotion.
    pub lsn: String,
}

/// Restores into `pgdata` (absent or empty). See the module documentation.
impl Target {
    /// The API checks the target; it is checked again before it reaches a configuration
    /// file: a time must be RFC 3339 (and exist), an LSN two hex numbers.
    fn check(&self) -> Result<(), Error> {
        let ok = match self {
            Target::Time(t) => {
                pgop_api::formats::is_timestamp(t) && t.parse::<jiff::Timestamp>().is_ok()
            }
            Target::Lsn(l) => pgop_api::formats::is_lsn(l),
            Target::EndOfWal | Target::Immediate => true,
        };
        match self {
            Target::Time(v) | Target::Lsn(v) if !ok => Err(Error::InvalidTarget(v.clone())),
            _ => Ok(()),
        }
    }
}

/// The timeline recovery follows: the newest timeline in the store whose history descends
/// from the backup's (a failover after it, say), found as PostgreSQL's `latest` finds
/// timelines (history files `N+1`, `N+2`, ... until one is missing), but never one that
/// does not: an in-place major upgrade starts its new cluster (another system) on a new
/// timeline whose history names no parent, and recovery of an older backup cannot follow
/// it. The backup's own timeline when none descends.
async fn target_timeline(store: &Store, backup: &Manifest) -> Result<u32, Error> {
    let mut histories = Vec::new();
    let mut next = backup.timeline.saturating_add(1);
    loop {
        let name = format!("{next:08X}.history");
        let Some(wal) = crate::wal::WalName::parse(&name) else {
            break;
        };
        let Some(content) = store.get(&wal.key(), true).await? else {
            break;
        };
        histories.push((next, String::from_utf8_lossy(&content).into_owned()));
        next = next.saturating_add(1);
    }
    let end = pgop_api::instance_status::parse_lsn(&backup.end_lsn).unwrap_or(0);
    Ok(descendant_timeline(backup.timeline, end, &histories))
}

/// The highest of `histories` (timeline, history file) that branched off `timeline` at or
/// after `lsn` (directly or through others), else `timeline`.
fn descendant_timeline(timeline: u32, lsn: u64, histories: &[(u32, String)]) -> u32 {
    histories
        .iter()
        .filter(|(_, text)| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .filter_map(|l| {
                    let mut fields = l.split_whitespace();
                    let parent = fields.next()?.parse::<u32>().ok()?;
                    let switch = pgop_api::instance_status::parse_lsn(fields.next()?)?;
                    Some((parent, switch))
                })
                .any(|(parent, switch)| parent == timeline && switch >= lsn)
        })
        .map(|(tli, _)| *tli)
        .max()
        .unwrap_or(timeline)
}

pub async fn restore(
    config: &StoreConfig,
    tools: &PgTools,
    pgdata: &Path,
    options: &RestoreOptions,
) -> Result<Restored, Error> {
    options.target.check()?;
    let store = Store::open(config)?;
    let (backups, _) = base::list(&store).await?;
    let backup = choose(&backups, options, &store)?;
    prepare_dir(pgdata, tools.run_as)?;
    let result = recover(config, &store, tools, pgdata, options, &backup).await;
    let _ = std::fs::remove_file(&options.store_config_file);
    match result {
        Ok(restored) => Ok(restored),
        Err(err) => {
            // Never leave a half-recovered data directory behind.
            empty_dir(pgdata);
            Err(err)
        }
    }
}

/// Unpacks the store's newest completed base backup into `pgdata` (absent or empty) for a
/// server that is to run as a standby of the store (a replica cluster that follows its
/// source's store): the files only, owned by PostgreSQL's OS user, no recovery run here
/// and no configuration written (the caller writes its own, with `standby.signal`). On
/// failure `pgdata` is emptied again.
pub async fn unpack_newest(
    config: &StoreConfig,
    tools: &PgTools,
    pgdata: &Path,
) -> Result<Manifest, Error> {
    let store = Store::open(config)?;
    let (backups, _) = base::list(&store).await?;
    // Listed oldest first (as `choose` reads them).
    let backup = backups.last().cloned().ok_or_else(|| Error::NoBackup {
        store: format!("{store:?}"),
        target: None,
    })?;
    prepare_dir(pgdata, tools.run_as)?;
    tracing::info!(backup = %backup.backup_id, "unpacking the store's newest base backup for a standby");
    match unpack_owned(&store, &backup, tools, pgdata).await {
        Ok(()) => Ok(backup),
        Err(err) => {
            empty_dir(pgdata);
            Err(err)
        }
    }
}

fn choose(
    backups: &[Manifest],
    options: &RestoreOptions,
    store: &Store,
) -> Result<Manifest, Error> {
    if let Some(id) = &options.backup_id {
        return backups
            .iter()
            .find(|b| &b.backup_id == id)
            .cloned()
            .ok_or_else(|| Error::UnknownBackup {
                id: id.clone(),
                store: format!("{store:?}"),
            });
    }
    let fits = |b: &Manifest| match &options.target {
        Target::EndOfWal | Target::Immediate => true,
        Target::Time(t) => match (t.parse::<jiff::Timestamp>(), b.end_time()) {
            (Ok(target), Some(end)) => end <= target,
            // A time PostgreSQL reads but jiff does not: PostgreSQL decides.
            _ => true,
        },
        Target::Lsn(l) => match (
            pgop_api::instance_status::parse_lsn(l),
            pgop_api::instance_status::parse_lsn(&b.end_lsn),
        ) {
            (Some(target), Some(end)) => end <= target,
            _ => true,
        },
    };
    backups
        .iter()
        .rev()
        .find(|b| fits(b))
        .cloned()
        .ok_or_else(|| Error::NoBackup {
            store: format!("{store:?}"),
            target: match &options.target {
                Target::EndOfWal | Target::Immediate => None,
                Target::Time(t) | Target::Lsn(t) => Some(t.clone()),
            },
        })
}

fn prepare_dir(pgdata: &Path, run_as: Option<(u32, u32)>) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: pgdata.to_path_buf(),
        source,
    };
    if pgdata.exists() {
        let mut entries = std::fs::read_dir(pgdata).map_err(io)?;
        if entries.next().is_some() {
            return Err(Error::NotEmpty(pgdata.to_path_buf()));
        }
    } else {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(pgdata)
            .map_err(io)?;
    }
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(pgdata, Some(uid), Some(gid)).map_err(io)?;
    }
    Ok(())
}

fn empty_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

async fn recover(
    config: &StoreConfig,
    store: &Store,
    tools: &PgTools,
    pgdata: &Path,
    options: &RestoreOptions,
    backup: &Manifest,
) -> Result<Restored, Error> {
    tracing::info!(backup = %backup.backup_id, target = ?options.target, "restoring");
    unpack_owned(store, backup, tools, pgdata).await?;
    config
        .write(&options.store_config_file, tools.run_as)
        .map_err(Error::Config)?;
    let restore_command = format!(
        "{} instance wal-restore --store-config {} %f %p",
        shell_quote(&options.pgop_binary.display().to_string()),
        shell_quote(&options.store_config_file.display().to_string())
    );
    let mut conf =
        String::from("# Written by pgop for a restore; replaced when the instance starts.\n");
    let mut set = |name: &str, value: &str| {
        conf.push_str(&format!(
            "{name} = '{}'\n",
            value.replace('\\', "\\\\").replace('\'', "''")
        ));
    };
    set("listen_addresses", "");
    set("port", "5432");
    let socket_dir = options.socket_dir.as_deref().unwrap_or(pgdata);
    set("unix_socket_directories", &socket_dir.display().to_string());
    // Never archive into the source's store from here.
    set("archive_mode", "off");
    set("hot_standby", "off");
    set("logging_collector", "off");
    set("restore_command", &restore_command);
    // Not `latest`: the newest timeline in the store may be another system's (an in-place
    // major upgrade archives its new cluster's WAL on a new timeline of the same store).
    let timeline = target_timeline(store, backup).await?;
    set("recovery_target_timeline", &timeline.to_string());
    match &options.target {
        Target::EndOfWal => {}
        Target::Time(t) => {
            // PostgreSQL's own spelling: RFC 3339's `T` and `Z` are not read here.
            let t = t
                .parse::<jiff::Timestamp>()
                .map_err(|_| Error::InvalidTarget(t.clone()))?
                .strftime("%Y-%m-%d %H:%M:%S%.6f+00")
                .to_string();
            set("recovery_target_time", &t);
            set("recovery_target_action", "promote");
        }
        Target::Lsn(l) => {
            set("recovery_target_lsn", l);
            set("recovery_target_action", "promote");
        }
        Target::Immediate => {
            set("recovery_target", "immediate");
            set("recovery_target_action", "promote");
        }
    }
    write_owned(
        &pgdata.join("postgresql.conf"),
        conf.as_bytes(),
        tools.run_as,
    )?;
    write_owned(&pgdata.join("recovery.signal"), b"", tools.run_as)?;

    let mut cmd = tools.command("postgres");
    cmd.arg("-D")
        .arg(pgdata)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (mut child, _registration) = crate::process::spawn(&mut cmd).map_err(Error::Start)?;
    let log = std::sync::Arc::new(std::sync::Mutex::new(VecDeque::<String>::new()));
    if let Some(stderr) = child.stderr.take() {
        let log = log.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "postgres", "{line}");
                let mut log = log
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                log.push_back(line);
                if log.len() > 30 {
                    log.pop_front();
                }
            }
        });
    }
    let last_lines = || {
        log.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    };
    let source = base::Source {
        socket_dir: options
            .socket_dir
            .clone()
            .unwrap_or_else(|| pgdata.to_path_buf()),
        port: 5432,
    };
    let deadline = tokio::time::Instant::now() + options.timeout;
    // hot_standby is off: the server accepts connections only once recovery is over.
    let client = loop {
        if let Some(status) = child.try_wait().map_err(Error::Start)? {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Err(Error::RecoveryFailed {
                status: status.to_string(),
                log: last_lines(),
            });
        }
        if let Ok(client) = source.connect().await
            && let Ok(row) = client.query_one("SELECT pg_is_in_recovery()", &[]).await
            && !row.get::<_, bool>(0)
        {
            break client;
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill().await;
            return Err(Error::Timeout {
                timeout: options.timeout,
                log: last_lines(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let row = client
        .query_one(
            "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
                    pg_current_wal_lsn()::text",
            &[],
        )
        .await
        .map_err(Error::Query)?;
    let timeline: i64 = row.try_get(0).map_err(Error::Query)?;
    let lsn: String = row.try_get(1).map_err(Error::Query)?;
    client
        .batch_execute("CHECKPOINT")
        .await
        .map_err(Error::Query)?;
    drop(client);
    // Fast shutdown: SIGINT to the postmaster.
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let stopped = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    if !matches!(stopped, Ok(Ok(status)) if status.success()) {
        let _ = child.kill().await;
        return Err(Error::RecoveryFailed {
            status: "no clean shutdown after promotion".into(),
            log: last_lines(),
        });
    }
    // The restore settings go; the instance manager writes its own configuration.
    write_owned(
        &pgdata.join("postgresql.conf"),
        b"# Restored by pgop; the instance manager writes this file when it starts.\n",
        tools.run_as,
    )?;
    tracing::info!(backup = %backup.backup_id, timeline, %lsn, "restore completed");
    Ok(Restored {
        backup: backup.clone(),
        timeline,
        lsn,
    })
}

/// Fetches, verifies and unpacks the base tar into `pgdata`.
/// [`unpack`], then the files given to PostgreSQL's OS user, and the signal and
/// postmaster files a copy of a running server may hold taken out (the caller writes its
/// own signal file).
async fn unpack_owned(
    store: &Store,
    backup: &Manifest,
    tools: &PgTools,
    pgdata: &Path,
) -> Result<(), Error> {
    unpack(store, backup, pgdata).await?;
    if let Some((uid, gid)) = tools.run_as {
        chown_tree(pgdata, uid, gid).map_err(|source| Error::Io {
            path: pgdata.to_path_buf(),
            source,
        })?;
    }
    for leftover in [
        "standby.signal",
        "recovery.signal",
        "postmaster.pid",
        "postmaster.opts",
    ] {
        let _ = std::fs::remove_file(pgdata.join(leftover));
    }
    Ok(())
}

async fn unpack(store: &Store, backup: &Manifest, pgdata: &Path) -> Result<(), Error> {
    let key = format!("base/{}/{BASE_TAR_FILE}", backup.backup_id);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
    let dir = pgdata.to_path_buf();
    let unpacker = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut archive = tar::Archive::new(VecReader {
            rx,
            current: Vec::new(),
            at: 0,
        });
        archive.set_preserve_permissions(true);
        archive.set_overwrite(true);
        archive.unpack(&dir)
    });
    let fetched = store.get_stream(&key, ChannelWriter { tx }).await;
    // The writer (and its channel) is dropped with the result: the unpacker sees the end.
    let fetched = fetched.map(|(footer, _writer)| footer);
    let unpacked = unpacker
        .await
        .map_err(|e| Error::Unpack(std::io::Error::other(e)))?;
    let footer = fetched?;
    unpacked.map_err(Error::Unpack)?;
    if let Some(file) = backup.files.iter().find(|f| f.name == BASE_TAR_FILE)
        && file.content_sha256 != footer.content_sha256
    {
        return Err(store::Error::Corrupt {
            object: store.name(&key),
            reason: format!(
                "its content's SHA-256 is {}, the manifest says {}",
                footer.content_sha256, file.content_sha256
            ),
        }
        .into());
    }
    Ok(())
}

struct ChannelWriter {
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx.send(buf.to_vec()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "unpacking stopped")
        })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct VecReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
}

impl std::io::Read for VecReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at >= self.current.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.current = chunk;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn write_owned(path: &Path, content: &[u8], run_as: Option<(u32, u32)>) -> Result<(), Error> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(path)?;
        file.write_all(content)?;
        file.sync_all()?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
        }
        Ok(())
    };
    write().map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn chown_tree(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            chown_tree(&path, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

/// `'...'` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn recovery_follows_timelines_that_descend_from_the_backup_only() {
        use super::descendant_timeline as follow;
        // Failovers after the backup (0/3000100 on timeline 1): timeline 3 descends.
        let failovers = [
            (
                2,
                "1\t0/5000000\tno recovery target specified\n".to_string(),
            ),
            (
                3,
                "1\t0/5000000\tno recovery target specified\n2\t0/7000000\tx\n".to_string(),
            ),
        ];
        assert_eq!(follow(1, 0x3000100, &failovers), 3);
        // A branch before the backup's end is not its future.
        let early = [(2, "1\t0/2000000\tx\n".to_string())];
        assert_eq!(follow(1, 0x3000100, &early), 1);
        // An in-place major upgrade's timeline (another system: no parent) is not
        // followed, nor what descends from it.
        let upgraded = [
            (2, "# pgop: PostgreSQL 18 after pg_upgrade\n".to_string()),
            (3, "2\t0/9000000\tfailover\n".to_string()),
        ];
        assert_eq!(follow(1, 0x3000100, &upgraded), 1);
        // A backup of the upgraded cluster follows its later failovers.
        assert_eq!(follow(2, 0x8000000, &upgraded[1..]), 3);
    }

    #[test]
    fn a_target_that_could_change_the_recovery_file_is_refused() {
        for bad in [
            Target::Time("2026-02-30T00:00:00Z".into()),
            Target::Time("2026-01-01T00:00:00Z'\nrestore_command = 'id".into()),
            Target::Time("yesterday".into()),
            Target::Lsn("0/1\nx".into()),
            Target::Lsn("0/1' #".into()),
        ] {
            assert!(
                matches!(bad.check(), Err(Error::InvalidTarget(_))),
                "{bad:?}"
            );
        }
        for good in [
            Target::Time("2026-01-31T12:00:00.5+01:00".into()),
            Target::Lsn("0/3000060".into()),
            Target::EndOfWal,
            Target::Immediate,
        ] {
            assert!(good.check().is_ok(), "{good:?}");
        }
    }

    use super::*;

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
    }
}
