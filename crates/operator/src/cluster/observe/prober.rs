//! Prober: every instance manager's `/pg/status`, polled on the prober's own timers over
//! HTTP/1.1 keep-alive connections, apart from the reconcile queue.
//!
//! [`probe::probe_all`] reads every instance once per reconcile over a fresh connection,
//! so failover detection waits for the reconcile queue. The [`Prober`] instead polls every
//! tracked instance every [`Config::interval`] on a timer of its own, and wakes a cluster's
//! reconcile only when what it saw changes in a way the reconcile acts on ([`significant`]):
//! a failed primary is noticed within `interval + timeout` whatever the queue's length.
//!
//! How it is used (one [`Prober`] per operator; a cluster is named by its
//! `ObjectRef::from_obj(&cluster)`, whose resource version and uid are ignored):
//! - [`Prober::wakes`] — a stream of the clusters to reconcile, for
//!   `Controller::reconcile_on` (one stream per controller: per watched namespace, or one
//!   for all namespaces);
//! - [`Prober::track`] — each reconcile hands over the cluster's Pods (name, IP): new
//!   instances are polled, removed ones no longer, an IP change (a Pod recreated under the
//!   same name) starts over on the new address; [`Prober::forget`] when the cluster goes,
//!   and [`Prober::retain`] for a periodic sweep against the controller's store;
//! - [`Prober::snapshot`] — the latest probe of every tracked instance, the same
//!   `BTreeMap<String, Probe>` as [`probe::probe_all`] returns (an instance not probed yet
//!   is probed then and there); [`Prober::probe_now`] — fresh probes of all of them, for a
//!   reconcile in the middle of a failover or switchover.
//!
//! Bounds:
//! - one poller task and at most one connection per instance, and one small slot holding
//!   the latest [`Probe`]: memory is O(instances), replaced in place on every poll;
//! - at most [`Config::concurrency`] probes in flight across the whole fleet (one
//!   semaphore): a hung instance holds one permit for at most [`Config::timeout`], and
//!   delays nobody else while permits are left. Waiting for a permit does not count against
//!   the timeout, so a busy pool never makes a healthy instance look unreachable;
//! - the wake channel holds at most one entry per cluster (a wake already pending is not
//!   sent again), so a slow consumer cannot make it grow.
//!
//! Why this file stays whole: it is one idea, the `Prober`: its poller tasks, the slots and
//! the wake channel they write, and what makes a new probe wake a reconcile (`significant`,
//! `changed`); about 450 of its lines are the unit tests.

use super::probe::{self, Probe};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Empty, Limited};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use pgop_api::constants::{MANAGER_PORT, PATH_PG_STATUS};
use pgop_api::instance_status::{InvalidParameter, PgRole, PgStatus};
use pgop_api::v1beta1::PostgresCluster;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use tracing::Instrument;

/// A PostgresCluster, as the controller names it.
pub type ClusterRef = ObjectRef<PostgresCluster>;

/// Largest `/pg/status` answer accepted (a status is a few KiB).
const MAX_BODY: usize = 1 << 20;
/// Shortest polling interval accepted.
const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// What an instance without a Pod IP reads as (the words of [`probe::probe_all`]).
const NO_IP: &str = "the pod has no IP yet";

/// How the prober polls.
#[derive(Clone, Debug)]
pub struct Config {
    /// How often each instance is polled (each on its own timer, started at a random
    /// point of the first interval). At least 10 ms.
    pub interval: Duration,
    /// How long one probe may take, connecting included (waiting for a permit of the pool
    /// is not included).
    pub timeout: Duration,
    /// Most probes in flight at once, across all clusters. At least 1.
    pub concurrency: usize,
    /// The managers' port ([`MANAGER_PORT`]).
    pub port: u16,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            timeout: probe::TIMEOUT,
            concurrency: 64,
            port: MANAGER_PORT,
        }
    }
}

/// Counters since the prober was created, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Probes done (polled or on demand), answered or not.
    pub probes: u64,
    /// Of those, the ones that found the instance unreachable (connection refused or
    /// dropped, timeout, bad answer).
    pub failures: u64,
    /// TCP connections opened: about one per instance while all is well; more means
    /// connections are being dropped (errors, restarted managers).
    pub connections: u64,
    /// Significant changes seen by polls: each wakes its cluster's reconcile, unless a
    /// wake of that cluster is still waiting in the stream.
    pub wakes: u64,
    /// Instances tracked now.
    pub instances: usize,
}

