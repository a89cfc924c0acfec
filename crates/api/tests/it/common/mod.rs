//! Helpers shared by the API's integration tests.
#![allow(dead_code)]

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use pgop_api::PostgresCluster;
use pgop_testenv::{TestNamespace, crds, shared};

pub type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// The shared control plane with pgop's CRDs installed (converting through this process's
/// callback endpoint, with pgop's conversion: the CRD's own Service does not exist here),
/// and a fresh namespace.
pub async fn setup(prefix: &str) -> Result<(Client, TestNamespace)> {
    let plane = shared().await?;
    let client = plane.client()?;
    crds::install_converting(
        &client,
        pgop_api::crds(),
        pgop_api::v1beta1::review_json,
        pgop_api::CONVERT_PATH,
    )
    .await?;
    let ns = TestNamespace::create(plane.config(), prefix).await?;
    Ok((client, ns))
}

/// PostgresClusters as untyped objects, so that invalid manifests can be sent.
pub fn dynamic_api(client: Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, ns, &ApiResource::erase::<PostgresCluster>(&()))
}
