//! The write-ahead log on its own volume (`spec.walStorage`): `PGDATA/pg_wal` is a link to
//! `<wal volume>/pg_wal`, made by [`place`] before every start of PostgreSQL.
//!
//! Every data directory pgop makes (initdb, pg_basebackup, a restore, pg_upgrade's new
//! cluster) has its WAL in a plain `pg_wal` directory; [`place`] moves it to the WAL volume
//! the first time, so the one path serves a new instance, a re-cloned one and a cluster
//! that gets `walStorage` later. The volumes are different filesystems: the files are
//! copied, not renamed. It is crash-safe, and run again it converges:
//!
//! 1. copy `PGDATA/pg_wal` into `<wal>/pg_wal.pgop-copy` (emptied first), fsync every file
//!    and directory;
//! 2. replace `<wal>/pg_wal` (what is there belongs to no data directory: `PGDATA/pg_wal`
//!    is still a directory) by the copy, with a rename, and fsync `<wal>`;
//! 3. rename `PGDATA/pg_wal` to `PGDATA/pg_wal.pgop-moved`, make the link, fsync PGDATA;
//! 4. remove `PGDATA/pg_wal.pgop-moved`.
//!
//! After a crash in 3 (no `pg_wal`, a `pg_wal.pgop-moved`), `<wal>/pg_wal` is that
//! directory's complete copy (step 2 ended before 3 began): the link is made. Nothing here
//! ever deletes the only copy of a WAL file.

use super::RunAs;
use std::io;
use std::path::{Path, PathBuf};

/// The directory on the WAL volume that `PGDATA/pg_wal` links to.
pub const WAL_SUBDIR: &str = "pg_wal";
/// The copy being made on the WAL volume (step 1).
const COPYING: &str = "pg_wal.pgop-copy";
/// PGDATA's own `pg_wal` once copied, until it is removed (steps 3 and 4).
const MOVED: &str = "pg_wal.pgop-moved";
/// A new link, renamed over a link that points elsewhere.
const NEW_LINK: &str = "pg_wal.pgop-link";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{link} is a link to {target}, but this instance has no WAL volume: spec.walStorage \
         may not be removed once set (put it back)"
    )]
    LinkWithoutVolume { link: PathBuf, target: PathBuf },
    #[error(
        "{link} links to {target}, which does not exist: the WAL volume lost this data \
         directory's write-ahead log (a standby is re-cloned; restore a primary from a backup)"
    )]
    TargetMissing { link: PathBuf, target: PathBuf },
    #[error(
        "{path} holds no pg_wal (neither a directory nor a link): not a PostgreSQL data directory"
    )]
    NoWal { path: PathBuf },
    #[error("{path} is neither a file nor a directory: pgop does not copy it to the WAL volume")]
    Unexpected { path: PathBuf },
    #[error("failed to {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What [`place`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// Nothing: the WAL was where it belongs.
    AlreadyThere,
    /// The WAL (`files` files, `bytes` bytes) was moved to the WAL volume.
    Moved { files: u64, bytes: u64 },
    /// The link pointed at another path; it points at the WAL volume's directory now.
    Relinked,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