/// The fields of a [`PgStatus`] whose change wakes the cluster's reconcile: everything the
/// reconcile branches on (`decide::roles::decide`, `decide::rolling`,
/// `decide::computed::compute`, the backup facts of `decide`), and nothing that moves on its
/// own under load.
///
/// Whether the instance answers at all (a [`Probe::Status`] or a [`Probe::Unreachable`]) is
/// significant too: see [`Prober`]. The words of an unreachable probe are not: they vary
/// (refused, timed out) while the instance stays down.
///
/// Left out on purpose:
/// - the WAL positions (`currentLsn`, `receivedLsn`, `replayedLsn`) and everything in
///   `replication` (the primary's view of its standbys, with their lag): they move with
///   every write, and the status publishes positions at most once a minute anyway
///   (`decide::computed::publish_positions_at_most_every`); a failover reads them fresh
///   when it chooses. The status has no coarse lag class to wake on;
/// - the archiver's counters, last archived and last failed WAL and their times: they
///   move with the WAL; only whether archiving is configured and failing decides the
///   ContinuousArchiving condition;
/// - `instance`, `inRecovery` (it mirrors `role`), `systemIdentifier`,
///   `postgresVersion(Num)` and `pendingRestartParameters`: the operator does not read
///   them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Significant<'a> {
    /// Primary, replica or stopped: whether the primary is available (failover), whether a
    /// failover or switchover target has promoted (completion), which standbys may be
    /// promoted, `status.instances[].role`, rollout health.
    pub role: PgRole,
    /// PostgreSQL answers queries: whether an instance restarted by the rollout is back.
    pub running: bool,
    /// Stopped on purpose: the PrimaryAvailable reason, and a fenced standby is never
    /// promoted nor chosen to take over a drained node's primary.
    pub fenced: bool,
    /// A standby streams from its primary: switchover targets, rollout health, evacuation
    /// targets.
    pub streaming: bool,
    /// `status.instances[].timeline`, published at once (not throttled like positions); a
    /// promotion starts a new one.
    pub timeline: Option<i64>,
    /// Parameters wait for a restart: the rolling restart, and the ContinuousArchiving
    /// reason RestartPending.
    pub pending_restart: bool,
    /// Some of them go down where a standby needs at least the primary's value: the primary
    /// restarts first.
    pub pending_restart_decreases: bool,
    /// The generation whose parameters the manager applied: the rollout waits until every
    /// instance has.
    pub applied_generation: Option<i64>,
    /// When the postmaster started: a requested restart is done once it is later.
    pub postmaster_start_time: Option<&'a str>,
    /// The manager refused a restart (dry run failed): RolloutBlocked.
    pub restart_refused: Option<&'a str>,
    /// PostgreSQL's last words after a failed start: a primary restarted on purpose that
    /// fails to start is failed over without waiting for switchoverTimeout; RolloutBlocked
    /// quotes them.
    pub last_error: Option<&'a str>,
    /// A failed bootstrap (restore): the Progressing condition.
    pub bootstrap_error: Option<&'a str>,
    /// Refused parameters: the ConfigurationApplied condition.
    pub invalid_parameters: &'a [InvalidParameter],
    /// Archiving configured, and failing: the ContinuousArchiving condition.
    pub archiving: Option<(bool, bool)>,
    /// `status.instances[].managerVersion`.
    pub manager_version: Option<&'a str>,
    /// `status.instances[].postgresVersion`.
    pub postgres_version: Option<&'a str>,
    /// The data volume's size in MiB and the share in use in whole percent: auto-grow
    /// compares the share with its threshold, and the VolumesResized condition waits for
    /// the filesystem to grow (see `decide::storage`). A busy instance moves the share by
    /// a percent now and then, not with every write.
    pub volume: Option<(u64, u64)>,
    /// Why a replica cluster's source refuses its designated primary (the reason): the
    /// ReplicaFollowing condition. It may change while nothing else does (a gap found in
    /// the source's store while the designated primary waits in recovery).
    pub source_refusal: Option<&'a str>,
}

/// What of `status` wakes a reconcile when it changes; see [`Significant`] for every field
/// and why.
pub fn significant(status: &PgStatus) -> Significant<'_> {
    Significant {
        role: status.role,
        running: status.running,
        fenced: status.fenced,
        streaming: status.streaming,
        timeline: status.timeline,
        pending_restart: status.pending_restart,
        pending_restart_decreases: !status.pending_restart_decreases.is_empty(),
        applied_generation: status.applied_generation,
        postmaster_start_time: status.postmaster_start_time.as_deref(),
        restart_refused: status.restart_refused.as_deref(),
        last_error: status.last_error.as_deref(),
        bootstrap_error: status.bootstrap_error.as_deref(),
        invalid_parameters: &status.invalid_parameters,
        archiving: status.archiving.as_ref().map(|a| (a.configured, a.failing)),
        manager_version: status.manager_version.as_deref(),
        postgres_version: status.postgres_version.as_deref(),
        volume: status
            .volume
            .map(|v| (v.capacity_bytes >> 20, v.used_percent())),
        source_refusal: status
            .upstream
            .as_ref()
            .and_then(|u| u.refusal.as_ref())
            .map(|r| r.reason.as_str()),
    }
}

/// Whether going from `old` to `new` is worth a reconcile: the instance became reachable
/// or unreachable, or a [`significant`] field changed.
pub fn changed(old: &Probe, new: &Probe) -> bool {
    match (old, new) {
        (Probe::Status(a), Probe::Status(b)) => significant(a) != significant(b),
        (Probe::Unreachable(_), Probe::Unreachable(_)) => false,
        _ => true,
    }
}

/// The `(Pod name, Pod IP)` of every Pod, for [`Prober::track`].
pub fn instances_of(pods: &[Pod]) -> Vec<(String, Option<String>)> {
    pods.iter()
        .map(|pod| {
            let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
            (pod.name_any(), ip)
        })
        .collect()
}

