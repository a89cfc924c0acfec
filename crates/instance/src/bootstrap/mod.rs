//! Creating the data directory: initdb for the first primary, pg_basebackup for a standby.
//! Bootstrap is restartable: a marker file beside PGDATA is written before and removed after,
//! so a half-finished directory is wiped and redone. It must never start PostgreSQL on a data
//! directory whose marker is still there.

pub mod clone;
pub mod initdb;

use crate::pg::RunAs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Output;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to run {program}")]
    SpawnProgram {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to run {program}: it exited with {status}: {stderr}")]
    RunProgram {
        program: &'static str,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("failed to prepare the data directory {path}")]
    PrepareDataDirectory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to mark the data directory complete")]
    FinishBootstrap(#[source] std::io::Error),
    #[error("failed to create the application database and roles")]
    CreateRoles(#[source] tokio_postgres::Error),
    #[error(
        "refusing to create the application {what} {name:?}: it is reserved (the superuser, the \
         replication role, a template database or a name PostgreSQL reserves) or no lower-case \
         identifier"
    )]
    ReservedName { what: &'static str, name: String },
}

/// The credentials bootstrap creates (from the cluster's `-app` and `-replication` Secrets).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub app_user: String,
    pub app_password: String,
    pub app_database: String,
    pub replication_user: String,
    pub replication_password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Passwords never reach a log line.
        f.debug_struct("Credentials")
            .field("app_user", &self.app_user)
            .field("app_database", &self.app_database)
            .field("replication_user", &self.replication_user)
            .finish_non_exhaustive()
    }
}

/// What is in the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataState {
    /// Nothing usable: bootstrap.
    Missing,
    /// A bootstrap was interrupted: wipe and bootstrap again.
    Incomplete,
    /// A complete data directory.
    Ready,
    /// A complete data directory of an older major than the binaries (its `PG_VERSION`):
    /// PostgreSQL cannot start it. A standby re-clones; the primary waits for an upgrade
    /// ([`crate::upgrade`]).
    OlderMajor(u32),
}

/// The marker beside PGDATA (PGDATA itself must be empty for initdb and pg_basebackup).
pub fn marker_path(pgdata: &Path) -> PathBuf {
    let mut name = pgdata
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "pgdata".into());
    name.push(".pgop-bootstrapping");
    pgdata.with_file_name(name)
}

/// Looks at the data directory and the marker; `major`: the binaries' major version, when
/// known (a complete directory of an older one is [`DataState::OlderMajor`]).
pub fn inspect(pgdata: &Path, major: Option<u32>) -> DataState {
    if marker_path(pgdata).exists() {
        DataState::Incomplete
    } else if pgdata.join("PG_VERSION").is_file() && pgdata.join("global/pg_control").is_file() {
        match (data_major(pgdata), major) {
            (Some(found), Some(binaries)) if found < binaries => DataState::OlderMajor(found),
            _ => DataState::Ready,
        }
    } else if pgdata.exists()
        && std::fs::read_dir(pgdata).is_ok_and(|mut entries| entries.next().is_some())
    {
        // Files without PG_VERSION: not ours to trust, and not a finished bootstrap.
        DataState::Incomplete
    } else {
        DataState::Missing
    }
}

/// The major version a data directory was made by (its `PG_VERSION`), when it says.
pub fn data_major(pgdata: &Path) -> Option<u32> {
    read_data_major(pgdata).ok().flatten()
}

