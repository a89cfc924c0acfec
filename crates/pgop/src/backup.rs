//! `pgop backup ...`: base backups, restores and retention against a backup store, by hand
//! or for the operator (through the instance manager). The store configuration is a file
//! (mode 0600) like the one the instance manager writes for `archive_command`: credentials
//! never appear on a command line.

use pgop_backup::{
    LogicalTarget, PgTools, RestoreOptions, Source, Store, StoreConfig, TakeOptions, Target,
};
use pgop_instance::{Binaries, RunAs};
use std::path::PathBuf;
use std::time::Duration;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Take a base backup of a running server (superuser over its Unix socket) into the
    /// store; prints the manifest as JSON.
    Take(TakeArgs),
    /// Restore a base backup into an empty data directory and recover it (to the end of
    /// the archived WAL, or to --target-time / --target-lsn); prints the result as JSON.
    Restore(RestoreArgs),
    /// List the completed backups (manifests, JSON) in the store.
    List(StoreArgs),
    /// Delete base backups older than --retention-days (never the newest) and the WAL no
    /// kept backup needs, and logical backups older than --retention-days (never the newest;
    /// leftovers of failed ones after a day); prints what was kept and deleted as JSON.
    Retention(RetentionArgs),
    /// Logical backups (pg_dump per database, pg_dumpall --globals-only): take, list,
    /// restore (`pgop backup logical --help`).
    #[command(subcommand)]
    Logical(LogicalCommand),
}

#[derive(Debug, clap::Subcommand)]
enum LogicalCommand {
    /// Dump every database that allows connections (pg_dump -Fc, `postgres` included) and
    /// the roles and tablespaces (pg_dumpall --globals-only) of a running server
    /// (superuser over its Unix socket) into the store; prints the manifest as JSON.
    Take(LogicalTakeArgs),
    /// List the completed logical backups (manifests, JSON, oldest first) in the store.
    List(StoreArgs),
    /// Restore one database of a logical backup into an existing (empty) database: the
    /// dump is downloaded and verified first, then pg_restore applies it in one transaction.
    /// Owners and privileges are restored as dumped: restore the globals first
    /// (`restore-globals`). The password comes from PGPASSWORD. Prints the result as JSON.
    Restore(LogicalRestoreArgs),
    /// Create the roles (and tablespaces) of a logical backup that the target server does
    /// not have; existing ones are left alone. The password comes from PGPASSWORD. Prints
    /// the roles created and skipped as JSON.
    RestoreGlobals(LogicalGlobalsArgs),
}

#[derive(Debug, clap::Args)]
struct LogicalTakeArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    pg: PgArgs,
    #[arg(long, env = "PGOP_SOCKET_DIR", default_value = "/run/postgresql")]
    socket_dir: PathBuf,
    #[arg(long, env = "PGOP_PG_PORT", default_value_t = pgop_api::constants::POSTGRES_PORT)]
    pg_port: u16,
}

#[derive(Debug, clap::Args)]
struct TargetArgs {
    /// The server to restore into: a host name, an IP address or a Unix socket directory.
    #[arg(long, default_value = "/run/postgresql")]
    host: String,
    #[arg(long, default_value_t = pgop_api::constants::POSTGRES_PORT)]
    port: u16,
    /// The role to connect as (a superuser, to restore owners and privileges).
    #[arg(long, default_value = "postgres")]
    user: String,
    /// Directory for the verified temporary copy of the dump (removed afterwards); it needs
    /// room for the whole dump, uncompressed.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    scratch_dir: PathBuf,
    /// The authority (PEM) of the server's certificate: connect over TLS and verify the
    /// server (`sslmode=verify-full`). A pgop cluster refuses connections without TLS; its
    /// app Secret's `ca.crt` is this file.
    #[arg(long, env = "PGSSLROOTCERT")]
    sslrootcert: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct LogicalRestoreArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    pg: PgArgs,
    /// The logical backup (its id, YYYYMMDDTHHMMSSZ; see `pgop backup logical list`).
    #[arg(long)]
    backup_id: String,
    /// The database of the backup to restore.
    #[arg(long)]
    database: String,
    #[command(flatten)]
    target: TargetArgs,
    /// The existing database to restore into; default: --database.
    #[arg(long)]
    dbname: Option<String>,
}

