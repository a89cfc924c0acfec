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
//! [`Pooler`] is everything but Kubernetes: configure, start, reload, read statistics,
//! stop. [`run`] adds the watches on top.

pub mod config;
pub mod http;
pub mod process;
pub mod stats;

use crate::error_chain;
use crate::pg::RunAs;
use crate::run::watch::{self, Inputs};
use config::{Desired, Files, Layout, Sourced};
use k8s_openapi::api::core::v1::{Pod, Secret};
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster::InstanceRole;
use pgop_api::constants::{APP_SECRET_SUFFIX, POSTGRES_PORT, SERVER_TLS_SECRET_SUFFIX};
use pgop_api::pooler::{PoolerSpec, PoolerType};
use pgop_api::v1beta1::PostgresCluster;
use process::PgBouncer;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How often a pass runs even when no watch reported a change (a safety net; a pass reads
/// what the watches keep and sends no request).
const RESYNC: Duration = Duration::from_secs(60);
/// The first retry of a failed pass; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The watch of an instance Pod no pass read for this long ends (no longer an instance).
const POD_IDLE: Duration = Duration::from_secs(300);
/// How long a stopping PgBouncer lets the transactions under way finish before it closes
/// every connection: with [`STOP_TIMEOUT`], within a pooler Pod's grace period
/// (30 s).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long PgBouncer has after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Everything `pgop pooler run` is told by its Pod.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cluster: String,
    pub namespace: String,
    /// The pooler's name in `spec.poolers`.
    pub pooler: String,
    pub pod_name: String,
    /// PgBouncer listens on it.
    pub pod_ip: IpAddr,
    /// The run directory: configuration, auth file, TLS files, Unix socket.
    pub dir: PathBuf,
    /// The `pgbouncer` binary.
    pub pgbouncer: PathBuf,
    /// PgBouncer's port (5432).
    pub port: u16,
    /// Where `/healthz`, `/readyz` and `/metrics` are served (the Pod IP, port 8000).
    pub http: SocketAddr,
    /// The OS user PgBouncer runs as when the manager is root (PgBouncer refuses root).
    pub run_as: Option<RunAs>,
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

/// The instances a pooler of `type_` sends connections to, by name: `rw`, the confirmed
/// primary (`currentPrimary`); `ro`, the ready replicas other than it, in name order.
pub fn target_instances(type_: PoolerType, status: &PostgresClusterStatus) -> Vec<String> {
    match type_ {
        PoolerType::Rw => status.current_primary.iter().cloned().collect(),
        PoolerType::Ro => {
            let mut names: Vec<String> = status
                .instances
                .iter()
                .filter(|i| {
                    i.role == Some(InstanceRole::Replica)
                        && i.ready
                        && status.current_primary.as_deref() != Some(i.name.as_str())
                })
                .map(|i| i.name.clone())
                .collect();
            names.sort();
            names.dedup();
            names
        }
    }
}

/// What the manager reads from the API server, each kept from a watch of that one
/// object; a change of what it uses of them wakes its loop (`wake`).
/// The pooler manager's watches: its cluster, the two Secrets, the instances' Pods.
fn inputs(client: &kube::Client, settings: &Settings) -> Inputs {
    Inputs::start(
        client,
        &settings.namespace,
        &settings.cluster,
        watch::Concerns {
            cluster: cluster_concerns,
            secret: secret_concerns,
            pod: pod_concerns,
        },
    )
}

/// What a pooler manager uses of its cluster: the poolers of the spec, the primary and
/// the instances' names, roles and readiness. LSNs, conditions and the rest wake nothing.
pub fn cluster_concerns(cluster: &PostgresCluster) -> u64 {
    #[derive(serde::Serialize)]
    struct Instance<'a> {
        name: &'a str,
        role: Option<InstanceRole>,
        ready: bool,
    }
    let status = cluster.status.as_ref();
    watch::digest(&(
        &cluster.metadata.uid,
        &cluster.spec.poolers,
        status.map(|s| &s.current_primary),
        status.map(|s| {
            s.instances
                .iter()
                .map(|i| Instance {
                    name: &i.name,
                    role: i.role,
                    ready: i.ready,
                })
                .collect::<Vec<_>>()
        }),
    ))
}