/// The major version a data directory was made by (its `PG_VERSION`): none without the
/// file; an error naming it when it cannot be read or holds no major version.
pub fn read_data_major(pgdata: &Path) -> Result<Option<u32>, String> {
    let path = pgdata.join("PG_VERSION");
    match std::fs::read_to_string(&path) {
        Ok(text) => crate::pg::binaries::parse_major(&text)
            .map(Some)
            .ok_or_else(|| format!("{} holds {text:?}, not a major version", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("failed to read {}: {e}", path.display())),
    }
}

/// Writes the marker, then leaves PGDATA empty (mode 0700, owned by PostgreSQL's user).
pub fn begin(pgdata: &Path, run_as: Option<RunAs>) -> Result<(), Error> {
    let prepare = |path: &Path| -> std::io::Result<()> {
        std::fs::write(marker_path(path), b"bootstrap in progress\n")?;
        sync_parent(path)?;
        if path.exists() {
            std::fs::remove_dir_all(path)?;
        }
        std::fs::DirBuilder::new().mode(0o700).create(path)?;
        if let Some(user) = run_as {
            user.chown(path)?;
        }
        Ok(())
    };
    prepare(pgdata).map_err(|source| Error::PrepareDataDirectory {
        path: pgdata.to_path_buf(),
        source,
    })
}

/// Gives an existing data directory back the mode PostgreSQL demands (0700: it refuses to
/// start on a directory that its group may write or others may read). A kubelet applying
/// the Pod's `fsGroup` to a volume with `fsGroupChangePolicy: Always` (the default; pgop's
/// Pods ask for `OnRootMismatch`) adds group write permission to every file on each
/// mount, so a Pod created anew on its old volume would find it 2770. Returns the mode it
/// found when it changed it; nothing when PGDATA is missing or already private.
pub fn restore_mode(pgdata: &Path) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(pgdata) {
        Ok(m) if m.is_dir() => m.permissions().mode() & 0o7777,
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if mode & 0o7077 == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(pgdata, std::fs::Permissions::from_mode(0o700))?;
    Ok(Some(mode))
}

/// Removes the marker once the data directory is complete and durable.
pub fn finish(pgdata: &Path) -> Result<(), Error> {
    std::fs::remove_file(marker_path(pgdata))
        .and_then(|()| sync_parent(pgdata))
        .map_err(Error::FinishBootstrap)
}

pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(parent) => std::fs::File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

/// Runs a program to completion; its stderr becomes the error message on failure.
pub(crate) async fn run(
    program: &'static str,
    mut cmd: tokio::process::Command,
) -> Result<Output, Error> {
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child =
        crate::reaper::spawn(&mut cmd).map_err(|source| Error::SpawnProgram { program, source })?;
    // Forgotten also when this future is dropped (the child is then killed and reaped by
    // tokio in the background).
    let _registered = crate::reaper::Registered(child.id());
    let output = child.wait_with_output().await;
    let output = output.map_err(|source| Error::SpawnProgram { program, source })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(Error::RunProgram {
            program,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_opened_to_its_group_is_made_private_again() -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pgop-restore-mode-{}", std::process::id()));
        let pgdata = dir.join("pgdata");
        std::fs::create_dir_all(&pgdata)?;
        let mode = |p: &Path| -> std::io::Result<u32> {
            Ok(std::fs::metadata(p)?.permissions().mode() & 0o7777)
        };
        // What a kubelet's fsGroup change leaves: group rwx and setgid.
        std::fs::set_permissions(&pgdata, std::fs::Permissions::from_mode(0o2770))?;
        assert_eq!(restore_mode(&pgdata)?, Some(0o2770));
        assert_eq!(mode(&pgdata)?, 0o700);
        assert_eq!(restore_mode(&pgdata)?, None, "already private");
        assert_eq!(restore_mode(&dir.join("missing"))?, None);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn a_complete_data_directory_of_an_older_major_is_not_ready() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("pgop-inspect-major-{}", std::process::id()));
        let pgdata = dir.join("pgdata");
        std::fs::create_dir_all(pgdata.join("global"))?;
        std::fs::write(pgdata.join("PG_VERSION"), "15\n")?;
        std::fs::write(pgdata.join("global/pg_control"), b"")?;
        assert_eq!(inspect(&pgdata, Some(18)), DataState::OlderMajor(15));
        assert_eq!(inspect(&pgdata, Some(15)), DataState::Ready);
        assert_eq!(inspect(&pgdata, None), DataState::Ready, "major unknown");
        std::fs::write(marker_path(&pgdata), b"")?;
        assert_eq!(inspect(&pgdata, Some(18)), DataState::Incomplete);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn the_marker_sits_beside_pgdata() {
        assert_eq!(
            marker_path(Path::new("/var/lib/postgresql/data/pgdata")),
            Path::new("/var/lib/postgresql/data/pgdata.pgop-bootstrapping")
        );
    }
}
