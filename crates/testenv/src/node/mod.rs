//! The local node: an in-process agent that plays kubelet for one Node, so that pods run
//! on this machine without containers. Test and demo infrastructure only.
//!
//! - registers a Node (Ready, heartbeats through its Lease) and a default StorageClass;
//! - provisions a local directory per PVC ([`provisioner`]);
//! - binds pending pods that use the pgop image to itself, once their PVCs are bound;
//! - runs each such pod as local processes with its own loopback address as pod IP
//!   ([`pods`], [`ip`]), reporting phase, container states, restarts and readiness from
//!   the real readiness probe;
//! - writes a hosts file resolving `<service>.<namespace>.svc` to ready endpoints
//!   ([`hosts`]): there is no DNS here.
//!
//! Pods of other images are left alone (they stay Pending).

mod container;
pub mod hosts;
mod ip;
mod pods;
mod probe;
mod provisioner;

use crate::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use hosts::{HOSTS_FILE_ENV, resolve as resolve_host};
pub use provisioner::{SIZED_STORAGE_CLASS, STORAGE_CLASS, host_path as provisioner_host_path};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("failed to {action}")]
    Api {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("failed to use {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unsupported by the local node: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Internal(String),
}

impl NodeError {
    fn api(action: &'static str, source: kube::Error) -> Self {
        Self::Api { action, source }
    }
    fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How a local node runs.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The Node's name.
    pub name: String,
    /// Only pods and PVCs of this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// The image whose pods run here (`pgop:` matches every `pgop:<tag>`).
    pub image: String,
    /// The binary that stands in for the image entrypoint (`command[0]`).
    pub pgop_binary: PathBuf,
    /// Ports every pod listens on, checked free before an address is handed out.
    pub pod_ports: Vec<u16>,
}

/// State shared by the node's loops and pod workers.
pub(crate) struct Shared {
    client: Client,
    /// The API server's URL, for the kubeconfig pods get.
    server: String,
    /// The control plane's directory: the marker on every pod process.
    plane_dir: PathBuf,
    node: String,
    root: PathBuf,
    pgop_binary: PathBuf,
    hosts_file: PathBuf,
    ips: ip::IpPool,
}

/// A running local node; [`LocalNode::stop`] (or dropping it) stops every pod process.
pub struct LocalNode {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    workers: Workers,
}

impl LocalNode {
    /// Starts a node against `plane`, keeping its files under the plane's directory.
    pub async fn start(plane: &ControlPlane, options: NodeOptions) -> Result<Self, NodeError> {
        let client = plane
            .client()
            .map_err(|e| NodeError::Internal(e.to_string()))?;
        let root = plane.dir().join("node").join(&options.name);
        std::fs::create_dir_all(&root).map_err(|e| NodeError::io(&root, e))?;
        // Pod users (non-root) must reach their volumes below this directory.
        for dir in [plane.dir(), &plane.dir().join("node"), &root] {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
        }
        let pgop_binary = executable_copy(&options.pgop_binary, &root.join("bin"))?;
        let hosts_file = root.join("hosts");
        std::fs::write(&hosts_file, "").map_err(|e| NodeError::io(&hosts_file, e))?;
        register_node(&client, &options.name).await?;
        provisioner::ensure_storage_class(&client).await?;
        let shared = Arc::new(Shared {
            client,
            server: plane.server().to_string(),
            plane_dir: plane.dir().to_path_buf(),
            node: options.name.clone(),
            root,
            pgop_binary,
            hosts_file,
            ips: ip::IpPool::new(options.pod_ports.clone()),
        });
        let workers = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(heartbeat(shared.clone())));
        {
            let shared = shared.clone();
            let ns = options.namespace.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let pv_root = shared.root.join("volumes");
                    let _ = std::fs::create_dir_all(&pv_root);
                    if let Err(e) =
                        provisioner::sync(&shared.client, &shared.node, ns.as_deref(), &pv_root)
                            .await
                    {
                        tracing::debug!(error = %e, "provisioner pass failed");
                    }
                    if let Err(e) =
                        hosts::sync(&shared.client, ns.as_deref(), &shared.hosts_file).await
                    {
                        tracing::debug!(error = %e, "hosts pass failed");
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }));
        }
        {
            let shared = shared.clone();
            let workers = workers.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    if let Err(e) = sync_pods(&shared, &options, &workers).await {
                        tracing::debug!(error = %e, "pod pass failed");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }));
        }
        Ok(Self {
            shared,
            tasks,
            workers,
        })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.shared.node
    }

    /// The hosts file (service name -> ready endpoint addresses) the pods get.
    pub fn hosts_file(&self) -> &Path {
        &self.shared.hosts_file
    }

    /// The directory that holds one directory per pod ([`LocalNode::pod_dir`]).
    pub fn pods_dir(&self) -> PathBuf {
        container::pods_dir(&self.shared.root)
    }

    /// The local directory of a pod (its logs: `<container>.log`).
    pub fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        container::pod_dir(&self.shared.root, pod_uid)
    }

    /// Stops the node: every pod process is stopped (pod objects stay as they are).
    pub async fn stop(mut self) {
        self.shutdown().await;
    }

    async fn shutdown(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let workers: Vec<_> = match self.workers.lock() {
            Ok(mut w) => w.drain().map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for (tx, handle) in workers {
            drop(tx); // the worker stops its process when its channel closes
            let _ = handle.await;
        }
        provisioner::unmount_all(&self.shared.root.join("volumes"));
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        if let Ok(mut w) = self.workers.lock() {
            for (_, (_, handle)) in w.drain() {
                // Aborting drops the worker and with it the process (killed on drop).
                handle.abort();
            }
        }
        provisioner::unmount_all(&self.shared.root.join("volumes"));
    }
}

