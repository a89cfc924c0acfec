//! Storage for real nodes: a default StorageClass that binds on first use, and a
//! provisioner that gives each claim a `local` PersistentVolume in the directory of the
//! node the scheduler picked (with node affinity, as a local-path provisioner does). The
//! kubelet mounts it and applies the Pod's `fsGroup`, as it would on a real disk.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

/// The default StorageClass on real nodes.
pub const STORAGE_CLASS: &str = "pgop-testenv-local";
const PROVISIONER: &str = "pgop.testenv/real-node-local";
const NODE_LABEL: &str = "pgop.testenv/node";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

pub async fn ensure_storage_class(client: &Client) -> Result<(), kube::Error> {
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": true
    }))
    .map_err(kube::Error::SerdeError)?;
    Api::<StorageClass>::all(client.clone())
        .patch(
            STORAGE_CLASS,
            &PatchParams::apply("pgop-testenv").force(),
            &Patch::Apply(&sc),
        )
        .await?;
    Ok(())
}

/// One pass: a PV for every claim of ours that the scheduler placed; released volumes
/// removed with their data.
async fn sync(client: &Client, roots: &BTreeMap<String, PathBuf>) -> Result<(), kube::Error> {
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for pvc in pvcs.list(&ListParams::default()).await?.items {
        let spec = pvc.spec.clone().unwrap_or_default();
        let class = spec.storage_class_name.clone().unwrap_or_default();
        if spec.volume_name.is_some()
            || pvc.metadata.deletion_timestamp.is_some()
            || class != STORAGE_CLASS
        {
            continue;
        }
        let Some(node) = pvc.annotations().get(SELECTED_NODE).cloned() else {
            continue; // not scheduled yet
        };
        let (Some(root), Some(ns), Some(uid)) = (roots.get(&node), pvc.namespace(), pvc.uid())
        else {
            continue;
        };
        let name = format!("pvc-{uid}");
        if pvs.get_opt(&name).await?.is_some() {
            continue;
        }
        let dir = root.join(&name);
        if std::fs::create_dir_all(&dir).is_err() {
            continue;
        }
        let capacity = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage").cloned())
            .map(|q| q.0)
            .unwrap_or_else(|| "1Gi".into());
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {NODE_LABEL: node},
                "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}
            },
            "spec": {
                "capacity": {"storage": capacity},
                "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
                "storageClassName": STORAGE_CLASS,
                "persistentVolumeReclaimPolicy": "Delete",
                "volumeMode": "Filesystem",
                "local": {"path": dir.display().to_string()},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                ]}]}},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "namespace": ns, "name": pvc.name_any(), "uid": uid}
            }
        }))
        .map_err(kube::Error::SerdeError)?;
        match pvs.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    for pv in pvs
        .list(&ListParams::default().labels(NODE_LABEL))
        .await?
        .items
    {
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released") {
            continue;
        }
        let path = pv
            .spec
            .as_ref()
            .and_then(|s| s.local.as_ref())
            .map(|l| PathBuf::from(&l.path));
        if let Some(path) = path
            && roots.values().any(|r| path.starts_with(r))
        {
            let _ = std::fs::remove_dir_all(&path);
        }
        match pvs.delete(&pv.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The provisioner, on a thread and runtime of its own; stops when dropped.
#[derive(Debug)]
pub struct Provisioner {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Provisioner {
    pub fn start(config: kube::Config, roots: BTreeMap<String, PathBuf>) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("testenv-provisioner".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(client) = Client::try_from(config) else {
                        return;
                    };
                    loop {
                        if let Err(e) = sync(&client, &roots).await {
                            tracing::debug!(error = %e, "provisioning pass failed");
                        }
                        tokio::select! {
                            _ = &mut stopped => return,
                            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        }
                    }
                });
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
