//! pgop's backups: continuous WAL archiving, base backups, restore (to the end of the WAL
//! or a point in time) and retention, in an S3-compatible object store or a directory (a
//! volume), through the `object_store` crate. The layout in the store is versioned
//! (`<prefix>/<cluster>/pgop-v1/...`, see [`store`]) and every object carries SHA-256
//! checksums that every read verifies. See docs/backup.md.

pub mod base;
pub mod config;
pub mod disk;
pub mod logical;
pub mod process;
pub mod restore;
pub mod retention;
pub mod store;
pub mod verify;
pub mod wal;

pub use base::{Manifest, PgTools, Source, TakeOptions};
pub use config::{Location, S3Keys, S3Location, StoreConfig};
pub use logical::{LogicalManifest, LogicalTarget};
pub use restore::{RestoreOptions, Restored, Target};
pub use store::Store;
pub use verify::{Verified, VerifyOptions};
pub use wal::WalName;
