//! One PostgreSQL instance and everything the manager does to it, without Kubernetes: the
//! desired role and spec are given by the caller (`run` from the PostgresCluster, tests
//! directly). Operations are serialized. It must never choose a role itself.
//!
//! Why this file stays whole: it is one facade, `Instance`, whose operations share the
//! `ops` lock and the `Desired` state; what each needs beyond that lives in the modules
//! below (down, floors, store, roles, databases, passwords, pooler_auth).

use crate::backups::Jobs;
use crate::bootstrap::{self, Credentials, DataState};
use crate::config::{self, InvalidParameter, Layout, Mode};
use crate::pg::{Binaries, Endpoint, RunAs, Upstream, UpstreamTls, sql};
use crate::role;
use crate::status::{self, PgRole, PgStatus};
use crate::supervisor::{self, Supervisor};
use crate::sync::{self, SyncSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod databases;
pub mod down;
mod floors;
mod passwords;
mod pooler_auth;
mod roles;

pub use roles::Password as RolePassword;
mod store;

pub use store::{
    Archiving, BackupRefused, Recovery, archive_command, same_archive, store_config_path,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to bootstrap the data directory")]
    Bootstrap(#[source] bootstrap::Error),
    #[error("failed to start PostgreSQL: the data directory is {0:?}")]
    DataNotReady(DataState),
    #[error("failed to put the write-ahead log on its volume")]
    PlaceWal(#[source] crate::pg::waldir::Error),
    #[error("failed to start PostgreSQL")]
    StartPostgres(#[source] supervisor::Error),
    #[error("failed to wait for PostgreSQL to accept connections")]
    WaitReady(#[source] sql::Error),
    #[error("failed to stop PostgreSQL")]
    StopPostgres(#[source] supervisor::Error),
    #[error("failed to connect to PostgreSQL")]
    Connect(#[source] sql::Error),
    #[error("failed to write the configuration")]
    WriteConfig(#[source] config::Error),
    #[error("failed to write {0}")]
    WriteSignal(&'static str, #[source] std::io::Error),
    #[error(
        "the replication user or password holds a line break, which a password file cannot \
         hold: set a password without one in the cluster's -replication Secret"
    )]
    PasswordLineBreak,
    #[error("failed to apply the configuration")]
    ApplyConfig(#[source] config::Error),
    #[error("failed to check pg_hba.conf")]
    CheckHba(#[source] tokio_postgres::Error),
    #[error("failed to promote")]
    Promote(#[source] role::Error),
    #[error("failed to manage replication slots")]
    ManageSlots(#[source] role::Error),
    #[error("failed to read the replication state")]
    ReadReplication(#[source] tokio_postgres::Error),
    #[error("failed to read the status")]
    ReadStatus(#[source] status::Error),
    #[error("failed to write the backup store configuration")]
    WriteStoreConfig(#[source] pgop_backup::config::Error),
    #[error("failed to check the new primary before re-cloning from it")]
    ProbePrimary(#[source] sql::Error),
    #[error("failed to restore from the backup store")]
    Restore(#[source] pgop_backup::restore::Error),
    #[error(
        "refusing to restore: the source's store and cluster name ({0}) are this cluster's own archive; give the restored cluster another name or store path"
    )]
    RestoreIntoSource(String),
    #[error("failed to mark the new timeline's history files for archiving")]
    MarkHistory(#[source] std::io::Error),
    #[error("no backup store is configured for this cluster: set spec.backup.store")]
    NoStore,
    #[error("the restore check failed")]
    Verify(#[source] pgop_backup::verify::Error),
    #[error("failed to apply retention to the backup store: {0}")]
    Retention(String),
    #[error("PostgreSQL exited while starting (see its log)")]
    ExitedAtStart,
    #[error(
        "the primary no longer has WAL this standby needs to become consistent (\"requested WAL segment has already been removed\"): it must be cloned afresh"
    )]
    UpstreamWalGone,
    #[error("refusing to restart: {0}")]
    RestartRefused(String),
    #[error("the replica cluster's source cannot be cloned now: {0}")]
    SourceRefuses(String),
    #[error("failed to set a role's password from the cluster's Secret")]
    SetPassword(#[source] tokio_postgres::Error),
    #[error("failed to set up the poolers' password look-up")]
    PoolerAuth(#[source] tokio_postgres::Error),
}

/// Everything about the instance that does not change while it runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub layout: Layout,
    pub binaries: Binaries,
    /// PostgreSQL's OS user when the manager runs as root.
    pub run_as: Option<RunAs>,
    pub credentials: Credentials,
    /// Smart shutdown gets this long, then fast shutdown as long again.
    pub stop_timeout: Duration,
    /// How long PostgreSQL may take to accept connections after a start.
    pub start_timeout: Duration,
    pub forward_logs: bool,
    /// Whether a primary's postmaster that exits on its own is restarted at once (as a
    /// standby's always is). `pgop instance run` says no: a crashed primary stays down
    /// until its manager has released the primary Lease and held off (see `run`).
    pub restart_crashed_primary: bool,
}

/// How a former primary became a standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// pg_rewind brought it onto the new primary's timeline.
    Rewound,
    /// Rewind could not work; it was cloned afresh.
    Recloned,
}

/// The result of applying a configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigReport {
    /// Refused parameters (and pg_hba rules, named `pgHba`): never written.
    pub invalid: Vec<InvalidParameter>,
    /// Parameters whose new value needs a restart.
    pub pending_restart: Vec<String>,
}

struct Desired {
    mode: Mode,
    parameters: BTreeMap<String, String>,
    pg_hba: Vec<String>,
    sync_names: String,
    invalid: Vec<InvalidParameter>,
    fenced: bool,
    /// WAL archiving to the backup store, when the spec has one.
    archiving: Option<Archiving>,
    /// The last spec applied, so that an unchanged spec is not reloaded again.
    applied: Option<(BTreeMap<String, String>, Vec<String>, ConfigReport)>,
    /// Why the last bootstrap failed, for `/pg/status`.
    bootstrap_error: Option<String>,
    /// The cluster generation whose configuration was last applied, for `/pg/status`.
    applied_generation: Option<i64>,
    /// `parameters` were checked by a running server ([`Instance::apply_config`]); until
    /// then they are the spec's, seeded for the first start ([`Instance::seed_parameters`]).
    validated: bool,
    /// Why the last restart was refused (its dry run failed), for `/pg/status`.
    restart_refused: Option<String>,
    /// PostgreSQL's last error lines when the last start failed; cleared by a start that
    /// succeeds.
    start_error: Option<String>,
    /// The last start failed because the primary no longer has the WAL this standby
    /// needs; cleared by a start that succeeds.
    wal_gone: bool,
    /// The parameters of the last start that succeeded.
    started_with: Option<BTreeMap<String, String>>,
    /// When the last start failed: the parameters whose values differ from the last start
    /// that succeeded (what the restart that left the instance down changed); cleared by a
    /// start that succeeds.
    failed_with_changes: Vec<String>,
    /// Why the instance is down, and since when (RFC 3339), as last served.
    down_since: Option<(pgop_api::instance_status::DownReason, String)>,
    /// For the next start as a standby: the primary's values of the parameters a hot
    /// standby needs at least as high (from pg_controldata), used where the spec's are
    /// lower. Not kept in later renderings: the rolling restart lowers them in order.
    standby_floors: BTreeMap<String, i64>,
    /// The application, replication and superuser passwords as the cluster's Secrets hold
    /// them now; no superuser password unless `spec.credentials.superuserAccess` (nor any
    /// network login as the superuser: see [`config::render_pg_hba`]).
    passwords: (String, String, Option<String>),
    /// The passwords last set in PostgreSQL by this manager (as the primary).
    passwords_set: Option<(String, String, Option<String>)>,
    /// PostgreSQL's TLS material, once the cluster's Secrets gave it (see
    /// [`Instance::set_tls`]); without it PostgreSQL runs without TLS.
    tls: Option<config::Tls>,
    /// `spec.roles` as last applied on this primary ([`Instance::apply_roles`]).
    roles: roles::Applied,
    /// `spec.databases` as last applied on this primary ([`Instance::apply_databases`]).
    databases: roles::Gate,
    /// The poolers' look-up role and function ([`Instance::apply_pooler_auth`]).
    pooler_auth: pooler_auth::Applied,
    /// Why this instance does not run its major, for `/pg/status`
    /// ([`Instance::set_major_upgrade_error`]).
    major_upgrade_error: Option<String>,
    /// Why a replica cluster's source refuses this designated primary, for `/pg/status`
    /// ([`Instance::set_source_refusal`]).
    source_refusal: Option<status::SourceRefusal>,
}

/// One PostgreSQL instance under the manager's control.
pub struct Instance {
    options: Options,
    supervisor: Supervisor,
    desired: std::sync::Mutex<Desired>,
    ops: tokio::sync::Mutex<()>,
    /// Base backups taken on request (`/pg/backups`).
    backups: Arc<std::sync::Mutex<Jobs>>,
    /// The pgop version reported as `managerVersion` on `/pg/status`
    /// ([`Instance::with_manager_version`]); none by default.
    manager_version: Option<String>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("instance", &self.options.layout.instance)
            .field("supervisor", &self.supervisor)
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// An instance with PostgreSQL stopped, to be configured as a primary until told else.
    pub fn new(options: Options) -> Self {
        let supervisor = Supervisor::new(supervisor::Options {
            binaries: options.binaries.clone(),
            run_as: options.run_as,
            pgdata: options.layout.pgdata.clone(),
            instance: options.layout.instance.clone(),
            stop_timeout: options.stop_timeout,
            forward_logs: options.forward_logs,
        });
        supervisor.set_restart_on_crash(options.restart_crashed_primary);
        let passwords = (
            options.credentials.app_password.clone(),
            options.credentials.replication_password.clone(),
            None,
        );
        Self {
            options,
            supervisor,
            desired: std::sync::Mutex::new(Desired {
                mode: Mode::Primary,
                parameters: BTreeMap::new(),
                pg_hba: Vec::new(),
                sync_names: String::new(),
                invalid: Vec::new(),
                fenced: false,
                archiving: None,
                applied: None,
                bootstrap_error: None,
                applied_generation: None,
                validated: false,
                restart_refused: None,
                start_error: None,
                wal_gone: false,
                started_with: None,
                failed_with_changes: Vec::new(),
                down_since: None,
                standby_floors: BTreeMap::new(),
                passwords,
                passwords_set: None,
                tls: None,
                roles: roles::Applied::default(),
                databases: roles::Gate::default(),
                pooler_auth: pooler_auth::Applied::default(),
                major_upgrade_error: None,
                source_refusal: None,
            }),
            ops: tokio::sync::Mutex::new(()),
            backups: Arc::default(),
            manager_version: None,
        }
    }

    /// Reports `version` (the running pgop binary's) as `managerVersion` on `/pg/status`.
    pub fn with_manager_version(mut self, version: &str) -> Self {
        self.manager_version = Some(version.to_string());
        self
    }

    pub fn name(&self) -> &str {
        &self.options.layout.instance
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The Unix socket endpoint of this instance's server.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            socket_dir: self.options.layout.socket_dir.clone(),
            port: self.options.layout.port,
        }
    }

    /// How this instance, as a standby, reaches the primary at `host`: with the
    /// replication user's certificate over TLS once [`Instance::set_tls`] gave one.
    pub fn as_upstream(&self, host: &str) -> Upstream {
        let d = self.desired();
        let files = config::tls_files(&self.options.layout);
        Upstream {
            host: host.to_string(),
            port: self.options.layout.port,
            user: self.options.credentials.replication_user.clone(),
            password: d.passwords.1.clone(),
            tls: d.tls.as_ref().map(|tls| UpstreamTls {
                server_name: tls.server_name.clone(),
                ca_file: files.server_ca,
                cert_file: files.replication_cert,
                key_file: files.replication_key,
            }),
        }
    }

    /// PostgreSQL's TLS material from now on: written to the socket directory at once
    /// (outside PGDATA); PostgreSQL reads it at its next start or reload, which the next
    /// [`Instance::apply_config`] does (certificates are renewed without a restart).
    /// `true` when it changed.
    pub fn set_tls(&self, tls: config::Tls) -> Result<bool, Error> {
        let mut d = self.desired();
        if d.tls.as_ref() == Some(&tls) {
            return Ok(false);
        }
        config::write_tls(&self.options.layout, &tls, self.options.run_as)
            .map_err(Error::WriteConfig)?;
        d.tls = Some(tls);
        // Apply (and reload) again even when the spec did not change.
        d.applied = None;
        Ok(true)
    }

    /// Whether PostgreSQL is configured with TLS.
    pub fn has_tls(&self) -> bool {
        self.desired().tls.is_some()
    }

    /// The state of the data directory (of an older major than the binaries: not
    /// usable).
    pub fn data_state(&self) -> DataState {
        let major = self.options.binaries.major().ok();
        bootstrap::inspect(&self.options.layout.pgdata, major)
    }

    /// The postmaster's pid, when running.
    pub fn pid(&self) -> Option<u32> {
        self.supervisor.pid()
    }

    /// Follows the postmaster's state: every start, stop and crash wakes the receiver.
    pub fn state_changes(&self) -> tokio::sync::watch::Receiver<supervisor::State> {
        self.supervisor.subscribe()
    }

    /// When the postmaster exited on its own and was left down (a crashed primary when
    /// [`Options::restart_crashed_primary`] is off); `None` once started or stopped again.
    pub fn crashed_at(&self) -> Option<Instant> {
        match self.supervisor.state() {
            supervisor::State::Crashed { at } => Some(at),
            _ => None,
        }
    }

    /// How often the supervisor restarted a crashed postmaster.
    pub fn restarts(&self) -> u32 {
        self.supervisor.restarts()
    }

    fn desired(&self) -> std::sync::MutexGuard<'_, Desired> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.desired
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Archives WAL to this store from now on (`None`: stops archiving). A change is
    /// written with the next configuration; `archive_mode` itself needs a restart, which
    /// `apply_config` reports as pending.
    pub fn set_archiving(&self, archiving: Option<Archiving>) {
        let mut d = self.desired();
        if d.archiving != archiving {
            d.archiving = archiving;
            // Apply again even when the spec's parameters did not change.
            d.applied = None;
        }
    }

    /// WAL archiving as configured.
    pub fn archiving(&self) -> Option<Archiving> {
        self.desired().archiving.clone()
    }

    /// Renders both files and standby.signal for the desired mode.
    fn write_config(&self) -> Result<(), Error> {
        let layout = &self.options.layout;
        let store_config = store_config_path(layout);
        let (conf, hba, standby, archiving, passfile) = {
            let d = self.desired();
            let command = d
                .archiving
                .as_ref()
                .map(|a| archive_command(&a.pgop_binary, &store_config));
            let floored;
            let parameters = if d.mode.is_standby() && !d.standby_floors.is_empty() {
                floored = floors::with_floors(&d.parameters, &d.standby_floors);
                &floored
            } else {
                &d.parameters
            };
            (
                config::render_postgresql_conf(
                    layout,
                    &d.mode,
                    &d.sync_names,
                    command.as_deref(),
                    d.tls.is_some(),
                    parameters,
                ),
                config::render_pg_hba(
                    &d.pg_hba,
                    &self.options.credentials.replication_user,
                    d.tls.as_ref().map(|t| t.allow_plaintext),
                    d.passwords.2.is_some(),
                ),
                d.mode.is_standby(),
                d.archiving.clone(),
                match &d.mode {
                    Mode::Standby { upstream } => {
                        Some(upstream.passfile_line().ok_or(Error::PasswordLineBreak)?)
                    }
                    // The source's password is in its own entry's directory.
                    Mode::Primary | Mode::DesignatedPrimary { .. } => None,
                },
            )
        };
        if let Some(archiving) = archiving {
            let owner = self.options.run_as.map(|u| (u.uid, u.gid));
            archiving
                .store
                .write(&store_config, owner)
                .map_err(Error::WriteStoreConfig)?;
        }
        self.supervisor
            .set_restart_on_crash(standby || self.options.restart_crashed_primary);
        let pgdata = &self.options.layout.pgdata;
        let run_as = self.options.run_as;
        // The replication password, for primary_conninfo's passfile; before the file that
        // names it, and gone when no longer a standby.
        let passfile_path = config::passfile_path(layout);
        match passfile {
            Some(line) => {
                config::write_file(&passfile_path, &line, run_as).map_err(Error::WriteConfig)?
            }
            None if passfile_path.exists() => std::fs::remove_file(&passfile_path)
                .map_err(|e| Error::WriteSignal("(removing) the replication password file", e))?,
            None => {}
        }
        config::write_file(&pgdata.join("postgresql.conf"), &conf, run_as)
            .map_err(Error::WriteConfig)?;
        config::write_file(&pgdata.join("pg_hba.conf"), &hba, run_as)
            .map_err(Error::WriteConfig)?;
        let signal = pgdata.join("standby.signal");
        if standby {
            config::write_file(&signal, "", run_as).map_err(Error::WriteConfig)?;
        } else if signal.exists() {
            std::fs::remove_file(&signal).map_err(|e| Error::WriteSignal("standby.signal", e))?;
        }
        Ok(())
    }

    async fn start_locked(&self) -> Result<(), Error> {
        let state = self.data_state();
        if state != DataState::Ready {
            return Err(Error::DataNotReady(state));
        }
        self.start_postmaster().await?;
        Ok(())
    }

    /// The spec's parameters for PostgreSQL's first start under this manager, written as
    /// they are: checking them needs a running server, and parameters that take effect only
    /// at start must be there from the first one (a standby of a primary that runs with a
    /// raised `max_connections` cannot even start without it). No effect once a
    /// configuration has been checked ([`Instance::apply_config`]) or while PostgreSQL runs.
    ///
    /// While PostgreSQL is down, a spec whose parameters changed since they were last
    /// checked is seeded again the same way: that is how an instance that cannot start with
    /// a value (a library that does not exist, too much shared memory) comes back once the
    /// spec is fixed, with no Pod deleted by hand. Values the last check refused are left
    /// out.
    pub fn seed_parameters(&self, parameters: &BTreeMap<String, String>) {
        if self.supervisor.pid().is_some() {
            return;
        }
        let mut d = self.desired();
        if !d.validated {
            d.parameters = parameters.clone();
            return;
        }
        let checked = d.applied.as_ref().map(|(p, _, _)| p);
        if checked != Some(parameters) {
            tracing::info!(
                "PostgreSQL is down and the spec's parameters changed since they were checked: starting with the spec's"
            );
            let refused = &d.invalid;
            let seeded: BTreeMap<String, String> = parameters
                .iter()
                .filter(|(k, v)| !refused.iter().any(|r| &r.name == *k && &r.value == *v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            d.parameters = seeded;
            d.validated = false;
        }
    }

    /// Writes the configuration, starts the postmaster and waits until it accepts
    /// connections. When the parameters are still the spec's unchecked ones and PostgreSQL
    /// does not come up with them, it starts again without them; the next
    /// [`Instance::apply_config`] then reports what it refuses.
    async fn start_postmaster(&self) -> Result<tokio_postgres::Client, Error> {
        let floors = if self.desired().mode.is_standby() {
            self.controldata_floors().await
        } else {
            BTreeMap::new()
        };
        self.desired().standby_floors = floors;
        let started = self.start_postmaster_floored().await;
        self.desired().standby_floors.clear();
        started
    }

    /// The values of the parameters a hot standby needs at least at its primary's, as
    /// pg_control last recorded them (the primary's, after a clone, a rewind or replaying
    /// its parameter change); empty when pg_controldata cannot tell.
    async fn controldata_floors(&self) -> BTreeMap<String, i64> {
        let o = &self.options;
        match crate::pg::ControlData::read(&o.binaries, o.run_as, &o.layout.pgdata).await {
            Ok(control) => floors::controldata_floors(&control),
            Err(err) => {
                tracing::warn!(error = %crate::error_chain(&err), "pg_controldata failed; starting the standby with the spec's values only");
                BTreeMap::new()
            }
        }
    }

    async fn start_postmaster_floored(&self) -> Result<tokio_postgres::Client, Error> {
        self.place_wal().await?;
        self.write_config()?;
        let unchecked = {
            let d = self.desired();
            !d.validated && !d.parameters.is_empty()
        };
        let client = match self.start_and_wait().await {
            Ok(client) => client,
            Err(err) if unchecked && !matches!(err, Error::UpstreamWalGone) => {
                tracing::warn!(error = %crate::error_chain(&err), "PostgreSQL did not start with the spec's parameters; starting it without them (they are checked once it runs)");
                self.supervisor
                    .stop_with(supervisor::Stop::Immediate)
                    .await
                    .map_err(Error::StopPostgres)?;
                self.desired().parameters.clear();
                self.write_config()?;
                match self.start_and_wait().await {
                    Ok(client) => client,
                    Err(err) => return Err(self.stay_down(err).await),
                }
            }
            Err(err) => return Err(self.stay_down(err).await),
        };
        Ok(client)
    }

    /// Puts the WAL on its volume (`spec.walStorage`) before PostgreSQL starts: a new data
    /// directory's (initdb, a clone, a restore, pg_upgrade's) or one that predates the
    /// volume is moved there once ([`crate::pg::waldir`]).
    async fn place_wal(&self) -> Result<(), Error> {
        let o = &self.options;
        let (pgdata, wal_dir, run_as) =
            (o.layout.pgdata.clone(), o.layout.wal_dir.clone(), o.run_as);
        let placed = tokio::task::spawn_blocking(move || {
            crate::pg::waldir::place(&pgdata, wal_dir.as_deref(), run_as)
        })
        .await
        .map_err(|e| {
            Error::PlaceWal(crate::pg::waldir::Error::Io {
                what: "wait for the move of",
                path: o.layout.pgdata.join("pg_wal"),
                source: std::io::Error::other(e.to_string()),
            })
        })?
        .map_err(Error::PlaceWal)?;
        match placed {
            crate::pg::waldir::Placed::AlreadyThere => {}
            crate::pg::waldir::Placed::Moved { files, bytes } => tracing::info!(
                files,
                bytes,
                wal_dir = ?o.layout.wal_dir,
                "moved the write-ahead log to its volume"
            ),
            crate::pg::waldir::Placed::Relinked => tracing::info!(
                wal_dir = ?o.layout.wal_dir,
                "pointed pg_wal at the WAL volume's directory"
            ),
        }
        Ok(())
    }

    /// After a failed start: a postmaster that exits at start is not restarted in a loop
    /// (the manager's next pass decides, with whatever the spec says then). A primary's
    /// crash is left as it is ([`Instance::crashed_at`]): its Lease goes, and it is held off
    /// while the operator fails over.
    async fn stay_down(&self, err: Error) -> Error {
        if matches!(err, Error::UpstreamWalGone) {
            tracing::warn!(log = ?self.supervisor.last_error_lines(), "the primary no longer has WAL this standby needs; stopping it");
            {
                let mut d = self.desired();
                d.start_error = Some(err.to_string());
                d.wal_gone = true;
            }
            if let Err(stop) = self.supervisor.stop_with(supervisor::Stop::Immediate).await {
                return Error::StopPostgres(stop);
            }
            return err;
        }
        if matches!(err, Error::ExitedAtStart) {
            let words = self
                .supervisor
                .last_error_lines()
                .unwrap_or_else(|| "PostgreSQL exited while starting".into());
            let mut d = self.desired();
            d.start_error = Some(words);
            d.failed_with_changes = match &d.started_with {
                Some(before) => down::changed(before, &d.parameters),
                None => Vec::new(),
            };
        }
        if matches!(err, Error::ExitedAtStart) && self.crashed_at().is_none() {
            tracing::warn!(log = ?self.supervisor.last_error_lines(), "PostgreSQL exited while starting; leaving it stopped until the next pass");
            if let Err(stop) = self.supervisor.stop_with(supervisor::Stop::Immediate).await {
                return Error::StopPostgres(stop);
            }
        }
        err
    }

    /// Starts the postmaster and waits until it accepts connections; a postmaster that
    /// exits meanwhile fails the start at once rather than after the start timeout.
    async fn start_and_wait(&self) -> Result<tokio_postgres::Client, Error> {
        let restarts = self.supervisor.restarts();
        self.supervisor
            .start()
            .await
            .map_err(Error::StartPostgres)?;
        self.desired().fenced = false;
        let endpoint = self.endpoint();
        let ready = endpoint.wait_ready(self.options.start_timeout);
        let exited = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if self.supervisor.pid().is_none() || self.supervisor.restarts() > restarts {
                    return;
                }
            }
        };
        // A standby whose upstream removed the WAL it needs never gets consistent: it
        // would wait here for the whole start timeout, and again at every start.
        // (A designated primary that reads its source's store fetches such WAL there.)
        let standby = match &self.desired().mode {
            Mode::DesignatedPrimary { source } => !source.has_archive(),
            mode => mode.is_standby(),
        };
        let wal_gone = async {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if standby && self.supervisor.upstream_wal_gone() {
                    return;
                }
            }
        };
        let client = tokio::select! {
            ready = ready => ready.map_err(Error::WaitReady)?,
            () = exited => return Err(Error::ExitedAtStart),
            () = wal_gone => return Err(Error::UpstreamWalGone),
        };
        {
            let mut d = self.desired();
            d.start_error = None;
            d.wal_gone = false;
            d.failed_with_changes.clear();
            d.started_with = Some(d.parameters.clone());
        }
        Ok(client)
    }

    /// Starts PostgreSQL on a complete data directory in the desired mode.
    pub async fn start(&self) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.start_locked().await
    }

    /// Starts PostgreSQL in `mode` (a manager restarting on an existing data directory).
    /// A standby whose primary no longer has the WAL it needs is cloned afresh, once the
    /// primary answers as one ([`Error::UpstreamWalGone`]).
    pub async fn start_as(&self, mode: Mode) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.desired().mode = mode.clone();
        match (self.start_locked().await, mode) {
            (Err(Error::UpstreamWalGone), Mode::Standby { upstream }) => {
                tracing::warn!(
                    "the primary no longer has the WAL this standby needs: cloning afresh"
                );
                upstream
                    .probe_primary()
                    .await
                    .map_err(Error::ProbePrimary)?;
                self.clone_locked(&upstream).await
            }
            (Err(Error::UpstreamWalGone), Mode::DesignatedPrimary { source }) => {
                tracing::warn!(
                    source = %source.name(),
                    "the replica cluster's source no longer has the WAL this designated primary needs: cloning it afresh"
                );
                self.clone_source_locked(&source, true).await
            }
            (started, _) => started,
        }
    }

    /// A running designated primary whose source removed WAL it still needs: cloned afresh
    /// from the source ([`Instance::clone_source_locked`]).
    pub async fn reclone_from_source(&self, source: &crate::external::Source) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.clone_source_locked(source, true).await
    }

    /// Clones `source` into PGDATA and starts as its designated primary. With `ask_first`
    /// (PGDATA holds data: a re-clone), the source must answer a replication connection
    /// first: the data is only thrown away for a source that can be cloned. A designated
    /// primary holds nothing of its own (it takes no writes), so a re-clone loses nothing.
    async fn clone_source_locked(
        &self,
        source: &crate::external::Source,
        ask_first: bool,
    ) -> Result<(), Error> {
        let o = &self.options;
        let app = config::replica_application_name(&o.layout.instance);
        if ask_first {
            if source.has_connection() {
                source
                    .identify(
                        &o.binaries,
                        o.run_as,
                        &app,
                        crate::external::IDENTIFY_TIMEOUT,
                    )
                    .await
                    .map_err(|r| Error::SourceRefuses(r.to_string()))?;
            }
            self.supervisor.stop().await.map_err(Error::StopPostgres)?;
        }
        self.desired().mode = Mode::DesignatedPrimary {
            source: Box::new(source.clone()),
        };
        bootstrap::begin(&o.layout.pgdata, o.run_as).map_err(Error::Bootstrap)?;
        match (source.conninfo(&app), source.archive()) {
            (Some(conninfo), _) => bootstrap::clone::base_backup_from_source(
                &o.binaries,
                o.run_as,
                &o.layout.pgdata,
                &conninfo,
            )
            .await
            .map_err(Error::Bootstrap)?,
            // A store alone: its newest base backup, then the WAL after it by
            // restore_command (the designated primary's configuration).
            (None, Some((store_config, _))) => {
                let store = pgop_backup::StoreConfig::read(store_config)
                    .map_err(|e| Error::SourceRefuses(format!("its store: {e}")))?;
                let backup =
                    pgop_backup::restore::unpack_newest(&store, &self.tools(), &o.layout.pgdata)
                        .await
                        .map_err(Error::Restore)?;
                tracing::info!(source = %source.name(), backup = %backup.backup_id, end_lsn = %backup.end_lsn, "unpacked the source's newest base backup from its store");
            }
            (None, None) => {
                return Err(Error::SourceRefuses(
                    "the entry has neither a connection nor a store".into(),
                ));
            }
        }
        self.write_config()?;
        bootstrap::finish(&o.layout.pgdata).map_err(Error::Bootstrap)?;
        self.supervisor.forget_upstream_wal_gone();
        self.start_locked().await
    }

    /// The mode the configuration is rendered for.
    pub fn mode(&self) -> Mode {
        self.desired().mode.clone()
    }

    /// Whether PostgreSQL is stopped on a primary's data that it did not shut down: the
    /// control file says the primary was in production, in crash recovery or shutting
    /// down (a killed container, a crashed node, a postmaster that crashed). Read with
    /// pg_controldata; `false` when it cannot tell (no data, a standby's, running, or
    /// pg_controldata failed).
    pub async fn crashed_as_primary(&self) -> bool {
        if self.pid().is_some()
            || self.has_standby_signal()
            || !matches!(self.data_state(), DataState::Ready)
        {
            return false;
        }
        let o = &self.options;
        match crate::pg::ControlData::read(&o.binaries, o.run_as, &o.layout.pgdata).await {
            Ok(control) => unclean_primary(&control),
            Err(err) => {
                tracing::warn!(error = %crate::error_chain(&err), "pg_controldata failed; the data is taken as shut down cleanly");
                false
            }
        }
    }

    /// Whether the data directory was left as a standby's (`standby.signal`).
    pub fn has_standby_signal(&self) -> bool {
        self.options.layout.pgdata.join("standby.signal").exists()
    }

    /// Whether the manager fenced PostgreSQL.
    pub fn fenced(&self) -> bool {
        self.desired().fenced
    }

    /// Stops PostgreSQL: smart, then fast after the stop timeout.
    pub async fn stop(&self) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.supervisor.stop().await.map_err(Error::StopPostgres)
    }

    /// Stops and starts PostgreSQL (to apply parameters that need a restart). The stop is
    /// fast (sessions end at once, a shutdown checkpoint is written): a smart one would
    /// wait for idle pooled connections until the stop timeout.
    ///
    /// A dry run comes first ([`Instance::dry_run`]): a configuration PostgreSQL would
    /// refuse to start with is reported (`restartRefused` on `/pg/status`) and the running
    /// server is left alone.
    pub async fn restart(&self) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        if self.supervisor.pid().is_some()
            && let Err(why) = self.dry_run().await
        {
            tracing::warn!(%why, "refusing to restart PostgreSQL: the new configuration failed its dry run");
            self.desired().restart_refused = Some(why.clone());
            return Err(Error::RestartRefused(why));
        }
        self.desired().restart_refused = None;
        self.supervisor
            .stop_with(supervisor::Stop::Fast)
            .await
            .map_err(Error::StopPostgres)?;
        self.start_locked().await
    }

    /// Checks the configuration on disk as a new postmaster would read it, without
    /// starting one: `postgres -C` parses postgresql.conf (and refuses values it could not
    /// start with), and every library of `shared_preload_libraries` must exist. `Err`
    /// holds PostgreSQL's words.
    pub async fn dry_run(&self) -> Result<(), String> {
        let o = &self.options;
        let mut cmd = crate::pg::binaries::command(&o.binaries, "postgres", o.run_as);
        cmd.arg("-D")
            .arg(&o.layout.pgdata)
            .args(["-C", "shared_preload_libraries"]);
        let out = match bootstrap::run("postgres -C", cmd).await {
            Ok(out) => out,
            Err(bootstrap::Error::RunProgram { stderr, .. }) => {
                let lines: Vec<&str> = stderr.lines().rev().take(4).collect();
                let lines: Vec<&str> = lines.into_iter().rev().collect();
                return Err(format!(
                    "PostgreSQL refuses the configuration: {}",
                    lines.join(" ")
                ));
            }
            Err(other) => return Err(format!("could not run postgres -C: {other}")),
        };
        let libraries = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let libdir = o.binaries.program("postgres");
        let libdir = libdir
            .parent()
            .and_then(std::path::Path::parent)
            .map(|p| p.join("lib"));
        for library in libraries
            .split(',')
            .map(|l| l.trim().trim_matches('"'))
            .filter(|l| !l.is_empty())
        {
            let relative = library.strip_prefix("$libdir/").unwrap_or(library);
            let candidates: Vec<std::path::PathBuf> = if relative.contains('/') {
                vec![relative.into(), format!("{relative}.so").into()]
            } else {
                match &libdir {
                    Some(dir) if dir.is_dir() => {
                        vec![dir.join(relative), dir.join(format!("{relative}.so"))]
                    }
                    // No library directory where expected: PostgreSQL will tell at start.
                    _ => continue,
                }
            };
            if !candidates.iter().any(|c| c.is_file()) {
                return Err(format!(
                    "shared_preload_libraries names {library:?}, which is not installed: \
                     PostgreSQL would not start"
                ));
            }
        }
        Ok(())
    }

    /// Simulates losing the node: SIGKILL to every PostgreSQL process, no restart.
    pub async fn kill(&self) -> Result<(), Error> {
        self.supervisor.kill().await.map_err(Error::StopPostgres)
    }

    /// A primary steps down (switchover): `CHECKPOINT`, so that the shutdown checkpoint has
    /// little to write, then a fast shutdown: sessions end, and the walsenders ship all WAL,
    /// the shutdown checkpoint included, to the connected standbys before the postmaster
    /// exits. The data stays a primary's (no standby.signal) until a rejoin.
    pub async fn step_down(&self) -> Result<(), Error> {
        self.step_down_within(None).await
    }

    /// [`Self::step_down`], but a fast shutdown that has not finished within `bound` turns
    /// into an immediate one. For a primary fenced by a failover (the operator could not
    /// reach it): walsenders that cannot reach their standbys (a network partition) would
    /// hold the fast shutdown, and the Lease with it, for the whole stop timeout, while
    /// every acknowledged commit the failover must keep is already on the chosen standby
    /// (`dataDurability: required`) or lost anyway with the unreachable link. Reachable
    /// standbys still get the WAL: a fast shutdown with connected standbys ends well within
    /// the bound.
    pub async fn step_down_within(&self, bound: Option<Duration>) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        if self.supervisor.pid().is_none() {
            return Ok(());
        }
        match self.endpoint().connect().await {
            Ok(client) => {
                if let Err(err) = client.batch_execute("CHECKPOINT").await {
                    tracing::warn!(error = %crate::error_chain(&err), "CHECKPOINT before stepping down failed; stopping anyway");
                }
            }
            Err(err) => {
                tracing::warn!(error = %crate::error_chain(&err), "no connection for a CHECKPOINT before stepping down; stopping anyway");
            }
        }
        let fast = self.supervisor.stop_with(supervisor::Stop::Fast);
        let Some(bound) = bound else {
            return fast.await.map_err(Error::StopPostgres);
        };
        match tokio::time::timeout(bound, fast).await {
            Ok(stopped) => stopped.map_err(Error::StopPostgres),
            Err(_) => {
                tracing::warn!(
                    ?bound,
                    "the fast shutdown did not finish in time (standbys unreachable?): immediate shutdown"
                );
                self.supervisor
                    .stop_with(supervisor::Stop::Immediate)
                    .await
                    .map_err(Error::StopPostgres)
            }
        }
    }

    /// Self-fencing: an immediate stop, at once, without waiting for an operation under
    /// way (it does not take the operation lock). For a primary that lost its Lease.
    pub async fn stop_now(&self) -> Result<(), Error> {
        self.supervisor
            .stop_with(supervisor::Stop::Immediate)
            .await
            .map_err(Error::StopPostgres)
    }

    /// Fencing (`spec.fencedInstances`): stop PostgreSQL cleanly, as a step-down does (a
    /// `CHECKPOINT`, then a fast shutdown: the walsenders ship every WAL record to the
    /// connected standbys first), and keep it stopped, data untouched, until
    /// [`Self::unfence`]. Reported as `fenced` on `/pg/status` from the start of the stop.
    pub async fn fence(&self) -> Result<(), Error> {
        self.desired().fenced = true;
        self.step_down_within(None).await
    }

    /// Ends a fence: the next pass may start PostgreSQL again (a start also ends it).
    pub fn unfence(&self) {
        self.desired().fenced = false;
    }

    /// initdb (with data checksums), then the application database and roles; leaves a
    /// running primary. Redone from scratch when interrupted.
    pub async fn bootstrap_primary(&self) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        let o = &self.options;
        self.desired().mode = Mode::Primary;
        bootstrap::begin(&o.layout.pgdata, o.run_as).map_err(Error::Bootstrap)?;
        bootstrap::initdb::initdb(&o.binaries, o.run_as, &o.layout.pgdata)
            .await
            .map_err(Error::Bootstrap)?;
        let client = self.start_postmaster().await?;
        bootstrap::initdb::create_roles(&client, &o.credentials)
            .await
            .map_err(Error::Bootstrap)?;
        client
            .batch_execute("CHECKPOINT")
            .await
            .map_err(|e| Error::Bootstrap(bootstrap::Error::CreateRoles(e)))?;
        bootstrap::finish(&o.layout.pgdata).map_err(Error::Bootstrap)
    }

    /// Clones `upstream` with pg_basebackup and starts as its standby. Redone from scratch
    /// when interrupted. The primary must already have this instance's slot.
    pub async fn bootstrap_standby(&self, upstream: &Upstream) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.clone_locked(upstream).await
    }

    async fn clone_locked(&self, upstream: &Upstream) -> Result<(), Error> {
        let o = &self.options;
        self.desired().mode = Mode::Standby {
            upstream: upstream.clone(),
        };
        bootstrap::begin(&o.layout.pgdata, o.run_as).map_err(Error::Bootstrap)?;
        bootstrap::clone::base_backup(
            &o.binaries,
            o.run_as,
            &o.layout.pgdata,
            upstream,
            &o.layout.instance,
        )
        .await
        .map_err(Error::Bootstrap)?;
        self.write_config()?;
        bootstrap::finish(&o.layout.pgdata).map_err(Error::Bootstrap)?;
        self.start_locked().await
    }

    /// A replica cluster's first instance: clones the outside `source` with pg_basebackup
    /// and starts as its designated primary. Redone from scratch when interrupted.
    pub async fn bootstrap_designated(
        &self,
        source: &crate::external::Source,
    ) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.clone_source_locked(source, false).await
    }

    /// Validates and applies the spec's parameters and pg_hba rules: refused ones are
    /// reported and their last good value kept; reloads; reports what needs a restart.
    pub async fn apply_config(
        &self,
        parameters: &BTreeMap<String, String>,
        pg_hba: &[String],
    ) -> Result<ConfigReport, Error> {
        let _op = self.ops.lock().await;
        if let Some((params, hba, report)) = &self.desired().applied
            && params == parameters
            && hba == pg_hba
            && report.pending_restart.is_empty()
        {
            return Ok(report.clone());
        }
        let mut client = self.endpoint().connect().await.map_err(Error::Connect)?;
        let (valid, mut invalid) = config::validate(&mut client, parameters)
            .await
            .map_err(Error::ApplyConfig)?;
        // Rules outside pgop's grammar are left out of pg_hba.conf by the renderer.
        for rule in pg_hba.iter().filter(|r| config::hba_rule_refused(r)) {
            invalid.push(InvalidParameter {
                name: "pgHba".into(),
                value: rule.clone(),
                reason:
                    "not a pg_hba rule pgop writes (one line; local, host, hostssl, hostnossl or \
                         hostnogssenc; a known method; no @file, no #)"
                        .into(),
            });
        }
        let previous_hba = {
            let mut d = self.desired();
            let mut merged = valid;
            for bad in &invalid {
                if let Some(good) = d.parameters.get(&bad.name) {
                    merged.insert(bad.name.clone(), good.clone());
                }
            }
            d.parameters = merged;
            std::mem::replace(&mut d.pg_hba, pg_hba.to_vec())
        };
        self.write_config()?;
        // PostgreSQL parses pg_hba.conf anew for this view: a bad rule is caught before any
        // reload or restart could use the file.
        let rows = client
            .query(
                "SELECT line_number, COALESCE(error, '') FROM pg_hba_file_rules WHERE error IS NOT NULL",
                &[],
            )
            .await
            .map_err(Error::CheckHba)?;
        if !rows.is_empty() {
            for row in &rows {
                let reason: String = row.try_get(1).map_err(Error::CheckHba)?;
                invalid.push(InvalidParameter {
                    name: "pgHba".into(),
                    value: pg_hba.join("\n"),
                    reason,
                });
            }
            self.desired().pg_hba = previous_hba;
            self.write_config()?;
        }
        config::reload(&client).await.map_err(Error::ApplyConfig)?;
        // What PostgreSQL itself refused while reading the new file (a value its own check
        // rejects at reload): reported, never hidden behind a reload that "worked".
        invalid.extend(
            config::file_errors(&client)
                .await
                .map_err(Error::ApplyConfig)?,
        );
        let pending_restart = config::pending_restart(&client)
            .await
            .map_err(Error::ApplyConfig)?;
        let report = ConfigReport {
            invalid,
            pending_restart,
        };
        let mut d = self.desired();
        if report.pending_restart.is_empty() {
            d.restart_refused = None;
        }
        d.invalid = report.invalid.clone();
        d.applied = Some((parameters.clone(), pg_hba.to_vec(), report.clone()));
        d.validated = true;
        Ok(report)
    }

    /// Reports (`Some`) or clears why this instance does not run its PostgreSQL major
    /// (`majorUpgradeError` on `/pg/status`): a failed major upgrade, or primary data of an
    /// older major without an upgrade request. `true` when it changed.
    pub fn set_major_upgrade_error(&self, error: Option<String>) -> bool {
        let mut d = self.desired();
        let changed = d.major_upgrade_error != error;
        d.major_upgrade_error = error;
        changed
    }

    /// Reports (`Some`) or clears why the source refuses this designated primary
    /// (`upstream.refusal` on `/pg/status`). `true` when it changed.
    pub fn set_source_refusal(&self, refusal: Option<status::SourceRefusal>) -> bool {
        let mut d = self.desired();
        let changed = d.source_refusal != refusal;
        d.source_refusal = refusal;
        changed
    }

    /// Records that the configuration of this cluster generation is applied (see
    /// [`PgStatus::applied_generation`]).
    pub fn applied_generation(&self, generation: Option<i64>) {
        self.desired().applied_generation = generation;
    }

    /// Primary: keeps `synchronous_standby_names` in step with the spec and the standbys.
    pub async fn set_synchronous(
        &self,
        spec: SyncSpec,
        standbys: &[String],
    ) -> Result<String, Error> {
        let _op = self.ops.lock().await;
        let client = self.endpoint().connect().await.map_err(Error::Connect)?;
        let rows = client
            .query(
                "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'",
                &[],
            )
            .await
            .map_err(Error::ReadReplication)?;
        let streaming = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()
            .map_err(Error::ReadReplication)?;
        let names = sync::standby_names(spec, standbys, &streaming);
        let changed = {
            let mut d = self.desired();
            let changed = d.sync_names != names;
            d.sync_names = names.clone();
            changed
        };
        if changed {
            self.write_config()?;
            config::reload(&client).await.map_err(Error::ApplyConfig)?;
        }
        Ok(names)
    }

    /// Primary: one replication slot per standby, none for instances that are gone.
    pub async fn ensure_slots(&self, standbys: &[String]) -> Result<(), Error> {
        let client = self.endpoint().connect().await.map_err(Error::Connect)?;
        role::ensure_slots(&client, standbys)
            .await
            .map_err(Error::ManageSlots)
    }

    /// Standby to primary: `pg_promote()`, then the config rewritten for a primary.
    pub async fn promote(&self) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        let client = self.endpoint().connect().await.map_err(Error::Connect)?;
        role::promote(&client, self.options.start_timeout)
            .await
            .map_err(Error::Promote)?;
        self.desired().mode = Mode::Primary;
        self.write_config()?;
        config::reload(&client).await.map_err(Error::ApplyConfig)
    }

    /// A running standby follows another primary (reload: `primary_conninfo` is reloadable).
    pub async fn follow(&self, upstream: &Upstream) -> Result<(), Error> {
        self.repoint(Mode::Standby {
            upstream: upstream.clone(),
        })
        .await
    }

    /// A running standby becomes (or stays) the designated primary of a replica cluster:
    /// it follows the outside `source` (a reload: `primary_conninfo` and
    /// `primary_slot_name` are reloadable). Never `pg_promote()`.
    pub async fn follow_source(&self, source: &crate::external::Source) -> Result<(), Error> {
        self.repoint(Mode::DesignatedPrimary {
            source: Box::new(source.clone()),
        })
        .await
    }

    /// A running standby follows another upstream: the configuration for `mode`, reloaded.
    async fn repoint(&self, mode: Mode) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        self.desired().mode = mode;
        self.write_config()?;
        self.supervisor.forget_upstream_wal_gone();
        let client = self.endpoint().connect().await.map_err(Error::Connect)?;
        config::reload(&client).await.map_err(Error::ApplyConfig)
    }

    /// Whether this standby's WAL receiver was told, since PostgreSQL last started, that
    /// its upstream removed a WAL segment it needs: standbys fetch WAL by streaming only,
    /// so it can never catch up ([`Instance::reclone`]).
    pub fn upstream_wal_gone(&self) -> bool {
        self.supervisor.upstream_wal_gone()
    }

    /// A running standby whose primary removed WAL it still needs is cloned afresh from
    /// `upstream`. Its data is thrown away only once `upstream` answers as a primary;
    /// otherwise it keeps running and an error is returned (to be retried).
    pub async fn reclone(&self, upstream: &Upstream) -> Result<(), Error> {
        let _op = self.ops.lock().await;
        upstream
            .probe_primary()
            .await
            .map_err(Error::ProbePrimary)?;
        self.supervisor.stop().await.map_err(Error::StopPostgres)?;
        self.clone_locked(upstream).await
    }

    /// A former primary (running, stopped or killed) becomes a standby of `upstream`:
    /// pg_rewind, or a fresh clone when rewinding cannot work. The data is only thrown away
    /// for a clone once `upstream` answers as a primary; otherwise it is kept and an error
    /// returned (to be retried).
    pub async fn demote(&self, upstream: &Upstream) -> Result<Rejoin, Error> {
        let _op = self.ops.lock().await;
        let o = &self.options;
        self.supervisor.stop().await.map_err(Error::StopPostgres)?;
        self.desired().mode = Mode::Standby {
            upstream: upstream.clone(),
        };
        if self.data_state() == DataState::Ready {
            match role::rewind(
                &o.binaries,
                o.run_as,
                &o.layout.pgdata,
                upstream,
                &o.layout.instance,
            )
            .await
            {
                Ok(()) => match self.start_locked().await {
                    Ok(()) => return Ok(Rejoin::Rewound),
                    Err(err) => {
                        tracing::warn!(error = %crate::error_chain(&err), "the rewound standby did not start; cloning afresh");
                        self.supervisor.stop().await.map_err(Error::StopPostgres)?;
                    }
                },
                Err(err) => {
                    tracing::warn!(error = %crate::error_chain(&err), "pg_rewind failed; cloning afresh");
                }
            }
        }
        // Re-cloning wipes this instance's data: only for an upstream that is a primary now.
        upstream
            .probe_primary()
            .await
            .map_err(Error::ProbePrimary)?;
        self.clone_locked(upstream).await?;
        Ok(Rejoin::Recloned)
    }

    /// The filesystem of the data volume: the one holding the data directory, or its
    /// parent (the volume's mount) before initdb made it.
    pub fn volume_usage(&self) -> Option<pgop_api::instance_status::VolumeUsage> {
        usage_of(&self.options.layout.pgdata)
    }

    /// The filesystem of the WAL volume (`spec.walStorage`); none without one.
    pub fn wal_volume_usage(&self) -> Option<pgop_api::instance_status::VolumeUsage> {
        usage_of(self.options.layout.wal_dir.as_deref()?)
    }

    /// The status served on `/pg/status`.
    pub async fn status(&self) -> PgStatus {
        let (
            invalid,
            fenced,
            bootstrap_error,
            applied_generation,
            restart_refused,
            start_error,
            major_upgrade_error,
            failure,
        ) = {
            let d = self.desired();
            (
                d.invalid.clone(),
                d.fenced,
                d.bootstrap_error.clone(),
                d.applied_generation,
                d.restart_refused.clone(),
                d.start_error.clone(),
                d.major_upgrade_error.clone(),
                down::Failure {
                    words: d.start_error.clone(),
                    wal_gone: d.wal_gone,
                    changed_parameters: d.failed_with_changes.clone(),
                },
            )
        };
        let queried = async {
            let client = self.endpoint().connect().await.map_err(Error::Connect)?;
            status::query(&client, self.name())
                .await
                .map_err(Error::ReadStatus)
        };
        let mut status = match self.supervisor.pid() {
            Some(_) => match tokio::time::timeout(Duration::from_secs(5), queried).await {
                Ok(Ok(status)) => status,
                _ => PgStatus::stopped(self.name(), fenced),
            },
            None => PgStatus::stopped(self.name(), fenced),
        };
        status.manager_version = self.manager_version.clone();
        status.invalid_parameters = invalid;
        status.fenced = fenced;
        status.bootstrap_error = bootstrap_error;
        status.applied_generation = applied_generation;
        status.restart_refused = restart_refused;
        status.major_upgrade_error = major_upgrade_error;
        status.volume = self.volume_usage();
        status.wal_volume = self.wal_volume_usage();
        if status.role == PgRole::Replica
            && matches!(self.desired().mode, Mode::DesignatedPrimary { .. })
        {
            status.role = PgRole::DesignatedPrimary;
        }
        // Set on a designated primary only, also before its first clone.
        if let Some(refusal) = self.desired().source_refusal.clone() {
            status.upstream.get_or_insert_with(Default::default).refusal = Some(refusal);
        }
        if status.role == PgRole::DesignatedPrimary
            && let Mode::DesignatedPrimary { source } = &self.desired().mode
            && let Some(record) = source.archive_record()
        {
            let upstream = status.upstream.get_or_insert_with(Default::default);
            upstream.restored_wal = record.restored.clone();
            upstream.restored_at = record.restored_at.clone();
            // A store alone: caught up once the segment after the last restored one is
            // what the store lacks (and no later one is there); the lag is then the
            // source's WAL not archived yet, which nothing here can see.
            if !source.has_connection() && record.missing.is_some() && !record.later_present {
                upstream.lag_seconds = Some(0.0);
            } else if !source.has_connection() {
                upstream.lag_seconds = upstream.replayed_commit_age_seconds;
            }
        }
        if status.role == PgRole::Primary {
            let d = self.desired();
            status.roles = d.roles.gate.report.clone();
            status.databases = d.databases.report.clone();
        }
        if status.role == PgRole::Stopped {
            status.last_error = start_error;
        }
        // Why it is not ready; `since` is the first time this reason was served.
        status.down = down::decide(&status, &failure);
        let mut d = self.desired();
        d.down_since = match (&mut status.down, d.down_since.take()) {
            (Some(down), Some((reason, since))) if down.reason == reason => {
                down.since = Some(since.clone());
                Some((reason, since))
            }
            (Some(down), _) => {
                let now = jiff::Timestamp::now();
                let since = jiff::Timestamp::from_second(now.as_second())
                    .unwrap_or(now)
                    .to_string();
                down.since = Some(since.clone());
                Some((down.reason, since))
            }
            (None, _) => None,
        };
        status
    }

    /// Ready: bootstrap finished and accepting connections; a standby also streams from
    /// its primary.
    pub async fn ready(&self) -> bool {
        if self.data_state() != DataState::Ready {
            return false;
        }
        let status = self.status().await;
        match status.role {
            // A designated primary serves reads whether or not its source answers.
            PgRole::Primary | PgRole::DesignatedPrimary => true,
            PgRole::Replica => status.streaming,
            PgRole::Stopped => false,
        }
    }

    /// Alive: PostgreSQL is not wedged. A stopped, starting or crash-restarting server is
    /// not wedged (it refuses connections at once); one that does not even answer a
    /// connection attempt, or a query, within a few seconds is.
    pub async fn healthy(&self) -> bool {
        const PATIENCE: Duration = Duration::from_secs(3);
        if self.supervisor.pid().is_none() {
            return true;
        }
        match tokio::time::timeout(PATIENCE, self.endpoint().connect()).await {
            Err(_elapsed) => false,
            Ok(Err(_refused_or_starting)) => true,
            Ok(Ok(client)) => tokio::time::timeout(PATIENCE, client.simple_query("SELECT 1"))
                .await
                .is_ok(),
        }
    }

    /// Stops PostgreSQL for good (SIGTERM of the manager: a Pod deleted or drained). As a
    /// step-down: a CHECKPOINT, then a fast shutdown. A smart one would wait, up to the stop
    /// timeout, for every idle session to leave while a primary still holds its Lease, so a
    /// deleted primary would hand over only after ~10 s; the fast one ends the sessions at
    /// once, and the walsenders still ship every WAL record to the standbys before the
    /// postmaster exits. The Lease is released right after.
    pub async fn shutdown(&self) -> Result<(), Error> {
        self.step_down().await
    }
}

