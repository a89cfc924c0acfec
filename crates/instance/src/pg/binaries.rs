//! Where PostgreSQL's programs live (`PGOP_PG_BIN`, else `pg_config --bindir` on PATH, else
//! the newest `/usr/lib/postgresql/*/bin`) and which OS user runs them. It must never run
//! PostgreSQL as root: when the manager itself is root (CI, tests), every PostgreSQL program
//! runs as the configured unprivileged user.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// The environment variable naming PostgreSQL's binary directory.
pub const ENV_PG_BIN: &str = "PGOP_PG_BIN";

/// The environment variable naming the binary directory of one major version:
/// `PGOP_PG_BIN_<major>` (`PGOP_PG_BIN_18`).
pub fn env_pg_bin_of(major: u32) -> String {
    format!("{ENV_PG_BIN}_{major}")
}

/// Where `hack/install-postgres18.sh` installs a major version Debian does not package
/// (PostgreSQL 18, built from the source tarball of Debian's `postgresql-18`): `<root>/<major>/bin`.
pub const INSTALL_ROOT: &str = "/var/cache/pgop/postgresql";

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
    #[error(
        "failed to find PostgreSQL {major}'s binaries: looked in {}; install them (PostgreSQL 15: hack/install-packages.sh demo; 18: hack/install-postgres18.sh) or set {}",
        .looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        env_pg_bin_of(*.major)
    )]
    FindMajor { major: u32, looked: Vec<PathBuf> },
    #[error("failed to run {program} --version")]
    RunVersion {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} --version printed {printed:?}, not a PostgreSQL version")]
    ParseVersion { program: PathBuf, printed: String },
}

/// PostgreSQL's binary directory, checked to hold the programs pgop runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
    /// The major version, once `postgres --version` told it ([`Binaries::major`]).
    major: std::sync::OnceLock<u32>,
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
        Ok(Self {
            dir,
            major: std::sync::OnceLock::new(),
        })
    }

    /// The binaries of PostgreSQL `major`, from the first place that holds that major
    /// (`postgres --version`): `explicit` (the manager's `--pg-bin`), `PGOP_PG_BIN_<major>`,
    /// Debian's `/usr/lib/postgresql/<major>/bin` (and the images'), then
    /// [`INSTALL_ROOT`]`/<major>/bin`.
    pub fn for_major(major: u32, explicit: Option<&Path>) -> Result<Self, Error> {
        let mut candidates = Vec::new();
        if let Some(dir) = explicit {
            candidates.push(dir.to_path_buf());
        }
        if let Some(dir) = std::env::var_os(env_pg_bin_of(major)).filter(|d| !d.is_empty()) {
            candidates.push(PathBuf::from(dir));
        }
        candidates.push(PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")));
        candidates.push(Path::new(INSTALL_ROOT).join(major.to_string()).join("bin"));
        let mut looked = Vec::new();
        for dir in candidates {
            if !dir.join("postgres").is_file() {
                looked.push(dir);
                continue;
            }
            // Another major's directory (an image's PGOP_PG_BIN for its default, say) is
            // passed over, and named in the error.
            let found = Self::locate(Some(&dir))?;
            match found.major()? {
                m if m == major => return Ok(found),
                other => looked.push(PathBuf::from(format!(
                    "{} (PostgreSQL {other})",
                    dir.display()
                ))),
            }
        }
        Err(Error::FindMajor { major, looked })
    }

    /// The major version of these binaries, from `postgres --version` (run once, then
    /// remembered).
    pub fn major(&self) -> Result<u32, Error> {
        if let Some(major) = self.major.get() {
            return Ok(*major);
        }
        let program = self.program("postgres");
        let out = std::process::Command::new(&program)
            .arg("--version")
            .env("LC_ALL", "C")
            .output()
            .map_err(|source| Error::RunVersion {
                program: program.clone(),
                source,
            })?;
        let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let major = parse_major(&printed).ok_or(Error::ParseVersion { program, printed })?;
        Ok(*self.major.get_or_init(|| major))
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

pub use pgop_api::instance_status::parse_major;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_majors_directory_is_passed_over() {
        // Debian's PostgreSQL 15 (hack/install-packages.sh), as an image's PGOP_PG_BIN.
        let fifteen = Path::new("/usr/lib/postgresql/15/bin");
        let found = Binaries::for_major(15, Some(fifteen)).expect("PostgreSQL 15 installed");
        assert_eq!(found.dir(), fifteen);
        assert_eq!(found.major().expect("a version"), 15);
        match Binaries::for_major(18, Some(fifteen)) {
            Ok(eighteen) => {
                assert_ne!(eighteen.dir(), fifteen);
                assert_eq!(eighteen.major().expect("a version"), 18);
            }
            Err(e) => assert!(
                e.to_string()
                    .contains("/usr/lib/postgresql/15/bin (PostgreSQL 15)"),
                "{e}"
            ),
        }
    }

    #[test]
    fn a_missing_major_names_where_it_looked_and_how_to_install_it() {
        let err = Binaries::for_major(7, Some(Path::new("/nonexistent/bin")))
            .expect_err("no PostgreSQL 7 anywhere");
        let text = err.to_string();
        assert!(text.contains("/nonexistent/bin"), "{text}");
        assert!(text.contains("/usr/lib/postgresql/7/bin"), "{text}");
        assert!(text.contains("/var/cache/pgop/postgresql/7/bin"), "{text}");
        assert!(text.contains("PGOP_PG_BIN_7"), "{text}");
        assert!(text.contains("hack/install-postgres18.sh"), "{text}");
    }
}
