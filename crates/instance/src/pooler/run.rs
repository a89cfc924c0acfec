//! The Kubernetes side of `pgop pooler run`: `run` starts a `Pooler` and its HTTP server,
//! follows the cluster, its two Secrets and the instance Pods through one watch each
//! (`crate::run::watch`), and on every change they report (or every minute) runs a pass
//! that reads what the watches keep, picks the servers (`target_instances`) and hands them
//! to `Pooler::apply`. A failed pass is retried after a delay that doubles up to 30 s, with
//! PgBouncer on its last configuration meanwhile. `Settings` is what the Pod tells it.

use super::config::{self, Desired, Layout, Sourced};
use super::{Applied, Error, Options, Pooler, http};
use crate::error_chain;
use crate::pg::RunAs;
use crate::run::watch::{self, Inputs};
use k8s_openapi::api::core::v1::{Pod, Secret};
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster::InstanceRole;
use pgop_api::constants::{APP_SECRET_SUFFIX, POSTGRES_PORT, SERVER_TLS_SECRET_SUFFIX};
use pgop_api::pooler::{PoolerSpec, PoolerType};
use pgop_api::v1beta1::PostgresCluster;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
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
    fn a_failed_pass_is_retried_after_a_delay_that_doubles_up_to_a_cap() {
        assert_eq!(retry_after(1), RETRY_FIRST);
        assert_eq!(retry_after(3), Duration::from_secs(4));
        assert_eq!(retry_after(u32::MAX), RETRY_MAX);
    }
}
