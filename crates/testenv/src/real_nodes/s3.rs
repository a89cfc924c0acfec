//! An S3-compatible server in the nodes' network, for backups on real nodes: `s3s-fs`
//! (the same server as [`crate::s3`]) runs inside the switch's network namespace and
//! listens on the bridge's address [`crate::pki::NODE_FACING_API_ADDRESS`], so every Pod
//! reaches it through its node as it would reach a store on the cluster's network, and
//! nothing outside the nodes' network does. Its objects are plain files under the nodes'
//! directory, which the harness reads to check what reached the store.

use super::holder::in_node;
use super::{Error, io, proxy};
use crate::process::ManagedProcess;
use crate::s3::{BUCKET, INSTALL_COMMAND};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The port a Service published with [`NodesS3::publish`] exposes (MinIO's usual one).
pub const S3_SERVICE_PORT: u16 = 9000;

/// A running `s3s-fs` in the nodes' network, with bucket [`BUCKET`] and the keys
/// [`crate::s3::ACCESS_KEY`] / [`crate::s3::SECRET_KEY`]. Dropping it stops the server;
/// its objects stay until the nodes' directory goes. It lives in the switch's cgroup tree,
/// so it also dies with the nodes (drop, or the holder's cleanup when the harness dies).
pub struct NodesS3 {
    addr: SocketAddr,
    root: PathBuf,
    process: ManagedProcess,
}

impl std::fmt::Debug for NodesS3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodesS3")
            .field("addr", &self.addr)
            .field("root", &self.root)
            .finish()
    }
}

const LISTEN_TIMEOUT: Duration = Duration::from_secs(20);

/// Starts the server in the namespace of `switch` (its holder's pid), joined to its cgroup
/// tree with `tree_join`, keeping its objects under `dir/s3`.
pub(super) async fn start(
    switch: u32,
    tree_join: &str,
    owner: &str,
    dir: &Path,
) -> Result<NodesS3, Error> {
    let binary = crate::s3::binary().map_err(|_| Error::Missing {
        what: "the S3 server s3s-fs".into(),
        path: crate::binaries::cache_dir().join("s3s-fs/bin/s3s-fs"),
        install: INSTALL_COMMAND,
    })?;
    let host: Ipv4Addr = crate::pki::NODE_FACING_API_ADDRESS
        .parse()
        .map_err(|_| Error::NotContained("the node-facing address is invalid".into()))?;
    // A free port on the bridge's address. The namespace is this run's own: nothing else
    // binds there between this probe and the server's start.
    let port = proxy::in_netns(switch, move || {
        std::net::TcpListener::bind((host, 0))?
            .local_addr()
            .map(|a| a.port())
    })
    .map_err(io("finding a free port in the switch's namespace"))?;
    let addr = SocketAddr::from((host, port));
    let root = dir.join("s3");
    std::fs::create_dir_all(root.join(BUCKET))
        .map_err(io(format!("creating {}", root.display())))?;
    let args = crate::s3::server_args(&host.to_string(), port, &root);
    let cmd = in_node(
        switch,
        tree_join,
        owner,
        &binary.display().to_string(),
        |c| {
            c.args(&args);
        },
    );
    let mut process = ManagedProcess::spawn("s3s-fs", cmd, &dir.join("s3s-fs.log"))
        .map_err(io("starting s3s-fs"))?;
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    loop {
        let connected = proxy::in_netns(switch, move || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        });
        if connected.is_ok() {
            break;
        }
        if let Some(status) = process.try_exited() {
            return Err(Error::Exited {
                name: "s3s-fs".into(),
                status: status.to_string(),
                log: process.log_path().display().to_string(),
                tail: process.log_tail(20),
            });
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("s3s-fs did not listen on {addr}"),
                timeout: LISTEN_TIMEOUT,
                detail: format!(":\n{}", process.log_tail(20)),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(NodesS3 {
        addr,
        root,
        process,
    })
}

impl NodesS3 {
    /// Where it listens: the bridge's address in the nodes' network.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://10.250.0.1:<port>`, reachable from every Pod and node.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The file in which the server keeps object `key` of [`BUCKET`].
    pub fn object_file(&self, key: &str) -> PathBuf {
        self.root.join(BUCKET).join(key)
    }

    /// The keys of [`BUCKET`] that start with the directory `prefix` (`a/b`), sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let bucket = self.root.join(BUCKET);
        let mut keys = Vec::new();
        let mut dirs = vec![bucket.join(prefix)];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Ok(key) = path.strip_prefix(&bucket) {
                    keys.push(key.to_string_lossy().into_owned());
                }
            }
        }
        keys.sort();
        keys
    }

    /// The server's log.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// Publishes the server as Service `name` in `namespace`, as a user publishes a store
    /// outside the cluster: a ClusterIP Service without selector on port
    /// [`S3_SERVICE_PORT`] and an EndpointSlice naming the server's address, so that Pods
    /// reach it by DNS name through kube-proxy. Returns the endpoint,
    /// `http://<name>.<namespace>.svc.cluster.local:9000`. Idempotent.
    pub async fn publish(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<String, Error> {
        let params = PatchParams::apply("pgop-testenv").force();
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "s3", "port": S3_SERVICE_PORT,
                                "targetPort": self.addr.port(), "protocol": "TCP"}]}
        }))
        .map_err(|e| Error::Io {
            what: "the S3 Service".into(),
            source: std::io::Error::other(e),
        })?;
        Api::<Service>::namespaced(client.clone(), namespace)
            .patch(name, &params, &Patch::Apply(&service))
            .await?;
        let slice: EndpointSlice = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-switch"), "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by": "pgop-testenv"}},
            "addressType": "IPv4",
            "ports": [{"name": "s3", "port": self.addr.port(), "protocol": "TCP"}],
            "endpoints": [{"addresses": [self.addr.ip().to_string()],
                           "conditions": {"ready": true}}]
        }))
        .map_err(|e| Error::Io {
            what: "the S3 EndpointSlice".into(),
            source: std::io::Error::other(e),
        })?;
        Api::<EndpointSlice>::namespaced(client.clone(), namespace)
            .patch(&format!("{name}-switch"), &params, &Patch::Apply(&slice))
            .await?;
        Ok(format!(
            "http://{name}.{namespace}.svc.cluster.local:{S3_SERVICE_PORT}"
        ))
    }
}
