//! Backups on request (`POST /pg/backups`), base or logical: one at a time, in a background
//! task, into the cluster's own store (the one WAL is archived to), with the last
//! [`KEEP_JOBS`] jobs kept in memory for `GET /pg/backups/<name>`. The bookkeeping
//! ([`Jobs`]) is pure and unit-tested; the task runs `pgop_backup::base::take` or
//! `pgop_backup::logical::take`. A manager that restarts forgets its jobs: the operator
//! sees 404 and marks the backup failed.

use pgop_api::backup::BackupMethod;
use pgop_api::instance_status::{BackupJob, BackupJobPhase};
use pgop_backup::Manifest;
use pgop_backup::logical::LogicalManifest;

/// How many jobs (finished ones, plus the running one) are remembered.
pub const KEEP_JOBS: usize = 20;

/// The outcome of asking for a backup.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// A new job, now running: 202.
    Started(BackupJob),
    /// A job of that name exists (in any phase): 200, the same job.
    Existing(BackupJob),
    /// Another backup is running: 409.
    Busy { running: String },
}

/// The jobs this manager knows, oldest first.
#[derive(Debug, Default)]
pub struct Jobs {
    jobs: Vec<BackupJob>,
}

impl Jobs {
    /// Registers a job named `name` unless it exists or another one runs; `now` is RFC 3339.
    pub fn begin(&mut self, name: &str, method: BackupMethod, now: &str) -> Begin {
        if let Some(job) = self.get(name) {
            return Begin::Existing(job);
        }
        if let Some(running) = self
            .jobs
            .iter()
            .find(|j| j.phase == BackupJobPhase::Running)
        {
            return Begin::Busy {
                running: running.name.clone(),
            };
        }
        let job = BackupJob::running(name, method, now);
        self.jobs.push(job.clone());
        // Forget the oldest finished jobs (never the running one).
        while self.jobs.len() > KEEP_JOBS {
            match self
                .jobs
                .iter()
                .position(|j| j.phase != BackupJobPhase::Running)
            {
                Some(at) => {
                    self.jobs.remove(at);
                }
                None => break,
            }
        }
        Begin::Started(job)
    }

    /// Records the end of job `name`: the manifest of a completed backup, or the error chain.
    pub fn finish(&mut self, name: &str, result: Result<&Manifest, String>, now: &str) {
        let Some(job) = self.jobs.iter_mut().find(|j| j.name == name) else {
            return;
        };
        job.stopped_at = Some(now.to_string());
        match result {
            Ok(manifest) => {
                job.phase = BackupJobPhase::Completed;
                record(job, manifest);
            }
            Err(error) => {
                job.phase = BackupJobPhase::Failed;
                job.error = Some(error);
            }
        }
    }

    /// Records the end of logical backup job `name`: its manifest, or the error chain.
    pub fn finish_logical(
        &mut self,
        name: &str,
        result: Result<&LogicalManifest, String>,
        now: &str,
    ) {
        let Some(job) = self.jobs.iter_mut().find(|j| j.name == name) else {
            return;
        };
        job.stopped_at = Some(now.to_string());
        match result {
            Ok(manifest) => {
                job.phase = BackupJobPhase::Completed;
                job.backup_id = Some(manifest.backup_id.clone());
                job.begin_time = Some(manifest.begin_time.clone());
                job.end_time = Some(manifest.end_time.clone());
                job.size_bytes = i64::try_from(manifest.size_bytes()).ok();
                job.stored_bytes = i64::try_from(manifest.stored_bytes()).ok();
                job.databases = manifest.databases.iter().map(|d| d.name.clone()).collect();
            }
            Err(error) => {
                job.phase = BackupJobPhase::Failed;
                job.error = Some(error);
            }
        }
    }

    /// Records the manifest of job `name`'s backup while the job stays `running` (the
    /// restore check follows).
    pub fn taken(&mut self, name: &str, manifest: &Manifest) {
        if let Some(job) = self.jobs.iter_mut().find(|j| j.name == name) {
            record(job, manifest);
        }
    }

    /// Records the restore check of job `name` (the summary, or why the backup cannot be
    /// restored) and completes it: the backup itself succeeded either way.
    pub fn verified(&mut self, name: &str, result: Result<String, String>, now: &str) {
        let Some(job) = self.jobs.iter_mut().find(|j| j.name == name) else {
            return;
        };
        job.stopped_at = Some(now.to_string());
        job.phase = BackupJobPhase::Completed;
        let (verified, verification) = match result {
            Ok(summary) => (true, summary),
            Err(reason) => (false, reason),
        };
        job.verified = Some(verified);
        job.verification = Some(verification);
    }

    pub fn get(&self, name: &str) -> Option<BackupJob> {
        self.jobs.iter().find(|j| j.name == name).cloned()
    }

    /// Every job remembered, oldest first (for `/metrics`).
    pub fn all(&self) -> &[BackupJob] {
        &self.jobs
    }
}

