//! Apply: make the API server hold the built children, writing only what differs.
//!
//! - Most children go through server-side apply under the one field manager, and only
//!   when the built object is not already contained in the live one. A reconcile that
//!   finds everything in place therefore sends no write at all, and fields that others
//!   add (a user's extra label, server defaults) are neither fought over nor counted as
//!   drift. Quantities compare by value: the API server stores them in canonical form (a
//!   PVC asked for `1.5Gi` holds `1536Mi`), which is no drift either.
//! - Secrets are created once and their data never rewritten (passwords and the
//!   certificate authority are generated once), except the managers' certificate, which
//!   is server-side applied like the rest and so rewritten when it is renewed, and the app
//!   Secret's `uri`, rewritten to match a password the user changed; Pods are created
//!   once, since their spec is immutable (restarts for new settings are the rolling
//!   update's job). For both, drifted labels and a missing ownerReference are repaired
//!   with a metadata-only patch.
//! - Instances the plan removed lose their Pod, then their PVC.
//!
//! Why this file stays whole: it is one idea, the writes of the built children: each sent
//! only when it differs from what was observed (`is_contained`, `metadata_patch`), each
//! delete only of the object seen (by its uid), and every write recorded in one `Outcome`;
//! about 140 of its lines are the unit tests.

use crate::cluster::build::{Children, quantity};
use crate::cluster::observe::cache::Written;
use crate::cluster::world::Observed;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use pgop_api::constants::FIELD_MANAGER;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Debug;

pub use crate::cluster::error::ApplyError as Error;

/// What an apply pass changed, for events and status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Names of objects that did not exist and were created, as `Kind/name`.
    pub created: Vec<String>,
    /// Names of objects that existed and were changed back to the desired state.
    pub repaired: Vec<String>,
    /// Names of objects deleted, as `Kind/name`.
    pub deleted: Vec<String>,
    /// Every write, with the resourceVersion it returned: what the watch caches must show
    /// before a later pass may trust them ([`crate::cluster::observe::cache::Expectations`]).
    pub written: Vec<Written>,
    /// Changes of existing PersistentVolumeClaims the API server refused (an expansion the
    /// StorageClass does not allow, a claim not bound yet): the claim's name and the API
    /// server's words. The rest of the pass went on without them.
    pub refused_volumes: Vec<(String, String)>,
}

impl Outcome {
    fn wrote<K: Resource + k8s_openapi::Resource>(&mut self, obj: &K) {
        self.written.push(Written {
            kind: K::KIND,
            name: obj.name_any(),
            version: obj.meta().resource_version.clone(),
            uid: None,
        });
    }

    fn deleted<K: k8s_openapi::Resource>(&mut self, name: &str, uid: Option<String>) {
        self.deleted.push(format!("{}/{name}", K::KIND));
        self.written.push(Written {
            kind: K::KIND,
            name: name.to_string(),
            version: None,
            uid,
        });
    }
}

/// True when every field of `desired` is present with the same value in `live`.
/// Objects compare key by key (extra keys in `live` are fine), lists element by element
/// (same length), scalars by equality — except quantities, which compare by value
/// (see [`is_quantity_field`]).
pub fn is_contained(desired: &Value, live: &Value) -> bool {
    contained(desired, live, None, None)
}

/// [`is_contained`] of a value under the key `key` of an object under `parent`.
fn contained(desired: &Value, live: &Value, parent: Option<&str>, key: Option<&str>) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d
            .iter()
            .all(|(k, v)| v.is_null() || l.get(k).is_some_and(|lv| contained(v, lv, key, Some(k)))),
        (Value::Array(d), Value::Array(l)) => {
            // The elements of a list are under the list's key.
            d.len() == l.len() && d.iter().zip(l).all(|(a, b)| contained(a, b, parent, key))
        }
        (Value::String(d), Value::String(l)) if is_quantity_field(parent, key) => {
            quantity::same_value(d, l)
        }
        _ => desired == live,
    }
}

