//! The nodes' images, unpacked once per image set and then linked into every node.
//!
//! `ctr images import` of the pgop image (107 MB of gzip'd layers) took 9.4 s per node:
//! 38 s of every four-node start, most of a real-node test's set-up. Instead, a throwaway
//! containerd (in a mount namespace of its own, CRI off) imports and unpacks the archives
//! once into a root directory under `~/.cache/pgop/containerd-templates/<key>`, the key
//! naming the archives (path, size, modification time) and containerd's version; processes
//! that start nodes with the same archives find it there (built under an exclusive lock,
//! published by a rename). A node's containerd root is a copy of it made before containerd
//! starts: the content blobs and the unpacked layers, which containerd never changes once
//! committed, are hard links (a copy when the node's directory is on another filesystem),
//! everything else (the metadata databases above all) a copy of its own. The CRI plugin
//! finds the images in namespace `k8s.io` when it starts, as if they had been imported.
//! Templates unused for a day are removed when a new one is made.

use super::{Error, io};
use crate::process::ManagedProcess;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// What containerd never changes in a root once written: content blobs (by digest) and
/// committed snapshots (the unpacked layers, overlay's read-only lower directories).
const SHARED: [&str; 2] = [
    "io.containerd.content.v1.content/blobs",
    "io.containerd.snapshotter.v1.overlayfs/snapshots",
];

/// Written last into a finished template's directory.
const COMPLETE: &str = ".complete";

/// How long an unused template is kept.
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// The template root for `images`, made if no process has made it yet.
pub fn for_images(images: &[PathBuf]) -> Result<PathBuf, Error> {
    let base = crate::binaries::cache_dir().join("containerd-templates");
    std::fs::create_dir_all(&base).map_err(io(format!("creating {}", base.display())))?;
    let key = key(images)?;
    let dir = base.join(&key);
    let root = dir.join("root");
    if dir.join(COMPLETE).is_file() {
        touch(&dir.join(COMPLETE));
        return Ok(root);
    }
    let lock_path = base.join(format!("{key}.lock"));
    let lock = std::fs::File::create(&lock_path)
        .map_err(io(format!("creating {}", lock_path.display())))?;
    // SAFETY: flock on a descriptor this function owns and keeps open until it returns.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Error::Io {
            what: format!("locking {}", lock_path.display()),
            source: std::io::Error::last_os_error(),
        });
    }
    if dir.join(COMPLETE).is_file() {
        return Ok(root);
    }
    prune(&base);
    let building = base.join(format!("{key}.building-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    let _ = std::fs::remove_dir_all(&dir);
    build(&building, images)?;
    std::fs::write(building.join(COMPLETE), b"")
        .map_err(io(format!("marking {}", building.display())))?;
    std::fs::rename(&building, &dir).map_err(io(format!("publishing {}", dir.display())))?;
    Ok(root)
}

/// Copies `template` to `to` (which must not exist): shared parts as hard links where
/// the filesystem allows, the rest as copies.
pub fn copy(template: &Path, to: &Path) -> Result<(), Error> {
    let linkable = std::fs::metadata(template)
        .and_then(|t| std::fs::metadata(to.parent().unwrap_or(to)).map(|p| (t.dev(), p.dev())))
        .map(|(a, b)| a == b)
        .unwrap_or(false);
    let mut cp = Command::new("cp");
    cp.arg(if linkable { "-al" } else { "-a" })
        .arg(template)
        .arg(to);
    super::holder::run(&mut cp)?;
    if linkable {
        unshare_mutable(to, to)?;
    }
    // Each containerd its own identity.
    let _ = std::fs::remove_file(to.join("io.containerd.grpc.v1.introspection/uuid"));
    Ok(())
}

/// Replaces every hard link under `dir` outside [`SHARED`] by a copy of its own.
fn unshare_mutable(root: &Path, dir: &Path) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
        let path = entry.path();
        let relative = path.strip_prefix(root).unwrap_or(&path);
        if SHARED.iter().any(|s| relative == Path::new(s)) {
            continue;
        }
        let kind = entry
            .file_type()
            .map_err(io(format!("reading {}", path.display())))?;
        if kind.is_dir() {
            unshare_mutable(root, &path)?;
        } else if kind.is_file() {
            let copy = path.with_extension("pgop-copy");
            std::fs::copy(&path, &copy).map_err(io(format!("copying {}", path.display())))?;
            std::fs::rename(&copy, &path).map_err(io(format!("replacing {}", path.display())))?;
        }
    }
    Ok(())
}

/// The template's name: the archives (path, size, modification time) and containerd's
/// version, hashed (FNV-1a, 64 bits).
fn key(images: &[PathBuf]) -> Result<String, Error> {
    let version = super::holder::run(Command::new("containerd").arg("--version"))?;
    let mut text = version;
    for image in images {
        let meta = std::fs::metadata(image).map_err(io(format!("reading {}", image.display())))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|m| m.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        text.push_str(&format!("\n{} {} {modified}", image.display(), meta.len()));
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    Ok(format!("{hash:016x}"))
}

/// Imports `images` into a new root under `dir` with a containerd of its own.
fn build(dir: &Path, images: &[PathBuf]) -> Result<(), Error> {
    let started = Instant::now();
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let sock = dir.join("containerd.sock");
    let config = dir.join("containerd.toml");
    std::fs::write(
        &config,
        format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{ttrpc}\"\n\
             [metrics]\n  address = \"\"\n",
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = sock.display(),
            ttrpc = dir.join("containerd-ttrpc.sock").display(),
        ),
    )
    .map_err(io("writing the template containerd's configuration"))?;
    // Unpacking mounts each layer's snapshot: in a mount namespace of its own, so that
    // nothing shows on the machine and nothing stays mounted if it dies.
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "containerd"])
        .arg(format!("--config={}", config.display()))
        .env("PATH", super::holder::PATH);
    let mut containerd =
        ManagedProcess::spawn("template containerd", cmd, &dir.join("containerd.log"))
            .map_err(io("starting the template containerd"))?;
    let ctr = |args: &[&str]| {
        let mut c = Command::new("ctr");
        c.arg(format!("--address={}", sock.display())).args(args);
        c
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(sock.exists() && super::holder::run(&mut ctr(&["version"])).is_ok()) {
        if let Some(status) = containerd.try_exited() {
            return Err(Error::Exited {
                name: containerd.name().to_string(),
                status: status.to_string(),
                log: containerd.log_path().display().to_string(),
                tail: containerd.log_tail(20),
            });
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: "the template containerd was not up".into(),
                timeout: Duration::from_secs(60),
                detail: format!("\n{}", containerd.log_tail(20)),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for image in images {
        let archive = image.display().to_string();
        super::holder::run(&mut ctr(&[
            "-n",
            "k8s.io",
            "images",
            "import",
            "--no-unpack=false",
            "--snapshotter=overlayfs",
            &archive,
        ]))?;
    }
    containerd.terminate(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir.join("state"));
    for file in ["containerd.sock", "containerd-ttrpc.sock"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    tracing::info!(
        dir = %dir.display(),
        took = ?started.elapsed(),
        "unpacked the nodes' images into a template containerd root"
    );
    Ok(())
}

fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().write(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// Removes the templates (and abandoned builds) not used for [`KEEP`].
fn prune(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let used = std::fs::metadata(path.join(COMPLETE))
            .or_else(|_| std::fs::metadata(&path))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.elapsed().ok());
        if used.is_some_and(|age| age > KEEP) {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}