/// The prober: cheap to clone (one `Arc`), created once per operator. Dropping the last
/// clone stops every poller and closes every connection.
#[derive(Clone)]
pub struct Prober {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    clusters: Mutex<HashMap<ClusterRef, BTreeMap<String, Tracked>>>,
}

/// What the pollers share.
struct Shared {
    config: Config,
    pool: Semaphore,
    subscribers: Mutex<Vec<Subscriber>>,
    probes: AtomicU64,
    failures: AtomicU64,
    connections: AtomicU64,
    wakes: AtomicU64,
}

/// One stream of [`Prober::wakes`].
struct Subscriber {
    /// Its namespace; all when `None`.
    scope: Option<String>,
    tx: mpsc::UnboundedSender<ClusterRef>,
    /// The clusters sent and not yet taken from the stream.
    pending: Arc<Mutex<HashSet<ClusterRef>>>,
}

/// One tracked instance: its address, its slot and its poller.
struct Tracked {
    /// `ip:port`; `None` while the Pod has no IP.
    host: Option<String>,
    instance: Arc<Instance>,
    _poller: Option<AbortOnDrop>,
}

/// The connection to one manager and the latest probe of it. The connection's lock is
/// held for a whole probe, and the latest probe is recorded under it: the probes of one
/// instance (polled or on demand) happen, and are recorded, one after another.
struct Instance {
    host: Option<String>,
    conn: tokio::sync::Mutex<Option<Connection>>,
    latest: Mutex<Option<Probe>>,
}

