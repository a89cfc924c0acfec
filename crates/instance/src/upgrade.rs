//! The in-place major upgrade of a data directory with pg_upgrade (PostgreSQL 15 to 18,
//! say), run by the manager of the primary before it starts PostgreSQL. It is resumable:
//! the manager may be killed at any point, and [`upgrade`] (or [`recover`], without an
//! upgrade request) run at its next start converges. It must never start the new cluster
//! before it is in place, and never leave PGDATA unusable by the old major unless the new
//! cluster is complete.
//!
//! On disk, beside PGDATA (on its filesystem, which `--link` needs):
//! - `<pgdata>.upgrade-<new>`: the new cluster while it is made (initdb, pg_upgrade, the
//!   timeline step);
//! - `<pgdata>.upgrade-<new>.done`: written (and fsynced, with its directory) once the new
//!   cluster is complete; from then on the upgrade is finished by the swap, never undone;
//! - `<pgdata>.old-<old>`: the old data directory during the swap, removed at its end
//!   (after `--link` its files are shared with the new cluster; removing the old tree is
//!   what pg_upgrade's `delete_old_cluster.sh` does).
//!
//! Without the done marker, whatever an earlier attempt left is rolled back: the new
//! directory goes, and `global/pg_control.old` (pg_upgrade `--link` renames `pg_control`
//! just before it links the files) is renamed back, which pg_upgrade documents as the way
//! back to the old cluster as long as the new one never started.
//!
//! Why this file stays whole: it is one idea, the resumable upgrade, whose steps (the new
//! cluster, pg_upgrade, the timeline step, the swap, the rollback) must be read together
//! against the states on disk above to see that a manager killed at any point converges.

use crate::bootstrap::{self, initdb};
use crate::pg::sql::SUPERUSER;
use crate::pg::{Binaries, RunAs, binaries};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the major version of PostgreSQL's binaries")]
    Version(#[source] binaries::Error),
    #[error("failed to find the binaries of PostgreSQL {major}, to upgrade from")]
    FindBinaries {
        major: u32,
        #[source]
        source: binaries::Error,
    },
    #[error("refusing to upgrade from PostgreSQL {from} to {to}: the new major must be higher")]
    NotAnUpgrade { from: u32, to: u32 },
    #[error(
        "the data directory {path} holds no PostgreSQL data (no readable PG_VERSION): nothing to upgrade"
    )]
    NoData { path: PathBuf },
    #[error(
        "the data directory {path} holds PostgreSQL {found}, neither {from} (to upgrade from) nor {to}"
    )]
    UnexpectedMajor {
        path: PathBuf,
        found: u32,
        from: u32,
        to: u32,
    },
    #[error("failed to {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {what}")]
    Program {
        what: &'static str,
        #[source]
        source: bootstrap::Error,
    },
    #[error("pg_controldata of {path} printed no {field:?} (or no value pgop understands)")]
    ControlData { path: PathBuf, field: &'static str },
    #[error(
        "the old cluster in {path} is {state:?}, not shut down cleanly, and crash recovery \
         cannot help (a standby's data directory?): pg_upgrade needs a primary's data shut down cleanly"
    )]
    NotClean { path: PathBuf, state: String },
    #[error("failed to run pg_upgrade")]
    SpawnPgUpgrade(#[source] std::io::Error),
    #[error("pg_upgrade{} failed ({status}):\n{report}", if *.check { " --check" } else { "" })]
    PgUpgrade {
        check: bool,
        status: std::process::ExitStatus,
        /// The end of pg_upgrade's output, and of the files it names (the list of
        /// offending tables, the server log of a failed start).
        report: String,
    },
    #[error(
        "after pg_resetwal the new cluster's latest checkpoint is on timeline {found_timeline} \
         in {found_file}, not on {timeline} in {file}"
    )]
    Timeline {
        timeline: u32,
        file: String,
        found_timeline: String,
        found_file: String,
    },
    #[error("the marker {path} of a finished pg_upgrade is unreadable: {content:?}")]
    Marker { path: PathBuf, content: String },
    #[error("failed to finish swapping in the upgraded data directory: {0}")]
    Swap(String),
    #[error(
        "the upgrade failed, and rolling the data directory back failed too ({}); the upgrade failed",
        crate::error_chain(&**.rollback)
    )]
    Rollback {
        rollback: Box<Error>,
        #[source]
        failure: Box<Error>,
    },
}

/// How pg_upgrade carries the data files over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `--link`: hard links, fast and without space for a second copy; the old cluster is
    /// unusable once the new one has started.
    Link,
    /// `--copy`: a full copy; the old files are left alone.
    Copy,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Link => "--link",
            Mode::Copy => "--copy",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "link" => Some(Mode::Link),
            "copy" => Some(Mode::Copy),
            _ => None,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Link => "link",
            Mode::Copy => "copy",
        })
    }
}

