//! `pgop dev`: the local environment behind the README's demo command: a real control
//! plane, pgop's CRDs, the operator running in this process, and a sample cluster.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use pgop_api::PostgresCluster;
use pgop_testenv::{ControlPlane, Options};
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
    /// Start only the control plane: no CRDs, no operator, no cluster.
    #[arg(long)]
    control_plane_only: bool,
    #[command(flatten)]
    operator: crate::operator::Args,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

pub async fn run(args: Args) -> Result<(), Error> {
    eprintln!(
        "pgop dev: starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler ..."
    );
    let started = std::time::Instant::now();
    let plane = ControlPlane::start(
        Options::default()
            .with_controller_manager()
            .with_scheduler(),
    )
    .await?;
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

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut operator = None;
    if !args.control_plane_only {
        let client = plane.client()?;
        pgop_testenv::crds::install(&client, pgop_api::crds()).await?;
        let options = args.operator.options();
        let op_client = client.clone();
        operator = Some(tokio::spawn(async move {
            pgop_operator::run(op_client, options, async move {
                let _ = stop_rx.await;
            })
            .await;
        }));
        let manifest = match &args.cluster {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("failed to read {}: {e}", path.display()))?,
            None => EXAMPLE.to_string(),
        };
        let cluster: PostgresCluster = serde_yaml::from_str(&manifest)
            .map_err(|e| format!("invalid PostgresCluster manifest: {e}"))?;
        let name = cluster.name_any();
        let api: Api<PostgresCluster> = Api::namespaced(client.clone(), "default");
        api.patch(
            &name,
            &PatchParams::apply("pgop-dev").force(),
            &Patch::Apply(&cluster),
        )
        .await
        .map_err(|e| format!("failed to apply PostgresCluster {name}: {e}"))?;
        // Wait for the operator's first status, so the table below shows it at work.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if api
                .get(&name)
                .await
                .ok()
                .and_then(|c| c.status)
                .is_some_and(|s| s.phase.is_some())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!("applied PostgresCluster default/{name}; the operator created its instances:");
        println!();
        print!(
            "{}",
            kubectl(&plane, &["get", "pgc", "-n", "default"]).await
        );
        println!();
        println!(
            "Its pods stay Pending: no node runs them yet (the local node comes with the HA work)."
        );
    }
    println!("kubeconfig: {}", kubeconfig.display());
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get pgc,pods,svc,secrets");
    println!();
    println!("Ctrl-C stops everything and removes this directory:");
    println!("directory: {}", plane.dir().display());
    wait_for_shutdown().await?;
    eprintln!("pgop dev: stopping ...");
    let _ = stop_tx.send(());
    if let Some(op) = operator {
        let _ = tokio::time::timeout(Duration::from_secs(10), op).await;
    }
    plane.stop();
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

async fn wait_for_shutdown() -> Result<(), Error> {
    crate::operator::shutdown_signal().await;
    Ok(())
}
