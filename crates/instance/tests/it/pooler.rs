//! The pooler manager's PgBouncer against real PostgreSQL 15 servers (no Kubernetes):
//! PostgreSQL runs as the instance manager runs it (TLS from the cluster's authority,
//! `hostnossl` rejected, scram-sha-256), and PgBouncer as `pgop pooler run` runs it, through
//! [`Pooler`]: files written, PgBouncer started, reloaded and restarted, its admin console
//! read. Each test has its own servers, ports and directories, and leaves no process
//! behind (dropping a server or a pooler kills its process).
//!
//! Why this file stays whole: it is the scenarios of one subject, the pooler's PgBouncer in
//! front of real PostgreSQL, each on the same fixtures (`pki`, `Server`, `Bouncer`,
//! `desired`).

use crate::postgres::common::{TempDir, TestResult, eventually, free_port, options, run_as};
use crate::tls::server_tls;
use pgop_api::pooler::PoolMode;
use pgop_instance::pooler::config::{Desired, Layout, Sourced, Tls};
use pgop_instance::pooler::process::State;
use pgop_instance::pooler::{Applied, NotReady, Options, Pooler};
use pgop_instance::{Credentials, Instance};
use pgop_tls::postgres::PostgresTls;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Generous: PostgreSQL starts and PgBouncer restarts on machines as small and as loaded
/// as CI's.
const WAIT: Duration = Duration::from_secs(60);

/// The application owner's password: everything PgBouncer's auth file must quote.
const APP_PASSWORD: &str = r#"p"a ss=#$(id)`x`\;'"#;

const CLUSTER: &str = "it";
/// The name clients verify in the certificate PgBouncer serves (the pooler Service's).
const POOLER_SERVICE: &str = "it-pooler-rw";

fn credentials() -> Credentials {
    Credentials {
        app_user: "app".into(),
        app_password: APP_PASSWORD.into(),
        app_database: "app".into(),
        replication_user: "streaming_replica".into(),
        replication_password: "unused".into(),
    }
}

/// The cluster's PostgreSQL authority and the certificates it issued, as the operator
/// issues them: one server certificate naming `<cluster>-rw` and the pooler Service.
struct Pki {
    ca: String,
    server: pgop_tls::Issued,
    replication: pgop_tls::Issued,
}

fn pki() -> Pki {
    let now = jiff::Timestamp::now();
    let ca = pgop_tls::Authority::generate_postgres(now).expect("an authority");
    let names = [format!("{CLUSTER}-rw"), POOLER_SERVICE.to_string()];
    Pki {
        server: ca
            .issue_postgres_server(&names, now, 2)
            .expect("a server certificate"),
        replication: ca
            .issue_postgres_client("streaming_replica", now, 2)
            .expect("a client certificate"),
        ca: ca.cert_pem().to_string(),
    }
}

/// A PostgreSQL 15 primary on `addr:port` that takes TCP connections over TLS only.
struct Server {
    instance: Arc<Instance>,
    addr: IpAddr,
    port: u16,
    _dir: TempDir,
}

