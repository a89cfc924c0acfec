//! `GET /metrics`: the instance in the OpenMetrics text format, for Prometheus. Nothing is
//! kept between scrapes: each one encodes a fresh [`PgStatus`] (the same one `/pg/status`
//! serves), the manager's backup jobs, the data volume's usage ([`volume`]) and the expiry
//! of PostgreSQL's certificates ([`certificates`]) with [`encode`], a pure function. Every
//! series carries the `cluster` and `instance` labels; a value that is not known
//! (PostgreSQL down, a standby's current LSN, ...) has no series rather than a made-up one.
//!
//! Why this file stays whole: it is one idea, the exposition `encode` writes from one
//! scrape's readings (the status, the backup jobs, `volume`, `certificates`); about 420 of
//! its lines are its unit tests, which parse what it writes back into samples.

use pgop_api::instance_status::{BackupJob, BackupJobPhase, PgRole, PgStatus};
use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64};

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of one series, beyond the registry's own `cluster` and `instance`.
type Labels = Vec<(&'static str, String)>;
type IntGauge = Family<Labels, Gauge<i64, AtomicI64>>;
type FloatGauge = Family<Labels, Gauge<f64, AtomicU64>>;
type IntCounter = Family<Labels, Counter<u64, AtomicU64>>;

/// What one scrape reads besides the status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Manager<'a> {
    /// The PostgresCluster this instance belongs to.
    pub cluster: &'a str,
    /// How often the supervisor restarted a crashed postmaster since the manager started.
    pub crash_restarts: u32,
    /// The filesystem PGDATA is on; `None` when statvfs failed.
    pub volume: Option<Volume>,
    /// The WAL volume's filesystem (`spec.walStorage`); `None` without one.
    pub wal_volume: Option<Volume>,
    /// PostgreSQL's certificates as served, by name (`server`, `replication`), and when
    /// each expires; those that could not be read are left out.
    pub certificates: &'a [(&'static str, jiff::Timestamp)],
}

/// The size and usage of a filesystem, as statvfs(3) reports it.
pub use pgop_backup::disk::Usage as Volume;

/// statvfs(3) of the filesystem `path` is on; of its nearest existing ancestor while
/// `path` does not exist (PGDATA before initdb creates it, below the volume's mount).
pub fn volume(path: &Path) -> Option<Volume> {
    pgop_backup::disk::usage(path)
}

/// When each of PostgreSQL's certificates in `files` expires: the server certificate it
/// serves (`server`) and the replication client certificate (`replication`). A file that
/// is missing (before the manager wrote it, or without TLS) or unreadable is left out.
pub fn certificates(files: &crate::config::TlsFiles) -> Vec<(&'static str, jiff::Timestamp)> {
    [
        ("server", &files.server_cert),
        ("replication", &files.replication_cert),
    ]
    .into_iter()
    .filter_map(|(name, path)| {
        let pem = std::fs::read_to_string(path).ok()?;
        match pgop_tls::not_after(&pem, "certificate") {
            Ok(at) => Some((name, at)),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "unreadable certificate");
                None
            }
        }
    })
    .collect()
}

/// Registers families on a registry with the `pgop` prefix and the constant labels.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn int(&mut self, name: &str, help: &str) -> IntGauge {
        let family = IntGauge::default();
        self.registry.register(name, help, family.clone());
        family
    }

    /// `<prefix>_{capacity,used,available}_bytes` of the filesystem `what` names, from
    /// statvfs; no series when `usage` is unknown.
    fn volume(&mut self, prefix: &str, what: &str, usage: Option<Volume>) {
        let capacity = self.int_with_unit(
            &format!("{prefix}_capacity"),
            &format!("Size of {what}"),
            Unit::Bytes,
        );
        let used = self.int_with_unit(
            &format!("{prefix}_used"),
            &format!("Bytes in use on {what}"),
            Unit::Bytes,
        );
        let available = self.int_with_unit(
            &format!("{prefix}_available"),
            &format!("Bytes PostgreSQL may still write on {what}; less than capacity minus used by the blocks reserved for root"),
            Unit::Bytes,
        );
        if let Some(v) = usage {
            let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            set(&capacity, vec![], bytes(v.capacity_bytes));
            set(&used, vec![], bytes(v.used_bytes));
            set(&available, vec![], bytes(v.available_bytes));
        }
    }

    fn int_with_unit(&mut self, name: &str, help: &str, unit: Unit) -> IntGauge {
        let family = IntGauge::default();
        self.registry
            .register_with_unit(name, help, unit, family.clone());
        family
    }

    fn float_with_unit(&mut self, name: &str, help: &str, unit: Unit) -> FloatGauge {
        let family = FloatGauge::default();
        self.registry
            .register_with_unit(name, help, unit, family.clone());
        family
    }

    /// `name` without `_total`: the encoder appends it.
    fn counter(&mut self, name: &str, help: &str) -> IntCounter {
        let family = IntCounter::default();
        self.registry.register(name, help, family.clone());
        family
    }
}

