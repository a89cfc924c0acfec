//! `pgop pooler run`: the manager of one PgBouncer pooler Pod (`spec.poolers`). It follows
//! its PostgresCluster, the Secrets `<cluster>-app` and `<cluster>-server-tls`, and the
//! Pods of the instances it sends connections to, each from a watch of that one object
//! ([`crate::run::watch`]); renders PgBouncer's files ([`config`], pure); runs PgBouncer as
//! a child ([`process`]) and reloads it (SIGHUP, never a restart) when they change, so that
//! a failover moves the server connections and no client connection; and serves
//! `/healthz`, `/readyz` and `/metrics` ([`http`], [`stats`]).
//!
//! Where connections go: an `rw` pooler to the Pod of `status.currentPrimary` (the
//! confirmed primary, never `targetPrimary` while a change is under way: a standby being
//! promoted refuses writes); an `ro` pooler to the ready replicas of `status.instances`,
//! round robin. With none, PgBouncer keeps its last servers and the pooler is not ready;
//! so too when the cluster is gone or no longer lists the pooler.
//!
//! This file holds [`Pooler`], everything but Kubernetes: configure, start, reload, read
//! statistics, stop. `run.rs` holds the watches on top: [`run()`], what it is told
//! ([`Settings`]), and the passes that turn what the watches keep into [`Pooler::apply`].

pub mod config;
pub mod http;
pub mod process;
mod run;
pub mod stats;

pub use run::{DRAIN_TIMEOUT, STOP_TIMEOUT, Settings, cluster_concerns, run, target_instances};

