//! The configuration files of one real node: containerd, the CNI network, the kubelet
//! and kube-proxy, and their kubeconfigs. Every path is the node's own, so that several
//! nodes (and several harness runs) share nothing on the machine.

use std::net::Ipv4Addr;
use std::path::Path;

/// The Service CIDR the control plane allocates from (`--service-cluster-ip-range`):
/// about 4,000 ClusterIPs, enough for the scale benchmark's fleets (three Services a
/// cluster).
pub const SERVICE_CIDR: &str = "10.0.0.0/20";
/// The ClusterIP the `kube-dns` Service gets, and the kubelets give to Pods.
pub const CLUSTER_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 10);
/// Every node's Pod CIDR is a /24 of this.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The nodes' own network (on the switch's bridge).
pub const NODE_NETWORK_PREFIX: u8 = 24;

/// Node `index`'s address on the switch: 10.250.0.11, .12, ...
pub fn node_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 0, 11 + index as u8)
}

/// Node `index`'s Pod CIDR: 10.244.<index>.0/24.
pub fn pod_cidr(index: usize) -> String {
    format!("10.244.{index}.0/24")
}

/// The fully qualified name containerd gives an image imported as `name`.
pub fn normalized_image(name: &str) -> String {
    let first = name.split('/').next().unwrap_or_default();
    let has_registry =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        name.to_string()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    }
}

pub fn containerd(dir: &Path, sandbox_image: &str) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
oom_score = 0

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd-ttrpc.sock"

[debug]
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  enable_selinux = false
  # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its
  # oom_score_adj: keep every container at or above containerd's own (0).
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
"#,
        sandbox = normalized_image(sandbox_image),
    )
}

/// A bridge network on the node's Pod CIDR; Pods route everything through the node,
/// which has no route off the machine.
pub fn cni(dir: &Path, index: usize) -> String {
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "pgop-testenv",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{d}/cni-ipam",
        "ranges": [[{{"subnet": "{cidr}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}]
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#,
        d = dir.display(),
        cidr = pod_cidr(index),
    )
}

pub fn kubelet(dir: &Path, ca: &Path, cgroup_root: &str, infra: bool) -> String {
    let d = dir.display();
    let taints = if infra {
        format!(
            "registerWithTaints:\n- {{key: {}, value: 'true', effect: NoSchedule}}\n",
            super::INFRA_LABEL
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
cgroupsPerQOS: true
failCgroupV1: false
containerRuntimeEndpoint: unix://{d}/containerd.sock
clusterDNS: [{dns}]
clusterDomain: cluster.local
resolvConf: {d}/resolv.conf
podLogsDir: {d}/pod-logs
staticPodPath: ''
failSwapOn: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
localStorageCapacityIsolation: false
nodeStatusReportFrequency: 10s
{taints}",
        ca = ca.display(),
        dns = CLUSTER_DNS,
    )
}

pub fn kube_proxy(dir: &Path, node: &str, ip: Ipv4Addr) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {d}/kube-proxy.kubeconfig
mode: iptables
clusterCIDR: {cluster}
hostnameOverride: {node}
bindAddress: {ip}
healthzBindAddress: {ip}:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
",
        d = dir.display(),
        cluster = CLUSTER_CIDR,
    )
}
