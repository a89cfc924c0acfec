//! The PostgreSQL client helpers of the e2e tests: connections over TLS to an instance by
//! its Pod IP (`connect`, `connect_within`, `connect_to`) or verifying the server
//! (`connect_verified`), the postmasters' start times, row counts and waits for them, and
//! writes through `<cluster>-rw` (`write_through_rw`, and `Writer`, which records every
//! commit PostgreSQL acknowledged).

use super::{Env, Result, TIMEOUT};
use pgop_testenv::wait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub async fn connect(host: &str, password: &str) -> Result<tokio_postgres::Client> {
    connect_within(host, password, Duration::from_secs(5)).await
}

pub async fn connect_within(
    host: &str,
    password: &str,
    timeout: Duration,
) -> Result<tokio_postgres::Client> {
    connect_to(host, "app", "app", password, timeout).await
}

/// Connects to `dbname` on `host` as `user`, over TLS (PostgreSQL refuses plaintext), as
/// `sslmode=require`: these tests connect by Pod IP and check data, not the server's
/// identity (the TLS tests do).
pub async fn connect_to(
    host: &str,
    dbname: &str,
    user: &str,
    password: &str,
    timeout: Duration,
) -> Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::Config::new()
        .host(host)
        .port(5432)
        .user(user)
        .dbname(dbname)
        .password(password)
        .connect_timeout(timeout)
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect(pgop_tls::postgres::PostgresTls::without_verification()?)
        .await?;
    tokio::spawn(conn);
    Ok(client)
}

/// When the postmaster behind `c` started, in seconds since the epoch.
pub async fn postmaster_started(c: &tokio_postgres::Client) -> Result<f64> {
    Ok(c.query_one(
        "select extract(epoch from pg_postmaster_start_time())::float8",
        &[],
    )
    .await?
    .get(0))
}

/// Every instance's postmaster start time (epoch seconds), by instance.
pub async fn start_times(
    env: &Env,
    cluster: &str,
    password: &str,
) -> Result<std::collections::BTreeMap<String, f64>> {
    let mut out = std::collections::BTreeMap::new();
    for (name, ip) in env.pod_ips(cluster).await? {
        out.insert(
            name,
            postmaster_started(&connect(&ip, password).await?).await?,
        );
    }
    Ok(out)
}

pub async fn count_on(host: &str, password: &str, table: &str) -> Result<i64> {
    let c = connect(host, password).await?;
    Ok(c.query_one(&format!("select count(*) from {table}"), &[])
        .await?
        .get(0))
}

/// Waits until the instance at `ip` holds `rows` rows of `table`.
pub async fn wait_rows(name: &str, ip: &str, password: &str, table: &str, rows: i64) -> Result {
    wait::until(&format!("{rows} rows on {name}"), TIMEOUT, || async {
        match count_on(ip, password, table).await {
            Ok(n) if n == rows => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// Runs `sql` through `-rw` until it succeeds (a new connection each try, as a client
/// after a failover would); returns how long it took.
pub async fn write_through_rw(
    env: &Env,
    name: &str,
    password: &str,
    sql: &str,
) -> Result<Duration> {
    let started = std::time::Instant::now();
    let deadline = started + TIMEOUT;
    loop {
        if let Some(rw) = env.rw(name)
            && let Ok(c) = connect_within(&rw, password, Duration::from_millis(500)).await
            && c.batch_execute(sql).await.is_ok()
        {
            return Ok(started.elapsed());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("no write through {name}-rw within {TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A writer through `-rw` that records every commit PostgreSQL acknowledged.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(i64, std::time::Instant)>>,
}

impl Writer {
    /// Starts committing `insert into acked(id)` through `<cluster>-rw`, reconnecting to
    /// wherever it resolves after a failure.
    pub fn start(env: &Env, cluster: &str, password: &str) -> Self {
        let hosts = env.node.hosts_file().to_path_buf();
        let name = format!("{cluster}-rw.{}.svc", env.n());
        let rw = move || pgop_testenv::node::resolve_host(&hosts, &name);
        let password = password.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut next = 1i64;
            while !flag.load(Ordering::Relaxed) {
                let Some(host) = rw() else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let Ok(c) = connect_within(&host, &password, Duration::from_millis(500)).await
                else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                while !flag.load(Ordering::Relaxed) {
                    let id = next;
                    next += 1;
                    let sql = "insert into acked(id) values ($1)";
                    match tokio::time::timeout(Duration::from_secs(5), c.execute(sql, &[&id])).await
                    {
                        Ok(Ok(1)) => acked.push((id, std::time::Instant::now())),
                        _ => break,
                    }
                }
            }
            acked
        });
        Self { stop, task }
    }

    /// Stops writing; every id PostgreSQL acknowledged.
    pub async fn stop(self) -> Result<Vec<i64>> {
        Ok(self.stop_timed().await?.0)
    }

    /// Stops writing; every id PostgreSQL acknowledged, and the longest time without an
    /// acknowledged commit once the first one was (between two, or from the last to the
    /// stop). `None` when nothing was acknowledged.
    /// Stops the writer; every acknowledged id with when its commit returned.
    pub async fn stop_with_times(self) -> Result<Vec<(i64, std::time::Instant)>> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.task.await?)
    }

    pub async fn stop_timed(self) -> Result<(Vec<i64>, Option<Duration>)> {
        self.stop.store(true, Ordering::Relaxed);
        let stopped = std::time::Instant::now();
        let acked = self.task.await?;
        let longest = acked.first().map(|(_, first)| {
            let mut longest = Duration::ZERO;
            let mut last = *first;
            for (_, at) in &acked {
                longest = longest.max(at.duration_since(last));
                last = *at;
            }
            longest.max(stopped.saturating_duration_since(last))
        });
        Ok((acked.into_iter().map(|(id, _)| id).collect(), longest))
    }
}

/// A connection as `user` to `dbname` at `host:port` over TLS, verifying the server as
/// `sslmode=verify-full` against `ca_pem` under `server_name`.
pub async fn connect_verified(
    host: &str,
    port: u16,
    (user, password, dbname): (&str, &str, &str),
    ca_pem: &str,
    server_name: &str,
) -> std::result::Result<tokio_postgres::Client, tokio_postgres::Error> {
    let tls = pgop_tls::postgres::PostgresTls::verify_full(ca_pem, None)
        .and_then(|t| t.server_name(server_name))
        .expect("a TLS configuration");
    let mut config = tokio_postgres::Config::new();
    config
        .host(host)
        .port(port)
        .user(user)
        .password(password)
        .dbname(dbname)
        .connect_timeout(Duration::from_secs(5));
    pgop_tls::postgres::connect(&mut config, Some(tls)).await
}
