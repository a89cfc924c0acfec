//! `pgop instance run`: the instance manager inside a pod. It reads its own PostgresCluster,
//! the cluster's Secrets and the primary's Pod from watches narrowed to each object
//! ([`watch`]: no request in the steady state; a pass runs when what it uses of them
//! changes, when PostgreSQL's state changes, and at a periodic resync), and turns the
//! cluster status into calls on [`Instance`]: bootstrap, start, promote when
//! `targetPrimary` names this instance, follow or rejoin the primary otherwise, slots and
//! synchronous standbys on the primary, configuration everywhere. It must never choose a
//! primary: with no `targetPrimary`/`currentPrimary` in the status it waits.
//!
//! A pass (`reconcile`) reads as its steps: fencing first; then refresh what it takes
//! from the Secrets (`secrets::refresh`), observe (`observe`: the status, the primary it
//! names and its address, PostgreSQL), plan ([`plan()`], pure: one action), act on the plan
//! (`act`), and converge the running PostgreSQL on the spec (`converge`: synchronous
//! standbys, slots, passwords, roles, databases, configuration, a requested restart).
//!
//! PostgreSQL runs as a primary only while this instance holds the primary Lease
//! ([`crate::lease`]): it is acquired before bootstrapping, starting or promoting a primary,
//! renewed in the background (losing it stops PostgreSQL at once), and released whenever
//! PostgreSQL stops running as a primary (step-down, crash, shutdown), so that the next
//! primary need not wait for it to expire.
//!
//! Why this file stays whole: it is one idea, the manager's loop: `run` (start, the loop
//! of passes, shutdown), the pass it repeats (`reconcile`), and what only those two share
//! (the Lease held across passes, the memory of the last pass, the retry policy, which
//! watch changes wake a pass); each step of a pass is a submodule of its own.

mod act;
mod converge;
mod observe;
mod plan;
mod secrets;
mod upgrade;
pub mod watch;
use watch::Inputs;

pub use plan::{Action, Observed, Plan, plan};
pub use secrets::recovery_target;
use secrets::{archiving, recovery_of, refresh, wait_for_credentials};

use crate::bootstrap::DataState;
use crate::config::{Layout, Mode};
use crate::instance::{self, Instance, Options};
use crate::lease::{self, Keeper, PRIMARY_TIMINGS, PrimaryLease};
use crate::pg::{Binaries, RunAs, Upstream};
use crate::sync::SyncSpec;
use crate::upgrade::UpgradeRequest;
use crate::{error_chain, http};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster::RecoverySource;
use pgop_api::v1beta1::PostgresCluster;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How soon a pass that waits for the Lease or a change of primary is run again.
const SOON: Duration = Duration::from_millis(400);
/// How soon a failed pass is retried while the primary changes.
const RETRY_WHILE_CHANGING: Duration = Duration::from_secs(1);
/// How soon a failed pass is retried otherwise, the first time; the delay doubles with
/// each failure in a row, up to [`RETRY_MAX`]. A failure (a standby whose primary is not
/// up yet, say) must not wait for the resync, and must not spin either.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay before a failed pass is retried.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The delay before retrying after `failures` failed passes in a row (at least one).
fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}
/// How long a primary fenced by a failover waits for its fast shutdown (walsenders shipping
/// the last WAL) before an immediate one.
const FAILOVER_STEP_DOWN_BOUND: Duration = Duration::from_secs(2);
/// Added to `spec.failoverDelay`: how long a crashed primary stays down before restarting
/// as the primary, if the status still names it then.
const CRASH_HOLD_OFF_EXTRA: Duration = Duration::from_secs(10);
/// How often a pass that waits for `status.recoverySource` runs again.
const WAIT_FOR_RECOVERY_SOURCE: Duration = Duration::from_secs(2);
/// How long after a failed restore the next attempt waits.
const RESTORE_BACKOFF: Duration = Duration::from_secs(30);
/// How often a manager without PostgreSQL's certificates looks for them again.
const WAIT_FOR_CERTIFICATES: Duration = Duration::from_secs(2);
/// How long a restore may replay WAL.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// A Secret no pass read for this long is no longer watched (e.g. the spec names another
/// store Secret now).
const SECRET_IDLE: Duration = Duration::from_secs(600);
/// How long a standby that does not stream must keep looking diverged from the primary's
/// timeline before it is rewound: its own timeline is read from its last restartpoint
/// while no WAL receiver runs, which can lag behind the one it replays for a moment.
const DIVERGENCE_CONFIRM: Duration = Duration::from_secs(3);
/// How often a standby that should stream from the primary but does not looks again
/// whether it diverged (nothing else wakes the manager while it retries).
const STREAM_RECHECK: Duration = Duration::from_secs(2);
/// How often a designated primary that does not stream from its source asks the source
/// again why (one replication connection each time).
const SOURCE_RECHECK: Duration = Duration::from_secs(5);