/// The operator's request to upgrade this instance's data directory (the primary's Pod:
/// `PGOP_UPGRADE_FROM`, `PGOP_UPGRADE_MODE`), the new major being the binaries'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpgradeRequest {
    /// The major whose data directory is upgraded; its binaries are looked up with
    /// [`Binaries::for_major`].
    pub from: u32,
    pub mode: Mode,
}

/// What [`upgrade`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// PGDATA holds the new major now.
    Upgraded(Upgraded),
    /// PGDATA already held the new major: nothing to do.
    AlreadyDone { major: u32 },
}

/// A finished upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgraded {
    pub from: u32,
    pub to: u32,
    pub mode: Mode,
    /// The new cluster's timeline (the old one's + 1).
    pub timeline: u32,
    pub duration: Duration,
    /// Only the swap of an earlier attempt was finished (pg_upgrade had run then).
    pub resumed: bool,
}

/// `<pgdata>.<suffix>`, beside PGDATA.
fn beside(pgdata: &Path, suffix: &str) -> PathBuf {
    let mut name = pgdata
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "pgdata".into());
    name.push(".");
    name.push(suffix);
    pgdata.with_file_name(name)
}

/// Where the new cluster of an upgrade to `to` is made: `<pgdata>.upgrade-<to>`.
pub fn new_dir(pgdata: &Path, to: u32) -> PathBuf {
    beside(pgdata, &format!("upgrade-{to}"))
}

/// The marker of a complete new cluster: `<pgdata>.upgrade-<to>.done`.
pub fn done_marker(pgdata: &Path, to: u32) -> PathBuf {
    beside(pgdata, &format!("upgrade-{to}.done"))
}

/// Where the old data directory goes during the swap: `<pgdata>.old-<from>`.
pub fn old_dir(pgdata: &Path, from: u32) -> PathBuf {
    beside(pgdata, &format!("old-{from}"))
}

/// pg_upgrade's working directory (its logs before PostgreSQL 15, its scripts) and socket
/// directory, private to PostgreSQL's OS user: in the manager's socket directory.
fn work_dir(socket_dir: &Path) -> PathBuf {
    socket_dir.join("pgop-upgrade")
}

/// Whether PGDATA is in the midst of an upgrade to `to`: a done marker, a new directory
/// being made, or `pg_control` renamed by pg_upgrade `--link`. [`recover`] sets it right.
pub fn interrupted(pgdata: &Path, to: u32) -> bool {
    exists(&done_marker(pgdata, to)) || exists(&new_dir(pgdata, to)) || control_renamed(pgdata)
}

/// What an interrupted upgrade to `to` left, set right without pg_upgrade (a start without
/// an upgrade request): a complete new cluster (its done marker) is swapped in (`Some`);
/// anything else is rolled back (`None`), PGDATA being the old data directory as it was.
pub async fn recover(pgdata: &Path, to: u32) -> Result<Option<Outcome>, Error> {
    let started = Instant::now();
    let done = done_marker(pgdata, to);
    if exists(&done) {
        let marker = Marker::read(&done)?;
        finish_swap(pgdata, to, &marker).await?;
        return Ok(Some(Outcome::Upgraded(marker.upgraded(to, started))));
    }
    rollback(pgdata, &new_dir(pgdata, to)).await?;
    Ok(None)
}

