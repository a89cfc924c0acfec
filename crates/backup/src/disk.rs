//! How full a filesystem is (`statvfs(3)`): the restore check of [`crate::verify`] and the
//! instance manager's report of its volume.

use std::path::Path;

/// A filesystem's size and use, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Its whole size (`f_blocks`).
    pub capacity_bytes: u64,
    /// Bytes in use (`f_blocks - f_bfree`).
    pub used_bytes: u64,
    /// Bytes an unprivileged user may still write (`f_bavail`).
    pub available_bytes: u64,
}

/// The filesystem that holds `path`, or its nearest existing ancestor while `path` does not
/// exist (a data directory before initdb, below the volume's mount), when `statvfs`
/// answers.
pub fn usage(path: &Path) -> Option<Usage> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct; c_path is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return None;
    }
    #[allow(clippy::useless_conversion)]
    let (blocks, free, avail, size) = (
        u64::from(stat.f_blocks),
        u64::from(stat.f_bfree),
        u64::from(stat.f_bavail),
        u64::from(stat.f_frsize),
    );
    Some(Usage {
        capacity_bytes: blocks.saturating_mul(size),
        used_bytes: blocks.saturating_sub(free).saturating_mul(size),
        available_bytes: avail.saturating_mul(size),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filesystem_of_a_directory_or_of_its_nearest_ancestor_has_a_size() {
        let dir = std::env::temp_dir();
        let u = usage(&dir).expect("statvfs of the temporary directory");
        assert!(u.capacity_bytes > 0);
        assert!(u.used_bytes <= u.capacity_bytes);
        assert!(u.available_bytes <= u.capacity_bytes);
        let missing = usage(&dir.join("pgop-no-such-directory/x")).expect("its ancestor's");
        assert_eq!(missing.capacity_bytes, u.capacity_bytes);
        assert_eq!(usage(Path::new("relative-and-missing")), None);
    }
}
