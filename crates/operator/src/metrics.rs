//! The operator's `/metrics`, `/healthz` and `/readyz` (axum, on `--metrics-bind-address`).
//!
//! Two kinds of metrics, in the OpenMetrics text format:
//! - recorded as reconciles happen ([`Metrics`]): how long they take, how many succeeded or
//!   failed, and why they failed (`Error::metric_label`); and whether this replica leads;
//! - read at scrape time from the controllers' reflector stores: every PostgresCluster's
//!   phase, instances, conditions and backup times, and the PostgresBackups per phase.
//!
//! [`encode`] is a pure function of both, so the whole exposition is unit-tested without an
//! API server. Nothing about an object outlives it: a deleted cluster's series vanish with
//! it from the next scrape.
//!
//! Why this file stays whole: it is one idea, the exposition, whose families, help texts
//! and label sets must be read side by side with [`encode`] and its table test.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use pgop_api::backup::{BackupPhase, PostgresBackup};
use pgop_api::cluster::{ClusterPhase, InstanceRole};
use pgop_api::constants::{PATH_HEALTHZ, PATH_METRICS, PATH_READYZ};
use pgop_api::v1beta1::PostgresCluster;
use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the reconcile duration buckets, in seconds: 1 ms to 30 s.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

type Labels = Vec<(&'static str, String)>;
type IntGauge = Family<Labels, Gauge<i64, AtomicI64>>;
type FloatGauge = Family<Labels, Gauge<f64, AtomicU64>>;
type IntCounter = Family<Labels, Counter<u64, AtomicU64>>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Which controller a reconcile belongs to: the `controller` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    Cluster,
    Backup,
}

impl Controller {
    pub const ALL: [Controller; 2] = [Controller::Cluster, Controller::Backup];

    pub fn label(self) -> &'static str {
        match self {
            Controller::Cluster => "cluster",
            Controller::Backup => "backup",
        }
    }
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// What the reconciles recorded since the operator started. Cheap to share (`Arc`); the
/// families are themselves shared handles, so a scrape registers them as they are.
#[derive(Debug)]
pub struct Metrics {
    durations: Histograms,
    reconciles: IntCounter,
    errors: IntCounter,
    /// 1 while this replica leads (runs the controllers), 0 while it waits for leadership.
    leader: Gauge<i64, AtomicI64>,
    /// `pgop_operator_build_info{version}`: always 1, with the operator's version.
    build_info: IntGauge,
    /// Admission reviews answered, by webhook and result.
    webhook_reviews: IntCounter,
    /// When the webhooks' serving certificate in use expires (Unix seconds); absent
    /// until one is served, and when its source does not say (files).
    webhook_certificate_expiry: Gauge<i64, AtomicI64>,
    webhook_certificate_known: std::sync::atomic::AtomicBool,
    /// When the last failover this replica saw began, by cluster uid (see
    /// [`Metrics::observe_cluster`]).
    failovers: std::sync::Mutex<BTreeMap<String, f64>>,
}

impl Default for Metrics {
    /// Reports this crate's version; `pgop operator` uses [`Metrics::with_version`].
    fn default() -> Self {
        Self::with_version(env!("CARGO_PKG_VERSION"))
    }
}

impl Metrics {
    /// Metrics of an operator of `version` (as `pgop --version` prints it).
    pub fn with_version(version: &str) -> Self {
        let metrics = Self {
            durations: Histograms::new_with_constructor(duration_histogram),
            reconciles: IntCounter::default(),
            errors: IntCounter::default(),
            leader: Gauge::default(),
            build_info: IntGauge::default(),
            webhook_reviews: IntCounter::default(),
            webhook_certificate_expiry: Gauge::default(),
            webhook_certificate_known: std::sync::atomic::AtomicBool::new(false),
            failovers: std::sync::Mutex::default(),
        };
        metrics
            .build_info
            .get_or_create(&vec![("version", version.to_string())])
            .set(1);
        // Every controller and result has a series from the start, so a rate over them
        // has a first sample at 0 instead of appearing with the first failure.
        for controller in Controller::ALL {
            drop(
                metrics
                    .durations
                    .get_or_create(&vec![("controller", controller.label().to_string())]),
            );
            for result in ["ok", "error"] {
                drop(
                    metrics
                        .reconciles
                        .get_or_create(&result_labels(controller, result)),
                );
            }
        }
        metrics
    }
}

fn result_labels(controller: Controller, result: &str) -> Labels {
    vec![
        ("controller", controller.label().to_string()),
        ("result", result.to_string()),
    ]
}

/// A webhook, for the `webhook` label of `pgop_operator_webhook_reviews_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Webhook {
    DefaultClusters,
    ValidateClusters,
    ValidateBackups,
    ConvertClusters,
}

impl Webhook {
    pub fn label(self) -> &'static str {
        match self {
            Webhook::DefaultClusters => "default-postgresclusters",
            Webhook::ValidateClusters => "validate-postgresclusters",
            Webhook::ValidateBackups => "validate-postgresbackups",
            Webhook::ConvertClusters => "convert-postgresclusters",
        }
    }
}

/// What a review answered: the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Review {
    /// Allowed as it was.
    Allowed,
    /// Allowed with a patch (defaults written).
    Patched,
    /// Refused, naming the fields.
    Refused,
    /// Allowed with a check left out (a lookup failed or timed out).
    Unchecked,
    /// The request could not be read.
    Invalid,
    /// Not this operator's to review: a cluster its `--cluster-selector` does not select.
    Skipped,
    /// Every object of a conversion review converted.
    Converted,
}

