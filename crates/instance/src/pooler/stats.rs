//! PgBouncer's admin console, read as the stats user over the Unix socket (`SHOW POOLS`,
//! `SHOW STATS`: the simple query protocol, the only one the console speaks), and the
//! pooler's `/metrics` in the OpenMetrics text format ([`encode`], pure). Columns are read
//! by name, so a PgBouncer that adds columns changes nothing; one that lacks a column
//! gives no series for it rather than a made-up one.

use super::config::{ADMIN_DATABASE, Layout, STATS_USER};
use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::borrow::Cow;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;
use tokio_postgres::{SimpleQueryMessage, SimpleQueryRow};

/// How long one exchange with the admin console (connecting included) may take: less
/// than the readiness probe's timeout.
pub const ADMIN_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to connect to PgBouncer's admin console as {STATS_USER}")]
    Connect(#[source] tokio_postgres::Error),
    #[error("failed to run {query} on PgBouncer's admin console")]
    Query {
        query: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("PgBouncer's admin console did not answer within {0:?}")]
    Timeout(Duration),
}

/// One pool (a database and user pair) of `SHOW POOLS`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pool {
    pub database: String,
    pub user: String,
    /// Client connections by state (`active`, `waiting`, ...), as the console reports.
    pub clients: Vec<(&'static str, i64)>,
    /// Server connections by state (`active`, `idle`, `used`, `tested`, `login`, ...).
    pub servers: Vec<(&'static str, i64)>,
    /// How long the oldest waiting client has waited.
    pub max_wait_seconds: Option<f64>,
}

/// One database of `SHOW STATS`: totals since PgBouncer started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatabaseStats {
    pub database: String,
    pub transactions: Option<u64>,
    pub queries: Option<u64>,
    pub received_bytes: Option<u64>,
    pub sent_bytes: Option<u64>,
    pub transaction_seconds: Option<f64>,
    pub query_seconds: Option<f64>,
    pub wait_seconds: Option<f64>,
}

/// What one read of the admin console found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub pools: Vec<Pool>,
    pub databases: Vec<DatabaseStats>,
}

impl Stats {
    /// The pool of `database` and `user`.
    pub fn pool(&self, database: &str, user: &str) -> Option<&Pool> {
        self.pools
            .iter()
            .find(|p| p.database == database && p.user == user)
    }
}

impl Pool {
    /// Client connections in `state`.
    pub fn clients(&self, state: &str) -> i64 {
        self.clients
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }

    /// Server connections in `state`.
    pub fn servers(&self, state: &str) -> i64 {
        self.servers
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }
}

/// `SHOW POOLS` columns of client connections, and the state each counts.
const CLIENT_COLUMNS: &[(&str, &str)] = &[
    ("cl_active", "active"),
    ("cl_waiting", "waiting"),
    ("cl_active_cancel_req", "active_cancel_req"),
    ("cl_waiting_cancel_req", "waiting_cancel_req"),
];

/// `SHOW POOLS` columns of server connections, and the state each counts.
const SERVER_COLUMNS: &[(&str, &str)] = &[
    ("sv_active", "active"),
    ("sv_active_cancel", "active_cancel"),
    ("sv_being_canceled", "being_canceled"),
    ("sv_idle", "idle"),
    ("sv_used", "used"),
    ("sv_tested", "tested"),
    ("sv_login", "login"),
];

fn text<'a>(row: &'a SimpleQueryRow, column: &str) -> Option<&'a str> {
    row.try_get(column).ok().flatten()
}

fn int(row: &SimpleQueryRow, column: &str) -> Option<i64> {
    text(row, column)?.trim().parse().ok()
}

fn uint(row: &SimpleQueryRow, column: &str) -> Option<u64> {
    text(row, column)?.trim().parse().ok()
}

/// A column of microseconds, in seconds.
fn micros(row: &SimpleQueryRow, column: &str) -> Option<f64> {
    uint(row, column).map(|us| us as f64 / 1e6)
}

