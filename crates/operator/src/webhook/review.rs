//! What the validating webhook decides about one PostgresCluster or PostgresBackup: the
//! same checks as the controller (`pgop_api::validation`, twins of the CRD's schema and CEL
//! rules), plus those that need the old object or other objects, which the API server
//! cannot express in CEL:
//! - a cluster's changes that pgop cannot carry out ([`validation::transition_errors`]:
//!   a smaller `spec.storage.size`, another `spec.bootstrap`, a `spec.postgresVersion`
//!   below the major the data holds or changed while pg_upgrade runs);
//! - the Secrets a cluster names exist (and the S3 credentials Secret holds its keys), the
//!   PostgresBackup it restores from exists, and so does its PriorityClass;
//! - a PostgresBackup names a PostgresCluster that exists and has a backup store.
//!
//! A reference is checked when it is new or changed: an update that leaves it alone is not
//! refused because the object it names was deleted since. An update that changes nothing
//! in the spec (metadata, such as the operator's own annotations and finalizers) is always
//! allowed. When another object cannot be read (the API server did not answer), the check
//! is skipped with a warning rather than refused: the controller checks again when it
//! uses the object.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::ResourceExt;
use pgop_api::cluster::{BackupStore, PostgresClusterSpec};
use pgop_api::validation::{self, FieldError};
use pgop_api::{PostgresBackup, PostgresCluster};
use std::future::Future;