/// Whether the field `key` of an object under `parent` holds a quantity: the values of
/// `requests` and `limits` (a PVC's `spec.resources`, a container's `resources`) and an
/// emptyDir's `sizeLimit`.
fn is_quantity_field(parent: Option<&str>, key: Option<&str>) -> bool {
    matches!(parent, Some("requests" | "limits")) || key == Some("sizeLimit")
}

fn find<'a, K: ResourceExt>(live: &'a [K], name: &str) -> Option<&'a K> {
    live.iter().find(|o| o.name_any() == name)
}

fn api<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(client.clone(), namespace)
}

fn to_json<K: ResourceExt + k8s_openapi::Resource + Serialize>(obj: &K) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|source| Error::Serialize {
        kind: K::KIND,
        name: obj.name_any(),
        source,
    })
}

/// Server-side apply under pgop's field manager, taking over fields others changed.
async fn server_side_apply<K>(api: &Api<K>, desired: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()>
        + k8s_openapi::Resource
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let name = desired.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await
    .map_err(|source| Error::Apply {
        kind: K::KIND,
        name,
        source,
    })
}

/// Server-side applies `desired` unless `live` already contains it.
async fn apply_if_changed<K>(
    client: &Client,
    namespace: &str,
    desired: &K,
    live: &[K],
    extra_equal: impl Fn(&K, &K) -> bool,
    outcome: &mut Outcome,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let name = desired.name_any();
    let label = format!("{}/{name}", <K as k8s_openapi::Resource>::KIND);
    let current = find(live, &name);
    if let Some(current) = current
        && is_contained(&to_json(desired)?, &to_json(current)?)
        && extra_equal(desired, current)
    {
        return Ok(());
    }
    let written = server_side_apply(&api::<K>(client, namespace), desired).await?;
    outcome.wrote(&written);
    if current.is_some() {
        outcome.repaired.push(label);
    } else {
        outcome.created.push(label);
    }
    Ok(())
}

/// Creates `desired` if it does not exist; otherwise only repairs its labels and
/// ownerReference, never its data or spec.
///
/// Created with a plain create, never an apply: when the view of what exists is behind
/// (a watch cache), the API server refuses to create it again (409), and the object,
/// a certificate authority or a password, is never overwritten.
async fn create_or_fix_metadata<K>(
    client: &Client,
    namespace: &str,
    desired: &K,
    live: &[K],
    outcome: &mut Outcome,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let name = desired.name_any();
    let label = format!("{}/{name}", <K as k8s_openapi::Resource>::KIND);
    let api = api::<K>(client, namespace);
    let apply_err = |source| Error::Apply {
        kind: <K as k8s_openapi::Resource>::KIND,
        name: name.clone(),
        source,
    };
    let Some(current) = find(live, &name) else {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.create(&params, desired).await {
            Ok(created) => {
                outcome.wrote(&created);
                outcome.created.push(label);
            }
            // It exists after all: the view was behind. The next pass repairs its
            // metadata if it must.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(apply_err(e)),
        }
        return Ok(());
    };
    if let Some(patch) = metadata_patch(desired.meta(), current.meta()) {
        let patched = api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(patch),
            )
            .await
            .map_err(apply_err)?;
        outcome.wrote(&patched);
        outcome.repaired.push(label);
    }
    Ok(())
}

/// Rewrites the `keys` of an existing Secret that differ from `desired`'s (keys derived
/// from a password the user may change, such as the app Secret's `uri`); the password and
/// every other key are left as they are.
async fn fix_derived_keys(
    client: &Client,
    namespace: &str,
    desired: &Secret,
    live: &[Secret],
    keys: &[&str],
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let name = desired.name_any();
    let Some(current) = find(live, &name) else {
        return Ok(());
    };
    let wanted = desired.string_data.clone().unwrap_or_default();
    let mut changed = serde_json::Map::new();
    for key in keys {
        let Some(value) = wanted.get(*key) else {
            continue;
        };
        let now = current
            .data
            .as_ref()
            .and_then(|d| d.get(*key))
            .map(|v| v.0.as_slice());
        if now != Some(value.as_bytes()) {
            changed.insert((*key).to_string(), Value::String(value.clone()));
        }
    }
    if changed.is_empty() {
        return Ok(());
    }
    let patched = api::<Secret>(client, namespace)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(serde_json::json!({ "stringData": changed })),
        )
        .await
        .map_err(|source| Error::Apply {
            kind: "Secret",
            name: name.clone(),
            source,
        })?;
    outcome.wrote(&patched);
    outcome.repaired.push(format!("Secret/{name}"));
    Ok(())
}

