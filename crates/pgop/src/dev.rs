//! `pgop dev`: the local environment behind the README's demo command: a real control
//! plane, pgop's CRDs, the operator running in this process, a local node that runs the
//! instance pods as processes (this very binary as `pgop instance run`, real PostgreSQL),
//! and a sample cluster a person can psql into.

use crate::operator::BindAddress;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use pgop_api::v1beta1::PostgresCluster;
use pgop_testenv::node::{LocalNode, NodeOptions};
use pgop_testenv::{ControlPlane, Options};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

const EXAMPLE: &str = include_str!("../../../examples/cluster.yaml");

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also copy the admin kubeconfig to this path (it is always written inside the
    /// control plane's temporary directory).
    #[arg(long, value_name = "PATH")]
    write_kubeconfig: Option<PathBuf>,
    /// The PostgresCluster manifest to apply in namespace `default` (default:
    /// examples/cluster.yaml, built in).
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Start only the control plane: no CRDs, no operator, no node, no cluster.
    #[arg(long)]
    control_plane_only: bool,
    /// How long to wait for the cluster to become Ready, in seconds.
    #[arg(long, default_value_t = 300)]
    ready_timeout: u64,
    #[command(flatten)]
    pub operator: crate::operator::Args,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Ctrl-C (or SIGTERM) at any moment: the handlers are installed before anything starts,
/// and every phase checks for it, so an interrupted start still stops what it started and
/// removes its directory.
struct Interrupt {
    flag: std::sync::Arc<std::sync::atomic::AtomicBool>,
    notify: std::sync::Arc<tokio::sync::Notify>,
}

impl Interrupt {
    fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int =
            signal(SignalKind::interrupt()).map_err(|e| format!("failed to handle SIGINT: {e}"))?;
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| format!("failed to handle SIGTERM: {e}"))?;
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let notify = std::sync::Arc::new(tokio::sync::Notify::new());
        let (f, n) = (flag.clone(), notify.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
            }
            f.store(true, std::sync::atomic::Ordering::SeqCst);
            n.notify_waiters();
        });
        Ok(Self { flag, notify })
    }

    fn interrupted(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn wait(&self) {
        let notified = self.notify.notified();
        if !self.interrupted() {
            notified.await;
        }
    }
}

/// What `pgop dev` started, stopped in reverse order: operator, pods (their managers stop
/// PostgreSQL), control plane (which removes its directory).
struct Running {
    plane: Option<ControlPlane>,
    node: Option<LocalNode>,
    operator: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl Running {
    async fn stop(&mut self) {
        if let Some((stop, op)) = self.operator.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), op).await;
        }
        if let Some(node) = self.node.take() {
            node.stop().await;
        }
        if let Some(plane) = self.plane.take() {
            plane.stop();
        }
    }
}

pub async fn run(args: Args) -> Result<(), Error> {
    let interrupt = Interrupt::install()?;
    let mut running = Running {
        plane: None,
        node: None,
        operator: None,
    };
    let result = run_until_stopped(args, &interrupt, &mut running).await;
    eprintln!("pgop dev: stopping ...");
    running.stop().await;
    result
}

