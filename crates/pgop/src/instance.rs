//! `pgop instance ...`: the instance manager, PID 1 of every PostgreSQL pod.

use pgop_api::constants::{MANAGER_PORT, MANAGER_TLS_PORT, POSTGRES_PORT};
use pgop_instance::run::Settings;
use pgop_instance::{Binaries, RunAs};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Bootstrap, configure, supervise and replicate this pod's PostgreSQL as the
    /// PostgresCluster's status says, and serve /healthz, /readyz and /pg/status.
    Run(Box<RunArgs>),
    /// PostgreSQL's `archive_command`: archive one WAL file (`%p`) to the backup store
    /// (idempotent: the same content already there is a success; different content under
    /// the same name is an error). Run by PostgreSQL, not by hand.
    WalArchive(WalArchiveArgs),
    /// PostgreSQL's `restore_command`: fetch WAL file `%f` from the backup store into `%p`,
    /// verifying its checksums. Exit 1 (quietly) when the store has no such file; exit
    /// 200 on any other failure, which aborts recovery instead of ending it early.
    WalRestore(WalRestoreArgs),
}

#[derive(Debug, clap::Args)]
struct WalArchiveArgs {
    /// The backup store configuration the instance manager wrote (mode 0600).
    #[arg(long, env = "PGOP_BACKUP_STORE_CONFIG")]
    store_config: PathBuf,
    /// The WAL file, relative to the data directory (the working directory).
    path: PathBuf,
}

#[derive(Debug, clap::Args)]
struct WalRestoreArgs {
    /// The backup store configuration (mode 0600).
    #[arg(long, env = "PGOP_BACKUP_STORE_CONFIG")]
    store_config: PathBuf,
    /// The WAL file's name (`%f`).
    name: String,
    /// Where to put it (`%p`), relative to the data directory (the working directory).
    dest: PathBuf,
}

/// Exit code of `wal-restore` for any failure but a missing file: above 125, so that
/// PostgreSQL aborts recovery rather than taking it for the end of the archive.
pub const WAL_RESTORE_FAILED: i32 = 200;

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// This instance's name (its Pod's name).
    #[arg(long, env = "POD_NAME")]
    pod_name: String,
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// The Pod's IP: PostgreSQL listens on it (besides the Unix socket).
    #[arg(long, env = "POD_IP", default_value = "127.0.0.1")]
    pod_ip: String,
    /// The PostgresCluster this instance belongs to.
    #[arg(long, env = "PGOP_CLUSTER")]
    cluster: String,
    #[arg(
        long,
        env = "PGDATA",
        default_value = "/var/lib/postgresql/data/pgdata"
    )]
    pgdata: PathBuf,
    /// PostgreSQL's binary directory (default: that of --postgres-major, see there).
    #[arg(long, env = "PGOP_PG_BIN")]
    pg_bin: Option<PathBuf>,
    /// The PostgreSQL major version to run (the cluster's `spec.postgresql.version`, which
    /// the operator sets). Its binaries: --pg-bin, else `PGOP_PG_BIN_<major>`, else
    /// /usr/lib/postgresql/<major>/bin, else /var/cache/pgop/postgresql/<major>/bin.
    /// Without it: the major of an existing data directory (its PG_VERSION), else
    /// `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin.
    #[arg(long, env = "PGOP_POSTGRES_MAJOR", value_parser = clap::value_parser!(u32).range(10..100))]
    postgres_major: Option<u32>,
    #[arg(long, env = "PGOP_SOCKET_DIR", default_value = "/run/postgresql")]
    socket_dir: PathBuf,
    #[arg(long, env = "PGOP_PG_PORT", default_value_t = POSTGRES_PORT)]
    pg_port: u16,
    /// Address of the health and status endpoints [default: the pod IP, port 8000].
    #[arg(long, env = "PGOP_LISTEN")]
    listen: Option<SocketAddr>,
    /// Address of the mutual-TLS endpoint (backups, retention) [default: the pod IP, port
    /// 8001; with --listen, its IP and any free port].
    #[arg(long, env = "PGOP_TLS_LISTEN")]
    tls_listen: Option<SocketAddr>,
    /// OS user PostgreSQL runs as when pgop itself runs as root (tests, CI).
    #[arg(long, env = "PGOP_PG_USER", default_value = "postgres")]
    pg_user: String,
    /// Seconds a smart shutdown may take before a fast one (and the fast one before an
    /// immediate one).
    #[arg(long, env = "PGOP_STOP_TIMEOUT", default_value_t = 10)]
    stop_timeout: u64,
    /// Seconds between passes when nothing that concerns the manager changes (a safety
    /// net: a pass reads what the watches keep and sends no request; changes of the
    /// cluster, its Secrets, the primary's Pod and PostgreSQL's state wake it at once).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    resync: u64,
    /// Where the claim of `spec.backup.store.volume` is mounted.
    #[arg(
        long,
        env = "PGOP_BACKUP_VOLUME",
        default_value = "/var/lib/postgresql/backup"
    )]
    backup_volume: PathBuf,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

