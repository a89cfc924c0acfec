//! `pgop pooler ...`: the manager of a PgBouncer pooler Pod (`spec.poolers`).

use pgop_api::constants::{MANAGER_PORT, POSTGRES_PORT};
use pgop_instance::RunAs;
use pgop_instance::pooler::Settings;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run PgBouncer for one pooler of a PostgresCluster: point it at the confirmed
    /// primary (`rw`) or the ready replicas (`ro`) as the cluster's status says, reload it
    /// (never restart it) when they change, restart it if it exits, and serve /healthz,
    /// /readyz and /metrics.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The PostgresCluster the pooler belongs to.
    #[arg(long, env = "PGOP_CLUSTER")]
    cluster: String,
    /// The pooler's name in the cluster's `spec.poolers`.
    #[arg(long, env = "PGOP_POOLER")]
    pooler: String,
    /// This Pod's name.
    #[arg(long, env = "POD_NAME")]
    pod_name: String,
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// The Pod's IP: PgBouncer listens on it.
    #[arg(long, env = "POD_IP")]
    pod_ip: IpAddr,
    /// PgBouncer's run directory: its configuration, auth file, TLS files and Unix
    /// socket.
    #[arg(long, env = "PGOP_POOLER_DIR", default_value = "/run/pgbouncer")]
    dir: PathBuf,
    /// The pgbouncer binary.
    #[arg(long, env = "PGOP_PGBOUNCER", default_value = "/usr/sbin/pgbouncer")]
    pgbouncer: PathBuf,
    /// The port PgBouncer listens on.
    #[arg(long, env = "PGOP_PGBOUNCER_PORT", default_value_t = POSTGRES_PORT)]
    port: u16,
    /// Address of the health, readiness and metrics endpoints [default: the pod IP, port
    /// 8000].
    #[arg(long, env = "PGOP_LISTEN")]
    listen: Option<SocketAddr>,
    /// OS user PgBouncer runs as when pgop itself runs as root (PgBouncer refuses root).
    #[arg(long, env = "PGOP_POOLER_USER", default_value = "postgres")]
    user: String,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

pub async fn run(args: Args) -> Result<(), Error> {
    match args.command {
        Command::Run(args) => run_pooler(args).await,
    }
}

fn settings(args: RunArgs, run_as: Option<RunAs>) -> Settings {
    Settings {
        http: args
            .listen
            .unwrap_or_else(|| SocketAddr::new(args.pod_ip, MANAGER_PORT)),
        cluster: args.cluster,
        namespace: args.namespace,
        pooler: args.pooler,
        pod_name: args.pod_name,
        pod_ip: args.pod_ip,
        dir: args.dir,
        pgbouncer: args.pgbouncer,
        port: args.port,
        run_as,
    }
}

async fn run_pooler(args: RunArgs) -> Result<(), Error> {
    let run_as = RunAs::when_root(&args.user)?;
    let settings = settings(args, run_as);
    let client = crate::kube_client("pooler").await?;
    tracing::info!(
        version = crate::VERSION,
        cluster = %settings.cluster,
        pooler = %settings.pooler,
        pod = %settings.pod_name,
        pgbouncer = %settings.pgbouncer.display(),
        "starting the pooler manager"
    );
    pgop_instance::pooler::run(client, settings, crate::operator::shutdown_signal()).await?;
    tracing::info!("pooler manager stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn the_defaults_are_the_pods() {
        let args = Cli::try_parse_from([
            "run",
            "--cluster=db",
            "--pooler=rw",
            "--pod-name=db-pooler-rw-abc",
            "--namespace=ns",
            "--pod-ip=10.1.2.3",
        ])
        .expect("valid arguments")
        .run;
        let s = settings(args, None);
        assert_eq!(s.http, "10.1.2.3:8000".parse().expect("address"));
        assert_eq!(s.port, 5432);
        assert_eq!(s.dir, PathBuf::from("/run/pgbouncer"));
        assert_eq!(s.pgbouncer, PathBuf::from("/usr/sbin/pgbouncer"));
        assert_eq!((s.cluster.as_str(), s.pooler.as_str()), ("db", "rw"));
        let listen = Cli::try_parse_from([
            "run",
            "--cluster=db",
            "--pooler=rw",
            "--pod-name=p",
            "--namespace=ns",
            "--pod-ip=10.1.2.3",
            "--listen=127.0.0.1:9000",
        ])
        .expect("valid arguments")
        .run;
        assert_eq!(
            settings(listen, None).http,
            "127.0.0.1:9000".parse().expect("address")
        );
        assert!(
            Cli::try_parse_from([
                "run",
                "--cluster=db",
                "--pooler=rw",
                "--pod-name=p",
                "--namespace=ns",
                "--pod-ip=not-an-ip",
            ])
            .is_err()
        );
    }
}