#[derive(Debug, clap::Args)]
struct LogicalGlobalsArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    pg: PgArgs,
    /// The logical backup (its id, YYYYMMDDTHHMMSSZ; see `pgop backup logical list`).
    #[arg(long)]
    backup_id: String,
    #[command(flatten)]
    target: TargetArgs,
    /// The database to connect to.
    #[arg(long, default_value = "postgres")]
    dbname: String,
}

impl TargetArgs {
    fn target(&self, dbname: String) -> LogicalTarget {
        LogicalTarget {
            host: self.host.clone(),
            port: self.port,
            user: self.user.clone(),
            password: std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()),
            dbname,
            ssl_root_cert: self.sslrootcert.clone(),
        }
    }
}

#[derive(Debug, clap::Args)]
struct StoreArgs {
    /// The backup store configuration (JSON, mode 0600).
    #[arg(long, env = "PGOP_BACKUP_STORE_CONFIG")]
    store_config: PathBuf,
}

impl StoreArgs {
    /// The configuration read and the store opened.
    fn open(&self) -> Result<(StoreConfig, Store), Error> {
        let config = StoreConfig::read(&self.store_config)?;
        let store = Store::open(&config)?;
        Ok((config, store))
    }
}

#[derive(Debug, clap::Args)]
struct PgArgs {
    /// PostgreSQL's binary directory (default: `pg_config --bindir`, else the newest
    /// /usr/lib/postgresql/*/bin).
    #[arg(long, env = "PGOP_PG_BIN")]
    pg_bin: Option<PathBuf>,
    /// OS user PostgreSQL's programs run as when pgop runs as root.
    #[arg(long, env = "PGOP_PG_USER", default_value = "postgres")]
    pg_user: String,
}

impl PgArgs {
    fn tools(&self) -> Result<PgTools, Error> {
        let binaries = Binaries::locate(self.pg_bin.as_deref())?;
        let run_as = RunAs::when_root(&self.pg_user)?;
        Ok(PgTools {
            bin_dir: binaries.dir().to_path_buf(),
            run_as: run_as.map(|u| (u.uid, u.gid)),
        })
    }
}

#[derive(Debug, clap::Args)]
struct TakeArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    pg: PgArgs,
    #[arg(long, env = "PGOP_SOCKET_DIR", default_value = "/run/postgresql")]
    socket_dir: PathBuf,
    #[arg(long, env = "PGOP_PG_PORT", default_value_t = pgop_api::constants::POSTGRES_PORT)]
    pg_port: u16,
    /// Seconds to wait for the WAL the backup needs to be archived.
    #[arg(long, default_value_t = 120)]
    wait_for_wal: u64,
}

#[derive(Debug, clap::Args)]
struct RestoreArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    pg: PgArgs,
    /// The (absent or empty) data directory to restore into.
    #[arg(long, env = "PGDATA")]
    pgdata: PathBuf,
    /// The backup to restore; default: the latest completed one before the target.
    #[arg(long)]
    backup_id: Option<String>,
    /// Recover up to this time (RFC 3339).
    #[arg(long, conflicts_with = "target_lsn")]
    target_time: Option<String>,
    /// Recover up to this LSN.
    #[arg(long)]
    target_lsn: Option<String>,
    /// Seconds recovery may take.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
}

