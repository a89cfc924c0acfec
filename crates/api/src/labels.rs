//! Label keys and values on everything pgop creates.
//!
//! The operator selects children by these labels and the `-rw`/`-ro` Services select
//! instances by [`ROLE`], so a value written here is part of the API.

use std::collections::BTreeMap;

/// `app.kubernetes.io/name`: always [`NAME_VALUE`].
pub const NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: the PostgresCluster's name.
pub const INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/managed-by`: always [`MANAGED_BY_VALUE`].
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/component`: what the object is for, e.g. [`COMPONENT_DATABASE`].
pub const COMPONENT: &str = "app.kubernetes.io/component";

/// The value of [`NAME`].
pub const NAME_VALUE: &str = "postgresql";
/// The value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "pgop";
/// [`COMPONENT`] of instance Pods and their PVCs.
pub const COMPONENT_DATABASE: &str = "database";
/// [`COMPONENT`] of backup objects.
pub const COMPONENT_BACKUP: &str = "backup";
/// [`COMPONENT`] of a pooler's Deployment, Service and Pods (`spec.poolers`).
pub const COMPONENT_POOLER: &str = "pooler";
/// `database.example.com/pooler`: the pooler (`<cluster>-pooler-<name>`) a Deployment,
/// Service or Pod belongs to. Pooler Pods carry it and not [`CLUSTER`], so that nothing
/// that selects a cluster's instance Pods by [`CLUSTER`] ever sees them.
pub const POOLER: &str = "database.example.com/pooler";
/// [`NAME`] of pooler Pods.
pub const NAME_POOLER: &str = "pgbouncer";

/// `database.example.com/cluster`: the PostgresCluster an object belongs to.
pub const CLUSTER: &str = "database.example.com/cluster";
/// `database.example.com/instance`: the instance (`<cluster>-<serial>`) an object belongs to.
pub const INSTANCE_NAME: &str = "database.example.com/instance";
/// `database.example.com/role`: [`ROLE_PRIMARY`] or [`ROLE_REPLICA`].
pub const ROLE: &str = "database.example.com/role";

/// `database.example.com/volume` on an instance's PersistentVolumeClaims: [`VOLUME_DATA`]
/// or [`VOLUME_WAL`] (claims made before the label are data claims).
pub const VOLUME: &str = "database.example.com/volume";
/// [`VOLUME`] of the data volume (PGDATA), the claim named like the instance.
pub const VOLUME_DATA: &str = "data";
/// [`VOLUME`] of the write-ahead log's volume (`spec.walStorage`), `<instance>-wal`.
pub const VOLUME_WAL: &str = "wal";

/// The name of an instance's WAL claim (`spec.walStorage`).
pub fn wal_claim(instance: &str) -> String {
    format!("{instance}-wal")
}

/// [`ROLE`] of the instance that accepts writes.
pub const ROLE_PRIMARY: &str = "primary";
/// [`ROLE`] of a streaming standby.
pub const ROLE_REPLICA: &str = "replica";

/// The labels every child of a cluster carries.
pub fn cluster_labels(cluster: &str) -> BTreeMap<String, String> {
    [
        (NAME, NAME_VALUE),
        (INSTANCE, cluster),
        (MANAGED_BY, MANAGED_BY_VALUE),
        (CLUSTER, cluster),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The label selector (as a string) matching every instance Pod of a cluster; it is the
/// value of `status.selector`, which the scale subresource hands to autoscalers.
pub fn instance_selector(cluster: &str) -> String {
    format!("{CLUSTER}={cluster},{COMPONENT}={COMPONENT_DATABASE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_labels_name_the_cluster_and_the_manager() {
        let labels = cluster_labels("main");
        assert_eq!(labels.get(CLUSTER).map(String::as_str), Some("main"));
        assert_eq!(labels.get(INSTANCE).map(String::as_str), Some("main"));
        assert_eq!(labels.get(MANAGED_BY).map(String::as_str), Some("pgop"));
    }

    #[test]
    fn instance_selector_is_a_kubernetes_label_selector() {
        assert_eq!(
            instance_selector("main"),
            "database.example.com/cluster=main,app.kubernetes.io/component=database"
        );
    }
}