/// How long a segment must be missing from a source's store while a later one is there
/// before it is called a gap: the archiver uploads a few segments at once when it is
/// behind, so a later one may arrive first for a moment.
const ARCHIVE_GAP_CONFIRM: Duration = Duration::from_secs(30);

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
    #[error("failed to read key {key} of Secret {name}")]
    ReadSecretKey { name: String, key: &'static str },
    #[error("failed to read key {key} of the backup store's Secret {name}")]
    ReadStoreSecretKey { name: String, key: String },
    #[error("failed to configure the backup store")]
    StoreConfig(#[source] pgop_backup::config::Error),
    #[error("failed to find the address of primary {name}")]
    ResolvePrimary {
        name: String,
        #[source]
        source: Option<kube::Error>,
    },
    #[error("failed to serve HTTP")]
    ServeHttp(#[source] http::Error),
    #[error("failed to manage the instance")]
    ManageInstance(#[source] instance::Error),
    #[error("failed to stop PostgreSQL")]
    Shutdown(#[source] instance::Error),
    #[error("failed to manage the primary Lease")]
    Lease(#[source] lease::Error),
    #[error("spec.replica.source {source_name:?}: {message}")]
    ReplicaSource {
        source_name: String,
        message: String,
    },
}

/// What the loop does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Wait for a change that concerns the manager, the resync tick or a postmaster state
    /// change.
    Idle,
    /// Run again shortly: waiting for the Lease, a hold-off or a change of primary.
    Soon,
    /// Run again after this long (waiting for the operator, or backing off).
    After(Duration),
}

/// The primary Lease as this manager holds it.
struct LeaseHold {
    lease: Arc<PrimaryLease>,
    /// Renewing: held since PostgreSQL was started or promoted as the primary.
    keeper: Option<Keeper>,
    /// Given up but not yet released (a failed release is retried on the next pass).
    release_pending: bool,
    /// Whether "waiting for the Lease" was logged since it was last held.
    waiting_logged: bool,
}

impl LeaseHold {
    /// Acquires the Lease (or keeps it) and renews it from now on; `false`: held by
    /// someone else.
    async fn acquire(&mut self, instance: &Arc<Instance>) -> Result<bool, Error> {
        let sent = Instant::now();
        if !self.lease.try_acquire().await.map_err(Error::Lease)? {
            if !self.waiting_logged {
                let holder = self.lease.holder().await.ok().flatten();
                tracing::info!(?holder, "waiting for the primary Lease");
                self.waiting_logged = true;
            }
            return Ok(false);
        }
        self.waiting_logged = false;
        self.release_pending = false;
        if self.keeper.as_ref().is_none_or(|k| k.fenced().is_some()) {
            tracing::info!(lease = %self.lease.name(), "holding the primary Lease");
            let fenced = instance.clone();
            self.keeper = Some(lease::keep(self.lease.clone(), sent, move |_| async move {
                if let Err(err) = fenced.stop_now().await {
                    tracing::error!(error = %error_chain(&err), "failed to stop PostgreSQL when fencing");
                }
            }));
        }
        Ok(true)
    }

    /// Stops renewing and releases the Lease (if still held by this instance).
    async fn give_up(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.stop().await;
            self.release_pending = true;
        }
        if self.release_pending {
            match self.lease.release().await {
                Ok(_) => self.release_pending = false,
                Err(err) => {
                    tracing::warn!(error = %error_chain(&err), "failed to release the primary Lease; retrying")
                }
            }
        }
    }

    /// The Lease is held only while PostgreSQL runs as a primary (or as a replica
    /// cluster's designated primary): after a step-down, a crash, a fence or a failed
    /// promotion it is given up at once.
    async fn settle(&mut self, instance: &Instance) {
        let fenced = self.keeper.as_ref().and_then(Keeper::fenced);
        if let Some(reason) = &fenced
            && instance.pid().is_some()
        {
            // Started again by something else meanwhile: never run without the Lease.
            tracing::error!(%reason, "PostgreSQL runs without the primary Lease; stopping it");
            if let Err(err) = instance.stop_now().await {
                tracing::error!(error = %error_chain(&err), "failed to stop PostgreSQL when fencing");
            }
        }
        let primary = instance.pid().is_some()
            && matches!(
                instance.mode(),
                Mode::Primary | Mode::DesignatedPrimary { .. }
            );
        if fenced.is_some() || !primary || self.keeper.is_none() {
            if self.keeper.is_some() && instance.crashed_at().is_some() {
                tracing::warn!("the primary's postmaster exited; releasing the primary Lease");
            }
            self.give_up().await;
        }
    }
}

/// Everything `pgop instance run` is told by its pod.
#[derive(Debug, Clone)]
pub struct Settings {
    pub pod_name: String,
    pub namespace: String,
    pub cluster: String,
    /// Where PostgreSQL listens (the pod IP) besides the Unix socket.
    pub listen_addresses: String,
    pub pg_port: u16,
    pub pgdata: PathBuf,
    pub socket_dir: PathBuf,
    /// The WAL volume's mount (`PGOP_WAL_DIR`, with `spec.walStorage`).
    pub wal_dir: Option<PathBuf>,
    pub http_listen: SocketAddr,
    /// Where the mutual-TLS endpoint listens ([`crate::tls`]).
    pub tls_listen: SocketAddr,
    pub binaries: Binaries,
    pub run_as: Option<RunAs>,
    pub stop_timeout: Duration,
    /// How often a pass runs even when nothing that concerns the manager changed (a
    /// safety net: the pass reads what the watches keep, it sends no request).
    pub resync: Duration,
    /// The `pgop` binary PostgreSQL's `archive_command` runs (this very binary).
    pub pgop_binary: PathBuf,
    /// Where a `spec.backup.store.volume` claim is mounted in the pod.
    pub backup_volume_path: PathBuf,
    /// The running pgop binary's version, reported on `/pg/status` (`managerVersion`).
    pub version: String,
    /// An in-place major upgrade of the data directory to the major of `binaries`, asked
    /// by the operator on the primary's Pod (`PGOP_UPGRADE_FROM`, `PGOP_UPGRADE_MODE`): run
    /// before PostgreSQL starts when the data directory holds `from`.
    pub upgrade: Option<UpgradeRequest>,
}

/// What the manager reads from the API server, each kept from a watch of that one object
/// ([`watch`]): its cluster, the Secrets it uses, and the Pod of the primary the status
/// names (one Pod watch, moved when the primary changes). A change of what the manager
/// uses of them wakes its loop (`wake`).
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

/// What of its cluster the manager acts on, as a digest: a change of anything else (the
/// operator's status writes of LSNs, readiness, conditions, backup times) wakes nothing.
/// The whole spec and generation; the uid (the Lease's ownerReference); of the status,
/// what [`plan()`] and [`reconcile`] read: the primaries named, the instances' names, the
/// phase, the recovery source, the rolling restart, and whether the cluster was a replica
/// cluster and its promotion approved (not its lag). The manager reads no annotation or
/// label of its cluster (the restart annotation reaches it as `status.restartRequested`).
pub fn cluster_concerns(cluster: &PostgresCluster) -> u64 {
    #[derive(serde::Serialize)]
    struct Status<'a> {
        phase: &'a Option<pgop_api::cluster::ClusterPhase>,
        current_primary: &'a Option<String>,
        target_primary: &'a Option<String>,
        instances: Vec<&'a str>,
        recovery_source: &'a Option<RecoverySource>,
        restart_instance: &'a Option<String>,
        restart_requested: &'a Option<pgop_api::cluster::RestartRequest>,
        instance_restarts: &'a [pgop_api::cluster::InstanceRestart],
        replica: Option<bool>,
    }
    #[derive(serde::Serialize)]
    struct Concerns<'a> {
        uid: &'a Option<String>,
        generation: Option<i64>,
        spec: &'a pgop_api::v1beta1::PostgresClusterSpec,
        status: Option<Status<'a>>,
    }
    watch::digest(&Concerns {
        uid: &cluster.metadata.uid,
        generation: cluster.metadata.generation,
        spec: &cluster.spec,
        status: cluster.status.as_ref().map(|s| Status {
            phase: &s.phase,
            current_primary: &s.current_primary,
            target_primary: &s.target_primary,
            instances: s.instances.iter().map(|i| i.name.as_str()).collect(),
            recovery_source: &s.recovery_source,
            restart_instance: &s.restart_instance,
            restart_requested: &s.restart_requested,
            instance_restarts: &s.instance_restarts,
            replica: s.replica.as_ref().map(|r| r.promotion.is_some()),
        }),
    })
}

/// A Secret's data: credentials, certificates renewed by the operator, S3 keys.
fn secret_concerns(secret: &Secret) -> u64 {
    watch::digest(&(&secret.data, &secret.string_data))
}

/// The primary's address.
fn pod_concerns(pod: &Pod) -> u64 {
    watch::digest(&pod.status.as_ref().map(|s| &s.pod_ip))
}

/// Runs the manager until `shutdown` completes, then stops PostgreSQL cleanly.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let inputs = inputs(&client, &settings);
    let mut shutdown = Box::pin(shutdown);
    crate::reaper::register_backup_programs();
    if crate::reaper::is_init() {
        tokio::spawn(crate::reaper::run(Duration::from_secs(2)));
    }
    let credentials = tokio::select! {
        () = &mut shutdown => return Ok(()),
        credentials = wait_for_credentials(&inputs, &settings) => credentials,
    };
    let instance = Arc::new(
        Instance::new(Options {
            layout: Layout {
                instance: settings.pod_name.clone(),
                cluster: settings.cluster.clone(),
                pgdata: settings.pgdata.clone(),
                listen_addresses: settings.listen_addresses.clone(),
                port: settings.pg_port,
                socket_dir: settings.socket_dir.clone(),
                wal_dir: settings.wal_dir.clone(),
            },
            binaries: settings.binaries.clone(),
            run_as: settings.run_as,
            credentials,
            stop_timeout: settings.stop_timeout,
            start_timeout: Duration::from_secs(300),
            forward_logs: true,
            // A crashed primary waits: the Lease is released first and the operator may fail
            // over (see `Observed::held_off`).
            restart_crashed_primary: false,
        })
        .with_manager_version(&settings.version),
    );
    let mut hold = LeaseHold {
        lease: Arc::new(PrimaryLease::new(
            client.clone(),
            &settings.namespace,
            &settings.cluster,
            &settings.pod_name,
            PRIMARY_TIMINGS,
        )),
        keeper: None,
        // A manager that starts may find the Lease still naming its Pod: its container
        // was killed (OOM, crash, `crictl stop`) while it held it. It does not run
        // PostgreSQL as the primary yet, so the first pass releases it (only if it names
        // this Pod), rather than leaving the next primary to wait for it to expire; it is
        // taken again if this instance starts as the primary.
        release_pending: true,
        waiting_logged: false,
    };
    // Every renewal of the primary Lease as it happens (a watch on that one object), so
    // that a standby named to take over a primary that vanished (a lost node) waits the
    // Lease's duration from the last renewal, not from when it was named.
    if let Ok(ip) = settings.listen_addresses.parse::<std::net::IpAddr>() {
        tokio::spawn(crate::relay::loopback_relay(ip, settings.pg_port));
    }
    tokio::spawn(watch_lease(
        client.clone(),
        settings.namespace.clone(),
        hold.lease.clone(),
    ));
    // A Pod created anew on its old volume (a rolling update, a deleted Pod) may find
    // PGDATA opened to its group by the kubelet's fsGroup change; PostgreSQL would refuse
    // to start on it.
    match crate::bootstrap::restore_mode(&settings.pgdata) {
        Ok(Some(mode)) => tracing::warn!(
            pgdata = %settings.pgdata.display(),
            mode = format!("{mode:o}"),
            "the data directory was not private (a volume ownership change?); made it 0700"
        ),
        Ok(None) => {}
        Err(e) => tracing::warn!(
            pgdata = %settings.pgdata.display(),
            error = %e,
            "failed to check the data directory's mode"
        ),
    }
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, server) = http::bind(settings.http_listen, instance.clone(), async move {
        let _ = http_stopped.await;
    })
    .await
    .map_err(Error::ServeHttp)?;
    tracing::info!(%addr, instance = %settings.pod_name, "serving health and status");
    let server = tokio::spawn(server);
    let (material, server_tls) = crate::tls::Material::new();
    let (stop_tls, tls_stopped) = tokio::sync::oneshot::channel::<()>();
    let (tls_addr, tls_server) = http::bind_tls(
        settings.tls_listen,
        instance.clone(),
        server_tls,
        async move {
            let _ = tls_stopped.await;
        },
    )
    .await
    .map_err(Error::ServeHttp)?;
    tracing::info!(address = %tls_addr, "serving backups and retention over mutual TLS once the certificate is read");
    let tls_server = tokio::spawn(tls_server);
    let servers = Servers {
        stop_http,
        stop_tls,
        server,
        tls_server,
    };

    // A major upgrade (or what an interrupted one left) before PostgreSQL may start, while
    // the endpoints serve. A failed one leaves PostgreSQL stopped, reported on /pg/status,
    // until the Pod goes: exiting would only restart the manager into the same attempt.
    let upgraded = tokio::select! {
        () = &mut shutdown => return stop_all(&instance, &mut hold, servers).await,
        upgraded = upgrade::upgrade_data(&settings) => upgraded,
    };
    if let Err(err) = upgraded {
        let chain = error_chain(&err);
        tracing::error!(error = %chain, "the major upgrade failed; PostgreSQL stays stopped until the Pod is replaced");
        instance.set_major_upgrade_error(Some(chain));
        hold.give_up().await;
        shutdown.await;
        return stop_all(&instance, &mut hold, servers).await;
    }

    let mut resync = tokio::time::interval(settings.resync);
    // PostgreSQL killed while primary (its container, or the manager during a crash
    // hold-off): held off like a crash seen by this manager, so that a failover the
    // operator may be choosing now, on what the standbys received, is not raced by this
    // instance accepting commits again.
    let mut memory = Memory {
        crashed_before_start: instance.crashed_as_primary().await.then(Instant::now),
        ..Memory::default()
    };
    if memory.crashed_before_start.is_some() {
        tracing::warn!(
            "PostgreSQL was not shut down as the primary (a killed container or a crash); \
             not started as the primary before the crash hold-off"
        );
    }
    let mut states = instance.state_changes();
    let mut soon: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    // Failed passes in a row: the retry backs off (see `retry_after`).
    let mut failures: u32 = 0;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            // A change of what the manager uses of its cluster, its Secrets or the primary's
            // Pod (the watches of `inputs`).
            () = inputs.wake.notified() => {}
            _ = resync.tick() => {}
            // A crash, a fence or a stop: act at once.
            Ok(()) = states.changed() => {}
            () = async {
                match soon.as_mut() {
                    Some(sleep) => sleep.await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        soon = None;
        let step = async {
            let cluster = inputs
                .cluster
                .get()
                .await
                .map_err(|source| Error::ReadCluster {
                    name: settings.cluster.clone(),
                    source,
                });
            let cluster = match cluster {
                Ok(Some(cluster)) => cluster,
                Ok(None) => return (false, Ok(Next::Idle)),
                Err(err) => return (false, Err(err)),
            };
            let changing = cluster
                .status
                .as_ref()
                .is_some_and(|s| s.target_primary != s.current_primary);
            let result = reconcile(
                &inputs,
                &settings,
                &instance,
                &material,
                &mut hold,
                &cluster,
                &mut memory,
            )
            .await;
            inputs.secrets.forget_idle(SECRET_IDLE);
            (changing, result)
        };
        tokio::select! {
            // An interrupted bootstrap leaves its marker: the next start redoes it.
            () = &mut shutdown => break,
            (changing, result) = step => {
                if result.is_ok() {
                    failures = 0;
                }
                match result {
                    Ok(Next::Soon) => soon = Some(Box::pin(tokio::time::sleep(SOON))),
                    Ok(Next::After(after)) => soon = Some(Box::pin(tokio::time::sleep(after))),
                    Ok(Next::Idle) if changing => soon = Some(Box::pin(tokio::time::sleep(SOON))),
                    Ok(Next::Idle) => {}
                    Err(err) => {
                        failures = failures.saturating_add(1);
                        let delay = if changing {
                            RETRY_WHILE_CHANGING
                        } else {
                            retry_after(failures)
                        };
                        tracing::warn!(error = %error_chain(&err), retry_in = ?delay, "reconcile failed; retrying");
                        soon = Some(Box::pin(tokio::time::sleep(delay)));
                    }
                }
            }
        }
    }
    stop_all(&instance, &mut hold, servers).await
}