impl Review {
    pub fn label(self) -> &'static str {
        match self {
            Review::Allowed => "allowed",
            Review::Patched => "patched",
            Review::Refused => "refused",
            Review::Unchecked => "unchecked",
            Review::Invalid => "invalid",
            Review::Skipped => "skipped",
            Review::Converted => "converted",
        }
    }
}

impl Metrics {
    /// Counts one admission review.
    pub fn record_review(&self, webhook: Webhook, review: Review) {
        self.webhook_reviews
            .get_or_create(&vec![
                ("webhook", webhook.label().to_string()),
                ("result", review.label().to_string()),
            ])
            .inc();
    }

    /// The serving certificate now in use expires at `not_after`.
    pub fn set_webhook_certificate_expiry(&self, not_after: jiff::Timestamp) {
        self.webhook_certificate_expiry.set(not_after.as_second());
        self.webhook_certificate_known
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Metrics {
    /// Notes a cluster as the controller's watch delivers it: while its phase is
    /// FailingOver, when that failover began (`status.targetPrimarySince`). A failover
    /// writes that phase to the status until the new primary reports in, so a watch sees
    /// it even when a scrape falls before and after it; switchovers (phase SwitchingOver)
    /// are not failovers.
    pub fn observe_cluster(&self, cluster: &PostgresCluster) {
        let Some(status) = cluster.status.as_ref() else {
            return;
        };
        if status.phase != Some(ClusterPhase::FailingOver) {
            return;
        }
        let (Some(uid), Some(since)) = (cluster.uid(), status.target_primary_since.as_ref()) else {
            return;
        };
        let mut failovers = self.failovers.lock().unwrap_or_else(|p| p.into_inner());
        failovers.insert(uid, epoch_seconds(since));
    }

    /// When the last failover of the cluster with this uid that this replica saw began.
    fn last_failover(&self, uid: &str) -> Option<f64> {
        let failovers = self.failovers.lock().unwrap_or_else(|p| p.into_inner());
        failovers.get(uid).copied()
    }

    /// Forgets the failovers of clusters that are not among `clusters` (deleted ones).
    fn forget_failovers_except(&self, clusters: &[Arc<PostgresCluster>]) {
        let mut failovers = self.failovers.lock().unwrap_or_else(|p| p.into_inner());
        failovers.retain(|uid, _| clusters.iter().any(|c| c.uid().as_deref() == Some(uid)));
    }
}

impl Metrics {
    /// Whether this replica leads: set when it starts its controllers (at once without
    /// leader election), cleared when it stops them. Not leading at first.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Whether this replica leads (runs the controllers).
    pub fn leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Records one reconcile: how long it took and, when it failed, why (the error's
    /// `metric_label`).
    pub fn record(&self, controller: Controller, elapsed: Duration, error: Option<&'static str>) {
        self.durations
            .get_or_create(&vec![("controller", controller.label().to_string())])
            .observe(elapsed.as_secs_f64());
        let result = if error.is_some() { "error" } else { "ok" };
        self.reconciles
            .get_or_create(&result_labels(controller, result))
            .inc();
        if let Some(reason) = error {
            self.errors
                .get_or_create(&vec![
                    ("controller", controller.label().to_string()),
                    ("reason", reason.to_string()),
                ])
                .inc();
        }
    }
}

/// Registers families on a registry with the `pgop` prefix.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn int(&mut self, name: &str, help: &str) -> IntGauge {
        let family = IntGauge::default();
        self.registry.register(name, help, family.clone());
        family
    }

    fn float_with_unit(&mut self, name: &str, help: &str, unit: Unit) -> FloatGauge {
        let family = FloatGauge::default();
        self.registry
            .register_with_unit(name, help, unit, family.clone());
        family
    }
}

fn set(family: &IntGauge, labels: Labels, value: i64) {
    family.get_or_create(&labels).set(value);
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A Kubernetes time as seconds since the Unix epoch (with its fraction).
fn epoch_seconds(time: &Time) -> f64 {
    // Exact for any plausible date: microseconds since 1970 fit in f64's 53 bits.
    time.0.as_microsecond() as f64 / 1e6
}

const CLUSTER_PHASES: [ClusterPhase; 12] = [
    ClusterPhase::Pending,
    ClusterPhase::Creating,
    ClusterPhase::Ready,
    ClusterPhase::Degraded,
    ClusterPhase::FailingOver,
    ClusterPhase::SwitchingOver,
    ClusterPhase::Invalid,
    ClusterPhase::Deleting,
    ClusterPhase::Hibernating,
    ClusterPhase::Hibernated,
    ClusterPhase::Resuming,
    ClusterPhase::Upgrading,
];

fn cluster_phase_name(phase: ClusterPhase) -> &'static str {
    match phase {
        ClusterPhase::Pending => "Pending",
        ClusterPhase::Creating => "Creating",
        ClusterPhase::Ready => "Ready",
        ClusterPhase::Degraded => "Degraded",
        ClusterPhase::FailingOver => "FailingOver",
        ClusterPhase::SwitchingOver => "SwitchingOver",
        ClusterPhase::Invalid => "Invalid",
        ClusterPhase::Deleting => "Deleting",
        ClusterPhase::Hibernating => "Hibernating",
        ClusterPhase::Hibernated => "Hibernated",
        ClusterPhase::Resuming => "Resuming",
        ClusterPhase::Upgrading => "Upgrading",
    }
}

const BACKUP_PHASES: [BackupPhase; 4] = [
    BackupPhase::Pending,
    BackupPhase::Running,
    BackupPhase::Completed,
    BackupPhase::Failed,
];

fn backup_phase_name(phase: BackupPhase) -> &'static str {
    match phase {
        BackupPhase::Pending => "Pending",
        BackupPhase::Running => "Running",
        BackupPhase::Completed => "Completed",
        BackupPhase::Failed => "Failed",
    }
}