/// A merge patch setting the desired labels and ownerReferences, or `None` when the live
/// metadata already has them. A desired reference missing from `live` is added; one whose
/// owner (uid) `live` names differently (`v1alpha1` where `v1beta1` is built, say) replaces
/// it. Other labels and other owners' references are left alone.
pub fn metadata_patch(desired: &ObjectMeta, live: &ObjectMeta) -> Option<Value> {
    let live_labels = live.labels.clone().unwrap_or_default();
    let mut labels = serde_json::Map::new();
    for (k, v) in desired.labels.iter().flatten() {
        if live_labels.get(k) != Some(v) {
            labels.insert(k.clone(), Value::String(v.clone()));
        }
    }
    let live_owners = live.owner_references.clone().unwrap_or_default();
    let wanted: Vec<_> = desired.owner_references.iter().flatten().collect();
    let owners_fit = wanted.iter().all(|o| live_owners.contains(o));
    if labels.is_empty() && owners_fit {
        return None;
    }
    let mut meta = serde_json::Map::new();
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !owners_fit {
        // A merge patch replaces the whole list: the others' references go in unchanged.
        let mut all: Vec<_> = live_owners
            .into_iter()
            .filter(|l| !wanted.iter().any(|o| o.uid == l.uid))
            .collect();
        all.extend(wanted.into_iter().cloned());
        meta.insert("ownerReferences".into(), serde_json::to_value(all).ok()?);
    }
    Some(serde_json::json!({ "metadata": meta }))
}

fn selectors_equal(
    a: &k8s_openapi::api::core::v1::Service,
    b: &k8s_openapi::api::core::v1::Service,
) -> bool {
    // A Service's selector must match exactly: an extra key would starve it of endpoints.
    let sel =
        |s: &k8s_openapi::api::core::v1::Service| s.spec.as_ref().and_then(|s| s.selector.clone());
    sel(a) == sel(b)
}

fn always<K>(_: &K, _: &K) -> bool {
    true
}