fn set(family: &IntGauge, labels: Labels, value: i64) {
    family.get_or_create(&labels).set(value);
}

fn set_f(family: &FloatGauge, labels: Labels, value: f64) {
    family.get_or_create(&labels).set(value);
}

fn count(family: &IntCounter, labels: Labels, value: u64) {
    family.get_or_create(&labels).inc_by(value);
}

/// An RFC 3339 time as seconds since the Unix epoch (with its fraction).
fn epoch_seconds(rfc3339: &str) -> Option<f64> {
    let at: jiff::Timestamp = rfc3339.parse().ok()?;
    // Exact for any plausible date: microseconds since 1970 fit in f64's 53 bits.
    Some(at.as_microsecond() as f64 / 1e6)
}

fn role_name(role: PgRole) -> &'static str {
    match role {
        PgRole::Primary => "primary",
        PgRole::Replica => "replica",
        PgRole::DesignatedPrimary => "designated_primary",
        PgRole::Stopped => "stopped",
    }
}

fn phase_name(phase: BackupJobPhase) -> &'static str {
    match phase {
        BackupJobPhase::Running => "running",
        BackupJobPhase::Completed => "completed",
        BackupJobPhase::Failed => "failed",
    }
}

/// The metrics of one scrape, in the OpenMetrics text format (ending with `# EOF`).
pub fn encode(
    status: &PgStatus,
    jobs: &[BackupJob],
    manager: Manager<'_>,
) -> Result<String, std::fmt::Error> {
    let constant = [
        (
            Cow::Borrowed("cluster"),
            Cow::Owned(manager.cluster.to_string()),
        ),
        (
            Cow::Borrowed("instance"),
            Cow::Owned(status.instance.clone()),
        ),
    ];
    let mut b = Builder {
        registry: Registry::with_prefix_and_labels("pgop", constant.into_iter()),
    };

    // The instance.
    let up = b.int("up", "1 when PostgreSQL answers queries, 0 otherwise");
    set(&up, vec![], i64::from(status.running));
    let role = b.int(
        "role",
        "The role PostgreSQL runs in: 1 for the current role (primary, replica, designated_primary or stopped), 0 for the others",
    );
    for r in [
        PgRole::Primary,
        PgRole::Replica,
        PgRole::DesignatedPrimary,
        PgRole::Stopped,
    ] {
        set(
            &role,
            vec![("role", role_name(r).to_string())],
            i64::from(r == status.role),
        );
    }
    let fenced = b.int(
        "fenced",
        "1 while the manager keeps PostgreSQL stopped on purpose (fencing)",
    );
    set(&fenced, vec![], i64::from(status.fenced));
    let pending = b.int(
        "pending_restart",
        "1 when a changed parameter takes effect only after a restart",
    );
    set(&pending, vec![], i64::from(status.pending_restart));
    let invalid = b.int(
        "invalid_parameters",
        "Parameters (and pg_hba rules) of the spec that the server refused and pgop did not write",
    );
    set(
        &invalid,
        vec![],
        i64::try_from(status.invalid_parameters.len()).unwrap_or(i64::MAX),
    );
    let bootstrap = b.int(
        "bootstrap_failing",
        "1 while the last bootstrap of the data directory failed (the manager retries)",
    );
    set(
        &bootstrap,
        vec![],
        i64::from(status.bootstrap_error.is_some()),
    );
    let restarts = b.counter(
        "postgres_crash_restarts",
        "Restarts of a crashed postmaster since the instance manager started",
    );
    count(&restarts, vec![], u64::from(manager.crash_restarts));

    // WAL and replication.
    let timeline = b.int("timeline", "The timeline PostgreSQL is on");
    if let Some(tli) = status.timeline {
        set(&timeline, vec![], tli);
    }
    let position = b.int_with_unit(
        "wal_position",
        "The WAL position as a byte offset: the current LSN on a primary, the last one received on a standby",
        Unit::Bytes,
    );
    if let Some(lsn) = status.wal_position().and_then(|l| i64::try_from(l).ok()) {
        set(&position, vec![], lsn);
    }
    let lag_bytes = b.int_with_unit(
        "replay_lag",
        "On a primary, per connected standby: bytes between the primary's current LSN and the standby's replayed LSN",
        Unit::Bytes,
    );
    let lag_seconds = b.float_with_unit(
        "replay_lag",
        "On a primary, per connected standby: pg_stat_replication.replay_lag (no series while the standby is idle)",
        Unit::Seconds,
    );
    if status.role.leads() {
        for standby in &status.replication {
            let labels = vec![("standby", standby.application_name.clone())];
            if let Some(lag) = standby.replay_lag_bytes {
                set(&lag_bytes, labels.clone(), lag);
            }
            if let Some(lag) = standby.replay_lag_seconds {
                set_f(&lag_seconds, labels, lag);
            }
        }
    }
    let streaming = b.int(
        "replication_streaming",
        "On a standby: 1 while its WAL receiver streams from the primary (a designated primary: from the replica cluster's source)",
    );
    if status.role.in_recovery() {
        set(&streaming, vec![], i64::from(status.streaming));
    }

    // WAL archiving (pg_stat_archiver): no series while PostgreSQL does not answer.
    let configured = b.int(
        "wal_archive_configured",
        "1 when WAL archiving to the backup store is configured (archive_mode on, with pgop's archive_command)",
    );
    let failing = b.int(
        "wal_archive_failing",
        "1 when archiving is configured and the last archive attempt failed (its failure is newer than the last success); the cluster's ContinuousArchiving condition is False meanwhile",
    );
    let archived = b.counter(
        "wal_archived",
        "WAL files archived (pg_stat_archiver.archived_count); resets with the server's statistics",
    );
    let failed = b.counter(
        "wal_archive_failed",
        "Failed attempts to archive a WAL file (pg_stat_archiver.failed_count); resets with the server's statistics",
    );
    let last_archived = b.float_with_unit(
        "wal_last_archived_timestamp",
        "When the last WAL file was archived, seconds since the Unix epoch",
        Unit::Seconds,
    );
    let last_failure = b.float_with_unit(
        "wal_last_archive_failure_timestamp",
        "When the last attempt to archive a WAL file failed, seconds since the Unix epoch",
        Unit::Seconds,
    );
    if let Some(a) = &status.archiving {
        set(&configured, vec![], i64::from(a.configured));
        set(&failing, vec![], i64::from(a.configured && a.failing));
        count(
            &archived,
            vec![],
            u64::try_from(a.archived_count).unwrap_or(0),
        );
        count(&failed, vec![], u64::try_from(a.failed_count).unwrap_or(0));
        if let Some(at) = a.last_archived_time.as_deref().and_then(epoch_seconds) {
            set_f(&last_archived, vec![], at);
        }
        if let Some(at) = a.last_failed_time.as_deref().and_then(epoch_seconds) {
            set_f(&last_failure, vec![], at);
        }
    }

    // The data volume (PGDATA's filesystem); the WAL volume (spec.walStorage) only with one.
    b.volume(
        "volume",
        "the filesystem the data directory (PGDATA) is on",
        manager.volume,
    );
    b.volume(
        "wal_volume",
        "the filesystem of the WAL volume (spec.walStorage) pg_wal links to",
        manager.wal_volume,
    );

    // PostgreSQL's certificates.
    let expiry = b.int_with_unit(
        "certificate_expiry_timestamp",
        "When a certificate PostgreSQL uses expires (server: the one it serves; replication: its client certificate), seconds since the Unix epoch",
        Unit::Seconds,
    );
    for (name, at) in manager.certificates {
        set(
            &expiry,
            vec![("certificate", (*name).to_string())],
            at.as_second(),
        );
    }

    // Base backups this manager ran (`/pg/backups`), as far as it remembers them.
    let by_phase = b.int(
        "backup_jobs",
        "Base backup jobs the instance manager remembers (its last few since it started), by phase",
    );
    for phase in [
        BackupJobPhase::Running,
        BackupJobPhase::Completed,
        BackupJobPhase::Failed,
    ] {
        let n = jobs.iter().filter(|j| j.phase == phase).count();
        set(
            &by_phase,
            vec![("phase", phase_name(phase).to_string())],
            i64::try_from(n).unwrap_or(i64::MAX),
        );
    }
    let last_backup = b.float_with_unit(
        "last_backup_completed_timestamp",
        "When the last base backup this instance manager ran completed, seconds since the Unix epoch",
        Unit::Seconds,
    );
    let completed = jobs
        .iter()
        .filter(|j| j.phase == BackupJobPhase::Completed)
        .filter_map(|j| j.stopped_at.as_deref().and_then(epoch_seconds))
        .reduce(f64::max);
    if let Some(at) = completed {
        set_f(&last_backup, vec![], at);
    }

    let mut out = String::new();
    text::encode(&mut out, &b.registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgop_api::instance_status::{ArchiveStatus, StandbyReplication};

    const DEMO: Manager<'static> = Manager {
        cluster: "demo",
        crash_restarts: 2,
        volume: None,
        wal_volume: None,
        certificates: &[],
    };

    fn standby(name: &str, lag: i64, seconds: Option<f64>) -> StandbyReplication {
        StandbyReplication {
            application_name: name.into(),
            state: "streaming".into(),
            sync_state: "async".into(),
            sent_lsn: Some("0/3000060".into()),
            flush_lsn: Some("0/3000060".into()),
            replay_lsn: Some("0/3000000".into()),
            replay_lag_bytes: Some(lag),
            replay_lag_seconds: seconds,
        }
    }

    fn primary() -> PgStatus {
        let mut s = PgStatus::stopped("demo-1", false);
        s.role = PgRole::Primary;
        s.running = true;
        s.timeline = Some(3);
        s.current_lsn = Some("1/3000060".into());
        s.replication = vec![
            standby("demo-2", 96, Some(0.25)),
            standby("demo-3", 4096, None),
        ];
        s.archiving = Some(ArchiveStatus {
            configured: true,
            failing: true,
            archived_count: 7,
            last_archived_wal: Some("000000030000000100000002".into()),
            last_archived_time: Some("2025-01-31T12:00:00.5Z".into()),
            failed_count: 4,
            last_failed_wal: Some("000000030000000100000003".into()),
            last_failed_time: Some("2025-01-31T12:05:00Z".into()),
        });
        s
    }

    fn job(name: &str, phase: BackupJobPhase, stopped_at: Option<&str>) -> BackupJob {
        let mut job = BackupJob::running(name, Default::default(), "2025-01-31T11:00:00Z");
        job.phase = phase;
        job.stopped_at = stopped_at.map(Into::into);
        job
    }

    /// Checks the exposition's shape: every sample is `name{labels} value` with a known
    /// family, comments are HELP/TYPE/UNIT, and it ends with `# EOF`. Returns the samples.
    fn parse(text: &str) -> Vec<(String, String, f64)> {
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut families = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.splitn(3, ' ');
                match words.next() {
                    Some("EOF") => continue,
                    Some("TYPE") => {
                        let name = words.next().expect("TYPE name");
                        let kind = words.next().expect("TYPE kind");
                        assert!(["gauge", "counter"].contains(&kind), "{line}");
                        families.push((name.to_string(), kind.to_string()));
                    }
                    Some("HELP" | "UNIT") => {
                        assert!(words.next().is_some_and(|n| n.starts_with("pgop_")));
                        assert!(words.next().is_some_and(|h| !h.is_empty()), "{line}");
                    }
                    _ => panic!("unexpected comment: {line}"),
                }
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
            let (name, labels) = series.split_once('{').expect("labels");
            let labels = labels.strip_suffix('}').expect("closing brace");
            assert!(
                name.starts_with("pgop_")
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            for label in labels.split(',') {
                let (key, value) = label.split_once('=').expect("key=value");
                assert!(key.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
                assert!(value.starts_with('"') && value.ends_with('"'), "{line}");
            }
            assert!(
                families.iter().any(|(family, kind)| match kind.as_str() {
                    "counter" => name.strip_suffix("_total") == Some(family),
                    _ => name == family,
                }),
                "{name} has no TYPE before it"
            );
            samples.push((name.to_string(), labels.to_string(), value));
        }
        samples
    }

    /// The value of the one sample `name` with exactly these labels, if any.
    fn value(samples: &[(String, String, f64)], name: &str, labels: &str) -> Option<f64> {
        let found: Vec<f64> = samples
            .iter()
            .filter(|(n, l, _)| n == name && l == labels)
            .map(|(_, _, v)| *v)
            .collect();
        assert!(found.len() <= 1, "{name}{{{labels}}} twice");
        found.first().copied()
    }

    const BASE: &str = r#"cluster="demo",instance="demo-1""#;

    #[test]
    fn a_primary_with_two_standbys_and_failing_archiving() {
        let jobs = [
            job(
                "b1",
                BackupJobPhase::Completed,
                Some("2025-01-31T10:00:00Z"),
            ),
            job("b2", BackupJobPhase::Failed, Some("2025-01-31T10:30:00Z")),
            job(
                "b3",
                BackupJobPhase::Completed,
                Some("2025-01-31T11:00:00Z"),
            ),
            job("b4", BackupJobPhase::Running, None),
        ];
        let text = encode(&primary(), &jobs, DEMO).expect("encode");
        for line in [
            r#"pgop_up{cluster="demo",instance="demo-1"} 1"#,
            r#"pgop_fenced{cluster="demo",instance="demo-1"} 0"#,
            r#"pgop_pending_restart{cluster="demo",instance="demo-1"} 0"#,
            r#"pgop_timeline{cluster="demo",instance="demo-1"} 3"#,
            r#"pgop_wal_position_bytes{cluster="demo",instance="demo-1"} 4345299040"#,
            r#"pgop_replay_lag_bytes{cluster="demo",instance="demo-1",standby="demo-2"} 96"#,
            r#"pgop_replay_lag_bytes{cluster="demo",instance="demo-1",standby="demo-3"} 4096"#,
            r#"pgop_wal_archive_configured{cluster="demo",instance="demo-1"} 1"#,
            r#"pgop_wal_archive_failing{cluster="demo",instance="demo-1"} 1"#,
            r#"pgop_wal_archived_total{cluster="demo",instance="demo-1"} 7"#,
            r#"pgop_wal_archive_failed_total{cluster="demo",instance="demo-1"} 4"#,
            r#"pgop_postgres_crash_restarts_total{cluster="demo",instance="demo-1"} 2"#,
            "# TYPE pgop_wal_archived counter",
            "# TYPE pgop_wal_archive_failing gauge",
            "# UNIT pgop_wal_position_bytes bytes",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        let samples = parse(&text);
        let v = |name: &str, extra: &str| value(&samples, name, &format!("{BASE}{extra}"));
        assert_eq!(v("pgop_role", r#",role="primary""#), Some(1.0));
        assert_eq!(v("pgop_role", r#",role="replica""#), Some(0.0));
        assert_eq!(v("pgop_role", r#",role="stopped""#), Some(0.0));
        assert_eq!(
            v("pgop_replay_lag_seconds", r#",standby="demo-2""#),
            Some(0.25)
        );
        assert_eq!(v("pgop_replay_lag_seconds", r#",standby="demo-3""#), None);
        assert_eq!(
            v("pgop_wal_last_archived_timestamp_seconds", ""),
            Some(1738324800.5)
        );
        assert_eq!(
            v("pgop_wal_last_archive_failure_timestamp_seconds", ""),
            Some(1738325100.0)
        );
        assert_eq!(v("pgop_backup_jobs", r#",phase="completed""#), Some(2.0));
        assert_eq!(v("pgop_backup_jobs", r#",phase="failed""#), Some(1.0));
        assert_eq!(v("pgop_backup_jobs", r#",phase="running""#), Some(1.0));
        assert_eq!(
            v("pgop_last_backup_completed_timestamp_seconds", ""),
            Some(1738321200.0),
            "the newest completed job, not the failed one after it"
        );
        // A primary has no streaming series.
        assert_eq!(v("pgop_replication_streaming", ""), None);
        // Every series carries the cluster and instance labels.
        assert!(samples.iter().all(|(_, l, _)| l.starts_with(BASE)));
    }

    #[test]
    fn a_stopped_instance_is_down_without_lag_or_archive_series() {
        let text = encode(&PgStatus::stopped("demo-1", true), &[], DEMO).expect("encode");
        let samples = parse(&text);
        let v = |name: &str, extra: &str| value(&samples, name, &format!("{BASE}{extra}"));
        assert!(
            text.lines()
                .any(|l| l == r#"pgop_up{cluster="demo",instance="demo-1"} 0"#),
            "{text}"
        );
        assert_eq!(v("pgop_fenced", ""), Some(1.0));
        assert_eq!(v("pgop_role", r#",role="stopped""#), Some(1.0));
        assert_eq!(v("pgop_role", r#",role="primary""#), Some(0.0));
        assert_eq!(v("pgop_backup_jobs", r#",phase="completed""#), Some(0.0));
        for absent in [
            "pgop_replay_lag_bytes",
            "pgop_replay_lag_seconds",
            "pgop_replication_streaming",
            "pgop_timeline",
            "pgop_wal_position_bytes",
            "pgop_wal_archive_configured",
            "pgop_wal_archive_failing",
            "pgop_wal_archived_total",
            "pgop_last_backup_completed_timestamp_seconds",
        ] {
            assert!(
                samples.iter().all(|(n, _, _)| n != absent),
                "{absent} in\n{text}"
            );
        }
        // A family without a series is left out altogether.
        assert!(!text.contains("pgop_replay_lag_bytes"), "{text}");
    }

    #[test]
    fn a_streaming_standby_reports_its_received_position() {
        let mut s = PgStatus::stopped("demo-2", false);
        s.role = PgRole::Replica;
        s.running = true;
        s.in_recovery = true;
        s.streaming = true;
        s.received_lsn = Some("0/3000060".into());
        s.replayed_lsn = Some("0/3000000".into());
        s.archiving = Some(ArchiveStatus {
            configured: true,
            ..ArchiveStatus::default()
        });
        let text = encode(&s, &[], DEMO).expect("encode");
        let samples = parse(&text);
        let base = r#"cluster="demo",instance="demo-2""#;
        let v = |name: &str| value(&samples, name, base);
        assert_eq!(v("pgop_replication_streaming"), Some(1.0));
        assert_eq!(v("pgop_wal_position_bytes"), Some(f64::from(0x3000060)));
        assert_eq!(
            value(&samples, "pgop_role", &format!(r#"{base},role="replica""#)),
            Some(1.0)
        );
        assert_eq!(v("pgop_wal_archive_failing"), Some(0.0));
        assert_eq!(v("pgop_wal_archived_total"), Some(0.0));
        assert_eq!(v("pgop_wal_last_archived_timestamp_seconds"), None);
    }

    #[test]
    fn a_stale_failure_with_archiving_off_is_not_failing() {
        let mut s = primary();
        if let Some(a) = s.archiving.as_mut() {
            a.configured = false;
        }
        let samples = parse(&encode(&s, &[], DEMO).expect("encode"));
        assert_eq!(value(&samples, "pgop_wal_archive_failing", BASE), Some(0.0));
        assert_eq!(
            value(&samples, "pgop_wal_archive_failed_total", BASE),
            Some(4.0)
        );
    }

    #[test]
    fn the_data_volume_and_the_certificates_are_reported() {
        let server: jiff::Timestamp = "2027-03-01T00:00:00Z".parse().expect("timestamp");
        let replication: jiff::Timestamp = "2027-02-01T00:00:00Z".parse().expect("timestamp");
        let manager = Manager {
            volume: Some(Volume {
                capacity_bytes: 10 << 30,
                used_bytes: 9 << 30,
                available_bytes: 512 << 20,
            }),
            certificates: &[("server", server), ("replication", replication)],
            ..DEMO
        };
        // Known whether PostgreSQL runs or not.
        let text = encode(&PgStatus::stopped("demo-1", false), &[], manager).expect("encode");
        let samples = parse(&text);
        let v = |name: &str, extra: &str| value(&samples, name, &format!("{BASE}{extra}"));
        assert_eq!(v("pgop_volume_capacity_bytes", ""), Some(10_737_418_240.0));
        assert_eq!(v("pgop_volume_used_bytes", ""), Some(9_663_676_416.0));
        assert_eq!(v("pgop_volume_available_bytes", ""), Some(536_870_912.0));
        let with_wal = Manager {
            wal_volume: Some(Volume {
                capacity_bytes: 2 << 30,
                used_bytes: 1 << 30,
                available_bytes: 1 << 30,
            }),
            ..manager
        };
        let wal =
            parse(&encode(&PgStatus::stopped("demo-1", false), &[], with_wal).expect("encode"));
        let w = |name: &str| value(&wal, name, BASE);
        assert_eq!(w("pgop_wal_volume_capacity_bytes"), Some(2_147_483_648.0));
        assert_eq!(w("pgop_wal_volume_used_bytes"), Some(1_073_741_824.0));
        assert_eq!(w("pgop_wal_volume_available_bytes"), Some(1_073_741_824.0));
        assert_eq!(
            v(
                "pgop_certificate_expiry_timestamp_seconds",
                r#",certificate="server""#
            ),
            Some(1_803_859_200.0)
        );
        assert_eq!(
            v(
                "pgop_certificate_expiry_timestamp_seconds",
                r#",certificate="replication""#
            ),
            Some(1_801_440_000.0)
        );
        assert!(
            text.lines()
                .any(|l| l == "# UNIT pgop_volume_capacity_bytes bytes"),
            "{text}"
        );
        // Unknown: no series, not zeros.
        let text = encode(&primary(), &[], DEMO).expect("encode");
        for absent in [
            "pgop_volume_",
            "pgop_wal_volume_",
            "pgop_certificate_expiry",
        ] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
    }

    /// A directory of its own under the system's temporary directory, removed on drop.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(label: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "pgop-metrics-{label}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("a temporary directory");
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn statvfs_reads_the_volume_of_a_directory_or_of_its_nearest_ancestor() {
        let dir = TempDir::new("volume");
        let v = volume(&dir.0).expect("statvfs of a directory");
        assert!(v.capacity_bytes > 0, "{v:?}");
        assert!(v.used_bytes <= v.capacity_bytes, "{v:?}");
        assert!(
            v.available_bytes <= v.capacity_bytes - v.used_bytes,
            "{v:?}"
        );
        // PGDATA before initdb: the volume it will be on.
        let later = volume(&dir.0.join("pgdata/not/yet")).expect("an ancestor's");
        assert_eq!(later.capacity_bytes, v.capacity_bytes);
    }

    #[test]
    fn the_certificates_are_read_from_the_files_postgresql_uses() {
        let dir = TempDir::new("certificates");
        let layout = crate::config::Layout {
            instance: "demo-1".into(),
            cluster: "demo".into(),
            pgdata: dir.0.join("pgdata"),
            listen_addresses: "127.0.0.1".into(),
            port: 5432,
            socket_dir: dir.0.clone(),
            wal_dir: None,
        };
        let files = crate::config::tls_files(&layout);
        // Before the manager wrote them: nothing.
        assert_eq!(certificates(&files), []);
        let now = jiff::Timestamp::now();
        let ca = pgop_tls::Authority::generate_postgres(now).expect("authority");
        let server = ca
            .issue_postgres_server(&["demo-rw".to_string()], now, 90)
            .expect("server certificate");
        // The server's with its chain, as a brought certificate may be.
        std::fs::write(
            &files.server_cert,
            format!("{}{}", server.cert_pem, ca.cert_pem()),
        )
        .expect("write");
        assert_eq!(certificates(&files), [("server", server.not_after)]);
        std::fs::write(&files.replication_cert, "garbage").expect("write");
        assert_eq!(
            certificates(&files),
            [("server", server.not_after)],
            "an unreadable one is left out"
        );
        let replication = ca
            .issue_postgres_client("streaming_replica", now, 30)
            .expect("client certificate");
        std::fs::write(&files.replication_cert, &replication.cert_pem).expect("write");
        assert_eq!(
            certificates(&files),
            [
                ("server", server.not_after),
                ("replication", replication.not_after)
            ]
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = primary();
        s.replication = vec![standby("we\"ird\\name", 1, None)];
        let text = encode(&s, &[], DEMO).expect("encode");
        assert!(text.contains(r#"standby="we\"ird\\name"} 1"#), "{text}");
    }
}
