//! A minimal volume provisioner: every pending PVC of the local StorageClass (or of no
//! class) gets a PersistentVolume backed by a local directory, which kube-controller-manager's
//! binder then binds. A released volume's directory is removed with the PV.

use super::NodeError;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::path::{Path, PathBuf};

/// The StorageClass the local node provisions (made the default class).
pub const STORAGE_CLASS: &str = "pgop-local";
const PROVISIONER: &str = "pgop.testenv/local";
const NODE_LABEL: &str = "pgop.testenv/node";

pub async fn ensure_storage_class(client: &Client) -> Result<(), NodeError> {
    let sc: StorageClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate"
    }))
    .map_err(|e| NodeError::Internal(e.to_string()))?;
    Api::<StorageClass>::all(client.clone())
        .patch(
            STORAGE_CLASS,
            &PatchParams::apply("pgop-local-node").force(),
            &Patch::Apply(&sc),
        )
        .await
        .map_err(|e| NodeError::api("apply the local StorageClass", e))?;
    Ok(())
}

fn ours(pvc: &PersistentVolumeClaim) -> bool {
    let class = pvc
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    matches!(class, None | Some("") | Some(STORAGE_CLASS))
}

/// One provisioning pass over `namespace` (all namespaces when `None`).
pub async fn sync(
    client: &Client,
    node: &str,
    namespace: Option<&str>,
    root: &Path,
) -> Result<(), NodeError> {
    let pvcs: Api<PersistentVolumeClaim> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for pvc in pvcs
        .list(&ListParams::default())
        .await
        .map_err(|e| NodeError::api("list PVCs", e))?
        .items
    {
        let bound = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_ref())
            .is_some();
        if bound || pvc.metadata.deletion_timestamp.is_some() || !ours(&pvc) {
            continue;
        }
        let (Some(ns), Some(uid)) = (pvc.namespace(), pvc.uid()) else {
            continue;
        };
        let pv_name = format!("pvc-{uid}");
        if pvs
            .get_opt(&pv_name)
            .await
            .map_err(|e| NodeError::api("get PV", e))?
            .is_some()
        {
            continue; // created already; the binder will bind it
        }
        let dir = root.join(&pv_name);
        std::fs::create_dir_all(&dir).map_err(|e| NodeError::io(&dir, e))?;
        let spec = pvc.spec.clone().unwrap_or_default();
        let capacity = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage").cloned());
        let pv = PersistentVolume {
            metadata: kube::api::ObjectMeta {
                name: Some(pv_name.clone()),
                labels: Some([(NODE_LABEL.to_string(), node.to_string())].into()),
                annotations: Some(
                    [(
                        "pv.kubernetes.io/provisioned-by".to_string(),
                        PROVISIONER.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: capacity.map(|c| [("storage".to_string(), c)].into()),
                access_modes: spec
                    .access_modes
                    .clone()
                    .or_else(|| Some(vec!["ReadWriteOnce".into()])),
                storage_class_name: Some(spec.storage_class_name.clone().unwrap_or_default()),
                persistent_volume_reclaim_policy: Some("Delete".into()),
                host_path: Some(HostPathVolumeSource {
                    path: dir.display().to_string(),
                    type_: Some("Directory".into()),
                }),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: Some(ns),
                    name: Some(pvc.name_any()),
                    uid: Some(uid),
                    ..Default::default()
                }),
                volume_mode: spec.volume_mode.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match pvs.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(NodeError::api("create PV", e)),
        }
    }
    // Released volumes of this node: remove the data, then the PV.
    let released = pvs
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await
        .map_err(|e| NodeError::api("list PVs", e))?;
    for pv in released.items {
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        if phase != Some("Released") {
            continue;
        }
        if let Some(path) = host_path(&pv)
            && path.starts_with(root)
        {
            let _ = std::fs::remove_dir_all(&path);
        }
        match pvs.delete(&pv.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(NodeError::api("delete PV", e)),
        }
    }
    Ok(())
}

pub fn host_path(pv: &PersistentVolume) -> Option<PathBuf> {
    pv.spec
        .as_ref()
        .and_then(|s| s.host_path.as_ref())
        .map(|h| PathBuf::from(&h.path))
}