/// Applies every built child against what was observed.
pub async fn apply(
    client: &Client,
    namespace: &str,
    children: &Children,
    observed: &Observed,
) -> Result<Outcome, Error> {
    let Children {
        service_account,
        role,
        role_binding,
        app_secret,
        app_derived_keys,
        replication_secret,
        superuser_secret,
        superuser_secret_name,
        ca_secret,
        manager_tls_secret,
        postgres_ca_secret,
        server_tls_secret,
        replication_tls_secret,
        services,
        pod_disruption_budgets,
        pvcs,
        pods,
        network_policy,
        poolers,
    } = children;
    let mut out = Outcome::default();
    apply_if_changed(
        client,
        namespace,
        service_account,
        &observed.service_accounts,
        always,
        &mut out,
    )
    .await?;
    apply_if_changed(client, namespace, role, &observed.roles, always, &mut out).await?;
    apply_if_changed(
        client,
        namespace,
        role_binding,
        &observed.role_bindings,
        always,
        &mut out,
    )
    .await?;
    create_or_fix_metadata(client, namespace, app_secret, &observed.secrets, &mut out).await?;
    fix_derived_keys(
        client,
        namespace,
        app_secret,
        &observed.secrets,
        app_derived_keys,
        &mut out,
    )
    .await?;
    match superuser_secret {
        Some((secret, keys)) => {
            create_or_fix_metadata(client, namespace, secret, &observed.secrets, &mut out).await?;
            fix_derived_keys(client, namespace, secret, &observed.secrets, keys, &mut out).await?;
        }
        // spec.credentials.superuserAccess is off: no Secret holds a superuser password.
        None => {
            if let Some(secret) = find(&observed.secrets, superuser_secret_name) {
                delete(client, namespace, secret, background(), &mut out).await?;
            }
        }
    }
    create_or_fix_metadata(
        client,
        namespace,
        replication_secret,
        &observed.secrets,
        &mut out,
    )
    .await?;
    create_or_fix_metadata(client, namespace, ca_secret, &observed.secrets, &mut out).await?;
    create_or_fix_metadata(
        client,
        namespace,
        postgres_ca_secret,
        &observed.secrets,
        &mut out,
    )
    .await?;
    // Renewed certificates are written here: the managers read them on their next pass
    // (and PostgreSQL reloads its own).
    for tls in [
        manager_tls_secret,
        server_tls_secret,
        replication_tls_secret,
    ] {
        apply_if_changed(client, namespace, tls, &observed.secrets, always, &mut out).await?;
    }
    for service in services {
        apply_if_changed(
            client,
            namespace,
            service,
            &observed.services,
            selectors_equal,
            &mut out,
        )
        .await?;
    }
    for budget in pod_disruption_budgets {
        apply_if_changed(
            client,
            namespace,
            budget,
            &observed.pod_disruption_budgets,
            always,
            &mut out,
        )
        .await?;
    }
    // A budget no longer built (the primary's, once no switchover could move it) goes.
    for stale in &observed.pod_disruption_budgets {
        let name = stale.name_any();
        if !pod_disruption_budgets.iter().any(|b| b.name_any() == name) {
            delete(client, namespace, stale, background(), &mut out).await?;
        }
    }
    for pvc in pvcs {
        match apply_if_changed(client, namespace, pvc, &observed.pvcs, always, &mut out).await {
            // A change of an existing claim that the API server refuses (its expansion)
            // must not hold back the Pods behind it: reported, and tried again next pass.
            Err(Error::Apply {
                source: kube::Error::Api(e),
                name,
                ..
            }) if find(&observed.pvcs, &name).is_some() && matches!(e.code, 400 | 403 | 422) => {
                out.refused_volumes.push((name, e.message));
            }
            other => other?,
        }
    }
    for pod in pods {
        create_or_fix_metadata(client, namespace, pod, &observed.pods, &mut out).await?;
    }
    apply_poolers(client, namespace, poolers, observed, &mut out).await?;
    match network_policy {
        Some(policy) => {
            apply_if_changed(
                client,
                namespace,
                policy,
                &observed.network_policies,
                always,
                &mut out,
            )
            .await?
        }
        // spec.networkPolicy.enabled turned off: the policy goes.
        None => {
            for stale in &observed.network_policies {
                delete(client, namespace, stale, background(), &mut out).await?;
            }
        }
    }
    Ok(out)
}

/// The poolers (`spec.poolers`): their identity, Deployments and Services; those of
/// poolers no longer declared are deleted (Deployment first, then Service). The identity
/// stays once made (it goes with the cluster).
async fn apply_poolers(
    client: &Client,
    namespace: &str,
    poolers: &crate::cluster::build::pooler::Poolers,
    observed: &Observed,
    out: &mut Outcome,
) -> Result<(), Error> {
    if let Some(secret) = &poolers.auth_secret {
        create_or_fix_metadata(client, namespace, secret, &observed.secrets, out).await?;
    }
    if let Some((account, role, binding)) = &poolers.identity {
        apply_if_changed(
            client,
            namespace,
            account,
            &observed.service_accounts,
            always,
            out,
        )
        .await?;
        apply_if_changed(client, namespace, role, &observed.roles, always, out).await?;
        apply_if_changed(
            client,
            namespace,
            binding,
            &observed.role_bindings,
            always,
            out,
        )
        .await?;
    }
    for service in &poolers.services {
        apply_if_changed(
            client,
            namespace,
            service,
            &observed.services,
            selectors_equal,
            out,
        )
        .await?;
    }
    for deployment in &poolers.deployments {
        apply_if_changed(
            client,
            namespace,
            deployment,
            &observed.deployments,
            always,
            out,
        )
        .await?;
    }
    let is_pooler = |meta: &ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(pgop_api::labels::COMPONENT))
            .is_some_and(|c| c == pgop_api::labels::COMPONENT_POOLER)
    };
    for stale in &observed.deployments {
        let name = stale.name_any();
        if is_pooler(&stale.metadata) && !poolers.deployments.iter().any(|d| d.name_any() == name) {
            delete(client, namespace, stale, background(), out).await?;
        }
    }
    for stale in &observed.services {
        let name = stale.name_any();
        if is_pooler(&stale.metadata) && !poolers.services.iter().any(|s| s.name_any() == name) {
            delete(client, namespace, stale, background(), out).await?;
        }
    }
    Ok(())
}

