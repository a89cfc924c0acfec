//! One control plane shared by every test in a test binary.

use crate::{ControlPlane, Error, Options};
use tokio::sync::OnceCell;

/// The control plane shared by the tests of this process (with kube-controller-manager),
/// started by the first caller. Give each test its own [`crate::TestNamespace`].
///
/// It lives until the process exits; an exit hook stops its processes and removes its
/// directory then (statics are never dropped).
pub async fn shared() -> Result<&'static ControlPlane, Error> {
    static PLANE: OnceCell<ControlPlane> = OnceCell::const_new();
    PLANE
        .get_or_try_init(|| ControlPlane::start(Options::default().with_controller_manager()))
        .await
}