fn secret_concerns(secret: &Secret) -> u64 {
    watch::digest(&(&secret.data, &secret.string_data))
}

fn pod_concerns(pod: &Pod) -> u64 {
    watch::digest(&pod.status.as_ref().map(|s| &s.pod_ip))
}

/// The text of `key` in Secret `name` (read from its watch).
async fn secret_keys<const N: usize>(
    inputs: &Inputs,
    name: String,
    keys: [&'static str; N],
) -> Result<[Sourced; N], Error> {
    let secret = match inputs.secrets.get(&name).await {
        Ok(Some(secret)) => secret,
        Ok(None) => return Err(Error::NoSecret { name }),
        Err(source) => return Err(Error::ReadSecret { name, source }),
    };
    let mut out = Vec::with_capacity(N);
    for key in keys {
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| Error::SecretKey {
                name: name.clone(),
                key,
            })?;
        out.push(Sourced::from_secret(value, &name, key));
    }
    out.try_into()
        .map_err(|_| Error::SecretKey { name, key: "?" })
}

/// The Pod IP of each of `instances` that has a Pod with an address.
async fn pod_ips(inputs: &Inputs, instances: &[&str]) -> HashMap<String, IpAddr> {
    let mut ips = HashMap::new();
    for name in instances {
        let ip = match inputs.pods.get(name).await {
            Ok(pod) => pod
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
            Err(err) => {
                tracing::warn!(instance = %name, error = %error_chain(&err), "failed to read the instance's Pod");
                None
            }
        };
        if let Some(ip) = ip {
            ips.insert(name.to_string(), ip);
        }
    }
    ips
}

/// One pass: the cluster, its Secrets and the targets' Pods into [`Pooler::apply`].
/// `waiting`: the instances named when "no target" was last logged (logged again only
/// when they change).
async fn pass(
    inputs: &Inputs,
    settings: &Settings,
    pooler: &Pooler,
    waiting: &mut Option<Vec<String>>,
) -> Result<(), Error> {
    let cluster = inputs
        .cluster
        .get()
        .await
        .map_err(|source| Error::ReadCluster {
            name: settings.cluster.clone(),
            source,
        })?;
    let Some(cluster) = cluster else {
        pooler.withdraw(format!("PostgresCluster {} is gone", settings.cluster));
        return Ok(());
    };
    let Some(spec): Option<&PoolerSpec> = cluster
        .spec
        .poolers
        .iter()
        .find(|p| p.name == settings.pooler)
    else {
        pooler.withdraw(format!(
            "pooler {} is no longer in spec.poolers of PostgresCluster {}",
            settings.pooler, settings.cluster
        ));
        return Ok(());
    };
    let cluster_name = &settings.cluster;
    let [app_user, app_password] = secret_keys(
        inputs,
        format!("{cluster_name}{APP_SECRET_SUFFIX}"),
        ["username", "password"],
    )
    .await?;
    let [cert, key, ca] = secret_keys(
        inputs,
        format!("{cluster_name}{SERVER_TLS_SECRET_SUFFIX}"),
        ["tls.crt", "tls.key", "ca.crt"],
    )
    .await?;
    // Other roles are looked up as pgop_pooler; without its Secret (an older operator),
    // only the application owner logs in.
    let auth_password = match secret_keys(
        inputs,
        pgop_api::pooler::identity_name(cluster_name),
        ["password"],
    )
    .await
    {
        Ok([password]) => Some(password),
        Err(Error::NoSecret { name }) => {
            tracing::debug!(secret = %name, "no look-up Secret: only the application owner logs in");
            None
        }
        Err(err) => return Err(err),
    };
    let status = cluster.status.clone().unwrap_or_default();
    let instances = target_instances(spec.type_, &status);
    // Every instance's Pod is watched, not only the targets': when another instance
    // becomes the primary, its address is known already.
    let mut watched: Vec<&str> = status.instances.iter().map(|i| i.name.as_str()).collect();
    watched.extend(instances.iter().map(String::as_str));
    watched.sort_unstable();
    watched.dedup();
    let ips = pod_ips(inputs, &watched).await;
    let targets: Vec<IpAddr> = instances
        .iter()
        .filter_map(|name| {
            let ip = ips.get(name).copied();
            if ip.is_none() {
                tracing::debug!(instance = %name, "no address for the instance's Pod yet");
            }
            ip
        })
        .collect();
    let desired = Desired {
        targets: targets.clone(),
        server_port: POSTGRES_PORT,
        pool_mode: spec.pool_mode,
        max_client_connections: spec.max_client_connections,
        default_pool_size: spec.default_pool_size,
        app_user,
        app_password,
        auth_password,
        tls: config::Tls { cert, key, ca },
    };
    let before = pooler.targets();
    let applied = pooler.apply(&desired)?;
    let told = waiting.as_ref() == Some(&instances);
    *waiting = targets.is_empty().then(|| instances.clone());
    let shown = |t: &[IpAddr]| t.iter().map(ToString::to_string).collect::<Vec<_>>();
    match applied {
        Applied::Started => {
            tracing::info!(?instances, targets = ?shown(&targets), "PgBouncer configured and started")
        }
        Applied::NoTarget => {
            if !told {
                tracing::info!(?instances, "waiting for a server to send connections to")
            }
        }
        Applied::Reloaded | Applied::Unchanged if targets.is_empty() => {
            if !told {
                tracing::warn!(
                    ?instances,
                    kept = ?shown(&pooler.targets()),
                    "no server to send connections to; keeping the last ones (not ready)"
                )
            } else if applied == Applied::Reloaded {
                tracing::info!("PgBouncer reloaded with its new configuration (still no server)")
            }
        }
        Applied::Reloaded if before != targets => {
            tracing::info!(?instances, targets = ?shown(&targets), previous = ?shown(&before), "PgBouncer reloaded: new server connections go to the new targets")
        }
        Applied::Reloaded => tracing::info!("PgBouncer reloaded with its new configuration"),
        Applied::Unchanged => {}
    }
    Ok(())
}

