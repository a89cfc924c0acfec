//! pgop's operator: the controllers behind `pgop operator`.
//!
//! One controller per kind, built on `kube::runtime::Controller`; see [`cluster`] for the
//! reconcile pipeline. The operator is the single source of truth for roles: it decides,
//! the instance managers act.

pub mod backoff;
pub mod backup;
pub mod cluster;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client};
use pgop_api::PostgresCluster;
use pgop_api::backup::PostgresBackup;
use std::future::Future;
use std::sync::Arc;

pub use cluster::build::{DEFAULT_IMAGE, Settings};

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub backoff: backoff::Backoff,
    pub recorder: Recorder,
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
        }
    }
}

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Watch this namespace only; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Most clusters reconciled at the same time.
    pub concurrency: u16,
    pub settings: Settings,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            namespace: None,
            concurrency: 4,
            settings: Settings::default(),
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

/// Runs the controllers until `shutdown` resolves; reconciles in flight then finish.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = options.namespace.as_deref();
    // Children are watched through the managed-by label only, so the caches hold pgop's
    // objects and not every Pod and Secret of the cluster.
    let children = watcher::Config::default().labels(&format!(
        "{}={}",
        pgop_api::labels::MANAGED_BY,
        pgop_api::labels::MANAGED_BY_VALUE
    ));
    let ctx = Arc::new(Context::new(client.clone(), options.settings.clone()));
    // Both controllers stop on the same signal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let clusters = Controller::new(
        api::<PostgresCluster>(&client, ns),
        watcher::Config::default(),
    )
    .owns(api::<Pod>(&client, ns), children.clone())
    .owns(api::<PersistentVolumeClaim>(&client, ns), children.clone())
    .owns(api::<Service>(&client, ns), children.clone())
    .owns(api::<Secret>(&client, ns), children.clone())
    .owns(api::<PodDisruptionBudget>(&client, ns), children.clone())
    .owns(api::<ServiceAccount>(&client, ns), children.clone())
    .owns(api::<Role>(&client, ns), children.clone())
    .owns(api::<RoleBinding>(&client, ns), children)
    .with_config(controller::Config::default().concurrency(options.concurrency))
    .graceful_shutdown_on(stopped())
    .run(cluster::reconcile, cluster::error_policy, ctx.clone())
    .for_each(|result| async move {
        match result {
            Ok((obj, _)) => tracing::debug!(cluster = %obj, "reconciled"),
            Err(controller::Error::ReconcilerFailed(..)) => {} // logged by error_policy
            Err(e) => tracing::warn!(error = %error_chain(&e), "controller error"),
        }
    });
    let backups = Controller::new(
        api::<PostgresBackup>(&client, ns),
        watcher::Config::default(),
    )
    .with_config(controller::Config::default().concurrency(options.concurrency))
    .graceful_shutdown_on(stopped())
    .run(
        backup::controller::reconcile,
        backup::controller::error_policy,
        ctx,
    )
    .for_each(|result| async move {
        match result {
            Ok((obj, _)) => tracing::debug!(backup = %obj, "reconciled"),
            Err(controller::Error::ReconcilerFailed(..)) => {}
            Err(e) => tracing::warn!(error = %error_chain(&e), "controller error"),
        }
    });
    let controllers = async {
        tokio::join!(clusters, backups);
    };
    tokio::pin!(controllers);
    tokio::select! {
        () = &mut controllers => {}
        () = shutdown => {
            let _ = stop_tx.send(true);
            // Reconciles in flight finish within the grace period. A controller that
            // never started (its CRD is not installed: it keeps waiting for its first
            // list) must not hold the exit up for ever.
            if tokio::time::timeout(SHUTDOWN_GRACE, controllers).await.is_err() {
                tracing::warn!(grace = ?SHUTDOWN_GRACE, "controllers did not stop in time; exiting anyway");
            }
        }
    }
}

/// How long reconciles in flight may take to finish after a shutdown request.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

pub use pgop_api::error_chain;