pub async fn run(args: Args) -> Result<(), Error> {
    match args.command {
        Command::Run(args) => run_instance(*args).await,
        Command::WalArchive(args) => wal_archive(args).await,
        Command::WalRestore(args) => wal_restore(args).await,
    }
}

async fn wal_archive(args: WalArchiveArgs) -> Result<(), Error> {
    let config = pgop_backup::StoreConfig::read(&args.store_config)?;
    let store = pgop_backup::Store::open(&config)?;
    let cwd = std::env::current_dir()?;
    let how = pgop_backup::wal::archive(&store, &cwd, &args.path).await?;
    tracing::debug!(wal = %args.path.display(), ?how, "archived");
    Ok(())
}

async fn wal_restore(args: WalRestoreArgs) -> Result<(), Error> {
    let restored = async {
        let config = pgop_backup::StoreConfig::read(&args.store_config)?;
        let store = pgop_backup::Store::open(&config)?;
        let cwd = std::env::current_dir()?;
        Ok::<_, Error>(pgop_backup::wal::restore(&store, &cwd, &args.name, &args.dest).await?)
    };
    match restored.await {
        Ok(true) => Ok(()),
        // PostgreSQL probes for files that may not exist (history files, the next segment).
        Ok(false) => std::process::exit(1),
        Err(err) => {
            eprintln!(
                "pgop: failed to restore WAL file {}: {}",
                args.name,
                pgop_api::error_chain(&*err)
            );
            std::process::exit(WAL_RESTORE_FAILED)
        }
    }
}

