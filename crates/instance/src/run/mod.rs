//! `pgop instance run`: the instance manager inside a pod. It reads its own PostgresCluster
//! (a watch narrowed to that one object, plus a periodic resync) and the cluster's Secrets,
//! and turns the cluster status into calls on [`Instance`]: bootstrap, start, promote when
//! `targetPrimary` names this instance, follow or rejoin the primary otherwise, slots and
//! synchronous standbys on the primary, configuration everywhere. It must never choose a
//! primary: with no `targetPrimary`/`currentPrimary` in the status it waits.

mod plan;

pub use plan::{Action, Observed, Plan, plan};

use crate::bootstrap::Credentials;
use crate::config::{Layout, Mode};
use crate::instance::{self, Instance, Options};
use crate::pg::{Binaries, RunAs, Upstream};
use crate::sync::SyncSpec;
use crate::{error_chain, http};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use pgop_api::PostgresCluster;
use pgop_api::constants::ANNOTATION_RESTART;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
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
    #[error("failed to read key {key} of Secret {name}")]
    ReadSecretKey { name: String, key: &'static str },
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
    pub http_listen: SocketAddr,
    pub binaries: Binaries,
    pub run_as: Option<RunAs>,
    pub stop_timeout: Duration,
    /// How often the cluster is read even without a watch event.
    pub resync: Duration,
}

/// Runs the manager until `shutdown` completes, then stops PostgreSQL cleanly.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), &settings.namespace);
    let mut shutdown = Box::pin(shutdown);
    if crate::reaper::is_init() {
        tokio::spawn(crate::reaper::run(Duration::from_secs(2)));
    }
    let credentials = tokio::select! {
        () = &mut shutdown => return Ok(()),
        credentials = wait_for_credentials(&client, &settings) => credentials,
    };
    let instance = Arc::new(Instance::new(Options {
        layout: Layout {
            instance: settings.pod_name.clone(),
            cluster: settings.cluster.clone(),
            pgdata: settings.pgdata.clone(),
            listen_addresses: settings.listen_addresses.clone(),
            port: settings.pg_port,
            socket_dir: settings.socket_dir.clone(),
        },
        binaries: settings.binaries.clone(),
        run_as: settings.run_as,
        credentials,
        stop_timeout: settings.stop_timeout,
        start_timeout: Duration::from_secs(300),
        forward_logs: true,
    }));
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, server) = http::bind(settings.http_listen, instance.clone(), async move {
        let _ = http_stopped.await;
    })
    .await
    .map_err(Error::ServeHttp)?;
    tracing::info!(%addr, instance = %settings.pod_name, "serving health and status");
    let server = tokio::spawn(server);

    let events = watcher(
        clusters.clone(),
        watcher::Config::default().fields(&format!("metadata.name={}", settings.cluster)),
    );
    let mut events = std::pin::pin!(events);
    let mut resync = tokio::time::interval(settings.resync);
    let mut restarts = RestartRequests::default();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = events.next() => {}
            _ = resync.tick() => {}
        }
        let step = async {
            let cluster = clusters
                .get_opt(&settings.cluster)
                .await
                .map_err(|source| Error::ReadCluster {
                    name: settings.cluster.clone(),
                    source,
                })?;
            match cluster {
                Some(cluster) => {
                    reconcile(&client, &settings, &instance, &cluster, &mut restarts).await
                }
                None => Ok(()),
            }
        };
        tokio::select! {
            // An interrupted bootstrap leaves its marker: the next start redoes it.
            () = &mut shutdown => break,
            result = step => if let Err(err) = result {
                tracing::warn!(error = %error_chain(&err), "reconcile failed; retrying");
            }
        }
    }
    tracing::info!("shutting down PostgreSQL");
    let stopped = instance.shutdown().await.map_err(Error::Shutdown);
    let _ = stop_http.send(());
    let _ = server.await;
    stopped
}