/// Reads the other objects a review needs, in the object's namespace. `Ok(None)`: it does
/// not exist; `Err`: it could not be read (the words go into a warning).
pub trait Lookup: Sync {
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Secret>, String>> + Send;
    fn backup(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PostgresBackup>, String>> + Send;
    fn cluster(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PostgresCluster>, String>> + Send;
    /// A PriorityClass (cluster-scoped).
    fn priority_class(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<PriorityClass>, String>> + Send;
}

impl Lookup for kube::Client {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String> {
        get(self, namespace, name).await
    }

    async fn backup(&self, namespace: &str, name: &str) -> Result<Option<PostgresBackup>, String> {
        get(self, namespace, name).await
    }

    async fn cluster(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PostgresCluster>, String> {
        get(self, namespace, name).await
    }

    async fn priority_class(&self, name: &str) -> Result<Option<PriorityClass>, String> {
        kube::Api::<PriorityClass>::all(self.clone())
            .get_opt(name)
            .await
            .map_err(|e| crate::error_chain(&e))
    }
}

async fn get<K>(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    kube::Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| crate::error_chain(&e))
}

/// The outcome: refused when `errors` is not empty (every error names its field);
/// `warnings` go back to the client either way.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub errors: Vec<FieldError>,
    pub warnings: Vec<String>,
}

impl Verdict {
    fn error(&mut self, field: &str, message: String) {
        let error = FieldError {
            field: field.to_string(),
            message,
        };
        if !self.errors.contains(&error) {
            self.errors.push(error);
        }
    }

    fn errors(&mut self, errors: Vec<FieldError>) {
        for e in errors {
            if !self.errors.contains(&e) {
                self.errors.push(e);
            }
        }
    }

    /// The message of a refusal: every field, as the controller's `SpecValid` condition
    /// words it.
    pub fn message(&self) -> String {
        validation::summary(&self.errors)
    }
}

/// Reviews a PostgresCluster being created (`old` is `None`) or updated.
pub async fn cluster(
    namespace: &str,
    old: Option<&PostgresCluster>,
    new: &PostgresCluster,
    lookup: &impl Lookup,
) -> Verdict {
    let mut verdict = Verdict::default();
    if old.is_some_and(|old| old.spec == new.spec) {
        return verdict;
    }
    let mut defaulted = new.clone();
    defaulted.spec = pgop_api::with_defaults(new.spec.clone());
    if let Err(errors) = validation::validate_cluster(&defaulted) {
        verdict.errors(errors);
    }
    let old_spec = old.map(|old| pgop_api::with_defaults(old.spec.clone()));
    if let Some(old_spec) = &old_spec
        && let Err(errors) = validation::validate_update(
            old_spec,
            &defaulted.spec,
            old.and_then(|o| o.status.as_ref()),
        )
    {
        verdict.errors(errors);
    }
    let spec = &defaulted.spec;
    let before = old_spec.as_ref().map(user_secrets);
    for (i, (field, name)) in user_secrets(spec).into_iter().enumerate() {
        let unchanged = before.as_ref().is_some_and(|b| b[i].1 == name);
        let unread = field == SUPERUSER_SECRET && !spec.credentials.superuser_access;
        if let Some(name) = name.filter(|_| !unchanged && !unread) {
            secret_exists(&mut verdict, lookup, namespace, field, name).await;
        }
    }
    let store = spec.backup.as_ref().and_then(|b| b.store.as_ref());
    let old_store = old_spec
        .as_ref()
        .and_then(|o| o.backup.as_ref())
        .and_then(|b| b.store.as_ref());
    if let Some(store) = store
        && old_store.is_none_or(|o| credentials_of(o) != credentials_of(store))
    {
        store_credentials(&mut verdict, lookup, namespace, "spec.backup.store", store).await;
    }
    let class = spec.affinity.priority_class_name.as_deref();
    let old_class = old_spec
        .as_ref()
        .and_then(|o| o.affinity.priority_class_name.as_deref());
    if let Some(class) = class.filter(|c| Some(*c) != old_class) {
        let field = "spec.affinity.priorityClassName";
        match lookup.priority_class(class).await {
            Ok(Some(_)) => {}
            Ok(None) => verdict.error(
                field,
                format!(
                    "PriorityClass {class:?} does not exist: the API server would refuse the instance Pods"
                ),
            ),
            Err(e) => unchecked(&mut verdict, field, &e),
        }
    }
    // spec.bootstrap is read once, at creation (and may not change after).
    let recovery = spec.bootstrap.as_ref().and_then(|b| b.recovery.as_ref());
    if old.is_none()
        && let Some(recovery) = recovery
    {
        if let Some(backup) = &recovery.backup {
            let field = "spec.bootstrap.recovery.backup";
            match lookup.backup(namespace, backup).await {
                Ok(Some(_)) => {}
                Ok(None) => verdict.error(
                    field,
                    format!("PostgresBackup {backup:?} does not exist in namespace {namespace}"),
                ),
                Err(e) => unchecked(&mut verdict, field, &e),
            }
        }
        if let Some(store) = &recovery.store {
            let field = "spec.bootstrap.recovery.store";
            store_credentials(&mut verdict, lookup, namespace, field, store).await;
        }
    }
    verdict
}

/// The JSON patch operations (RFC 6902) that write the defaults the schema cannot express
/// ([`pgop_api::defaults`]) into a PostgresCluster, so that the stored object shows the
/// spec in effect: `spec.bootstrap.initdb` when no bootstrap is set, and
/// `spec.backup.timezone` when a backup section has none. Only fields that are absent are
/// added, and the same ones on every CREATE and UPDATE: an apply that leaves them out
/// gets them again, so two appliers of the same manifest never see a change (no drift).
pub fn defaults(spec: &PostgresClusterSpec) -> Vec<serde_json::Value> {
    let defaulted = pgop_api::with_defaults(spec.clone());
    let mut ops = Vec::new();
    let add = |path: &str, value: serde_json::Value| serde_json::json!({"op": "add", "path": path, "value": value});
    match (&spec.bootstrap, &defaulted.bootstrap) {
        (None, Some(bootstrap)) => ops.push(add(
            "/spec/bootstrap",
            serde_json::to_value(bootstrap).unwrap_or_default(),
        )),
        (Some(b), Some(d)) if b.initdb.is_none() && d.initdb.is_some() => ops.push(add(
            "/spec/bootstrap/initdb",
            serde_json::to_value(&d.initdb).unwrap_or_default(),
        )),
        _ => {}
    }
    if let (Some(backup), Some(d)) = (&spec.backup, &defaulted.backup)
        && backup.timezone.is_none()
        && let Some(timezone) = &d.timezone
    {
        ops.push(add("/spec/backup/timezone", timezone.as_str().into()));
    }
    ops
}

/// Whether a cluster with these labels is this operator's to review: every cluster
/// without a `--cluster-selector`; with one, only those it selects (another release of
/// pgop, with the complementary selector, reviews the others with its own rules).
pub fn selected(
    selector: Option<&kube::core::Selector>,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    use kube::core::SelectorExt;
    selector.is_none_or(|s| s.matches(labels))
}

/// Reviews a PostgresBackup being created (`old` is `None`) or updated. With a
/// `selector`, a backup of a cluster that exists and is not selected is left to the
/// release that manages it.
pub async fn backup(
    namespace: &str,
    old: Option<&PostgresBackup>,
    new: &PostgresBackup,
    lookup: &impl Lookup,
    selector: Option<&kube::core::Selector>,
) -> Verdict {
    let mut verdict = Verdict::default();
    let checked = match old {
        Some(old) => validation::validate_backup_update(&old.spec, &new.spec),
        None => validation::validate_backup(&new.spec),
    };
    if let Err(errors) = checked {
        verdict.errors(errors);
    }
    if old.is_some() || !verdict.errors.is_empty() {
        return verdict;
    }
    let field = "spec.cluster.name";
    let name = &new.spec.cluster.name;
    match lookup.cluster(namespace, name).await {
        Ok(Some(cluster)) if !selected(selector, cluster.labels()) => {}
        Ok(Some(cluster)) => {
            let has_store = cluster
                .spec
                .backup
                .as_ref()
                .is_some_and(|b| b.store.is_some());
            if !has_store {
                verdict.error(
                    field,
                    format!(
                        "PostgresCluster {name:?} has no spec.backup.store to write the backup to"
                    ),
                );
            }
        }
        Ok(None) => verdict.error(
            field,
            format!("PostgresCluster {name:?} does not exist in namespace {namespace}"),
        ),
        Err(e) => unchecked(&mut verdict, field, &e),
    }
    verdict
}

const SUPERUSER_SECRET: &str = "spec.credentials.superuserSecret";

/// The Secrets of the user a spec names, by field, always in this order.
fn user_secrets(spec: &PostgresClusterSpec) -> [(&'static str, Option<&str>); 4] {
    [
        ("spec.tls.serverSecret", spec.tls.server_secret.as_deref()),
        (
            "spec.tls.clientCASecret",
            spec.tls.client_ca_secret.as_deref(),
        ),
        (
            "spec.credentials.appSecret",
            spec.credentials.app_secret.as_deref(),
        ),
        (
            SUPERUSER_SECRET,
            spec.credentials.superuser_secret.as_deref(),
        ),
    ]
}

fn credentials_of(store: &BackupStore) -> Option<&pgop_api::cluster::S3Credentials> {
    store.s3.as_ref().map(|s3| &s3.credentials_secret)
}

async fn secret_exists(
    verdict: &mut Verdict,
    lookup: &impl Lookup,
    namespace: &str,
    field: &str,
    name: &str,
) -> Option<Secret> {
    match lookup.secret(namespace, name).await {
        Ok(Some(secret)) => Some(secret),
        Ok(None) => {
            verdict.error(
                field,
                format!("Secret {name:?} does not exist in namespace {namespace}"),
            );
            None
        }
        Err(e) => {
            unchecked(verdict, field, &e);
            None
        }
    }
}

/// An S3 store's credentials Secret exists and holds both keys.
async fn store_credentials(
    verdict: &mut Verdict,
    lookup: &impl Lookup,
    namespace: &str,
    store_field: &str,
    store: &BackupStore,
) {
    let Some(credentials) = credentials_of(store) else {
        return;
    };
    let field = format!("{store_field}.s3.credentialsSecret.name");
    if let Some(secret) = secret_exists(verdict, lookup, namespace, &field, &credentials.name).await
        && let Err(why) = credentials.keys_in(&secret)
    {
        verdict.error(
            &format!("{store_field}.s3.credentialsSecret"),
            format!("Secret {:?}: {why}", credentials.name),
        );
    }
}

fn unchecked(verdict: &mut Verdict, field: &str, error: &str) {
    verdict
        .warnings
        .push(format!("{field} was not checked: {error}"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Objects that exist, by name; a name in `unreadable` fails to read.
    #[derive(Default)]
    struct Objects {
        secrets: BTreeMap<String, Secret>,
        backups: BTreeMap<String, PostgresBackup>,
        clusters: BTreeMap<String, PostgresCluster>,
        classes: BTreeMap<String, PriorityClass>,
        unreadable: Vec<String>,
    }

    impl Objects {
        fn read<T: Clone>(
            &self,
            map: &BTreeMap<String, T>,
            name: &str,
        ) -> Result<Option<T>, String> {
            if self.unreadable.iter().any(|n| n == name) {
                return Err("the API server did not answer".to_string());
            }
            Ok(map.get(name).cloned())
        }
    }

    impl Lookup for Objects {
        async fn secret(&self, _: &str, name: &str) -> Result<Option<Secret>, String> {
            self.read(&self.secrets, name)
        }
        async fn backup(&self, _: &str, name: &str) -> Result<Option<PostgresBackup>, String> {
            self.read(&self.backups, name)
        }
        async fn cluster(&self, _: &str, name: &str) -> Result<Option<PostgresCluster>, String> {
            self.read(&self.clusters, name)
        }
        async fn priority_class(&self, name: &str) -> Result<Option<PriorityClass>, String> {
            self.read(&self.classes, name)
        }
    }

    #[tokio::test]
    async fn a_priority_class_must_exist_when_it_is_named_or_changed() {
        let mut objects = Objects::default();
        objects
            .classes
            .insert("databases".into(), PriorityClass::default());
        objects.unreadable.push("flaky".into());
        let with_class = |class: &str| {
            cluster_of(serde_json::json!({
                "storage": {"size": "1Gi"},
                "affinity": {"priorityClassName": class}
            }))
        };
        let ok = cluster("ns", None, &with_class("databases"), &objects).await;
        assert_eq!(ok, Verdict::default());
        let missing = cluster("ns", None, &with_class("gone"), &objects).await;
        assert_eq!(missing.errors.len(), 1, "{missing:?}");
        assert_eq!(missing.errors[0].field, "spec.affinity.priorityClassName");
        assert!(
            missing.errors[0]
                .message
                .contains("\"gone\" does not exist")
        );
        // Unchanged by an update: not looked up again (it may have been deleted since).
        let old = with_class("gone");
        let mut relabelled = with_class("gone");
        relabelled.spec.replicas = 2;
        let kept = cluster("ns", Some(&old), &relabelled, &objects).await;
        assert_eq!(kept, Verdict::default());
        // Unreadable: allowed with a warning naming the field.
        let unread = cluster("ns", None, &with_class("flaky"), &objects).await;
        assert!(unread.errors.is_empty());
        assert!(
            unread
                .warnings
                .iter()
                .any(|w| w.contains("spec.affinity.priorityClassName")),
            "{unread:?}"
        );
    }

    fn cluster_of(spec: serde_json::Value) -> PostgresCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "ns"},
            "spec": spec,
        }))
        .expect("cluster fixture")
    }