impl Server {
    async fn start(name: &str, addr: &str, port: u16, pki: &Pki) -> Self {
        let dir = TempDir::new(name);
        let instance = Arc::new(Instance::new(pgop_instance::Options {
            start_timeout: WAIT,
            ..options(name, &dir, addr, port, credentials())
        }));
        instance
            .set_tls(server_tls(
                &pki.ca,
                &pki.server,
                &pki.replication,
                &format!("{CLUSTER}-rw"),
            ))
            .expect("TLS files written");
        instance
            .bootstrap_primary()
            .await
            .expect("PostgreSQL bootstrapped");
        Self {
            instance,
            addr: addr.parse().expect("an address"),
            port,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = self.instance.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// A PgBouncer run as the manager runs it, on a free loopback port, killed on drop.
struct Bouncer {
    pooler: Arc<Pooler>,
    port: u16,
    _dir: TempDir,
}

impl Bouncer {
    /// A pooler whose stop lets transactions under way finish for 2 s.
    fn new(name: &str) -> Self {
        Self::draining_for(name, Duration::from_secs(2))
    }

    fn draining_for(name: &str, drain_timeout: Duration) -> Self {
        let dir = TempDir::new(name);
        let port = free_port();
        let pooler = Pooler::new(Options {
            cluster: CLUSTER.into(),
            pooler: "rw".into(),
            layout: Layout {
                dir: dir.0.join("run"),
                listen: "127.0.0.1".parse().expect("an address"),
                port,
            },
            pgbouncer: "/usr/sbin/pgbouncer".into(),
            run_as: run_as(),
            drain_timeout,
            stop_timeout: Duration::from_secs(5),
        })
        .expect("a pooler");
        Self {
            pooler: Arc::new(pooler),
            port,
            _dir: dir,
        }
    }

    /// Waits for PgBouncer to be up with an admin console that answers and a target.
    async fn ready(&self) {
        eventually("the pooler ready", WAIT, || async {
            self.pooler.readiness().await.ok()
        })
        .await;
    }

    fn pid(&self) -> Option<u32> {
        self.pooler.state().pid()
    }

    /// A client of PgBouncer over TLS, verifying the pooler Service's name.
    async fn client(
        &self,
        pki: &Pki,
        password: &str,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let tls = PostgresTls::verify_full(&pki.ca, None)
            .and_then(|t| t.server_name(POOLER_SERVICE))
            .expect("a TLS client");
        pgop_tls::postgres::connect(&mut self.config(password), Some(tls)).await
    }

    /// A client of PgBouncer over TLS as `user` in database `dbname`.
    async fn client_as(
        &self,
        pki: &Pki,
        user: &str,
        password: &str,
        dbname: &str,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let tls = PostgresTls::verify_full(&pki.ca, None)
            .and_then(|t| t.server_name(POOLER_SERVICE))
            .expect("a TLS client");
        let mut config = self.config(password);
        config.user(user).dbname(dbname);
        pgop_tls::postgres::connect(&mut config, Some(tls)).await
    }

    fn config(&self, password: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("app")
            .password(password)
            .dbname("app")
            .connect_timeout(Duration::from_secs(10));
        config
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: as above; PgBouncer leads its own process group.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The configuration a pooler of `mode` gets for `servers` (all on one port).
fn desired(pki: &Pki, servers: &[&Server], mode: PoolMode) -> Desired {
    let secret = |value: &str, key: &str| Sourced::from_secret(value, "it-server-tls", key);
    Desired {
        targets: servers.iter().map(|s| s.addr).collect(),
        server_port: servers.first().map_or(5432, |s| s.port),
        pool_mode: mode,
        max_client_connections: 100,
        default_pool_size: 10,
        app_user: Sourced::from_secret("app", "it-app", "username"),
        app_password: Sourced::from_secret(APP_PASSWORD, "it-app", "password"),
        auth_password: None,
        tls: Tls {
            cert: secret(&pki.server.cert_pem, "tls.crt"),
            key: secret(&pki.server.key_pem, "tls.key"),
            ca: secret(&pki.ca, "ca.crt"),
        },
    }
}

/// The address of the server a query of `client` ran on.
async fn server_of(client: &tokio_postgres::Client) -> Result<String, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT host(inet_server_addr())", &[])
        .await?;
    row.try_get(0)
}

/// A port free on both 127.0.0.1 and 127.0.0.2 (two servers, one port, as Pods have).
fn port_free_on_both() -> u16 {
    for _ in 0..100 {
        let port = free_port();
        if std::net::TcpListener::bind(("127.0.0.2", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// GET `path` of the pooler's HTTP server: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("receive");
    let code = response
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The value of the series `series` (name and labels, exactly) in `metrics`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_get_in_over_tls_with_the_app_password_and_no_other_way() -> TestResult {
    let pki = pki();
    let server = Server::start("pooler-auth", "127.0.0.1", free_port(), &pki).await;
    let bouncer = Bouncer::new("pooler-auth-pgb");
    // PostgreSQL itself refuses a client without TLS: the pooler must use TLS too.
    let plain = pgop_tls::postgres::connect(
        tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(server.port)
            .user("app")
            .password(APP_PASSWORD)
            .dbname("app"),
        None,
    )
    .await;
    assert!(plain.is_err(), "PostgreSQL accepted a client without TLS");

    assert_eq!(
        bouncer
            .pooler
            .apply(&desired(&pki, &[&server], PoolMode::Transaction))?,
        Applied::Started
    );
    bouncer.ready().await;
    let client = bouncer.client(&pki, APP_PASSWORD).await?;
    client
        .batch_execute("CREATE TABLE t (id int); INSERT INTO t VALUES (1), (2)")
        .await?;
    let row = client
        .query_one("SELECT count(*), current_user FROM t", &[])
        .await?;
    assert_eq!(row.try_get::<_, i64>(0)?, 2);
    assert_eq!(row.try_get::<_, String>(1)?, "app");
    assert_eq!(
        client
            .query_one("SELECT inet_server_port()", &[])
            .await?
            .try_get::<_, i32>(0)?,
        i32::from(server.port),
        "the query ran on the target"
    );
    // Extended protocol statements are fine in transaction mode (unnamed).
    let n: i32 = client
        .query_one("SELECT $1::int + 1", &[&41])
        .await?
        .try_get(0)?;
    assert_eq!(n, 42);

    let wrong = bouncer.client(&pki, "not-the-password").await;
    let err = wrong
        .err()
        .map(|e| pgop_instance::error_chain(&e))
        .unwrap_or_default();
    assert!(
        err.contains("authentication failed"),
        "a wrong password must be refused, got {err:?}"
    );
    let without_tls = pgop_tls::postgres::connect(&mut bouncer.config(APP_PASSWORD), None).await;
    let err = without_tls
        .err()
        .map(|e| pgop_instance::error_chain(&e))
        .unwrap_or_default();
    assert!(
        err.contains("SSL required"),
        "a client without TLS must be refused, got {err:?}"
    );
    // The stats user is for the manager's admin console only: never a way to the servers.
    let mut stats = bouncer.config("x");
    stats.user(pgop_instance::pooler::config::STATS_USER);
    let tls = PostgresTls::without_verification()?;
    assert!(
        pgop_tls::postgres::connect(&mut stats, Some(tls))
            .await
            .is_err()
    );
    // Still usable after the refusals.
    assert_eq!(server_of(&client).await?, "127.0.0.1");
    bouncer.pooler.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_count_the_pooled_client_and_server_connections() -> TestResult {
    let pki = pki();
    let server = Server::start("pooler-metrics", "127.0.0.1", free_port(), &pki).await;
    let bouncer = Bouncer::new("pooler-metrics-pgb");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, http) = pgop_instance::pooler::http::bind(
        "127.0.0.1:0".parse()?,
        bouncer.pooler.clone(),
        async move {
            let _ = stopped.await;
        },
    )
    .await?;
    let http = tokio::spawn(http);
    assert_eq!(get(addr, "/healthz").await.0, 200);
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(
        (code, body.as_str()),
        (503, "not ready: no configuration yet\n")
    );

    bouncer
        .pooler
        .apply(&desired(&pki, &[&server], PoolMode::Transaction))?;
    bouncer.ready().await;
    assert_eq!(get(addr, "/readyz").await, (200, "ready\n".to_string()));

    // Two clients each in a transaction (a server connection each), one idle (its
    // transaction ran first, on the server the first of the others then took).
    let busy1 = bouncer.client(&pki, APP_PASSWORD).await?;
    let busy2 = bouncer.client(&pki, APP_PASSWORD).await?;
    let idle = bouncer.client(&pki, APP_PASSWORD).await?;
    idle.batch_execute("SELECT 1").await?;
    for c in [&busy1, &busy2] {
        c.batch_execute("BEGIN; SELECT 1").await?;
    }
    let stats = eventually("two active servers in the app pool", WAIT, || async {
        let stats = bouncer.pooler.stats().await.ok()?;
        let pool = stats.pool("app", "app")?;
        (pool.servers("active") == 2).then_some(stats)
    })
    .await;
    let pool = stats.pool("app", "app").expect("the app pool");
    assert_eq!(pool.clients("active"), 3, "{pool:?}");
    assert_eq!(pool.clients("waiting"), 0, "{pool:?}");
    assert_eq!(pool.max_wait_seconds, Some(0.0), "{pool:?}");
    let app = stats
        .databases
        .iter()
        .find(|d| d.database == "app")
        .expect("the app database's totals");
    assert!(app.transactions.unwrap_or(0) >= 1, "{app:?}");
    assert!(app.received_bytes.unwrap_or(0) > 0, "{app:?}");

    let (code, metrics) = get(addr, "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    let labels = r#"cluster="it",pooler="rw""#;
    let pool_labels = format!(r#"{labels},database="app",user="app""#);
    for (series, value) in [
        (format!("pgop_pgbouncer_up{{{labels}}}"), 1.0),
        (format!("pgop_pgbouncer_targets{{{labels}}}"), 1.0),
        (format!("pgop_pgbouncer_restarts_total{{{labels}}}"), 0.0),
        (
            format!(r#"pgop_pgbouncer_client_connections{{{pool_labels},state="active"}}"#),
            3.0,
        ),
        (
            format!(r#"pgop_pgbouncer_client_connections{{{pool_labels},state="waiting"}}"#),
            0.0,
        ),
        (
            format!(r#"pgop_pgbouncer_server_connections{{{pool_labels},state="active"}}"#),
            2.0,
        ),
        (
            format!(r#"pgop_pgbouncer_server_connections{{{pool_labels},state="login"}}"#),
            0.0,
        ),
        (
            format!("pgop_pgbouncer_max_wait_seconds{{{pool_labels}}}"),
            0.0,
        ),
    ] {
        assert_eq!(
            sample(&metrics, &series),
            Some(value),
            "{series} in\n{metrics}"
        );
    }
    let db = format!(r#"{labels},database="app""#);
    for counter in [
        "transactions_total",
        "queries_total",
        "received_bytes_total",
        "sent_bytes_total",
    ] {
        let series = format!("pgop_pgbouncer_{counter}{{{db}}}");
        assert!(
            sample(&metrics, &series).is_some_and(|v| v > 0.0),
            "{series} in\n{metrics}"
        );
    }

    // Both transactions end: their server connections go back to the pool.
    for c in [&busy1, &busy2] {
        c.batch_execute("COMMIT").await?;
    }
    eventually("no active server connection", WAIT, || async {
        let stats = bouncer.pooler.stats().await.ok()?;
        let pool = stats.pool("app", "app")?;
        let parked = pool.servers("idle") + pool.servers("used");
        (pool.servers("active") == 0 && parked == 2).then_some(())
    })
    .await;

    // No target: the last configuration is kept, clients still work, not ready.
    let mut none = desired(&pki, &[&server], PoolMode::Transaction);
    none.targets.clear();
    assert_eq!(bouncer.pooler.apply(&none)?, Applied::Unchanged);
    assert!(matches!(
        bouncer.pooler.readiness().await,
        Err(NotReady::NoTarget)
    ));
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(server_of(&idle).await?, "127.0.0.1");
    let metrics = get(addr, "/metrics").await.1;
    assert_eq!(
        sample(&metrics, &format!("pgop_pgbouncer_targets{{{labels}}}")),
        Some(0.0)
    );
    bouncer
        .pooler
        .withdraw("pooler rw is no longer in spec.poolers".into());
    assert!(matches!(
        bouncer.pooler.readiness().await,
        Err(NotReady::Withdrawn(_))
    ));
    bouncer
        .pooler
        .apply(&desired(&pki, &[&server], PoolMode::Transaction))?;
    bouncer.ready().await;

    let _ = stop.send(());
    http.await??;
    bouncer.pooler.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_target_takes_the_next_transactions_and_connected_clients_stay() -> TestResult {
    let pki = pki();
    let port = port_free_on_both();
    let (a, b) = tokio::join!(
        Server::start("pooler-move-a", "127.0.0.1", port, &pki),
        Server::start("pooler-move-b", "127.0.0.2", port, &pki),
    );
    let bouncer = Bouncer::new("pooler-move-pgb");
    bouncer
        .pooler
        .apply(&desired(&pki, &[&a], PoolMode::Transaction))?;
    bouncer.ready().await;
    let pid = bouncer.pid();
    let idle = bouncer.client(&pki, APP_PASSWORD).await?;
    let in_tx = bouncer.client(&pki, APP_PASSWORD).await?;
    assert_eq!(server_of(&idle).await?, "127.0.0.1");
    in_tx.batch_execute("BEGIN").await?;
    assert_eq!(server_of(&in_tx).await?, "127.0.0.1");

    // The failover: the primary is now b.
    assert_eq!(
        bouncer
            .pooler
            .apply(&desired(&pki, &[&b], PoolMode::Transaction))?,
        Applied::Reloaded
    );
    assert_eq!(bouncer.pooler.targets(), [b.addr]);
    // The connected client's next transaction goes to b (once PgBouncer has read the
    // file: SIGHUP is asynchronous), on the same client connection.
    eventually("the idle client's next transaction on b", WAIT, || async {
        (server_of(&idle).await.ok()? == "127.0.0.2").then_some(())
    })
    .await;
    // The open transaction stays on a until it ends; the next one goes to b.
    assert_eq!(server_of(&in_tx).await?, "127.0.0.1");
    in_tx.batch_execute("COMMIT").await?;
    assert_eq!(server_of(&in_tx).await?, "127.0.0.2");
    assert!(!idle.is_closed() && !in_tx.is_closed());
    let fresh = bouncer.client(&pki, APP_PASSWORD).await?;
    assert_eq!(server_of(&fresh).await?, "127.0.0.2");
    assert_eq!(bouncer.pid(), pid, "reloaded, never restarted");
    assert_eq!(bouncer.pooler.restarts(), 0);
    assert!(bouncer.pooler.reloads() >= 1);

    // An `ro` pooler over two replicas: new server connections alternate between them.
    bouncer
        .pooler
        .apply(&desired(&pki, &[&a, &b], PoolMode::Transaction))?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(bouncer.client(&pki, APP_PASSWORD).await?);
    }
    let seen = eventually("transactions on both servers", WAIT, || async {
        // Each client holds a transaction open: each needs its own server connection.
        let mut seen = std::collections::BTreeSet::new();
        for c in &clients {
            c.batch_execute("BEGIN").await.ok()?;
            seen.insert(server_of(c).await.ok()?);
        }
        for c in &clients {
            c.batch_execute("COMMIT").await.ok()?;
        }
        (seen.len() == 2).then_some(seen)
    })
    .await;
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["127.0.0.1", "127.0.0.2"]
    );
    assert_eq!(bouncer.pid(), pid);
    bouncer.pooler.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_killed_is_restarted_and_stopped_with_its_manager() -> TestResult {
    let pki = pki();
    let server = Server::start("pooler-kill", "127.0.0.1", free_port(), &pki).await;
    let bouncer = Bouncer::new("pooler-kill-pgb");
    bouncer
        .pooler
        .apply(&desired(&pki, &[&server], PoolMode::Session))?;
    bouncer.ready().await;
    let client = bouncer.client(&pki, APP_PASSWORD).await?;
    assert_eq!(server_of(&client).await?, "127.0.0.1");
    let Some(first) = bouncer.pid() else {
        panic!("PgBouncer runs");
    };
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(i32::try_from(first)?, libc::SIGKILL) };
    let second = eventually("PgBouncer up again", WAIT, || async {
        match bouncer.pooler.state() {
            State::Up { pid } if pid != first => Some(pid),
            _ => None,
        }
    })
    .await;
    assert_eq!(bouncer.pooler.restarts(), 1);
    assert!(client.batch_execute("SELECT 1").await.is_err() || client.is_closed());
    bouncer.ready().await;
    let again = bouncer.client(&pki, APP_PASSWORD).await?;
    assert_eq!(server_of(&again).await?, "127.0.0.1");

    // Stopping the manager stops PgBouncer: SIGINT, and SIGTERM (an immediate shutdown)
    // after the drain timeout, since the session of `again` holds its server connection.
    bouncer.pooler.stop().await;
    assert_eq!(bouncer.pooler.state(), State::Stopped);
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(i32::try_from(second)?, 0) } == 0;
    assert!(!alive, "PgBouncer {second} still runs");
    assert!(again.batch_execute("SELECT 1").await.is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_and_password_are_used_after_a_reload() -> TestResult {
    let pki = pki();
    let server = Server::start("pooler-renew", "127.0.0.1", free_port(), &pki).await;
    let bouncer = Bouncer::new("pooler-renew-pgb");
    let first = desired(&pki, &[&server], PoolMode::Transaction);
    bouncer.pooler.apply(&first)?;
    bouncer.ready().await;
    let pid = bouncer.pid();
    let kept = bouncer.client(&pki, APP_PASSWORD).await?;

    // A certificate from another authority, as after the operator renewed it (the
    // servers' authority stays).
    let now = jiff::Timestamp::now();
    let other = pgop_tls::Authority::generate_named(now, "pgop-it-other-ca")?;
    let renewed = other.issue_postgres_server(&[POOLER_SERVICE.to_string()], now, 2)?;
    // And a new password, set on the server as the instance manager would.
    let password = "renewed \"password\" #2";
    server
        .instance
        .endpoint()
        .connect()
        .await?
        .batch_execute(&format!(
            "ALTER ROLE app PASSWORD {}",
            pgop_instance::pg::sql::password_literal(password)
        ))
        .await?;
    let mut next = first.clone();
    next.tls.cert = Sourced::from_secret(renewed.cert_pem.clone(), "it-server-tls", "tls.crt");
    next.tls.key = Sourced::from_secret(renewed.key_pem.clone(), "it-server-tls", "tls.key");
    next.app_password = Sourced::from_secret(password, "it-app", "password");
    assert_eq!(bouncer.pooler.apply(&next)?, Applied::Reloaded);
    let other_pki = Pki {
        ca: other.cert_pem().to_string(),
        server: renewed,
        replication: pki.replication,
    };
    let client = eventually("a client trusting the new authority", WAIT, || async {
        bouncer.client(&other_pki, password).await.ok()
    })
    .await;
    assert_eq!(server_of(&client).await?, "127.0.0.1");
    assert!(bouncer.client(&other_pki, APP_PASSWORD).await.is_err());
    // The client connected before the renewal stays connected.
    assert_eq!(server_of(&kept).await?, "127.0.0.1");
    assert_eq!(bouncer.pid(), pid, "reloaded, never restarted");
    bouncer.pooler.stop().await;
    Ok(())
}

/// A pooler Pod that goes (a rolling update, a scale-down) lets the transactions under way
/// finish: its manager sends PgBouncer SIGINT (PAUSE, then SHUTDOWN once every server
/// connection is released) and not SIGTERM, which would cut them; it is not ready
/// meanwhile, and no new transaction starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_pooler_lets_the_transaction_under_way_commit() -> TestResult {
    let pki = pki();
    let server = Server::start("pooler-drain", "127.0.0.1", free_port(), &pki).await;
    let bouncer = Bouncer::draining_for("pooler-drain-pgb", Duration::from_secs(60));
    bouncer
        .pooler
        .apply(&desired(&pki, &[&server], PoolMode::Transaction))?;
    bouncer.ready().await;
    let writer = bouncer.client(&pki, APP_PASSWORD).await?;
    writer
        .batch_execute("CREATE TABLE IF NOT EXISTS drained (id int)")
        .await?;
    writer
        .batch_execute("BEGIN; INSERT INTO drained VALUES (1)")
        .await?;
    let Some(pid) = bouncer.pid() else {
        panic!("PgBouncer runs");
    };
    let pooler = bouncer.pooler.clone();
    let stopping = tokio::spawn(async move { pooler.stop().await });
    // The stop waits for the open transaction; readiness goes at once.
    eventually("the stopping pooler not ready", WAIT, || async {
        bouncer.pooler.readiness().await.is_err().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !stopping.is_finished(),
        "the stop did not wait for the transaction"
    );
    // SAFETY: signal 0 only checks that the process exists.
    assert_eq!(unsafe { libc::kill(i32::try_from(pid)?, 0) }, 0);
    writer
        .batch_execute("INSERT INTO drained VALUES (2); COMMIT")
        .await?;
    tokio::time::timeout(Duration::from_secs(20), stopping).await??;
    assert_eq!(bouncer.pooler.state(), State::Stopped);
    assert!(bouncer.client(&pki, APP_PASSWORD).await.is_err());
    let direct = server.instance.endpoint().connect_to("app").await?;
    let rows: i64 = direct
        .query_one("SELECT count(*) FROM drained", &[])
        .await?
        .get(0);
    assert_eq!(
        rows, 2,
        "the transaction under way at the stop committed whole"
    );
    Ok(())
}

/// The look-up role's password (`<cluster>.pooler`), with what the auth file must quote.
const LOOKUP_PASSWORD: &str = r#"l"o=o#k$(up)"#;

/// Roles other than the application owner log in through the pooler: PgBouncer looks
/// their SCRAM verifier up as pgop_pooler through the function the manager installed in
/// every database (template1's copy reaches a database made afterwards). Superusers,
/// roles that may not log in and expired passwords are not looked up; nobody else may call
/// the function; without poolers the look-up role may not log in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_roles_log_in_through_the_pooler_and_superusers_do_not() -> TestResult {
    let pki = pki();
    let server = Server::start("pooler-lookup", "127.0.0.1", free_port(), &pki).await;
    server
        .instance
        .apply_pooler_auth(Some(LOOKUP_PASSWORD))
        .await?;
    let su = server.instance.endpoint().connect().await?;
    su.batch_execute(
        "CREATE ROLE reader LOGIN PASSWORD 'r''ead \"er\" $(x)';
         CREATE ROLE boss LOGIN SUPERUSER PASSWORD 'boss';
         CREATE ROLE shut NOLOGIN PASSWORD 'shut';
         CREATE ROLE old LOGIN PASSWORD 'old' VALID UNTIL '2000-01-01';",
    )
    .await?;
    su.batch_execute("CREATE DATABASE later").await?;
    let bouncer = Bouncer::new("pooler-lookup-pgb");
    let mut d = desired(&pki, &[&server], PoolMode::Transaction);
    d.auth_password = Some(Sourced::from_secret(
        LOOKUP_PASSWORD,
        "it.pooler",
        "password",
    ));
    bouncer.pooler.apply(&d)?;
    bouncer.ready().await;

    for db in ["app", "later"] {
        let reader = bouncer
            .client_as(&pki, "reader", "r'ead \"er\" $(x)", db)
            .await?;
        let row = reader
            .query_one("SELECT current_user::text, current_database()::text", &[])
            .await?;
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, String>(1)),
            ("reader".to_string(), db.to_string())
        );
    }
    // The application owner as before (the auth file).
    let app = bouncer.client(&pki, APP_PASSWORD).await?;
    app.batch_execute("SELECT 1").await?;
    for (user, password, why) in [
        ("reader", "wrong", "a wrong password"),
        ("boss", "boss", "a superuser"),
        ("shut", "shut", "a role that may not log in"),
        ("old", "old", "an expired password"),
        ("nobody", "x", "no such role"),
    ] {
        assert!(
            bouncer
                .client_as(&pki, user, password, "app")
                .await
                .is_err(),
            "{why} logged in through the pooler"
        );
    }

    // Only pgop_pooler may call the look-up (reader, over the socket, straight to
    // PostgreSQL).
    let mut direct = tokio_postgres::Config::new();
    direct
        .host_path(server.instance.endpoint().socket_dir)
        .port(server.port)
        .user("reader")
        .password("r'ead \"er\" $(x)")
        .dbname("app");
    let (reader, connection) = direct.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let refused = reader
        .query("SELECT * FROM pgop_pooler.user_lookup('app')", &[])
        .await
        .expect_err("reader called the look-up");
    assert!(
        refused
            .as_db_error()
            .is_some_and(|e| e.message().contains("permission denied")),
        "{refused:?}"
    );

    // No poolers: the look-up role may no longer log in.
    server.instance.apply_pooler_auth(None).await?;
    let can: bool = su
        .query_one(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'pgop_pooler'",
            &[],
        )
        .await?
        .get(0);
    assert!(!can);
    Ok(())
}