/// The `role` label of an instance in `status.instances`; `unknown` before its first probe.
fn role_name(role: Option<InstanceRole>) -> &'static str {
    match role {
        Some(InstanceRole::Primary) => "primary",
        Some(InstanceRole::Replica) => "replica",
        None => "unknown",
    }
}

/// The metrics of one scrape, in the OpenMetrics text format (ending with `# EOF`): the
/// recorded reconcile metrics, then the clusters' and backups' state as the stores hold it.
pub fn encode(
    clusters: &[Arc<PostgresCluster>],
    backups: &[Arc<PostgresBackup>],
    metrics: &Metrics,
    prober: Option<crate::cluster::prober::Stats>,
) -> Result<String, std::fmt::Error> {
    let mut b = Builder {
        registry: Registry::with_prefix("pgop"),
    };

    // Reconciles, as recorded.
    b.registry.register_with_unit(
        "operator_reconcile_duration",
        "How long reconciles take, by controller (cluster or backup)",
        Unit::Seconds,
        metrics.durations.clone(),
    );
    b.registry.register(
        "operator_reconciles",
        "Reconciles finished, by controller and result (ok or error)",
        metrics.reconciles.clone(),
    );
    b.registry.register(
        "operator_leader",
        "1 while this operator replica is the leader and runs the controllers, 0 while it waits for leadership",
        metrics.leader.clone(),
    );
    b.registry.register(
        "operator_build_info",
        "Always 1, labelled with the version of this operator (pgop --version)",
        metrics.build_info.clone(),
    );
    b.registry.register(
        "operator_webhook_reviews",
        "Admission reviews answered by this replica's webhooks, by webhook and result (allowed, patched, refused, unchecked, invalid, skipped)",
        metrics.webhook_reviews.clone(),
    );
    if metrics
        .webhook_certificate_known
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        b.registry.register(
            "operator_webhook_certificate_expiry_timestamp_seconds",
            "When the webhooks' serving certificate in use expires, in seconds since the Unix epoch",
            metrics.webhook_certificate_expiry.clone(),
        );
    }
    b.registry.register(
        "operator_reconcile_errors",
        "Failed reconciles, by controller and reason (the error variant, as in the operator's logs)",
        metrics.errors.clone(),
    );

    // The prober's counters (while the controllers run).
    if let Some(stats) = prober {
        b.registry.register(
            "operator_probes",
            "Probes of the instance managers' /pg/status by the operator's prober, answered or not",
            ConstCounter::new(stats.probes),
        );
        b.registry.register(
            "operator_probe_failures",
            "Probes that found the instance unreachable (refused, dropped, timed out, unreadable)",
            ConstCounter::new(stats.failures),
        );
        b.registry.register(
            "operator_prober_connections",
            "Connections the prober opened to instance managers (each kept alive across probes)",
            ConstCounter::new(stats.connections),
        );
        b.registry.register(
            "operator_prober_wakes",
            "Significant changes of an instance the prober saw, each waking its cluster's reconcile",
            ConstCounter::new(stats.wakes),
        );
        b.registry.register(
            "operator_prober_instances",
            "Instances the prober polls now",
            ConstGauge::new(i64::try_from(stats.instances).unwrap_or(i64::MAX)),
        );
    }

    // Clusters, from the store.
    let phase = b.int(
        "cluster_phase",
        "The cluster's phase: 1 for the current one, 0 for the others (all 0 before the operator set one)",
    );
    let instances = b.int(
        "cluster_instances",
        "Instances the cluster asks for (spec.instances)",
    );
    let ready = b.int(
        "cluster_ready_instances",
        "Instances whose Pod is ready (status.readyReplicas)",
    );
    let by_role = b.int(
        "cluster_instances_by_role",
        "Instances in status.instances by role: primary, replica, or unknown before the first probe",
    );
    let condition = b.int(
        "cluster_condition",
        "1 for each condition of the cluster, with its type and status (True, False or Unknown)",
    );
    let last_backup = b.float_with_unit(
        "cluster_last_backup_timestamp",
        "When the cluster's last base backup completed, seconds since the Unix epoch",
        Unit::Seconds,
    );
    let last_logical = b.float_with_unit(
        "cluster_last_logical_backup_timestamp",
        "When the cluster's last logical backup (pg_dump) completed, seconds since the Unix epoch",
        Unit::Seconds,
    );
    let recoverability = b.float_with_unit(
        "cluster_first_recoverability_point_timestamp",
        "The earliest time the cluster can be restored to from its backups, seconds since the Unix epoch",
        Unit::Seconds,
    );
    let last_failover = b.float_with_unit(
        "cluster_last_failover_timestamp",
        "When the cluster's last failover seen by this operator replica began (status.targetPrimarySince while the phase was FailingOver), seconds since the Unix epoch",
        Unit::Seconds,
    );
    for cluster in clusters {
        let base = vec![
            ("namespace", cluster.namespace().unwrap_or_default()),
            ("cluster", cluster.name_any()),
        ];
        let with = |key: &'static str, value: &str| {
            let mut labels = base.clone();
            labels.push((key, value.to_string()));
            labels
        };
        if let Some(at) = cluster.uid().and_then(|uid| metrics.last_failover(&uid)) {
            last_failover.get_or_create(&base).set(at);
        }
        let status = cluster.status.as_ref();
        let current = status.and_then(|s| s.phase);
        for p in CLUSTER_PHASES {
            set(
                &phase,
                with("phase", cluster_phase_name(p)),
                i64::from(current == Some(p)),
            );
        }
        set(&instances, base.clone(), i64::from(cluster.spec.instances));
        set(
            &ready,
            base.clone(),
            status.map_or(0, |s| i64::from(s.ready_replicas)),
        );
        let listed = status.map(|s| s.instances.as_slice()).unwrap_or_default();
        for role in [
            Some(InstanceRole::Primary),
            Some(InstanceRole::Replica),
            None,
        ] {
            let n = listed.iter().filter(|i| i.role == role).count();
            set(&by_role, with("role", role_name(role)), count(n));
        }
        let Some(status) = status else {
            continue;
        };
        for c in &status.conditions {
            let mut labels = with("type", &c.type_);
            labels.push(("status", c.status.clone()));
            set(&condition, labels, 1);
        }
        if let Some(at) = &status.last_backup_time {
            last_backup.get_or_create(&base).set(epoch_seconds(at));
        }
        if let Some(at) = &status.last_logical_backup_time {
            last_logical.get_or_create(&base).set(epoch_seconds(at));
        }
        if let Some(at) = &status.first_recoverability_point {
            recoverability.get_or_create(&base).set(epoch_seconds(at));
        }
    }

    // Backups, from the store: every phase of each (namespace, cluster) that has any.
    let by_phase = b.int(
        "backups",
        "PostgresBackups by namespace, cluster and phase (a backup without a status yet counts as Pending)",
    );
    let mut counts: BTreeMap<(String, String), [usize; BACKUP_PHASES.len()]> = BTreeMap::new();
    for backup in backups {
        let key = (
            backup.namespace().unwrap_or_default(),
            backup.spec.cluster.name.clone(),
        );
        let phase = backup
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or(BackupPhase::Pending);
        let slot = BACKUP_PHASES.iter().position(|p| *p == phase).unwrap_or(0);
        counts.entry(key).or_default()[slot] += 1;
    }
    for ((namespace, cluster), n) in counts {
        for (p, n) in BACKUP_PHASES.iter().zip(n) {
            set(
                &by_phase,
                vec![
                    ("namespace", namespace.clone()),
                    ("cluster", cluster.clone()),
                    ("phase", backup_phase_name(*p).to_string()),
                ],
                count(n),
            );
        }
    }

    let mut out = String::new();
    text::encode(&mut out, &b.registry)?;
    Ok(out)
}

