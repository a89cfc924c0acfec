//! The instance manager's `/pg/status` JSON: what an instance's PostgreSQL is doing. The
//! instance manager serves it and the operator reads it, so the types live here, once.

use crate::backup::BackupMethod;
use serde::{Deserialize, Serialize};

/// The major version in `postgres --version`'s line ("postgres (PostgreSQL) 18.6",
/// "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"), or in a data directory's
/// `PG_VERSION` ("18"), or in `postgresVersion` as `/pg/status` reports it. Shared by the
/// instance manager (which binaries) and the operator (which major an instance runs).
pub fn parse_major(text: &str) -> Option<u32> {
    let version = match text.find("(PostgreSQL)") {
        Some(at) => text[at + "(PostgreSQL)".len()..]
            .split_whitespace()
            .next()?,
        None => text.trim(),
    };
    let major = version.split(['.', 'b', 'r', 'd']).next()?;
    major.parse().ok().filter(|m| *m >= 10)
}

/// A user parameter (or `pgHba` for the pg_hba rules) the server would not accept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InvalidParameter {
    pub name: String,
    pub value: String,
    pub reason: String,
}

/// The role PostgreSQL runs in right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PgRole {
    /// Out of recovery: accepts writes.
    Primary,
    /// In recovery: a standby.
    Replica,
    /// In recovery as a replica cluster's designated primary: a standby of the cluster's
    /// outside source (`spec.replica`), the one the cluster's other instances follow.
    #[serde(rename = "designatedPrimary")]
    DesignatedPrimary,
    /// Not running (stopped, fenced or starting).
    Stopped,
}

impl PgRole {
    /// The cluster's primary: the writable one, or a replica cluster's designated primary
    /// (the one its other instances follow, failed over like a primary).
    pub fn leads(self) -> bool {
        matches!(self, PgRole::Primary | PgRole::DesignatedPrimary)
    }

    /// In recovery: a standby of an instance of the cluster or of the outside source.
    pub fn in_recovery(self) -> bool {
        matches!(self, PgRole::Replica | PgRole::DesignatedPrimary)
    }
}

/// The instance's PostgreSQL status, served as JSON on `/pg/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PgStatus {
    pub instance: String,
    /// The version of the pgop binary serving this (the instance manager), as
    /// `pgop --version` prints it. Unset from managers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager_version: Option<String>,
    pub role: PgRole,
    /// Whether PostgreSQL answers queries.
    pub running: bool,
    /// Whether the manager stopped PostgreSQL on purpose (fencing) and keeps it stopped.
    #[serde(default)]
    pub fenced: bool,
    #[serde(default)]
    pub in_recovery: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_identifier: Option<String>,
    /// Primary: `pg_current_wal_lsn()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_lsn: Option<String>,
    /// Standby: the last LSN received and flushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_lsn: Option<String>,
    /// Standby: the last LSN replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_lsn: Option<String>,
    /// Standby: whether the WAL receiver streams from the primary.
    #[serde(default)]
    pub streaming: bool,
    /// Primary: one entry per connected standby.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication: Vec<StandbyReplication>,
    #[serde(default)]
    pub pending_restart: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_restart_parameters: Vec<String>,
    /// Of those, the parameters a hot standby needs at least at its primary's value
    /// (`max_connections`, `max_worker_processes`, `max_wal_senders`,
    /// `max_prepared_transactions`, `max_locks_per_transaction`) whose new value is lower
    /// than the running one: a standby restarted with it before the primary would refuse to
    /// start, so the primary restarts first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_restart_decreases: Vec<String>,
    /// The cluster's `metadata.generation` whose parameters this instance last applied
    /// (reloaded): until every instance has, `pendingRestart` may not yet tell the whole
    /// story, so a rolling restart waits. Unset before the first apply (and from managers
    /// that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_generation: Option<i64>,
    /// User parameters refused by the last configuration (never written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid_parameters: Vec<InvalidParameter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version_num: Option<i32>,
    /// Primary: how each role of `spec.roles` was last applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<crate::roles::AppliedStatus>,
    /// Primary: how each database of `spec.databases` was last applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<crate::roles::AppliedStatus>,
    /// WAL archiving to the backup store (`pg_stat_archiver`); unset while PostgreSQL does
    /// not answer (and from managers that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiving: Option<ArchiveStatus>,
    /// The filesystem of the data volume, read by the manager whether or not PostgreSQL
    /// runs; unset when it could not be read (and from managers that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeUsage>,
    /// The filesystem of the WAL volume (`spec.walStorage`); unset without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_volume: Option<VolumeUsage>,
    /// Why the last bootstrap of the data directory failed (a restore from a backup whose
    /// target is unreachable, a corrupt object, ...; initdb or a clone from the primary once
    /// they have failed for 30 s); unset once a bootstrap succeeds. The manager retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_error: Option<String>,
    /// When the running postmaster started (`pg_postmaster_start_time()`, RFC 3339): a
    /// restart requested before it is done. Unset while PostgreSQL does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postmaster_start_time: Option<String>,
    /// While PostgreSQL is down because its last start failed: why, in its own last words
    /// (the last error lines it wrote before it exited, e.g. `FATAL: could not load library
    /// "x"`). Unset while it runs, and after a stop on purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Why the manager refused the restart it was asked for: the new configuration failed
    /// its dry run (PostgreSQL would not start with it). The instance keeps running with
    /// the old values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_refused: Option<String>,
    /// Why this instance does not run its PostgreSQL major: the error chain of a failed
    /// in-place major upgrade (pg_upgrade; the old data directory is left as it was and
    /// PostgreSQL stays stopped), or, on the instance the status names primary, that its
    /// data directory holds an older major and no upgrade was requested. Unset otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade_error: Option<String>,
    /// Why this instance is not ready, as its manager sees it: set while PostgreSQL does
    /// not run (and not on purpose: a fenced instance has none), or a standby does not
    /// stream. Unset from managers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<Down>,
    /// In recovery: how it follows its upstream (`pg_stat_wal_receiver`), and on a replica
    /// cluster's designated primary why its source refuses it. Unset otherwise (and from
    /// managers that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamState>,
}

