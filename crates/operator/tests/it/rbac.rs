//! The operator works with exactly the permissions in deploy/operator/rbac.yaml: it runs
//! here impersonating that ServiceAccount (the admin only sets things up).

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgop_api::cluster::ClusterPhase;

const RBAC: &str = include_str!("../../../../deploy/operator/rbac.yaml");

#[tokio::test]
async fn the_operator_needs_no_more_than_its_published_rbac() -> Result {
    let (plane, admin, ns) = setup("rbac").await?;
    let n = ns.name().to_string();
    let n = n.as_str();

    // Install the published RBAC, with the ServiceAccount living in this test's namespace.
    let apply = PatchParams::apply("rbac-test").force();
    for doc in serde_yaml::Deserializer::from_str(RBAC) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)?;
        match value["kind"].as_str() {
            Some("ServiceAccount") => {
                let mut sa: k8s_openapi::api::core::v1::ServiceAccount =
                    serde_yaml::from_value(value)?;
                sa.metadata.namespace = Some(n.to_string());
                Api::namespaced(admin.clone(), n)
                    .create(&PostParams::default(), &sa)
                    .await?;
            }
            Some("ClusterRole") => {
                let mut role: ClusterRole = serde_yaml::from_value(value)?;
                role.metadata.name = Some(format!("pgop-operator-{n}"));
                let api: Api<ClusterRole> = Api::all(admin.clone());
                api.patch(&role.name_any(), &apply, &Patch::Apply(&role))
                    .await?;
            }
            Some("ClusterRoleBinding") => {
                let mut binding: ClusterRoleBinding = serde_yaml::from_value(value)?;
                binding.metadata.name = Some(format!("pgop-operator-{n}"));
                binding.role_ref.name = format!("pgop-operator-{n}");
                for s in binding.subjects.iter_mut().flatten() {
                    s.namespace = Some(n.to_string());
                }
                let api: Api<ClusterRoleBinding> = Api::all(admin.clone());
                api.patch(&binding.name_any(), &apply, &Patch::Apply(&binding))
                    .await?;
            }
            other => return Err(format!("unexpected kind {other:?} in rbac.yaml").into()),
        }
    }

    let mut config = plane.config().clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{n}:pgop-operator"));
    let operator_client = kube::Client::try_from(config)?;
    // The impersonated identity really is limited: it cannot list namespaces.
    assert!(
        Api::<Namespace>::all(operator_client.clone())
            .list(&Default::default())
            .await
            .is_err()
    );

    // With leader election, as `pgop operator` runs in a cluster: the Lease is created,
    // renewed and released with the published permissions too.
    let op = Operator::start_with(
        &operator_client,
        pgop_operator::Options {
            namespaces: vec![n.to_string()],
            leader_election: Some(pgop_operator::LeaderElection::new(n, "pgop-operator-0")),
            ..pgop_operator::Options::default()
        },
    );
    create(&admin, n, &cluster("least", 2)).await?;
    wait_names::<Pod>(&admin, n, "least", &["least-1", "least-2"]).await?;
    wait_names::<Secret>(
        &admin,
        n,
        "least",
        &[
            "least-app",
            "least-ca",
            "least-manager-tls",
            "least-postgres-ca",
            "least-replication",
            "least-replication-tls",
            "least-server-tls",
        ],
    )
    .await?;
    // Applied last: a permission missing for it would leave everything above in place.
    wait_names::<k8s_openapi::api::networking::v1::NetworkPolicy>(&admin, n, "least", &["least"])
        .await?;
    for pod in ["least-1", "least-2"] {
        make_ready(&admin, n, pod, true).await?;
    }
    wait_cluster(&admin, n, "least", "phase Ready", |c| {
        phase(c) == Some(ClusterPhase::Ready)
    })
    .await?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), n);
    let lease = leases
        .get(pgop_operator::leader::DEFAULT_LEASE_NAME)
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("pgop-operator-0")
    );
    op.stop().await;
    let lease = leases
        .get(pgop_operator::leader::DEFAULT_LEASE_NAME)
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(""),
        "released on stop"
    );
    ns.delete().await?;
    Ok(())
}