/// What the HTTP endpoints read: the recorded metrics and the controllers' stores, one
/// of each kind per watched namespace (or one for all namespaces).
#[derive(Clone)]
pub struct Sources {
    pub metrics: Arc<Metrics>,
    pub clusters: Vec<Store<PostgresCluster>>,
    pub backups: Vec<Store<PostgresBackup>>,
    /// Whether the operator manages only selected clusters (`--cluster-selector`): then
    /// only the backups of the clusters in the store are reported, so that two operators
    /// side by side never both report one backup.
    pub selective: bool,
    /// The prober, whose counters are reported while this replica leads.
    pub prober: Option<crate::cluster::prober::Prober>,
}

impl Sources {
    /// Whether this replica is ready: the leader once every store has received its first
    /// list from the API server; a standby (waiting for leadership, its controllers
    /// not started) always. A standby is healthy, and a Deployment's rolling update must
    /// not wait for it: there, the new Pod is the standby until the old leader is gone.
    pub fn ready(&self) -> bool {
        !self.metrics.leader()
            || (self.clusters.iter().all(listed) && self.backups.iter().all(listed))
    }

    /// The clusters in every store.
    fn clusters(&self) -> Vec<Arc<PostgresCluster>> {
        self.clusters.iter().flat_map(Store::state).collect()
    }

    /// The backups in every store.
    fn backups(&self) -> Vec<Arc<PostgresBackup>> {
        self.backups.iter().flat_map(Store::state).collect()
    }
}

fn listed<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    // Resolves at once when the store is ready; never waits here.
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// The routes: `GET /metrics`, `/healthz` (200 while the process runs) and `/readyz` (200
/// once all the controllers' stores have their first list, 503 before; always 200 while
/// waiting for leadership, see [`Sources::ready`]).
pub fn router(sources: Sources) -> Router {
    Router::new()
        .route(PATH_HEALTHZ, get(healthz))
        .route(PATH_READYZ, get(readyz))
        .route(PATH_METRICS, get(serve_metrics))
        .with_state(Arc::new(sources))
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(sources): State<Arc<Sources>>) -> (StatusCode, &'static str) {
    if !sources.metrics.leader() {
        (StatusCode::OK, "ready: standby, waiting for leadership\n")
    } else if sources.ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first list of PostgresClusters and PostgresBackups\n",
        )
    }
}

/// The backups to report: all of them, or with `selective` only those of the clusters
/// (namespace and name) in `clusters`.
fn reported_backups(
    clusters: &[Arc<PostgresCluster>],
    mut backups: Vec<Arc<PostgresBackup>>,
    selective: bool,
) -> Vec<Arc<PostgresBackup>> {
    if selective {
        backups.retain(|b| {
            clusters
                .iter()
                .any(|c| c.namespace() == b.namespace() && c.name_any() == b.spec.cluster.name)
        });
    }
    backups
}

