//! The object store (through the `object_store` crate), the versioned layout and the
//! checksummed object format.
//!
//! Layout, under `<prefix>/<cluster>/pgop-v1/`:
//! - `wal/<timeline>/<walfile>.gz`: one archived WAL file (segment, `.history`, `.partial`,
//!   `.backup`), gzip-compressed; `<timeline>` is the file name's first 8 hex digits.
//! - `base/<backup-id>/base.tar.gz`: the base backup's tar (`pg_basebackup -Ft`), gzip.
//! - `base/<backup-id>/backup.manifest`: the [`crate::Manifest`] as JSON, written last; a
//!   backup without it is incomplete.
//!
//! Every object ends with a 80-byte footer: `PGOPSUM1`, the SHA-256 of the stored bytes
//! before the footer, the SHA-256 of the content before compression, and the content length
//! (u64, big endian). Every read checks both hashes and fails naming the object.
//!
//! Why this file stays whole: it is one idea, the store as pgop uses it: every object it
//! puts or gets, whole or streamed, is named under the cluster's versioned root
//! (`<prefix>/<cluster>/pgop-v1/`) and carries the checksummed footer described above.

use crate::config::{Location, StoreConfig};
use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
    WriteMultipart,
};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// The layout version, part of every key.
pub const LAYOUT_VERSION: &str = "pgop-v1";
const MAGIC: &[u8; 8] = b"PGOPSUM1";
/// Length of the footer every object ends with.
pub const FOOTER_LEN: usize = 8 + 32 + 32 + 8;
/// Parts of a streamed upload (S3 needs at least 5 MiB per part but the last).
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts in flight at once: a streamed upload holds at most about this many parts in memory.
const PARTS_IN_FLIGHT: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to open the backup store")]
    Open(#[source] object_store::Error),
    #[error(
        "refusing the backup store's {what} {value:?}: it must be relative, with segments of \
         letters, digits, '.', '_' and '-' that do not start with '.' (no '..')"
    )]
    InvalidKey { what: &'static str, value: String },
    #[error("failed to write {object} to the backup store")]
    Put {
        object: String,
        #[source]
        source: object_store::Error,
    },
    #[error("failed to read {object} from the backup store")]
    Get {
        object: String,
        #[source]
        source: object_store::Error,
    },
    #[error("failed to list {prefix} in the backup store")]
    List {
        prefix: String,
        #[source]
        source: object_store::Error,
    },
    #[error("failed to delete {object} from the backup store")]
    Delete {
        object: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{object} is corrupt: {reason}")]
    Corrupt { object: String, reason: String },
    #[error("failed to compress or decompress {object}")]
    Codec {
        object: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to read the stream for {object}")]
    Source {
        object: String,
        #[source]
        source: std::io::Error,
    },
}

/// Checksums and sizes of one stored object, as its footer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// SHA-256 of the stored bytes (compressed), hex.
    pub stored_sha256: String,
    /// SHA-256 of the content before compression, hex.
    pub content_sha256: String,
    pub content_len: u64,
}

impl Footer {
    fn encode(stored: &[u8; 32], content: &[u8; 32], len: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(FOOTER_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(stored);
        out.extend_from_slice(content);
        out.extend_from_slice(&len.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<(Self, [u8; 32], [u8; 32])> {
        if bytes.len() != FOOTER_LEN || &bytes[..8] != MAGIC {
            return None;
        }
        let stored: [u8; 32] = bytes[8..40].try_into().ok()?;
        let content: [u8; 32] = bytes[40..72].try_into().ok()?;
        let len = u64::from_be_bytes(bytes[72..80].try_into().ok()?);
        Some((
            Self {
                stored_sha256: hex(&stored),
                content_sha256: hex(&content),
                content_len: len,
            },
            stored,
            content,
        ))
    }
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `data`, hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// One listed object, its key relative to the cluster's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    pub last_modified: jiff::Timestamp,
}

/// The backup store, rooted at `<prefix>/<cluster>/pgop-v1`.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    root: String,
    describe: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

impl Store {
    /// Opens the store the configuration names (no request is made yet).
    pub fn open(config: &StoreConfig) -> Result<Self, Error> {
        // Checked by the API; checked again where it becomes a key, so that no prefix or
        // cluster name can reach another cluster's backups.
        let prefix = config
            .prefix
            .as_deref()
            .map(|p| p.trim_matches('/'))
            .filter(|p| !p.is_empty());
        for (what, value) in [
            ("path", prefix),
            ("cluster name", Some(config.cluster.as_str())),
        ] {
            if let Some(value) = value
                && !pgop_api::formats::is_store_path(value)
            {
                return Err(Error::InvalidKey {
                    what,
                    value: value.to_string(),
                });
            }
        }
        let (inner, describe): (Arc<dyn ObjectStore>, String) = match &config.location {
            Location::S3(s3) => {
                let insecure_http = s3
                    .endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://"));
                let client = ClientOptions::new()
                    .with_allow_http(insecure_http)
                    .with_allow_invalid_certificates(s3.insecure_skip_tls_verify)
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120));
                let retry = RetryConfig {
                    max_retries: 3,
                    retry_timeout: Duration::from_secs(20),
                    ..RetryConfig::default()
                };
                let mut builder = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&s3.bucket)
                    .with_access_key_id(&s3.access_key_id)
                    .with_secret_access_key(&s3.secret_access_key)
                    .with_region(s3.region.as_deref().unwrap_or("us-east-1"))
                    .with_client_options(client)
                    .with_retry(retry);
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_virtual_hosted_style_request(false);
                }
                // object_store's reqwest client has rustls without a crypto provider of its
                // own (Cargo.toml) and takes the process default, which must exist before
                // `build`; an error only says that one is installed already.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let describe = format!(
                    "s3://{}{}",
                    s3.bucket,
                    s3.endpoint
                        .as_deref()
                        .map(|e| format!(" at {e}"))
                        .unwrap_or_default()
                );
                (Arc::new(builder.build().map_err(Error::Open)?), describe)
            }
            Location::Local { path } => {
                std::fs::create_dir_all(path).map_err(|e| {
                    Error::Open(object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source: Box::new(e),
                    })
                })?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(path)
                    .map_err(Error::Open)?;
                (Arc::new(local), format!("file://{}", path.display()))
            }
        };
        let mut root = String::new();
        if let Some(prefix) = prefix {
            root.push_str(prefix);
            root.push('/');
        }
        root.push_str(&config.cluster);
        root.push('/');
        root.push_str(LAYOUT_VERSION);
        Ok(Self {
            inner,
            describe: format!("{describe}/{root}"),
            root,
        })
    }

    /// The full key of `rel` (relative to the cluster's root).
    pub fn path(&self, rel: &str) -> ObjectPath {
        ObjectPath::from(format!("{}/{rel}", self.root))
    }

    /// How an object is named in messages: `<store>/<rel>`.
    pub fn name(&self, rel: &str) -> String {
        format!("{}/{rel}", self.describe)
    }

    /// Stores `content` (gzip-compressed when `compress`) with its footer, in one request.
    pub async fn put(&self, rel: &str, content: Bytes, compress: bool) -> Result<Footer, Error> {
        let object = self.name(rel);
        let encoded = {
            let object = object.clone();
            tokio::task::spawn_blocking(move || encode(&content, compress, &object))
                .await
                .map_err(|e| Error::Codec {
                    object: self.name(rel),
                    source: std::io::Error::other(e),
                })??
        };
        let (body, footer) = encoded;
        self.inner
            .put(&self.path(rel), PutPayload::from(body))
            .await
            .map_err(|source| Error::Put { object, source })?;
        Ok(footer)
    }

    /// The footer of `rel`, `None` when there is no such object (one small range read).
    pub async fn footer(&self, rel: &str) -> Result<Option<Footer>, Error> {
        let options = GetOptions {
            range: Some(GetRange::Suffix(FOOTER_LEN as u64)),
            ..GetOptions::default()
        };
        let object = self.name(rel);
        let result = match self.inner.get_opts(&self.path(rel), options).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(Error::Get { object, source }),
        };
        let bytes = result.bytes().await.map_err(|source| Error::Get {
            object: object.clone(),
            source,
        })?;
        match Footer::decode(&bytes) {
            Some((footer, _, _)) => Ok(Some(footer)),
            None => Err(Error::Corrupt {
                object,
                reason: "no pgop checksum footer at its end".into(),
            }),
        }
    }

    /// Reads `rel` whole, verifies both checksums, decompresses when `compressed`; `None`
    /// when there is no such object. For small objects (WAL files, manifests).
    pub async fn get(&self, rel: &str, compressed: bool) -> Result<Option<Bytes>, Error> {
        let object = self.name(rel);
        let result = match self.inner.get(&self.path(rel)).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(source) => return Err(Error::Get { object, source }),
        };
        let bytes = result.bytes().await.map_err(|source| Error::Get {
            object: object.clone(),
            source,
        })?;
        let decoded = tokio::task::spawn_blocking(move || decode(&bytes, compressed, &object))
            .await
            .map_err(|e| Error::Codec {
                object: self.name(rel),
                source: std::io::Error::other(e),
            })??;
        Ok(Some(decoded))
    }

    /// Streams `source` into `rel`, gzip-compressed, as a multipart upload: memory stays
    /// bounded (a few parts) whatever the size. Returns the footer and the stored size.
    pub async fn put_stream<R>(&self, rel: &str, mut source: R) -> Result<(Footer, u64), Error>
    where
        R: tokio::io::AsyncRead + Unpin,
    {
        use tokio::io::AsyncReadExt;
        let object = self.name(rel);
        let upload = self
            .inner
            .put_multipart(&self.path(rel))
            .await
            .map_err(|source| Error::Put {
                object: object.clone(),
                source,
            })?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut content_hash = Sha256::new();
        let mut stored_hash = Sha256::new();
        let mut content_len = 0u64;
        let mut stored_len = 0u64;
        let mut buf = vec![0u8; 256 * 1024];
        let codec = |source| Error::Codec {
            object: object.clone(),
            source,
        };
        let result: Result<(), Error> = async {
            loop {
                let n = source
                    .read(&mut buf)
                    .await
                    .map_err(|source| Error::Source {
                        object: object.clone(),
                        source,
                    })?;
                if n == 0 {
                    break;
                }
                content_hash.update(&buf[..n]);
                content_len += n as u64;
                gzip.write_all(&buf[..n]).map_err(codec)?;
                let out = std::mem::take(gzip.get_mut());
                if !out.is_empty() {
                    stored_hash.update(&out);
                    stored_len += out.len() as u64;
                    writer
                        .wait_for_capacity(PARTS_IN_FLIGHT)
                        .await
                        .map_err(|source| Error::Put {
                            object: object.clone(),
                            source,
                        })?;
                    writer.write(&out);
                }
            }
            Ok(())
        }
        .await;
        if let Err(err) = result {
            let _ = writer.abort().await;
            return Err(err);
        }
        let rest = match gzip.finish() {
            Ok(rest) => rest,
            Err(source) => {
                let _ = writer.abort().await;
                return Err(codec(source));
            }
        };
        stored_hash.update(&rest);
        stored_len += rest.len() as u64;
        writer.write(&rest);
        let stored: [u8; 32] = stored_hash.finalize().into();
        let content: [u8; 32] = content_hash.finalize().into();
        writer.write(&Footer::encode(&stored, &content, content_len));
        writer.finish().await.map_err(|source| Error::Put {
            object: object.clone(),
            source,
        })?;
        Ok((
            Footer {
                stored_sha256: hex(&stored),
                content_sha256: hex(&content),
                content_len,
            },
            stored_len + FOOTER_LEN as u64,
        ))
    }

    /// Streams `rel` (gzip) into `sink` decompressed, through a blocking thread; verifies the
    /// stored bytes' checksum as they arrive and the content's at the end. `sink` gets every
    /// byte before the verdict: on error, whatever it wrote must be thrown away.
    pub async fn get_stream<W>(&self, rel: &str, sink: W) -> Result<(Footer, W), Error>
    where
        W: std::io::Write + Send + 'static,
    {
        let object = self.name(rel);
        let result = self
            .inner
            .get(&self.path(rel))
            .await
            .map_err(|source| Error::Get {
                object: object.clone(),
                source,
            })?;
        let size = result.meta.size;
        if size < FOOTER_LEN as u64 {
            return Err(Error::Corrupt {
                object,
                reason: format!("{size} bytes, shorter than the checksum footer"),
            });
        }
        let body_len = size - FOOTER_LEN as u64;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(8);
        let decoder = {
            let object = object.clone();
            tokio::task::spawn_blocking(move || -> Result<([u8; 32], u64, W), Error> {
                let reader = ChannelReader {
                    rx,
                    current: Bytes::new(),
                };
                let mut gz = flate2::read::GzDecoder::new(reader);
                let mut hashing = HashingWriter {
                    inner: sink,
                    hash: Sha256::new(),
                    len: 0,
                };
                std::io::copy(&mut gz, &mut hashing).map_err(|source| Error::Codec {
                    object: object.clone(),
                    source,
                })?;
                let HashingWriter { inner, hash, len } = hashing;
                Ok((hash.finalize().into(), len, inner))
            })
        };
        let mut stream = result.into_stream();
        let mut stored_hash = Sha256::new();
        let mut seen = 0u64;
        let mut tail = Vec::with_capacity(FOOTER_LEN);
        let mut failed = None;
        let mut decoding = true;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(source) => {
                    failed = Some(Error::Get {
                        object: object.clone(),
                        source,
                    });
                    break;
                }
            };
            // The body goes to the decoder; the last FOOTER_LEN bytes are the footer.
            let start = seen;
            seen += chunk.len() as u64;
            let body_part = if start >= body_len {
                Bytes::new()
            } else {
                let end = usize::try_from((body_len - start).min(chunk.len() as u64))
                    .unwrap_or(chunk.len());
                chunk.slice(..end)
            };
            tail.extend_from_slice(&chunk[body_part.len()..]);
            if !body_part.is_empty() {
                stored_hash.update(&body_part);
                // A decoder that stopped reports its error below; the rest is still read
                // so that a checksum mismatch is reported as such.
                if decoding && tx.send(body_part).is_err() {
                    decoding = false;
                }
            }
        }
        drop(tx);
        let decoded = decoder.await.map_err(|e| Error::Codec {
            object: object.clone(),
            source: std::io::Error::other(e),
        })?;
        if let Some(err) = failed {
            return Err(err);
        }
        let Some((footer, stored, expected_content)) = Footer::decode(&tail) else {
            return Err(Error::Corrupt {
                object,
                reason: "no pgop checksum footer at its end".into(),
            });
        };
        let actual: [u8; 32] = stored_hash.finalize().into();
        if actual != stored {
            return Err(Error::Corrupt {
                object,
                reason: format!(
                    "SHA-256 of the stored bytes is {}, the footer says {}",
                    hex(&actual),
                    hex(&stored)
                ),
            });
        }
        let (content, content_len, sink) = decoded.map_err(|err| match err {
            Error::Codec { object, source } => Error::Corrupt {
                object,
                reason: format!("it does not decompress: {source}"),
            },
            other => other,
        })?;
        if content != expected_content || content_len != footer.content_len {
            return Err(Error::Corrupt {
                object,
                reason: "the decompressed content does not match its checksum".into(),
            });
        }
        Ok((footer, sink))
    }

    /// Every object under `rel_prefix` (relative to the root).
    pub async fn list(&self, rel_prefix: &str) -> Result<Vec<Listed>, Error> {
        let prefix = self.path(rel_prefix);
        let skip = self.root.len() + 1;
        let mut out = Vec::new();
        let mut stream = self.inner.list(Some(&prefix));
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|source| Error::List {
                prefix: self.name(rel_prefix),
                source,
            })?;
            let key = meta.location.as_ref();
            let rel = key.get(skip..).unwrap_or(key).to_string();
            out.push(Listed {
                key: rel,
                size: meta.size,
                last_modified: jiff::Timestamp::from_second(meta.last_modified.timestamp())
                    .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes `rel` (absent is fine).
    pub async fn delete(&self, rel: &str) -> Result<(), Error> {
        match self.inner.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(Error::Delete {
                object: self.name(rel),
                source,
            }),
        }
    }
}