/// Puts the WAL of `pgdata` where it belongs: on the WAL volume `wal_dir` (`PGDATA/pg_wal`
/// a link to `<wal_dir>/pg_wal`), or in PGDATA without one. PostgreSQL must be stopped.
/// New files and directories are owned by `run_as` when the manager runs as root.
pub fn place(
    pgdata: &Path,
    wal_dir: Option<&Path>,
    run_as: Option<RunAs>,
) -> Result<Placed, Error> {
    let pg_wal = pgdata.join("pg_wal");
    let moved = pgdata.join(MOVED);
    let Some(wal_dir) = wal_dir else {
        if let Ok(target) = std::fs::read_link(&pg_wal) {
            return Err(Error::LinkWithoutVolume {
                link: pg_wal,
                target,
            });
        }
        return Ok(Placed::AlreadyThere);
    };
    let target = wal_dir.join(WAL_SUBDIR);
    let source = match std::fs::symlink_metadata(&pg_wal) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let link = std::fs::read_link(&pg_wal).map_err(io_err("read the link", &pg_wal))?;
            if link == target {
                if !target.is_dir() {
                    return Err(Error::TargetMissing {
                        link: pg_wal,
                        target,
                    });
                }
                remove_tree(&moved)?;
                return Ok(Placed::AlreadyThere);
            }
            if !link.exists() {
                // The volume is mounted elsewhere than when the link was made.
                if !target.is_dir() {
                    return Err(Error::TargetMissing {
                        link: pg_wal,
                        target: link,
                    });
                }
                relink(pgdata, &target)?;
                return Ok(Placed::Relinked);
            }
            link
        }
        Ok(meta) if meta.is_dir() => pg_wal.clone(),
        Ok(_) => return Err(Error::Unexpected { path: pg_wal }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !moved.is_dir() {
                return Err(Error::NoWal {
                    path: pgdata.to_path_buf(),
                });
            }
            // Interrupted in step 3: the copy on the volume is complete.
            if target.is_dir() {
                symlink(&target, &pg_wal)?;
                sync_dir(pgdata)?;
                remove_tree(&moved)?;
                return Ok(Placed::Moved { files: 0, bytes: 0 });
            }
            std::fs::rename(&moved, &pg_wal).map_err(io_err("rename back", &moved))?;
            pg_wal.clone()
        }
        Err(e) => return Err(io_err("read", &pg_wal)(e)),
    };

    // 1. the copy
    let copying = wal_dir.join(COPYING);
    remove_tree(&copying)?;
    let mut counts = (0u64, 0u64);
    copy_tree(&source, &copying, run_as, &mut counts)?;
    // 2. in place on the volume
    remove_tree(&target)?;
    std::fs::rename(&copying, &target).map_err(io_err("rename", &copying))?;
    sync_dir(wal_dir)?;
    // 3. the link
    if source == pg_wal {
        std::fs::rename(&pg_wal, &moved).map_err(io_err("rename", &pg_wal))?;
        symlink(&target, &pg_wal)?;
        sync_dir(pgdata)?;
        // 4.
        remove_tree(&moved)?;
    } else {
        relink(pgdata, &target)?;
    }
    Ok(Placed::Moved {
        files: counts.0,
        bytes: counts.1,
    })
}

/// Points `PGDATA/pg_wal` (a link) at `target`, atomically.
fn relink(pgdata: &Path, target: &Path) -> Result<(), Error> {
    let new = pgdata.join(NEW_LINK);
    if std::fs::symlink_metadata(&new).is_ok() {
        std::fs::remove_file(&new).map_err(io_err("remove", &new))?;
    }
    symlink(target, &new)?;
    let pg_wal = pgdata.join("pg_wal");
    std::fs::rename(&new, &pg_wal).map_err(io_err("rename", &new))?;
    sync_dir(pgdata)
}

fn symlink(target: &Path, link: &Path) -> Result<(), Error> {
    std::os::unix::fs::symlink(target, link).map_err(io_err("make the link", link))
}

fn remove_tree(path: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

fn sync_dir(path: &Path) -> Result<(), Error> {
    std::fs::File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", path))
}

/// Copies the directory `from` to `to` (which must not exist): regular files and
/// directories only, modes kept, every file and directory fsynced, owned by `run_as`.
fn copy_tree(
    from: &Path,
    to: &Path,
    run_as: Option<RunAs>,
    counts: &mut (u64, u64),
) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mode = std::fs::metadata(from)
        .map_err(io_err("read", from))?
        .permissions()
        .mode();
    std::fs::DirBuilder::new()
        .mode(mode & 0o7777)
        .create(to)
        .map_err(io_err("create", to))?;
    chown(to, run_as)?;
    let entries = std::fs::read_dir(from).map_err(io_err("read", from))?;
    for entry in entries {
        let entry = entry.map_err(io_err("read", from))?;
        let path = entry.path();
        let dest = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io_err("read", &path))?;
        if kind.is_dir() {
            copy_tree(&path, &dest, run_as, counts)?;
        } else if kind.is_file() {
            let bytes = std::fs::copy(&path, &dest).map_err(io_err("copy", &path))?;
            std::fs::File::open(&dest)
                .and_then(|f| f.sync_all())
                .map_err(io_err("fsync", &dest))?;
            chown(&dest, run_as)?;
            counts.0 += 1;
            counts.1 += bytes;
        } else {
            return Err(Error::Unexpected { path });
        }
    }
    sync_dir(to)
}

