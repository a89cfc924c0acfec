//! The temporary directory of one control plane: `$TMPDIR/pgop-testenv/<pid>-<n>`.
//!
//! A later run removes directories whose owner died without cleaning up (SIGKILL gives a
//! process no chance to): the owner holds an exclusive `flock` on the directory's `.owner`
//! file for as long as it lives (the kernel drops it with the process), so a directory
//! whose lock can be taken is dead. A lock works across PID namespaces, where the pid in
//! the name (`<pid>-<n>`) means nothing: a run in another namespace once removed a live
//! control plane's directory because its pid was not alive in its own. Directories without
//! the file (older runs) fall back to the pid.

use crate::process;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Keep the directory (logs, certificates) after the harness stops, for debugging.
pub const KEEP_ENV: &str = "PGOP_TESTENV_KEEP";

#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
    /// `.owner`, locked while this process lives.
    _owner: std::fs::File,
}

/// The owner's lock file in a work directory.
const OWNER_FILE: &str = ".owner";

/// Takes `file`'s exclusive lock without waiting; false when another process holds it.
fn try_lock(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function's caller owns and keeps open.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn root() -> PathBuf {
    std::env::temp_dir().join("pgop-testenv")
}

impl WorkDir {
    pub fn create() -> io::Result<Self> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let root = root();
        std::fs::create_dir_all(&root)?;
        sweep_dead(&root);
        crate::real_nodes::cgroup::sweep_dead();
        let pid = std::process::id();
        loop {
            let n = SEQ.fetch_add(1, Ordering::Relaxed);
            let path = root.join(format!("{pid}-{n}"));
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    let owner = std::fs::File::create(path.join(OWNER_FILE))?;
                    if !try_lock(&owner) {
                        return Err(io::Error::other("could not lock a new work directory"));
                    }
                    process::register_dir(&path);
                    return Ok(Self {
                        path,
                        _owner: owner,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        process::forget_dir(&self.path);
        if std::env::var_os(KEEP_ENV).is_some() {
            eprintln!("testenv: kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes directories left by processes that no longer exist.
fn sweep_dead(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let dead = match std::fs::File::open(entry.path().join(OWNER_FILE)) {
            Ok(owner) => try_lock(&owner),
            // Being made this instant, or left by a run before the lock file: its pid.
            Err(_) => {
                let young = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age < std::time::Duration::from_secs(60));
                !young && !process::pid_alive(pid)
            }
        };
        if dead {
            // Pod processes of a killed run may have outlived it.
            process::kill_tagged(process::OWNER_ENV, &entry.path().display().to_string());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owners_lock_not_the_pid_says_whether_a_directory_is_alive() {
        let root = std::env::temp_dir().join(format!("pgop-workdir-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // pid 1 is alive here; in another PID namespace it would be someone else.
        let dead = root.join("1-900");
        let alive = root.join("1-901");
        for dir in [&dead, &alive] {
            std::fs::create_dir_all(dir).expect("dir");
            std::fs::File::create(dir.join(OWNER_FILE)).expect("owner file");
        }
        // The live one's owner holds its lock (a second open file conflicts, even here).
        let held = std::fs::File::open(alive.join(OWNER_FILE)).expect("open");
        assert!(try_lock(&held));
        // Without a lock file, a young directory stays (being made) whatever its pid.
        let young = root.join("4000000-1");
        std::fs::create_dir_all(&young).expect("dir");
        sweep_dead(&root);
        assert!(
            !dead.exists(),
            "an unlocked directory is dead, its pid alive or not"
        );
        assert!(alive.exists(), "a locked directory is alive");
        assert!(young.exists(), "a directory being made is left alone");
        drop(held);
        let _ = std::fs::remove_dir_all(&root);
    }
}
