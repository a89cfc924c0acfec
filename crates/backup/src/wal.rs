//! Continuous WAL archiving (`archive_command`) and its counterpart for recovery
//! (`restore_command`).
//!
//! Archiving is idempotent: a WAL file already in the store with the same content is a
//! success (PostgreSQL retries after a crash between upload and its own bookkeeping); one
//! with different content under the same name is an error, never overwritten. When
//! PostgreSQL is behind (several `.ready` files in `pg_wal/archive_status`), the next ones
//! are uploaded alongside, in parallel; their own `archive_command` later only finds them
//! there (one small range read and a local checksum).

use crate::store::{self, Store, sha256_hex};
use bytes::Bytes;
use futures::StreamExt;
use std::path::{Path, PathBuf};

/// WAL files uploaded at once when archiving is behind (the one asked for included).
pub const ARCHIVE_PARALLELISM: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not a WAL file name")]
    Name(String),
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{object} is already archived with different content (SHA-256 {stored}, this file's is {local}); refusing to overwrite it"
    )]
    Conflict {
        object: String,
        stored: String,
        local: String,
    },
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// A WAL file name: a segment (`TTTTTTTTXXXXXXXXYYYYYYYY`, optionally `.partial` or
/// `.XXXXXXXX.backup`) or a timeline history file (`TTTTTTTT.history`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WalName {
    pub timeline: u32,
    /// (log, segment) of a segment file; `None` for a history file.
    pub position: Option<(u32, u32)>,
    pub name: String,
}

impl WalName {
    pub fn parse(name: &str) -> Option<Self> {
        let hex8 = |s: &str| -> Option<u32> {
            (s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        if let Some(tli) = name.strip_suffix(".history") {
            return Some(Self {
                timeline: hex8(tli)?,
                position: None,
                name: name.to_string(),
            });
        }
        let base = name.get(..24)?;
        let rest = &name[24..];
        let suffix_ok = rest.is_empty()
            || rest == ".partial"
            || (rest.ends_with(".backup")
                && rest.len() == 1 + 8 + 7
                && hex8(&rest[1..9]).is_some());
        if !suffix_ok {
            return None;
        }
        Some(Self {
            timeline: hex8(&base[..8])?,
            position: Some((hex8(&base[8..16])?, hex8(&base[16..24])?)),
            name: name.to_string(),
        })
    }

    /// The segment after this one on its timeline, for 16 MiB segments (pgop's): `None`
    /// for a history file or a suffixed name.
    pub fn next(&self) -> Option<Self> {
        let (log, seg) = self.position?;
        if self.name.len() != 24 {
            return None;
        }
        let (log, seg) = if seg >= 0xFF {
            (log.checked_add(1)?, 0)
        } else {
            (log, seg + 1)
        };
        Some(Self {
            timeline: self.timeline,
            position: Some((log, seg)),
            name: format!("{:08X}{log:08X}{seg:08X}", self.timeline),
        })
    }

    /// The object's key relative to the cluster's root.
    pub fn key(&self) -> String {
        format!("wal/{:08X}/{}.gz", self.timeline, self.name)
    }

    /// The name back from a key made by [`WalName::key`].
    pub fn from_key(key: &str) -> Option<Self> {
        let name = key.strip_prefix("wal/")?.split_once('/')?.1;
        Self::parse(name.strip_suffix(".gz")?)
    }
}

/// The segment holding `lsn` on `timeline`, for 16 MiB segments (`wal_segment_size`).
pub fn segment_of(timeline: u32, lsn: u64, segment_size: u64) -> WalName {
    let segments_per_log = 0x1_0000_0000u64 / segment_size;
    let segno = lsn / segment_size;
    let log = u32::try_from(segno / segments_per_log).unwrap_or(u32::MAX);
    let seg = u32::try_from(segno % segments_per_log).unwrap_or(u32::MAX);
    WalName {
        timeline,
        position: Some((log, seg)),
        name: format!("{timeline:08X}{log:08X}{seg:08X}"),
    }
}

/// What an archive call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Archived {
    Uploaded,
    /// The same content was already in the store.
    AlreadyThere,
}

/// Archives one WAL file (`%p`, relative to `cwd`, PostgreSQL's data directory), and,
/// when PostgreSQL is behind, the next ready ones in parallel.
pub async fn archive(store: &Store, cwd: &Path, wal_path: &Path) -> Result<Archived, Error> {
    let path = cwd.join(wal_path);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| Error::Name(wal_path.display().to_string()))?;
    let wal = WalName::parse(&name).ok_or_else(|| Error::Name(name.clone()))?;
    let ahead = ready_after(&path, &wal, ARCHIVE_PARALLELISM - 1);
    let first = archive_one(store, &path, &wal);
    let others = futures::stream::iter(ahead.into_iter().map(|(p, w)| async move {
        if let Err(err) = archive_one(store, &p, &w).await {
            // Only a head start: PostgreSQL's own call for it reports any error.
            tracing::debug!(wal = %w.name, error = %pgop_api::error_chain(&err), "archiving ahead failed");
        }
    }))
    .buffer_unordered(ARCHIVE_PARALLELISM)
    .collect::<Vec<()>>();
    let (result, _) = futures::join!(first, others);
    result
}