fn chown(path: &Path, run_as: Option<RunAs>) -> Result<(), Error> {
    match run_as {
        Some(r) => std::os::unix::fs::chown(path, Some(r.uid), Some(r.gid))
            .map_err(io_err("change the owner of", path)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A PGDATA with a WAL segment and an archive status file, and an empty WAL volume.
    fn setup(name: &str) -> (Dir, PathBuf, PathBuf) {
        let root = std::env::temp_dir().join(format!("pgop-waldir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pgdata = root.join("data/pgdata");
        let wal = root.join("wal");
        std::fs::create_dir_all(pgdata.join("pg_wal/archive_status")).expect("pg_wal");
        std::fs::create_dir_all(&wal).expect("wal volume");
        std::fs::write(
            pgdata.join("pg_wal/000000010000000000000001"),
            vec![7u8; 4096],
        )
        .expect("segment");
        std::fs::write(
            pgdata.join("pg_wal/archive_status/000000010000000000000001.ready"),
            "",
        )
        .expect("status");
        (Dir(root), pgdata, wal)
    }

    fn segment(pgdata: &Path) -> Vec<u8> {
        std::fs::read(pgdata.join("pg_wal/000000010000000000000001")).expect("segment via pg_wal")
    }

    #[test]
    fn the_wal_moves_to_its_volume_once_and_stays_readable_through_pg_wal() {
        let (_d, pgdata, wal) = setup("move");
        assert_eq!(
            place(&pgdata, Some(&wal), None).expect("place"),
            Placed::Moved {
                files: 2,
                bytes: 4096
            }
        );
        assert_eq!(
            std::fs::read_link(pgdata.join("pg_wal")).expect("a link"),
            wal.join("pg_wal")
        );
        assert_eq!(segment(&pgdata), vec![7u8; 4096]);
        assert!(
            pgdata
                .join("pg_wal/archive_status/000000010000000000000001.ready")
                .exists()
        );
        assert!(!pgdata.join(MOVED).exists() && !wal.join(COPYING).exists());
        assert_eq!(
            place(&pgdata, Some(&wal), None).expect("again"),
            Placed::AlreadyThere
        );
        // Without the volume, the link is an error that says what to do.
        let e = place(&pgdata, None, None).expect_err("no volume");
        assert!(
            e.to_string().contains("spec.walStorage may not be removed"),
            "{e}"
        );
    }

    #[test]
    fn a_stale_copy_on_the_volume_is_replaced_by_the_data_directorys_wal() {
        let (_d, pgdata, wal) = setup("stale");
        // What an earlier data directory (wiped and cloned again) left on the volume.
        std::fs::create_dir_all(wal.join("pg_wal")).expect("stale");
        std::fs::write(wal.join("pg_wal/000000010000000000000009"), "old").expect("stale");
        std::fs::create_dir_all(wal.join(COPYING)).expect("partial copy");
        place(&pgdata, Some(&wal), None).expect("place");
        assert!(!wal.join("pg_wal/000000010000000000000009").exists());
        assert_eq!(segment(&pgdata), vec![7u8; 4096]);
    }

    #[test]
    fn a_move_interrupted_between_rename_and_link_is_finished() {
        let (_d, pgdata, wal) = setup("interrupted");
        // As after step 2 and the rename of step 3.
        let mut counts = (0, 0);
        copy_tree(
            &pgdata.join("pg_wal"),
            &wal.join("pg_wal"),
            None,
            &mut counts,
        )
        .expect("copy");
        std::fs::rename(pgdata.join("pg_wal"), pgdata.join(MOVED)).expect("rename");
        place(&pgdata, Some(&wal), None).expect("finish");
        assert_eq!(segment(&pgdata), vec![7u8; 4096]);
        assert!(!pgdata.join(MOVED).exists());
        // Renamed but the volume's copy missing (cannot happen in order, but never lose
        // the only copy): renamed back and moved again.
        let (_d2, pgdata, wal) = setup("interrupted-early");
        std::fs::rename(pgdata.join("pg_wal"), pgdata.join(MOVED)).expect("rename");
        place(&pgdata, Some(&wal), None).expect("redo");
        assert_eq!(segment(&pgdata), vec![7u8; 4096]);
    }

    #[test]
    fn a_link_to_a_missing_directory_is_relinked_or_refused() {
        let (_d, pgdata, wal) = setup("relink");
        place(&pgdata, Some(&wal), None).expect("place");
        // The volume mounted at another path now.
        let elsewhere = wal.with_file_name("wal2");
        std::fs::rename(&wal, &elsewhere).expect("move the volume");
        assert_eq!(
            place(&pgdata, Some(&elsewhere), None).expect("relink"),
            Placed::Relinked
        );
        assert_eq!(segment(&pgdata), vec![7u8; 4096]);
        // The volume emptied: refused, naming the loss.
        std::fs::remove_dir_all(elsewhere.join("pg_wal")).expect("lose it");
        let e = place(&pgdata, Some(&elsewhere), None).expect_err("lost");
        assert!(matches!(e, Error::TargetMissing { .. }), "{e}");
    }

    #[test]
    fn without_a_volume_a_plain_pg_wal_is_left_alone() {
        let (_d, pgdata, _wal) = setup("none");
        assert_eq!(
            place(&pgdata, None, None).expect("nothing"),
            Placed::AlreadyThere
        );
        assert!(
            std::fs::symlink_metadata(pgdata.join("pg_wal"))
                .expect("pg_wal")
                .is_dir()
        );
    }
}
