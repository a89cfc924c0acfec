//! `pgop instance ...`: the instance manager, PID 1 of every PostgreSQL pod.

use pgop_api::constants::{MANAGER_PORT, MANAGER_TLS_PORT, POSTGRES_PORT};
use pgop_instance::run::Settings;
use pgop_instance::upgrade::{self, UpgradeRequest};
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
    /// A file to keep what was restored and what the store lacked in
    /// (`pgop_instance::external::ArchiveRecord`): a replica cluster's designated primary
    /// that reads its source's store.
    #[arg(long)]
    record: Option<PathBuf>,
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
    /// The major version whose data directory this instance may upgrade in place to
    /// --postgres-major with pg_upgrade (set by the operator on the primary's Pod during a
    /// major upgrade). Its binaries are found as --postgres-major's are, without --pg-bin.
    #[arg(long, env = "PGOP_UPGRADE_FROM", value_parser = clap::value_parser!(u32).range(10..100))]
    upgrade_from: Option<u32>,
    /// How pg_upgrade carries the data files over: `link` (hard links: fast, no second
    /// copy) or `copy`.
    #[arg(long, env = "PGOP_UPGRADE_MODE", value_enum, default_value_t = UpgradeMode::Link)]
    upgrade_mode: UpgradeMode,
    #[arg(long, env = "PGOP_SOCKET_DIR", default_value = "/run/postgresql")]
    socket_dir: PathBuf,
    /// The WAL volume's mount (set by the operator with `spec.walStorage`): the manager
    /// keeps the write-ahead log in `<dir>/pg_wal` and makes `PGDATA/pg_wal` a link to it.
    #[arg(long, env = "PGOP_WAL_DIR")]
    wal_dir: Option<PathBuf>,
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

/// pg_upgrade's mode (`PGOP_UPGRADE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum UpgradeMode {
    /// `pg_upgrade --link`.
    Link,
    /// `pg_upgrade --copy`.
    Copy,
}