async fn serve_metrics(State(sources): State<Arc<Sources>>) -> Response {
    let clusters = sources.clusters();
    sources.metrics.forget_failovers_except(&clusters);
    let backups = reported_backups(&clusters, sources.backups(), sources.selective);
    let prober = sources
        .prober
        .as_ref()
        .filter(|_| sources.metrics.leader())
        .map(crate::cluster::prober::Prober::stats);
    match encode(&clusters, &backups, &sources.metrics, prober) {
        Ok(body) => ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(std::fmt::Error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed to encode the metrics\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(
        namespace: &str,
        name: &str,
        replicas: i32,
        status: serde_json::Value,
    ) -> Arc<PostgresCluster> {
        let mut object = serde_json::json!({
            "apiVersion": "database.example.com/v1beta1",
            "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"instances": replicas, "storage": {"size": "1Gi"}}
        });
        if !status.is_null() {
            object["status"] = status;
        }
        Arc::new(serde_json::from_value(object).expect("a valid cluster"))
    }

    fn ready_cluster() -> Arc<PostgresCluster> {
        let at = "2025-01-31T12:00:00Z";
        cluster(
            "prod",
            "main",
            3,
            serde_json::json!({
                "phase": "Ready",
                "replicas": 3,
                "readyReplicas": 3,
                "currentPrimary": "main-1",
                "instances": [
                    {"name": "main-1", "serial": 1, "role": "primary", "ready": true},
                    {"name": "main-2", "serial": 2, "role": "replica", "ready": true},
                    {"name": "main-3", "serial": 3, "role": "replica", "ready": true}
                ],
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "AllReady", "message": "", "lastTransitionTime": at},
                    {"type": "Degraded", "status": "False", "reason": "AllReady", "message": "", "lastTransitionTime": at},
                    {"type": "BackupSucceeded", "status": "True", "reason": "Completed", "message": "", "lastTransitionTime": at}
                ],
                "lastBackupTime": "2025-01-31T12:00:00Z",
                "lastLogicalBackupTime": "2025-01-31T13:00:00Z",
                "firstRecoverabilityPoint": "2025-01-30T00:00:00Z"
            }),
        )
    }

    fn backup(
        namespace: &str,
        name: &str,
        cluster: &str,
        phase: Option<&str>,
    ) -> Arc<PostgresBackup> {
        let mut object = serde_json::json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresBackup",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"cluster": {"name": cluster}}
        });
        if let Some(phase) = phase {
            object["status"] = serde_json::json!({"phase": phase});
        }
        Arc::new(serde_json::from_value(object).expect("a valid backup"))
    }

    /// Checks the exposition's shape: every sample is `name{labels} value` of a family whose
    /// TYPE came before it, comments are HELP/TYPE/UNIT, and it ends with `# EOF`. Returns
    /// the samples.
    fn parse(text: &str) -> Vec<(String, String, f64)> {
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        let mut families: Vec<(String, String)> = Vec::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.splitn(3, ' ');
                match words.next() {
                    Some("EOF") => continue,
                    Some("TYPE") => {
                        let name = words.next().expect("TYPE name");
                        let kind = words.next().expect("TYPE kind");
                        assert!(["gauge", "counter", "histogram"].contains(&kind), "{line}");
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
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.strip_suffix('}').expect("closing brace")),
                None => (series, ""),
            };
            assert!(
                name.starts_with("pgop_")
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            assert!(
                families.iter().any(|(family, kind)| match kind.as_str() {
                    "counter" => name.strip_suffix("_total") == Some(family),
                    "histogram" => ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(family)),
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

    fn has_line(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }

    #[test]
    fn a_ready_cluster_with_three_instances_conditions_and_backups() {
        let text = encode(&[ready_cluster()], &[], &Metrics::default(), None).expect("encode");
        for line in [
            r#"pgop_cluster_phase{namespace="prod",cluster="main",phase="Ready"} 1"#,
            r#"pgop_cluster_phase{namespace="prod",cluster="main",phase="Degraded"} 0"#,
            r#"pgop_cluster_phase{namespace="prod",cluster="main",phase="Pending"} 0"#,
            r#"pgop_cluster_instances{namespace="prod",cluster="main"} 3"#,
            r#"pgop_cluster_ready_instances{namespace="prod",cluster="main"} 3"#,
            r#"pgop_cluster_instances_by_role{namespace="prod",cluster="main",role="primary"} 1"#,
            r#"pgop_cluster_instances_by_role{namespace="prod",cluster="main",role="replica"} 2"#,
            r#"pgop_cluster_instances_by_role{namespace="prod",cluster="main",role="unknown"} 0"#,
            r#"pgop_cluster_condition{namespace="prod",cluster="main",type="Ready",status="True"} 1"#,
            r#"pgop_cluster_condition{namespace="prod",cluster="main",type="Degraded",status="False"} 1"#,
            r#"pgop_cluster_condition{namespace="prod",cluster="main",type="BackupSucceeded",status="True"} 1"#,
            r#"pgop_cluster_last_backup_timestamp_seconds{namespace="prod",cluster="main"} 1738324800.0"#,
            r#"pgop_cluster_last_logical_backup_timestamp_seconds{namespace="prod",cluster="main"} 1738328400.0"#,
            r#"pgop_cluster_first_recoverability_point_timestamp_seconds{namespace="prod",cluster="main"} 1738195200.0"#,
            "# TYPE pgop_cluster_phase gauge",
            "# TYPE pgop_cluster_last_backup_timestamp_seconds gauge",
            "# UNIT pgop_cluster_last_backup_timestamp_seconds seconds",
            "# TYPE pgop_operator_reconcile_duration_seconds histogram",
            "# UNIT pgop_operator_reconcile_duration_seconds seconds",
            "# TYPE pgop_operator_reconciles counter",
            r#"pgop_operator_reconciles_total{controller="cluster",result="ok"} 0"#,
            r#"pgop_operator_reconciles_total{controller="backup",result="error"} 0"#,
        ] {
            has_line(&text, line);
        }
        let samples = parse(&text);
        // Every phase, one of them current.
        let phases: Vec<_> = samples
            .iter()
            .filter(|(n, _, _)| n == "pgop_cluster_phase")
            .collect();
        assert_eq!(phases.len(), CLUSTER_PHASES.len(), "{text}");
        assert_eq!(CLUSTER_PHASES.len(), 12);
        assert_eq!(phases.iter().map(|(_, _, v)| v).sum::<f64>(), 1.0);
        // Exactly the three conditions.
        let conditions = samples
            .iter()
            .filter(|(n, _, _)| n == "pgop_cluster_condition")
            .count();
        assert_eq!(conditions, 3, "{text}");
        // No backups, no errors: those families are left out.
        assert!(!text.contains("pgop_backups"), "{text}");
        assert!(
            !text.contains("pgop_operator_reconcile_errors_total{"),
            "{text}"
        );
    }

    #[test]
    fn the_probers_counters_are_reported_when_given() {
        let stats = crate::cluster::prober::Stats {
            probes: 12,
            failures: 3,
            connections: 4,
            wakes: 2,
            instances: 6,
        };
        let text = encode(&[], &[], &Metrics::default(), Some(stats)).expect("encode");
        for line in [
            "pgop_operator_probes_total 12",
            "pgop_operator_probe_failures_total 3",
            "pgop_operator_prober_connections_total 4",
            "pgop_operator_prober_wakes_total 2",
            "pgop_operator_prober_instances 6",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        let without = encode(&[], &[], &Metrics::default(), None).expect("encode");
        assert!(!without.contains("prober"), "{without}");
    }

    #[test]
    fn a_cluster_without_status_has_its_spec_and_zeros_only() {
        let text = encode(
            &[cluster("dev", "fresh", 2, serde_json::Value::Null)],
            &[],
            &Metrics::default(),
            None,
        )
        .expect("encode");
        let samples = parse(&text);
        let base = r#"namespace="dev",cluster="fresh""#;
        let v = |name: &str, extra: &str| value(&samples, name, &format!("{base}{extra}"));
        assert_eq!(v("pgop_cluster_instances", ""), Some(2.0));
        assert_eq!(v("pgop_cluster_ready_instances", ""), Some(0.0));
        for phase in CLUSTER_PHASES {
            let labels = format!(r#",phase="{}""#, cluster_phase_name(phase));
            assert_eq!(v("pgop_cluster_phase", &labels), Some(0.0), "{labels}");
        }
        assert_eq!(
            v("pgop_cluster_instances_by_role", r#",role="primary""#),
            Some(0.0)
        );
        assert_eq!(
            v("pgop_cluster_instances_by_role", r#",role="replica""#),
            Some(0.0)
        );
        for absent in [
            "pgop_cluster_condition",
            "pgop_cluster_last_backup_timestamp_seconds",
            "pgop_cluster_first_recoverability_point_timestamp_seconds",
        ] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
    }

    #[test]
    fn backups_are_counted_per_cluster_and_phase() {
        let backups = [
            backup("prod", "main-1", "main", Some("Completed")),
            backup("prod", "main-2", "main", Some("Failed")),
            backup("prod", "main-3", "main", Some("Completed")),
            backup("prod", "other-1", "other", None),
        ];
        let text = encode(&[], &backups, &Metrics::default(), None).expect("encode");
        for line in [
            r#"pgop_backups{namespace="prod",cluster="main",phase="Completed"} 2"#,
            r#"pgop_backups{namespace="prod",cluster="main",phase="Failed"} 1"#,
            r#"pgop_backups{namespace="prod",cluster="main",phase="Running"} 0"#,
            r#"pgop_backups{namespace="prod",cluster="main",phase="Pending"} 0"#,
            r#"pgop_backups{namespace="prod",cluster="other",phase="Pending"} 1"#,
            r#"pgop_backups{namespace="prod",cluster="other",phase="Completed"} 0"#,
            "# TYPE pgop_backups gauge",
        ] {
            has_line(&text, line);
        }
        let samples = parse(&text);
        assert_eq!(
            samples
                .iter()
                .filter(|(n, _, _)| n == "pgop_backups")
                .count(),
            8
        );
        assert!(!text.contains("pgop_cluster_"), "no clusters:\n{text}");
    }

    #[test]
    fn reconciles_are_counted_timed_and_their_errors_named() {
        let metrics = Metrics::default();
        metrics.record(Controller::Cluster, Duration::from_millis(3), None);
        metrics.record(Controller::Cluster, Duration::from_millis(40), None);
        metrics.record(Controller::Cluster, Duration::from_secs(2), Some("Apply"));
        metrics.record(
            Controller::Backup,
            Duration::from_secs(60),
            Some("NoNamespace"),
        );
        let text = encode(&[], &[], &metrics, None).expect("encode");
        for line in [
            r#"pgop_operator_reconciles_total{controller="cluster",result="ok"} 2"#,
            r#"pgop_operator_reconciles_total{controller="cluster",result="error"} 1"#,
            r#"pgop_operator_reconciles_total{controller="backup",result="ok"} 0"#,
            r#"pgop_operator_reconciles_total{controller="backup",result="error"} 1"#,
            r#"pgop_operator_reconcile_errors_total{controller="cluster",reason="Apply"} 1"#,
            r#"pgop_operator_reconcile_errors_total{controller="backup",reason="NoNamespace"} 1"#,
            r#"pgop_operator_reconcile_duration_seconds_count{controller="cluster"} 3"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="0.001",controller="cluster"} 0"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="0.005",controller="cluster"} 1"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="0.05",controller="cluster"} 2"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="2.5",controller="cluster"} 3"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="30.0",controller="cluster"} 3"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="30.0",controller="backup"} 0"#,
            r#"pgop_operator_reconcile_duration_seconds_bucket{le="+Inf",controller="backup"} 1"#,
            r#"pgop_operator_reconcile_duration_seconds_count{controller="backup"} 1"#,
            "# TYPE pgop_operator_reconcile_errors counter",
        ] {
            has_line(&text, line);
        }
        let samples = parse(&text);
        let sum = value(
            &samples,
            "pgop_operator_reconcile_duration_seconds_sum",
            r#"controller="cluster""#,
        )
        .expect("a sum");
        assert!((sum - 2.043).abs() < 1e-9, "{sum}");
        // The buckets are 1 ms .. 30 s, and +Inf.
        let buckets = samples
            .iter()
            .filter(|(n, l, _)| {
                n == "pgop_operator_reconcile_duration_seconds_bucket"
                    && l.ends_with(r#"controller="cluster""#)
            })
            .count();
        assert_eq!(buckets, DURATION_BUCKETS.len() + 1);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut c = (*ready_cluster()).clone();
        if let Some(status) = c.status.as_mut() {
            status.conditions[0].type_ = "we\"ird\\type\nx".into();
        }
        let text = encode(&[Arc::new(c)], &[], &Metrics::default(), None).expect("encode");
        has_line(
            &text,
            r#"pgop_cluster_condition{namespace="prod",cluster="main",type="we\"ird\\type\nx",status="True"} 1"#,
        );
        parse(&text);
    }

    async fn status(router: &Router, path: &str) -> (u16, String) {
        use tower::ServiceExt;
        let request = http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("a request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        let code = response.status().as_u16();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        (code, content_type)
    }

    #[test]
    fn the_build_info_names_the_version() {
        let text = encode(&[], &[], &Metrics::with_version("0.2.0-next"), None).expect("encode");
        has_line(&text, "# TYPE pgop_operator_build_info gauge");
        has_line(&text, r#"pgop_operator_build_info{version="0.2.0-next"} 1"#);
        let text = encode(&[], &[], &Metrics::default(), None).expect("encode");
        has_line(
            &text,
            &format!(
                r#"pgop_operator_build_info{{version="{}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            ),
        );
    }

    /// Cluster `name` with this uid, phase and `targetPrimarySince`.
    fn failing_over(name: &str, uid: &str, phase: &str, since: &str) -> Arc<PostgresCluster> {
        let mut c = cluster(
            "prod",
            name,
            3,
            serde_json::json!({"phase": phase, "currentPrimary": format!("{name}-1"),
                               "targetPrimary": format!("{name}-2"), "targetPrimarySince": since}),
        );
        Arc::make_mut(&mut c).metadata.uid = Some(uid.to_string());
        c
    }

    #[test]
    fn the_last_failover_seen_is_reported_until_its_cluster_goes() {
        let metrics = Metrics::default();
        let last = |clusters: &[Arc<PostgresCluster>], name: &str| {
            let text = encode(clusters, &[], &metrics, None).expect("encode");
            value(
                &parse(&text),
                "pgop_cluster_last_failover_timestamp_seconds",
                &format!(r#"namespace="prod",cluster="{name}""#),
            )
        };
        // A switchover is not a failover; nor is a cluster that never failed over.
        let switching = failing_over("a", "uid-a", "SwitchingOver", "2025-01-31T12:00:00Z");
        metrics.observe_cluster(&switching);
        assert_eq!(last(std::slice::from_ref(&switching), "a"), None);
        let failing = failing_over("a", "uid-a", "FailingOver", "2025-01-31T12:10:00.5Z");
        metrics.observe_cluster(&failing);
        // Reported after the failover ended, with the time it began.
        let ready = failing_over("a", "uid-a", "Ready", "2025-01-31T12:10:00.5Z");
        metrics.observe_cluster(&ready);
        assert_eq!(
            last(std::slice::from_ref(&ready), "a"),
            Some(1_738_325_400.5)
        );
        // Another failover of the same cluster replaces it.
        metrics.observe_cluster(&failing_over(
            "a",
            "uid-a",
            "FailingOver",
            "2025-01-31T13:00:00Z",
        ));
        assert_eq!(
            last(std::slice::from_ref(&ready), "a"),
            Some(1_738_328_400.0)
        );
        // A cluster of the same name made anew (another uid) has none; nor, once a scrape
        // found the first one gone, does the first one come back.
        let anew = failing_over("a", "uid-a2", "Ready", "2025-01-31T14:00:00Z");
        assert_eq!(last(std::slice::from_ref(&anew), "a"), None);
        metrics.forget_failovers_except(std::slice::from_ref(&anew));
        assert_eq!(last(std::slice::from_ref(&ready), "a"), None);
    }

    #[test]
    fn the_leader_gauge_is_1_while_leading_only() {
        let metrics = Metrics::default();
        let text = encode(&[], &[], &metrics, None).expect("encode");
        has_line(&text, "# TYPE pgop_operator_leader gauge");
        has_line(&text, "pgop_operator_leader 0");
        assert_eq!(value(&parse(&text), "pgop_operator_leader", ""), Some(0.0));
        metrics.set_leader(true);
        assert!(metrics.leader());
        let text = encode(&[], &[], &metrics, None).expect("encode");
        assert_eq!(value(&parse(&text), "pgop_operator_leader", ""), Some(1.0));
        metrics.set_leader(false);
        assert!(!metrics.leader());
        let text = encode(&[], &[], &metrics, None).expect("encode");
        has_line(&text, "pgop_operator_leader 0");
    }

    #[test]
    fn a_selective_operator_reports_only_the_backups_of_its_clusters() {
        let backups = || {
            vec![
                backup("prod", "mine", "main", Some("Completed")),
                backup("prod", "theirs", "other", Some("Completed")),
                backup("dev", "same-name-elsewhere", "main", None),
            ]
        };
        let clusters = [ready_cluster()]; // prod/main
        let names =
            |b: Vec<Arc<PostgresBackup>>| b.iter().map(|b| b.name_any()).collect::<Vec<_>>();
        assert_eq!(
            names(reported_backups(&clusters, backups(), true)),
            ["mine"]
        );
        assert_eq!(
            names(reported_backups(&clusters, backups(), false)),
            ["mine", "theirs", "same-name-elsewhere"]
        );
    }

    /// With several watched namespaces there is a store of each kind per namespace: ready
    /// once all of them listed, and the metrics cover the objects of every one.
    #[test]
    fn the_stores_of_every_watched_namespace_count() {
        use kube::runtime::reflector;
        use kube::runtime::watcher::Event;
        let (prod, mut prod_writer) = reflector::store::<PostgresCluster>();
        let (dev, mut dev_writer) = reflector::store::<PostgresCluster>();
        let (prod_backups, mut prod_backup_writer) = reflector::store::<PostgresBackup>();
        let (dev_backups, mut dev_backup_writer) = reflector::store::<PostgresBackup>();
        let metrics = Arc::new(Metrics::default());
        metrics.set_leader(true);
        let sources = Sources {
            metrics,
            clusters: vec![prod, dev],
            backups: vec![prod_backups, dev_backups],
            selective: true,
            prober: None,
        };
        assert!(!sources.ready());
        prod_writer.apply_watcher_event(&Event::Init);
        prod_writer.apply_watcher_event(&Event::InitApply((*ready_cluster()).clone()));
        prod_writer.apply_watcher_event(&Event::InitDone);
        for writer in [&mut prod_backup_writer, &mut dev_backup_writer] {
            writer.apply_watcher_event(&Event::Init);
        }
        prod_backup_writer.apply_watcher_event(&Event::InitApply(
            (*backup("prod", "p", "main", None)).clone(),
        ));
        dev_backup_writer.apply_watcher_event(&Event::InitApply(
            (*backup("dev", "d", "main", None)).clone(),
        ));
        for writer in [&mut prod_backup_writer, &mut dev_backup_writer] {
            writer.apply_watcher_event(&Event::InitDone);
        }
        assert!(!sources.ready(), "dev's clusters not listed yet");
        let dev_cluster = cluster("dev", "main", 1, serde_json::json!({}));
        dev_writer.apply_watcher_event(&Event::Init);
        dev_writer.apply_watcher_event(&Event::InitApply((*dev_cluster).clone()));
        dev_writer.apply_watcher_event(&Event::InitDone);
        assert!(sources.ready());
        let clusters = sources.clusters();
        let mut names: Vec<_> = clusters
            .iter()
            .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        names.sort();
        assert_eq!(names, ["dev/main", "prod/main"]);
        let reported = reported_backups(&clusters, sources.backups(), sources.selective);
        let mut names: Vec<_> = reported.iter().map(|b| b.name_any()).collect();
        names.sort();
        assert_eq!(names, ["d", "p"], "each backup's cluster is in some store");
        let text = encode(&clusters, &reported, &sources.metrics, None).expect("encode");
        for ns in ["prod", "dev"] {
            assert!(
                text.contains(&format!(
                    r#"pgop_backups{{namespace="{ns}",cluster="main",phase="Pending"}} 1"#
                )),
                "{text}"
            );
        }
    }

    /// A standby (not leading, its controllers not started, so its stores never list) is
    /// healthy and ready; once it leads, it is ready only after the first lists.
    #[tokio::test]
    async fn a_standby_is_healthy_and_ready_the_leader_once_listed() {
        use kube::runtime::reflector;
        use kube::runtime::watcher::Event;
        let (clusters, mut cluster_writer) = reflector::store::<PostgresCluster>();
        let (backups, mut backup_writer) = reflector::store::<PostgresBackup>();
        let metrics = Arc::new(Metrics::default());
        let router = router(Sources {
            metrics: metrics.clone(),
            clusters: vec![clusters],
            backups: vec![backups],
            selective: false,
            prober: None,
        });
        assert_eq!(status(&router, "/healthz").await.0, 200);
        assert_eq!(status(&router, "/readyz").await.0, 200, "standby");
        metrics.set_leader(true);
        assert_eq!(status(&router, "/healthz").await.0, 200);
        assert_eq!(
            status(&router, "/readyz").await.0,
            503,
            "leader, not listed"
        );
        cluster_writer.apply_watcher_event(&Event::Init);
        cluster_writer.apply_watcher_event(&Event::InitDone);
        backup_writer.apply_watcher_event(&Event::Init);
        backup_writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(status(&router, "/readyz").await.0, 200, "leader, listed");
    }

    #[tokio::test]
    async fn ready_once_both_stores_have_their_first_list() {
        use kube::runtime::reflector;
        use kube::runtime::watcher::Event;
        let (clusters, mut cluster_writer) = reflector::store::<PostgresCluster>();
        let (backups, mut backup_writer) = reflector::store::<PostgresBackup>();
        let metrics = Arc::new(Metrics::default());
        metrics.set_leader(true);
        let router = router(Sources {
            metrics,
            clusters: vec![clusters],
            backups: vec![backups],
            selective: false,
            prober: None,
        });
        assert_eq!(status(&router, "/healthz").await.0, 200);
        assert_eq!(status(&router, "/readyz").await.0, 503);
        cluster_writer.apply_watcher_event(&Event::Init);
        cluster_writer.apply_watcher_event(&Event::InitApply((*ready_cluster()).clone()));
        cluster_writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(
            status(&router, "/readyz").await.0,
            503,
            "backups not listed yet"
        );
        backup_writer.apply_watcher_event(&Event::Init);
        backup_writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(status(&router, "/readyz").await.0, 200);
        assert_eq!(
            status(&router, "/metrics").await,
            (200, CONTENT_TYPE.to_string())
        );
    }
}