/// Upgrades the data directory `pgdata` (of `old`'s major) to `new`'s major with
/// pg_upgrade in `mode`, run as `run_as`, pg_upgrade's sockets and logs in a private
/// directory under `socket_dir`:
/// 1. what an earlier attempt left is finished (done marker) or rolled back;
/// 2. an old cluster that was not shut down cleanly goes through crash recovery;
/// 3. the new cluster is made with pgop's initdb options, data checksums as the old one's;
/// 4. `pg_upgrade --check`, then pg_upgrade; on failure the old data directory is left as
///    it was, and the error holds the end of pg_upgrade's output and the files it names;
/// 5. the new cluster moves to a new timeline ([`move_to_new_timeline`]);
/// 6. the done marker is written, and the new directory swapped in for PGDATA.
///
/// Nothing else is carried over: the manager renders postgresql.conf and pg_hba.conf at
/// every start, and keeps its other files (TLS, passwords, the store's configuration) in
/// the socket directory. `ALTER SYSTEM` settings (`postgresql.auto.conf`) are not.
pub async fn upgrade(
    old: &Binaries,
    new: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    mode: Mode,
    socket_dir: &Path,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let from = old.major().map_err(Error::Version)?;
    let to = new.major().map_err(Error::Version)?;
    if from >= to {
        return Err(Error::NotAnUpgrade { from, to });
    }
    let done = done_marker(pgdata, to);
    let new_pgdata = new_dir(pgdata, to);
    if exists(&done) {
        let marker = Marker::read(&done)?;
        finish_swap(pgdata, to, &marker).await?;
        return Ok(Outcome::Upgraded(marker.upgraded(to, started)));
    }
    match bootstrap::data_major(pgdata) {
        Some(found) if found == to => {
            // Only leftovers of an upgrade that finished (the marker is gone): garbage.
            for leftover in [new_pgdata, old_dir(pgdata, from)] {
                if exists(&leftover) {
                    remove_tree(&leftover).await?;
                }
            }
            return Ok(Outcome::AlreadyDone { major: to });
        }
        Some(found) if found == from => {}
        Some(found) => {
            return Err(Error::UnexpectedMajor {
                path: pgdata.to_path_buf(),
                found,
                from,
                to,
            });
        }
        None => {
            return Err(Error::NoData {
                path: pgdata.to_path_buf(),
            });
        }
    }
    rollback(pgdata, &new_pgdata).await?;
    let work = work_dir(socket_dir);
    fresh_dir(&work, run_as)?;
    let made = make_new_cluster(old, new, run_as, pgdata, &new_pgdata, mode, &work, to).await;
    let timeline = match made {
        Ok(timeline) => timeline,
        Err(failure) => {
            let rolled_back = rollback(pgdata, &new_pgdata).await;
            let _ = remove_tree(&work).await;
            return Err(match rolled_back {
                Ok(()) => failure,
                Err(rollback) => Error::Rollback {
                    rollback: Box::new(rollback),
                    failure: Box::new(failure),
                },
            });
        }
    };
    let marker = Marker {
        from,
        mode,
        timeline,
    };
    marker.write(&done)?;
    let _ = remove_tree(&work).await;
    finish_swap(pgdata, to, &marker).await?;
    Ok(Outcome::Upgraded(Upgraded {
        from,
        to,
        mode,
        timeline,
        duration: started.elapsed(),
        resumed: false,
    }))
}

/// Steps 2 to 5 of [`upgrade`], into `new_pgdata`: the new cluster's timeline.
#[allow(clippy::too_many_arguments)]
async fn make_new_cluster(
    old: &Binaries,
    new: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    new_pgdata: &Path,
    mode: Mode,
    work: &Path,
    to: u32,
) -> Result<u32, Error> {
    ensure_clean_shutdown(old, run_as, pgdata).await?;
    // Read before pg_upgrade: with --link it renames the old pg_control.
    let control = ControlData::read(old, run_as, pgdata).await?;
    let old_position = control.position()?;
    let checksums = match control.number("Data page checksum version")? {
        0 => initdb::Checksums::Off { major: to },
        _ => initdb::Checksums::On,
    };
    let preload = shared_preload_libraries(old, run_as, pgdata).await;
    fresh_dir(new_pgdata, run_as)?;
    let cmd = initdb::initdb_command(new, run_as, new_pgdata, checksums);
    bootstrap::run("initdb", cmd)
        .await
        .map_err(|source| Error::Program {
            what: "initdb the new cluster",
            source,
        })?;
    let upgrade = PgUpgrade {
        old,
        new,
        run_as,
        pgdata,
        new_pgdata,
        mode,
        work,
        preload: preload.as_deref(),
    };
    upgrade.run(true).await?;
    upgrade.run(false).await?;
    move_to_new_timeline(new, run_as, pgdata, new_pgdata, old_position).await
}

/// One run of pg_upgrade.
struct PgUpgrade<'a> {
    old: &'a Binaries,
    new: &'a Binaries,
    run_as: Option<RunAs>,
    pgdata: &'a Path,
    new_pgdata: &'a Path,
    mode: Mode,
    work: &'a Path,
    /// `shared_preload_libraries` of the old cluster, for the new server pg_upgrade starts.
    preload: Option<&'a str>,
}