/// Deletes one instance's Pod (gracefully), keeping its volume: the next reconcile
/// creates the Pod anew from the current spec.
pub async fn delete_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    observed: &Observed,
    out: &mut Outcome,
) -> Result<(), Error> {
    match find(&observed.pods, name) {
        Some(pod) => delete(client, namespace, pod, DeleteParams::default(), out).await,
        None => Ok(()),
    }
}

/// Background propagation: the object goes at once, its dependents after.
fn background() -> DeleteParams {
    DeleteParams::background()
}

/// Deletes `live`, and only that object: the delete is conditional on its uid, so that a
/// view that is behind (a watch cache) cannot delete a newer object of the same name.
/// Gone already, or replaced, is success.
async fn delete<K>(
    client: &Client,
    namespace: &str,
    live: &K,
    mut params: DeleteParams,
    out: &mut Outcome,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + DeserializeOwned
        + Clone
        + Debug,
{
    let name = live.name_any();
    let uid = live.meta().uid.clone();
    if let Some(uid) = &uid {
        params.preconditions = Some(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        });
    }
    match api::<K>(client, namespace).delete(&name, &params).await {
        Ok(_) => {
            out.deleted::<K>(&name, uid);
            Ok(())
        }
        // 404: gone already; 409: the uid precondition failed, so the object of that name
        // is another one, and the one meant is gone.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::Delete {
            kind: <K as k8s_openapi::Resource>::KIND,
            name,
            source,
        }),
    }
}

