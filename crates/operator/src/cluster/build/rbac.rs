//! The identity of instance pods: a ServiceAccount, and a Role that lets the instance
//! manager read (and watch) its own cluster, its credentials and the primary's Pod, and
//! hold the primary Lease — nothing more
//! (the manager publishes no Events; docs/security.md lists each rule and its use).

use super::Common;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use pgop_api::constants::GROUP;
use pgop_api::v1beta1::PostgresCluster;

/// A Role's rule; `names`: its resourceNames (none: every object).
pub(super) fn rule(
    groups: &[&str],
    resources: &[&str],
    verbs: &[&str],
    names: &[String],
) -> PolicyRule {
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
    use pgop_api::constants::{
        APP_SECRET_SUFFIX, REPLICATION_SECRET_SUFFIX, SUPERUSER_SECRET_SUFFIX,
    };
    let mut secrets = vec![
        format!("{}{APP_SECRET_SUFFIX}", c.cluster),
        format!("{}{REPLICATION_SECRET_SUFFIX}", c.cluster),
        // Read with spec.credentials.superuserAccess only; the user's own Secrets
        // (spec.credentials) never: the operator copies them.
        format!("{}{SUPERUSER_SECRET_SUFFIX}", c.cluster),
        // With spec.poolers: the password the primary gives the poolers' auth_user.
        pgop_api::pooler::identity_name(&c.cluster),
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
    // The Secrets of the entry a replica cluster follows (its password, client
    // certificate, authority and store's keys), which every instance may need: any of them may become
    // the designated primary. No other entry's.
    // (Also while a promotion waits for pgop's approval: it follows until then.)
    if let Some(replica) = spec.replica.as_ref()
        && let Some(entry) = spec
            .external_clusters
            .iter()
            .find(|e| e.name == replica.source)
    {
        for (_, name) in entry.secrets() {
            if !secrets.iter().any(|s| s == name) {
                secrets.push(name.to_string());
            }
        }
    }
    // The passwords of spec.roles, which the primary's manager sets.
    for role in &spec.roles {
        if let Some(secret) = &role.password_secret
            && !secrets.contains(&secret.name)
        {
            secrets.push(secret.name.clone());
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
            // Each Secret watched by name (a list and watch with a field selector on the
            // name, which RBAC authorizes against these names); `get` for a read before a
            // watch has listed, and for managers of earlier versions, which read them.
            rule(&[""], &["secrets"], &["get", "list", "watch"], &secrets),
            // To find the primary's address (its pod IP): a watch of the primary's Pod by
            // name (a field selector), moved when the primary changes. Not narrowed by
            // resourceNames: the primary is any instance, and instance names (serials)
            // are not known when the Role is written. `get` as for Secrets.
            rule(&[""], &["pods"], &["get", "list", "watch"], &[]),
            // The primary Lease: only its holder may accept writes.
            rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "list", "watch", "update"],
                &cluster,
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