/// Up to `max` WAL files waiting for archiving (`.ready`) after `wal`, oldest first.
fn ready_after(path: &Path, wal: &WalName, max: usize) -> Vec<(PathBuf, WalName)> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir.join("archive_status")) else {
        return Vec::new();
    };
    let mut ready: Vec<WalName> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".ready")?.to_string();
            WalName::parse(&name)
        })
        .filter(|w| w.position.is_some() && w.name != wal.name && w > wal)
        .collect();
    ready.sort();
    ready.truncate(max);
    ready.into_iter().map(|w| (dir.join(&w.name), w)).collect()
}

async fn archive_one(store: &Store, path: &Path, wal: &WalName) -> Result<Archived, Error> {
    let content = tokio::fs::read(path).await.map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let key = wal.key();
    let local = {
        let content = Bytes::from(content);
        let for_hash = content.clone();
        let hash = tokio::task::spawn_blocking(move || sha256_hex(&for_hash))
            .await
            .map_err(|e| Error::Read {
                path: path.to_path_buf(),
                source: std::io::Error::other(e),
            })?;
        (content, hash)
    };
    let (content, hash) = local;
    if let Some(footer) = store.footer(&key).await? {
        if footer.content_sha256 == hash {
            return Ok(Archived::AlreadyThere);
        }
        return Err(Error::Conflict {
            object: store.name(&key),
            stored: footer.content_sha256,
            local: hash,
        });
    }
    store.put(&key, content, true).await?;
    Ok(Archived::Uploaded)
}

/// Restores WAL file `name` (`%f`) to `dest` (`%p`, relative to `cwd`); `false` when the
/// store has no such file (PostgreSQL asks for files that may not exist).
pub async fn restore(store: &Store, cwd: &Path, name: &str, dest: &Path) -> Result<bool, Error> {
    let wal = WalName::parse(name).ok_or_else(|| Error::Name(name.to_string()))?;
    let Some(content) = store.get(&wal.key(), true).await? else {
        return Ok(false);
    };
    let dest = cwd.join(dest);
    let tmp = dest.with_extension("pgop-restoring");
    let write = async {
        tokio::fs::write(&tmp, &content).await?;
        tokio::fs::rename(&tmp, &dest).await
    };
    write
        .await
        .map_err(|source| Error::Write { path: dest, source })?;
    Ok(true)
}

/// Whether WAL file `name` is in the store (its footer readable).
pub async fn exists(store: &Store, name: &WalName) -> Result<bool, Error> {
    Ok(store.footer(&name.key()).await?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_names_parse_and_order() {
        let seg = WalName::parse("000000010000000A000000FF").expect("segment");
        assert_eq!(seg.timeline, 1);
        assert_eq!(seg.position, Some((0xA, 0xFF)));
        assert_eq!(seg.key(), "wal/00000001/000000010000000A000000FF.gz");
        assert_eq!(WalName::from_key(&seg.key()), Some(seg.clone()));
        assert_eq!(
            seg.next().map(|n| n.name),
            Some("000000010000000B00000000".to_string())
        );
        assert_eq!(
            WalName::parse("000000020000000A00000003")
                .and_then(|w| w.next())
                .map(|n| n.name),
            Some("000000020000000A00000004".to_string())
        );
        let hist = WalName::parse("00000002.history").expect("history");
        assert_eq!(hist.next(), None);
        assert_eq!((hist.timeline, hist.position), (2, None));
        assert!(WalName::parse("000000010000000000000003.partial").is_some());
        assert!(WalName::parse("000000010000000000000003.00000028.backup").is_some());
        for bad in [
            "RECOVERYXLOG",
            "0000000100000000000000",
            "x.history",
            "../etc",
        ] {
            assert!(WalName::parse(bad).is_none(), "{bad}");
        }
        assert_eq!(
            segment_of(1, 0x1_0300_0060, 16 * 1024 * 1024).name,
            "000000010000000100000003"
        );
    }
}