/// The major version a data directory was made by (its `PG_VERSION`), when it has one.
fn data_major(pgdata: &std::path::Path) -> Result<Option<u32>, Error> {
    let path = pgdata.join("PG_VERSION");
    match std::fs::read_to_string(&path) {
        Ok(text) => pgop_instance::pg::binaries::parse_major(&text)
            .map(Some)
            .ok_or_else(|| {
                format!("{} holds {text:?}, not a major version", path.display()).into()
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("failed to read {}: {e}", path.display()).into()),
    }
}

/// The binaries this instance runs: those of `--postgres-major`, which must be the major
/// of an existing data directory (PostgreSQL cannot start another major's data, and
/// pgop does not upgrade in place yet); without it, the data directory's major, else
/// whatever is found.
fn binaries_for(args: &RunArgs) -> Result<Binaries, Error> {
    let on_disk = data_major(&args.pgdata)?;
    match (args.postgres_major, on_disk) {
        (Some(wanted), Some(found)) if wanted != found => Err(format!(
            "the data directory {} was made by PostgreSQL {found}, and this instance is to run PostgreSQL {wanted} (spec.postgresql.version): \
             pgop does not upgrade a data directory to another major version; set spec.postgresql.version back to {found}",
            args.pgdata.display()
        )
        .into()),
        (Some(major), _) | (None, Some(major)) => {
            Ok(Binaries::for_major(major, args.pg_bin.as_deref())?)
        }
        (None, None) => Ok(Binaries::locate(args.pg_bin.as_deref())?),
    }
}

async fn run_instance(args: RunArgs) -> Result<(), Error> {
    let binaries = binaries_for(&args)?;
    let run_as = RunAs::when_root(&args.pg_user)?;
    let client = crate::kube_client("instance").await?;
    // The pod IP rather than 0.0.0.0: the same in a real pod, and on the local node,
    // where every pod shares one network namespace, the only address that is its own.
    let pod_ip = || -> Result<std::net::IpAddr, Error> {
        args.pod_ip
            .parse()
            .map_err(|e| format!("POD_IP {:?} is not an IP address: {e}", args.pod_ip).into())
    };
    let http_listen = match args.listen {
        Some(addr) => addr,
        None => SocketAddr::new(pod_ip()?, MANAGER_PORT),
    };
    let tls_listen = match (args.tls_listen, args.listen) {
        (Some(addr), _) => addr,
        (None, Some(listen)) => SocketAddr::new(listen.ip(), 0),
        (None, None) => SocketAddr::new(pod_ip()?, MANAGER_TLS_PORT),
    };
    let settings = Settings {
        pod_name: args.pod_name,
        namespace: args.namespace,
        cluster: args.cluster,
        listen_addresses: args.pod_ip,
        pg_port: args.pg_port,
        pgdata: args.pgdata,
        socket_dir: args.socket_dir,
        http_listen,
        tls_listen,
        binaries,
        run_as,
        stop_timeout: Duration::from_secs(args.stop_timeout),
        resync: Duration::from_secs(args.resync),
        pgop_binary: std::env::current_exe()
            .map_err(|e| format!("failed to find the pgop binary's own path: {e}"))?,
        backup_volume_path: args.backup_volume,
        version: crate::VERSION.to_string(),
    };
    tracing::info!(version = crate::VERSION, instance = %settings.pod_name, cluster = %settings.cluster, bin = %settings.binaries.dir().display(), "starting the instance manager");
    pgop_instance::run::run(client, settings, crate::operator::shutdown_signal()).await?;
    tracing::info!("instance manager stopped");
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

    /// `pgop instance run` arguments for a data directory `pgdata`, at `--postgres-major`
    /// `major` when given.
    fn args(pgdata: &std::path::Path, major: Option<&str>) -> RunArgs {
        let mut argv = vec![
            "run".to_string(),
            "--pod-name=db-1".into(),
            "--namespace=ns".into(),
            "--cluster=db".into(),
            format!("--pgdata={}", pgdata.display()),
        ];
        if let Some(major) = major {
            argv.push(format!("--postgres-major={major}"));
        }
        Cli::try_parse_from(argv).expect("valid arguments").run
    }

    fn data_dir(name: &str, pg_version: Option<&str>) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pgop-instance-args-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        if let Some(version) = pg_version {
            std::fs::write(dir.join("PG_VERSION"), version).expect("PG_VERSION");
        }
        dir
    }

    #[test]
    fn the_data_directorys_major_decides_and_another_is_refused() {
        let none = data_dir("none", None);
        assert_eq!(data_major(&none).ok().flatten(), None);
        let fifteen = data_dir("fifteen", Some("15\n"));
        assert_eq!(data_major(&fifteen).ok().flatten(), Some(15));
        let garbage = data_dir("garbage", Some("fifteen\n"));
        assert!(data_major(&garbage).is_err());

        let refused = binaries_for(&args(&fifteen, Some("18"))).expect_err("15's data, 18 asked");
        let text = refused.to_string();
        assert!(
            text.contains("made by PostgreSQL 15") && text.contains("to run PostgreSQL 18"),
            "{text}"
        );
        // Debian's 15 (hack/install-packages.sh), with or without the flag.
        for major in [Some("15"), None] {
            let found = binaries_for(&args(&fifteen, major)).expect("PostgreSQL 15 installed");
            assert_eq!(found.major().ok(), Some(15));
        }
        assert!(Cli::try_parse_from(["run", "--postgres-major=9", "--pod-name=a"]).is_err());
        for dir in [none, fifteen, garbage] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
