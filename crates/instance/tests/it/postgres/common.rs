//! Real PostgreSQL servers for the scenarios: each node gets a temp directory (owned by
//! PostgreSQL's OS user when the tests run as root) and a free loopback port; dropping a
//! node kills its server and removes its directory, even when the test panics.

use pgop_instance::{Binaries, Credentials, Instance, Layout, Options, RunAs, Upstream};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The PostgreSQL major these scenarios run on: 18 in the module `postgres18` (this file
/// compiled again there), 15 (Debian's) in `postgres` and the binaries that include it.
pub fn major() -> u32 {
    if module_path!().ends_with("::postgres18::common") {
        18
    } else {
        15
    }
}

pub fn binaries() -> Binaries {
    let major = major();
    Binaries::for_major(major, None).unwrap_or_else(|e| {
        panic!(
            "PostgreSQL {major} (15: hack/install-packages.sh demo; 18: hack/install-postgres18.sh): {e}"
        )
    })
}

pub fn run_as() -> Option<RunAs> {
    RunAs::when_root("postgres").expect("the postgres OS user")
}

pub fn credentials() -> Credentials {
    Credentials {
        app_user: "app".into(),
        app_password: "app-secret".into(),
        app_database: "app".into(),
        replication_user: "streaming_replica".into(),
        replication_password: "repl-'secret".into(),
    }
}

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("pgop-it-{prefix}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        make_dir(&path);
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory PostgreSQL's OS user owns (mode 0700).
pub fn make_dir(path: &Path) {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(path)
        .expect("create a test directory");
    if let Some(user) = run_as() {
        user.chown(path).expect("chown a test directory");
    }
}

/// The manager's options for instance `name` of cluster `it`, its data and socket
/// directories made under `dir` (`data/`, `run/`), listening on `addr:port`: a 10 s stop,
/// a 60 s start, PostgreSQL's log forwarded with `PGOP_TEST_LOGS`.
pub fn options(
    name: &str,
    dir: &TempDir,
    addr: &str,
    port: u16,
    credentials: Credentials,
) -> Options {
    make_dir(&dir.0.join("data"));
    make_dir(&dir.0.join("run"));
    Options {
        layout: Layout {
            instance: name.to_string(),
            cluster: "it".into(),
            pgdata: dir.0.join("data/pgdata"),
            listen_addresses: addr.to_string(),
            port,
            socket_dir: dir.0.join("run"),
            wal_dir: None,
        },
        binaries: binaries(),
        run_as: run_as(),
        credentials,
        stop_timeout: Duration::from_secs(10),
        start_timeout: Duration::from_secs(60),
        forward_logs: std::env::var_os("PGOP_TEST_LOGS").is_some(),
        restart_crashed_primary: true,
    }
}

/// One instance: a manager (in process) and its PostgreSQL server.
pub struct Node {
    pub instance: Arc<Instance>,
    pub port: u16,
    _dir: TempDir,
}

impl Node {
    pub fn new(name: &str) -> Self {
        Self::with_stop_timeout(name, Duration::from_secs(10))
    }

    pub fn with_stop_timeout(name: &str, stop_timeout: Duration) -> Self {
        let dir = TempDir::new(name);
        let port = free_port();
        let options = Options {
            stop_timeout,
            ..options(name, &dir, "127.0.0.1", port, credentials())
        };
        Self {
            instance: Arc::new(Instance::new(options)),
            port,
            _dir: dir,
        }
    }

    /// The data directory.
    pub fn pgdata(&self) -> std::path::PathBuf {
        self._dir.0.join("data/pgdata")
    }

    /// The socket directory (where the replication password file lives).
    pub fn socket_dir(&self) -> std::path::PathBuf {
        self._dir.0.join("run")
    }

    pub fn upstream(&self) -> Upstream {
        self.instance.as_upstream("127.0.0.1")
    }

    /// A superuser connection over the socket.
    pub async fn superuser(&self) -> Client {
        self.instance
            .endpoint()
            .connect()
            .await
            .expect("superuser connection")
    }

    /// The application user over TCP with its password.
    pub async fn app(&self) -> Result<Client, tokio_postgres::Error> {
        let c = credentials();
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user(&c.app_user)
            .password(&c.app_password)
            .dbname(&c.app_database)
            .connect_timeout(Duration::from_secs(5))
            .connect(NoTls)
            .await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Rows of `table` visible on this node (superuser, app database).
    pub async fn count(&self, table: &str) -> Option<i64> {
        let client = self.instance.endpoint().connect_to("app").await.ok()?;
        let row = client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .ok()?;
        row.try_get(0).ok()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(pid) = self.instance.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// Polls `check` until it returns Some, or panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Names as `Vec<String>`.
pub fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Serves the node's HTTP endpoints on a free loopback port until the guard drops.
pub struct Http {
    pub addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Http {
    pub async fn serve(node: &Node) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, server) = pgop_instance::http::bind(
            "127.0.0.1:0".parse().expect("address"),
            node.instance.clone(),
            async move {
                let _ = stopped.await;
            },
        )
        .await
        .expect("bind the HTTP server");
        tokio::spawn(server);
        Self { addr, _stop: stop }
    }

    /// GET `path`: the status code and the body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let (code, _head, body) = self.get_with_head(path).await;
        (code, body)
    }

    /// GET `path`: the status code, the status line and headers, and the body.
    pub async fn get_with_head(&self, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("receive");
        let code = response
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status code");
        let (head, body) = response
            .split_once("\r\n\r\n")
            .map(|(h, b)| (h.to_string(), b.to_string()))
            .unwrap_or_default();
        (code, head, body)
    }

    pub async fn status(&self) -> pgop_instance::PgStatus {
        let (code, body) = self.get(pgop_api::constants::PATH_PG_STATUS).await;
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("status JSON")
    }
}

/// `SHOW name` on a new connection.
pub async fn show(node: &Node, name: &str) -> String {
    let row = node
        .superuser()
        .await
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .expect("SHOW");
    row.get(0)
}

/// `name = value` pairs as a parameter map.
pub fn params(v: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