/// The HTTP servers of [`run`], and how to stop them.
struct Servers {
    stop_http: tokio::sync::oneshot::Sender<()>,
    stop_tls: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), http::Error>>,
    tls_server: tokio::task::JoinHandle<Result<(), http::Error>>,
}

/// The end of [`run`]: PostgreSQL stopped cleanly, the Lease released, the servers
/// stopped.
async fn stop_all(
    instance: &Instance,
    hold: &mut LeaseHold,
    servers: Servers,
) -> Result<(), Error> {
    tracing::info!("shutting down PostgreSQL");
    let stopped = instance.shutdown().await.map_err(Error::Shutdown);
    // Released after the stop, so that the next primary can start at once.
    hold.give_up().await;
    let _ = servers.stop_http.send(());
    let _ = servers.stop_tls.send(());
    let _ = servers.server.await;
    let _ = servers.tls_server.await;
    stopped
}

/// Whether this standby (as `pg` reports it) replayed past the fork of the primary's
/// timeline from its own ([`crate::pg::timeline::diverged`]). Anything unknown (the primary
/// does not answer or is not a primary yet, a position is missing) reads as not diverged:
/// the data is only rewound on evidence.
async fn diverged_from(upstream: &Upstream, pg: &pgop_api::instance_status::PgStatus) -> bool {
    let position = pg.timeline.and_then(|t| u32::try_from(t).ok()).zip(
        pg.replayed_lsn
            .as_deref()
            .and_then(pgop_api::instance_status::parse_lsn),
    );
    let Some((timeline, replayed)) = position else {
        return false;
    };
    match upstream.timeline().await {
        Ok(Some(primary)) => crate::pg::timeline::diverged(
            &primary,
            crate::pg::timeline::StandbyPosition { timeline, replayed },
        ),
        Ok(None) => false,
        Err(err) => {
            tracing::debug!(error = %error_chain(&err), "failed to read the primary's timeline history");
            false
        }
    }
}

