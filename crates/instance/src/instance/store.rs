//! What an instance does with the backup store: the archiving configuration, the restore
//! bootstrap from a backup, backups and the restore check on request, retention.

use super::{Error, Instance};
use crate::backups::{self, Begin};
use crate::bootstrap;
use crate::config::{Layout, Mode};
use crate::pg::RunAs;
use pgop_api::backup::BackupMethod;
use pgop_api::instance_status::RetentionDone;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a base backup was not started (`POST /pg/backups`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackupRefused {
    #[error("no backup store is configured for this cluster: set spec.backup.store")]
    NoStore,
    #[error("PostgreSQL is not running on this instance")]
    NotRunning,
}

/// A restore from a backup store as the first primary's bootstrap
/// (`spec.bootstrap.recovery`, resolved by the operator into `status.recoverySource`).
#[derive(Debug, Clone)]
pub struct Recovery {
    /// The source cluster's store (its `cluster` is the source cluster's name).
    pub source: pgop_backup::StoreConfig,
    /// The backup; else the latest completed one before the target.
    pub backup_id: Option<String>,
    pub target: pgop_backup::Target,
    /// The `pgop` binary the restore's `restore_command` runs (`pgop instance wal-restore`).
    pub pgop_binary: PathBuf,
    /// How long replaying the WAL may take.
    pub timeout: Duration,
}

/// Whether two store configurations name the same archive: the same bucket (endpoint) or
/// directory, key prefix and cluster name. Credentials and region do not matter.
pub fn same_archive(a: &pgop_backup::StoreConfig, b: &pgop_backup::StoreConfig) -> bool {
    use pgop_backup::Location;
    let location = match (&a.location, &b.location) {
        (Location::S3(x), Location::S3(y)) => x.bucket == y.bucket && x.endpoint == y.endpoint,
        (Location::Local { path: x }, Location::Local { path: y }) => x == y,
        _ => false,
    };
    let prefix = |c: &pgop_backup::StoreConfig| {
        c.prefix
            .as_deref()
            .map(|p| p.trim_matches('/').to_string())
            .filter(|p| !p.is_empty())
    };
    location && prefix(a) == prefix(b) && a.cluster == b.cluster
}

/// Marks every timeline history file in `pg_wal` ready for archiving. A restore ends on a
/// new timeline while archiving is off, so PostgreSQL never queues its history file; the
/// archiver picks these up (history files first) once the primary archives. Any `.done`
/// from the restore goes: the new cluster's archive gets the whole history chain.
fn mark_history_for_archiving(pgdata: &Path, run_as: Option<RunAs>) -> std::io::Result<()> {
    let wal = pgdata.join("pg_wal");
    let status = wal.join("archive_status");
    if !status.is_dir() {
        std::fs::create_dir_all(&status)?;
        if let Some(user) = run_as {
            user.chown(&status)?;
        }
    }
    for entry in std::fs::read_dir(&wal)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if pgop_backup::WalName::parse(name).is_none_or(|w| w.position.is_some()) {
            continue;
        }
        let _ = std::fs::remove_file(status.join(format!("{name}.done")));
        let ready = status.join(format!("{name}.ready"));
        std::fs::write(&ready, b"")?;
        if let Some(user) = run_as {
            user.chown(&ready)?;
        }
    }
    Ok(())
}

/// WAL archiving: the backup store and the `pgop` binary PostgreSQL's `archive_command`
/// runs (`pgop instance wal-archive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archiving {
    pub store: pgop_backup::StoreConfig,
    pub pgop_binary: PathBuf,
}

/// Where the manager writes the backup store's configuration for `archive_command`: in the
/// socket directory (private to PostgreSQL's OS user, not on the data volume, never in a
/// base backup), mode 0600.
pub fn store_config_path(layout: &Layout) -> PathBuf {
    layout.socket_dir.join("pgop-backup-store.json")
}