impl PgUpgrade<'_> {
    /// Runs pg_upgrade (`--check` only with `check`); on failure the error holds the end of
    /// its output and of the files it names.
    async fn run(&self, check: bool) -> Result<(), Error> {
        let mut cmd = binaries::command(self.new, "pg_upgrade", self.run_as);
        cmd.current_dir(self.work)
            .arg("--old-bindir")
            .arg(self.old.dir())
            .arg("--new-bindir")
            .arg(self.new.dir())
            .arg("--old-datadir")
            .arg(self.pgdata)
            .arg("--new-datadir")
            .arg(self.new_pgdata)
            .args(["--username", SUPERUSER])
            .arg("--socketdir")
            .arg(self.work)
            .arg(self.mode.flag())
            // The old server starts with the configuration pgop last rendered for it: not
            // with TLS files the socket directory may not hold yet, nor archiving to a
            // store whose configuration is not written yet. pg_upgrade passes these
            // through a shell: plain words only.
            .args(["--old-options", "-c ssl=off -c archive_mode=off"]);
        if let Some(libraries) = self.preload {
            cmd.arg("--new-options")
                .arg(format!("-c shared_preload_libraries={libraries}"));
        }
        if check {
            cmd.arg("--check");
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let child = crate::reaper::spawn(&mut cmd).map_err(Error::SpawnPgUpgrade)?;
        let _registered = crate::reaper::Registered(child.id());
        let output = child
            .wait_with_output()
            .await
            .map_err(Error::SpawnPgUpgrade)?;
        if output.status.success() {
            return Ok(());
        }
        Err(Error::PgUpgrade {
            check,
            status: output.status,
            report: failure_report(
                &output.stdout,
                &output.stderr,
                &[self.work, self.new_pgdata],
                self.work,
            ),
        })
    }
}

/// Lines of pg_upgrade's output kept in an error.
const OUTPUT_LINES: usize = 15;
/// Lines of each file pg_upgrade names kept in an error.
const FILE_LINES: usize = 20;
/// Files pg_upgrade names read into an error.
const FILES: usize = 4;
/// The longest error report (characters).
const REPORT_CHARS: usize = 8000;

/// The end of pg_upgrade's output (its failure message), its standard error, and the end
/// of each file it names (`tables_using_aclitem.txt`, `loadable_libraries.txt`,
/// `pg_upgrade_server.log`, ...) inside `roots` (names without a directory are in `work`,
/// as pg_upgrade before PostgreSQL 15 wrote them).
fn failure_report(stdout: &[u8], stderr: &[u8], roots: &[&Path], work: &Path) -> String {
    let stdout = String::from_utf8_lossy(stdout);
    let mut report = tail(&stdout, OUTPUT_LINES);
    let stderr = String::from_utf8_lossy(stderr);
    let stderr = stderr.trim();
    if !stderr.is_empty() {
        report.push('\n');
        report.push_str(stderr);
    }
    let mut named: Vec<PathBuf> = Vec::new();
    for word in stdout.split_whitespace() {
        let word = word
            .trim_matches(|c| c == '"' || c == '\'')
            .trim_end_matches([',', '.', ':', ';']);
        if !(word.ends_with(".txt") || word.ends_with(".log")) {
            continue;
        }
        let path = if word.starts_with('/') {
            PathBuf::from(word)
        } else {
            work.join(word)
        };
        let inside = roots.iter().any(|root| path.starts_with(root))
            && !path
                .components()
                .any(|c| c == std::path::Component::ParentDir);
        if inside && path.is_file() && !named.contains(&path) {
            named.push(path);
        }
    }
    for path in named.iter().take(FILES) {
        if let Ok(text) = std::fs::read_to_string(path) {
            report.push_str(&format!(
                "\n{}:\n{}",
                path.display(),
                tail(&text, FILE_LINES)
            ));
        }
    }
    if report.chars().count() > REPORT_CHARS {
        let cut: String = report.chars().take(REPORT_CHARS).collect();
        report = format!("{cut}\n[...]");
    }
    report
}

/// The last `n` non-blank lines of `text`, trailing spaces trimmed.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Where the old cluster's WAL was: its timeline and the newest segment it wrote, from
/// pg_controldata before pg_upgrade.
#[derive(Debug, Clone, Copy)]
struct WalPosition {
    timeline: u32,
    segment: u64,
    segment_size: u64,
}