fn record(job: &mut BackupJob, manifest: &Manifest) {
    job.backup_id = Some(manifest.backup_id.clone());
    job.begin_lsn = Some(manifest.begin_lsn.clone());
    job.end_lsn = Some(manifest.end_lsn.clone());
    job.begin_time = Some(manifest.begin_time.clone());
    job.end_time = Some(manifest.end_time.clone());
    job.timeline = Some(i64::from(manifest.timeline));
    job.size_bytes = i64::try_from(manifest.size_bytes).ok();
    job.stored_bytes = i64::try_from(manifest.stored_bytes).ok();
}

/// How long the restore check may take (the restore, then pg_checksums).
pub const VERIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4 * 3600);

/// Where the restore check of this instance works.
#[derive(Debug, Clone)]
pub struct Check {
    /// The instance's PGDATA: the scratch copy goes next to it (same volume).
    pub pgdata: std::path::PathBuf,
    /// The instance's socket directory: the store configuration for `restore_command`
    /// (private, never on the data volume) and the temporary server's own socket directory
    /// (`pgop-verify`) go there.
    pub socket_dir: std::path::PathBuf,
    pub pgop_binary: std::path::PathBuf,
}

impl Check {
    pub async fn run(
        &self,
        config: &pgop_backup::StoreConfig,
        tools: &pgop_backup::PgTools,
        backup_id: &str,
    ) -> Result<pgop_backup::Verified, pgop_backup::verify::Error> {
        let options = pgop_backup::VerifyOptions {
            backup_id: backup_id.to_string(),
            pgop_binary: self.pgop_binary.clone(),
            store_config_file: self.socket_dir.join("pgop-verify-store.json"),
            timeout: VERIFY_TIMEOUT,
            // Not the instance's socket directory: its server runs, maybe on the same port.
            socket_dir: self.socket_dir.join("pgop-verify"),
        };
        pgop_backup::verify::verify(config, tools, &self.pgdata, &options).await
    }
}