/// How a server in recovery follows its upstream ([`PgStatus::upstream`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamState {
    /// The WAL receiver's state (`streaming`, `catchup`, `waiting`, ...); unset while no
    /// WAL receiver runs (the upstream cannot be reached, or refuses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver: Option<String>,
    /// The end of the upstream's WAL as it last told the receiver (`latest_end_lsn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,
    /// Bytes of that WAL not replayed here yet (0 once caught up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<i64>,
    /// 0 once everything the upstream reported is replayed; else the seconds since the
    /// last replayed commit's time (`pg_last_xact_replay_timestamp()`). Unset when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
    /// When the last message from the upstream arrived (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_message_at: Option<String>,
    /// Seconds since the time of the last commit replayed here
    /// (`pg_last_xact_replay_timestamp()`), whatever the upstream says; unset before any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_commit_age_seconds: Option<f64>,
    /// A designated primary that reads its source's store: the last WAL segment
    /// `restore_command` restored from it, and when (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<String>,
    /// A designated primary that does not stream: why its source refuses it, as the
    /// manager's own connection to it was answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<SourceRefusal>,
}

/// Why a replica cluster's source refuses its designated primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRefusal {
    /// `SourceUnreachable`, `SourceTLSRefused`, `SourceAuthenticationFailed`,
    /// `SourceNoReplication`, `SourceRefused`, `SourceWalGone`,
    /// `SystemIdentifierMismatch` or `ArchiveGap`.
    pub reason: String,
    /// What the source (or libpq) said, printable, at most 1024 bytes.
    pub message: String,
}

impl SourceRefusal {
    /// A refusal for `reason`, its message made printable and cut to 1024 bytes.
    pub fn new(reason: &str, message: &str) -> Self {
        Self {
            reason: reason.to_string(),
            message: printable(message, 1024),
        }
    }
}

/// Why an instance is not ready ([`PgStatus::down`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Down {
    pub reason: DownReason,
    /// PostgreSQL's own last words (its last FATAL/PANIC lines, each without the log line
    /// prefix, joined by " | "), or the manager's error; printable and at most
    /// [`MAX_DOWN_MESSAGE`] bytes.
    pub message: String,
    /// The parameters whose values changed since the instance's last start that succeeded
    /// (a restart for them left it down); empty when none did, or the manager saw no
    /// start succeed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
    /// Since when (RFC 3339) the instance has been down for this reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// The longest [`Down::message`], in bytes.
