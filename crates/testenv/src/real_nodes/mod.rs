//! Real Kubernetes nodes on this machine: each node is a containerd, a kubelet and a
//! kube-proxy in network, mount and UTS namespaces of its own, running real containers
//! with runc, joined to a control plane started [`crate::Options::with_real_nodes`].
//!
//! ```text
//!  harness (host namespace)              switch namespace              node namespaces
//!  kube-apiserver 127.0.0.1:P  <-proxy-  10.250.0.1:P on br0  --veth--  eth0 10.250.0.11  cni0 10.244.0.1/24
//!                                        routes 10.244.i/24              eth0 10.250.0.12  cni0 10.244.1.1/24
//! ```
//!
//! - **Containment.** No namespace of the nodes has a link to the machine's network: the
//!   switch and the nodes have no default route, and the Service CIDR is an `unreachable`
//!   route in every node, so a packet that kube-proxy did not rewrite dies on its node.
//!   The one way out is the API proxy ([`proxy`]), which only connects to the API
//!   server's loopback port; the one way in, the API server's tunnel
//!   ([`proxy::ClusterEgress`]), reaches Pod and node addresses only. [`RealNodes::start`]
//!   checks this before any Pod starts.
//! - **Cleanup.** The namespaces are anonymous and held by the nodes' processes, so they
//!   vanish with them, and with them every veth, iptables rule, mount and Pod network.
//!   Every process of a node (its daemons, the shims, the containers) lives in the node's
//!   cgroup tree ([`cgroup`]), which is frozen, killed and removed on drop, at exit, and by
//!   the sweep of a later run when this one was SIGKILLed.
//!
//! Why this file stays whole: it is one idea, `RealNodes`: `start` (the switch, then each
//! node's namespaces, links and daemons, in the order they are made: about 280 lines), what
//! a test does to running nodes (freeze, partition, power off, look inside) and their stop;
//! the parts of a node that stand alone are its submodules.

pub mod cgroup;
mod config;
mod dns;
mod holder;
mod proxy;
mod s3;
mod template;
mod volumes;

pub(crate) use proxy::ClusterEgress;
pub use s3::{NodesS3, S3_SERVICE_PORT};
pub use volumes::STORAGE_CLASS;

pub use config::{CLUSTER_CIDR, CLUSTER_DNS, SERVICE_CIDR, node_ip, normalized_image, pod_cidr};
pub use holder::{KEPT_SYSCTLS, kept_sysctl_file};

