//! The restore check (`spec.backup.verify`): a completed base backup restored from the
//! store into a scratch directory next to the data directory (`<PGDATA parent>/verify-<id>`,
//! on the same volume, never inside PGDATA), with WAL replayed only to the backup's
//! consistent end (`recovery_target = 'immediate'`; every object's checksums are verified
//! by the store layer on the way), the temporary server stopped cleanly, then
//! `pg_checksums --check` over every page. The scratch directory is removed afterwards
//! whatever happens. The temporary server is the restore's own: no TCP
//! (`listen_addresses = ''`), its socket in a directory of its own
//! ([`VerifyOptions::socket_dir`]), so it never collides with the instance's server.

use crate::base::{self, Manifest, PgTools};
use crate::config::StoreConfig;
use crate::restore::{self, RestoreOptions, Target};
use crate::store::{self, Store};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The scratch directory's name prefix, next to the data directory.
pub const SCRATCH_PREFIX: &str = "verify-";

/// Free space kept beyond the backup's size (WAL replayed to the consistent end, the new
/// timeline's first segment, and room for the running instance).
pub const SPACE_MARGIN_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the data directory {0} has no parent directory for the scratch copy")]
    NoParent(PathBuf),
    #[error("failed to prepare or remove the scratch directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "not enough free space for the scratch copy in {path}: {free} bytes free, {needed} needed (the backup's size plus a margin)"
    )]
    NoSpace {
        path: PathBuf,
        free: u64,
        needed: u64,
    },
    #[error("backup {id} is not in the store (or has no manifest: incomplete)")]
    UnknownBackup { id: String },
    #[error("backup {id} could not be restored")]
    Restore {
        id: String,
        #[source]
        source: Box<restore::Error>,
    },
    #[error("failed to run pg_checksums")]
    Spawn(#[source] std::io::Error),
    #[error("pg_checksums did not finish within {0:?}")]
    ChecksumsTimeout(Duration),
    #[error("pg_checksums --check failed ({status}): {output}")]
    Checksums { status: String, output: String },
    #[error(transparent)]
    Base(#[from] base::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// What to check and how.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub backup_id: String,
    /// The `pgop` binary the restore's `restore_command` runs.
    pub pgop_binary: PathBuf,
    /// Where the restore writes the store configuration `restore_command` reads (outside
    /// the data directory; removed afterwards).
    pub store_config_file: PathBuf,
    /// How long the restore may take, and then pg_checksums.
    pub timeout: Duration,
    /// A directory of its own for the temporary server's Unix socket (created, and removed
    /// afterwards): never the running instance's socket directory, whose server may use
    /// the same port. Short: a socket path is limited to 107 bytes.
    pub socket_dir: PathBuf,
}

/// A backup that restored and whose every page has a valid checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub backup: Manifest,
    /// pg_checksums' "Files scanned".
    pub files: u64,
    /// pg_checksums' "Blocks scanned".
    pub blocks: u64,
}

impl Verified {
    /// One line for `BackupJob.verification`.
    pub fn summary(&self) -> String {
        format!(
            "restored to {} (its consistent end) and checked {} files / {} blocks with pg_checksums, no checksum failure",
            self.backup.end_lsn, self.files, self.blocks
        )
    }
}

/// `<PGDATA parent>/verify-<backup id>`.
pub fn scratch_dir(pgdata: &Path, backup_id: &str) -> Result<PathBuf, Error> {
    let parent = pgdata
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| Error::NoParent(pgdata.to_path_buf()))?;
    Ok(parent.join(format!("{SCRATCH_PREFIX}{backup_id}")))
}

/// Checks backup `options.backup_id` of the store `config` in a scratch directory next to
/// `pgdata` (see the module documentation). Scratch directories left by an interrupted
/// check are removed first.
pub async fn verify(
    config: &StoreConfig,
    tools: &PgTools,
    pgdata: &Path,
    options: &VerifyOptions,
) -> Result<Verified, Error> {
    let scratch = scratch_dir(pgdata, &options.backup_id)?;
    if let Some(parent) = scratch.parent() {
        remove_stale(parent);
    }
    remove(&scratch)?;
    remove(&options.socket_dir)?;
    let result = check(config, tools, &scratch, options).await;
    for dir in [&scratch, &options.socket_dir] {
        if let Err(err) = remove(dir) {
            // The verdict stands; the next check sweeps the leftover.
            tracing::error!(error = %pgop_api::error_chain(&err), "failed to remove the restore check's directory");
        }
    }
    result
}

async fn check(
    config: &StoreConfig,
    tools: &PgTools,
    scratch: &Path,
    options: &VerifyOptions,
) -> Result<Verified, Error> {
    let id = &options.backup_id;
    let store = Store::open(config)?;
    let (backups, _) = base::list(&store).await?;
    let backup = backups
        .iter()
        .find(|b| &b.backup_id == id)
        .cloned()
        .ok_or_else(|| Error::UnknownBackup { id: id.clone() })?;
    if let Some(parent) = scratch.parent() {
        let needed = backup
            .size_bytes
            .saturating_add(backup.size_bytes / 10)
            .saturating_add(SPACE_MARGIN_BYTES);
        if let Some(free) = free_bytes(parent)
            && free < needed
        {
            return Err(Error::NoSpace {
                path: parent.to_path_buf(),
                free,
                needed,
            });
        }
    }
    tracing::info!(backup = %id, scratch = %scratch.display(), "restore check: restoring");
    make_private_dir(&options.socket_dir, tools.run_as)?;
    let restore_options = RestoreOptions {
        backup_id: Some(id.clone()),
        target: Target::Immediate,
        pgop_binary: options.pgop_binary.clone(),
        store_config_file: options.store_config_file.clone(),
        timeout: options.timeout,
        socket_dir: Some(options.socket_dir.clone()),
    };
    restore::restore(config, tools, scratch, &restore_options)
        .await
        .map_err(|source| Error::Restore {
            id: id.clone(),
            source: Box::new(source),
        })?;
    tracing::info!(backup = %id, "restore check: pg_checksums --check");
    let (files, blocks) = pg_checksums(tools, scratch, options.timeout).await?;
    let verified = Verified {
        backup,
        files,
        blocks,
    };
    tracing::info!(backup = %id, summary = %verified.summary(), "restore check passed");
    Ok(verified)
}