/// pg_upgrade leaves the new cluster on timeline 1, at the WAL segment after the one the
/// old cluster's last checkpoint was in. pgop's WAL archive refuses to overwrite a file
/// with different content, and the new cluster archives to where the old one did: it must
/// never write a WAL segment or a timeline history file under a name the old one may have
/// archived. So, with the new major's `pg_resetwal -l`, it moves to the timeline after the
/// old one's (and after any timeline history file in the old `pg_wal`), at a segment
/// number past both the new cluster's current one and every segment of the old cluster
/// (its last checkpoint's, and whatever its `pg_wal` holds after pg_upgrade started and
/// stopped it). Its LSNs go on growing where the old cluster's stopped.
///
/// The new timeline gets a history file (with a comment only: its WAL does not continue
/// the old timeline's, the system being another), ready for archiving: standbys streaming
/// from it (and pg_basebackup, pg_rewind) ask for the history file of every timeline
/// above 1. pg_controldata checks the result. Returns the new timeline.
async fn move_to_new_timeline(
    new: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    new_pgdata: &Path,
    old: WalPosition,
) -> Result<u32, Error> {
    let control = ControlData::read(new, run_as, new_pgdata).await?;
    let current = control.position()?;
    if current.segment_size != old.segment_size {
        // pg_upgrade refuses clusters whose segment sizes differ; never reached.
        return Err(Error::ControlData {
            path: new_pgdata.to_path_buf(),
            field: "Bytes per WAL segment",
        });
    }
    let old_wal = pgdata.join("pg_wal");
    let entries = std::fs::read_dir(&old_wal).map_err(|source| Error::Io {
        what: "list",
        path: old_wal.clone(),
        source,
    })?;
    let (mut last_timeline, mut last_segment) = (old.timeline, old.segment);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(wal) = name.to_str().and_then(pgop_backup::WalName::parse) else {
            continue;
        };
        last_timeline = last_timeline.max(wal.timeline);
        if let Some(segment) = segment_number(&wal.name, old.segment_size) {
            last_segment = last_segment.max(segment);
        }
    }
    let timeline = last_timeline.saturating_add(1);
    let segment = last_segment.max(current.segment).saturating_add(1);
    let file = wal_file_name(timeline, segment, old.segment_size);
    let mut cmd = binaries::command(new, "pg_resetwal", run_as);
    cmd.arg("-l").arg(&file).arg("-D").arg(new_pgdata);
    bootstrap::run("pg_resetwal", cmd)
        .await
        .map_err(|source| Error::Program {
            what: "move the new cluster to a new timeline",
            source,
        })?;
    // After pg_resetwal, which removes the WAL and its archive status (history files
    // stay).
    let history = new_pgdata.join(crate::pg::timeline::history_file(timeline));
    write_durable(
        &history,
        &format!(
            "# timeline {timeline}: a cluster upgraded by pgop (pg_upgrade) from one on timeline {}\n",
            old.timeline
        ),
        run_as,
    )?;
    let ready = new_pgdata.join(format!(
        "pg_wal/archive_status/{timeline:08X}.history.ready"
    ));
    write_durable(&ready, "", run_as)?;
    let control = ControlData::read(new, run_as, new_pgdata).await?;
    let found_timeline = control.field("Latest checkpoint's TimeLineID")?;
    let found_file = control.field("Latest checkpoint's REDO WAL file")?;
    if found_timeline != timeline.to_string() || found_file != file {
        return Err(Error::Timeline {
            timeline,
            file,
            found_timeline: found_timeline.to_string(),
            found_file: found_file.to_string(),
        });
    }
    Ok(timeline)
}

/// WAL segments per "log" of a file name (`<timeline><log><segment>`).
fn segments_per_log(segment_size: u64) -> u64 {
    0x1_0000_0000 / segment_size.max(1)
}

/// The segment number of a WAL segment file name (none for history files and others).
fn segment_number(name: &str, segment_size: u64) -> Option<u64> {
    if name.len() != 24 {
        return None;
    }
    let (log, segment) = pgop_backup::WalName::parse(name)?.position?;
    Some(u64::from(log) * segments_per_log(segment_size) + u64::from(segment))
}

/// The WAL segment file name of `segment` on `timeline`.
fn wal_file_name(timeline: u32, segment: u64, segment_size: u64) -> String {
    let per = segments_per_log(segment_size);
    format!("{timeline:08X}{:08X}{:08X}", segment / per, segment % per)
}

/// pg_controldata's report of a data directory ([`crate::pg::ControlData`]), a missing or
/// unreadable field an error naming the directory.
struct ControlData {
    path: PathBuf,
    report: crate::pg::ControlData,
}

impl ControlData {
    async fn read(
        binaries: &Binaries,
        run_as: Option<RunAs>,
        pgdata: &Path,
    ) -> Result<Self, Error> {
        let report = crate::pg::ControlData::read(binaries, run_as, pgdata)
            .await
            .map_err(|source| Error::Program {
                what: "read the control file",
                source,
            })?;
        Ok(Self {
            path: pgdata.to_path_buf(),
            report,
        })
    }

    fn field(&self, field: &'static str) -> Result<&str, Error> {
        self.report.field(field).ok_or_else(|| self.missing(field))
    }

    fn number(&self, field: &'static str) -> Result<u64, Error> {
        self.field(field)?.parse().map_err(|_| self.missing(field))
    }

    fn missing(&self, field: &'static str) -> Error {
        Error::ControlData {
            path: self.path.clone(),
            field,
        }
    }

