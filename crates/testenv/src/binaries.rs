//! Where the control-plane binaries live and which versions they must be.
//!
//! The versions are pinned in `hack/testenv-versions.env`, the same file the install
//! script reads, so the harness and the build cannot disagree.

use std::path::{Path, PathBuf};

/// The command that builds the binaries, named in every "missing binary" error.
pub const INSTALL_COMMAND: &str = "hack/install-testenv.sh";

/// Overrides the directory holding every binary.
pub const BIN_DIR_ENV: &str = "PGOP_TESTENV_BIN_DIR";
/// Overrides the cache root (default `$HOME/.cache/pgop`).
pub const CACHE_DIR_ENV: &str = "PGOP_CACHE_DIR";

const VERSIONS: &str = include_str!("../../../hack/testenv-versions.env");

fn pinned(key: &str) -> &'static str {
    VERSIONS
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .unwrap_or("unknown")
}

/// The pinned Kubernetes version, e.g. `1.34.12`.
pub fn kubernetes_version() -> &'static str {
    pinned("KUBERNETES_VERSION")
}

/// The pinned CoreDNS version, e.g. `1.14.7`.
pub fn coredns_version() -> &'static str {
    pinned("COREDNS_VERSION")
}

/// The pinned Helm version.
pub fn helm_version() -> &'static str {
    pinned("HELM_VERSION")
}

/// The pinned etcd version, e.g. `3.6.16`.
pub fn etcd_version() -> &'static str {
    pinned("ETCD_VERSION")
}

/// The binaries the harness can start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    Kubectl,
    Kubelet,
    KubeProxy,
    Crictl,
    Coredns,
    Helm,
}

impl Binary {
    pub fn file_name(self) -> &'static str {
        match self {
            Binary::Etcd => "etcd",
            Binary::KubeApiserver => "kube-apiserver",
            Binary::KubeControllerManager => "kube-controller-manager",
            Binary::KubeScheduler => "kube-scheduler",
            Binary::Kubectl => "kubectl",
            Binary::Kubelet => "kubelet",
            Binary::KubeProxy => "kube-proxy",
            Binary::Crictl => "crictl",
            Binary::Coredns => "coredns",
            Binary::Helm => "helm",
        }
    }
}

/// A binary that is not where the harness looks for it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{binary} not found at {path}; build the control plane with `{INSTALL_COMMAND}` \
     (or point {BIN_DIR_ENV} at a directory holding etcd v{etcd} and Kubernetes v{k8s} binaries)",
    path = path.display(),
    etcd = etcd_version(),
    k8s = kubernetes_version()
)]
pub struct MissingBinary {
    pub binary: &'static str,
    pub path: PathBuf,
}

/// The directory the install script writes to, honouring the overrides.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        return PathBuf::from(dir);
    }
    cache_dir()
        .join("testenv")
        .join(kubernetes_version())
        .join("bin")
}

/// `$PGOP_CACHE_DIR`, else `$HOME/.cache/pgop`, else a directory under the temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV) {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME") {
        Some(home) => Path::new(&home).join(".cache").join("pgop"),
        None => std::env::temp_dir().join("pgop-cache"),
    }
}

/// The full path of `binary` in [`bin_dir`], or an error naming the install command.
pub fn locate(binary: Binary) -> Result<PathBuf, MissingBinary> {
    locate_in(&bin_dir(), binary)
}

/// The full path of `binary` in `dir`, or an error naming the install command.
pub fn locate_in(dir: &Path, binary: Binary) -> Result<PathBuf, MissingBinary> {
    let path = dir.join(binary.file_name());
    if path.is_file() {
        Ok(path)
    } else {
        Err(MissingBinary {
            binary: binary.file_name(),
            path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_pinned_file() {
        assert!(
            kubernetes_version().starts_with("1."),
            "{}",
            kubernetes_version()
        );
        assert!(etcd_version().starts_with("3.6."), "{}", etcd_version());
    }

    #[test]
    fn missing_binary_error_names_the_install_command() {
        let err = MissingBinary {
            binary: "etcd",
            path: PathBuf::from("/nowhere/etcd"),
        };
        let msg = err.to_string();
        assert!(msg.contains("hack/install-testenv.sh"), "{msg}");
        assert!(msg.contains("/nowhere/etcd"), "{msg}");
    }
}