/// Whether a state seen now (`seen`: a divergence, WAL gone upstream) has lasted
/// [`DIVERGENCE_CONFIRM`]: `since` holds when it was first seen, and is cleared as soon as
/// it is not.
fn confirmed(seen: bool, since: &mut Option<Instant>, now: Instant) -> bool {
    if !seen {
        *since = None;
        return false;
    }
    let first = *since.get_or_insert(now);
    now.saturating_duration_since(first) >= DIVERGENCE_CONFIRM
}

/// What the loop remembers from one pass to the next.
#[derive(Debug, Default)]
struct Memory {
    /// When the last restore of a bootstrap failed (it is retried after a back-off).
    bootstrap_failed: Option<Instant>,
    /// Since when this standby has looked diverged from the primary's timeline.
    diverged_since: Option<Instant>,
    /// Since when this standby has not streamed after the primary said it removed WAL the
    /// standby needs.
    wal_gone_since: Option<Instant>,
    /// When this manager started on a primary's data PostgreSQL did not shut down
    /// (`Instance::crashed_as_primary`); cleared once PostgreSQL runs.
    crashed_before_start: Option<Instant>,
    /// Since when making the data directory (initdb, a clone) has failed; cleared once it
    /// is made.
    making_failed_since: Option<Instant>,
}