/// `'<pgop>' instance wal-archive --store-config '<file>' %p`, quoted for the shell and
/// with `%` doubled where PostgreSQL would substitute it.
pub fn archive_command(pgop_binary: &Path, store_config: &Path) -> String {
    let arg =
        |p: &Path| pgop_backup::restore::shell_quote(&p.display().to_string().replace('%', "%%"));
    format!(
        "{} instance wal-archive --store-config {} %p",
        arg(pgop_binary),
        arg(store_config)
    )
}

impl Instance {
    /// The first primary from a backup: the source's base backup restored and its WAL
    /// replayed to the target (`pgop_backup::restore`), then started as a primary on the
    /// new timeline with this cluster's own archiving (the history files queued for it)
    /// and the application and replication roles given this cluster's passwords (created
    /// when missing). Under the bootstrap marker: a restore interrupted halfway is redone
    /// from scratch, and a failed one leaves an empty data directory. Refused when this
    /// cluster archives into the source's own archive.
    pub async fn bootstrap_recovery(
        &self,
        recovery: &Recovery,
    ) -> Result<pgop_backup::Restored, Error> {
        let _op = self.ops.lock().await;
        let o = &self.options;
        if let Some(own) = self.archiving()
            && same_archive(&own.store, &recovery.source)
        {
            return Err(Error::RestoreIntoSource(recovery.source.cluster.clone()));
        }
        self.desired().mode = Mode::Primary;
        let pgdata = &o.layout.pgdata;
        bootstrap::begin(pgdata, o.run_as).map_err(Error::Bootstrap)?;
        let options = pgop_backup::RestoreOptions {
            backup_id: recovery.backup_id.clone(),
            target: recovery.target.clone(),
            pgop_binary: recovery.pgop_binary.clone(),
            // Private to PostgreSQL's OS user, never on the data volume; removed after.
            store_config_file: o.layout.socket_dir.join("pgop-restore-store.json"),
            timeout: recovery.timeout,
            // The instance's own socket directory: short, private, and free (PostgreSQL is
            // not running during a bootstrap).
            socket_dir: Some(o.layout.socket_dir.clone()),
        };
        // On failure the data directory is emptied (the marker stays: never started).
        let restored =
            pgop_backup::restore::restore(&recovery.source, &self.tools(), pgdata, &options)
                .await
                .map_err(Error::Restore)?;
        self.desired().bootstrap_error = None;
        let started = async {
            mark_history_for_archiving(pgdata, o.run_as).map_err(Error::MarkHistory)?;
            let client = self.start_postmaster().await?;
            // The restored data has the source's roles: this cluster's Secrets must work.
            bootstrap::initdb::create_roles(&client, &o.credentials)
                .await
                .map_err(Error::Bootstrap)?;
            client
                .batch_execute("CHECKPOINT")
                .await
                .map_err(|e| Error::Bootstrap(bootstrap::Error::CreateRoles(e)))
        };
        if let Err(err) = started.await {
            if self.supervisor.stop().await.is_ok() {
                // Leave no restored data behind either: the next attempt starts afresh.
                let _ = bootstrap::begin(pgdata, o.run_as);
            }
            return Err(err);
        }
        bootstrap::finish(pgdata).map_err(Error::Bootstrap)?;
        Ok(restored)
    }

    /// Records (or clears) why the last bootstrap failed, shown on `/pg/status`.
    pub fn set_bootstrap_error(&self, error: Option<String>) {
        self.desired().bootstrap_error = error;
    }

    /// PostgreSQL's programs for pgop-backup.
    pub(super) fn tools(&self) -> pgop_backup::PgTools {
        pgop_backup::PgTools {
            bin_dir: self.options.binaries.dir().to_path_buf(),
            run_as: self.options.run_as.map(|u| (u.uid, u.gid)),
        }
    }