/// The current time, RFC 3339 (UTC, whole seconds).
pub fn now() -> String {
    let now = jiff::Timestamp::now();
    now.round(jiff::Unit::Second).unwrap_or(now).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: 1,
            backup_id: "20250131T120304Z".into(),
            cluster: "demo".into(),
            system_identifier: "1".into(),
            timeline: 2,
            begin_lsn: "0/3000028".into(),
            end_lsn: "0/3000100".into(),
            begin_wal: "000000020000000000000003".into(),
            end_wal: "000000020000000000000003".into(),
            begin_time: "2025-01-31T12:03:04Z".into(),
            end_time: "2025-01-31T12:03:09Z".into(),
            size_bytes: 1000,
            stored_bytes: 300,
            postgres_version_num: 150000,
            from_standby: false,
            files: Vec::new(),
        }
    }

    #[test]
    fn the_same_name_is_the_same_job_and_a_second_one_waits() {
        let mut jobs = Jobs::default();
        let Begin::Started(job) =
            jobs.begin("b1", BackupMethod::BaseBackup, "2025-01-31T12:00:00Z")
        else {
            panic!("a new job")
        };
        assert_eq!(job.phase, BackupJobPhase::Running);
        assert_eq!(
            jobs.begin("b1", BackupMethod::BaseBackup, "2025-01-31T12:00:01Z"),
            Begin::Existing(job.clone())
        );
        assert_eq!(
            jobs.begin("b2", BackupMethod::BaseBackup, "2025-01-31T12:00:01Z"),
            Begin::Busy {
                running: "b1".into()
            }
        );
        jobs.finish("b1", Ok(&manifest()), "2025-01-31T12:00:10Z");
        let done = jobs.get("b1").expect("b1");
        assert_eq!(done.phase, BackupJobPhase::Completed);
        assert_eq!(done.backup_id.as_deref(), Some("20250131T120304Z"));
        assert_eq!(done.timeline, Some(2));
        assert_eq!(done.stored_bytes, Some(300));
        assert_eq!(done.stopped_at.as_deref(), Some("2025-01-31T12:00:10Z"));
        // Finished: the same name still answers the same job, a new name may start.
        assert_eq!(
            jobs.begin("b1", BackupMethod::BaseBackup, "2025-01-31T12:00:11Z"),
            Begin::Existing(done)
        );
        assert!(matches!(
            jobs.begin("b2", BackupMethod::BaseBackup, "2025-01-31T12:00:11Z"),
            Begin::Started(_)
        ));
        jobs.finish("b2", Err("pg_basebackup failed: boom".into()), "now");
        let failed = jobs.get("b2").expect("b2");
        assert_eq!(failed.phase, BackupJobPhase::Failed);
        assert_eq!(failed.error.as_deref(), Some("pg_basebackup failed: boom"));
        assert_eq!(failed.backup_id, None);
    }

    #[test]
    fn a_verified_job_stays_running_until_the_check_is_done() {
        let mut jobs = Jobs::default();
        assert!(matches!(
            jobs.begin("v1", BackupMethod::BaseBackup, "t0"),
            Begin::Started(_)
        ));
        jobs.taken("v1", &manifest());
        let taken = jobs.get("v1").expect("v1");
        assert_eq!(taken.phase, BackupJobPhase::Running);
        assert_eq!(taken.backup_id.as_deref(), Some("20250131T120304Z"));
        assert_eq!((taken.verified, taken.stopped_at), (None, None));
        assert!(matches!(
            jobs.begin("v2", BackupMethod::BaseBackup, "t1"),
            Begin::Busy { .. }
        ));
        jobs.verified("v1", Ok("checked 3 blocks".into()), "t2");
        let done = jobs.get("v1").expect("v1");
        assert_eq!(done.phase, BackupJobPhase::Completed);
        assert_eq!(done.verified, Some(true));
        assert_eq!(done.verification.as_deref(), Some("checked 3 blocks"));
        assert_eq!(done.stopped_at.as_deref(), Some("t2"));

        assert!(matches!(
            jobs.begin("v2", BackupMethod::BaseBackup, "t3"),
            Begin::Started(_)
        ));
        jobs.taken("v2", &manifest());
        jobs.verified("v2", Err("corrupt".into()), "t4");
        let bad = jobs.get("v2").expect("v2");
        assert_eq!(bad.phase, BackupJobPhase::Completed);
        assert_eq!(bad.verified, Some(false));
        assert_eq!(bad.verification.as_deref(), Some("corrupt"));
        assert_eq!(bad.error, None);
    }

    #[test]
    fn a_logical_job_records_its_databases_and_sizes() {
        use pgop_backup::logical::{LogicalDatabase, LogicalObject};
        let object = |name: &str, size: u64, stored: u64| LogicalObject {
            object: format!("logical/20250131T120304Z/{name}"),
            size_bytes: size,
            stored_bytes: stored,
            sha256: String::new(),
        };
        let manifest = LogicalManifest {
            format: 1,
            backup_id: "20250131T120304Z".into(),
            cluster: "demo".into(),
            system_identifier: "1".into(),
            server_version_num: 150000,
            begin_time: "2025-01-31T12:03:04Z".into(),
            end_time: "2025-01-31T12:03:09Z".into(),
            globals: object("globals.sql", 100, 50),
            databases: vec![
                LogicalDatabase {
                    name: "app".into(),
                    dump: object("db/app.dump", 1000, 400),
                },
                LogicalDatabase {
                    name: "postgres".into(),
                    dump: object("db/postgres.dump", 10, 10),
                },
            ],
        };
        let mut jobs = Jobs::default();
        let Begin::Started(job) = jobs.begin("l1", BackupMethod::Logical, "t0") else {
            panic!("a new job")
        };
        assert_eq!(job.method, BackupMethod::Logical);
        jobs.finish_logical("l1", Ok(&manifest), "t1");
        let done = jobs.get("l1").expect("l1");
        assert_eq!(done.phase, BackupJobPhase::Completed);
        assert_eq!(done.databases, ["app", "postgres"]);
        assert_eq!(done.size_bytes, Some(manifest.size_bytes() as i64));
        assert_eq!(done.stored_bytes, Some(manifest.stored_bytes() as i64));
        assert_eq!((done.begin_lsn, done.timeline), (None, None));
        assert!(matches!(
            jobs.begin("l2", BackupMethod::Logical, "t2"),
            Begin::Started(_)
        ));
        jobs.finish_logical("l2", Err("pg_dump of app failed: boom".into()), "t3");
        let failed = jobs.get("l2").expect("l2");
        assert_eq!(failed.phase, BackupJobPhase::Failed);
        assert_eq!(failed.error.as_deref(), Some("pg_dump of app failed: boom"));
    }

    #[test]
    fn only_the_last_jobs_are_kept() {
        let mut jobs = Jobs::default();
        for i in 0..KEEP_JOBS + 5 {
            let name = format!("b{i}");
            assert!(matches!(
                jobs.begin(&name, BackupMethod::BaseBackup, "t"),
                Begin::Started(_)
            ));
            jobs.finish(&name, Err("x".into()), "t");
        }
        assert!(jobs.get("b0").is_none());
        assert!(jobs.get("b4").is_none());
        assert!(jobs.get("b5").is_some());
        assert!(jobs.get(&format!("b{}", KEEP_JOBS + 4)).is_some());
        assert_eq!(jobs.jobs.len(), KEEP_JOBS);
    }

    #[test]
    fn now_is_rfc3339_in_whole_seconds() {
        let now = now();
        assert!(now.ends_with('Z') && !now.contains('.'), "{now}");
        assert!(now.parse::<jiff::Timestamp>().is_ok());
    }
}
