//! Where PostgreSQL's programs live (`PGOP_PG_BIN`, else `pg_config --bindir` on PATH, else
//! the newest `/usr/lib/postgresql/*/bin`) and which OS user runs them. It must never run
//! PostgreSQL as root: when the manager itself is root (CI, tests), every PostgreSQL program
//! runs as the configured unprivileged user.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// The environment variable naming PostgreSQL's binary directory.
pub const ENV_PG_BIN: &str = "PGOP_PG_BIN";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "failed to find PostgreSQL's binaries: set {ENV_PG_BIN}, put pg_config on PATH or install /usr/lib/postgresql/<version>/bin"
    )]
    FindBinaries,
    #[error("failed to find {program} in {dir}")]
    FindProgram { program: String, dir: PathBuf },
    #[error("failed to look up OS user {user}")]
    LookUpUser { user: String },
}

/// PostgreSQL's binary directory, checked to hold the programs pgop runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The programs pgop needs.
    const PROGRAMS: &[&str] = &["postgres", "initdb", "pg_basebackup", "pg_rewind", "pg_ctl"];

    /// Uses `dir` when given (flag or `PGOP_PG_BIN`), else discovers the directory.
    pub fn locate(dir: Option<&Path>) -> Result<Self, Error> {
        let dir = match dir {
            Some(dir) => dir.to_path_buf(),
            None => match std::env::var_os(ENV_PG_BIN) {
                Some(dir) if !dir.is_empty() => PathBuf::from(dir),
                _ => discover().ok_or(Error::FindBinaries)?,
            },
        };
        for program in Self::PROGRAMS {
            if !dir.join(program).is_file() {
                return Err(Error::FindProgram {
                    program: (*program).to_string(),
                    dir,
                });
            }
        }
        Ok(Self { dir })
    }

    /// The binary directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of one program.
    pub fn program(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// `pg_config --bindir` when pg_config is on PATH, else the newest Debian-style directory.
fn discover() -> Option<PathBuf> {
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("postgres").is_file() {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

/// The unprivileged OS user PostgreSQL's programs run as, when the manager is root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    /// Looks `user` up in the user database (getpwnam).
    pub fn user(user: &str) -> Result<Self, Error> {
        let lookup = || Error::LookUpUser {
            user: user.to_string(),
        };
        let name = CString::new(user).map_err(|_| lookup())?;
        // SAFETY: getpwnam gets a valid NUL-terminated string; the returned record is read
        // at once, before any other call could overwrite its static storage.
        let entry = unsafe { libc::getpwnam(name.as_ptr()) };
        if entry.is_null() {
            return Err(lookup());
        }
        // SAFETY: non-null, points to the static passwd record just returned.
        let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
        Ok(Self { uid, gid })
    }

    /// Needed only when the manager runs as root; `None` when it already is unprivileged.
    pub fn when_root(user: &str) -> Result<Option<Self>, Error> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            Self::user(user).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Gives `path` (a directory pgop created for PostgreSQL) to this user.
    pub fn chown(&self, path: &Path) -> std::io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }
}

/// A command for a PostgreSQL program, run as `run_as` when given.
pub fn command(binaries: &Binaries, program: &str, run_as: Option<RunAs>) -> Command {
    let mut cmd = Command::new(binaries.program(program));
    if let Some(user) = run_as {
        cmd.uid(user.uid).gid(user.gid);
    }
    // LC_ALL=C: PostgreSQL's messages stay in English whatever the image's locale.
    cmd.env("LC_ALL", "C").kill_on_drop(true);
    cmd
}