/// Deletes the Pod and the claims (data, WAL) of every named instance that still has them.
pub async fn delete_instances(
    client: &Client,
    namespace: &str,
    names: &[String],
    observed: &Observed,
    out: &mut Outcome,
) -> Result<(), Error> {
    for name in names {
        if let Some(pod) = find(&observed.pods, name) {
            delete(client, namespace, pod, background(), out).await?;
        }
        for claim in [name.clone(), pgop_api::labels::wal_claim(name)] {
            if let Some(pvc) = find(&observed.pvcs, &claim) {
                delete(client, namespace, pvc, background(), out).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_and_extra_labels_are_not_drift() {
        let desired =
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 5432}]}});
        let live = json!({
            "metadata": {"labels": {"a": "1", "user": "x"}, "uid": "u"},
            "spec": {"ports": [{"port": 5432, "protocol": "TCP"}], "clusterIP": "10.0.0.7"}
        });
        assert!(is_contained(&desired, &live));
    }

    #[test]
    fn a_changed_value_or_missing_item_is_drift() {
        let desired = json!({"spec": {"selector": {"role": "primary"}, "ports": [{"port": 5432}]}});
        let changed = json!({"spec": {"selector": {"role": "replica"}, "ports": [{"port": 5432}]}});
        let fewer = json!({"spec": {"selector": {"role": "primary"}, "ports": []}});
        assert!(!is_contained(&desired, &changed));
        assert!(!is_contained(&desired, &fewer));
    }

    fn pvc(size: &str) -> Value {
        json!({
            "metadata": {"name": "db-1"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}}
            }
        })
    }

    #[test]
    fn a_quantity_the_api_server_rewrote_is_not_drift() {
        for (asked, stored) in [("1.5Gi", "1536Mi"), ("2048Mi", "2Gi"), ("1000M", "1G")] {
            let mut live = pvc(stored);
            live["spec"]["volumeMode"] = json!("Filesystem");
            assert!(
                is_contained(&pvc(asked), &live),
                "{asked} stored as {stored}"
            );
        }
        let container = |cpu: &str, memory: &str| {
            json!({"spec": {"containers": [{"name": "postgres", "resources": {
                "requests": {"cpu": cpu, "memory": memory},
                "limits": {"memory": memory}
            }}]}})
        };
        assert!(is_contained(
            &container("0.5", "1.5Gi"),
            &container("500m", "1536Mi")
        ));
        let empty_dir =
            |size: &str| json!({"volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": size}}]});
        assert!(is_contained(&empty_dir("1024Mi"), &empty_dir("1Gi")));
    }

    #[test]
    fn another_quantity_is_drift() {
        assert!(!is_contained(&pvc("2Gi"), &pvc("1Gi")));
        assert!(!is_contained(&pvc("1G"), &pvc("1Gi")));
        assert!(!is_contained(&pvc("1536Mi"), &pvc("1537Mi")));
        // Text that is not a quantity compares as text.
        assert!(!is_contained(&pvc("1 Gi"), &pvc("1Gi")));
        assert!(is_contained(&pvc("1 Gi"), &pvc("1 Gi")));
    }

    #[test]
    fn only_quantity_fields_compare_by_value() {
        // The same texts anywhere else are different values.
        let labels = |v: &str| json!({"metadata": {"labels": {"size": v}}});
        assert!(!is_contained(&labels("1000M"), &labels("1G")));
        let selector = |v: &str| json!({"spec": {"selector": {"requests": v}}});
        assert!(!is_contained(&selector("1000M"), &selector("1G")));
        let pdb = |v: &str| json!({"spec": {"maxUnavailable": v}});
        assert!(!is_contained(&pdb("1000m"), &pdb("1")));
    }

    #[test]
    fn metadata_patch_adds_labels_and_owner_without_touching_others() {
        let desired: ObjectMeta = serde_json::from_value(json!({
            "labels": {"role": "primary"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "c", "uid": "1"}]
        }))
        .expect("valid meta");
        let live: ObjectMeta = serde_json::from_value(json!({
            "labels": {"role": "replica", "mine": "keep"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Y", "name": "o", "uid": "2"}]
        }))
        .expect("valid meta");
        let patch = metadata_patch(&desired, &live).expect("a patch");
        assert_eq!(patch["metadata"]["labels"], json!({"role": "primary"}));
        assert_eq!(
            patch["metadata"]["ownerReferences"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        let fixed: ObjectMeta = serde_json::from_value(json!({
            "labels": {"role": "primary", "mine": "keep"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "c", "uid": "1"}]
        }))
        .expect("valid meta");
        assert_eq!(metadata_patch(&desired, &fixed), None);
    }

    #[test]
    fn metadata_patch_renames_the_owners_version_and_keeps_other_owners() {
        let owner = |version: &str, uid: &str| {
            json!({"apiVersion": version, "kind": "PostgresCluster", "name": "db", "uid": uid,
                   "controller": true, "blockOwnerDeletion": true})
        };
        let desired: ObjectMeta = serde_json::from_value(json!({
            "ownerReferences": [owner("database.example.com/v1beta1", "1")]
        }))
        .expect("valid meta");
        let live: ObjectMeta = serde_json::from_value(json!({
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "2"},
                owner("database.example.com/v1alpha1", "1")
            ]
        }))
        .expect("valid meta");
        let patch = metadata_patch(&desired, &live).expect("a patch");
        assert_eq!(patch["metadata"].get("labels"), None);
        assert_eq!(
            patch["metadata"]["ownerReferences"],
            json!([
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "2"},
                owner("database.example.com/v1beta1", "1")
            ])
        );
        let fixed: ObjectMeta =
            serde_json::from_value(patch["metadata"].clone()).expect("valid meta");
        assert_eq!(metadata_patch(&desired, &fixed), None);
    }
}
