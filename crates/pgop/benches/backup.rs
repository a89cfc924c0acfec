//! The backup benchmark: `cargo bench -p pgop --bench backup` prints a markdown table of
//! - a generated database (`pgbench -i`, scale `PGOP_BENCH_BACKUP_SCALE`, default 70 ≈ 1 GB);
//! - `pg_basebackup` to local disk: plain (`-Fp`), gzip tar (`-Ft -z`, zlib's default level)
//!   and gzip level 1 (`-Ft --compress=client-gzip:1`, the level pgop uses), plus the
//!   tar stream to `/dev/null` (what reading the source costs);
//! - a pgop base backup into a local S3 server (`s3s-fs`): `pgop_backup::base::take`;
//! - a pgop restore from it into a new directory to the end of the WAL
//!   (`pgop_backup::restore::restore`, recovery and promotion included);
//! - WAL archive lag under `pgbench -c 4 -j 2` for `PGOP_BENCH_BACKUP_DURATION` seconds
//!   (default 60), sampled every second: the current WAL segment against
//!   `pg_stat_archiver.last_archived_wal`, and `failed_count`.
//!
//! Everything is real: PostgreSQL 15 started through `pgop_instance::Instance` with
//! archiving into s3s-fs as the instance manager sets it up (`archive_command` = this
//! build's `pgop instance wal-archive`). Run it on an otherwise idle machine; the figures
//! are wall-clock times on this machine. `PGOP_BENCH_DIR` chooses the scratch directory
//! (default: the system temp directory; it needs about 5x the database size).

use pgop_backup::{PgTools, RestoreOptions, Source, Store, StoreConfig, TakeOptions, Target};
use pgop_instance::{Archiving, Binaries, Credentials, Instance, Layout, Options, RunAs};
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const SEGMENT: u64 = 16 * 1024 * 1024;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn size(bytes: u64) -> String {
    if bytes >= 1_000_000_000 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.1} MB", mb(bytes))
    }
}

fn rate(bytes: u64, d: Duration) -> String {
    format!("{:.1} MB/s", mb(bytes) / d.as_secs_f64().max(1e-9))
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// CPU time (user + system) of this process, all threads.
fn cpu_self() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn run_as() -> Option<RunAs> {
    RunAs::when_root("postgres").expect("the postgres OS user")
}

fn make_dir(path: &Path) -> Result {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(path)?;
    if let Some(user) = run_as() {
        user.chown(path)?;
    }
    Ok(())
}

/// Total size of the files under `path`.
fn du(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(path)
            .map(|entries| entries.flatten().map(|e| du(&e.path())).sum())
            .unwrap_or(0)
    } else {
        meta.len()
    }
}

/// The scratch directory, removed on drop (also when the bench fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A PostgreSQL 15 program run as PostgreSQL's OS user against the benchmark's server.
fn pg_command(bin: &Path, program: &str, socket_dir: &Path, port: u16) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin.join(program));
    if let Some(user) = run_as() {
        cmd.uid(user.uid).gid(user.gid);
    }
    cmd.env("LC_ALL", "C")
        .env("PGHOST", socket_dir)
        .env("PGPORT", port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "app")
        .current_dir("/")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn run(mut cmd: tokio::process::Command, what: &str) -> Result<Duration> {
    let started = Instant::now();
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(started.elapsed())
}

/// A WAL file name's segment number (`None` for history files and other names).
fn segno(name: &str) -> Option<u64> {
    let hex = name.get(..24)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let log = u64::from_str_radix(&hex[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&hex[16..24], 16).ok()?;
    Some(log * (0x1_0000_0000 / SEGMENT) + seg)
}

/// One look at the archiver.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// pg_current_wal_lsn() in bytes.
    lsn: u64,
    current_seg: u64,
    last_archived_seg: Option<u64>,
    failed: i64,
}

impl Sample {
    /// Completed segments not yet archived.
    fn lag_segments(&self) -> u64 {
        let archived = self.last_archived_seg.map_or(0, |s| s + 1);
        self.current_seg.saturating_sub(archived)
    }