/// How long making the data directory (initdb, a clone) may fail before `/pg/status` says
/// so (`bootstrapError`): a standby made with its cluster clones before its primary
/// listens, and fails a few times on the way.
const MAKING_GRACE: Duration = Duration::from_secs(30);

/// What `bootstrapError` becomes after an attempt to make the data directory that ended
/// in `failed` (the error chain) at `now`: `Some(None)` (cleared) once made after a
/// failure, `Some(Some(chain))` once it has failed for [`MAKING_GRACE`], else `None`
/// (unchanged).
fn making_report(
    since: &mut Option<Instant>,
    now: Instant,
    failed: Option<String>,
) -> Option<Option<String>> {
    match failed {
        None => since.take().map(|_| None),
        Some(chain) => {
            let first = *since.get_or_insert(now);
            (now.duration_since(first) >= MAKING_GRACE).then_some(Some(chain))
        }
    }
}

/// [`making_report`] applied to the instance's status.
fn made<T>(instance: &Instance, memory: &mut Memory, result: Result<T, Error>) -> Result<T, Error> {
    let failed = result.as_ref().err().map(|e| error_chain(e));
    if let Some(report) = making_report(&mut memory.making_failed_since, Instant::now(), failed) {
        instance.set_bootstrap_error(report);
    }
    result
}

/// One pass: observe, plan (pure, in [`plan`]), act, then slots, synchronous standbys and
/// configuration.
async fn reconcile(
    inputs: &Inputs,
    settings: &Settings,
    instance: &Arc<Instance>,
    material: &crate::tls::Material,
    hold: &mut LeaseHold,
    cluster: &PostgresCluster,
    memory: &mut Memory,
) -> Result<Next, Error> {
    if let Some(owner) = owner_reference(cluster) {
        hold.lease.set_owner(owner);
    }
    hold.settle(instance).await;
    // spec.fencedInstances: PostgreSQL stopped cleanly and kept stopped, the Pod kept
    // running; the operator neither fails over a fenced primary nor promotes a fenced
    // standby.
    let fence_requested = cluster.spec.fenced_instances.contains(&settings.pod_name);
    if fence_requested {
        if !instance.fenced() || instance.pid().is_some() {
            tracing::info!(
                "fenced (spec.fencedInstances): stopping PostgreSQL cleanly; it stays stopped until the instance is unfenced"
            );
            instance.fence().await.map_err(Error::ManageInstance)?;
        }
        hold.settle(instance).await;
        return Ok(Next::Idle);
    }
    if instance.fenced() {
        tracing::info!("unfenced (no longer in spec.fencedInstances): PostgreSQL may start again");
        instance.unfence();
    }
    if !refresh(inputs, settings, instance, material, cluster).await {
        return Ok(Next::After(WAIT_FOR_CERTIFICATES));
    }
    let me = settings.pod_name.as_str();
    // A replica cluster's source, for whichever instance is (or becomes) its designated
    // primary; why it cannot be reached is only an error for the pass that needs it.
    let source = secrets::replica_source(inputs, settings, cluster).await;
    let seen = observe::observe(inputs, instance, cluster, me, memory, &source).await?;
    let (status, observed) = (&seen.status, &seen.observed);
    // WAL archiving follows spec.backup.store; written with the next start or reload.
    instance.set_archiving(archiving(inputs, settings, cluster).await?);
    let plan = plan::plan(me, status, observed);
    // The primary's data of an older major, and no upgrade asked: never started, reported.
    let stale = match (observed.data, settings.binaries.major()) {
        (DataState::OlderMajor(found), Ok(major)) if plan.primary.as_deref() == Some(me) => {
            Some(format!(
                "the data directory holds PostgreSQL {found} and this instance runs PostgreSQL {major}, \
                 but no major upgrade was requested (PGOP_UPGRADE_FROM): PostgreSQL stays stopped"
            ))
        }
        _ => None,
    };
    if instance.set_major_upgrade_error(stale.clone())
        && let Some(message) = &stale
    {
        tracing::warn!(reason = %message, "not starting PostgreSQL");
    }
    // spec.bootstrap.recovery: the first primary restores a backup instead of initdb, from
    // where the operator resolved it; decided before the Lease is taken.
    let mut recovery = None;
    let recovery_spec = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.recovery.as_ref());
    if plan.action == Action::BootstrapPrimary
        && let Some(spec) = recovery_spec
    {
        let Some(source) = status.recovery_source.as_ref() else {
            tracing::info!("waiting for the operator to resolve status.recoverySource");
            return Ok(Next::After(WAIT_FOR_RECOVERY_SOURCE));
        };
        if let Some(left) =
            (memory.bootstrap_failed).and_then(|at| RESTORE_BACKOFF.checked_sub(at.elapsed()))
        {
            return Ok(Next::After(left));
        }
        match recovery_of(inputs, settings, spec, source).await {
            Ok(r) => recovery = Some(r),
            Err(err) => {
                instance.set_bootstrap_error(Some(error_chain(&err)));
                return Err(err);
            }
        }
    }
    if plan.action.needs_lease() && !hold.acquire(instance).await? {
        return Ok(Next::Soon);
    }
    let next = if seen.observed.held_off {
        Next::Soon
    } else if seen.stalled {
        Next::After(STREAM_RECHECK)
    } else {
        Next::Idle
    };
    // A first start (bootstrap, clone, a manager started on existing data) already runs
    // with the spec's parameters, those that take effect only at start included.
    instance.seed_parameters(&cluster.spec.postgresql.parameters);
    let recovery = recovery.as_ref();
    let acted = act::act(
        inputs, instance, cluster, &seen, &plan, recovery, &source, hold, memory, next,
    );
    if let Some(next) = acted.await? {
        return Ok(next);
    }
    if instance.pid().is_none() {
        return Ok(next);
    }
    converge::converge(inputs, settings, instance, cluster, &seen, &plan).await?;
    let designated_here = observed.replica_cluster && plan.primary.as_deref() == Some(me);
    if !designated_here {
        instance.set_source_refusal(None);
    } else if let Mode::DesignatedPrimary { source } = instance.mode() {
        let refusal = source_refusal(settings, instance, &source, &seen.pg).await;
        let refused = refusal.is_some();
        if instance.set_source_refusal(refusal.clone())
            && let Some(r) = &refusal
        {
            tracing::warn!(source = %source.name(), reason = %r.reason, message = %r.message, "the replica cluster's source refuses this designated primary");
        }
        if refused || !seen.pg.streaming {
            return Ok(Next::After(SOURCE_RECHECK));
        }
    }
    Ok(next)
}

