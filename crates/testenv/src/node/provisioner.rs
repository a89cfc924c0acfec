//! A minimal volume provisioner: every pending PVC of the local StorageClass (or of no
//! class) gets a PersistentVolume backed by a local directory, which kube-controller-manager's
//! binder then binds. A released volume's directory is removed with the PV.
//!
//! A PVC of the second class, [`SIZED_STORAGE_CLASS`], gets a directory with a tmpfs of
//! the claim's size mounted on it: a volume that really fills up (`ENOSPC`) and reports its
//! size and use through `statvfs` as a disk does. The class allows expansion, and this
//! provisioner is its resizer: a claim asking for more gets its tmpfs remounted larger
//! while it is in use (as an online filesystem expansion does), then the PV's and the
//! claim's capacity. The data lives in memory: it is gone when the node stops (the mounts
//! are undone then), so it suits tests of volume size, not of a node restart.

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
/// The StorageClass of volumes of the claim's size that can grow (see the module doc).
pub const SIZED_STORAGE_CLASS: &str = "pgop-local-sized";
const PROVISIONER: &str = "pgop.testenv/local";
const SIZED_PROVISIONER: &str = "pgop.testenv/local-sized";
const NODE_LABEL: &str = "pgop.testenv/node";

pub async fn ensure_storage_class(client: &Client) -> Result<(), NodeError> {
    for (name, provisioner, default, expand) in [
        (STORAGE_CLASS, PROVISIONER, "true", false),
        (SIZED_STORAGE_CLASS, SIZED_PROVISIONER, "false", true),
    ] {
        let sc: StorageClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": name,
                "annotations": {"storageclass.kubernetes.io/is-default-class": default}
            },
            "provisioner": provisioner,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": expand
        }))
        .map_err(|e| NodeError::Internal(e.to_string()))?;
        Api::<StorageClass>::all(client.clone())
            .patch(
                name,
                &PatchParams::apply("pgop-local-node").force(),
                &Patch::Apply(&sc),
            )
            .await
            .map_err(|e| NodeError::api("apply the local StorageClass", e))?;
    }
    Ok(())
}

/// The kind of volume a claim of this node gets, if it is one of this node's classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Directory,
    Sized,
}

fn ours(pvc: &PersistentVolumeClaim) -> Option<Kind> {
    let class = pvc
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    match class {
        None | Some("") | Some(STORAGE_CLASS) => Some(Kind::Directory),
        Some(SIZED_STORAGE_CLASS) => Some(Kind::Sized),
        Some(_) => None,
    }
}

/// Bytes of a quantity as the API server writes storage sizes (`256Mi`, `1536Mi`, `2Gi`,
/// `500M`, `1.5Gi`, `268435456`); `None` for anything else.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: u64 = whole.parse().ok()?;
    let mut bytes = whole.checked_mul(factor)?;
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len()).ok()?;
        let scale = 10u64.checked_pow(digits)?;
        let part: u64 = fraction.parse().ok()?;
        bytes = bytes.checked_add(part.checked_mul(factor)?.div_ceil(scale))?;
    }
    Some(bytes)
}

fn requested_bytes(pvc: &PersistentVolumeClaim) -> Option<u64> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity_bytes(&q.0))
}

/// Mounts (or, with `remount`, resizes) a tmpfs of `bytes` on `dir`.
fn mount_tmpfs(dir: &Path, bytes: u64, remount: bool) -> Result<(), NodeError> {
    let options = if remount {
        format!("remount,size={bytes}")
    } else {
        format!("size={bytes},mode=0755")
    };
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
        .arg(dir)
        .output()
        .map_err(|e| NodeError::io(Path::new("mount"), e))?;
    if !out.status.success() {
        return Err(NodeError::Internal(format!(
            "mount -t tmpfs -o {options} {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Undoes a tmpfs mount on `dir` (lazily: a process may still hold a file there).
fn unmount(dir: &Path) {
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(dir)
        .output();
}

/// Whether something is mounted on `dir` (`/proc/self/mounts`).
fn is_mounted(dir: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let dir = dir.display().to_string();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(dir.as_str()))
}

/// Undoes every tmpfs this node mounted below `root` (at the node's stop).
pub fn unmount_all(root: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let root = root.display().to_string();
    for point in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        if point.starts_with(&format!("{root}/")) {
            unmount(Path::new(point));
        }
    }
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
        let Some(kind) = ours(&pvc) else {
            continue;
        };
        if bound && kind == Kind::Sized {
            resize(client, &pvs, &pvc).await?;
        }
        if bound || pvc.metadata.deletion_timestamp.is_some() {
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
        if kind == Kind::Sized && !is_mounted(&dir) {
            let bytes = requested_bytes(&pvc).ok_or_else(|| {
                NodeError::Unsupported(format!("PVC {} asks for no storage size", pvc.name_any()))
            })?;
            mount_tmpfs(&dir, bytes, false)?;
        }
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
            if is_mounted(&path) {
                unmount(&path);
            }
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

/// The resizer of [`SIZED_STORAGE_CLASS`]: a bound claim asking for more than its volume
/// has gets its tmpfs remounted at the new size, then the PV's capacity and the claim's
/// (`status.capacity`, as an online expansion reports it).
async fn resize(
    client: &Client,
    pvs: &Api<PersistentVolume>,
    pvc: &PersistentVolumeClaim,
) -> Result<(), NodeError> {
    let (Some(ns), Some(pv_name), Some(wanted)) = (
        pvc.namespace(),
        pvc.spec.as_ref().and_then(|s| s.volume_name.clone()),
        requested_bytes(pvc),
    ) else {
        return Ok(());
    };
    let capacity = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| quantity_bytes(&q.0))
    };
    let claim_has = capacity(
        pvc.status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    );
    if claim_has.is_some_and(|c| c >= wanted) {
        return Ok(());
    }
    let Some(pv) = pvs
        .get_opt(&pv_name)
        .await
        .map_err(|e| NodeError::api("get PV", e))?
    else {
        return Ok(());
    };
    let request = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage").cloned());
    let pv_has = capacity(
        pv.spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage")),
    );
    if pv_has.is_none_or(|c| c < wanted) {
        if let Some(dir) = host_path(&pv)
            && is_mounted(&dir)
        {
            mount_tmpfs(&dir, wanted, true)?;
        }
        pvs.patch(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"capacity": {"storage": request}}})),
        )
        .await
        .map_err(|e| NodeError::api("grow PV", e))?;
    }
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .patch_status(
            &pvc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"capacity": {"storage": request}}})),
        )
        .await
        .map_err(|e| NodeError::api("report the grown PVC", e))?;
    tracing::info!(claim = %pvc.name_any(), bytes = wanted, "grew a sized volume");
    Ok(())
}

pub fn host_path(pv: &PersistentVolume) -> Option<PathBuf> {
    pv.spec
        .as_ref()
        .and_then(|s| s.host_path.as_ref())
        .map(|h| PathBuf::from(&h.path))
}

#[cfg(test)]
mod tests {
    use super::quantity_bytes;

    #[test]
    fn quantities_as_the_api_server_writes_them_are_bytes() {
        assert_eq!(quantity_bytes("256Mi"), Some(256 << 20));
        assert_eq!(quantity_bytes("2Gi"), Some(2 << 30));
        assert_eq!(quantity_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("268435456"), Some(268_435_456));
        assert_eq!(quantity_bytes("1e3"), None);
        assert_eq!(quantity_bytes("1Xi"), None);
        assert_eq!(quantity_bytes(""), None);
    }
}
