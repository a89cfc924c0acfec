//! The temporary directory of one control plane: `$TMPDIR/pgop-testenv/<pid>-<n>`.
//!
//! The owning pid is part of the name, so a later run can remove directories whose owner
//! died without cleaning up (SIGKILL gives a process no chance to).

use crate::process;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Keep the directory (logs, certificates) after the harness stops, for debugging.
pub const KEEP_ENV: &str = "PGOP_TESTENV_KEEP";

#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
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
                    process::register_dir(&path);
                    return Ok(Self { path });
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
        if pid != std::process::id() && !process::pid_alive(pid) {
            // Pod processes of a killed run may have outlived it.
            process::kill_tagged(process::OWNER_ENV, &entry.path().display().to_string());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