/// Why the source refuses a designated primary that does not stream (`None` while it
/// streams): the answer to the manager's own replication connection to it, a source that
/// is another database system, or one that removed the WAL this instance needs.
async fn source_refusal(
    settings: &Settings,
    instance: &Instance,
    source: &crate::external::Source,
    pg: &pgop_api::instance_status::PgStatus,
) -> Option<crate::status::SourceRefusal> {
    use crate::status::SourceRefusal;
    if pg.streaming {
        return None;
    }
    if let Some(missing) = source
        .archive_record()
        .as_ref()
        .and_then(|r| r.gap(jiff::Timestamp::now(), ARCHIVE_GAP_CONFIRM))
    {
        return Some(SourceRefusal::new(
            "ArchiveGap",
            &format!(
                "the store lacks WAL segment {missing} while it holds later ones (for {} s or \
                 more): recovery cannot step over it{}",
                ARCHIVE_GAP_CONFIRM.as_secs(),
                if source.has_connection() {
                    "; the source is asked for it by streaming"
                } else {
                    "; the entry has no connection to stream it from: the source's archiving \
                     must put it back, or a base backup taken after it must be in the store and \
                     the replica cluster created again from it"
                }
            ),
        ));
    }
    if !source.has_connection() {
        // A store alone: nothing to ask.
        return None;
    }
    if instance.upstream_wal_gone() {
        return Some(SourceRefusal::new(
            "SourceWalGone",
            "the source no longer has the WAL this instance needs (\"requested WAL segment has \
             already been removed\"): its store, or a new clone, is needed",
        ));
    }
    let app = crate::config::replica_application_name(&settings.pod_name);
    match source
        .identify(
            &settings.binaries,
            settings.run_as,
            &app,
            crate::external::IDENTIFY_TIMEOUT,
        )
        .await
    {
        Err(r) => Some(SourceRefusal::new(r.reason(), r.message())),
        Ok(identity) if pg.system_identifier.as_ref() != Some(&identity.system_identifier) => {
            Some(SourceRefusal::new(
                "SystemIdentifierMismatch",
                &format!(
                    "the source is database system {}, this instance's data is of {}: it is \
                     not the server this cluster was cloned from",
                    identity.system_identifier,
                    pg.system_identifier.as_deref().unwrap_or("(unknown)")
                ),
            ))
        }
        // It answers and is the same system: the WAL receiver is (re)connecting.
        Ok(_) => None,
    }
}

/// Whether a restart annotation asks this instance (`me`) to restart: the cluster's
/// (`status.restartRequested`) or one naming it (`status.instanceRestarts`) was recorded
/// after the running postmaster started.
pub fn restart_requested(
    status: &PostgresClusterStatus,
    me: &str,
    postmaster_started: Option<&str>,
) -> bool {
    let Some(started) = postmaster_started.and_then(|t| t.parse::<jiff::Timestamp>().ok()) else {
        return false;
    };
    let before = |requested_at: &str| {
        requested_at
            .parse::<jiff::Timestamp>()
            .is_ok_and(|at| started < at)
    };
    status
        .restart_requested
        .as_ref()
        .is_some_and(|r| before(&r.requested_at))
        || status
            .instance_restarts
            .iter()
            .any(|r| r.instance == me && before(&r.requested_at))
}

