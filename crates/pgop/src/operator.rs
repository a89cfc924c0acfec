//! `pgop operator`: runs the controllers against the cluster in the kubeconfig or the
//! in-cluster service account.

use pgop_operator::{DEFAULT_IMAGE, Options, Settings};

#[derive(Debug, clap::Args)]
#[group(id = "operator")]
pub struct Args {
    /// Watch only this namespace (all namespaces when unset).
    #[arg(long, env = "PGOP_NAMESPACE")]
    namespace: Option<String>,
    /// Most clusters reconciled at the same time.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Image of PostgreSQL instance pods when a cluster does not name one (PostgreSQL
    /// plus the pgop binary).
    #[arg(long, env = "PGOP_IMAGE", default_value = DEFAULT_IMAGE)]
    image: String,
    /// uid instance containers run as (PostgreSQL refuses to run as root) [default: 26;
    /// `pgop dev`: the local `postgres` user].
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub instance_uid: Option<i64>,
    /// gid instance containers run as, also their fsGroup [default: 26; `pgop dev`: the
    /// local `postgres` group].
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub instance_gid: Option<i64>,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

impl Args {
    pub fn options(self) -> Options {
        Options {
            namespace: self.namespace,
            concurrency: self.concurrency,
            settings: Settings {
                image: self.image,
                run_as_user: self.instance_uid.unwrap_or(Settings::default().run_as_user),
                run_as_group: self
                    .instance_gid
                    .unwrap_or(Settings::default().run_as_group),
            },
        }
    }
}

pub async fn run(args: Args) -> Result<(), Error> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("failed to connect to Kubernetes: {e}"))?;
    let options = args.options();
    tracing::info!(namespace = ?options.namespace, concurrency = options.concurrency, image = %options.settings.image, "starting pgop operator");
    pgop_operator::run(client, options, shutdown_signal()).await;
    tracing::info!("pgop operator stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C; the controller then finishes the reconciles in flight.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