use crate::binaries::{self, Binary};
use crate::control_plane::ControlPlane;
use crate::process::ManagedProcess;
use crate::workdir::WorkDir;
use holder::{in_node, ip_in, nft_in, require_programs, run, spawn_holder};
use k8s_openapi::api::core::v1::Node;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "real nodes need root (namespaces, cgroups, mounts); run the tests as root \
         (`sudo hack/test.sh`)"
    )]
    NotRoot,
    #[error("the control plane was not started with Options::with_real_nodes()")]
    PlaneNotReady,
    #[error(
        "{what} not found ({path}); install it with `{install}`",
        path = path.display()
    )]
    Missing {
        what: String,
        path: PathBuf,
        install: &'static str,
    },
    #[error(transparent)]
    MissingBinary(#[from] binaries::MissingBinary),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },
    #[error("{name} exited ({status}); last lines of {log}:\n{tail}")]
    Exited {
        name: String,
        status: String,
        log: String,
        tail: String,
    },
    #[error("{what} within {timeout:?}{detail}")]
    Timeout {
        what: String,
        timeout: Duration,
        detail: String,
    },
    #[error("containment check failed: {0}")]
    NotContained(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// The Debian packages real nodes need, named in errors.
pub const NODE_PACKAGES: &str = "apt-get install containerd runc containernetworking-plugins iptables iproute2 util-linux nftables";

/// How [`RealNodes::partition`] cuts a node off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// From the other nodes (and their Pods) only: the node and its Pods still reach the
    /// API server, so its kubelet stays Ready and its instance manager still sees the
    /// cluster's status and its Lease.
    FromNodes,
    /// From everything, the API server too: as a cable pulled out.
    Isolated,
}

/// What [`RealNodes::start`] needs besides the control plane.
#[derive(Clone, Debug)]
pub struct NodesOptions {
    /// How many nodes (named `node-0`, `node-1`, ...).
    pub count: usize,
    /// Image archives (OCI or Docker archive) in every node's containerd: unpacked once
    /// into a template root that each node starts on (`template`).
    pub images: Vec<PathBuf>,
    /// The image containerd runs as every Pod's sandbox (must be among `images`).
    pub sandbox_image: String,
    /// Where kubelet, kube-proxy and crictl are; default [`binaries::bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// CoreDNS's image (among `images`): when set, CoreDNS runs as the cluster's DNS
    /// and [`RealNodes::start`] waits until it answers.
    pub dns_image: Option<String>,
    /// Make the last node an infrastructure node: labelled [`INFRA_LABEL`]`=true` and
    /// tainted [`INFRA_LABEL`]`=true:NoSchedule`, so that only Pods that tolerate it run
    /// there (CoreDNS does, and prefers it). Fault tests keep the operator, DNS and their
    /// clients there, away from the nodes they break.
    pub infra_node: bool,
}

/// The label and taint key of the infrastructure node ([`NodesOptions::infra_node`]).
pub const INFRA_LABEL: &str = "pgop.testenv/infra";

/// One node's processes and cgroup tree.
struct RealNode {
    name: String,
    dir: PathBuf,
    /// kube-proxy, kubelet, containerd, then the namespace holder: stopped newest first.
    processes: Vec<ManagedProcess>,
    tree: Option<cgroup::Tree>,
}

impl RealNode {
    fn holder_pid(&self) -> u32 {
        self.processes.first().map(ManagedProcess::pid).unwrap_or(0)
    }

    fn stop(&mut self) {
        // A frozen node's processes cannot die until thawed.
        if let Some(tree) = &self.tree {
            let _ = cgroup::set_frozen(tree.name(), false);
        }
        // The daemons first, so that nothing restarts a container while the tree dies.
        while self.processes.len() > 1 {
            if let Some(mut p) = self.processes.pop() {
                p.signal(libc::SIGKILL);
                p.wait_or_kill(Duration::from_secs(2));
            }
        }
        // Shims, containers and the holder: with the holder the namespaces go.
        drop(self.tree.take());
        for mut p in self.processes.drain(..) {
            p.wait_or_kill(Duration::from_secs(2));
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Running real nodes. Dropping stops them and leaves nothing behind.
pub struct RealNodes {
    // Drop order: the provisioner, the nodes, the proxy, the switch, the directory.
    provisioner: Option<volumes::Provisioner>,
    nodes: Vec<RealNode>,
    proxy: Option<proxy::ApiProxy>,
    switch: Option<ManagedProcess>,
    switch_tree: Option<cgroup::Tree>,
    crictl: PathBuf,
    workdir: WorkDir,
}

impl std::fmt::Debug for RealNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNodes")
            .field("nodes", &self.names())
            .field("dir", &self.workdir.path())
            .finish()
    }
}

const READY_TIMEOUT: Duration = Duration::from_secs(120);

impl RealNodes {
    /// Starts `options.count` nodes against `plane` and waits until every one is Ready.
    pub async fn start(plane: &ControlPlane, options: NodesOptions) -> Result<Self, Error> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::NotRoot);
        }
        if !plane.takes_real_nodes() {
            return Err(Error::PlaneNotReady);
        }
        require_programs()?;
        let bin_dir = options.bin_dir.clone().unwrap_or_else(binaries::bin_dir);
        let kubelet = binaries::locate_in(&bin_dir, Binary::Kubelet)?;
        let kube_proxy = binaries::locate_in(&bin_dir, Binary::KubeProxy)?;
        let crictl = binaries::locate_in(&bin_dir, Binary::Crictl)?;
        for image in &options.images {
            if !image.is_file() {
                return Err(Error::Missing {
                    what: "an image archive".into(),
                    path: image.clone(),
                    install: "hack/build-images.sh",
                });
            }
        }
        cgroup::sweep_dead();

        let workdir = WorkDir::create().map_err(io("creating the nodes' directory"))?;
        let run_id = workdir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let mut nodes = RealNodes {
            provisioner: None,
            nodes: Vec::new(),
            proxy: None,
            switch: None,
            switch_tree: None,
            crictl,
            workdir,
        };
        let owner = nodes.workdir.path().display().to_string();

        // The switch: a bridge for the nodes, and the API proxy's address.
        let switch_dir = nodes.workdir.path().join("switch");
        std::fs::create_dir_all(&switch_dir).map_err(io("creating the switch's directory"))?;
        let tree = cgroup::Tree::create(&format!("{}{run_id}-switch", cgroup::PREFIX))
            .map_err(io("creating the switch's cgroup"))?;
        let switch = spawn_holder(&tree, "switch", &switch_dir, false, &owner).await?;
        let switch_pid = switch.pid();
        nodes.switch = Some(switch);
        nodes.switch_tree = Some(tree);
        ip_in(switch_pid, "link add br0 type bridge")?;
        ip_in(
            switch_pid,
            &format!(
                "addr add {}/{} dev br0",
                crate::pki::NODE_FACING_API_ADDRESS,
                config::NODE_NETWORK_PREFIX
            ),
        )?;
        ip_in(switch_pid, "link set br0 up")?;
        let api: Ipv4Addr = crate::pki::NODE_FACING_API_ADDRESS
            .parse()
            .map_err(|_| Error::NotContained("the node-facing API address is invalid".into()))?;
        let listener = proxy::listen_in(switch_pid, SocketAddr::from((api, plane.api_port())))
            .map_err(io("binding the API proxy in the switch's namespace"))?;
        nodes.proxy =
            Some(proxy::ApiProxy::start(listener, plane.api_port()).map_err(io("API proxy"))?);
        plane.route_cluster_egress(switch_pid);
        let server = format!("https://{api}:{}", plane.api_port());

        for index in 0..options.count {
            let name = format!("node-{index}");
            let dir = nodes.workdir.path().join(&name);
            std::fs::create_dir_all(dir.join("cni"))
                .map_err(io(format!("creating {}", dir.display())))?;
            let tree = cgroup::Tree::create(&format!("{}{run_id}-{name}", cgroup::PREFIX))
                .map_err(io(format!("creating {name}'s cgroup")))?;
            let holder = spawn_holder(&tree, &name, &dir, true, &owner).await?;
            let pid = holder.pid();
            nodes.nodes.push(RealNode {
                name: name.clone(),
                dir: dir.clone(),
                processes: vec![holder],
                tree: Some(tree),
            });
            ip_in(
                switch_pid,
                &format!("link add n{index} type veth peer name eth0 netns {pid}"),
            )?;
            ip_in(switch_pid, &format!("link set n{index} master br0 up"))?;
            ip_in(
                switch_pid,
                &format!(
                    "route add {} via {}",
                    config::pod_cidr(index),
                    config::node_ip(index)
                ),
            )?;
            ip_in(
                pid,
                &format!(
                    "addr add {}/{} dev eth0",
                    config::node_ip(index),
                    config::NODE_NETWORK_PREFIX
                ),
            )?;
            ip_in(pid, "link set eth0 up")?;
            ip_in(
                pid,
                &format!("route add unreachable {}", config::SERVICE_CIDR),
            )?;
        }
        for index in 0..options.count {
            let pid = nodes.nodes[index].holder_pid();
            for other in (0..options.count).filter(|o| *o != index) {
                ip_in(
                    pid,
                    &format!(
                        "route add {} via {}",
                        config::pod_cidr(other),
                        config::node_ip(other)
                    ),
                )?;
            }
        }
        nodes.check_containment()?;

        // Node daemons, each containerd starting on a copy of the images, unpacked once
        // ([`template`]).
        let images_root = template::for_images(&options.images)?;
        let pki = plane.pki().clone();
        for index in 0..options.count {
            let node = &mut nodes.nodes[index];
            let dir = node.dir.clone();
            let name = node.name.clone();
            let tree_join = node
                .tree
                .as_ref()
                .map(cgroup::Tree::join_script)
                .unwrap_or_default();
            let holder = node.holder_pid();
            let write = |file: &str, text: String| {
                std::fs::write(dir.join(file), text).map_err(io(format!("writing {file}")))
            };
            write(
                "containerd.toml",
                config::containerd(&dir, &options.sandbox_image),
            )?;
            write("cni/10-pgop-testenv.conflist", config::cni(&dir, index))?;
            write("resolv.conf", "options ndots:1\n".to_string())?;
            let (cert, key) = plane
                .authority()
                .issue_client(
                    &dir,
                    "kubelet",
                    &format!("system:node:{name}"),
                    &["system:nodes"],
                )
                .map_err(|e| Error::Io {
                    what: format!("issuing {name}'s kubelet certificate: {e}"),
                    source: std::io::Error::other(e.to_string()),
                })?;
            write(
                "kubelet.kubeconfig",
                crate::kubeconfig::render_with(&server, &pki.ca_cert, &cert, &key),
            )?;
            let (cert, key) = plane
                .authority()
                .issue_client(&dir, "kube-proxy", "system:kube-proxy", &[])
                .map_err(|e| Error::Io {
                    what: format!("issuing {name}'s kube-proxy certificate: {e}"),
                    source: std::io::Error::other(e.to_string()),
                })?;
            write(
                "kube-proxy.kubeconfig",
                crate::kubeconfig::render_with(&server, &pki.ca_cert, &cert, &key),
            )?;
            let cgroup_root = node
                .tree
                .as_ref()
                .map(|t| t.name().to_string())
                .unwrap_or_default();
            let infra = options.infra_node && index + 1 == options.count;
            write(
                "kubelet.yaml",
                config::kubelet(&dir, &pki.ca_cert, &cgroup_root, infra),
            )?;
            write(
                "kube-proxy.yaml",
                config::kube_proxy(&dir, &name, config::node_ip(index)),
            )?;

            let containerd_dir = dir.join("containerd");
            std::fs::create_dir_all(&containerd_dir)
                .map_err(io(format!("creating {}", containerd_dir.display())))?;
            template::copy(&images_root, &containerd_dir.join("root"))?;
            let containerd = in_node(holder, &tree_join, &owner, "containerd", |c| {
                c.arg(format!(
                    "--config={}",
                    dir.join("containerd.toml").display()
                ));
            });
            node.processes.push(
                ManagedProcess::spawn("containerd", containerd, &dir.join("containerd.log"))
                    .map_err(io("starting containerd"))?,
            );
        }
        for index in 0..options.count {
            nodes.wait_containerd(index).await?;
        }
        for index in 0..options.count {
            let node = &mut nodes.nodes[index];
            let dir = node.dir.clone();
            let holder = node.holder_pid();
            let tree_join = node
                .tree
                .as_ref()
                .map(cgroup::Tree::join_script)
                .unwrap_or_default();
            let infra = options.infra_node && index + 1 == options.count;
            let kubelet_cmd = in_node(
                holder,
                &tree_join,
                &owner,
                &kubelet.display().to_string(),
                |c| {
                    c.arg(format!("--config={}", dir.join("kubelet.yaml").display()))
                        .arg(format!(
                            "--kubeconfig={}",
                            dir.join("kubelet.kubeconfig").display()
                        ))
                        .arg(format!("--root-dir={}", dir.join("kubelet").display()))
                        .arg(format!("--cert-dir={}", dir.join("kubelet-pki").display()))
                        .arg(format!("--hostname-override={}", node.name))
                        .arg(format!("--node-ip={}", config::node_ip(index)))
                        .args(infra.then(|| format!("--node-labels={INFRA_LABEL}=true")))
                        .arg("--v=1");
                },
            );
            node.processes.push(
                ManagedProcess::spawn("kubelet", kubelet_cmd, &dir.join("kubelet.log"))
                    .map_err(io("starting the kubelet"))?,
            );
            let proxy_cmd = in_node(
                holder,
                &tree_join,
                &owner,
                &kube_proxy.display().to_string(),
                |c| {
                    c.arg(format!(
                        "--config={}",
                        dir.join("kube-proxy.yaml").display()
                    ));
                },
            );
            node.processes.push(
                ManagedProcess::spawn("kube-proxy", proxy_cmd, &dir.join("kube-proxy.log"))
                    .map_err(io("starting kube-proxy"))?,
            );
        }
        nodes.wait_ready(plane).await?;
        let client = plane.client().map_err(|e| Error::Io {
            what: "a client for the control plane".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        volumes::ensure_storage_class(&client).await?;
        let roots = nodes
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.dir.join("volumes")))
            .collect();
        nodes.provisioner = Some(
            volumes::Provisioner::start(plane.config().clone(), roots)
                .map_err(io("starting the volume provisioner"))?,
        );
        if let Some(image) = &options.dns_image {
            dns::install(&client, image).await?;
            nodes.wait_dns(&client).await?;
        }
        Ok(nodes)
    }

    /// Starts an S3-compatible server (`s3s-fs`, bucket [`crate::s3::BUCKET`], keys
    /// [`crate::s3::ACCESS_KEY`] / [`crate::s3::SECRET_KEY`]) inside the nodes' network,
    /// listening on the switch's bridge address (`http://10.250.0.1:<port>`), where every
    /// Pod reaches it; [`NodesS3::publish`] gives it a Service name. Its objects are kept
    /// under this run's directory (`switch/s3/<bucket>/<key>`). Drop it before the nodes.
    pub async fn start_s3(&self) -> Result<NodesS3, Error> {
        let (Some(switch), Some(tree)) = (&self.switch, &self.switch_tree) else {
            return Err(Error::NotContained("the switch is not running".into()));
        };
        let dir = self.workdir.path().join("switch");
        let owner = self.workdir.path().display().to_string();
        s3::start(switch.pid(), &tree.join_script(), &owner, &dir).await
    }

    /// The nodes' names, in index order.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The nodes' directory (configs, logs, kubelet and containerd state).
    pub fn dir(&self) -> &Path {
        self.workdir.path()
    }

    /// The cgroup trees of this run (for tests that check nothing is left behind).
    pub fn cgroup_prefix(&self) -> String {
        let run_id = self
            .workdir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        format!("{}{run_id}-", cgroup::PREFIX)
    }

    /// Every process of the harness's own (holders and daemons), for leak checks.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .nodes
            .iter()
            .flat_map(|n| n.processes.iter().map(ManagedProcess::pid))
            .collect();
        pids.extend(self.switch.as_ref().map(ManagedProcess::pid));
        pids
    }

    /// Every process of node `index` (its daemons, shims and containers): pid, command
    /// name and resident memory in KiB, read from `/proc`.
    pub fn processes(&self, index: usize) -> Vec<(i32, String, u64)> {
        let Some(tree) = self.nodes.get(index).and_then(|n| n.tree.as_ref()) else {
            return Vec::new();
        };
        cgroup::pids_in(tree.name())
            .into_iter()
            .filter_map(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let field = |key: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(key))
                        .map(|v| v.trim().to_string())
                };
                let comm = field("Name:")?;
                let rss = field("VmRSS:")
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
                    .unwrap_or(0);
                Some((pid, comm, rss))
            })
            .collect()
    }

    /// Freezes every process of node `index` — containerd, the kubelet, kube-proxy and
    /// every container — as when a machine hangs: nothing runs, nothing answers, nothing
    /// shuts down cleanly. [`Self::thaw`] lets them run on.
    pub fn freeze(&self, index: usize) -> Result<(), Error> {
        self.set_frozen(index, true)
    }

    /// Lets a frozen node run on from where it stopped.
    pub fn thaw(&self, index: usize) -> Result<(), Error> {
        self.set_frozen(index, false)
    }

    fn set_frozen(&self, index: usize, frozen: bool) -> Result<(), Error> {
        let tree = self
            .nodes
            .get(index)
            .and_then(|n| n.tree.as_ref())
            .ok_or_else(|| Error::NotContained(format!("no node {index}")))?;
        cgroup::set_frozen(tree.name(), frozen).map_err(io(format!(
            "{} node {index}",
            if frozen { "freezing" } else { "thawing" }
        )))
    }

    /// Cuts node `index` off the network without stopping anything on it: the switch
    /// drops every frame between its port and the other nodes' ports, and with
    /// [`Cut::Isolated`] also to and from the switch's own address (the API server's).
    /// Connections already open hang, as on a real partition. [`Self::heal`] undoes it.
    pub fn partition(&self, index: usize, cut: Cut) -> Result<(), Error> {
        let switch = self.switch_pid()?;
        self.heal(index)?;
        if index >= self.nodes.len() {
            return Err(Error::NotContained(format!("no node {index}")));
        }
        let port = format!("n{index}");
        let api = crate::pki::NODE_FACING_API_ADDRESS;
        // Between nodes, frames are bridged (the forward hook); to the API proxy they go
        // up to the switch's own stack (input) and back (output).
        let local = match cut {
            Cut::FromNodes => format!(
                "chain cut_input {{ type filter hook input priority 0; policy accept; \
                 iifname \"{port}\" ip daddr != {api} drop; }}"
            ),
            Cut::Isolated => format!(
                "chain cut_input {{ type filter hook input priority 0; policy accept; \
                 iifname \"{port}\" drop; }}
                 chain cut_output {{ type filter hook output priority 0; policy accept; \
                 oifname \"{port}\" drop; }}"
            ),
        };
        let script = format!(
            "table bridge pgop_cut_{port} {{
                 chain cut_forward {{ type filter hook forward priority 0; policy accept; \
                 iifname \"{port}\" drop; oifname \"{port}\" drop; }}
                 {local}
             }}\n"
        );
        nft_in(switch, &script)?;
        Ok(())
    }

    /// Undoes [`Self::partition`] of node `index` (nothing when it is not cut off).
    pub fn heal(&self, index: usize) -> Result<(), Error> {
        let switch = self.switch_pid()?;
        let table = format!("pgop_cut_n{index}");
        let tables = nft_in(switch, "list tables bridge\n")?;
        if tables
            .lines()
            .any(|l| l.trim() == format!("table bridge {table}"))
        {
            nft_in(switch, &format!("delete table bridge {table}\n"))?;
        }
        Ok(())
    }

    /// Powers node `index` off for good, as a machine that died: every process of it
    /// (daemons and containers) is killed at once, its namespaces vanish, and nothing
    /// shuts down cleanly. Its Node object stays in the API until someone deletes it; its
    /// directory (and so its local volumes' data) stays on disk until `self` is dropped.
    pub fn power_off(&mut self, index: usize) -> Result<(), Error> {
        let node = self
            .nodes
            .get_mut(index)
            .ok_or_else(|| Error::NotContained(format!("no node {index}")))?;
        node.stop();
        Ok(())
    }

    fn switch_pid(&self) -> Result<u32, Error> {
        self.switch
            .as_ref()
            .map(ManagedProcess::pid)
            .ok_or_else(|| Error::NotContained("the switch is not running".into()))
    }

    /// Where node `index`'s kubelet keeps a Pod's emptyDir volume `volume` (readable from
    /// the harness: the node's directory is on this machine's filesystem).
    pub fn empty_dir(&self, index: usize, pod_uid: &str, volume: &str) -> PathBuf {
        self.nodes[index]
            .dir
            .join("kubelet/pods")
            .join(pod_uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(volume)
    }

    /// The index of the node called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Runs `ip` with `args` in node `index`'s network namespace (for tests).
    pub fn ip(&self, index: usize, args: &str) -> Result<String, Error> {
        ip_in(self.nodes[index].holder_pid(), args)
    }

    /// Runs `args` (a program and its arguments) in node `index`'s network namespace, as
    /// the node itself would (for tests: `timeout 3 bash -c 'exec 3<>/dev/tcp/...'`).
    pub fn exec_in_network(&self, index: usize, args: &[&str]) -> Result<String, Error> {
        run(Command::new("nsenter")
            .arg(format!("--target={}", self.nodes[index].holder_pid()))
            .args(["--net", "--"])
            .args(args)
            .env("PATH", holder::PATH))
    }

    /// Runs `crictl` against node `index`'s containerd.
    pub fn crictl(&self, index: usize, args: &[&str]) -> Result<String, Error> {
        let sock = self.nodes[index].dir.join("containerd.sock");
        run(Command::new(&self.crictl)
            .arg(format!("--runtime-endpoint=unix://{}", sock.display()))
            .arg(format!("--image-endpoint=unix://{}", sock.display()))
            .args(args))
    }

    /// Checks, from inside every node's network namespace, that nothing routes off the
    /// machine: an address on the Internet and the machine's own uplink address are
    /// unreachable, and so is an address of the Service CIDR that kube-proxy does not
    /// rewrite.
    pub fn check_containment(&self) -> Result<(), Error> {
        let mut holders: Vec<(String, u32)> = self
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.holder_pid()))
            .collect();
        if let Some(s) = &self.switch {
            holders.push(("switch".into(), s.pid()));
        }
        for (name, pid) in holders {
            let routes = ip_in(pid, "-4 route show")?;
            if routes.lines().any(|l| l.starts_with("default")) {
                return Err(Error::NotContained(format!(
                    "{name} has a default route:\n{routes}"
                )));
            }
            for target in ["1.1.1.1", "8.8.8.8", "192.0.2.1"] {
                if ip_in(pid, &format!("route get {target}")).is_ok() {
                    return Err(Error::NotContained(format!(
                        "{name} has a route to {target}:\n{routes}"
                    )));
                }
            }
            if name != "switch" {
                match ip_in(pid, "route get 10.0.0.99") {
                    Err(Error::Command { output, .. })
                        if output.contains("unreachable") || output.contains("No route") => {}
                    other => {
                        return Err(Error::NotContained(format!(
                            "{name}: the Service CIDR is not unreachable: {other:?}"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    async fn wait_containerd(&mut self, index: usize) -> Result<(), Error> {
        let sock = self.nodes[index].dir.join("containerd.sock");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_processes()?;
            if sock.exists()
                && run(Command::new("ctr")
                    .arg(format!("--address={}", sock.display()))
                    .arg("version"))
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("containerd of {} was not up", self.nodes[index].name),
                    timeout: READY_TIMEOUT,
                    detail: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn check_processes(&mut self) -> Result<(), Error> {
        for node in &mut self.nodes {
            for p in &mut node.processes {
                if let Some(status) = p.try_exited() {
                    return Err(Error::Exited {
                        name: format!("{} of {}", p.name(), node.name),
                        status: status.to_string(),
                        log: p.log_path().display().to_string(),
                        tail: p.log_tail(30),
                    });
                }
            }
        }
        Ok(())
    }

    async fn wait_dns(&mut self, client: &kube::Client) -> Result<(), Error> {
        let api: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
            kube::Api::namespaced(client.clone(), "kube-system");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_processes()?;
            let ready = api
                .get_opt("coredns")
                .await?
                .and_then(|d| d.status)
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            if ready > 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "CoreDNS was not ready".into(),
                    timeout: READY_TIMEOUT,
                    detail: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_ready(&mut self, plane: &ControlPlane) -> Result<(), Error> {
        let api: kube::Api<Node> = kube::Api::all(plane.client().map_err(|e| Error::Io {
            what: "a client for the control plane".into(),
            source: std::io::Error::other(e.to_string()),
        })?);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_processes()?;
            let mut waiting = Vec::new();
            for name in self.names() {
                let ready = api.get_opt(&name).await.ok().flatten().is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                if !ready {
                    waiting.push(name);
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let tails = self
                    .nodes
                    .iter()
                    .filter(|n| waiting.contains(&n.name))
                    .flat_map(|n| n.processes.iter().skip(1))
                    .map(|p| format!("--- {}:\n{}", p.log_path().display(), p.log_tail(15)))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(Error::Timeout {
                    what: format!("nodes {waiting:?} were not Ready"),
                    timeout: READY_TIMEOUT,
                    detail: format!("\n{tails}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        drop(self.provisioner.take());
        // Nodes in parallel: each waits for its own processes.
        std::thread::scope(|s| {
            for node in &mut self.nodes {
                s.spawn(move || node.stop());
            }
        });
        self.nodes.clear();
        drop(self.proxy.take());
        if let Some(mut switch) = self.switch.take() {
            switch.signal(libc::SIGKILL);
            switch.wait_or_kill(Duration::from_secs(2));
        }
        drop(self.switch_tree.take());
    }
}
