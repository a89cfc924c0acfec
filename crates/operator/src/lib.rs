//! pgop's operator: the controllers behind `pgop operator`.
//!
//! One controller per kind, built on `kube::runtime::Controller`; see [`cluster`] for the
//! reconcile pipeline. The operator is the single source of truth for roles: it decides,
//! the instance managers act.
//!
//! Several replicas may run with [`Options::leader_election`]: only the holder of the
//! leader Lease runs the controllers ([`leader`]).

pub mod backoff;
pub mod backup;
pub mod cluster;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod migrate;
pub mod selector;
pub mod webhook;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::PartialObjectMeta;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use pgop_api::backup::PostgresBackup;
use pgop_api::v1beta1::PostgresCluster;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use cluster::build::{DEFAULT_IMAGE, Settings};
pub use leader::LeaderElection;

/// The version of PostgresCluster the operator reads and writes through the API server
/// (watches, reads, status): `v1beta1`, the stored version, so that none of its requests
/// needs the conversion webhook.
pub type ApiCluster = pgop_api::v1beta1::PostgresCluster;

/// A reference to `cluster` (what an Event is about), in the version its children's
/// ownerReferences name ([`pgop_api::constants::CLUSTER_OWNER_API_VERSION`]); otherwise
/// what `Resource::object_ref` gives.
pub fn reference(cluster: &impl kube::Resource) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(pgop_api::constants::CLUSTER_OWNER_API_VERSION.to_string()),
        kind: Some("PostgresCluster".to_string()),
        name: cluster.meta().name.clone(),
        namespace: cluster.meta().namespace.clone(),
        uid: cluster.meta().uid.clone(),
        // No resourceVersion: the recorder keys an event series by the reference, and a
        // cluster's changes with every status write.
        ..Default::default()
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub backoff: backoff::Backoff,
    pub recorder: Recorder,
    /// The Nodes, from a watch cache ([`cluster::nodes`]); unknown until it is filled.
    pub nodes: cluster::nodes::NodeFacts,
    /// Which PostgresClusters this operator manages ([`Options::cluster_selector`]).
    pub cluster_selector: Option<kube::core::Selector>,
    /// Client certificates for the managers' authenticated endpoint ([`cluster::pki`]).
    pub manager_clients: cluster::pki::ManagerClients,
    /// The watch caches of the clusters' children (and PostgresBackups) in this context's
    /// scope ([`cluster::cache`]); without them every pass lists from the API server.
    pub caches: Option<cluster::cache::Caches>,
    /// What each cluster's last pass wrote, until the caches show it.
    pub expectations: cluster::cache::Expectations,
    /// The instances' probes, polled apart from the reconciles ([`cluster::prober`]);
    /// without it every pass probes every instance itself.
    pub prober: Option<cluster::prober::Prober>,
}