pub const MAX_DOWN_MESSAGE: usize = 1024;

/// Why an instance is not ready: the `reason` of `status.instances[]` and of the
/// `InstanceDown` Event. docs/troubleshooting.md says what to do for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownReason {
    /// PostgreSQL exited while starting (a parameter it refuses at start, a library it
    /// cannot load, a damaged data directory, ...).
    StartFailed,
    /// The data volume is full: PostgreSQL cannot write.
    VolumeFull,
    /// The WAL volume (`spec.walStorage`) is full.
    WalVolumeFull,
    /// The data directory could not be made: initdb, the clone from the primary or the
    /// restore from a backup failed (the manager retries).
    BootstrapFailed,
    /// The in-place major upgrade failed, or the data directory holds an older major.
    MajorUpgradeFailed,
    /// The primary no longer has the WAL this standby needs.
    WalGone,
    /// A standby that runs but does not stream from its primary (it passes through this
    /// during a failover or a switchover).
    NotStreaming,
}

impl DownReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StartFailed => "StartFailed",
            Self::VolumeFull => "VolumeFull",
            Self::WalVolumeFull => "WalVolumeFull",
            Self::BootstrapFailed => "BootstrapFailed",
            Self::MajorUpgradeFailed => "MajorUpgradeFailed",
            Self::WalGone => "WalGone",
            Self::NotStreaming => "NotStreaming",
        }
    }

    /// Whether this is a state an instance passes through on its own (a standby between
    /// two primaries): said in status, without an Event.
    pub fn passing(self) -> bool {
        self == Self::NotStreaming
    }
}

impl Down {
    /// Whether the instance cannot start with parameters a restart just applied: the
    /// rolling restart stops at once, and the configuration is not applied.
    pub fn cannot_start_with_parameters(&self) -> bool {
        self.reason == DownReason::StartFailed && !self.parameters.is_empty()
    }
}

/// `text` made safe to print and bounded: control characters (newlines included) are
/// escaped as `\u{..}` (a newline as " | "), and the result is cut at `max` bytes on a
/// character boundary, ending in "…" when cut.
pub fn printable(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.trim_end().chars() {
        let piece = match c {
            '\n' => " | ".to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        };
        if out.len() + piece.len() > max.saturating_sub('…'.len_utf8()) {
            out.push('…');
            return out;
        }
        out.push_str(&piece);
    }
    out
}

/// WAL archiving as PostgreSQL reports it (`pg_stat_archiver`, since the server started
/// The size and use of an instance's data volume (its filesystem), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUsage {
    /// The filesystem's size.
    pub capacity_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Bytes PostgreSQL (not root) may still write.
    #[serde(default)]
    pub available_bytes: u64,
}

impl VolumeUsage {
    /// The share in use, in percent rounded up (0 for a filesystem of no size).
    pub fn used_percent(&self) -> u64 {
        if self.capacity_bytes == 0 {
            return 0;
        }
        let used = (u128::from(self.used_bytes) * 100).div_ceil(u128::from(self.capacity_bytes));
        u64::try_from(used).unwrap_or(u64::MAX)
    }
}

/// or the statistics were reset).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveStatus {
    /// Whether archiving is configured (`archive_mode` on, with pgop's `archive_command`).
    pub configured: bool,
    /// Whether the last attempt failed: a failure newer than the last success. The
    /// operator's ContinuousArchiving condition is False while this is true.
    #[serde(default)]
    pub failing: bool,
    #[serde(default)]
    pub archived_count: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_wal: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_time: Option<String>,
    #[serde(default)]
    pub failed_count: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_wal: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_time: Option<String>,
}

/// One standby as the primary sees it (`pg_stat_replication`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StandbyReplication {
    pub application_name: String,
    pub state: String,
    /// `async`, `potential`, `sync` or `quorum`.
    pub sync_state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lsn: Option<String>,
    /// Bytes between the primary's current LSN and the standby's replayed LSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lag_bytes: Option<i64>,
    /// `pg_stat_replication.replay_lag` in seconds (unset while the standby is idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lag_seconds: Option<f64>,
}