    fn secret(name: &str, keys: &[&str]) -> (String, Secret) {
        let data = keys
            .iter()
            .map(|k| (k.to_string(), k8s_openapi::ByteString(b"x".to_vec())))
            .collect();
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        (name.to_string(), secret)
    }

    fn with_store(secret: &str) -> serde_json::Value {
        serde_json::json!({
            "storage": {"size": "1Gi"},
            "backup": {"store": {"s3": {"bucket": "backups", "credentialsSecret": {"name": secret}}}}
        })
    }

    fn fields(v: &Verdict) -> Vec<&str> {
        v.errors.iter().map(|e| e.field.as_str()).collect()
    }

    #[tokio::test]
    async fn a_cluster_naming_missing_secrets_is_refused_field_by_field() {
        let objects = Objects::default();
        let c = cluster_of(serde_json::json!({
            "storage": {"size": "1Gi"},
            "tls": {"serverSecret": "srv"},
            "credentials": {"appSecret": "app"},
            "backup": {"store": {"s3": {"bucket": "backups", "credentialsSecret": {"name": "s3"}}}}
        }));
        let v = cluster("ns", None, &c, &objects).await;
        assert_eq!(
            fields(&v),
            [
                "spec.tls.serverSecret",
                "spec.credentials.appSecret",
                "spec.backup.store.s3.credentialsSecret.name"
            ]
        );
        assert!(
            v.message()
                .contains("Secret \"srv\" does not exist in namespace ns")
        );
    }

