//! The ownerReferences that tie a cluster's children (Pods, volumes, Services, Secrets,
//! RBAC objects, budgets, its instance managers' Lease, its scheduled PostgresBackups) to
//! their PostgresCluster, and their move from `v1alpha1` to `v1beta1`.
//!
//! A child made by a pgop before `v1beta1` names its owner `database.example.com/v1alpha1`.
//! The garbage collector resolves an ownerReference through its `apiVersion`: once that
//! version is no longer served, it can neither find the owner nor tell that it is gone, and
//! the child outlives its cluster. pgop therefore rewrites every reference to a
//! PostgresCluster in [`CLUSTER_OWNER_API_VERSION`] (the operator on its next pass of the
//! cluster, the instance managers on their next Lease renewal), and `pgop migrate-storage`
//! counts the references still naming another version (docs/api.md, "Upgrading to
//! v1beta1").

use crate::constants::{CLUSTER_OWNER_API_VERSION, GROUP};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The kind every reference this module handles names.
pub const CLUSTER_KIND: &str = "PostgresCluster";

/// Whether `owner` names a PostgresCluster of pgop's group, in any version.
pub fn names_cluster(owner: &OwnerReference) -> bool {
    owner.kind == CLUSTER_KIND && owner.api_version.split('/').next() == Some(GROUP)
}

/// Whether `owner` names a PostgresCluster in a version other than
/// [`CLUSTER_OWNER_API_VERSION`].
pub fn is_outdated(owner: &OwnerReference) -> bool {
    names_cluster(owner) && owner.api_version != CLUSTER_OWNER_API_VERSION
}

/// `refs` with every reference to a PostgresCluster in [`CLUSTER_OWNER_API_VERSION`] and
/// everything else as it was, or `None` when there was nothing to change.
pub fn renamed(refs: &[OwnerReference]) -> Option<Vec<OwnerReference>> {
    if !refs.iter().any(is_outdated) {
        return None;
    }
    Some(
        refs.iter()
            .map(|r| {
                let mut r = r.clone();
                if is_outdated(&r) {
                    r.api_version = CLUSTER_OWNER_API_VERSION.to_string();
                }
                r
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(api_version: &str, kind: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "db".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn only_references_to_a_cluster_in_another_version_are_rewritten() {
        let refs = vec![
            reference("database.example.com/v1alpha1", "PostgresCluster", "1"),
            reference("apps/v1", "ReplicaSet", "2"),
            reference("other.example.com/v1alpha1", "PostgresCluster", "3"),
            reference("database.example.com/v1alpha1", "PostgresBackup", "4"),
        ];
        let fixed = renamed(&refs).expect("one to rewrite");
        assert_eq!(fixed[0].api_version, CLUSTER_OWNER_API_VERSION);
        assert_eq!(fixed[0].uid, "1");
        assert_eq!(fixed[0].controller, Some(true));
        assert_eq!(&fixed[1..], &refs[1..]);
        // Rewritten, nothing is left to do: no write on the next pass.
        assert_eq!(renamed(&fixed), None);
        assert_eq!(renamed(&[]), None);
    }

    #[test]
    fn the_current_version_is_v1beta1_and_any_version_names_a_cluster() {
        assert_eq!(CLUSTER_OWNER_API_VERSION, crate::v1beta1::API_VERSION);
        for version in ["database.example.com/v1alpha1", crate::v1beta1::API_VERSION] {
            assert!(names_cluster(&reference(version, "PostgresCluster", "1")));
        }
        assert!(!names_cluster(&reference(
            "database.example.com",
            "Pod",
            "1"
        )));
        assert!(!is_outdated(&reference(
            crate::v1beta1::API_VERSION,
            "PostgresCluster",
            "1"
        )));
    }
}
