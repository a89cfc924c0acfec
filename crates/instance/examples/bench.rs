//! Times the instance manager's slow paths against real PostgreSQL on this machine:
//! bootstrap of a primary, clone of a standby (small database), promotion (kill -9 of the
//! primary to the first write on the promoted standby) and rejoin (pg_rewind of the old
//! primary until it streams again).
//!
//! `cargo run --release -p pgop-instance --example bench [-- ROUNDS]` (as root, PostgreSQL
//! runs as the `postgres` OS user; PGOP_PG_BIN picks the binaries).

use pgop_instance::{Binaries, Credentials, Instance, Layout, Options, PgRole, Rejoin, RunAs};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Node {
    instance: Arc<Instance>,
    port: u16,
    dir: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(pid) = self.instance.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn make_dir(path: &Path, run_as: Option<RunAs>) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(path)?;
    if let Some(user) = run_as {
        user.chown(path)?;
    }
    Ok(())
}

fn node(name: &str, binaries: &Binaries, run_as: Option<RunAs>) -> Result<Node, Error> {
    let dir = std::env::temp_dir().join(format!("pgop-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in [&dir, &dir.join("data"), &dir.join("run")] {
        make_dir(d, run_as)?;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let instance = Instance::new(Options {
        layout: Layout {
            instance: name.to_string(),
            cluster: "bench".into(),
            pgdata: dir.join("data/pgdata"),
            listen_addresses: "127.0.0.1".into(),
            port,
            socket_dir: dir.join("run"),
            wal_dir: None,
        },
        binaries: binaries.clone(),
        run_as,
        credentials: Credentials {
            app_user: "app".into(),
            app_password: "app".into(),
            app_database: "app".into(),
            replication_user: "streaming_replica".into(),
            replication_password: "replica".into(),
        },
        stop_timeout: Duration::from_secs(10),
        start_timeout: Duration::from_secs(60),
        forward_logs: false,
        restart_crashed_primary: true,
    });
    Ok(Node {
        instance: Arc::new(instance),
        port,
        dir,
    })
}

async fn wait_streaming(node: &Node) {
    loop {
        let s = node.instance.status().await;
        if s.role == PgRole::Replica && s.streaming {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Default)]
struct Times {
    bootstrap: Vec<Duration>,
    clone: Vec<Duration>,
    promote: Vec<Duration>,
    rejoin: Vec<Duration>,
}

async fn round(binaries: &Binaries, run_as: Option<RunAs>, times: &mut Times) -> Result<(), Error> {
    let primary = node("bench-1", binaries, run_as)?;
    let standby = node("bench-2", binaries, run_as)?;

    let t = Instant::now();
    primary.instance.bootstrap_primary().await?;
    times.bootstrap.push(t.elapsed());

    let client = primary.instance.endpoint().connect_to("app").await?;
    // About 15 MB: "a small database".
    client
        .batch_execute(
            "CREATE TABLE t AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 200000) g",
        )
        .await?;
    primary
        .instance
        .ensure_slots(&["bench-2".to_string()])
        .await?;
    let t = Instant::now();
    standby
        .instance
        .bootstrap_standby(&primary.instance.as_upstream("127.0.0.1"))
        .await?;
    wait_streaming(&standby).await;
    times.clone.push(t.elapsed());

    let t = Instant::now();
    primary.instance.kill().await?;
    let killed = t.elapsed();
    standby.instance.promote().await?;
    let promoted = t.elapsed();
    standby
        .instance
        .endpoint()
        .connect_to("app")
        .await?
        .batch_execute("INSERT INTO t VALUES (0, 'after failover')")
        .await?;
    times.promote.push(t.elapsed());
    if std::env::var_os("PGOP_BENCH_DETAIL").is_some() {
        eprintln!(
            "killed after {killed:?}, promoted after {promoted:?}, written after {:?}",
            t.elapsed()
        );
    }

    standby
        .instance
        .ensure_slots(&["bench-1".to_string()])
        .await?;
    let t = Instant::now();
    let how = primary
        .instance
        .demote(&standby.instance.as_upstream("127.0.0.1"))
        .await?;
    wait_streaming(&primary).await;
    times.rejoin.push(t.elapsed());
    if how != Rejoin::Rewound {
        eprintln!("note: the old primary was recloned, not rewound");
    }
    let _ = (primary.port, standby.port);
    Ok(())
}

fn row(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let (Some(min), Some(max)) = (samples.first(), samples.last()) else {
        return;
    };
    println!(
        "| {what:<40} | {:>9} | {:>9} | {:>9} |",
        ms(*min),
        ms(samples[samples.len() / 2]),
        ms(*max)
    );
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let binaries = Binaries::locate(None)?;
    let run_as = RunAs::when_root("postgres")?;
    let mut times = Times::default();
    for _ in 0..rounds {
        round(&binaries, run_as, &mut times).await?;
    }
    println!(
        "PostgreSQL binaries: {}; {rounds} rounds",
        binaries.dir().display()
    );
    println!(
        "| {:<40} | {:>9} | {:>9} | {:>9} |",
        "step", "min", "median", "max"
    );
    println!("|{:-<42}|{:-<11}|{:-<11}|{:-<11}|", "", "", "", "");
    row("bootstrap a primary (initdb, roles)", &mut times.bootstrap);
    row("clone a standby (15 MB) until streaming", &mut times.clone);
    row("promotion: kill -9 to first write", &mut times.promote);
    row("rejoin: pg_rewind until streaming", &mut times.rejoin);
    Ok(())
}