/// The pod binary where every pod user can run it: a build under /root (mode 0700) is
/// out of reach for the non-root users pods run as. A hard link when the file system
/// allows, a copy otherwise.
fn executable_copy(binary: &Path, dir: &Path) -> Result<PathBuf, NodeError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| NodeError::io(dir, e))?;
    // The file itself, not a symlink to it (a link to a relative symlink would dangle).
    let binary = &std::fs::canonicalize(binary).map_err(|e| NodeError::io(binary, e))?;
    let name = binary
        .file_name()
        .unwrap_or_else(|| std::ffi::OsStr::new("pgop"));
    let target = dir.join(name);
    let _ = std::fs::remove_file(&target);
    if std::fs::hard_link(binary, &target).is_err() {
        std::fs::copy(binary, &target).map_err(|e| NodeError::io(&target, e))?;
    }
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| NodeError::io(&target, e))?;
    Ok(target)
}

/// uid and gid of a local user (e.g. `postgres`, whom Debian's PostgreSQL packages create):
/// instance pods run as that user here, since PostgreSQL refuses to run as root.
pub fn local_user(name: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam with a valid C string; the result is read before any other call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: a non-null pointer returned by getpwnam.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

async fn register_node(client: &Client, name: &str) -> Result<(), NodeError> {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {}
    }))
    .map_err(|e| NodeError::Internal(e.to_string()))?;
    let api: Api<Node> = Api::all(client.clone());
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(NodeError::api("create the Node", e)),
    }
    node_status(client, name).await
}

async fn node_status(client: &Client, name: &str) -> Result<(), NodeError> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = serde_json::json!({"status": {
        "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"},
        "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "pgop local node",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": format!("v{}", crate::binaries::kubernetes_version()), "operatingSystem": "linux",
                     "architecture": std::env::consts::ARCH, "containerRuntimeVersion": "pgop-local://0",
                     "kernelVersion": "", "osImage": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""}
    }});
    Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| NodeError::api("update the Node status", e))?;
    Ok(())
}

/// Keeps the Node Ready: its Lease renewed and its status refreshed every 10 s, as kubelet.
async fn heartbeat(shared: Arc<Shared>) {
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), "kube-node-lease");
    loop {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": shared.node},
            "spec": {"holderIdentity": shared.node, "leaseDurationSeconds": 40, "renewTime": now}
        });
        let _ = leases
            .patch(
                &shared.node,
                &PatchParams::apply("pgop-local-node").force(),
                &Patch::Apply(&lease),
            )
            .await;
        let _ = node_status(&shared.client, &shared.node).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

type Workers = Arc<std::sync::Mutex<HashMap<String, (watch::Sender<Pod>, JoinHandle<()>)>>>;

/// One pass: bind pending pgop pods here, start workers for new pods, feed every worker
/// its pod's latest state, and stop workers whose pod is gone.
async fn sync_pods(
    shared: &Arc<Shared>,
    options: &NodeOptions,
    workers: &Workers,
) -> Result<(), NodeError> {
    let api: Api<Pod> = match &options.namespace {
        Some(ns) => Api::namespaced(shared.client.clone(), ns),
        None => Api::all(shared.client.clone()),
    };
    let pods = api
        .list(&ListParams::default())
        .await
        .map_err(|e| NodeError::api("list pods", e))?
        .items;
    let mut seen = Vec::new();
    for pod in pods {
        if !container::uses_image(&pod, &options.image) {
            continue;
        }
        let Some(uid) = pod.uid() else { continue };
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        match node_name {
            None => {
                if pod.metadata.deletion_timestamp.is_none()
                    && claims_bound(&shared.client, &pod).await
                {
                    bind(&shared.client, &pod, &shared.node).await?;
                }
            }
            Some(n) if n == shared.node => {
                seen.push(uid.clone());
                let mut w = workers
                    .lock()
                    .map_err(|_| NodeError::Internal("workers lock poisoned".into()))?;
                match w.get(&uid) {
                    Some((tx, _)) => {
                        let _ = tx.send(pod);
                    }
                    None => {
                        let Some(ip) = shared.ips.allocate() else {
                            return Err(NodeError::Internal("no free loopback address".into()));
                        };
                        let (tx, rx) = watch::channel(pod);
                        let worker = pods::Worker::new(shared.clone(), rx, ip);
                        let handle = tokio::spawn(worker.run());
                        w.insert(uid, (tx, handle));
                    }
                }
            }
            Some(_) => {}
        }
    }
    let mut w = workers
        .lock()
        .map_err(|_| NodeError::Internal("workers lock poisoned".into()))?;
    w.retain(|uid, (_, handle)| {
        if handle.is_finished() {
            return false;
        }
        if !seen.contains(uid) {
            // Gone without a graceful deletion we saw (force-deleted): stop it now.
            handle.abort();
            return false;
        }
        true
    });
    Ok(())
}

async fn claims_bound(client: &Client, pod: &Pod) -> bool {
    let ns = pod.namespace().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(claim) = &v.persistent_volume_claim {
            let bound = api
                .get_opt(&claim.claim_name)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .and_then(|s| s.phase)
                .is_some_and(|p| p == "Bound");
            if !bound {
                return false;
            }
        }
    }
    true
}

async fn bind(client: &Client, pod: &Pod, node: &str) -> Result<(), NodeError> {
    let ns = pod.namespace().unwrap_or_default();
    let binding = Binding {
        metadata: kube::api::ObjectMeta {
            name: Some(pod.name_any()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api
        .create_subresource::<Binding, serde_json::Value>(
            "binding",
            &pod.name_any(),
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(()),
        // Bound meanwhile (409) or gone (404): the next pass sees the truth.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(NodeError::api("bind a pod", e)),
    }
}