impl From<UpgradeMode> for upgrade::Mode {
    fn from(mode: UpgradeMode) -> Self {
        match mode {
            UpgradeMode::Link => upgrade::Mode::Link,
            UpgradeMode::Copy => upgrade::Mode::Copy,
        }
    }
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
        let found = pgop_backup::wal::restore(&store, &cwd, &args.name, &args.dest).await?;
        if let Some(record) = &args.record {
            keep_record(&store, record, &args.name, found).await;
        }
        Ok::<_, Error>(found)
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

/// Records a segment restored, or missing (and whether the next one of its timeline is in
/// the store: a gap), in `record`. History files and the like are not recorded. A record
/// that cannot be written is only logged: the WAL is what recovery needs.
async fn keep_record(
    store: &pgop_backup::Store,
    record: &std::path::Path,
    name: &str,
    found: bool,
) {
    use pgop_backup::wal::WalName;
    let Some(wal) = WalName::parse(name).filter(|w| w.position.is_some() && w.name.len() == 24)
    else {
        return;
    };
    let now = jiff::Timestamp::now().to_string();
    let kept = pgop_instance::external::ArchiveRecord::read(record);
    let kept = if found {
        kept.restored(name, &now)
    } else {
        let later = match wal.next() {
            Some(next) => pgop_backup::wal::exists(store, &next)
                .await
                .unwrap_or(false),
            None => false,
        };
        kept.missed(name, later, &now)
    };
    if let Err(err) = kept.write(record) {
        eprintln!(
            "pgop: could not keep the record {}: {err}",
            record.display()
        );
    }
}

/// The major version a data directory was made by (its `PG_VERSION`), when it has one.
fn data_major(pgdata: &std::path::Path) -> Result<Option<u32>, Error> {
    Ok(pgop_instance::bootstrap::read_data_major(pgdata)?)
}

/// What this instance runs: the binaries, and the upgrade to run first.
#[derive(Debug)]
struct Chosen {
    binaries: Binaries,
    upgrade: Option<UpgradeRequest>,
    /// The data directory's major when it is older than the binaries' and no upgrade was
    /// requested (the manager re-clones a standby, and keeps the primary stopped).
    stale_data_major: Option<u32>,
}

/// The binaries this instance runs: those of `--postgres-major`; without it, the data
/// directory's major, else whatever is found. A data directory of an older major than
/// `--postgres-major` is upgraded in place first when `--upgrade-from` names its major,
/// else left to the manager (a standby re-clones it, a primary waits); one of a newer
/// major is refused (PostgreSQL cannot run it).
fn binaries_for(args: &RunArgs) -> Result<Chosen, Error> {
    let on_disk = data_major(&args.pgdata)?;
    let chosen = |binaries, upgrade, stale_data_major| Chosen {
        binaries,
        upgrade,
        stale_data_major,
    };
    match (args.postgres_major, on_disk) {
        (Some(wanted), Some(found)) if found > wanted => Err(format!(
            "the data directory {} was made by PostgreSQL {found}, and this instance is to run PostgreSQL {wanted} (spec.postgresql.version): \
             PostgreSQL cannot run the data of a newer major; set spec.postgresql.version back to {found}",
            args.pgdata.display()
        )
        .into()),
        (Some(wanted), Some(found)) if found < wanted => {
            let binaries = Binaries::for_major(wanted, args.pg_bin.as_deref())?;
            Ok(if args.upgrade_from == Some(found) {
                let mode = args.upgrade_mode.into();
                chosen(binaries, Some(UpgradeRequest { from: found, mode }), None)
            } else {
                chosen(binaries, None, Some(found))
            })
        }
        (Some(major), _) | (None, Some(major)) => Ok(chosen(
            Binaries::for_major(major, args.pg_bin.as_deref())?,
            None,
            None,
        )),
        (None, None) => Ok(chosen(Binaries::locate(args.pg_bin.as_deref())?, None, None)),
    }
}

async fn run_instance(args: RunArgs) -> Result<(), Error> {
    let Chosen {
        binaries,
        upgrade,
        stale_data_major,
    } = binaries_for(&args)?;
    if let Some(found) = stale_data_major {
        tracing::warn!(
            found,
            pgdata = %args.pgdata.display(),
            "the data directory holds an older PostgreSQL major and no upgrade was requested (PGOP_UPGRADE_FROM): a standby re-clones it from the primary, a primary stays stopped"
        );
    }
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
        wal_dir: args.wal_dir,
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
        upgrade,
    };
    tracing::info!(version = crate::VERSION, instance = %settings.pod_name, cluster = %settings.cluster, bin = %settings.binaries.dir().display(), upgrade = ?settings.upgrade, "starting the instance manager");
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
    /// `major` when given, with `extra` arguments.
    fn args(pgdata: &std::path::Path, major: Option<&str>, extra: &[&str]) -> RunArgs {
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
        argv.extend(extra.iter().map(|a| a.to_string()));
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
    fn the_data_directorys_major_decides_and_a_newer_one_is_refused() {
        let none = data_dir("none", None);
        assert_eq!(data_major(&none).ok().flatten(), None);
        let fifteen = data_dir("fifteen", Some("15\n"));
        assert_eq!(data_major(&fifteen).ok().flatten(), Some(15));
        let eighteen = data_dir("eighteen", Some("18\n"));
        let garbage = data_dir("garbage", Some("fifteen\n"));
        assert!(data_major(&garbage).is_err());

        let refused =
            binaries_for(&args(&eighteen, Some("15"), &[])).expect_err("18's data, 15 asked");
        let text = refused.to_string();
        assert!(
            text.contains("made by PostgreSQL 18") && text.contains("to run PostgreSQL 15"),
            "{text}"
        );
        // Debian's 15 (hack/install-packages.sh), with or without the flag.
        for major in [Some("15"), None] {
            let found = binaries_for(&args(&fifteen, major, &[])).expect("PostgreSQL 15 installed");
            assert_eq!(found.binaries.major().ok(), Some(15));
            assert_eq!((found.upgrade, found.stale_data_major), (None, None));
        }
        assert!(Cli::try_parse_from(["run", "--postgres-major=9", "--pod-name=a"]).is_err());
        for dir in [none, fifteen, eighteen, garbage] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn older_data_is_upgraded_when_asked_and_else_left_to_the_manager() {
        if Binaries::for_major(18, None).is_err() {
            panic!("PostgreSQL 18 is missing: run hack/install-postgres18.sh");
        }
        let fifteen = data_dir("upgrade-fifteen", Some("15\n"));
        let asked = binaries_for(&args(&fifteen, Some("18"), &["--upgrade-from=15"]))
            .expect("15's data, 18 asked, upgrade from 15");
        assert_eq!(asked.binaries.major().ok(), Some(18));
        assert_eq!(
            asked.upgrade,
            Some(UpgradeRequest {
                from: 15,
                mode: upgrade::Mode::Link
            }),
            "link by default"
        );
        assert_eq!(asked.stale_data_major, None);
        let copy = binaries_for(&args(
            &fifteen,
            Some("18"),
            &["--upgrade-from=15", "--upgrade-mode=copy"],
        ))
        .expect("copy");
        assert_eq!(copy.upgrade.map(|u| u.mode), Some(upgrade::Mode::Copy));
        // Not asked (a standby), or asked from another major: the manager sees old data.
        for extra in [&[][..], &["--upgrade-from=14"][..]] {
            let stale = binaries_for(&args(&fifteen, Some("18"), extra)).expect("stale data");
            assert_eq!(stale.binaries.major().ok(), Some(18));
            assert_eq!((stale.upgrade, stale.stale_data_major), (None, Some(15)));
        }
        // No data yet (a new cluster, or a swap under way): the wanted major, nothing else.
        let none = data_dir("upgrade-none", None);
        let fresh = binaries_for(&args(&none, Some("18"), &["--upgrade-from=15"])).expect("none");
        assert_eq!((fresh.upgrade, fresh.stale_data_major), (None, None));
        for bad in ["--upgrade-mode=move", "--upgrade-from=9"] {
            let argv = ["run", "--pod-name=a", "--namespace=ns", "--cluster=db", bad];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad}");
        }
        for dir in [fifteen, none] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