/// Compresses (or not) and appends the footer.
fn encode(content: &[u8], compress: bool, object: &str) -> Result<(Vec<u8>, Footer), Error> {
    let mut body = if compress {
        let mut gz = flate2::write::GzEncoder::new(
            Vec::with_capacity(content.len() / 4),
            flate2::Compression::fast(),
        );
        gz.write_all(content)
            .and_then(|()| gz.finish())
            .map_err(|source| Error::Codec {
                object: object.to_string(),
                source,
            })?
    } else {
        content.to_vec()
    };
    let stored: [u8; 32] = Sha256::digest(&body).into();
    let content_hash: [u8; 32] = Sha256::digest(content).into();
    let len = content.len() as u64;
    body.extend_from_slice(&Footer::encode(&stored, &content_hash, len));
    Ok((
        body,
        Footer {
            stored_sha256: hex(&stored),
            content_sha256: hex(&content_hash),
            content_len: len,
        },
    ))
}

/// Checks the footer and both checksums; decompresses when `compressed`.
fn decode(bytes: &[u8], compressed: bool, object: &str) -> Result<Bytes, Error> {
    let corrupt = |reason: String| Error::Corrupt {
        object: object.to_string(),
        reason,
    };
    if bytes.len() < FOOTER_LEN {
        return Err(corrupt(format!(
            "{} bytes, shorter than the checksum footer",
            bytes.len()
        )));
    }
    let (body, tail) = bytes.split_at(bytes.len() - FOOTER_LEN);
    let Some((_, stored, content)) = Footer::decode(tail) else {
        return Err(corrupt("no pgop checksum footer at its end".into()));
    };
    let actual: [u8; 32] = Sha256::digest(body).into();
    if actual != stored {
        return Err(corrupt(format!(
            "SHA-256 of the stored bytes is {}, the footer says {}",
            hex(&actual),
            hex(&stored)
        )));
    }
    let out = if compressed {
        let mut out = Vec::new();
        std::io::copy(&mut flate2::read::GzDecoder::new(body), &mut out)
            .map_err(|e| corrupt(format!("it does not decompress: {e}")))?;
        out
    } else {
        body.to_vec()
    };
    let actual: [u8; 32] = Sha256::digest(&out).into();
    if actual != content {
        return Err(corrupt(
            "the decompressed content does not match its checksum".into(),
        ));
    }
    Ok(Bytes::from(out))
}

