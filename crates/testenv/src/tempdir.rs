//! A scratch directory for one test: `$TMPDIR/pgop-<label>-<pid>`, emptied when made and
//! removed when dropped.

use std::path::PathBuf;

/// A directory of its own under the temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `$TMPDIR/pgop-<label>-<pid>`, made empty.
    pub fn new(label: &str) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("pgop-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