/// One pass: observe, plan (pure, in [`plan`]), act, then slots, synchronous standbys and
/// configuration.
async fn reconcile(
    client: &kube::Client,
    settings: &Settings,
    instance: &Instance,
    cluster: &PostgresCluster,
    restarts: &mut RestartRequests,
) -> Result<(), Error> {
    if instance.fenced() {
        return Ok(());
    }
    let status = cluster.status.clone().unwrap_or_default();
    let me = settings.pod_name.as_str();
    let named = status
        .target_primary
        .clone()
        .or_else(|| status.current_primary.clone());
    // The primary's address, when another instance is the primary.
    let upstream_of_primary = match named.as_deref() {
        Some(primary) if primary != me => {
            Some(upstream(client, settings, instance, primary).await?)
        }
        _ => None,
    };
    let observed = Observed {
        data: instance.data_state(),
        running: instance.pid().is_some(),
        standby_signal: instance.has_standby_signal(),
        role: instance.status().await.role,
        follows_primary: upstream_of_primary.as_ref().is_some_and(|u| {
            instance.mode()
                == Mode::Standby {
                    upstream: u.clone(),
                }
        }),
    };
    let plan = plan::plan(me, &status, &observed);
    let manage = Error::ManageInstance;
    let upstream_for = |primary: &str| {
        let known = upstream_of_primary.clone();
        let primary = primary.to_string();
        async move {
            match known {
                Some(u) if named.as_deref() == Some(primary.as_str()) => Ok(u),
                _ => upstream(client, settings, instance, &primary).await,
            }
        }
    };
    match &plan.action {
        Action::Wait => return Ok(()),
        Action::Keep => {}
        Action::BootstrapPrimary => {
            tracing::info!("bootstrapping a new primary with initdb");
            instance.bootstrap_primary().await.map_err(manage)?;
        }
        Action::StartPrimary => instance.start_as(Mode::Primary).await.map_err(manage)?,
        Action::StartStandby { primary } => {
            let upstream = upstream_for(primary).await?;
            instance
                .start_as(Mode::Standby { upstream })
                .await
                .map_err(manage)?;
        }
        Action::Promote => {
            // First the synchronous standbys, so that the first commit as primary waits.
            let sync = sync_spec(cluster);
            instance
                .set_synchronous(sync, &plan.sync_standbys)
                .await
                .map_err(manage)?;
            tracing::info!("promoting: the cluster status names this instance the primary");
            instance.promote().await.map_err(manage)?;
        }
        Action::Clone { primary } => {
            tracing::info!(%primary, "cloning the primary");
            let upstream = upstream_for(primary).await?;
            instance
                .bootstrap_standby(&upstream)
                .await
                .map_err(manage)?;
        }
        Action::Rejoin { primary } => {
            tracing::info!(%primary, "rejoining as a standby of the primary");
            let upstream = upstream_for(primary).await?;
            let how = instance.demote(&upstream).await.map_err(manage)?;
            tracing::info!(?how, "rejoined");
        }
        Action::Follow { primary } => {
            tracing::info!(%primary, "following the primary");
            let upstream = upstream_for(primary).await?;
            instance.follow(&upstream).await.map_err(manage)?;
        }
    }
    if instance.pid().is_none() {
        return Ok(());
    }
    instance
        .set_synchronous(sync_spec(cluster), &plan.sync_standbys)
        .await
        .map_err(manage)?;
    if plan.primary.as_deref() == Some(me) {
        instance.ensure_slots(&plan.slots).await.map_err(manage)?;
    }
    let spec = &cluster.spec;
    let report = instance
        .apply_config(&spec.postgresql.parameters, &spec.postgresql.pg_hba)
        .await
        .map_err(manage)?;
    for bad in &report.invalid {
        tracing::warn!(parameter = %bad.name, reason = %bad.reason, "refused a parameter");
    }
    let requested = cluster
        .annotations()
        .get(ANNOTATION_RESTART)
        .map(String::as_str);
    if restarts.changed(requested) {
        tracing::info!(pending = ?report.pending_restart, "restarting PostgreSQL as the cluster's restart annotation asks");
        instance.restart().await.map_err(manage)?;
    }
    Ok(())
}

/// The cluster's restart annotation: a new value asks every instance to restart once
/// (parameters pending a restart). The value seen first is only recorded: a manager that
/// starts has just started PostgreSQL anyway.
#[derive(Debug, Default)]
pub struct RestartRequests {
    seen: Option<Option<String>>,
}

impl RestartRequests {
    /// Whether `requested` is a new request since the last call.
    pub fn changed(&mut self, requested: Option<&str>) -> bool {
        let requested = requested.map(str::to_string);
        match self.seen.replace(requested.clone()) {
            None => false,
            Some(previous) => previous != requested,
        }
    }
}

fn sync_spec(cluster: &PostgresCluster) -> SyncSpec {
    let replication = &cluster.spec.replication;
    SyncSpec {
        synchronous: u32::try_from(replication.synchronous).unwrap_or(0),
        durability: replication.data_durability,
    }
}

/// The primary's address: its Pod's IP.
async fn upstream(
    client: &kube::Client,
    settings: &Settings,
    instance: &Instance,
    primary: &str,
) -> Result<Upstream, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &settings.namespace);
    let pod = pods
        .get(primary)
        .await
        .map_err(|source| Error::ResolvePrimary {
            name: primary.to_string(),
            source: Some(source),
        })?;
    let ip = pod
        .status
        .and_then(|s| s.pod_ip)
        .ok_or_else(|| Error::ResolvePrimary {
            name: primary.to_string(),
            source: None,
        })?;
    Ok(instance.as_upstream(&ip))
}

/// The cluster's Secrets, retried until the operator has created them.
async fn wait_for_credentials(client: &kube::Client, settings: &Settings) -> Credentials {
    loop {
        match read_credentials(client, settings).await {
            Ok(credentials) => return credentials,
            Err(err) => {
                tracing::info!(error = %error_chain(&err), "waiting for the cluster's Secrets")
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn read_credentials(
    client: &kube::Client,
    settings: &Settings,
) -> Result<Credentials, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let read = |name: String| {
        let secrets = secrets.clone();
        async move {
            let secret = secrets
                .get(&name)
                .await
                .map_err(|source| Error::ReadSecret {
                    name: name.clone(),
                    source,
                })?;
            Ok::<_, Error>((name, secret))
        }
    };
    let key = |(name, secret): &(String, Secret), key: &'static str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| Error::ReadSecretKey {
                name: name.clone(),
                key,
            })
    };
    let app = read(format!("{}-app", settings.cluster)).await?;
    let replication = read(format!("{}-replication", settings.cluster)).await?;
    Ok(Credentials {
        app_user: key(&app, "username")?,
        app_password: key(&app, "password")?,
        app_database: key(&app, "dbname")?,
        replication_user: key(&replication, "username")?,
        replication_password: key(&replication, "password")?,
    })
}

#[cfg(test)]
mod tests {
    use super::RestartRequests;

    #[test]
    fn only_a_new_restart_annotation_restarts() {
        let mut r = RestartRequests::default();
        assert!(!r.changed(Some("1")), "the first value is only recorded");
        assert!(!r.changed(Some("1")));
        assert!(r.changed(Some("2")));
        assert!(!r.changed(Some("2")));
        assert!(r.changed(None));
        assert!(!r.changed(None));
    }
}