async fn run_until_stopped(
    args: Args,
    interrupt: &Interrupt,
    running: &mut Running,
) -> Result<(), Error> {
    eprintln!(
        "pgop dev: starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler ..."
    );
    let started = std::time::Instant::now();
    let plane = running.plane.insert(
        ControlPlane::start(
            Options::default()
                .with_controller_manager()
                .with_scheduler(),
        )
        .await?,
    );
    if interrupt.interrupted() {
        return Ok(());
    }
    let mut kubeconfig = plane.kubeconfig().to_path_buf();
    if let Some(path) = &args.write_kubeconfig {
        std::fs::copy(plane.kubeconfig(), path)
            .map_err(|e| format!("failed to write kubeconfig to {}: {e}", path.display()))?;
        kubeconfig = path.clone();
    }
    println!(
        "control plane ready in {:.1}s at {}",
        started.elapsed().as_secs_f64(),
        plane.server()
    );

    if !args.control_plane_only {
        let client = plane.client()?;
        pgop_testenv::crds::install(&client, pgop_api::crds()).await?;
        let exe =
            std::env::current_exe().map_err(|e| format!("failed to find the pgop binary: {e}"))?;
        running.node = Some(
            LocalNode::start(
                plane,
                NodeOptions {
                    name: "pgop-local".into(),
                    namespace: None,
                    image: "pgop:".into(),
                    pgop_binary: exe,
                    pod_ports: vec![
                        pgop_api::constants::POSTGRES_PORT,
                        pgop_api::constants::MANAGER_PORT,
                        pgop_api::constants::MANAGER_TLS_PORT,
                    ],
                },
            )
            .await?,
        );
        let mut operator_args = args.operator;
        if operator_args.instance_uid.is_none() {
            // PostgreSQL refuses root: run instances as the local postgres user.
            let (uid, gid) = postgres_user()?;
            operator_args.instance_uid = Some(uid);
            operator_args.instance_gid.get_or_insert(gid);
        }
        // Metrics on a free loopback port unless asked otherwise: several `pgop dev` may run
        // on one machine.
        operator_args
            .metrics_bind_address
            .get_or_insert(BindAddress::At(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))));
        // One operator, no leader election (unless asked for).
        operator_args.leader_elect.get_or_insert(false);
        let mut options = operator_args.options(&crate::operator::Env::current())?;
        // The webhooks on a loopback port (unless flags say otherwise), converting for the
        // PostgresCluster CRD: the API server, on this machine, calls them there.
        if options.webhook.is_none() {
            options.webhook = Some(local_webhooks());
        }
        let bound = pgop_operator::Operator::bind(client.clone(), options)
            .await
            .map_err(|e| pgop_operator::error_chain(&e))?;
        if let Some(addr) = bound.metrics_address() {
            println!("operator metrics: http://{addr}/metrics (and /healthz, /readyz)");
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        running.operator = Some((
            stop_tx,
            tokio::spawn(async move {
                let run = bound.run(async move {
                    let _ = stop_rx.await;
                });
                if let Err(err) = run.await {
                    tracing::error!(error = %pgop_operator::error_chain(&err), "the operator stopped");
                }
            }),
        ));
        if interrupt.interrupted() {
            return Ok(());
        }
        // The CRD converts between v1alpha1 and v1beta1 through the operator's webhook,
        // which points the CRD at its loopback port once it has a certificate: wired and
        // answering before anything is applied, whichever version the manifest is in.
        tokio::select! {
            wired = pgop_operator::webhook::wait_converting(&client, "default", Duration::from_secs(60)) => wired?,
            () = interrupt.wait() => return Ok(()),
        }
        let manifest = match &args.cluster {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("failed to read {}: {e}", path.display()))?,
            None => EXAMPLE.to_string(),
        };
        let (cluster, resource) = manifest_cluster(&manifest)?;
        let name = cluster.name_any();
        if resource.version == pgop_api::StorageVersion::V1alpha1.name() {
            // What kubectl would print: the API server's warning, which kube does not show.
            eprintln!("warning: {}", pgop_api::V1ALPHA1_DEPRECATION);
        }
        Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource)
            .patch(
                &name,
                &PatchParams::apply("pgop-dev").force(),
                &Patch::Apply(&cluster),
            )
            .await
            .map_err(|e| format!("failed to apply PostgresCluster {name}: {e}"))?;
        let api: Api<PostgresCluster> = Api::namespaced(client.clone(), "default");
        println!("applied PostgresCluster default/{name}; waiting until it is Ready ...");
        let deadline = std::time::Instant::now() + Duration::from_secs(args.ready_timeout);
        let mut last_phase = None;
        let mut ready = false;
        while std::time::Instant::now() < deadline {
            let status = api.get(&name).await.ok().and_then(|c| c.status);
            let phase = status.as_ref().and_then(|s| s.phase);
            if phase != last_phase {
                let ready_n = status.as_ref().map(|s| s.ready_replicas).unwrap_or(0);
                println!(
                    "  {:>5.1}s  phase {:?}, {ready_n} ready",
                    started.elapsed().as_secs_f64(),
                    phase
                );
                last_phase = phase;
            }
            if phase == Some(pgop_api::cluster::ClusterPhase::Ready) {
                ready = true;
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = interrupt.wait() => return Ok(()),
            }
        }
        let node = &running.node;
        println!();
        print!(
            "{}",
            kubectl(plane, &["get", "pgc,pods", "-n", "default", "-o", "wide"]).await
        );
        println!();
        if ready {
            let host = node
                .as_ref()
                .and_then(|n| {
                    pgop_testenv::node::resolve_host(
                        n.hosts_file(),
                        &format!("{name}-rw.default.svc"),
                    )
                })
                .unwrap_or_else(|| "<the -rw endpoint>".into());
            let secret = format!("{name}-app");
            println!("Connect to the primary (the {name}-rw endpoint) with psql:");
            println!();
            println!("  export KUBECONFIG={}", kubeconfig.display());
            println!(
                "  PGPASSWORD=$(kubectl get secret {secret} -o jsonpath='{{.data.password}}' | base64 -d) \\"
            );
            println!(
                "    psql -h {host} -U $(kubectl get secret {secret} -o jsonpath='{{.data.username}}' | base64 -d) \\"
            );
            println!(
                "    $(kubectl get secret {secret} -o jsonpath='{{.data.dbname}}' | base64 -d)"
            );
            // The poolers of the manifest (examples/cluster.yaml has one), once a Pod of
            // each is ready (bounded: the cluster is, the pooler follows in seconds).
            let poolers = api
                .get(&name)
                .await
                .map(|c| c.spec.poolers)
                .unwrap_or_default();
            for pooler in &poolers {
                let service = pgop_api::pooler::pooler_name(&name, &pooler.name);
                let mut address = None;
                for _ in 0..60 {
                    address = node.as_ref().and_then(|n| {
                        pgop_testenv::node::resolve_host(
                            n.hosts_file(),
                            &format!("{service}.default.svc"),
                        )
                    });
                    if address.is_some() {
                        break;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(500)) => {}
                        () = interrupt.wait() => return Ok(()),
                    }
                }
                println!();
                println!(
                    "Or through the PgBouncer pooler {service} ({} pooling, {}): the same command with",
                    pooler.pool_mode.as_str(),
                    match pooler.type_ {
                        pgop_api::pooler::PoolerType::Rw => "to the primary",
                        pgop_api::pooler::PoolerType::Ro => "to the standbys",
                    }
                );
                println!(
                    "  -h {}",
                    address.unwrap_or_else(|| format!("<the {service} endpoint>"))
                );
            }
            println!();
            println!(
                "Watch it: kubectl get pgc -w   (the password is in Secret {secret}, key password)"
            );
            println!();
            println!("Fail over: kill -9 the primary's postmaster (or kubectl delete pod $P):");
            println!();
            println!("  P=$(kubectl get pgc {name} -o jsonpath='{{.status.currentPrimary}}')");
            println!(
                "  D=$(kubectl get pv $(kubectl get pvc $P -o jsonpath='{{.spec.volumeName}}') -o jsonpath='{{.spec.hostPath.path}}')"
            );
            println!("  kill -9 $(head -1 $D/pgdata/postmaster.pid)");
            if let Some(node) = &node {
                println!();
                println!(
                    "{name}-rw then moves to the new primary; there is no DNS here, its address is in\n  grep {name}-rw {}",
                    node.hosts_file().display()
                );
            }
        } else {
            let pods = node.as_ref().map(LocalNode::pods_dir);
            match pods.filter(|p| p.is_dir()) {
                Some(pods) => println!(
                    "The cluster is not Ready after {}s; each pod's logs are in a directory under {} \
                     (<container>.log), and `kubectl describe pgc {name}` shows its conditions and Events",
                    args.ready_timeout,
                    pods.display()
                ),
                None => println!(
                    "The cluster is not Ready after {}s and no pod has started; `kubectl describe pgc \
                     {name}` shows its conditions and Events, the operator's log is above",
                    args.ready_timeout
                ),
            }
        }
    }
    println!("kubeconfig: {}", kubeconfig.display());
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get pgc,pods,svc,secrets");
    println!();
    println!("Ctrl-C stops everything and removes this directory:");
    println!("directory: {}", plane.dir().display());
    interrupt.wait().await;
    Ok(())
}

