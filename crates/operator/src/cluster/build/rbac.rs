//! The identity of instance pods: a ServiceAccount, and a Role that lets the instance
//! manager read its own cluster and credentials and hold the primary Lease — nothing more.

use super::Common;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use pgop_api::PostgresCluster;
use pgop_api::constants::GROUP;

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[String]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        resource_names: (!names.is_empty()).then(|| names.to_vec()),
        ..PolicyRule::default()
    }
}

pub fn service_account(c: &Common) -> ServiceAccount {
    ServiceAccount {
        metadata: c.meta(&c.cluster, &[]),
        ..ServiceAccount::default()
    }
}

pub fn role(c: &Common, cluster_object: &PostgresCluster) -> Role {
    let cluster = vec![c.cluster.clone()];
    let mut secrets = vec![
        format!("{}{}", c.cluster, super::APP_SECRET_SUFFIX),
        format!("{}{}", c.cluster, super::REPLICATION_SECRET_SUFFIX),
        // The certificates the instances use; never the authorities (`<cluster>-ca`,
        // `<cluster>-postgres-ca`).
        format!(
            "{}{}",
            c.cluster,
            pgop_api::constants::MANAGER_TLS_SECRET_SUFFIX
        ),
        format!(
            "{}{}",
            c.cluster,
            pgop_api::constants::SERVER_TLS_SECRET_SUFFIX
        ),
        format!(
            "{}{}",
            c.cluster,
            pgop_api::constants::REPLICATION_TLS_SECRET_SUFFIX
        ),
    ];
    // The S3 keys of the backup store, and of the store a recovery reads from.
    let spec = &cluster_object.spec;
    let stores = [
        spec.backup.as_ref().and_then(|b| b.store.as_ref()),
        spec.bootstrap
            .as_ref()
            .and_then(|b| b.recovery.as_ref())
            .and_then(|r| r.store.as_ref()),
        cluster_object
            .status
            .as_ref()
            .and_then(|s| s.recovery_source.as_ref())
            .map(|r| &r.store),
    ];
    for store in stores.into_iter().flatten() {
        if let Some(s3) = &store.s3
            && !secrets.contains(&s3.credentials_secret.name)
        {
            secrets.push(s3.credentials_secret.name.clone());
        }
    }
    Role {
        metadata: c.meta(&c.cluster, &[]),
        rules: Some(vec![
            rule(
                &[GROUP],
                &["postgresclusters"],
                &["get", "list", "watch"],
                &cluster,
            ),
            rule(&[""], &["secrets"], &["get"], &secrets),
            // To find the primary's address (its pod IP) when following it.
            rule(&[""], &["pods"], &["get", "list", "watch"], &[]),
            // The primary Lease: only its holder may accept writes.
            rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "list", "watch", "update"],
                &cluster,
            ),
            rule(
                &["", "events.k8s.io"],
                &["events"],
                &["create", "patch"],
                &[],
            ),
        ]),
    }
}

pub fn role_binding(c: &Common) -> RoleBinding {
    RoleBinding {
        metadata: c.meta(&c.cluster, &[]),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name: c.cluster.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_string(),
            name: c.cluster.clone(),
            namespace: Some(c.namespace.clone()),
            ..Subject::default()
        }]),
    }
}