    /// The latest checkpoint's timeline and REDO segment.
    fn position(&self) -> Result<WalPosition, Error> {
        const SIZE: &str = "Bytes per WAL segment";
        const TIMELINE: &str = "Latest checkpoint's TimeLineID";
        const REDO: &str = "Latest checkpoint's REDO WAL file";
        let segment_size = self.number(SIZE)?;
        if !segment_size.is_power_of_two() || segment_size > 0x1_0000_0000 {
            return Err(self.missing(SIZE));
        }
        let timeline = u32::try_from(self.number(TIMELINE)?).map_err(|_| self.missing(TIMELINE))?;
        let segment =
            segment_number(self.field(REDO)?, segment_size).ok_or_else(|| self.missing(REDO))?;
        Ok(WalPosition {
            timeline,
            segment,
            segment_size,
        })
    }
}

/// pg_upgrade refuses an old cluster that was not shut down cleanly: one that crashed goes
/// through crash recovery first, in single-user mode (as pg_rewind does it): the old
/// major's `postgres --single` replays the WAL, writes a shutdown checkpoint at its end of
/// input and exits, without a socket or a port.
async fn ensure_clean_shutdown(
    old: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
) -> Result<(), Error> {
    const STATE: &str = "Database cluster state";
    let control = ControlData::read(old, run_as, pgdata).await?;
    match control.field(STATE)? {
        "shut down" => return Ok(()),
        "in production" | "in crash recovery" | "shutting down" | "starting up" => {}
        other => {
            return Err(Error::NotClean {
                path: pgdata.to_path_buf(),
                state: other.to_string(),
            });
        }
    }
    tracing::info!(pgdata = %pgdata.display(), "the old cluster was not shut down cleanly: crash recovery in single-user mode first");
    let mut cmd = binaries::command(old, "postgres", run_as);
    cmd.arg("--single").arg("-D").arg(pgdata).args([
        "-c",
        "archive_mode=off",
        "-c",
        "ssl=off",
        "template1",
    ]);
    bootstrap::run("postgres --single", cmd)
        .await
        .map_err(|source| Error::Program {
            what: "run crash recovery on the old cluster",
            source,
        })?;
    let control = ControlData::read(old, run_as, pgdata).await?;
    match control.field(STATE)? {
        "shut down" => Ok(()),
        other => Err(Error::NotClean {
            path: pgdata.to_path_buf(),
            state: other.to_string(),
        }),
    }
}

/// The old cluster's `shared_preload_libraries` (`postgres -C`), for the new server
/// pg_upgrade starts: an extension whose `CREATE EXTENSION` needs its library loaded
/// (pg_cron, timescaledb) could not be restored otherwise. `None` when there are none, or
/// when a name is more than plain characters (pg_upgrade passes it through a shell).
async fn shared_preload_libraries(
    old: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
) -> Option<String> {
    let mut cmd = binaries::command(old, "postgres", run_as);
    cmd.arg("-D")
        .arg(pgdata)
        .args(["-C", "shared_preload_libraries"]);
    let out = match bootstrap::run("postgres -C", cmd).await {
        Ok(out) => out,
        Err(err) => {
            tracing::warn!(error = %crate::error_chain(&err), "failed to read the old cluster's shared_preload_libraries; pg_upgrade starts the new server without them");
            return None;
        }
    };
    preload_list(&String::from_utf8_lossy(&out.stdout))
}

/// `shared_preload_libraries` as one comma-separated list of plain names (`None` when
/// empty or when a name holds anything but letters, digits, `_`, `-`, `.` and `/`).
fn preload_list(value: &str) -> Option<String> {
    let names: Vec<&str> = value
        .split(',')
        .map(|n| n.trim().trim_matches('"').trim())
        .map(|n| n.strip_prefix("$libdir/").unwrap_or(n))
        .filter(|n| !n.is_empty())
        .collect();
    let plain = |n: &str| {
        n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
    };
    if names.is_empty() {
        return None;
    }
    if !names.iter().all(|n| plain(n)) {
        tracing::warn!(
            libraries = value.trim(),
            "the old cluster's shared_preload_libraries holds names pgop does not pass to pg_upgrade; its new server starts without them"
        );
        return None;
    }
    Some(names.join(","))
}

/// What the done marker holds: enough to finish the swap and report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marker {
    from: u32,
    mode: Mode,
    timeline: u32,
}

impl Marker {
    fn write(&self, path: &Path) -> Result<(), Error> {
        let text = format!(
            "from={}\nmode={}\ntimeline={}\n",
            self.from, self.mode, self.timeline
        );
        write_durable(path, &text, None)
    }