    /// `POST /pg/backups`: starts a base backup named `name` into the cluster's store in
    /// the background, unless a job of that name exists (returned as it is) or another one
    /// runs. Works on a primary or a standby (a standby's end WAL segment reaches the store
    /// through the primary's archiver; the backup waits for it). With `verify`, the same
    /// job then runs the restore check ([`Instance::verify_backup`]) before it completes.
    /// A logical backup (`pg_dump` of every database) ignores `verify`.
    pub fn start_backup(
        &self,
        name: &str,
        method: BackupMethod,
        verify: bool,
    ) -> Result<Begin, BackupRefused> {
        let jobs = self.backups.clone();
        let mut locked = jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(job) = locked.get(name) {
            return Ok(Begin::Existing(job));
        }
        let Some(archiving) = self.archiving() else {
            return Err(BackupRefused::NoStore);
        };
        if self.pid().is_none() {
            return Err(BackupRefused::NotRunning);
        }
        let begin = locked.begin(name, method, &backups::now());
        drop(locked);
        if let Begin::Started(_) = &begin {
            let tools = self.tools();
            let source = pgop_backup::Source {
                socket_dir: self.options.layout.socket_dir.clone(),
                port: self.options.layout.port,
            };
            if method == BackupMethod::Logical {
                let config = archiving.store;
                let name = name.to_string();
                tokio::spawn(async move {
                    tracing::info!(backup = %name, "taking a logical backup on request");
                    let taken = async {
                        let store = pgop_backup::Store::open(&config)
                            .map_err(|e| crate::error_chain(&e))?;
                        pgop_backup::logical::take(&store, &tools, &source, &config.cluster)
                            .await
                            .map_err(|e| crate::error_chain(&e))
                    }
                    .await;
                    match &taken {
                        Ok(m) => {
                            tracing::info!(backup = %name, backup_id = %m.backup_id, databases = m.databases.len(), "logical backup completed")
                        }
                        Err(e) => {
                            tracing::error!(backup = %name, error = %e, "logical backup failed")
                        }
                    }
                    jobs.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .finish_logical(
                            &name,
                            taken.as_ref().map_err(Clone::clone),
                            &backups::now(),
                        );
                });
                return Ok(begin);
            }
            let check = verify.then(|| backups::Check {
                pgdata: self.options.layout.pgdata.clone(),
                socket_dir: self.options.layout.socket_dir.clone(),
                pgop_binary: archiving.pgop_binary.clone(),
            });
            let config = archiving.store;
            let name = name.to_string();
            tokio::spawn(async move {
                tracing::info!(backup = %name, verify, "taking a base backup on request");
                let taken = async {
                    let store = pgop_backup::Store::open(&config)?;
                    pgop_backup::base::take(
                        &store,
                        &tools,
                        &source,
                        &config.cluster,
                        &pgop_backup::TakeOptions::default(),
                    )
                    .await
                }
                .await;
                let manifest = match taken {
                    Ok(manifest) => {
                        tracing::info!(backup = %name, backup_id = %manifest.backup_id, "base backup completed");
                        manifest
                    }
                    Err(err) => {
                        let chain = crate::error_chain(&err);
                        tracing::error!(backup = %name, error = %chain, "base backup failed");
                        jobs.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .finish(&name, Err(chain), &backups::now());
                        return;
                    }
                };
                let Some(check) = check else {
                    jobs.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .finish(&name, Ok(&manifest), &backups::now());
                    return;
                };
                jobs.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .taken(&name, &manifest);
                let result = match check.run(&config, &tools, &manifest.backup_id).await {
                    Ok(verified) => Ok(verified.summary()),
                    Err(err) => {
                        let chain = crate::error_chain(&err);
                        tracing::error!(backup = %name, backup_id = %manifest.backup_id, error = %chain, "restore check failed");
                        Err(chain)
                    }
                };
                jobs.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .verified(&name, result, &backups::now());
            });
        }
        Ok(begin)
    }

    /// The restore check of backup `backup_id` in this cluster's store (see
    /// `pgop_backup::verify`): restored into `<PGDATA parent>/verify-<id>` to its
    /// consistent end, checked with `pg_checksums --check`, the scratch copy removed.
    pub async fn verify_backup(&self, backup_id: &str) -> Result<pgop_backup::Verified, Error> {
        let Some(archiving) = self.archiving() else {
            return Err(Error::NoStore);
        };
        let check = backups::Check {
            pgdata: self.options.layout.pgdata.clone(),
            socket_dir: self.options.layout.socket_dir.clone(),
            pgop_binary: archiving.pgop_binary.clone(),
        };
        check
            .run(&archiving.store, &self.tools(), backup_id)
            .await
            .map_err(Error::Verify)
    }

