//! Starting and stopping one control plane: etcd, kube-apiserver and, when asked,
//! kube-controller-manager and kube-scheduler, on free loopback ports.

use crate::binaries::{self, Binary, MissingBinary};
use crate::process::ManagedProcess;
use crate::workdir::WorkDir;
use crate::{kubeconfig, pki};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    MissingBinary(#[from] MissingBinary),
    #[error("failed to create the control plane's temporary directory")]
    CreateWorkDir(#[source] std::io::Error),
    #[error("failed to generate certificates")]
    Pki(#[from] pki::Error),
    #[error("failed to find a free loopback port")]
    FreePort(#[source] std::io::Error),
    #[error("failed to start {name}")]
    Spawn {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} exited during start-up ({status}); last lines of {log}:\n{tail}")]
    Exited {
        name: String,
        status: String,
        log: String,
        tail: String,
    },
    #[error("{name} was not ready after {timeout:?}; last lines of {log}:\n{tail}")]
    NotReady {
        name: String,
        timeout: Duration,
        log: String,
        tail: String,
    },
    #[error("failed to write the kubeconfig")]
    WriteKubeconfig(#[source] std::io::Error),
    #[error("failed to load the kubeconfig")]
    LoadKubeconfig(#[source] kube::config::KubeconfigError),
    #[error("failed to build a component's health URL")]
    ComponentUrl(#[source] http::Error),
    #[error("failed to build a Kubernetes client")]
    Client(#[source] kube::Error),
}

/// Which optional components to run besides etcd and kube-apiserver.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Run kube-controller-manager: garbage collection, namespace deletion, EndpointSlices,
    /// service-account tokens, PV/PVC binding and the other built-in controllers.
    pub controller_manager: bool,
    /// Run kube-scheduler, so that pods without `nodeName` get bound to a node.
    pub scheduler: bool,
    /// Where the binaries are; default [`binaries::bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// Prepare for real nodes ([`crate::nodes::RealNodes`]): the API server advertises
    /// the address the nodes reach it at, so that the `kubernetes` Service has endpoints
    /// that Pods can use.
    pub real_nodes: bool,
}

impl Options {
    pub fn with_controller_manager(mut self) -> Self {
        self.controller_manager = true;
        self
    }

    pub fn with_scheduler(mut self) -> Self {
        self.scheduler = true;
        self
    }

    pub fn with_real_nodes(mut self) -> Self {
        self.real_nodes = true;
        self
    }

    pub fn with_bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }
}

const START_TIMEOUT: Duration = Duration::from_secs(90);
const ATTEMPTS: usize = 3;

/// A running control plane. Dropping it stops every process and removes its directory.
pub struct ControlPlane {
    // Field order is drop order: processes first (newest first), then the directory.
    processes: Vec<ManagedProcess>,
    /// With real nodes: the API server's tunnel into their network.
    egress: Option<crate::real_nodes::ClusterEgress>,
    config: kube::Config,
    server: String,
    kubeconfig: PathBuf,
    pki: pki::Pki,
    authority: pki::Authority,
    api_port: u16,
    real_nodes: bool,
    workdir: WorkDir,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("dir", &self.workdir.path())
            .finish()
    }
}

fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    // Hold every listener until all ports are chosen so that they are distinct.
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::FreePort)?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::FreePort)
}

struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

impl ControlPlane {
    /// Starts a control plane and waits until it serves `/readyz` (and, with the
    /// controller manager, until it has created the `default` ServiceAccount).
    pub async fn start(options: Options) -> Result<Self, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                // A port chosen as free can be taken by someone else before the process
                // binds it; start again on new ports.
                Err(Error::Exited { tail, .. })
                    if attempt < ATTEMPTS && tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(options: &Options) -> Result<Self, Error> {
        let bin_dir = options.bin_dir.clone().unwrap_or_else(binaries::bin_dir);
        let locate = |b| binaries::locate_in(&bin_dir, b);
        let etcd = locate(Binary::Etcd)?;
        let apiserver = locate(Binary::KubeApiserver)?;
        let controller_manager = options
            .controller_manager
            .then(|| locate(Binary::KubeControllerManager))
            .transpose()?;
        let scheduler = options
            .scheduler
            .then(|| locate(Binary::KubeScheduler))
            .transpose()?;

        let workdir = WorkDir::create().map_err(Error::CreateWorkDir)?;
        let dir = workdir.path().to_path_buf();
        let pki_dir = dir.join("pki");
        std::fs::create_dir_all(&pki_dir).map_err(Error::CreateWorkDir)?;
        let (pki, authority) = pki::write(&pki_dir)?;
        let p = free_ports(5)?;
        let ports = Ports {
            etcd_client: p[0],
            etcd_peer: p[1],
            apiserver: p[2],
            controller_manager: p[3],
            scheduler: p[4],
        };
        let server = format!("https://127.0.0.1:{}", ports.apiserver);
        let kubeconfig = dir.join("kubeconfig");
        kubeconfig::write(&kubeconfig, &server, &pki).map_err(Error::WriteKubeconfig)?;
        let config = load_config(&kubeconfig).await?;

        // With real nodes, the API server reaches their network (webhooks served by Pods,
        // kubelets) through an HTTP CONNECT proxy, and a Service by its endpoints' Pod
        // addresses (no kube-proxy rules on this side).
        let egress = if options.real_nodes {
            let socket = dir.join("egress.sock");
            let egress =
                crate::real_nodes::ClusterEgress::start(&socket).map_err(Error::CreateWorkDir)?;
            let selector = format!(
                "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n\
                 egressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n\
                 \x20   transport:\n      uds:\n        udsName: {}\n",
                socket.display()
            );
            std::fs::write(dir.join("egress-selector.yaml"), selector)
                .map_err(Error::CreateWorkDir)?;
            Some(egress)
        } else {
            None
        };
        let mut plane = ControlPlane {
            processes: Vec::new(),
            egress,
            config,
            server,
            kubeconfig,
            pki: pki.clone(),
            authority,
            api_port: ports.apiserver,
            real_nodes: options.real_nodes,
            workdir,
        };

        let etcd_url = format!("http://127.0.0.1:{}", ports.etcd_client);
        let peer_url = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let mut cmd = Command::new(&etcd);
        cmd.arg("--name=testenv")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=testenv={peer_url}"))
            // Throwaway data: durability buys nothing and fsync dominates latency.
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        plane.spawn("etcd", cmd)?;

        let mut cmd = Command::new(&apiserver);
        cmd.arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!("--cert-dir={}", dir.join("apiserver").display()))
            .arg(format!("--secure-port={}", ports.apiserver))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            // The Node authorizer and NodeRestriction give real kubelets exactly a node's
            // rights, as on a production cluster.
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                pki.service_account_public_key.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.service_account_key.display()
            ))
            .arg(format!(
                "--service-cluster-ip-range={}",
                crate::real_nodes::SERVICE_CIDR
            ))
            .arg("--allow-privileged=true")
            .arg("--profiling=false");
        if options.real_nodes {
            // Real nodes reach the API server at this address (a proxy in their network
            // namespaces forwards it to the loopback port), so the `kubernetes` Service
            // gets it as its endpoint.
            cmd.arg(format!(
                "--advertise-address={}",
                pki::NODE_FACING_API_ADDRESS
            ))
            .arg("--endpoint-reconciler-type=lease")
            .arg(format!(
                "--egress-selector-config-file={}",
                dir.join("egress-selector.yaml").display()
            ))
            .arg("--enable-aggregator-routing=true")
            // Pods' logs, exec and port forwarding: the API server calls the kubelets by
            // their node address (the egress tunnel reaches addresses, not names) as the
            // admin, whom the kubelets' webhook authorization allows (system:masters).
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg(format!(
                "--kubelet-client-certificate={}",
                pki.admin_cert.display()
            ))
            .arg(format!("--kubelet-client-key={}", pki.admin_key.display()));
        } else {
            // The `kubernetes` Service's Endpoints cannot hold a loopback address.
            cmd.arg("--advertise-address=127.0.0.1")
                .arg("--endpoint-reconciler-type=none");
        }
        plane.spawn("kube-apiserver", cmd)?;
        let api = plane.client()?;
        plane
            .wait_until("kube-apiserver", START_TIMEOUT, || {
                let api = api.clone();
                async move { ready(&api, "/readyz").await }
            })
            .await?;

        let kc = plane.kubeconfig.display().to_string();
        if let Some(bin) = controller_manager {
            let mut cmd = Command::new(bin);
            cmd.arg(format!("--kubeconfig={kc}"))
                .arg(format!("--authentication-kubeconfig={kc}"))
                .arg(format!("--authorization-kubeconfig={kc}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", ports.controller_manager))
                .arg(format!(
                    "--cert-dir={}",
                    dir.join("controller-manager").display()
                ))
                .arg("--leader-elect=false")
                .arg("--controllers=*")
                .arg("--use-service-account-credentials=false")
                .arg(format!(
                    "--service-account-private-key-file={}",
                    pki.service_account_key.display()
                ))
                .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
                .arg(format!(
                    "--cluster-signing-cert-file={}",
                    pki.ca_cert.display()
                ))
                .arg(format!(
                    "--cluster-signing-key-file={}",
                    pki.ca_key.display()
                ))
                .arg("--profiling=false");
            plane.spawn("kube-controller-manager", cmd)?;
            let health = component_client(ports.controller_manager)?;
            plane
                .wait_until("kube-controller-manager", START_TIMEOUT, || {
                    let health = health.clone();
                    async move { ready(&health, "/healthz").await }
                })
                .await?;
            // Its service-account controller creating `default/default` shows the
            // controllers are running, not just serving health checks.
            plane
                .wait_until("kube-controller-manager", START_TIMEOUT, || {
                    let api = api.clone();
                    async move {
                        kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
                            api, "default",
                        )
                        .get_opt("default")
                        .await
                        .ok()
                        .flatten()
                        .is_some()
                    }
                })
                .await?;
        }
        if let Some(bin) = scheduler {
            let mut cmd = Command::new(bin);
            cmd.arg(format!("--kubeconfig={kc}"))
                .arg(format!("--authentication-kubeconfig={kc}"))
                .arg(format!("--authorization-kubeconfig={kc}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", ports.scheduler))
                .arg("--leader-elect=false")
                .arg("--profiling=false");
            plane.spawn("kube-scheduler", cmd)?;
            let health = component_client(ports.scheduler)?;
            plane
                .wait_until("kube-scheduler", START_TIMEOUT, || {
                    let health = health.clone();
                    async move { ready(&health, "/healthz").await }
                })
                .await?;
        }
        Ok(plane)
    }

    fn spawn(&mut self, name: &'static str, cmd: Command) -> Result<(), Error> {
        let log = self.workdir.path().join(format!("{name}.log"));
        let process = ManagedProcess::spawn(name, cmd, &log)
            .map_err(|source| Error::Spawn { name, source })?;
        self.processes.push(process);
        Ok(())
    }

    /// Polls `check` until it returns true; fails early when any process has exited.
    async fn wait_until<F, Fut>(
        &mut self,
        name: &str,
        timeout: Duration,
        check: F,
    ) -> Result<(), Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            for p in &mut self.processes {
                if let Some(status) = p.try_exited() {
                    return Err(Error::Exited {
                        name: p.name().to_string(),
                        status: status.to_string(),
                        log: p.log_path().display().to_string(),
                        tail: p.log_tail(30),
                    });
                }
            }
            if check().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                let (log, tail) = self
                    .processes
                    .iter()
                    .find(|p| p.name() == name)
                    .map(|p| (p.log_path().display().to_string(), p.log_tail(30)))
                    .unwrap_or_default();
                return Err(Error::NotReady {
                    name: name.to_string(),
                    timeout,
                    log,
                    tail,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new client for the admin user. Create one per tokio runtime: a client's
    /// connection pool lives on the runtime it was created in.
    pub fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.config.clone()).map_err(Error::Client)
    }

    /// The client configuration (admin credentials, CA).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// Path of a kubeconfig file usable with `kubectl --kubeconfig`.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API server's loopback port.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The API server's tunnels into the nodes' network open from the namespace of process
    /// `pid` (the nodes' switch) from now on.
    pub(crate) fn route_cluster_egress(&self, pid: u32) {
        if let Some(egress) = &self.egress {
            egress.route_through(pid);
        }
    }

    /// Whether the plane was started [`Options::with_real_nodes`].
    pub fn takes_real_nodes(&self) -> bool {
        self.real_nodes
    }

    pub(crate) fn pki(&self) -> &pki::Pki {
        &self.pki
    }

    pub(crate) fn authority(&self) -> &pki::Authority {
        &self.authority
    }

    /// The control plane's temporary directory (certificates, logs, etcd data).
    pub fn dir(&self) -> &Path {
        self.workdir.path()
    }

    /// Process ids of every component, for tests that check nothing is left behind.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(ManagedProcess::pid).collect()
    }

    /// Name and pid of every running component, in start order.
    pub fn components(&self) -> Vec<(&str, u32)> {
        self.processes.iter().map(|p| (p.name(), p.pid())).collect()
    }

    /// Stops every component: the newest first, etcd last, each with a grace period.
    pub fn stop(mut self) {
        self.stop_processes();
    }

    fn stop_processes(&mut self) {
        // Pod processes first (a local node may have been dropped without stopping them).
        crate::process::kill_tagged(
            crate::process::OWNER_ENV,
            &self.workdir.path().display().to_string(),
        );
        // Ask everything but etcd to stop at once, then wait; etcd goes last so that
        // the API server does not spend its shutdown retrying a dead store.
        let grace = Duration::from_secs(5);
        if self.processes.len() > 1 {
            for p in &self.processes[1..] {
                p.signal(libc::SIGTERM);
            }
            while self.processes.len() > 1 {
                if let Some(mut p) = self.processes.pop() {
                    p.wait_or_kill(grace);
                }
            }
        }
        for mut p in self.processes.drain(..) {
            p.terminate(grace);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_processes();
    }
}

async fn load_config(path: &Path) -> Result<kube::Config, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(Error::LoadKubeconfig)?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(Error::LoadKubeconfig)
}

/// A client for a component's own health endpoint (self-signed serving certificate).
fn component_client(port: u16) -> Result<kube::Client, Error> {
    let url = http::Uri::builder()
        .scheme("https")
        .authority(format!("127.0.0.1:{port}"))
        .path_and_query("/")
        .build()
        .map_err(Error::ComponentUrl)?;
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    kube::Client::try_from(config).map_err(Error::Client)
}

async fn ready(client: &kube::Client, path: &str) -> bool {
    let Ok(req) = http::Request::get(path).body(Vec::new()) else {
        return false;
    };
    matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok")
}