/// A keep-alive HTTP/1.1 connection; its driver task stops when it is dropped.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    _driver: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (plain assignments).
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `ip:port`, with brackets for IPv6.
fn host_of(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// A cluster's reference without its resource version or uid.
fn plain(cluster: &ClusterRef) -> ClusterRef {
    let plain = ObjectRef::new(&cluster.name);
    match &cluster.namespace {
        Some(ns) => plain.within(ns),
        None => plain,
    }
}

impl Prober {
    pub fn new(config: Config) -> Self {
        let config = Config {
            interval: config.interval.max(MIN_INTERVAL),
            concurrency: config.concurrency.max(1),
            ..config
        };
        let shared = Shared {
            pool: Semaphore::new(config.concurrency),
            config,
            subscribers: Mutex::new(Vec::new()),
            probes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
        };
        Self {
            inner: Arc::new(Inner {
                shared: Arc::new(shared),
                clusters: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn config(&self) -> &Config {
        &self.inner.shared.config
    }

    /// The clusters in `namespace` (all when `None`) whose instances changed
    /// significantly, for `Controller::reconcile_on`. Each call makes a stream of its own;
    /// a wake goes to every stream whose namespace matches. A cluster already waiting in a
    /// stream is not added again until it has been taken. Wakes before the first call are
    /// not kept. The stream ends when the prober is dropped.
    pub fn wakes(
        &self,
        namespace: Option<String>,
    ) -> impl Stream<Item = ClusterRef> + Send + 'static {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(Mutex::new(HashSet::new()));
        lock(&self.inner.shared.subscribers).push(Subscriber {
            scope: namespace,
            tx,
            pending: pending.clone(),
        });
        futures::stream::unfold(rx, |mut rx| async move {
            let cluster = rx.recv().await?;
            Some((cluster, rx))
        })
        .map(move |cluster| {
            lock(&pending).remove(&cluster);
            cluster
        })
    }

    /// Polls the instances of `cluster`, given as `(Pod name, Pod IP)` (see
    /// [`instances_of`]): from now on exactly these. A new instance is polled from a random
    /// point of the first interval on; one no longer listed is no longer polled and its
    /// connection is closed; one whose IP changed is polled at its new address, its old
    /// probe forgotten (it was of another Pod). An instance without an IP reads as
    /// unreachable and is not polled. Must be called within a Tokio runtime.
    pub fn track(
        &self,
        cluster: &ClusterRef,
        instances: impl IntoIterator<Item = (String, Option<String>)>,
    ) {
        let port = self.inner.shared.config.port;
        let hosts = instances
            .into_iter()
            .map(|(name, ip)| (name, ip.map(|ip| host_of(&ip, port))));
        self.track_hosts(cluster, hosts);
    }

    /// [`Prober::track`] with the address of each instance (`ip:port`).
    fn track_hosts(
        &self,
        cluster: &ClusterRef,
        instances: impl IntoIterator<Item = (String, Option<String>)>,
    ) {
        let cluster = plain(cluster);
        let mut clusters = lock(&self.inner.clusters);
        let mut old = clusters.remove(&cluster).unwrap_or_default();
        let mut tracked = BTreeMap::new();
        for (name, host) in instances {
            let kept = old.remove(&name).filter(|t| t.host == host);
            let entry = match kept {
                Some(entry) => entry,
                None => self.start(&cluster, &name, host),
            };
            tracked.insert(name, entry);
        }
        // What is left in `old` was removed (or moved): its pollers stop as it drops.
        drop(old);
        clusters.insert(cluster, tracked);
    }

    fn start(&self, cluster: &ClusterRef, name: &str, host: Option<String>) -> Tracked {
        let latest = match host {
            Some(_) => None,
            None => Some(Probe::Unreachable(NO_IP.to_string())),
        };
        let instance = Arc::new(Instance {
            host: host.clone(),
            conn: tokio::sync::Mutex::new(None),
            latest: Mutex::new(latest),
        });
        let poller = host.as_ref().map(|_| {
            let task = tokio::spawn(poll(
                self.inner.shared.clone(),
                cluster.clone(),
                name.to_string(),
                instance.clone(),
            ));
            AbortOnDrop(task.abort_handle())
        });
        Tracked {
            host,
            instance,
            _poller: poller,
        }
    }

    /// Stops polling the instances of a cluster that is gone.
    pub fn forget(&self, cluster: &ClusterRef) {
        let gone = lock(&self.inner.clusters).remove(&plain(cluster));
        drop(gone);
    }

    /// Forgets every cluster for which `keep` is false: for a sweep against the
    /// controller's store, which also catches the clusters no reconcile saw go (relabelled
    /// out of `--cluster-selector`, deleted while the operator was not leading).
    pub fn retain(&self, mut keep: impl FnMut(&ClusterRef) -> bool) {
        let mut clusters = lock(&self.inner.clusters);
        let gone: Vec<_> = clusters
            .extract_if(|cluster, _| !keep(cluster))
            .map(|(_, tracked)| tracked)
            .collect();
        drop(clusters);
        drop(gone);
    }

    /// The clusters tracked now.
    pub fn clusters(&self) -> Vec<ClusterRef> {
        lock(&self.inner.clusters).keys().cloned().collect()
    }

    fn instances(&self, cluster: &ClusterRef) -> Vec<(String, Arc<Instance>)> {
        lock(&self.inner.clusters)
            .get(&plain(cluster))
            .map(|tracked| {
                tracked
                    .iter()
                    .map(|(name, t)| (name.clone(), t.instance.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The latest probe of every tracked instance of `cluster`, by Pod name (empty when
    /// the cluster is not tracked). An instance not probed yet is probed now (in parallel,
    /// each within [`Config::timeout`] once it has a permit of the pool), so the first
    /// reconcile after [`Prober::track`] has real data. Does not wake anything.
    pub async fn snapshot(&self, cluster: &ClusterRef) -> BTreeMap<String, Probe> {
        let shared = &self.inner.shared;
        let probes = self.instances(cluster).into_iter().map(|(name, instance)| {
            let cluster = cluster.clone();
            async move {
                let latest = lock(&instance.latest).clone();
                let probe = match latest {
                    Some(probe) => probe,
                    None => probe_and_record(shared, &instance, &cluster, &name, false).await,
                };
                (name, probe)
            }
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .collect()
    }

    /// Fresh probes of every tracked instance of `cluster`, in parallel, recorded as the
    /// latest: for a reconcile during a failover or switchover. An instance whose poll is
    /// in flight is probed once that poll is done, so this takes up to twice
    /// [`Config::timeout`] (plus the wait for permits). Does not wake anything: the caller
    /// has the news.
    pub async fn probe_now(&self, cluster: &ClusterRef) -> BTreeMap<String, Probe> {
        let shared = &self.inner.shared;
        let probes = self.instances(cluster).into_iter().map(|(name, instance)| {
            let cluster = cluster.clone();
            // A span per instance in the reconcile's trace; the prober's own polls are
            // in none (a trace a second per instance would drown the ones that matter).
            let span = tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "probe instance", instance = %name);
            async move {
                let probe = probe_and_record(shared, &instance, &cluster, &name, false).await;
                (name, probe)
            }
            .instrument(span)
        });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .collect()
    }

    pub fn stats(&self) -> Stats {
        let shared = &self.inner.shared;
        Stats {
            probes: shared.probes.load(Ordering::Relaxed),
            failures: shared.failures.load(Ordering::Relaxed),
            connections: shared.connections.load(Ordering::Relaxed),
            wakes: shared.wakes.load(Ordering::Relaxed),
            instances: lock(&self.inner.clusters).values().map(BTreeMap::len).sum(),
        }
    }
}

impl Shared {
    /// Sends `cluster` to every stream of its namespace that does not hold it yet.
    fn wake(&self, cluster: &ClusterRef) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        lock(&self.subscribers).retain(|subscriber| {
            let in_scope = subscriber.scope.is_none() || subscriber.scope == cluster.namespace;
            if !in_scope || !lock(&subscriber.pending).insert(cluster.clone()) {
                return true;
            }
            // A closed stream (its controller stopped) is dropped.
            subscriber.tx.send(cluster.clone()).is_ok()
        });
    }
}

/// Polls one instance every interval until aborted (when it is no longer tracked).
async fn poll(shared: Arc<Shared>, cluster: ClusterRef, name: String, instance: Arc<Instance>) {
    let interval = shared.config.interval;
    let jitter = {
        let nanos = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        Duration::from_nanos(std::collections::hash_map::RandomState::new().hash_one(&name) % nanos)
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + jitter, interval);
    // A probe longer than the interval (a hung instance, a busy pool) pushes the next one
    // back rather than firing the missed ones in a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        probe_and_record(&shared, &instance, &cluster, &name, true).await;
    }
}

/// Probes one instance and records the result as its latest; with `wake`, a significant
/// change wakes the cluster. The first probe of an instance wakes nothing: the reconcile
/// that tracked it reads it through [`Prober::snapshot`].
async fn probe_and_record(
    shared: &Shared,
    instance: &Instance,
    cluster: &ClusterRef,
    name: &str,
    wake: bool,
) -> Probe {
    let Some(host) = instance.host.as_deref() else {
        return Probe::Unreachable(NO_IP.to_string());
    };
    let mut conn = instance.conn.lock().await;
    let probe = {
        let Ok(_permit) = shared.pool.acquire().await else {
            return Probe::Unreachable("the prober is stopping".to_string());
        };
        let timeout = shared.config.timeout;
        match tokio::time::timeout(timeout, get_status(shared, &mut conn, host)).await {
            Ok(Ok(status)) => Probe::Status(status),
            Ok(Err(e)) => Probe::Unreachable(e),
            Err(_) => {
                // The connection may be in the middle of an exchange: not reusable.
                *conn = None;
                Probe::Unreachable(format!("no answer from {host} within {timeout:?}"))
            }
        }
    };
    shared.probes.fetch_add(1, Ordering::Relaxed);
    if matches!(probe, Probe::Unreachable(_)) {
        shared.failures.fetch_add(1, Ordering::Relaxed);
    }
    let woken = {
        let mut latest = lock(&instance.latest);
        let woken = latest.as_ref().is_some_and(|old| changed(old, &probe));
        *latest = Some(probe.clone());
        woken
    };
    drop(conn);
    if woken && wake {
        tracing::debug!(cluster = %cluster, instance = name, "instance changed: waking the reconcile");
        shared.wake(cluster);
    }
    probe
}

/// `GET /pg/status` over the instance's connection: the one kept from the last probe if
/// it is still open, else a new one. A kept connection that fails (the manager closed it
/// meanwhile, say) is replaced once by a new one; any other error drops the connection.
async fn get_status(
    shared: &Shared,
    conn: &mut Option<Connection>,
    host: &str,
) -> Result<Box<PgStatus>, String> {
    if let Some(mut kept) = conn.take().filter(|c| !c.sender.is_closed()) {
        match exchange(&mut kept, host).await {
            Ok(Answer::Status(status)) => {
                *conn = Some(kept);
                return Ok(status);
            }
            Ok(Answer::Bad(e)) => return Err(e),
            Err(e) => tracing::trace!(host, error = %e, "a kept connection failed: reconnecting"),
        }
    }
    let mut fresh = connect(shared, host).await?;
    match exchange(&mut fresh, host).await? {
        Answer::Status(status) => {
            *conn = Some(fresh);
            Ok(status)
        }
        Answer::Bad(e) => Err(e),
    }
}

/// A complete answer: a status, or a bad answer (error code, unreadable body).
enum Answer {
    Status(Box<PgStatus>),
    Bad(String),
}

async fn connect(shared: &Shared, host: &str) -> Result<Connection, String> {
    let tcp = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("failed to connect to {host}: {e}"))?;
    shared.connections.fetch_add(1, Ordering::Relaxed);
    // Small requests and answers, one at a time: do not wait to fill segments.
    let _ = tcp.set_nodelay(true);
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| format!("failed to connect to {host}: {e}"))?;
    let driver = tokio::spawn(async move {
        // Ends when the sender is dropped or the peer closes; errors show on requests.
        let _ = connection.await;
    });
    Ok(Connection {
        sender,
        _driver: AbortOnDrop(driver.abort_handle()),
    })
}

/// One request on `conn`. An `Err` is a failure of the connection (it is not reused).
async fn exchange(conn: &mut Connection, host: &str) -> Result<Answer, String> {
    let mut request = http::Request::get(PATH_PG_STATUS)
        .header(http::header::HOST, host)
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("bad request to {host}: {e}"))?;
    // Within a reconcile's fresh probes, the manager's side joins its trace.
    pgop_telemetry::inject(request.headers_mut());
    conn.sender
        .ready()
        .await
        .map_err(|e| format!("connection to {host} closed: {e}"))?;
    let response = conn
        .sender
        .send_request(request)
        .await
        .map_err(|e| format!("failed to read from {host}: {e}"))?;
    let code = response.status();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("failed to read from {host}: {e}"))?
        .to_bytes();
    if code != http::StatusCode::OK {
        return Ok(Answer::Bad(format!(
            "bad answer from {host}: status {}: {}",
            code.as_u16(),
            String::from_utf8_lossy(&body).trim()
        )));
    }
    Ok(match serde_json::from_slice(&body) {
        Ok(status) => Answer::Status(status),
        Err(e) => Answer::Bad(format!("unreadable status from {host}: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use pgop_api::instance_status::ArchiveStatus;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Long enough for a loaded 2-core machine; nothing asserts on a duration.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// Fast polls; a timeout long enough that a stall of the machine is not taken for a
    /// silent manager.
    fn config() -> Config {
        Config {
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(3),
            concurrency: 8,
            port: 0,
        }
    }

    fn cluster(name: &str) -> ClusterRef {
        ObjectRef::new(name).within("ns")
    }

    fn pg(name: &str, role: PgRole, lsn: &str) -> PgStatus {
        let mut s = PgStatus::stopped(name, false);
        s.role = role;
        s.running = role != PgRole::Stopped;
        s.streaming = role == PgRole::Replica;
        s.timeline = Some(1);
        match role {
            PgRole::Primary => s.current_lsn = Some(lsn.into()),
            _ => {
                s.received_lsn = Some(lsn.into());
                s.replayed_lsn = Some(lsn.into());
            }
        }
        s
    }

    #[derive(Clone)]
    enum Mode {
        Answer(Box<PgStatus>),
        /// Reads requests and never answers them.
        Hang,
    }

    /// A manager that speaks HTTP/1.1 keep-alive, whose answer the test changes, and that
    /// counts connections accepted, requests read and connections closed by the client.
    struct Fake {
        host: String,
        mode: Arc<Mutex<Mode>>,
        accepts: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
        closed: Arc<AtomicUsize>,
        _server: AbortOnDrop,
    }

    impl Fake {
        async fn start(mode: Mode) -> Fake {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let host = listener.local_addr().expect("addr").to_string();
            let mode = Arc::new(Mutex::new(mode));
            let accepts = Arc::new(AtomicUsize::new(0));
            let requests = Arc::new(AtomicUsize::new(0));
            let closed = Arc::new(AtomicUsize::new(0));
            let (m, a, r, c) = (
                mode.clone(),
                accepts.clone(),
                requests.clone(),
                closed.clone(),
            );
            let server = tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    a.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(stream, m.clone(), r.clone(), c.clone()));
                }
            });
            Fake {
                host,
                mode,
                accepts,
                requests,
                closed,
                _server: AbortOnDrop(server.abort_handle()),
            }
        }

        fn answer(status: PgStatus) -> Mode {
            Mode::Answer(Box::new(status))
        }

        fn set(&self, mode: Mode) {
            *lock(&self.mode) = mode;
        }

        fn requests(&self) -> usize {
            self.requests.load(Ordering::SeqCst)
        }

        fn accepts(&self) -> usize {
            self.accepts.load(Ordering::SeqCst)
        }

        fn closed(&self) -> usize {
            self.closed.load(Ordering::SeqCst)
        }

        /// Waits for `n` more requests than now.
        async fn more_requests(&self, n: usize) {
            let target = self.requests() + n;
            until(|| self.requests() >= target).await;
        }
    }

    async fn serve(
        mut stream: TcpStream,
        mode: Arc<Mutex<Mode>>,
        requests: Arc<AtomicUsize>,
        closed: Arc<AtomicUsize>,
    ) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let end = loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end;
                }
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            buf.drain(..end + 4);
            requests.fetch_add(1, Ordering::SeqCst);
            let answer = lock(&mode).clone();
            match answer {
                Mode::Answer(status) => {
                    let body = serde_json::to_vec(&status).expect("json");
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if stream.write_all(head.as_bytes()).await.is_err()
                        || stream.write_all(&body).await.is_err()
                    {
                        return;
                    }
                }
                Mode::Hang => std::future::pending::<()>().await,
            }
        }
    }

    async fn until(done: impl Fn() -> bool) {
        let waited = tokio::time::timeout(DEADLINE, async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "not done within {DEADLINE:?}");
    }

    async fn next_wake(wakes: &mut (impl Stream<Item = ClusterRef> + Unpin)) -> ClusterRef {
        tokio::time::timeout(DEADLINE, wakes.next())
            .await
            .expect("a wake within the deadline")
            .expect("the stream goes on")
    }

    fn role_of(probes: &BTreeMap<String, Probe>, name: &str) -> Option<PgRole> {
        probes.get(name).and_then(Probe::status).map(|s| s.role)
    }

    #[test]
    fn only_significant_fields_count_as_a_change() {
        let primary = pg("db-1", PgRole::Primary, "0/1000000");
        let status = |s: &PgStatus| Probe::Status(Box::new(s.clone()));
        let mut moved = primary.clone();
        moved.current_lsn = Some("0/2000000".into());
        assert!(!changed(&status(&primary), &status(&moved)), "an LSN");
        let mut archived = primary.clone();
        archived.archiving = Some(ArchiveStatus {
            configured: true,
            archived_count: 7,
            last_archived_wal: Some("000000010000000000000007".into()),
            ..Default::default()
        });
        let mut more = archived.clone();
        if let Some(a) = more.archiving.as_mut() {
            a.archived_count = 8;
            a.last_archived_wal = Some("000000010000000000000008".into());
        }
        assert!(
            !changed(&status(&archived), &status(&more)),
            "archiving goes on"
        );
        if let Some(a) = more.archiving.as_mut() {
            a.failing = true;
        }
        assert!(
            changed(&status(&archived), &status(&more)),
            "archiving fails"
        );
        let stopped = pg("db-1", PgRole::Stopped, "0/1000000");
        assert!(changed(&status(&primary), &status(&stopped)), "a role");
        let mut pending = primary.clone();
        pending.pending_restart = true;
        assert!(changed(&status(&primary), &status(&pending)));
        // A designated primary's source found refusing it (a gap in its store), nothing
        // else changed.
        let mut gap = primary.clone();
        gap.upstream = Some(pgop_api::instance_status::UpstreamState {
            refusal: Some(pgop_api::instance_status::SourceRefusal::new(
                "ArchiveGap",
                "the store lacks WAL segment 000000010000000000000004",
            )),
            ..Default::default()
        });
        assert!(changed(&status(&primary), &status(&gap)), "a refusal");
        let down = |why: &str| Probe::Unreachable(why.to_string());
        assert!(!changed(&down("refused"), &down("timed out")), "still down");
        assert!(changed(&status(&primary), &down("refused")));
        assert!(changed(&down("refused"), &status(&primary)));
    }

    /// (a) One connection for many polls.
    #[tokio::test]
    async fn a_connection_is_kept_across_polls() {
        let fake = Fake::start(Fake::answer(pg("db-1", PgRole::Primary, "0/1"))).await;
        let prober = Prober::new(config());
        let c = cluster("a");
        prober.track_hosts(&c, [("db-1".to_string(), Some(fake.host.clone()))]);
        fake.more_requests(6).await;
        assert_eq!(fake.accepts(), 1, "one connection for every poll");
        assert_eq!(prober.stats().connections, 1);
        assert!(prober.stats().probes >= 5);
        assert_eq!(prober.stats().failures, 0);
    }

    /// (a) The same against axum's server, which the instance manager runs.
    #[tokio::test]
    async fn axums_server_keeps_the_connection_too() {
        use axum::serve::ListenerExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let host = listener.local_addr().expect("addr").to_string();
        let accepts = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let counted = accepts.clone();
        let listener = listener.tap_io(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let answered = served.clone();
        let router = axum::Router::new().route(
            PATH_PG_STATUS,
            axum::routing::get(move || {
                answered.fetch_add(1, Ordering::SeqCst);
                async { axum::Json(pg("db-1", PgRole::Replica, "0/1")) }
            }),
        );
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        let _server = AbortOnDrop(server.abort_handle());
        let prober = Prober::new(config());
        prober.track_hosts(&cluster("a"), [("db-1".to_string(), Some(host))]);
        until(|| served.load(Ordering::SeqCst) >= 6).await;
        assert_eq!(accepts.load(Ordering::SeqCst), 1);
        let probes = prober.snapshot(&cluster("a")).await;
        assert_eq!(role_of(&probes, "db-1"), Some(PgRole::Replica));
    }

    /// (b) Positions move: nothing; the role changes: one wake, for that cluster only.
    #[tokio::test]
    async fn only_a_significant_change_wakes_its_cluster_once() {
        let a = Fake::start(Fake::answer(pg("db-1", PgRole::Primary, "0/1"))).await;
        let b = Fake::start(Fake::answer(pg("other-1", PgRole::Primary, "0/1"))).await;
        let prober = Prober::new(config());
        let mut wakes = Box::pin(prober.wakes(None));
        let mut in_ns = Box::pin(prober.wakes(Some("ns".to_string())));
        let mut elsewhere = Box::pin(prober.wakes(Some("elsewhere".to_string())));
        prober.track_hosts(&cluster("a"), [("db-1".to_string(), Some(a.host.clone()))]);
        prober.track_hosts(
            &cluster("b"),
            [("other-1".to_string(), Some(b.host.clone()))],
        );
        a.more_requests(2).await;
        a.set(Fake::answer(pg("db-1", PgRole::Primary, "0/2")));
        a.more_requests(3).await;
        a.set(Fake::answer(pg("db-1", PgRole::Primary, "0/3")));
        a.more_requests(3).await;
        assert!(
            wakes.next().now_or_never().is_none(),
            "positions moved only"
        );

        a.set(Fake::answer(pg("db-1", PgRole::Stopped, "0/3")));
        assert_eq!(next_wake(&mut wakes).await, cluster("a"));
        assert_eq!(next_wake(&mut in_ns).await, cluster("a"));
        a.more_requests(3).await;
        b.more_requests(3).await;
        assert!(wakes.next().now_or_never().is_none(), "one wake per change");
        assert!(in_ns.next().now_or_never().is_none());
        assert!(
            elsewhere.next().now_or_never().is_none(),
            "another namespace"
        );
        let probes = prober.snapshot(&cluster("a")).await;
        assert_eq!(role_of(&probes, "db-1"), Some(PgRole::Stopped));
        assert_eq!(prober.stats().wakes, 1);
    }

    /// (c) A manager that stops answering is unreachable after the timeout, and wakes its
    /// cluster once however long it stays so.
    #[tokio::test]
    async fn a_silent_manager_turns_unreachable_and_wakes_once() {
        let fake = Fake::start(Fake::answer(pg("db-1", PgRole::Primary, "0/1"))).await;
        let prober = Prober::new(Config {
            timeout: Duration::from_millis(500),
            ..config()
        });
        let mut wakes = Box::pin(prober.wakes(None));
        let c = cluster("a");
        prober.track_hosts(&c, [("db-1".to_string(), Some(fake.host.clone()))]);
        let probes = prober.snapshot(&c).await;
        assert_eq!(role_of(&probes, "db-1"), Some(PgRole::Primary));
        fake.set(Mode::Hang);
        assert_eq!(next_wake(&mut wakes).await, c);
        let probes = prober.snapshot(&c).await;
        assert!(
            matches!(&probes["db-1"], Probe::Unreachable(m) if m.contains("no answer")),
            "{probes:?}"
        );
        // Each later poll reconnects (the hung connection was dropped) and times out too.
        let accepted = fake.accepts();
        until(|| fake.accepts() >= accepted + 2).await;
        assert!(wakes.next().now_or_never().is_none(), "still unreachable");
        assert!(prober.stats().failures >= 2);

        fake.set(Fake::answer(pg("db-1", PgRole::Primary, "0/1")));
        assert_eq!(next_wake(&mut wakes).await, c, "back");
    }

    /// (d) A hung instance holds one permit of the pool; another cluster's change still
    /// wakes it.
    #[tokio::test]
    async fn a_hung_instance_does_not_hold_up_another_cluster() {
        let hung = Fake::start(Mode::Hang).await;
        let fine = Fake::start(Fake::answer(pg("b-1", PgRole::Primary, "0/1"))).await;
        let prober = Prober::new(Config {
            timeout: Duration::from_secs(600),
            concurrency: 2,
            ..config()
        });
        let mut wakes = Box::pin(prober.wakes(None));
        prober.track_hosts(
            &cluster("hung"),
            [("hung-1".to_string(), Some(hung.host.clone()))],
        );
        until(|| hung.requests() >= 1).await;
        prober.track_hosts(
            &cluster("b"),
            [("b-1".to_string(), Some(fine.host.clone()))],
        );
        let probes = prober.snapshot(&cluster("b")).await;
        assert_eq!(role_of(&probes, "b-1"), Some(PgRole::Primary));
        fine.set(Fake::answer(pg("b-1", PgRole::Replica, "0/1")));
        assert_eq!(next_wake(&mut wakes).await, cluster("b"));
        assert_eq!(hung.requests(), 1, "the hung probe is still in flight");
    }

    /// (e) An instance no longer tracked is no longer polled, and its connection closes;
    /// so are those of a cluster forgotten or not retained.
    #[tokio::test]
    async fn an_instance_removed_is_no_longer_polled() {
        let one = Fake::start(Fake::answer(pg("db-1", PgRole::Primary, "0/1"))).await;
        let two = Fake::start(Fake::answer(pg("db-2", PgRole::Replica, "0/1"))).await;
        let prober = Prober::new(config());
        let c = cluster("a");
        let host = |f: &Fake| Some(f.host.clone());
        prober.track_hosts(
            &c,
            [
                ("db-1".to_string(), host(&one)),
                ("db-2".to_string(), host(&two)),
            ],
        );
        one.more_requests(2).await;
        two.more_requests(2).await;
        assert_eq!(prober.stats().instances, 2);

        prober.track_hosts(&c, [("db-1".to_string(), host(&one))]);
        until(|| two.closed() >= 1).await;
        let served = two.requests();
        one.more_requests(5).await;
        assert_eq!(two.requests(), served, "db-2 is no longer polled");
        assert_eq!(two.accepts(), 1);
        assert_eq!(prober.stats().instances, 1);
        let probes = prober.snapshot(&c).await;
        assert_eq!(probes.keys().collect::<Vec<_>>(), ["db-1"]);

        let other = cluster("b");
        prober.track_hosts(&other, [("b-1".to_string(), host(&two))]);
        until(|| two.accepts() >= 2).await;
        prober.retain(|cluster| cluster.name == "b");
        until(|| one.closed() >= 1).await;
        assert_eq!(prober.clusters(), std::slice::from_ref(&other));
        assert!(prober.snapshot(&c).await.is_empty());
        prober.forget(&other);
        until(|| two.closed() >= 2).await;
        assert_eq!(prober.stats().instances, 0);
    }

    /// (f) A snapshot right after `track` has real data: what was not probed yet is probed
    /// then. An instance without an IP is unreachable; one whose IP changed is read at its
    /// new address.
    #[tokio::test]
    async fn a_snapshot_probes_what_was_never_probed() {
        let old = Fake::start(Fake::answer(pg("db-1", PgRole::Primary, "0/1"))).await;
        let new = Fake::start(Fake::answer(pg("db-1", PgRole::Replica, "0/1"))).await;
        // Polls far apart: the snapshot finds nothing probed yet (or, rarely, the first
        // poll; either way it answers with what the manager says).
        let prober = Prober::new(Config {
            interval: Duration::from_secs(3600),
            ..config()
        });
        let c = cluster("a");
        prober.track_hosts(
            &c,
            [
                ("db-1".to_string(), Some(old.host.clone())),
                ("db-2".to_string(), None),
            ],
        );
        let probes = prober.snapshot(&c).await;
        assert_eq!(role_of(&probes, "db-1"), Some(PgRole::Primary));
        assert!(matches!(&probes["db-2"], Probe::Unreachable(m) if m == NO_IP));
        assert!(old.requests() >= 1);
        let asked = old.requests();
        let again = prober.snapshot(&c).await;
        assert_eq!(again, probes);
        assert_eq!(old.requests(), asked, "the latest probe is kept");

        prober.track_hosts(&c, [("db-1".to_string(), Some(new.host.clone()))]);
        let probes = prober.snapshot(&c).await;
        assert_eq!(role_of(&probes, "db-1"), Some(PgRole::Replica), "new IP");
        new.set(Fake::answer(pg("db-1", PgRole::Primary, "0/1")));
        let fresh = prober.probe_now(&c).await;
        assert_eq!(role_of(&fresh, "db-1"), Some(PgRole::Primary));
        assert_eq!(new.accepts(), 1, "probe_now reuses the connection");
        assert!(prober.snapshot(&cluster("unknown")).await.is_empty());
    }
}