#[derive(Debug, clap::Args)]
struct RetentionArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=365))]
    retention_days: u32,
    /// Print the plan without deleting anything.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(args: Args) -> Result<(), Error> {
    match args.command {
        Command::Take(args) => {
            let (config, store) = args.store.open()?;
            let manifest = pgop_backup::base::take(
                &store,
                &args.pg.tools()?,
                &Source {
                    socket_dir: args.socket_dir,
                    port: args.pg_port,
                },
                &config.cluster,
                &TakeOptions {
                    wait_for_wal: Duration::from_secs(args.wait_for_wal),
                },
            )
            .await?;
            println!("{}", serde_json::to_string_pretty(&manifest)?);
        }
        Command::Restore(args) => {
            let config = StoreConfig::read(&args.store.store_config)?;
            let target = match (args.target_time, args.target_lsn) {
                (Some(t), _) => Target::Time(t),
                (None, Some(l)) => Target::Lsn(l),
                (None, None) => Target::EndOfWal,
            };
            let store_config_file = restore_config_path(&args.pgdata);
            let restored = pgop_backup::restore::restore(
                &config,
                &args.pg.tools()?,
                &args.pgdata,
                &RestoreOptions {
                    backup_id: args.backup_id,
                    target,
                    pgop_binary: std::env::current_exe()?,
                    store_config_file,
                    timeout: Duration::from_secs(args.timeout),
                    socket_dir: None,
                },
            )
            .await?;
            let out = serde_json::json!({
                "backupId": restored.backup.backup_id,
                "timeline": restored.timeline,
                "lsn": restored.lsn,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Command::List(args) => {
            let (_, store) = args.open()?;
            let (backups, _) = pgop_backup::base::list(&store).await?;
            println!("{}", serde_json::to_string_pretty(&backups)?);
        }
        Command::Retention(args) => {
            let (_, store) = args.store.open()?;
            let now = jiff::Timestamp::now();
            let plan = if args.dry_run {
                let inventory = pgop_backup::retention::inventory(&store).await?;
                pgop_backup::retention::plan(&inventory, now, args.retention_days)
            } else {
                pgop_backup::retention::apply(&store, now, args.retention_days).await?
            };
            let logical = pgop_backup::logical::apply_retention(
                &store,
                now,
                args.retention_days,
                args.dry_run,
            )
            .await?;
            let out = serde_json::json!({
                "keptBackups": plan.keep_backups,
                "deletedBackups": plan.delete_backups,
                "deletedWal": plan.delete_wal.len(),
                "oldestKeptWal": plan.oldest_kept_wal,
                "keptLogicalBackups": logical.kept,
                "deletedLogicalBackups": logical.deleted,
                "deletedIncompleteLogicalBackups": logical.deleted_incomplete,
                "dryRun": args.dry_run,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Command::Logical(command) => logical(command).await?,
    }
    Ok(())
}

async fn logical(command: LogicalCommand) -> Result<(), Error> {
    match command {
        LogicalCommand::Take(args) => {
            let (config, store) = args.store.open()?;
            let manifest = pgop_backup::logical::take(
                &store,
                &args.pg.tools()?,
                &Source {
                    socket_dir: args.socket_dir,
                    port: args.pg_port,
                },
                &config.cluster,
            )
            .await?;
            println!("{}", serde_json::to_string_pretty(&manifest)?);
        }
        LogicalCommand::List(args) => {
            let (_, store) = args.open()?;
            let backups = pgop_backup::logical::list(&store).await?;
            println!("{}", serde_json::to_string_pretty(&backups)?);
        }
        LogicalCommand::Restore(args) => {
            let (_, store) = args.store.open()?;
            let dbname = args.dbname.unwrap_or_else(|| args.database.clone());
            let target = args.target.target(dbname);
            let bytes = pgop_backup::logical::restore(
                &store,
                &args.pg.tools()?,
                &args.backup_id,
                &args.database,
                &target,
                &args.target.scratch_dir,
            )
            .await?;
            let out = serde_json::json!({
                "backupId": args.backup_id,
                "database": args.database,
                "restoredInto": target.dbname,
                "bytesRestored": bytes,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        LogicalCommand::RestoreGlobals(args) => {
            let (_, store) = args.store.open()?;
            let restored = pgop_backup::logical::restore_globals(
                &store,
                &args.pg.tools()?,
                &args.backup_id,
                &args.target.target(args.dbname.clone()),
                &args.target.scratch_dir,
            )
            .await?;
            println!("{}", serde_json::to_string_pretty(&restored)?);
        }
    }
    Ok(())
}

/// Where a restore writes the store configuration its `restore_command` reads: beside the
/// data directory (never inside it), removed when the restore ends.
pub fn restore_config_path(pgdata: &std::path::Path) -> PathBuf {
    let mut name = pgdata
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".pgop-restore-store.json");
    pgdata.with_file_name(name)
}