/// The pools of `SHOW POOLS` rows.
pub fn parse_pools(rows: &[SimpleQueryRow]) -> Vec<Pool> {
    rows.iter()
        .map(|row| {
            let counts = |columns: &[(&str, &'static str)]| {
                columns
                    .iter()
                    .filter_map(|(column, state)| Some((*state, int(row, column)?)))
                    .collect()
            };
            let max_wait_seconds = int(row, "maxwait")
                .map(|s| s as f64 + int(row, "maxwait_us").map_or(0.0, |us| us as f64 / 1e6));
            Pool {
                database: text(row, "database").unwrap_or_default().to_string(),
                user: text(row, "user").unwrap_or_default().to_string(),
                clients: counts(CLIENT_COLUMNS),
                servers: counts(SERVER_COLUMNS),
                max_wait_seconds,
            }
        })
        .collect()
}

/// The databases of `SHOW STATS` rows.
pub fn parse_stats(rows: &[SimpleQueryRow]) -> Vec<DatabaseStats> {
    rows.iter()
        .map(|row| DatabaseStats {
            database: text(row, "database").unwrap_or_default().to_string(),
            transactions: uint(row, "total_xact_count"),
            queries: uint(row, "total_query_count"),
            received_bytes: uint(row, "total_received"),
            sent_bytes: uint(row, "total_sent"),
            transaction_seconds: micros(row, "total_xact_time"),
            query_seconds: micros(row, "total_query_time"),
            wait_seconds: micros(row, "total_wait_time"),
        })
        .collect()
}

/// A connection to PgBouncer's admin console as [`STATS_USER`], kept between reads and
/// made anew when it broke (a restarted PgBouncer).
pub struct Admin {
    config: tokio_postgres::Config,
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// The admin console of the PgBouncer of `layout`, with the stats user's password.
    pub fn new(layout: &Layout, password: &str) -> Self {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&layout.dir)
            .port(layout.port)
            .user(STATS_USER)
            .password(password)
            .dbname(ADMIN_DATABASE)
            .application_name("pgop-pooler-manager")
            .connect_timeout(ADMIN_TIMEOUT);
        Self {
            config,
            client: tokio::sync::Mutex::new(None),
        }
    }

    /// The rows of `query` (one admin command), within [`ADMIN_TIMEOUT`].
    pub async fn query(&self, query: &'static str) -> Result<Vec<SimpleQueryRow>, Error> {
        tokio::time::timeout(ADMIN_TIMEOUT, self.query_now(query))
            .await
            .unwrap_or(Err(Error::Timeout(ADMIN_TIMEOUT)))
    }

    async fn query_now(&self, query: &'static str) -> Result<Vec<SimpleQueryRow>, Error> {
        let mut client = self.client.lock().await;
        // A kept connection may have died with its PgBouncer: one more try on a new one.
        for fresh in [false, true] {
            if fresh
                || client
                    .as_ref()
                    .is_none_or(tokio_postgres::Client::is_closed)
            {
                let (c, connection) = self
                    .config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(Error::Connect)?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                *client = Some(c);
            }
            let Some(c) = client.as_ref() else {
                continue;
            };
            match c.simple_query(query).await {
                Ok(messages) => {
                    return Ok(messages
                        .into_iter()
                        .filter_map(|m| match m {
                            SimpleQueryMessage::Row(row) => Some(row),
                            _ => None,
                        })
                        .collect());
                }
                Err(source) if fresh => return Err(Error::Query { query, source }),
                Err(_) => *client = None,
            }
        }
        Err(Error::Timeout(ADMIN_TIMEOUT))
    }

    /// `SHOW POOLS` and `SHOW STATS`.
    pub async fn stats(&self) -> Result<Stats, Error> {
        let pools = parse_pools(&self.query("SHOW POOLS").await?);
        let databases = parse_stats(&self.query("SHOW STATS").await?);
        Ok(Stats { pools, databases })
    }

    /// Whether the console answers (`SHOW VERSION`).
    pub async fn answers(&self) -> Result<(), Error> {
        self.query("SHOW VERSION").await.map(|_| ())
    }
}

/// What the manager knows besides the console.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Manager<'a> {
    pub cluster: &'a str,
    pub pooler: &'a str,
    /// Servers the configuration sends connections to, per the cluster's status (0: none
    /// now; PgBouncer keeps the last ones and the pooler is not ready).
    pub targets: usize,
    pub reloads: u64,
    pub restarts: u64,
}

