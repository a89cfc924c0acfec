//! Storage-version migration (`pgop migrate-storage`): every object of a CRD is written
//! again, so that the API server stores it in the CRD's storage version, and then the
//! versions no object is stored in any more leave the CRD's `status.storedVersions`.
//!
//! Each object is written back as it was read (an update carrying the resourceVersion
//! read). The API server encodes it in the storage version and stores it, as it would any
//! change. A conflict means somebody else wrote the object since it was read, and so
//! stored it in the storage version already; an object deleted since is gone. Neither
//! needs another try, so the migration is safe while the operator (or anyone) writes
//! the objects, and safe to run twice. Objects created meanwhile are stored in the
//! storage version from the start.
//!
//! Reading objects stored in another version goes through the CRD's conversion webhook
//! (the operator's `POST /convert`): it must be up. An object the API server refuses to
//! write (an admission webhook's refusal, say) is reported by name, and `storedVersions`
//! is left as it was.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;

/// What a migration of one CRD did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The CRD.
    pub crd: String,
    /// Its storage version (`v1beta1`).
    pub storage_version: String,
    /// `status.storedVersions` before.
    pub stored_before: Vec<String>,
    /// Objects written back by the migration.
    pub rewritten: usize,
    /// Objects somebody else wrote (or deleted) between the read and the write.
    pub changed_meanwhile: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read CustomResourceDefinition {0}")]
    ReadCrd(String, #[source] kube::Error),
    #[error("CustomResourceDefinition {0} has no storage version")]
    NoStorageVersion(String),
    #[error(
        "failed to list the {kind} objects in {version} (objects stored in another version are converted by the CRD's conversion webhook: is the operator serving it?)"
    )]
    List {
        kind: String,
        version: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{} of the {kind} objects could not be written again, so status.storedVersions is left as it is: {}",
        .failed.len(),
        .failed.join("; ")
    )]
    Objects { kind: String, failed: Vec<String> },
    #[error("failed to set status.storedVersions of CustomResourceDefinition {0} to [{1}]")]
    StoredVersions(String, String, #[source] kube::Error),
}

/// How many objects a list page holds.
const PAGE: u32 = 250;

/// Migrates every object of CRD `name` to its storage version, then leaves only that
/// version in `status.storedVersions`.
pub async fn storage(client: &kube::Client, name: &str) -> Result<Report, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get(name)
        .await
        .map_err(|e| Error::ReadCrd(name.to_string(), e))?;
    let storage_version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .ok_or_else(|| Error::NoStorageVersion(name.to_string()))?;
    let stored_before = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let kind = crd.spec.names.kind.clone();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &storage_version, &kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut report = Report {
        crd: name.to_string(),
        storage_version: storage_version.clone(),
        stored_before,
        ..Report::default()
    };
    let mut failed = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(|source| Error::List {
            kind: kind.clone(),
            version: storage_version.clone(),
            source,
        })?;
        for object in page.items {
            let namespace = object.metadata.namespace.clone().unwrap_or_default();
            let object_name = object.metadata.name.clone().unwrap_or_default();
            let scoped: Api<DynamicObject> = if namespace.is_empty() {
                Api::all_with(client.clone(), &resource)
            } else {
                Api::namespaced_with(client.clone(), &namespace, &resource)
            };
            match scoped
                .replace(&object_name, &PostParams::default(), &object)
                .await
            {
                Ok(_) => report.rewritten += 1,
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                    report.changed_meanwhile += 1
                }
                Err(e) => failed.push(format!(
                    "{namespace}/{object_name}: {}",
                    crate::error_chain(&e)
                )),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    if !failed.is_empty() {
        return Err(Error::Objects { kind, failed });
    }
    if report.stored_before != [storage_version.clone()] {
        let patch = serde_json::json!({"status": {"storedVersions": [storage_version]}});
        crds.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::StoredVersions(name.to_string(), storage_version.clone(), e))?;
    }
    tracing::info!(
        crd = %name,
        storage_version = %report.storage_version,
        rewritten = report.rewritten,
        changed_meanwhile = report.changed_meanwhile,
        "migrated the stored objects"
    );
    Ok(report)
}

/// Objects whose ownerReferences name a PostgresCluster in a version other than the one
/// pgop writes ([`pgop_api::owner`]): what keeps `v1alpha1` from being retired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerScan {
    /// `Kind namespace/name` of each such object.
    pub outdated: Vec<String>,
    /// The kinds that could not be listed, with the API server's answer (RBAC, say).
    pub unreadable: Vec<String>,
}

/// Lists, in every namespace and by metadata only, every kind pgop makes children of
/// (and the instance managers' Leases and PostgresBackups), and names the objects whose
/// ownerReferences still name a PostgresCluster in another version than
/// [`pgop_api::constants::CLUSTER_OWNER_API_VERSION`]. The operator renames them on its
/// next pass of their cluster, the instance managers on their next Lease renewal.
pub async fn outdated_owner_references(client: &kube::Client) -> OwnerScan {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let mut scan = OwnerScan::default();
    scan_kind::<Pod>(client, &mut scan).await;
    scan_kind::<PersistentVolumeClaim>(client, &mut scan).await;
    scan_kind::<Service>(client, &mut scan).await;
    scan_kind::<Secret>(client, &mut scan).await;
    scan_kind::<ServiceAccount>(client, &mut scan).await;
    scan_kind::<Role>(client, &mut scan).await;
    scan_kind::<RoleBinding>(client, &mut scan).await;
    scan_kind::<PodDisruptionBudget>(client, &mut scan).await;
    scan_kind::<NetworkPolicy>(client, &mut scan).await;
    scan_kind::<Lease>(client, &mut scan).await;
    scan_kind::<pgop_api::PostgresBackup>(client, &mut scan).await;
    scan
}

async fn scan_kind<K>(client: &kube::Client, scan: &mut OwnerScan)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&()).to_string();
    let api: Api<K> = Api::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(e) => {
                scan.unreadable
                    .push(format!("{kind}: {}", crate::error_chain(&e)));
                return;
            }
        };
        for object in page.items {
            let meta = &object.metadata;
            if meta
                .owner_references
                .iter()
                .flatten()
                .any(pgop_api::owner::is_outdated)
            {
                scan.outdated.push(format!(
                    "{kind} {}/{}",
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default()
                ));
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return,
        }
    }
}