use crate::error_chain;
use crate::pg::RunAs;
use config::{Desired, Files, Layout};
use process::PgBouncer;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read PostgresCluster {name}")]
    ReadCluster {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to read Secret {name}")]
    ReadSecret {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {name} does not exist")]
    NoSecret { name: String },
    #[error("Secret {name} has no key {key} (or its value is not UTF-8)")]
    SecretKey { name: String, key: &'static str },
    #[error("failed to create the pooler's run directory {path}")]
    RunDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to generate the stats user's password")]
    Random(#[source] getrandom::Error),
    #[error("refused PgBouncer's configuration")]
    Render(#[source] config::Error),
    #[error("failed to write PgBouncer's files")]
    Write(#[source] crate::config::Error),
    #[error("failed to serve HTTP")]
    ServeHttp(#[source] http::Error),
}

/// How a [`Pooler`] runs PgBouncer.
#[derive(Debug, Clone)]
pub struct Options {
    /// Names the metrics' `cluster` and `pooler` labels.
    pub cluster: String,
    pub pooler: String,
    pub layout: Layout,
    pub pgbouncer: PathBuf,
    pub run_as: Option<RunAs>,
    /// [`DRAIN_TIMEOUT`] for `pgop pooler run`.
    pub drain_timeout: Duration,
    pub stop_timeout: Duration,
}

/// What [`Pooler::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Files written and PgBouncer started.
    Started,
    /// Files rewritten and PgBouncer told to reload.
    Reloaded,
    /// Nothing changed.
    Unchanged,
    /// No target and no configuration yet: PgBouncer is not started.
    NoTarget,
}

/// Why the pooler is not ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("no configuration yet")]
    NotConfigured,
    #[error("{0}; keeping the last configuration")]
    Withdrawn(String),
    #[error("no server to send connections to; keeping the last ones")]
    NoTarget,
    #[error("PgBouncer is not running")]
    NotRunning,
    #[error("PgBouncer does not answer: {0}")]
    Console(String),
}

/// What the pooler was last configured with.
#[derive(Debug, Default)]
struct Inner {
    /// The files as last written.
    files: Option<Files>,
    /// The servers of the files (kept while the cluster names none).
    targets: Vec<IpAddr>,
    /// The servers the cluster names now.
    targets_now: usize,
    /// Why the pooler no longer follows its cluster (gone, or the pooler no longer in
    /// its spec).
    withdrawn: Option<String>,
}

/// One PgBouncer and its files, without Kubernetes: [`Pooler::apply`] writes what changed
/// and starts or reloads PgBouncer; [`Pooler::stats`], [`Pooler::readiness`] and
/// [`Pooler::metrics`] read its admin console.
pub struct Pooler {
    options: Options,
    stats_password: String,
    admin: stats::Admin,
    inner: Mutex<Inner>,
    pgbouncer: Mutex<Option<PgBouncer>>,
}

impl std::fmt::Debug for Pooler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooler")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A password of 32 random bytes, hex.
fn random_password() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(Error::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Pooler {
    /// Creates the run directory (owned by `run_as`, when given) and the stats user's
    /// password; PgBouncer starts at the first [`Pooler::apply`] with a target.
    pub fn new(options: Options) -> Result<Self, Error> {
        make_dir(&options.layout.dir, options.run_as)?;
        let stats_password = random_password()?;
        Ok(Self {
            admin: stats::Admin::new(&options.layout, &stats_password),
            stats_password,
            options,
            inner: Mutex::new(Inner::default()),
            pgbouncer: Mutex::new(None),
        })
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pgbouncer(&self) -> std::sync::MutexGuard<'_, Option<PgBouncer>> {
        self.pgbouncer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Configures PgBouncer as `desired` says: the files that changed are written (mode
    /// 0600), then PgBouncer is started (the first time) or told to reload. Without a
    /// target the last servers are kept (and the pooler is not ready); a configuration
    /// refused ([`config::render`]) leaves everything as it was.
    pub fn apply(&self, desired: &Desired) -> Result<Applied, Error> {
        let mut inner = self.inner();
        inner.targets_now = desired.targets.len();
        inner.withdrawn = None;
        let targets = if desired.targets.is_empty() {
            if inner.targets.is_empty() {
                return Ok(Applied::NoTarget);
            }
            inner.targets.clone()
        } else {
            desired.targets.clone()
        };
        let effective = Desired {
            targets,
            ..desired.clone()
        };
        let files = config::render(&self.options.layout, &effective, &self.stats_password)
            .map_err(Error::Render)?;
        let layout = &self.options.layout;
        let before = inner.files.as_ref();
        let mut changed = false;
        for (path, content, old) in [
            (
                layout.tls_cert(),
                &files.tls_cert,
                before.map(|f| &f.tls_cert),
            ),
            (layout.tls_key(), &files.tls_key, before.map(|f| &f.tls_key)),
            (
                layout.server_ca(),
                &files.server_ca,
                before.map(|f| &f.server_ca),
            ),
            (layout.auth_file(), &files.auth, before.map(|f| &f.auth)),
            (layout.ini(), &files.ini, before.map(|f| &f.ini)),
        ] {
            if old != Some(content) {
                crate::config::write_file(&path, content, self.options.run_as)
                    .map_err(Error::Write)?;
                changed = true;
            }
        }
        inner.files = Some(files);
        inner.targets = effective.targets;
        drop(inner);
        let mut pgbouncer = self.pgbouncer();
        Ok(match pgbouncer.as_ref() {
            None => {
                *pgbouncer = Some(PgBouncer::start(process::Options {
                    program: self.options.pgbouncer.clone(),
                    ini: layout.ini(),
                    socket: layout.socket(),
                    run_as: self.options.run_as,
                    drain_timeout: self.options.drain_timeout,
                    stop_timeout: self.options.stop_timeout,
                }));
                Applied::Started
            }
            Some(running) if changed => {
                running.reload();
                Applied::Reloaded
            }
            Some(_) => Applied::Unchanged,
        })
    }

    /// The cluster is gone, or no longer lists this pooler: PgBouncer keeps its last
    /// configuration and the pooler reports not ready, `why`.
    pub fn withdraw(&self, why: String) {
        self.inner().withdrawn = Some(why);
    }

    /// The servers PgBouncer's configuration names now.
    pub fn targets(&self) -> Vec<IpAddr> {
        self.inner().targets.clone()
    }

    /// PgBouncer's state ([`process::State::Stopped`] before the first start).
    pub fn state(&self) -> process::State {
        self.pgbouncer()
            .as_ref()
            .map_or(process::State::Stopped, PgBouncer::state)
    }

    /// Every change of PgBouncer's state, once it was started.
    pub fn state_changes(&self) -> Option<tokio::sync::watch::Receiver<process::State>> {
        self.pgbouncer().as_ref().map(PgBouncer::state_changes)
    }

    pub fn restarts(&self) -> u64 {
        self.pgbouncer().as_ref().map_or(0, PgBouncer::restarts)
    }

    pub fn reloads(&self) -> u64 {
        self.pgbouncer().as_ref().map_or(0, PgBouncer::reloads)
    }

    /// The admin console's `SHOW POOLS` and `SHOW STATS`.
    pub async fn stats(&self) -> Result<stats::Stats, stats::Error> {
        self.admin.stats().await
    }

    /// Ready: configured, following its cluster, with a server to send connections to,
    /// PgBouncer up and its admin console answering.
    pub async fn readiness(&self) -> Result<(), NotReady> {
        {
            let inner = self.inner();
            if let Some(why) = &inner.withdrawn {
                return Err(NotReady::Withdrawn(why.clone()));
            }
            if inner.files.is_none() {
                return Err(NotReady::NotConfigured);
            }
            if inner.targets_now == 0 {
                return Err(NotReady::NoTarget);
            }
        }
        if !matches!(self.state(), process::State::Up { .. }) {
            return Err(NotReady::NotRunning);
        }
        self.admin
            .answers()
            .await
            .map_err(|e| NotReady::Console(error_chain(&e)))
    }

    /// `/metrics`: the admin console's statistics (none when it does not answer) and the
    /// manager's counts.
    pub async fn metrics(&self) -> Result<String, std::fmt::Error> {
        let stats = if self.state().pid().is_some() {
            match self.stats().await {
                Ok(stats) => Some(stats),
                Err(err) => {
                    tracing::debug!(error = %error_chain(&err), "no statistics from PgBouncer");
                    None
                }
            }
        } else {
            None
        };
        let targets = self.inner().targets_now;
        stats::encode(
            stats.as_ref(),
            stats::Manager {
                cluster: &self.options.cluster,
                pooler: &self.options.pooler,
                targets,
                reloads: self.reloads(),
                restarts: self.restarts(),
            },
        )
    }

    /// Stops PgBouncer: SIGINT, so that the transactions under way finish (it is not ready
    /// from now on), SIGTERM after the drain timeout, SIGKILL after the stop timeout.
    pub async fn stop(&self) {
        let running = self.pgbouncer().take();
        if let Some(running) = running {
            running.stop().await;
        }
    }
}

/// The run directory; when the manager is root, given to `run_as` (mode 0700) so that
/// PgBouncer can read its files and create its socket there.
fn make_dir(dir: &Path, run_as: Option<RunAs>) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |source| Error::RunDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    if let Some(user) = run_as {
        user.chown(dir).map_err(failed)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_password_is_random_and_long() {
        let a = random_password().expect("random");
        let b = random_password().expect("random");
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