type Labels = Vec<(&'static str, String)>;
type IntGauge = Family<Labels, Gauge<i64, AtomicI64>>;
type FloatGauge = Family<Labels, Gauge<f64, AtomicU64>>;
type IntCounter = Family<Labels, Counter<u64, AtomicU64>>;
type FloatCounter = Family<Labels, Counter<f64, AtomicU64>>;

/// The metrics of one scrape (ending with `# EOF`): `pgop_pgbouncer_*`, each series with
/// the `cluster` and `pooler` labels; `stats` is `None` when the console did not answer
/// (`pgop_pgbouncer_up` 0, no per-pool series).
pub fn encode(stats: Option<&Stats>, manager: Manager<'_>) -> Result<String, std::fmt::Error> {
    let constant = [
        (Cow::Borrowed("cluster"), Cow::Owned(manager.cluster.into())),
        (Cow::Borrowed("pooler"), Cow::Owned(manager.pooler.into())),
    ];
    let mut registry = Registry::with_prefix_and_labels("pgop_pgbouncer", constant.into_iter());
    let mut int = |name: &str, help: &str, unit: Option<Unit>| {
        let family = IntGauge::default();
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
            None => registry.register(name, help, family.clone()),
        }
        family
    };
    let up = int(
        "up",
        "1 when PgBouncer's admin console answers, 0 otherwise",
        None,
    );
    let targets = int(
        "targets",
        "Servers PgBouncer sends new server connections to, per the cluster's status (0: none; the last ones are kept and the pooler is not ready)",
        None,
    );
    let clients = int(
        "client_connections",
        "Client connections per pool (database, user) and state: active (linked to a server or idle), waiting (for a server), and cancel requests",
        None,
    );
    let servers = int(
        "server_connections",
        "Server connections per pool (database, user) and state: active (linked to a client), idle, used, tested, login, and cancels",
        None,
    );
    let up_value = i64::from(stats.is_some());
    up.get_or_create(&vec![]).set(up_value);
    targets
        .get_or_create(&vec![])
        .set(i64::try_from(manager.targets).unwrap_or(i64::MAX));
    let max_wait = FloatGauge::default();
    registry.register_with_unit(
        "max_wait",
        "How long the oldest client waiting for a server connection has waited, per pool",
        Unit::Seconds,
        max_wait.clone(),
    );
    let mut counter = |name: &str, help: &str, unit: Option<Unit>| {
        let family = IntCounter::default();
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, family.clone()),
            None => registry.register(name, help, family.clone()),
        }
        family
    };
    let transactions = counter(
        "transactions",
        "Transactions pooled (in session mode, server connections released) per database since PgBouncer started",
        None,
    );
    let queries = counter(
        "queries",
        "Queries pooled per database since PgBouncer started",
        None,
    );
    let received = counter(
        "received",
        "Network traffic received from clients per database since PgBouncer started",
        Some(Unit::Bytes),
    );
    let sent = counter(
        "sent",
        "Network traffic sent to clients per database since PgBouncer started",
        Some(Unit::Bytes),
    );
    let reloads = counter(
        "reloads",
        "Reloads (SIGHUP) the manager sent PgBouncer after its configuration changed",
        None,
    );
    let restarts = counter(
        "restarts",
        "Times the manager started PgBouncer again after it exited",
        None,
    );
    let mut seconds = |name: &str, help: &str| {
        let family = FloatCounter::default();
        registry.register_with_unit(name, help, Unit::Seconds, family.clone());
        family
    };
    let transaction_time = seconds(
        "transaction_time",
        "Time spent in pooled transactions per database since PgBouncer started",
    );
    let query_time = seconds(
        "query_time",
        "Time spent in pooled queries per database since PgBouncer started",
    );
    let wait_time = seconds(
        "wait_time",
        "Time clients waited for a server connection per database since PgBouncer started",
    );
    reloads.get_or_create(&vec![]).inc_by(manager.reloads);
    restarts.get_or_create(&vec![]).inc_by(manager.restarts);
    if let Some(stats) = stats {
        for pool in &stats.pools {
            let labels = |state: Option<&str>| -> Labels {
                let mut l = vec![
                    ("database", pool.database.clone()),
                    ("user", pool.user.clone()),
                ];
                if let Some(state) = state {
                    l.push(("state", state.to_string()));
                }
                l
            };
            for (state, n) in &pool.clients {
                clients.get_or_create(&labels(Some(state))).set(*n);
            }
            for (state, n) in &pool.servers {
                servers.get_or_create(&labels(Some(state))).set(*n);
            }
            if let Some(wait) = pool.max_wait_seconds {
                max_wait.get_or_create(&labels(None)).set(wait);
            }
        }
        for db in &stats.databases {
            let labels: Labels = vec![("database", db.database.clone())];
            for (family, value) in [
                (&transactions, db.transactions),
                (&queries, db.queries),
                (&received, db.received_bytes),
                (&sent, db.sent_bytes),
            ] {
                if let Some(v) = value {
                    family.get_or_create(&labels).inc_by(v);
                }
            }
            for (family, value) in [
                (&transaction_time, db.transaction_seconds),
                (&query_time, db.query_seconds),
                (&wait_time, db.wait_seconds),
            ] {
                if let Some(v) = value {
                    family.get_or_create(&labels).inc_by(v);
                }
            }
        }
    }
    let mut out = String::new();
    text::encode(&mut out, &registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> Stats {
        Stats {
            pools: vec![Pool {
                database: "app".into(),
                user: "we\"ird\\user\n".into(),
                clients: vec![("active", 3), ("waiting", 1)],
                servers: vec![("active", 2), ("idle", 1), ("used", 0), ("login", 1)],
                max_wait_seconds: Some(1.5),
            }],
            databases: vec![DatabaseStats {
                database: "app".into(),
                transactions: Some(10),
                queries: Some(12),
                received_bytes: Some(1000),
                sent_bytes: Some(2000),
                transaction_seconds: Some(0.25),
                query_seconds: Some(0.125),
                wait_seconds: Some(0.0),
            }],
        }
    }

    fn manager() -> Manager<'static> {
        Manager {
            cluster: "db",
            pooler: "rw",
            targets: 2,
            reloads: 4,
            restarts: 1,
        }
    }

    #[test]
    fn every_series_is_named_pgop_pgbouncer_and_labelled() {
        let out = encode(Some(&stats()), manager()).expect("encoded");
        for line in [
            r#"pgop_pgbouncer_up{cluster="db",pooler="rw"} 1"#,
            r#"pgop_pgbouncer_targets{cluster="db",pooler="rw"} 2"#,
            r#"pgop_pgbouncer_reloads_total{cluster="db",pooler="rw"} 4"#,
            r#"pgop_pgbouncer_restarts_total{cluster="db",pooler="rw"} 1"#,
            r#"pgop_pgbouncer_transactions_total{cluster="db",pooler="rw",database="app"} 10"#,
            r#"pgop_pgbouncer_queries_total{cluster="db",pooler="rw",database="app"} 12"#,
            r#"pgop_pgbouncer_received_bytes_total{cluster="db",pooler="rw",database="app"} 1000"#,
            r#"pgop_pgbouncer_sent_bytes_total{cluster="db",pooler="rw",database="app"} 2000"#,
            r#"pgop_pgbouncer_transaction_time_seconds_total{cluster="db",pooler="rw",database="app"} 0.25"#,
        ] {
            assert!(out.contains(line), "{line} in\n{out}");
        }
        assert!(out.ends_with("# EOF\n"), "{out}");
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("pgop_pgbouncer_"), "{line}");
        }
    }

    #[test]
    fn label_values_from_pgbouncer_are_escaped() {
        let out = encode(Some(&stats()), manager()).expect("encoded");
        let user = r#"user="we\"ird\\user\n""#;
        for (metric, state, value) in [
            ("client_connections", "active", "3"),
            ("client_connections", "waiting", "1"),
            ("server_connections", "active", "2"),
            ("server_connections", "idle", "1"),
            ("server_connections", "login", "1"),
        ] {
            let line = format!(
                r#"pgop_pgbouncer_{metric}{{cluster="db",pooler="rw",database="app",{user},state="{state}"}} {value}"#
            );
            assert!(out.contains(&line), "{line} in\n{out}");
        }
        let wait = format!(
            r#"pgop_pgbouncer_max_wait_seconds{{cluster="db",pooler="rw",database="app",{user}}} 1.5"#
        );
        assert!(out.contains(&wait), "{wait} in\n{out}");
        // No raw line break inside a series.
        assert!(out.lines().all(|l| l.starts_with('#') || l.contains('}')));
    }

    #[test]
    fn a_console_that_does_not_answer_is_down_with_no_pool_series() {
        let out = encode(None, manager()).expect("encoded");
        assert!(out.contains(r#"pgop_pgbouncer_up{cluster="db",pooler="rw"} 0"#));
        assert!(out.contains(r#"pgop_pgbouncer_restarts_total{cluster="db",pooler="rw"} 1"#));
        assert!(!out.contains("database="), "{out}");
    }
}