    /// WAL written after the end of the last archived segment (the segment being written
    /// included).
    fn lag_bytes(&self) -> u64 {
        let archived_end = self.last_archived_seg.map_or(0, |s| (s + 1) * SEGMENT);
        self.lsn.saturating_sub(archived_end)
    }
}

async fn sample(client: &tokio_postgres::Client) -> Result<Sample> {
    let row = client
        .query_one(
            "SELECT pg_walfile_name(pg_current_wal_lsn()),
                    (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,
                    coalesce(last_archived_wal, ''), failed_count
               FROM pg_stat_archiver",
            &[],
        )
        .await?;
    let current: String = row.get(0);
    let lsn: i64 = row.get(1);
    let last: String = row.get(2);
    Ok(Sample {
        lsn: u64::try_from(lsn).unwrap_or(0),
        current_seg: segno(&current).ok_or("pg_walfile_name")?,
        last_archived_seg: segno(&last),
        failed: row.get(3),
    })
}

/// Switches WAL and waits until everything written so far is archived; returns how long.
async fn drain(client: &tokio_postgres::Client, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    let row = client
        .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
        .await?;
    let target = segno(&row.get::<_, String>(0)).ok_or("pg_switch_wal")?;
    loop {
        let s = sample(client).await?;
        if s.last_archived_seg.is_some_and(|a| a >= target) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            return Err(format!("WAL not archived within {timeout:?}: {s:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn segments(n: u64) -> String {
    format!("{n} segment{}", if n == 1 { "" } else { "s" })
}

fn median(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result {
    let scale = env_u64("PGOP_BENCH_BACKUP_SCALE", 70);
    let load_secs = env_u64("PGOP_BENCH_BACKUP_DURATION", 60);
    let base = std::env::var_os("PGOP_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let scratch = Scratch(base.join(format!("pgop-bench-backup-{}", std::process::id())));
    let dir = scratch.0.clone();
    let _ = std::fs::remove_dir_all(&dir);
    make_dir(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;

    let binaries = Binaries::locate(None)?;
    let bin = binaries.dir().to_path_buf();
    let owner = run_as().map(|u| (u.uid, u.gid));
    let tools = PgTools {
        bin_dir: bin.clone(),
        run_as: owner,
    };

    // The pgop binary, where PostgreSQL's OS user may run it.
    let pgop = {
        let bin_dir = dir.join("bin");
        std::fs::create_dir_all(&bin_dir)?;
        std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755))?;
        let target = bin_dir.join("pgop");
        std::fs::copy(env!("CARGO_BIN_EXE_pgop"), &target)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
        target
    };

    let s3 = S3Server::start(&dir)?;
    let config = StoreConfig {
        format: pgop_backup::config::CONFIG_FORMAT,
        location: pgop_backup::Location::S3(pgop_backup::S3Location {
            bucket: BUCKET.into(),
            endpoint: Some(s3.endpoint()),
            region: Some("us-east-1".into()),
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: SECRET_KEY.into(),
            insecure_skip_tls_verify: false,
        }),
        prefix: Some("bench".into()),
        cluster: "bench".into(),
    };

    // The primary, archiving into the store as the instance manager sets it up.
    let socket_dir = dir.join("run");
    make_dir(&socket_dir)?;
    make_dir(&dir.join("data"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let instance = Instance::new(Options {
        layout: Layout {
            instance: "bench-1".into(),
            cluster: "bench".into(),
            pgdata: dir.join("data/pgdata"),
            listen_addresses: "127.0.0.1".into(),
            port,
            socket_dir: socket_dir.clone(),
            wal_dir: None,
        },
        binaries,
        run_as: run_as(),
        credentials: Credentials {
            app_user: "app".into(),
            app_password: "app-secret".into(),
            app_database: "app".into(),
            replication_user: "streaming_replica".into(),
            replication_password: "repl-secret".into(),
        },
        stop_timeout: Duration::from_secs(30),
        start_timeout: Duration::from_secs(60),
        forward_logs: std::env::var_os("PGOP_TEST_LOGS").is_some(),
        restart_crashed_primary: false,
    });
    instance.set_archiving(Some(Archiving {
        store: config.clone(),
        pgop_binary: pgop.clone(),
    }));
    instance.bootstrap_primary().await?;
    let ctx = Bench {
        instance: &instance,
        config: &config,
        tools: &tools,
        bin: &bin,
        dir: &dir,
        socket_dir: &socket_dir,
        port,
        pgop: &pgop,
        scale,
        load_secs,
    };
    let result = bench(&ctx).await;
    let _ = instance.stop().await;
    drop(s3);
    drop(scratch);
    result
}

struct Bench<'a> {
    instance: &'a Instance,
    config: &'a StoreConfig,
    tools: &'a PgTools,
    bin: &'a Path,
    dir: &'a Path,
    socket_dir: &'a Path,
    port: u16,
    pgop: &'a Path,
    scale: u64,
    load_secs: u64,
}

async fn bench(ctx: &Bench<'_>) -> Result {
    let &Bench {
        instance,
        config,
        tools,
        bin,
        dir,
        socket_dir,
        port,
        pgop,
        scale,
        load_secs,
    } = ctx;
    let client = instance.endpoint().connect_to("app").await?;
    let pg = |program: &str| pg_command(bin, program, socket_dir, port);
    let mut rows: Vec<[String; 5]> = Vec::new();
    let row = |what: &str, time: String, rate: String, size: String, note: String| {
        [what.to_string(), time, rate, size, note]
    };

    // 1. The database.
    eprintln!("generating: pgbench -i -s {scale} ...");
    let mut init = pg("pgbench");
    init.args(["-i", "-q", "-s", &scale.to_string()]);
    let generated = run(init, "pgbench -i").await?;
    let db_bytes: i64 = client
        .query_one("SELECT pg_database_size('app')", &[])
        .await?
        .get(0);
    let db_bytes = u64::try_from(db_bytes).unwrap_or(0);
    eprintln!("waiting for the archive to catch up ...");
    let catch_up = drain(&client, Duration::from_secs(3600)).await?;
    rows.push(row(
        &format!("`pgbench -i -s {scale}` (database `app`)"),
        secs(generated),
        rate(db_bytes, generated),
        size(db_bytes),
        format!("archiving caught up {} after it ended", secs(catch_up)),
    ));

    // 2. pg_basebackup to local disk.
    let fp_dir = dir.join("fp");
    eprintln!("pg_basebackup -Fp ...");
    let mut fp = pg("pg_basebackup");
    fp.arg("-D")
        .arg(&fp_dir)
        .args(["-Fp", "-X", "none", "--checkpoint=fast", "--no-password"]);
    let fp_time = run(fp, "pg_basebackup -Fp").await?;
    let cluster_bytes = du(&fp_dir);
    std::fs::remove_dir_all(&fp_dir)?;
    rows.push(row(
        "`pg_basebackup -Fp -X none` → local disk",
        secs(fp_time),
        rate(cluster_bytes, fp_time),
        size(cluster_bytes),
        "plain copy of the data directory (fsync'd)".into(),
    ));

    let tar_to_null = {
        eprintln!("pg_basebackup -Ft -D - > /dev/null ...");
        let mut cmd = pg("pg_basebackup");
        cmd.args([
            "-D",
            "-",
            "-Ft",
            "-X",
            "none",
            "--checkpoint=fast",
            "--no-password",
        ]);
        cmd.stdout(std::fs::File::create("/dev/null")?);
        let started = Instant::now();
        let out = cmd.stderr(Stdio::piped()).output().await?;
        if !out.status.success() {
            return Err(format!(
                "pg_basebackup to /dev/null: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        started.elapsed()
    };
    rows.push(row(
        "`pg_basebackup -Ft -D -` → /dev/null",
        secs(tar_to_null),
        rate(cluster_bytes, tar_to_null),
        "—".into(),
        "reading the source: the floor for any tar-based backup".into(),
    ));

    let mut gz_runs = Vec::new();
    for (label, compress) in [
        ("`pg_basebackup -Ft -z -X none` → local disk", "-z"),
        (
            "`pg_basebackup -Ft --compress=client-gzip:1` → local disk",
            "--compress=client-gzip:1",
        ),
    ] {
        let out_dir = dir.join("ft");
        eprintln!("pg_basebackup -Ft {compress} ...");
        let mut cmd = pg("pg_basebackup");
        cmd.arg("-D").arg(&out_dir).args([
            "-Ft",
            compress,
            "-X",
            "none",
            "--checkpoint=fast",
            "--no-password",
        ]);
        let t = run(cmd, label).await?;
        let stored = du(&out_dir);
        std::fs::remove_dir_all(&out_dir)?;
        rows.push(row(
            label,
            secs(t),
            rate(cluster_bytes, t),
            size(stored),
            format!(
                "{:.1}x smaller",
                cluster_bytes as f64 / stored.max(1) as f64
            ),
        ));
        gz_runs.push((t, stored));
    }

    // 3. pgop's base backup into s3s-fs.
    eprintln!("pgop base backup ...");
    let store = Store::open(config)?;
    let cpu = cpu_self();
    let started = Instant::now();
    let manifest = pgop_backup::base::take(
        &store,
        tools,
        &Source {
            socket_dir: socket_dir.to_path_buf(),
            port,
        },
        &config.cluster,
        &TakeOptions {
            wait_for_wal: Duration::from_secs(600),
        },
    )
    .await?;
    let take_time = started.elapsed();
    let take_cpu = cpu_self().saturating_sub(cpu);
    rows.push(row(
        "pgop base backup → s3s-fs (`base::take`)",
        secs(take_time),
        rate(cluster_bytes, take_time),
        size(manifest.stored_bytes),
        format!(
            "tar {}, {:.1}x smaller; pgop CPU {} (gzip level 1, SHA-256 ×2, upload)",
            size(manifest.size_bytes),
            manifest.size_bytes as f64 / manifest.stored_bytes.max(1) as f64,
            secs(take_cpu)
        ),
    ));

    // 4. pgop's restore from s3s-fs to the end of the WAL.
    eprintln!("pgop restore ...");
    let restore_dir = dir.join("restored");
    make_dir(&restore_dir)?;
    let pgdata = restore_dir.join("pgdata");
    let cpu = cpu_self();
    let started = Instant::now();
    let restored = pgop_backup::restore::restore(
        config,
        tools,
        &pgdata,
        &RestoreOptions {
            backup_id: Some(manifest.backup_id.clone()),
            target: Target::EndOfWal,
            pgop_binary: pgop.to_path_buf(),
            store_config_file: dir.join("restore-store.json"),
            timeout: Duration::from_secs(3600),
            socket_dir: None,
        },
    )
    .await?;
    let restore_time = started.elapsed();
    let restore_cpu = cpu_self().saturating_sub(cpu);
    let restored_bytes = du(&pgdata);
    std::fs::remove_dir_all(&restore_dir)?;
    rows.push(row(
        "pgop restore ← s3s-fs, to the end of WAL (`restore::restore`)",
        secs(restore_time),
        rate(cluster_bytes, restore_time),
        size(restored_bytes),
        format!(
            "download + verify + gunzip + untar, recovery, promotion (timeline {}), checkpoint; pgop CPU {}",
            restored.timeline,
            secs(restore_cpu)
        ),
    ));

    // 5. WAL archive lag under load.
    eprintln!("pgbench -T {load_secs} -c 4 -j 2, sampling the archiver ...");
    let before = sample(&client).await?;
    let mut load = pg("pgbench");
    load.args(["-T", &load_secs.to_string(), "-c", "4", "-j", "2", "-n"]);
    let mut load = load.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let status = loop {
        tokio::select! {
            status = load.wait() => break status?,
            _ = ticker.tick() => samples.push(sample(&client).await?),
        }
    };
    let load_time = started.elapsed();
    let mut out = String::new();
    if let Some(mut stdout) = load.stdout.take() {
        use tokio::io::AsyncReadExt;
        stdout.read_to_string(&mut out).await?;
    }
    if !status.success() {
        return Err(format!("pgbench failed ({status}): {out}").into());
    }
    let tps = out
        .lines()
        .find(|l| l.starts_with("tps"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|t| t.parse::<f64>().ok())
        .map_or_else(|| "?".to_string(), |t| format!("{t:.0}"));
    let after = sample(&client).await?;
    let drain_time = drain(&client, Duration::from_secs(3600)).await?;
    let lag_segs: Vec<u64> = samples.iter().map(Sample::lag_segments).collect();
    let lag_bytes: Vec<u64> = samples.iter().map(Sample::lag_bytes).collect();
    let generated_wal = after.lsn.saturating_sub(before.lsn);
    let archived_wal = after
        .last_archived_seg
        .zip(before.last_archived_seg)
        .map_or(0, |(a, b)| a.saturating_sub(b) * SEGMENT);
    let failed = after.failed - before.failed;
    rows.push(row(
        &format!("`pgbench -T {load_secs} -c 4 -j 2` with archiving on"),
        secs(load_time),
        format!(
            "{} WAL, {} archived",
            rate(generated_wal, load_time),
            rate(archived_wal, load_time)
        ),
        format!("{} WAL", size(generated_wal)),
        format!(
            "{tps} tps; {} archived during the run, {} failures",
            size(archived_wal),
            failed
        ),
    ));
    rows.push(row(
        "WAL archive lag under that load (sampled every 1 s)",
        "—".into(),
        "—".into(),
        "—".into(),
        format!(
            "median {} ({}), max {} ({}); {} samples; the rest archived {} after the load ended",
            segments(median(&lag_segs)),
            size(median(&lag_bytes)),
            segments(lag_segs.iter().max().copied().unwrap_or(0)),
            size(lag_bytes.iter().max().copied().unwrap_or(0)),
            samples.len(),
            secs(drain_time)
        ),
    ));

    // The table.
    let [fp_time, gz6, gz1] = [fp_time, gz_runs[0].0, gz_runs[1].0].map(|d| d.as_secs_f64());
    println!();
    println!(
        "Database cluster {} (`pg_basebackup -Fp` output; database `app` {}), PostgreSQL 15, \
         scale {scale}, {} cores",
        size(cluster_bytes),
        size(db_bytes),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!("| step | time | throughput | size | notes |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!("| {} |", r.join(" | "));
    }
    println!();
    let take = take_time.as_secs_f64();
    println!("| ratio | value |");
    println!("|---|---|");
    println!(
        "| pgop backup time / `pg_basebackup -Ft -z` time | {:.2} |",
        take / gz6
    );
    println!(
        "| pgop backup time / `pg_basebackup -Ft --compress=client-gzip:1` time | {:.2} |",
        take / gz1
    );
    println!(
        "| pgop backup time / `pg_basebackup -Fp` time | {:.2} |",
        take / fp_time
    );
    println!(
        "| pgop stored size / `-Ft -z` size | {:.2} |",
        manifest.stored_bytes as f64 / gz_runs[0].1.max(1) as f64
    );
    println!(
        "| pgop stored size / `-Ft --compress=client-gzip:1` size | {:.2} |",
        manifest.stored_bytes as f64 / gz_runs[1].1.max(1) as f64
    );
    println!(
        "| pgop restore time / pgop backup time | {:.2} |",
        restore_time.as_secs_f64() / take
    );
    println!(
        "| WAL archived / WAL generated during the load | {:.2} |",
        archived_wal as f64 / generated_wal.max(1) as f64
    );
    Ok(())
}