/// `kubectl <args>` against the dev control plane; its output, or why it failed.
async fn kubectl(plane: &ControlPlane, args: &[&str]) -> String {
    let bin = match pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl) {
        Ok(b) => b,
        Err(e) => return format!("({e})\n"),
    };
    match tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(plane.kubeconfig())
        .args(args)
        .output()
        .await
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => format!(
            "(kubectl failed: {})\n",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => format!("(kubectl failed: {e})\n"),
    }
}

/// uid and gid of the local `postgres` user (Debian's PostgreSQL packages create it).
fn postgres_user() -> Result<(i64, i64), Error> {
    let (uid, gid) = pgop_testenv::node::local_user("postgres").ok_or(
        "no local postgres user to run instances as (apt-get install postgresql-15), or pass --instance-uid",
    )?;
    Ok((i64::from(uid), i64::from(gid)))
}

/// The operator's webhooks for `pgop dev`: on a free loopback port, with pgop's own
/// certificate for 127.0.0.1 (its Secret in `default`), and the PostgresCluster CRD's
/// conversion pointed there.
fn local_webhooks() -> pgop_operator::webhook::Config {
    use pgop_operator::webhook::{Config, cert};
    Config {
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        certificate: cert::Source::Managed(cert::Managed {
            namespace: "default".into(),
            secret: "pgop-webhook-tls".into(),
            names: vec![Ipv4Addr::LOCALHOST.to_string()],
            configurations: Vec::new(),
            conversion_crds: vec!["postgresclusters.database.example.com".into()],
            conversion_client: Some(cert::ConversionClient::Loopback),
            validity_days: 365,
            renew_before_days: 121,
            check_every: Duration::from_secs(60),
        }),
    }
}