/// How long a crashed primary stays down: `spec.failoverDelay` + 10 s.
fn crash_hold_off(cluster: &PostgresCluster) -> Duration {
    Duration::from_secs(u64::try_from(cluster.spec.ha.failover_delay).unwrap_or(0))
        + CRASH_HOLD_OFF_EXTRA
}

/// The Lease belongs to the cluster (not as its controller): deleted with it.
fn owner_reference(cluster: &PostgresCluster) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: pgop_api::constants::CLUSTER_OWNER_API_VERSION.to_string(),
        kind: PostgresCluster::kind(&()).to_string(),
        name: cluster.name_any(),
        uid: cluster.metadata.uid.clone()?,
        controller: None,
        block_owner_deletion: None,
    })
}

fn sync_spec(cluster: &PostgresCluster) -> SyncSpec {
    let synchronous = &cluster.spec.ha.synchronous;
    SyncSpec {
        synchronous: u32::try_from(synchronous.standbys).unwrap_or(0),
        durability: synchronous.data_durability,
    }
}

/// The primary's address: its Pod's IP, from the watch of that Pod (moved to the primary
/// the status names; a new IP wakes the loop).
async fn upstream(inputs: &Inputs, instance: &Instance, primary: &str) -> Result<Upstream, Error> {
    inputs.pods.keep_only(primary);
    let pod = inputs
        .pods
        .get(primary)
        .await
        .map_err(|source| Error::ResolvePrimary {
            name: primary.to_string(),
            source: Some(source),
        })?;
    let ip = pod
        .as_ref()
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.pod_ip.clone())
        .ok_or_else(|| Error::ResolvePrimary {
            name: primary.to_string(),
            source: None,
        })?;
    Ok(instance.as_upstream(&ip))
}

/// Feeds every version of the primary Lease to the contender ([`pgop_lease::Contender::observe`])
/// until the manager exits. Errors (a missing permission, a lost connection) are retried
/// with back-off; without the watch the takeover clock starts at the first read, as before.
async fn watch_lease(client: kube::Client, namespace: String, lease: Arc<PrimaryLease>) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::watcher::{Config, Event, watcher};
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, &namespace);
    let fields = format!("metadata.name={}", lease.name());
    let events = watcher(api, Config::default().fields(&fields)).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut warned = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(l) | Event::InitApply(l)) => lease.observe(&l),
            Ok(_) => {}
            Err(err) if !warned => {
                tracing::warn!(error = %error_chain(&err), "watching the primary Lease (retrying)");
                warned = true;
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PostgresClusterStatus, cluster_concerns, recovery_target, restart_requested};

    #[test]
    fn making_the_data_directory_is_reported_failed_only_once_it_failed_for_the_grace() {
        use super::{MAKING_GRACE, making_report};
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut since = None;
        assert_eq!(making_report(&mut since, t0, None), None, "made at once");
        let failed = || Some("cloning: connection refused".to_string());
        assert_eq!(
            making_report(&mut since, t0, failed()),
            None,
            "first failure"
        );
        assert_eq!(
            making_report(&mut since, t0 + Duration::from_secs(5), failed()),
            None
        );
        assert_eq!(
            making_report(&mut since, t0 + MAKING_GRACE, failed()),
            Some(failed()),
            "failing for the grace"
        );
        assert_eq!(
            making_report(&mut since, t0 + MAKING_GRACE * 2, None),
            Some(None),
            "made: cleared"
        );
        assert_eq!(since, None);
        assert_eq!(making_report(&mut since, t0 + MAKING_GRACE * 3, None), None);
    }

    #[test]
    fn a_divergence_is_acted_on_only_once_it_lasted_and_forgotten_when_it_stops() {
        use super::{DIVERGENCE_CONFIRM, confirmed};
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let mut since = None;
        assert!(!confirmed(true, &mut since, t0), "first seen");
        assert_eq!(since, Some(t0));
        assert!(!confirmed(true, &mut since, t0 + Duration::from_secs(1)));
        assert!(confirmed(true, &mut since, t0 + DIVERGENCE_CONFIRM));
        // Streaming again (or the primary's history says otherwise): forgotten.
        assert!(!confirmed(false, &mut since, t0 + DIVERGENCE_CONFIRM));
        assert_eq!(since, None);
        let later = t0 + DIVERGENCE_CONFIRM * 2;
        assert!(!confirmed(true, &mut since, later), "counted afresh");
        assert!(confirmed(true, &mut since, later + DIVERGENCE_CONFIRM));
    }

    #[test]
    fn a_failed_pass_is_retried_after_a_delay_that_doubles_up_to_a_cap() {
        use super::{RETRY_FIRST, RETRY_MAX, retry_after};
        use std::time::Duration;
        assert_eq!(retry_after(1), RETRY_FIRST);
        assert_eq!(retry_after(2), Duration::from_secs(2));
        assert_eq!(retry_after(3), Duration::from_secs(4));
        assert_eq!(retry_after(5), Duration::from_secs(16));
        assert_eq!(retry_after(6), RETRY_MAX);
        assert_eq!(retry_after(u32::MAX), RETRY_MAX);
        assert_eq!(
            retry_after(0),
            RETRY_FIRST,
            "never sooner than the first delay"
        );
    }
    use pgop_api::cluster::RecoverySpec;
    use pgop_api::v1beta1::PostgresCluster;
    use pgop_backup::Target;

    fn cluster(yaml: &str) -> PostgresCluster {
        serde_yaml::from_str(yaml).expect("a cluster")
    }

    const CLUSTER: &str = r#"
