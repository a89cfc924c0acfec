//! A real S3-compatible server for tests: `s3s-fs` (from crates.io; installed by
//! `hack/install-s3-server.sh` into `~/.cache/pgop/s3s-fs`) on a loopback port, keeping its
//! objects in a directory that survives its restarts, so that a test can take the store
//! down and bring it back.

use crate::process::ManagedProcess;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The bucket every server starts with.
pub const BUCKET: &str = "pgop-test";
/// Access keys the server accepts.
pub const ACCESS_KEY: &str = "pgop-test-access";
pub const SECRET_KEY: &str = "pgop-test-secret-key";
/// How to install the server.
pub const INSTALL_COMMAND: &str = "hack/install-s3-server.sh";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the S3 server for the backup tests (s3s-fs) is missing: install it with `{INSTALL_COMMAND}` (or set PGOP_S3_SERVER)"
    )]
    Missing,
    #[error("failed to prepare {0}")]
    Prepare(PathBuf, #[source] std::io::Error),
    #[error("failed to start s3s-fs")]
    Start(#[source] std::io::Error),
    #[error("s3s-fs did not listen on port {port} within 20 s: {log}")]
    NotListening { port: u16, log: String },
}

/// The `s3s-fs` binary: `PGOP_S3_SERVER`, the cache (`PGOP_CACHE_DIR`), or the PATH.
pub fn binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("PGOP_S3_SERVER") {
        return Ok(PathBuf::from(path));
    }
    // Where hack/install-s3-server.sh installs it: ${PGOP_CACHE_DIR:-$HOME/.cache/pgop}.
    let cached = crate::binaries::cache_dir().join("s3s-fs/bin/s3s-fs");
    if cached.is_file() {
        return Ok(cached);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file())
        .ok_or(Error::Missing)
}

/// The arguments of `s3s-fs` listening on `host:port` with [`ACCESS_KEY`] and
/// [`SECRET_KEY`], keeping its objects under `root` (one directory per bucket).
pub(crate) fn server_args(host: &str, port: u16, root: &Path) -> Vec<std::ffi::OsString> {
    let port = port.to_string();
    let mut args: Vec<std::ffi::OsString> = [
        "--host",
        host,
        "--port",
        &port,
        "--access-key",
        ACCESS_KEY,
        "--secret-key",
        SECRET_KEY,
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(root.into());
    args
}

/// A running (or stopped) `s3s-fs`.
pub struct S3Server {
    port: u16,
    root: PathBuf,
    process: Option<ManagedProcess>,
}

impl S3Server {
    /// Starts a server keeping its data under `dir`, with [`BUCKET`] created.
    pub fn start(dir: &Path) -> Result<Self, Error> {
        let root = dir.join("s3");
        std::fs::create_dir_all(root.join(BUCKET)).map_err(|e| Error::Prepare(root.clone(), e))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(Error::Start)?;
        let mut server = Self {
            port,
            root,
            process: None,
        };
        server.resume()?;
        Ok(server)
    }

    /// Starts the server again on the same port and data.
    pub fn resume(&mut self) -> Result<(), Error> {
        let mut cmd = Command::new(binary()?);
        cmd.args(server_args("127.0.0.1", self.port, &self.root));
        let log = self.root.with_extension("log");
        let process = ManagedProcess::spawn("s3s-fs", cmd, &log).map_err(Error::Start)?;
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                return Err(Error::NotListening {
                    port: self.port,
                    log: process.log_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.process = Some(process);
        Ok(())
    }

    /// Stops the server at once (the store is down).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.signal(libc::SIGKILL);
            p.wait_or_kill(Duration::from_secs(5));
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Where the server keeps `bucket/key`.
    pub fn object_file(&self, key: &str) -> PathBuf {
        self.root.join(BUCKET).join(key)
    }
}