/// The delay before retrying after `failures` failed passes in a row.
fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}

/// Runs the pooler manager until `shutdown` completes, then stops PgBouncer.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let mut shutdown = Box::pin(shutdown);
    if crate::reaper::is_init() {
        tokio::spawn(crate::reaper::run(Duration::from_secs(2)));
    }
    let pooler = Arc::new(Pooler::new(Options {
        cluster: settings.cluster.clone(),
        pooler: settings.pooler.clone(),
        layout: Layout {
            dir: settings.dir.clone(),
            listen: settings.pod_ip,
            port: settings.port,
        },
        pgbouncer: settings.pgbouncer.clone(),
        run_as: settings.run_as,
        drain_timeout: DRAIN_TIMEOUT,
        stop_timeout: STOP_TIMEOUT,
    })?);
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, server) = http::bind(settings.http, pooler.clone(), async move {
        let _ = http_stopped.await;
    })
    .await
    .map_err(Error::ServeHttp)?;
    tracing::info!(%addr, pooler = %settings.pooler, pod = %settings.pod_name, "serving health, readiness and metrics");
    let server = tokio::spawn(server);
    // PgBouncer listens on the Pod's address; kubectl port-forward reaches the loopback.
    let relay = tokio::spawn(crate::relay::loopback_relay(settings.pod_ip, settings.port));
    let inputs = inputs(&client, &settings);
    let mut resync = tokio::time::interval(RESYNC);
    let mut soon: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut failures: u32 = 0;
    let mut waiting = None;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = inputs.wake.notified() => {}
            _ = resync.tick() => {}
            () = async {
                match soon.as_mut() {
                    Some(sleep) => sleep.await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        soon = None;
        let result = tokio::select! {
            () = &mut shutdown => break,
            result = pass(&inputs, &settings, &pooler, &mut waiting) => result,
        };
        inputs.pods.forget_idle(POD_IDLE);
        match result {
            Ok(()) => failures = 0,
            Err(err) => {
                failures = failures.saturating_add(1);
                let delay = retry_after(failures);
                tracing::warn!(error = %error_chain(&err), retry_in = ?delay, "pass failed; keeping PgBouncer's last configuration");
                soon = Some(Box::pin(tokio::time::sleep(delay)));
            }
        }
    }
    tracing::info!("shutting down PgBouncer");
    relay.abort();
    pooler.stop().await;
    let _ = stop_http.send(());
    let _ = server.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(yaml: &str) -> PostgresClusterStatus {
        serde_yaml::from_str(yaml).expect("a status")
    }

    const STATUS: &str = r#"
currentPrimary: db-1
targetPrimary: db-2
instances:
  - {name: db-3, serial: 3, role: replica, ready: true}
  - {name: db-1, serial: 1, role: primary, ready: true}
  - {name: db-2, serial: 2, role: replica, ready: true}
  - {name: db-4, serial: 4, role: replica, ready: false}
  - {name: db-5, serial: 5, ready: true}
"#;

    #[test]
    fn rw_follows_the_confirmed_primary_never_the_target() {
        assert_eq!(
            target_instances(PoolerType::Rw, &status(STATUS)),
            ["db-1"],
            "targetPrimary db-2 is being promoted: it refuses writes until confirmed"
        );
        assert!(target_instances(PoolerType::Rw, &status("instances: []")).is_empty());
    }

    #[test]
    fn ro_spreads_over_the_ready_replicas_other_than_the_primary() {
        assert_eq!(
            target_instances(PoolerType::Ro, &status(STATUS)),
            ["db-2", "db-3"]
        );
        // A replica the status still lists as such but which is the primary now.
        let s = status(
            r#"
currentPrimary: db-2
instances:
  - {name: db-2, serial: 2, role: replica, ready: true}
  - {name: db-1, serial: 1, role: primary, ready: false}
"#,
        );
        assert!(target_instances(PoolerType::Ro, &s).is_empty());
    }

    fn cluster(yaml: &str) -> PostgresCluster {
        serde_yaml::from_str(yaml).expect("a cluster")
    }

    const CLUSTER: &str = r#"
apiVersion: database.example.com/v1beta1
kind: PostgresCluster
metadata: {name: db, namespace: ns, uid: u1}
spec:
  instances: 2
  storage: {size: 1Gi}
  poolers: [{name: rw}]
status:
  currentPrimary: db-1
  targetPrimary: db-1
  instances:
    - {name: db-1, serial: 1, role: primary, ready: true, receivedLsn: 0/3000000}
    - {name: db-2, serial: 2, role: replica, ready: true, replayedLsn: 0/3000000}
"#;

    fn moves(edit: impl FnOnce(&mut serde_json::Value)) -> bool {
        let before = cluster(CLUSTER);
        let mut value = serde_json::to_value(&before).expect("json");
        edit(&mut value);
        let after: PostgresCluster = serde_json::from_value(value).expect("a cluster");
        cluster_concerns(&before) != cluster_concerns(&after)
    }

    #[test]
    fn only_what_decides_the_targets_and_settings_wakes_the_manager() {
        assert!(!moves(
            |v| v["status"]["instances"][1]["replayedLsn"] = "0/4000000".into()
        ));
        assert!(!moves(|v| v["status"]["targetPrimary"] = "db-2".into()));
        assert!(!moves(|v| v["spec"]["instances"] = 3.into()));
        assert!(moves(|v| v["status"]["currentPrimary"] = "db-2".into()));
        assert!(moves(
            |v| v["status"]["instances"][1]["ready"] = false.into()
        ));
        assert!(moves(
            |v| v["status"]["instances"][1]["role"] = "primary".into()
        ));
        assert!(moves(
            |v| v["spec"]["poolers"][0]["poolMode"] = "session".into()
        ));
        assert!(moves(|v| v["spec"]["poolers"] = serde_json::json!([])));
        assert!(moves(|v| v["status"] = serde_json::Value::Null));
    }

    #[test]
    fn the_stats_password_is_random_and_long() {
        let a = random_password().expect("random");
        let b = random_password().expect("random");
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn a_failed_pass_is_retried_after_a_delay_that_doubles_up_to_a_cap() {
        assert_eq!(retry_after(1), RETRY_FIRST);
        assert_eq!(retry_after(3), Duration::from_secs(4));
        assert_eq!(retry_after(u32::MAX), RETRY_MAX);
    }
}