/// The PostgresCluster of a manifest and its resource, in the version it is written in
/// (`v1alpha1` or `v1beta1`, both served): anything else is refused naming what it is.
fn manifest_cluster(manifest: &str) -> Result<(DynamicObject, ApiResource), String> {
    let cluster: DynamicObject = serde_yaml::from_str(manifest)
        .map_err(|e| format!("invalid PostgresCluster manifest: {e}"))?;
    let types = cluster.types.as_ref();
    let api_version = types.map(|t| t.api_version.as_str()).unwrap_or_default();
    let kind = types.map(|t| t.kind.as_str()).unwrap_or_default();
    if kind != "PostgresCluster"
        || ![pgop_api::v1beta1::V1ALPHA1, pgop_api::v1beta1::API_VERSION].contains(&api_version)
    {
        return Err(format!(
            "the manifest is a {kind:?} of {api_version:?}, not a PostgresCluster of {} or {}",
            pgop_api::v1beta1::API_VERSION,
            pgop_api::v1beta1::V1ALPHA1
        ));
    }
    if cluster.metadata.name.is_none() {
        return Err("invalid PostgresCluster manifest: metadata.name is missing".into());
    }
    let version = api_version.rsplit('/').next().unwrap_or_default();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(pgop_api::constants::GROUP, version, kind),
        "postgresclusters",
    );
    Ok((cluster, resource))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_a_v1beta1_cluster_and_other_kinds_are_refused() {
        let (example, _) = manifest_cluster(EXAMPLE).expect("the example");
        assert_eq!(
            example.types.map(|t| t.api_version).as_deref(),
            Some(pgop_api::v1beta1::API_VERSION)
        );
        let alpha = "apiVersion: database.example.com/v1alpha1\nkind: PostgresCluster\nmetadata: {name: a}\nspec: {replicas: 1, storage: {size: 1Gi}}\n";
        assert!(manifest_cluster(alpha).is_ok());
        let other = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";
        let e = manifest_cluster(other).expect_err("a ConfigMap");
        assert!(e.contains("not a PostgresCluster"), "{e}");
        let future =
            "apiVersion: database.example.com/v2\nkind: PostgresCluster\nmetadata: {name: a}\n";
        assert!(manifest_cluster(future).is_err());
        let unnamed =
            "apiVersion: database.example.com/v1beta1\nkind: PostgresCluster\nmetadata: {}\n";
        let e = manifest_cluster(unnamed).expect_err("no name");
        assert!(e.contains("metadata.name"), "{e}");
    }
}