impl Context {
    pub fn new(client: Client, settings: Settings) -> Self {
        let reporter = Reporter {
            controller: "pgop".to_string(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            backoff: backoff::Backoff::default(),
            nodes: cluster::nodes::NodeFacts::default(),
            cluster_selector: None,
            manager_clients: cluster::pki::ManagerClients::default(),
            caches: None,
            expectations: cluster::cache::Expectations::default(),
            prober: None,
        }
    }
}

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Watch these namespaces only; all namespaces when empty. Each namespace gets
    /// controllers of its own (a PostgresCluster and a PostgresBackup controller, with
    /// their watches on that namespace), so [`Options::concurrency`] applies to each.
    pub namespaces: Vec<String>,
    /// Manage only the PostgresClusters whose labels match ([`selector::parse`]), and the
    /// PostgresBackups of those clusters; all of them when `None`. Two operators with
    /// complementary selectors split the clusters between them (a canary release).
    pub cluster_selector: Option<kube::core::Selector>,
    /// Most clusters (and, separately, backups) reconciled at the same time, per watched
    /// namespace: with [`Options::namespaces`] `[a, b]` up to twice as many in all.
    pub concurrency: u16,
    pub settings: Settings,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (port 0: any free port, see
    /// [`Operator::metrics_address`]); nowhere when `None`, the default here (`pgop
    /// operator` defaults to `0.0.0.0:8080`).
    pub metrics_bind_address: Option<SocketAddr>,
    /// Run the controllers only while holding this Lease, so that several replicas may run
    /// ([`leader`]); always run them when `None`, the default here (`pgop operator` turns
    /// it on in a cluster).
    pub leader_election: Option<LeaderElection>,
    /// The operator's version, as `pgop --version` prints it: the `version` label of
    /// `pgop_operator_build_info`. This crate's version by default.
    pub version: String,
    /// Serve the validating admission webhooks ([`webhook`]), leader or not; not when
    /// `None`, the default.
    pub webhook: Option<webhook::Config>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            namespaces: Vec::new(),
            cluster_selector: None,
            concurrency: 4,
            settings: Settings::default(),
            metrics_bind_address: None,
            leader_election: None,
            version: env!("CARGO_PKG_VERSION").to_string(),
            webhook: None,
        }
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Why the operator could not start, or stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to listen for metrics on {0}")]
    MetricsListen(SocketAddr, #[source] std::io::Error),
    #[error("failed to start the admission webhooks")]
    Webhook(#[source] webhook::Error),
    /// The leader lost its Lease (see [`leader`]): its controllers were stopped at once.
    /// The process should exit (nonzero) and be restarted, to re-enter the election with
    /// empty caches.
    #[error("lost leadership (Lease {lease}): {reason}")]
    LostLeadership {
        /// `namespace/name` of the Lease.
        lease: String,
        /// Why: who holds the Lease now, or how long it went without renewal.
        reason: pgop_lease::Fence,
    },
}

/// Runs the controllers (and the metrics endpoint, when [`Options::metrics_bind_address`]
/// is set) until `shutdown` resolves; reconciles in flight then finish. Fails when the
/// metrics address cannot be bound, before any controller starts, and when leadership is
/// lost ([`Error::LostLeadership`]).
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    Operator::bind(client, options).await?.run(shutdown).await
}

/// An operator whose metrics address is bound but whose controllers do not run yet: for
/// callers that need the address (port 0 picks a free one) before [`Operator::run`].
pub struct Operator {
    client: Client,
    options: Options,
    listener: Option<(tokio::net::TcpListener, SocketAddr)>,
    webhook: Option<webhook::Webhook>,
}

impl Operator {
    /// Binds the metrics address, if any: a port in use is an error here, naming it.
    pub async fn bind(client: Client, options: Options) -> Result<Self, Error> {
        let listener = match options.metrics_bind_address {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| Error::MetricsListen(addr, e))?;
                let local = listener
                    .local_addr()
                    .map_err(|e| Error::MetricsListen(addr, e))?;
                Some((listener, local))
            }
            None => None,
        };
        let webhook = match options.webhook.clone() {
            Some(config) => Some(
                webhook::Webhook::bind(client.clone(), config)
                    .await
                    .map_err(Error::Webhook)?
                    .with_selector(options.cluster_selector.clone()),
            ),
            None => None,
        };
        Ok(Self {
            client,
            options,
            listener,
            webhook,
        })
    }

    /// Where the admission webhooks are served; `None` when disabled.
    pub fn webhook_address(&self) -> Option<SocketAddr> {
        self.webhook.as_ref().map(webhook::Webhook::local_addr)
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None` when disabled.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.listener.as_ref().map(|(_, addr)| *addr)
    }

    /// Runs the controllers and the HTTP endpoints until `shutdown` resolves; reconciles
    /// in flight then finish, and the endpoints stop with the controllers.
    ///
    /// With [`Options::leader_election`], the endpoints start at once but the controllers
    /// only once this replica holds the Lease (a shutdown while waiting just returns). The
    /// Lease is renewed in the background; when it is lost the controllers stop at once
    /// (reconciles in flight are dropped) and this returns [`Error::LostLeadership`]. On a
    /// shutdown the Lease is released after the controllers stopped, so that a standby
    /// takes over at once rather than after the Lease duration.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let Self {
            client,
            options,
            listener,
            webhook,
        } = self;
        // Nodes: names and cordons only (see cluster::nodes), cluster-wide. Without the
        // permission the watcher retries with backoff and the node features stay off.
        let (node_reader, node_writer) = kube::runtime::reflector::store::<Node>();
        // Each scope (namespace) has a context of its own: its caches (and its clusters'
        // manager client certificates). Everything else is the same in each.
        // One prober for every scope: its pool bounds the probes in flight fleet-wide.
        let prober = cluster::prober::Prober::new(cluster::prober::Config::default());
        let context = |caches: cluster::cache::Caches| {
            let mut ctx = Context::new(client.clone(), options.settings.clone());
            ctx.prober = Some(prober.clone());
            ctx.nodes = cluster::nodes::NodeFacts::new(node_reader.clone());
            ctx.cluster_selector = options.cluster_selector.clone();
            ctx.caches = Some(caches);
            Arc::new(ctx)
        };
        let recorded = Arc::new(metrics::Metrics::with_version(&options.version));
        let election = options
            .leader_election
            .as_ref()
            .map(|election| (election.lease(), election.contender(client.clone())));
        // The controllers and the HTTP server stop on the same signal.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        // A node cordoned, uncordoned or deleted wakes the clusters with an instance on it
        // (cluster::triggers): each scope's controller subscribes.
        let (node_changes, _) = tokio::sync::broadcast::channel::<String>(1024);
        let announce = node_changes.clone();
        let mut changes = cluster::triggers::NodeChanges::default();
        let nodes = kube::runtime::reflector(
            node_writer,
            watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
                .default_backoff()
                .modify(cluster::nodes::trim),
        )
        .take_until(stopped())
        .for_each(move |event| {
            match event {
                Ok(event) => {
                    for node in changes.changed(&event) {
                        // No receiver (no scope running yet) is no error.
                        let _ = announce.send(node);
                    }
                }
                Err(e) => tracing::warn!(error = %error_chain(&e), "watching Nodes"),
            }
            futures::future::ready(())
        });
        // With a selector the API server sends only the selected clusters: a cluster
        // relabelled out of it leaves the store (and this operator leaves it alone), one
        // relabelled into it arrives as new.
        let selected = match &options.cluster_selector {
            Some(selector) => watcher::Config::default().labels_from(selector),
            None => watcher::Config::default(),
        };
        // One cluster and one backup controller per watched namespace (or one of each for
        // all namespaces): a reflector's store holds one watch, and several namespaced
        // watches cannot be merged safely into one. They share the context, the metrics
        // and the stop signal; /metrics and /readyz read all their stores.
        let scopes: Vec<Option<&str>> = if options.namespaces.is_empty() {
            vec![None]
        } else {
            options
                .namespaces
                .iter()
                .map(|ns| Some(ns.as_str()))
                .collect()
        };
        let mut cluster_stores = Vec::with_capacity(scopes.len());
        let mut backup_stores = Vec::with_capacity(scopes.len());
        let mut running = Vec::with_capacity(2 * scopes.len());
        for ns in scopes {
            // The backup controller's store of PostgresBackups doubles as the clusters'
            // cache of their backups.
            let backups = Controller::new(
                api::<PostgresBackup>(&client, ns),
                watcher::Config::default(),
            )
            .with_config(controller::Config::default().concurrency(options.concurrency))
            .graceful_shutdown_on(stopped());
            let (mut caches, feeds) = cluster::cache::Caches::watch(&client, ns);
            caches.backups = Some(backups.store());
            let on_nodes = caches.clone();
            let ctx = context(caches);
            // The clusters' own watch, kept without managedFields.
            let (cluster_reader, cluster_writer) =
                kube::runtime::reflector::store::<PostgresCluster>();
            // What else a pass reads wakes it (cluster::triggers): the user's Secrets a
            // cluster names, its PostgresBackups, the nodes its instances are on.
            let naming = cluster_reader.clone();
            let recovering = cluster_reader.clone();
            let node_wakes = cluster::triggers::subscribe(&node_changes)
                .flat_map(move |node| futures::stream::iter(on_nodes.clusters_on_node(&node)));
            let cluster_stream = kube::runtime::reflector(
                cluster_writer,
                // Backing off on errors: a CRD that does not serve v1beta1 yet (the
                // operator upgraded before its CRD) is retried, not hammered.
                watcher(api::<PostgresCluster>(&client, ns), selected.clone())
                    .default_backoff()
                    .modify(cluster::cache::trim::<PostgresCluster>),
            )
            .applied_objects()
            // Failovers, for pgop_cluster_last_failover_timestamp_seconds.
            .inspect_ok({
                let recorded = recorded.clone();
                move |cluster| recorded.observe_cluster(cluster)
            });
            // Each child kind's watch fills its cache and triggers its cluster's reconcile.
            let clusters = feeds
                .attach(Controller::for_stream(cluster_stream, cluster_reader))
                // A significant change of an instance (its role, reachability, readiness)
                // wakes its cluster at once.
                .reconcile_on(prober.wakes(ns.map(str::to_string)))
                .watches_stream(
                    cluster::triggers::user_secrets(api::<PartialObjectMeta<Secret>>(&client, ns)),
                    move |secret| {
                        cluster::triggers::clusters_naming_secret(
                            &naming.state(),
                            &secret.namespace().unwrap_or_default(),
                            &secret.name_any(),
                        )
                    },
                )
                .watches_stream(
                    cluster::triggers::backups(api::<PostgresBackup>(&client, ns)),
                    move |backup| {
                        cluster::triggers::clusters_of_backup(&recovering.state(), &backup)
                    },
                )
                .reconcile_on(node_wakes)
                .with_config(controller::Config::default().concurrency(options.concurrency))
                .graceful_shutdown_on(stopped());
            cluster_stores.push(clusters.store());
            let m = recorded.clone();
            let clusters = clusters
                .run(
                    move |obj, ctx| {
                        timed(
                            m.clone(),
                            metrics::Controller::Cluster,
                            cluster::reconcile(obj, ctx),
                            cluster::Error::metric_label,
                        )
                    },
                    cluster::error_policy,
                    ctx.clone(),
                )
                .for_each(|result| async move {
                    match result {
                        Ok((obj, _)) => tracing::debug!(cluster = %obj, "reconciled"),
                        Err(controller::Error::ReconcilerFailed(..)) => {} // logged by error_policy
                        // A child changed whose cluster is not in the store: the cluster was
                        // just deleted, or another operator manages it (--cluster-selector).
                        Err(controller::Error::ObjectNotFound(obj)) => {
                            tracing::trace!(cluster = %obj, "not managed here (or deleted)")
                        }
                        Err(e) => tracing::warn!(error = %error_chain(&e), "controller error"),
                    }
                });
            running.push(futures::FutureExt::boxed(clusters));
            backup_stores.push(backups.store());
            let m = recorded.clone();
            let backups = backups
                .run(
                    move |obj, ctx| {
                        timed(
                            m.clone(),
                            metrics::Controller::Backup,
                            backup::controller::reconcile(obj, ctx),
                            backup::controller::Error::metric_label,
                        )
                    },
                    backup::controller::error_policy,
                    ctx.clone(),
                )
                .for_each(|result| async move {
                    match result {
                        Ok((obj, _)) => tracing::debug!(backup = %obj, "reconciled"),
                        Err(controller::Error::ReconcilerFailed(..)) => {}
                        Err(e) => tracing::warn!(error = %error_chain(&e), "controller error"),
                    }
                });
            running.push(futures::FutureExt::boxed(backups));
        }

        // Clusters gone from every store (deleted, relabelled out of the selector) stop
        // being probed: a reconcile never runs for them to say so.
        let sweep = {
            let stores = cluster_stores.clone();
            let prober = prober.clone();
            async move {
                let mut every = tokio::time::interval(PROBER_SWEEP);
                loop {
                    every.tick().await;
                    prober.retain(|r| stores.iter().any(|s| s.get(r).is_some()));
                }
            }
        };
        let sweep_stopped = stopped();
        let sweep = async move {
            tokio::select! {
                () = sweep => {}
                () = sweep_stopped => {}
            }
        };
        // Freed memory back to the system (memory.rs), on the same stop.
        let trim_stopped = stopped();
        let trim = async move {
            tokio::select! {
                () = memory::trim_periodically() => {}
                () = trim_stopped => {}
            }
        };
        let server = listener.map(|(listener, addr)| {
            tracing::info!(address = %addr, "serving /metrics, /healthz and /readyz");
            let router = metrics::router(metrics::Sources {
                metrics: recorded.clone(),
                clusters: cluster_stores,
                backups: backup_stores,
                selective: options.cluster_selector.is_some(),
                prober: Some(prober.clone()),
            });
            let serve = axum::serve(listener, router).with_graceful_shutdown(stopped());
            let stopped = stopped();
            async move {
                // A scrape still in flight gets the grace period, not more.
                let overdue = async {
                    stopped.await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                };
                tokio::select! {
                    result = serve => if let Err(e) = result {
                        tracing::error!(address = %addr, error = %e, "the metrics server failed");
                    },
                    () = overdue => {}
                }
            }
        });
        // The webhooks answer from the start, whether this replica leads or not, and stop
        // with the rest.
        let webhooks_stopped = stopped();
        let webhook_metrics = recorded.clone();
        let webhooks_overdue = stopped();
        let webhooks = async move {
            let Some(webhook) = webhook else {
                return;
            };
            // A review in flight gets the grace period, not more.
            let overdue = async {
                webhooks_overdue.await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            };
            let webhook = webhook.with_metrics(webhook_metrics);
            tokio::select! {
                result = webhook.run(webhooks_stopped) => if let Err(e) = result {
                    tracing::error!(error = %error_chain(&e), "the webhook server failed");
                },
                () = overdue => {}
            }
        };
        let server = async move {
            tokio::join!(
                async move {
                    if let Some(server) = server {
                        server.await;
                    }
                },
                webhooks
            );
        };

        // The controllers are built above but do nothing until polled: their stores serve
        // /metrics and /readyz from the start, empty while waiting for leadership.
        let controllers = async move {
            tokio::pin!(shutdown);
            let mut leading = None;
            if let Some((lease, contender)) = election {
                tracing::info!(%lease, identity = %contender.identity(), "leader election: waiting for the Lease");
                tokio::select! {
                    acquired = leader::acquire(&contender) => {
                        tracing::info!(%lease, "leading: starting the controllers");
                        let (keeper, lost) = leader::keep(contender.clone(), acquired);
                        leading = Some((lease, contender, keeper, lost));
                    }
                    () = &mut shutdown => {
                        // An acquisition cut short may have succeeded all the same.
                        release(&lease, &contender).await;
                        let _ = stop_tx.send(true);
                        return Ok(());
                    }
                }
            }
            recorded.set_leader(true);
            let mut both = Box::pin(async {
                tokio::join!(futures::future::join_all(running), nodes, sweep, trim);
            });
            let (lost, leading) = match leading {
                Some((lease, contender, keeper, lost)) => (
                    futures::future::Either::Left(lost),
                    Some((lease, contender, keeper)),
                ),
                None => (futures::future::Either::Right(std::future::pending()), None),
            };
            tokio::pin!(lost);
            let lost_leadership = |reason: pgop_lease::Fence| {
                // Another replica may lead already: not one more write.
                let lease = leading
                    .as_ref()
                    .map(|(lease, ..)| lease.clone())
                    .unwrap_or_default();
                tracing::error!(%lease, %reason, "lost leadership: stopping the controllers at once");
                Err(Error::LostLeadership { lease, reason })
            };
            let result = tokio::select! {
                () = &mut both => Ok(()),
                () = &mut shutdown => {
                    let _ = stop_tx.send(true);
                    // Reconciles in flight finish within the grace period, unless leadership
                    // is lost meanwhile. A controller that never started (its CRD is not
                    // installed: it keeps waiting for its first list) must not hold the exit
                    // up for ever.
                    tokio::select! {
                        finished = tokio::time::timeout(SHUTDOWN_GRACE, &mut both) => {
                            if finished.is_err() {
                                tracing::warn!(grace = ?SHUTDOWN_GRACE, "controllers did not stop in time; exiting anyway");
                            }
                            Ok(())
                        }
                        reason = &mut lost => lost_leadership(reason),
                    }
                }
                reason = &mut lost => lost_leadership(reason),
            };
            // The controllers stop here: whatever they were doing is dropped.
            drop(both);
            recorded.set_leader(false);
            if let Some((lease, contender, keeper)) = leading {
                keeper.stop().await;
                if result.is_ok() {
                    release(&lease, &contender).await;
                }
            }
            // Controllers that ended on their own take the server down with them.
            let _ = stop_tx.send(true);
            result
        };
        let (result, ()) = tokio::join!(controllers, server);
        result
    }
}

/// Releases the leader Lease if this replica holds it, so that a standby takes over at
/// once; a failure only delays the takeover until the Lease expires.
async fn release(lease: &str, contender: &pgop_lease::Contender) {
    if let Err(err) = contender.release().await {
        tracing::warn!(%lease, error = %error_chain(&err), "failed to release the leader Lease; a standby takes over once it expires");
    }
}

/// Runs one reconcile and records its duration and outcome.
async fn timed<E>(
    recorded: Arc<metrics::Metrics>,
    controller: metrics::Controller,
    reconcile: impl Future<Output = Result<Action, E>>,
    label: fn(&E) -> &'static str,
) -> Result<Action, E> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    recorded.record(
        controller,
        started.elapsed(),
        result.as_ref().err().map(label),
    );
    result
}

/// How often the prober forgets the clusters no store holds any more.
const PROBER_SWEEP: std::time::Duration = std::time::Duration::from_secs(60);

/// How long reconciles in flight may take to finish after a shutdown request.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

pub use pgop_api::error_chain;

#[cfg(test)]
mod tests {
    #[test]
    fn an_events_reference_names_the_owners_version_and_no_resource_version() {
        let cluster: pgop_api::v1beta1::PostgresCluster =
            serde_json::from_value(serde_json::json!({
                "apiVersion": pgop_api::v1beta1::API_VERSION, "kind": "PostgresCluster",
                "metadata": {"name": "db", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
                "spec": {"storage": {"size": "1Gi"}}
            }))
            .expect("a cluster");
        let r = super::reference(&cluster);
        assert_eq!(
            r.api_version.as_deref(),
            Some(pgop_api::constants::CLUSTER_OWNER_API_VERSION)
        );
        assert_eq!(
            (r.name.as_deref(), r.namespace.as_deref(), r.uid.as_deref()),
            (Some("db"), Some("ns"), Some("u1"))
        );
        // Events of one series share this reference across the cluster's writes.
        assert_eq!(r.resource_version, None);
    }
}