apiVersion: database.example.com/v1beta1
kind: PostgresCluster
metadata: {name: demo, namespace: ns, uid: u1, generation: 3, resourceVersion: "10"}
spec: {instances: 2, storage: {size: 1Gi}}
status:
  phase: Ready
  currentPrimary: demo-1
  targetPrimary: demo-1
  observedGeneration: 3
  readyReplicas: 2
  instances:
    - {name: demo-1, serial: 1, ready: true, receivedLsn: 0/3000000, replayedLsn: 0/3000000}
    - {name: demo-2, serial: 2, ready: true, receivedLsn: 0/3000000, replayedLsn: 0/3000000}
"#;

    /// Applies `edit` to the status of [`CLUSTER`] (as JSON) and tells whether the digest of
    /// what the manager uses moved.
    fn moves(edit: impl FnOnce(&mut serde_json::Value)) -> bool {
        let before = cluster(CLUSTER);
        let mut value = serde_json::to_value(&before).expect("json");
        edit(&mut value);
        let after: PostgresCluster = serde_json::from_value(value).expect("a cluster");
        cluster_concerns(&before) != cluster_concerns(&after)
    }

    #[test]
    fn status_writes_that_do_not_concern_the_manager_leave_its_digest() {
        assert!(!moves(
            |v| v["status"]["instances"][0]["receivedLsn"] = "0/4000000".into()
        ));
        assert!(!moves(
            |v| v["status"]["instances"][1]["ready"] = false.into()
        ));
        assert!(!moves(|v| v["status"]["readyReplicas"] = 1.into()));
        assert!(!moves(|v| v["metadata"]["resourceVersion"] = "11".into()));
        assert!(!moves(|v| v["status"]["conditions"] = serde_json::json!([{
            "type": "Ready", "status": "True", "reason": "Ready", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}])));
    }

    #[test]
    fn what_the_manager_acts_on_moves_its_digest() {
        assert!(moves(|v| v["status"]["targetPrimary"] = "demo-2".into()));
        assert!(moves(|v| v["status"]["currentPrimary"] = "demo-2".into()));
        assert!(moves(|v| v["status"]["phase"] = "FailingOver".into()));
        assert!(moves(|v| v["status"]["restartInstance"] = "demo-2".into()));
        assert!(moves(
            |v| v["status"]["restartRequested"] =
                serde_json::json!({"value": "1", "requestedAt": "2026-01-01T00:00:00Z"})
        ));
        assert!(moves(
            |v| v["status"]["instances"][1]["name"] = "demo-3".into()
        ));
        // A replica cluster's record, then its promotion approved (a lag alone is not).
        let replica = serde_json::json!({"source": "site-a", "lagSeconds": 1});
        assert!(moves(|v| v["status"]["replica"] = replica.clone()));
        let mut approved = replica.clone();
        approved["promotion"] =
            serde_json::json!({"approvedAt": "2026-01-01T00:00:00Z", "forced": true});
        let lagging = serde_json::json!({"source": "site-a", "lagSeconds": 9});
        let before = cluster(CLUSTER);
        let with = |r: &serde_json::Value| {
            let mut v = serde_json::to_value(&before).expect("json");
            v["status"]["replica"] = r.clone();
            serde_json::from_value::<PostgresCluster>(v).expect("a cluster")
        };
        assert_eq!(
            cluster_concerns(&with(&replica)),
            cluster_concerns(&with(&lagging))
        );
        assert_ne!(
            cluster_concerns(&with(&replica)),
            cluster_concerns(&with(&approved))
        );
        assert!(moves(
            |v| v["spec"]["postgresql"] = serde_json::json!({"parameters": {"work_mem": "8MB"}})
        ));
        assert!(moves(|v| v["metadata"]["generation"] = 4.into()));
        assert!(moves(|v| v["metadata"]["uid"] = "u2".into()));
        assert!(moves(|v| v["status"] = serde_json::Value::Null));
    }

    #[test]
    fn the_recovery_target_is_the_time_the_lsn_or_the_end_of_wal() {
        let spec = |time: Option<&str>, lsn: Option<&str>| RecoverySpec {
            backup: None,
            store: None,
            source_cluster: None,
            target_time: time.map(str::to_string),
            target_lsn: lsn.map(str::to_string),
        };
        assert_eq!(recovery_target(&spec(None, None)), Target::EndOfWal);
        assert_eq!(
            recovery_target(&spec(Some("2025-01-31T12:00:00Z"), None)),
            Target::Time("2025-01-31T12:00:00Z".into())
        );
        assert_eq!(
            recovery_target(&spec(None, Some("0/3000060"))),
            Target::Lsn("0/3000060".into())
        );
    }

    #[test]
    fn the_restart_annotation_asks_postmasters_started_before_it() {
        let mut status = PostgresClusterStatus::default();
        assert!(!restart_requested(
            &status,
            "db-1",
            Some("2026-01-01T00:00:00Z")
        ));
        status.restart_requested = Some(pgop_api::cluster::RestartRequest {
            value: "1".into(),
            requested_at: "2026-01-01T00:00:10Z".into(),
        });
        assert!(restart_requested(
            &status,
            "db-1",
            Some("2026-01-01T00:00:09.5Z")
        ));
        assert!(!restart_requested(
            &status,
            "db-1",
            Some("2026-01-01T00:00:10.5Z")
        ));
        assert!(
            !restart_requested(&status, "db-1", None),
            "a stopped one starts anyway"
        );
        // One instance's request: that instance only.
        status.restart_requested = None;
        status.instance_restarts = vec![pgop_api::cluster::InstanceRestart {
            instance: "db-2".into(),
            requested_at: "2026-01-01T00:00:10Z".into(),
        }];
        assert!(restart_requested(
            &status,
            "db-2",
            Some("2026-01-01T00:00:09Z")
        ));
        assert!(!restart_requested(
            &status,
            "db-1",
            Some("2026-01-01T00:00:09Z")
        ));
        assert!(!restart_requested(
            &status,
            "db-2",
            Some("2026-01-01T00:00:11Z")
        ));
    }
}