    fn read(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            what: "read",
            path: path.to_path_buf(),
            source,
        })?;
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
        };
        let parsed = value("from")
            .and_then(|v| v.parse().ok())
            .zip(value("mode").and_then(Mode::parse))
            .zip(value("timeline").and_then(|v| v.parse().ok()))
            .map(|((from, mode), timeline)| Self {
                from,
                mode,
                timeline,
            });
        parsed.ok_or_else(|| Error::Marker {
            path: path.to_path_buf(),
            content: text.chars().take(200).collect(),
        })
    }

    fn upgraded(&self, to: u32, started: Instant) -> Upgraded {
        Upgraded {
            from: self.from,
            to,
            mode: self.mode,
            timeline: self.timeline,
            duration: started.elapsed(),
            resumed: true,
        }
    }
}

/// The swap, once the done marker is written: PGDATA to `<pgdata>.old-<from>`, the new
/// directory to PGDATA, the old directory removed, then the marker. Each step is checked
/// on disk first, so that a swap interrupted anywhere is finished by running this again.
async fn finish_swap(pgdata: &Path, to: u32, marker: &Marker) -> Result<(), Error> {
    let new = new_dir(pgdata, to);
    let old = old_dir(pgdata, marker.from);
    if exists(&new) {
        if exists(pgdata) {
            let found = bootstrap::data_major(pgdata);
            if found != Some(marker.from) {
                return Err(Error::Swap(format!(
                    "{} holds {}, not PostgreSQL {} as the marker says",
                    pgdata.display(),
                    found.map_or("no PostgreSQL data".to_string(), |m| format!(
                        "PostgreSQL {m}"
                    )),
                    marker.from
                )));
            }
            if exists(&old) {
                return Err(Error::Swap(format!(
                    "{}, {} and {} all exist; one of the first two is not pgop's",
                    pgdata.display(),
                    old.display(),
                    new.display()
                )));
            }
            rename(pgdata, &old)?;
        }
        rename(&new, pgdata)?;
    }
    match bootstrap::data_major(pgdata) {
        Some(found) if found == to => {}
        found => {
            return Err(Error::Swap(format!(
                "{} holds {}, not PostgreSQL {to}, and {} is gone",
                pgdata.display(),
                found.map_or("no PostgreSQL data".to_string(), |m| format!(
                    "PostgreSQL {m}"
                )),
                new.display()
            )));
        }
    }
    if exists(&old) {
        remove_tree(&old).await?;
    }
    let done = done_marker(pgdata, to);
    std::fs::remove_file(&done).map_err(|source| Error::Io {
        what: "remove",
        path: done.clone(),
        source,
    })?;
    sync_parent(&done)
}

/// Undoes an attempt that did not finish (no done marker): removes the new directory and
/// renames `global/pg_control.old` back when pg_upgrade `--link` left it renamed.
async fn rollback(pgdata: &Path, new: &Path) -> Result<(), Error> {
    if exists(new) {
        remove_tree(new).await?;
    }
    if control_renamed(pgdata) {
        let global = pgdata.join("global");
        tracing::info!(pgdata = %pgdata.display(), "renaming global/pg_control.old back (left by an interrupted pg_upgrade --link)");
        rename(&global.join("pg_control.old"), &global.join("pg_control"))?;
    }
    Ok(())
}

/// pg_upgrade `--link` renamed `global/pg_control` to `pg_control.old`.
fn control_renamed(pgdata: &Path) -> bool {
    let global = pgdata.join("global");
    !exists(&global.join("pg_control")) && global.join("pg_control.old").is_file()
}

/// Whether anything is at `path` (a dangling symbolic link too).
fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Renames `from` to `to` and fsyncs their directory.
fn rename(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::rename(from, to).map_err(|source| Error::Io {
        what: "rename",
        path: from.to_path_buf(),
        source,
    })?;
    sync_parent(to)
}

/// Removes a directory tree (off the async threads: it may be large), then fsyncs its
/// parent.
async fn remove_tree(path: &Path) -> Result<(), Error> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::remove_dir_all(owned))
        .await
        .map_err(std::io::Error::other)
        .and_then(|removed| removed)
        .map_err(|source| Error::Io {
            what: "remove",
            path: path.to_path_buf(),
            source,
        })?;
    sync_parent(path)
}

