//! PostgreSQL and the real S3 server for the backup tests (`backup.rs`, `logical.rs`):
//! PostgreSQL's OS user, scratch directories it owns, `s3s-fs` with the store
//! configuration the tests use, and primaries bootstrapped by `pgop_instance`.

use pgop_backup::{PgTools, Source, StoreConfig};
use pgop_instance::{
    Archiving, Binaries, Credentials, Instance, Layout, Mode, Options, PgStatus, RunAs,
};
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, SECRET_KEY};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub fn run_as() -> Option<RunAs> {
    RunAs::when_root("postgres").expect("the postgres OS user")
}

pub fn owner() -> Option<(u32, u32)> {
    run_as().map(|u| (u.uid, u.gid))
}

/// The PostgreSQL major of this module: 18 in `common::pg18` (this file compiled a second
/// time, for `backup18.rs`, `logical18.rs` and `postgres_build18.rs`), else 15 (Debian's).
/// Read from the module's path, never from the environment.
pub fn major() -> u32 {
    if module_path!().ends_with("::pg18") {
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

/// Asserts that this module runs the binaries of the major its name says (15 in
/// `common::pg`, 18 in `common::pg18`), as `postgres --version` reports them.
pub fn check_binaries_of_this_module() {
    let expected = match module_path!().rsplit("::").next() {
        Some("pg18") => 18,
        _ => 15,
    };
    assert_eq!(major(), expected);
    assert_eq!(binaries().major().ok(), Some(expected));
}

pub fn tools() -> PgTools {
    PgTools {
        bin_dir: binaries().dir().to_path_buf(),
        run_as: owner(),
    }
}

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// A directory removed on drop, owned by PostgreSQL's OS user.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("pgop-bk-{prefix}-{}-{n}", std::process::id()));
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

/// The pgop binary, copied where PostgreSQL's OS user may run it (the build directory is
/// under root's home).
pub fn pgop_binary(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let target = bin.join("pgop");
    std::fs::copy(env!("CARGO_BIN_EXE_pgop"), &target).expect("copy pgop");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    target
}

/// The real S3 server of `pgop_testenv::s3`, with the store configuration the tests use.
pub struct S3Server(pub pgop_testenv::s3::S3Server);

impl S3Server {
    pub fn start(dir: &Path) -> Self {
        Self(pgop_testenv::s3::S3Server::start(dir).expect("start s3s-fs"))
    }

    /// Starts the server again on the same port and data.
    pub fn resume(&mut self) {
        self.0.resume().expect("restart s3s-fs");
    }

    /// Stops the server at once: the store is down.
    pub fn stop(&mut self) {
        self.0.stop();
    }

    pub fn endpoint(&self) -> String {
        self.0.endpoint()
    }

    pub fn config(&self, cluster: &str) -> StoreConfig {
        StoreConfig {
            format: pgop_backup::config::CONFIG_FORMAT,
            location: pgop_backup::Location::S3(pgop_backup::S3Location {
                bucket: BUCKET.into(),
                endpoint: Some(self.endpoint()),
                region: Some("us-east-1".into()),
                access_key_id: ACCESS_KEY.into(),
                secret_access_key: SECRET_KEY.into(),
                insecure_skip_tls_verify: false,
            }),
            prefix: Some("tests/pgop".into()),
            cluster: cluster.into(),
        }
    }

    /// The file holding an object, for corrupting it.
    pub fn object_file(&self, config: &StoreConfig, rel: &str) -> PathBuf {
        self.0
            .object_file(&format!("tests/pgop/{}/pgop-v1/{rel}", config.cluster))
    }
}

/// A PostgreSQL primary of the backup tests (bootstrapped by `pgop_instance`).
pub struct Node {
    pub instance: Arc<Instance>,
    pub socket_dir: PathBuf,
    pub port: u16,
}

impl Node {
    pub fn options(dir: &Path, name: &str, pgdata: PathBuf) -> (Options, PathBuf, u16) {
        let socket_dir = dir.join(format!("{name}-run"));
        make_dir(&socket_dir);
        let port = free_port();
        let options = Options {
            layout: Layout {
                instance: name.to_string(),
                cluster: "src".into(),
                pgdata,
                listen_addresses: "127.0.0.1".into(),
                port,
                socket_dir: socket_dir.clone(),
                wal_dir: None,
            },
            binaries: binaries(),
            run_as: run_as(),
            credentials: Credentials {
                app_user: "app".into(),
                app_password: "app-secret".into(),
                app_database: "app".into(),
                replication_user: "streaming_replica".into(),
                replication_password: "repl-secret".into(),
            },
            stop_timeout: Duration::from_secs(10),
            start_timeout: Duration::from_secs(60),
            forward_logs: std::env::var_os("PGOP_TEST_LOGS").is_some(),
            restart_crashed_primary: true,
        };
        (options, socket_dir, port)
    }

    /// A primary that archives to the store.
    pub async fn primary(dir: &Path, name: &str, archiving: Archiving) -> Self {
        Self::bootstrap(dir, name, Some(archiving)).await
    }

    /// A primary, archiving when `archiving` says where to.
    pub async fn bootstrap(dir: &Path, name: &str, archiving: Option<Archiving>) -> Self {
        let data = dir.join(format!("{name}-data"));
        make_dir(&data);
        let (options, socket_dir, port) = Self::options(dir, name, data.join("pgdata"));
        let instance = Arc::new(Instance::new(options));
        instance.set_archiving(archiving);
        instance.bootstrap_primary().await.expect("bootstrap");
        Self {
            instance,
            socket_dir,
            port,
        }
    }

    /// Starts a restored data directory as a primary (no archiving).
    pub async fn start_restored(dir: &Path, name: &str, pgdata: PathBuf) -> Self {
        let (options, socket_dir, port) = Self::options(dir, name, pgdata);
        let instance = Arc::new(Instance::new(options));
        instance
            .start_as(Mode::Primary)
            .await
            .expect("start the restored data");
        Self {
            instance,
            socket_dir,
            port,
        }
    }

    pub fn source(&self) -> Source {
        Source {
            socket_dir: self.socket_dir.clone(),
            port: self.port,
        }
    }

    pub async fn sql(&self) -> tokio_postgres::Client {
        self.instance
            .endpoint()
            .connect_to("app")
            .await
            .expect("connect")
    }

    pub async fn exec(&self, sql: &str) {
        self.sql().await.batch_execute(sql).await.expect(sql);
    }

    /// Row count and md5 of the ordered table.
    pub async fn fingerprint(&self) -> (i64, String) {
        let row = self
            .sql()
            .await
            .query_one(
                "SELECT count(*), md5(coalesce(string_agg(id::text || ':' || v, ',' ORDER BY id), '')) FROM t",
                &[],
            )
            .await
            .expect("fingerprint");
        (row.get(0), row.get(1))
    }

    /// Switches to a new WAL file and returns the name of the one just completed.
    pub async fn switch_wal(&self) -> String {
        let row = self
            .sql()
            .await
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await
            .expect("pg_switch_wal");
        row.get(0)
    }

    pub async fn status(&self) -> PgStatus {
        self.instance.status().await
    }

    /// Waits until `wal` (and everything before it) is archived.
    pub async fn wait_archived(&self, wal: &str, timeout: Duration) {
        let start = Instant::now();
        loop {
            let status = self.status().await;
            let archiving = status.archiving.clone().unwrap_or_default();
            if archiving.last_archived_wal.as_deref() >= Some(wal) {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "{wal} not archived within {timeout:?}: {archiving:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

/// Flips one byte of `file` (an object as the S3 server keeps it): at `at`, or in the
/// middle. Flipping the same byte again repairs it.
pub fn flip_byte(file: &Path, at: Option<usize>) {
    let mut raw = std::fs::read(file).expect("read the object's file");
    let at = at.unwrap_or(raw.len() / 2);
    raw[at] ^= 0x55;
    std::fs::write(file, &raw).expect("write the object's file");
}