/// Whether the control file shows a primary that was not shut down: `in production`, `in
/// crash recovery` or `shutting down` (a standby's is `in archive recovery`; a clean stop
/// is `shut down`).
fn unclean_primary(control: &crate::pg::ControlData) -> bool {
    control.state().is_some_and(|state| {
        matches!(
            state,
            "in production" | "in crash recovery" | "shutting down"
        )
    })
}

/// The size and use of the filesystem `path` is on (see [`crate::metrics::volume`]).
fn usage_of(path: &std::path::Path) -> Option<pgop_api::instance_status::VolumeUsage> {
    crate::metrics::volume(path).map(|u| pgop_api::instance_status::VolumeUsage {
        capacity_bytes: u.capacity_bytes,
        used_bytes: u.used_bytes,
        available_bytes: u.available_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::unclean_primary;

    #[test]
    fn a_primary_not_shut_down_is_told_from_the_control_file() {
        let state = |s: &str| {
            format!(
                "pg_control version number:            1300\nDatabase cluster state:               {s}\npg_control last modified:             Fri 04 Dec 2026\n"
            )
        };
        let unclean = |text: &str| unclean_primary(&crate::pg::ControlData::parse(text));
        assert!(unclean(&state("in production")));
        assert!(unclean(&state("in crash recovery")));
        assert!(unclean(&state("shutting down")));
        assert!(!unclean(&state("shut down")));
        assert!(!unclean(&state("in archive recovery")));
        assert!(!unclean(&state("shut down in recovery")));
        assert!(!unclean(""));
    }
}