    /// `POST /pg/retention`: the cluster's retention applied to its store from here (this
    /// manager mounts the store whatever its kind): base backups older than
    /// `retention_days` with the WAL only they need, and logical backups older than that;
    /// never the newest completed backup of either method.
    pub async fn retention(&self, retention_days: u32) -> Result<RetentionDone, Error> {
        let Some(archiving) = self.archiving() else {
            return Err(Error::NoStore);
        };
        let store = pgop_backup::Store::open(&archiving.store)
            .map_err(|e| Error::Retention(crate::error_chain(&e)))?;
        let now = jiff::Timestamp::now();
        let plan = pgop_backup::retention::apply(&store, now, retention_days)
            .await
            .map_err(|e| Error::Retention(crate::error_chain(&e)))?;
        let logical = pgop_backup::logical::apply_retention(&store, now, retention_days, false)
            .await
            .map_err(|e| Error::Retention(crate::error_chain(&e)))?;
        Ok(RetentionDone {
            base_backups: plan.delete_backups,
            logical_backups: logical.deleted,
            wal_files: plan.delete_wal.len(),
        })
    }

    /// `GET /pg/backups/<name>`: a job this manager knows (the last few).
    pub fn backup_job(&self, name: &str) -> Option<pgop_api::instance_status::BackupJob> {
        self.backups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
    }

    /// Every backup job this manager remembers (the last few), oldest first.
    pub fn backup_jobs(&self) -> Vec<pgop_api::instance_status::BackupJob> {
        self.backups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .all()
            .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgop_backup::{Location, S3Location, StoreConfig};

    fn s3(bucket: &str, prefix: Option<&str>, cluster: &str, key: &str) -> StoreConfig {
        StoreConfig {
            format: pgop_backup::config::CONFIG_FORMAT,
            location: Location::S3(S3Location {
                bucket: bucket.into(),
                endpoint: Some("http://s3:9000".into()),
                region: None,
                access_key_id: key.into(),
                secret_access_key: "s".into(),
                insecure_skip_tls_verify: false,
            }),
            prefix: prefix.map(str::to_string),
            cluster: cluster.into(),
        }
    }

    #[test]
    fn the_same_archive_is_bucket_prefix_and_cluster_whatever_the_credentials() {
        let source = s3("b", Some("prod"), "src", "k1");
        assert!(same_archive(&source, &s3("b", Some("/prod/"), "src", "k2")));
        assert!(!same_archive(&source, &s3("b", Some("prod"), "new", "k1")));
        assert!(!same_archive(&source, &s3("b", None, "src", "k1")));
        assert!(!same_archive(&source, &s3("c", Some("prod"), "src", "k1")));
        assert!(!same_archive(&source, &StoreConfig::local("/b", "src")));
        assert!(same_archive(
            &StoreConfig::local("/b", "src"),
            &StoreConfig::local("/b", "src")
        ));
    }

    #[test]
    fn history_files_are_queued_for_archiving() {
        let dir = std::env::temp_dir().join(format!("pgop-history-{}", std::process::id()));
        let status = dir.join("pg_wal/archive_status");
        std::fs::create_dir_all(&status).expect("dirs");
        for f in [
            "00000002.history",
            "00000003.history",
            "000000030000000000000005",
        ] {
            std::fs::write(dir.join("pg_wal").join(f), b"x").expect("file");
        }
        std::fs::write(status.join("00000002.history.done"), b"").expect("done");
        mark_history_for_archiving(&dir, None).expect("mark");
        assert!(status.join("00000002.history.ready").exists());
        assert!(!status.join("00000002.history.done").exists());
        assert!(status.join("00000003.history.ready").exists());
        assert!(!status.join("000000030000000000000005.ready").exists());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