impl PgStatus {
    /// The status of an instance whose PostgreSQL does not answer.
    pub fn stopped(instance: &str, fenced: bool) -> Self {
        Self {
            instance: instance.to_string(),
            manager_version: None,
            role: PgRole::Stopped,
            running: false,
            fenced,
            in_recovery: false,
            timeline: None,
            system_identifier: None,
            current_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            streaming: false,
            replication: Vec::new(),
            pending_restart: false,
            pending_restart_parameters: Vec::new(),
            pending_restart_decreases: Vec::new(),
            applied_generation: None,
            invalid_parameters: Vec::new(),
            postgres_version: None,
            postgres_version_num: None,
            roles: Vec::new(),
            databases: Vec::new(),
            archiving: None,
            volume: None,
            wal_volume: None,
            bootstrap_error: None,
            postmaster_start_time: None,
            last_error: None,
            restart_refused: None,
            major_upgrade_error: None,
            down: None,
            upstream: None,
        }
    }

    /// The LSN that orders standbys for a failover: the most WAL received (or written).
    pub fn wal_position(&self) -> Option<u64> {
        self.received_lsn
            .as_deref()
            .or(self.current_lsn.as_deref())
            .and_then(parse_lsn)
    }
}

/// `16/B374D848` as a number.
pub fn parse_lsn(lsn: &str) -> Option<u64> {
    let (hi, lo) = lsn.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// `POST /pg/backups`: take a backup of this instance into the cluster's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRequest {
    /// The PostgresBackup this is for; a second request with the same name returns the
    /// same job.
    pub name: String,
    /// After the backup, restore it into a scratch directory and check it; the job stays
    /// `running` until the check is done.
    #[serde(default)]
    pub verify: bool,
    /// Base backup (the default) or logical backup (`pg_dump`).
    #[serde(default)]
    pub method: BackupMethod,
}

/// `POST /pg/retention`: apply the cluster's retention to its store, from this instance
/// (which can reach the store, whatever its kind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionRequest {
    /// `spec.backup.retentionDays`.
    pub retention_days: u32,
}

/// The answer to a [`RetentionRequest`]: what was removed from the store.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionDone {
    /// Base backup ids removed (with the WAL only they needed).
    #[serde(default)]
    pub base_backups: Vec<String>,
    /// Logical backup ids removed.
    #[serde(default)]
    pub logical_backups: Vec<String>,
    /// WAL files removed.
    #[serde(default)]
    pub wal_files: usize,
}

/// Where a backup job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupJobPhase {
    Running,
    Completed,
    Failed,
}

/// `GET /pg/backups/<name>`: a backup the instance manager runs or ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupJob {
    pub name: String,
    pub phase: BackupJobPhase,
    /// RFC 3339.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// The backup id in the store, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_lsn: Option<String>,
    /// RFC 3339: when the backup began and ended in PostgreSQL's terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<i64>,
    /// Requested with `verify`: the backup restored into a scratch directory and every
    /// page's checksum checked (`None` while not checked yet or not requested).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
    /// What the verification found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<String>,
    #[serde(default)]
    pub method: BackupMethod,
    /// A logical backup: the databases dumped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl BackupJob {
    /// A job just started: running, nothing known yet but its name, method and start.
    pub fn running(name: &str, method: BackupMethod, started_at: &str) -> Self {
        Self {
            name: name.to_string(),
            phase: BackupJobPhase::Running,
            started_at: started_at.to_string(),
            stopped_at: None,
            backup_id: None,
            begin_lsn: None,
            end_lsn: None,
            begin_time: None,
            end_time: None,
            timeline: None,
            size_bytes: None,
            stored_bytes: None,
            verified: None,
            verification: None,
            method,
            databases: Vec::new(),
            error: None,
        }
    }
}

/// The compatibility contract between an operator and the instance managers of another
/// pgop version (an operator upgrade, a cluster that pins `spec.image`): `/pg/status` only
/// ever gains optional fields, so each side reads what the other serves.
#[cfg(test)]
mod compatibility {
    use super::*;

