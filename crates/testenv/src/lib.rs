//! testenv: a real Kubernetes control plane on one machine, for pgop's tests and demo.
//!
//! etcd, kube-apiserver and (on request) kube-controller-manager and kube-scheduler are
//! built from source by `hack/install-testenv.sh` and started here as child processes on
//! free loopback ports, with TLS, an admin client certificate in `system:masters` and RBAC
//! on, as envtest does for controller-runtime. Nothing is mocked.
//!
//! This crate is test and demo infrastructure; it must never be part of a deployment.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let plane = pgop_testenv::ControlPlane::start(pgop_testenv::Options::default()).await?;
//! let client = plane.client()?;
//! println!("kubectl --kubeconfig {}", plane.kubeconfig().display());
//! # Ok(()) }
//! ```

pub mod binaries;
pub mod callback;
mod control_plane;
pub mod crds;
pub mod images;
mod kubeconfig;
mod namespace;
pub mod node;
mod pki;
mod process;
pub mod real_nodes;
pub mod s3;
mod shared;
mod tempdir;
pub mod wait;
mod workdir;

pub use binaries::{INSTALL_COMMAND, MissingBinary};
pub use control_plane::{ControlPlane, Error, Options};
pub use namespace::{Error as NamespaceError, TestNamespace};
pub use shared::shared;
pub use tempdir::TempDir;
pub use workdir::KEEP_ENV;

/// "failed to X: failed to Y: cause" from an error and its sources.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}