/// A blocking reader over chunks sent from the async side.
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.recv() {
                Ok(chunk) => self.current = chunk,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: std::io::Write> std::io::Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> (std::path::PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("pgop-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&StoreConfig::local(&dir, "demo")).expect("open");
        (dir, store)
    }

    #[test]
    fn a_prefix_or_cluster_that_escapes_its_place_is_refused() {
        let dir = std::env::temp_dir().join(format!("pgop-store-escape-{}", std::process::id()));
        for (prefix, cluster) in [
            (Some("../../other"), "demo"),
            (Some("a/../b"), "demo"),
            (Some("a\nb"), "demo"),
            (None, ".."),
            (None, "../other"),
        ] {
            let mut config = StoreConfig::local(&dir, cluster);
            config.prefix = prefix.map(str::to_string);
            let refused = Store::open(&config).map(drop);
            assert!(
                matches!(refused, Err(Error::InvalidKey { .. })),
                "{prefix:?} {cluster:?}: {refused:?}"
            );
        }
        let mut config = StoreConfig::local(&dir, "demo");
        config.prefix = Some("/clusters/prod/".into());
        assert!(Store::open(&config).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn objects_round_trip_and_corruption_names_the_object() {
        let (dir, store) = scratch("roundtrip");
        let content = Bytes::from(vec![7u8; 100_000]);
        let footer = store
            .put("wal/00000001/x.gz", content.clone(), true)
            .await
            .expect("put");
        assert_eq!(footer.content_sha256, sha256_hex(&content));
        assert_eq!(
            store.footer("wal/00000001/x.gz").await.expect("footer"),
            Some(footer)
        );
        let back = store.get("wal/00000001/x.gz", true).await.expect("get");
        assert_eq!(back, Some(content));
        assert_eq!(store.get("wal/none", true).await.expect("get"), None);

        // Flip one byte in the middle of the stored object.
        let file = dir.join("demo/pgop-v1/wal/00000001/x.gz");
        let mut raw = std::fs::read(&file).expect("read");
        raw[10] ^= 0xff;
        std::fs::write(&file, raw).expect("write");
        let err = store
            .get("wal/00000001/x.gz", true)
            .await
            .expect_err("corrupt");
        let shown = err.to_string();
        assert!(
            shown.contains("demo/pgop-v1/wal/00000001/x.gz") && shown.contains("corrupt"),
            "{shown}"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[tokio::test]
    async fn streams_round_trip_with_bounded_parts() {
        let (dir, store) = scratch("stream");
        let content: Vec<u8> = (0..20_000_000u32).map(|i| (i % 251) as u8).collect();
        let (footer, _) = store
            .put_stream("base/b1/base.tar.gz", &content[..])
            .await
            .expect("put_stream");
        assert_eq!(footer.content_len, content.len() as u64);
        let (footer2, back) = store
            .get_stream("base/b1/base.tar.gz", Vec::new())
            .await
            .expect("get_stream");
        assert_eq!(footer, footer2);
        assert!(back == content);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