    #[test]
    fn an_operator_reads_the_status_of_a_manager_that_predates_fields() {
        // What a manager of 0.1.0 before `managerVersion` served for a primary.
        let old = r#"{"instance":"db-1","role":"primary","running":true,"fenced":false,
            "inRecovery":false,"timeline":1,"systemIdentifier":"7300000000000000001",
            "currentLsn":"0/3000148","streaming":false,"pendingRestart":false,
            "appliedGeneration":2,"postgresVersion":"15.14","postgresVersionNum":150014,
            "postmasterStartTime":"2026-12-01T10:00:00+00:00"}"#;
        let status: PgStatus = serde_json::from_str(old).expect("the old shape parses");
        assert_eq!(status.role, PgRole::Primary);
        assert_eq!(status.manager_version, None);
        assert_eq!(status.wal_position(), parse_lsn("0/3000148"));
        // The least any manager has ever served: name, role, whether PostgreSQL runs.
        let least: PgStatus =
            serde_json::from_str(r#"{"instance":"db-2","role":"stopped","running":false}"#)
                .expect("the least shape parses");
        assert_eq!(least, PgStatus::stopped("db-2", false));
    }

    #[test]
    fn an_operator_reads_the_status_of_a_newer_manager_with_fields_it_does_not_know() {
        let newer = r#"{"instance":"db-2","managerVersion":"0.2.0","role":"replica",
            "running":true,"inRecovery":true,"timeline":2,"receivedLsn":"0/5000000",
            "replayedLsn":"0/4FFFF00","streaming":true,"aFieldFromTheFuture":{"x":[1,2]},
            "pendingRestart":false}"#;
        let status: PgStatus = serde_json::from_str(newer).expect("unknown fields are ignored");
        assert_eq!(status.role, PgRole::Replica);
        assert!(status.streaming);
        assert_eq!(status.manager_version.as_deref(), Some("0.2.0"));
    }

    #[test]
    fn a_status_without_a_version_is_served_without_the_field() {
        // An older operator's strict reader never meets a `null` it did not expect.
        let json = serde_json::to_value(PgStatus::stopped("db-1", false)).expect("json");
        assert!(json.get("managerVersion").is_none(), "{json}");
        let mut with = PgStatus::stopped("db-1", false);
        with.manager_version = Some("0.1.0".into());
        let json = serde_json::to_value(&with).expect("json");
        assert_eq!(json["managerVersion"], "0.1.0");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_major_version_is_read_from_postgres_and_from_pg_version() {
        assert_eq!(super::parse_major("postgres (PostgreSQL) 18.6"), Some(18));
        assert_eq!(
            super::parse_major("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"),
            Some(15)
        );
        assert_eq!(
            super::parse_major("postgres (PostgreSQL) 19devel"),
            Some(19)
        );
        assert_eq!(
            super::parse_major("postgres (PostgreSQL) 18beta1"),
            Some(18)
        );
        assert_eq!(super::parse_major("18\n"), Some(18));
        // Before 10 a major had two parts; pgop never ran those.
        assert_eq!(super::parse_major("9.6"), None);
        assert_eq!(super::parse_major("postgres (PostgreSQL)"), None);
        assert_eq!(super::parse_major("not postgres"), None);
    }
}

#[cfg(test)]
mod down_tests {
    use super::*;

    #[test]
    fn printable_escapes_control_characters_and_bounds_the_length() {
        assert_eq!(
            printable("a\nb\x1b[31mc\rd", 100),
            "a | b\\u{1b}[31mc\\u{d}d"
        );
        let long = "é".repeat(600);
        let cut = printable(&long, 1024);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(printable("short\n", 1024), "short");
    }

    #[test]
    fn down_reads_and_writes_as_the_manager_serves_it() {
        let down = Down {
            reason: DownReason::StartFailed,
            message: "FATAL:  could not map anonymous shared memory".into(),
            parameters: vec!["huge_pages".into()],
            since: Some("2026-12-06T00:00:00Z".into()),
        };
        let json = serde_json::to_value(&down).expect("serializes");
        assert_eq!(json["reason"], "StartFailed");
        assert_eq!(json["parameters"][0], "huge_pages");
        let back: Down = serde_json::from_value(json).expect("deserializes");
        assert_eq!(back, down);
        assert!(down.cannot_start_with_parameters());
        assert!(DownReason::NotStreaming.passing());
        assert!(!DownReason::VolumeFull.passing());
    }
}