    #[tokio::test]
    async fn s3_credentials_must_hold_both_keys() {
        let mut objects = Objects::default();
        objects.secrets.extend([
            secret("half", &["AWS_ACCESS_KEY_ID"]),
            secret("full", &["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]),
        ]);
        let v = cluster("ns", None, &cluster_of(with_store("half")), &objects).await;
        assert_eq!(fields(&v), ["spec.backup.store.s3.credentialsSecret"]);
        assert!(
            v.message().contains("AWS_SECRET_ACCESS_KEY"),
            "{}",
            v.message()
        );
        let v = cluster("ns", None, &cluster_of(with_store("full")), &objects).await;
        assert_eq!(v, Verdict::default());
    }

    #[tokio::test]
    async fn updates_refuse_what_pgop_cannot_do_and_leave_unchanged_references_alone() {
        let objects = Objects::default();
        let old = cluster_of(with_store("gone"));
        // Only metadata changed: allowed, although the Secret is gone.
        let mut relabelled = old.clone();
        relabelled.labels_mut().insert("team".into(), "a".into());
        assert_eq!(
            cluster("ns", Some(&old), &relabelled, &objects).await,
            Verdict::default()
        );
        // A spec change that keeps the reference: the Secret is not looked at again.
        let mut grown = old.clone();
        grown.spec.storage.size = "2Gi".into();
        assert_eq!(
            cluster("ns", Some(&old), &grown, &objects).await,
            Verdict::default()
        );
        // A shrink and a restore added after creation, refused with their fields.
        let mut changed = old.clone();
        changed.spec.storage.size = "512Mi".into();
        changed.spec.bootstrap = Some(
            serde_json::from_value(serde_json::json!({"recovery": {"backup": "b1"}}))
                .expect("bootstrap"),
        );
        let v = cluster("ns", Some(&old), &changed, &objects).await;
        assert_eq!(fields(&v), ["spec.storage.size", "spec.bootstrap"]);
        // The invalid spec itself is reported once, not once per check that sees it.
        let mut invalid = old.clone();
        invalid.spec.failover_delay = -1;
        let v = cluster("ns", Some(&old), &invalid, &objects).await;
        assert_eq!(fields(&v), ["spec.failoverDelay"]);
    }

    #[tokio::test]
    async fn a_restore_needs_its_backup_at_creation_only() {
        let mut objects = Objects::default();
        let c = cluster_of(serde_json::json!({
            "storage": {"size": "1Gi"},
            "bootstrap": {"recovery": {"backup": "nightly"}}
        }));
        let v = cluster("ns", None, &c, &objects).await;
        assert_eq!(fields(&v), ["spec.bootstrap.recovery.backup"]);
        assert!(
            v.message()
                .contains("PostgresBackup \"nightly\" does not exist")
        );
        let mut later = c.clone();
        later.spec.replicas = 2;
        assert_eq!(
            cluster("ns", Some(&c), &later, &objects).await,
            Verdict::default()
        );
        objects.unreadable.push("nightly".into());
        let v = cluster("ns", None, &c, &objects).await;
        assert!(v.errors.is_empty());
        assert_eq!(
            v.warnings,
            ["spec.bootstrap.recovery.backup was not checked: the API server did not answer"]
        );
    }

    #[test]
    fn defaults_are_added_only_where_absent_and_then_there_is_nothing_to_add() {
        let c = cluster_of(with_store("s3"));
        let ops = defaults(&c.spec);
        assert_eq!(
            ops,
            [
                serde_json::json!({"op": "add", "path": "/spec/bootstrap", "value": {"initdb": {"database": "app", "owner": "app"}}}),
                serde_json::json!({"op": "add", "path": "/spec/backup/timezone", "value": "UTC"}),
            ]
        );
        // Applied, nothing is left to add.
        let mut value = serde_json::to_value(&c).expect("json");
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::Value::Array(ops)).expect("a JSON patch");
        json_patch::patch(&mut value, &patch).expect("applies");
        let defaulted: PostgresCluster = serde_json::from_value(value).expect("a cluster");
        assert!(defaults(&defaulted.spec).is_empty());
        assert_eq!(defaulted.spec, pgop_api::with_defaults(c.spec.clone()));
        // What the user set stays.
        let restore = cluster_of(serde_json::json!({
            "storage": {"size": "1Gi"},
            "bootstrap": {"recovery": {"backup": "b"}},
            "backup": {"timezone": "Europe/Berlin"}
        }));
        assert!(defaults(&restore.spec).is_empty());
        let empty = cluster_of(serde_json::json!({"storage": {"size": "1Gi"}, "bootstrap": {}}));
        assert_eq!(
            defaults(&empty.spec),
            [
                serde_json::json!({"op": "add", "path": "/spec/bootstrap/initdb", "value": {"database": "app", "owner": "app"}})
            ]
        );
    }

    #[tokio::test]
    async fn a_backup_needs_a_cluster_with_a_store() {
        let mut objects = Objects::default();
        let b: PostgresBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresBackup",
            "metadata": {"name": "b1", "namespace": "ns"},
            "spec": {"cluster": {"name": "db"}}
        }))
        .expect("backup fixture");
        let v = backup("ns", None, &b, &objects, None).await;
        assert_eq!(fields(&v), ["spec.cluster.name"]);
        assert!(
            v.message()
                .contains("PostgresCluster \"db\" does not exist in namespace ns")
        );
        objects.clusters.insert(
            "db".into(),
            cluster_of(serde_json::json!({"storage": {"size": "1Gi"}})),
        );
        let v = backup("ns", None, &b, &objects, None).await;
        assert!(
            v.message().contains("has no spec.backup.store"),
            "{}",
            v.message()
        );
        objects
            .clusters
            .insert("db".into(), cluster_of(with_store("s3")));
        assert_eq!(
            backup("ns", None, &b, &objects, None).await,
            Verdict::default()
        );
        // Another release's cluster (not selected here): left to that release.
        let selector = crate::selector::parse("channel=canary").expect("a selector");
        let mut stable = cluster_of(serde_json::json!({"storage": {"size": "1Gi"}}));
        stable
            .labels_mut()
            .insert("channel".into(), "stable".into());
        objects.clusters.insert("db".into(), stable);
        assert_eq!(
            backup("ns", None, &b, &objects, Some(&selector)).await,
            Verdict::default()
        );
        assert!(!selected(
            Some(&selector),
            &std::collections::BTreeMap::new()
        ));
        assert!(selected(None, &std::collections::BTreeMap::new()));
        let mut other = b.clone();
        other.spec.cluster.name = "elsewhere".into();
        let v = backup("ns", Some(&b), &other, &objects, None).await;
        assert_eq!(fields(&v), ["spec"]);
    }
}
