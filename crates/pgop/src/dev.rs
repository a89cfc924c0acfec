//! `pgop dev`: the local environment behind the README's demo command.

use pgop_testenv::{ControlPlane, Options};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Also copy the admin kubeconfig to this path (it is always written inside the
    /// control plane's temporary directory).
    #[arg(long, value_name = "PATH")]
    write_kubeconfig: Option<PathBuf>,
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
    if let Some(path) = args.write_kubeconfig {
        std::fs::copy(plane.kubeconfig(), &path)
            .map_err(|e| format!("failed to write kubeconfig to {}: {e}", path.display()))?;
        kubeconfig = path;
    }
    println!(
        "control plane ready in {:.1}s at {}",
        started.elapsed().as_secs_f64(),
        plane.server()
    );
    println!("kubeconfig: {}", kubeconfig.display());
    println!();
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get namespaces");
    println!();
    println!("directory: {}", plane.dir().display());
    println!("Ctrl-C stops everything and removes that directory.");
    wait_for_shutdown().await?;
    eprintln!("pgop dev: stopping ...");
    plane.stop();
    Ok(())
}

async fn wait_for_shutdown() -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {},
    }
    Ok(())
}