/// `pg_checksums --check -D <dir>` on a cleanly stopped data directory: (files, blocks).
async fn pg_checksums(tools: &PgTools, dir: &Path, timeout: Duration) -> Result<(u64, u64), Error> {
    let mut cmd = tools.command("pg_checksums");
    cmd.arg("--check")
        .arg("-D")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::time::timeout(timeout, crate::process::output(&mut cmd))
        .await
        .map_err(|_| Error::ChecksumsTimeout(timeout))?
        .map_err(Error::Spawn)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    parse_checksums(
        out.status.success(),
        &out.status.to_string(),
        &stdout,
        &stderr,
    )
}

/// At most this many of pg_checksums' error lines go into a failure.
const MAX_ERROR_LINES: usize = 5;

fn parse_checksums(
    success: bool,
    status: &str,
    stdout: &str,
    stderr: &str,
) -> Result<(u64, u64), Error> {
    let field = |name: &str| {
        stdout.lines().find_map(|line| {
            line.strip_prefix(name)
                .and_then(|rest| rest.trim().parse::<u64>().ok())
        })
    };
    let files = field("Files scanned:");
    let blocks = field("Blocks scanned:");
    let bad = field("Bad checksums:");
    match (success, files, blocks, bad) {
        (true, Some(files), Some(blocks), Some(0)) => Ok((files, blocks)),
        _ => {
            let errors: Vec<&str> = stderr
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let mut output = errors
                .iter()
                .take(MAX_ERROR_LINES)
                .copied()
                .collect::<Vec<_>>()
                .join("; ");
            if errors.len() > MAX_ERROR_LINES {
                output.push_str(&format!(
                    "; and {} more lines",
                    errors.len() - MAX_ERROR_LINES
                ));
            }
            if let Some(bad) = bad {
                if !output.is_empty() {
                    output.push_str("; ");
                }
                output.push_str(&format!(
                    "{bad} bad checksums in {} blocks",
                    blocks.unwrap_or(0)
                ));
            }
            if output.is_empty() {
                output = format!("no summary in its output: {}", stdout.trim());
            }
            Err(Error::Checksums {
                status: status.to_string(),
                output,
            })
        }
    }
}

/// Free bytes for an unprivileged user on the filesystem of `path`, when known.
fn free_bytes(path: &Path) -> Option<u64> {
    crate::disk::usage(path).map(|u| u.available_bytes)
}

fn make_private_dir(dir: &Path, run_as: Option<(u32, u32)>) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(io)?;
    }
    Ok(())
}

fn remove(dir: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Removes `verify-*` directories in `parent` (left by a check that was interrupted: only
/// one check runs at a time on an instance).
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let is_scratch = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(SCRATCH_PREFIX));
        if is_scratch && entry.file_type().is_ok_and(|t| t.is_dir()) {
            tracing::info!(dir = %entry.path().display(), "removing a leftover scratch copy");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLEAN: &str = "Checksum operation completed\nFiles scanned:   946\n\
        Blocks scanned:  2806\nBad checksums:  0\nData checksum version: 1\n";

    #[test]
    fn a_clean_pass_reports_files_and_blocks() {
        assert_eq!(
            parse_checksums(true, "exit status: 0", CLEAN, "").ok(),
            Some((946, 2806))
        );
    }

    #[test]
    fn failures_keep_pg_checksums_lines_and_the_count() {
        let stdout = CLEAN.replace("Bad checksums:  0", "Bad checksums:  2");
        let stderr = "pg_checksums: error: checksum verification failed in file \"/x/base/5/16384\", block 3: calculated checksum 1A2B but block contains 3C4D\n\
            pg_checksums: error: checksum verification failed in file \"/x/base/5/16384\", block 4: calculated checksum 1A2C but block contains 3C4E\n";
        let err =
            parse_checksums(false, "exit status: 1", &stdout, stderr).expect_err("bad checksums");
        let shown = err.to_string();
        assert!(shown.contains("base/5/16384\", block 3"), "{shown}");
        assert!(shown.contains("2 bad checksums in 2806 blocks"), "{shown}");
        assert!(shown.contains("exit status: 1"), "{shown}");
        let err = parse_checksums(
            false,
            "exit status: 1",
            "",
            "pg_checksums: error: data checksums are not enabled in cluster\n",
        )
        .expect_err("disabled");
        assert!(err.to_string().contains("not enabled"), "{err}");
        assert!(parse_checksums(true, "exit status: 0", "", "").is_err());
    }

    #[test]
    fn the_scratch_copy_is_next_to_pgdata() {
        assert_eq!(
            scratch_dir(
                Path::new("/var/lib/postgresql/data/pgdata"),
                "20250131T120304Z"
            )
            .ok(),
            Some(PathBuf::from(
                "/var/lib/postgresql/data/verify-20250131T120304Z"
            ))
        );
        assert!(scratch_dir(Path::new("pgdata"), "x").is_err());
        assert!(scratch_dir(Path::new("/"), "x").is_err());
    }
}