/// An empty directory at `path` (anything there before is removed), mode 0700, owned by
/// PostgreSQL's OS user.
fn fresh_dir(path: &Path, run_as: Option<RunAs>) -> Result<(), Error> {
    let io = |source| Error::Io {
        what: "create",
        path: path.to_path_buf(),
        source,
    };
    if exists(path) {
        std::fs::remove_dir_all(path).map_err(io)?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(io)?;
    if let Some(user) = run_as {
        user.chown(path).map_err(io)?;
    }
    sync_parent(path)
}

/// Writes `text` to `path` and fsyncs it and its directory; owned by `run_as` when given.
fn write_durable(path: &Path, text: &str, run_as: Option<RunAs>) -> Result<(), Error> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(path)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        if let Some(user) = run_as {
            user.chown(path)?;
        }
        Ok(())
    };
    let written = write();
    written.map_err(|source| Error::Io {
        what: "write",
        path: path.to_path_buf(),
        source,
    })?;
    sync_parent(path)
}

/// Fsyncs the directory holding `path`.
fn sync_parent(path: &Path) -> Result<(), Error> {
    bootstrap::sync_parent(path).map_err(|source| Error::Io {
        what: "fsync",
        path: path.parent().unwrap_or(path).to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upgrade_works_beside_pgdata() {
        let pgdata = Path::new("/var/lib/postgresql/data/pgdata");
        assert_eq!(
            new_dir(pgdata, 18),
            Path::new("/var/lib/postgresql/data/pgdata.upgrade-18")
        );
        assert_eq!(
            done_marker(pgdata, 18),
            Path::new("/var/lib/postgresql/data/pgdata.upgrade-18.done")
        );
        assert_eq!(
            old_dir(pgdata, 15),
            Path::new("/var/lib/postgresql/data/pgdata.old-15")
        );
    }

    #[test]
    fn wal_file_names_and_segment_numbers_agree() {
        const MB16: u64 = 16 * 1024 * 1024;
        assert_eq!(segment_number("000000010000000000000003", MB16), Some(3));
        assert_eq!(
            segment_number("0000000100000001000000FF", MB16),
            Some(256 + 255)
        );
        assert_eq!(segment_number("00000001.history", MB16), None);
        assert_eq!(
            segment_number("000000010000000000000003.partial", MB16),
            None
        );
        assert_eq!(
            wal_file_name(2, 256 + 255, MB16),
            "0000000200000001000000FF"
        );
        assert_eq!(wal_file_name(0x1A, 256, MB16), "0000001A0000000100000000");
        // 1 GB segments: four per log.
        assert_eq!(wal_file_name(3, 5, 1 << 30), "000000030000000100000001");
        assert_eq!(segment_number("000000030000000100000001", 1 << 30), Some(5));
    }

    #[test]
    fn preloaded_libraries_are_passed_on_only_as_plain_names() {
        assert_eq!(preload_list(""), None);
        assert_eq!(preload_list("  \n"), None);
        assert_eq!(
            preload_list("pg_stat_statements, \"auto_explain\",$libdir/pg_cron\n").as_deref(),
            Some("pg_stat_statements,auto_explain,pg_cron")
        );
        assert_eq!(preload_list("a;touch /tmp/x"), None);
        assert_eq!(preload_list("a b"), None);
        assert_eq!(preload_list("$HOME/x"), None);
    }

    #[test]
    fn the_failure_report_has_the_end_of_the_output_and_of_the_files_it_names() {
        let dir = std::env::temp_dir().join(format!("pgop-upgrade-report-{}", std::process::id()));
        let out = dir.join("new/pg_upgrade_output.d/x");
        std::fs::create_dir_all(&out).expect("a scratch directory");
        let list = out.join("tables_using_aclitem.txt");
        std::fs::write(&list, "In database: app\n  public.t.a\n").expect("write");
        let stdout = format!(
            "Checking for incompatible \"aclitem\" data type              fatal\n\n\
             A list of the problem columns is in the file:\n    {}\nFailure, exiting\n\
             see /etc/passwd.txt and \"{}/../../etc/x.log\"\n",
            list.display(),
            dir.display()
        );
        let new = dir.join("new");
        let report = failure_report(stdout.as_bytes(), b"", &[&dir.join("work"), &new], &dir);
        assert!(report.contains("fatal"), "{report}");
        assert!(report.contains("public.t.a"), "{report}");
        assert!(report.contains("Failure, exiting"), "{report}");
        assert!(!report.contains("root:"), "{report}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_done_marker_round_trips() {
        let dir = std::env::temp_dir().join(format!("pgop-upgrade-marker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let path = dir.join("pgdata.upgrade-18.done");
        let marker = Marker {
            from: 15,
            mode: Mode::Copy,
            timeline: 4,
        };
        marker.write(&path).expect("write");
        assert_eq!(Marker::read(&path).expect("read"), marker);
        std::fs::write(&path, "garbage").expect("write");
        assert!(matches!(Marker::read(&path), Err(Error::Marker { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
