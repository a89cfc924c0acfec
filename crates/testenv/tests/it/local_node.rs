//! The local node runs real pods as processes: a Python HTTP server stands in for the
//! pgop binary, so the node's own behaviour is tested without PostgreSQL.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use pgop_testenv::node::{LocalNode, NodeOptions};
use pgop_testenv::{TestNamespace, shared, wait};
use std::path::PathBuf;
use std::time::Duration;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A python3 that an unprivileged user may run (not one under /root).
fn python() -> Result<PathBuf> {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = PathBuf::from(dir).join("python3");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err("python3 not found in /usr/bin (apt-get install python3)".into())
}

fn manifests(ns: &str) -> Result<(PersistentVolumeClaim, Pod, Service)> {
    let pvc = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))?;
    let pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}},
        "spec": {
            "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534},
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": "pgop:test",
                "command": ["pgop", "-m", "http.server", "--bind", "$(POD_IP)", "8000", "--directory", "/data/www"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "ports": [{"name": "http", "containerPort": 8000}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        }
    }))?;
    let svc = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8000, "targetPort": "http"}]}
    }))?;
    Ok((pvc, pod, svc))
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

/// Pids whose command line mentions `needle`.
fn pids_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|c| {
                            String::from_utf8_lossy(&c)
                                .replace('\0', " ")
                                .contains(needle)
                        })
                        .unwrap_or(false)
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn http_get(ip: &str, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((ip, 8000)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

#[tokio::test]
async fn a_pod_runs_as_a_process_with_its_own_ip_volume_user_readiness_and_restarts() -> Result {
    let plane = shared().await?;
    let client = plane.client()?;
    let ns = TestNamespace::create(plane.config(), "node").await?;
    let n = ns.name().to_string();
    let node = LocalNode::start(
        plane,
        NodeOptions {
            name: format!("node-{n}"),
            namespace: Some(n.clone()),
            image: "pgop:".into(),
            pgop_binary: python()?,
            pod_ports: vec![8000],
        },
    )
    .await?;
    let (pvc, pod, svc) = manifests(&n)?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &n);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &n);
    pvcs.create(&PostParams::default(), &pvc).await?;
    Api::<Service>::namespaced(client.clone(), &n)
        .create(&PostParams::default(), &svc)
        .await?;
    pods.create(&PostParams::default(), &pod).await?;

    // The PVC is provisioned as a local directory and bound by the real PV controller.
    let bound = wait::until("the PVC to be bound", TIMEOUT, || async {
        match pvcs.get("data").await {
            Ok(p) if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") => Ok(p),
            other => Err(format!("{:?}", other.map(|p| p.status))),
        }
    })
    .await?;
    let pv_name = bound.spec.and_then(|s| s.volume_name).ok_or("no volume")?;
    let pv: PersistentVolume = Api::all(client.clone()).get(&pv_name).await?;
    let dir = PathBuf::from(
        pv.spec
            .and_then(|s| s.host_path)
            .map(|h| h.path)
            .ok_or("no hostPath")?,
    );
    std::fs::create_dir_all(dir.join("www"))?;
    std::fs::write(dir.join("www/hello.txt"), "hello from the volume")?;

    // Bound to the node, running, Ready from the real readiness probe, with its own IP.
    let running = wait::until("the pod to be Ready", TIMEOUT, || async {
        match pods.get("web").await {
            Ok(p) if ready(&p) => Ok(p),
            other => Err(format!("{:?}", other.map(|p| p.status))),
        }
    })
    .await?;
    assert_eq!(
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name())
    );
    let ip = running
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .ok_or("no pod IP")?;
    assert!(ip.starts_with("127.") && ip != "127.0.0.1", "{ip}");
    assert_eq!(
        running.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    // $(POD_IP) was expanded, /data mapped to the PV's directory.
    let body = http_get(&ip, "/hello.txt").await?;
    assert!(body.contains("hello from the volume"), "{body}");
    // It runs as the pod's runAsUser.
    let pid = *pids_with(&format!("--bind {ip}"))
        .first()
        .ok_or("no process")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap_or_default();
    assert!(
        uid_line.split_whitespace().nth(1) == Some("65534"),
        "{uid_line}"
    );

    // The Service name resolves through the node's hosts file to the ready endpoint.
    let svc_name = format!("web.{n}.svc");
    wait::until("the service name to resolve", TIMEOUT, || async {
        match pgop_testenv::node::resolve_host(node.hosts_file(), &svc_name) {
            Some(found) if found == ip => Ok(()),
            other => Err(format!(
                "{other:?}; hosts file: {:?}",
                std::fs::read_to_string(node.hosts_file())
            )),
        }
    })
    .await?;

    // A crashed process is restarted, and the restart is counted.
    // SAFETY: kill(2) on a process this test's node started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait::until(
        "a restart to be counted and the pod Ready again",
        TIMEOUT,
        || async {
            match pods.get("web").await {
                Ok(p) if restarts(&p) == 1 && ready(&p) => Ok(()),
                other => Err(format!("{:?}", other.map(|p| (restarts(&p), ready(&p))))),
            }
        },
    )
    .await?;

    // Deleting the pod stops its process and removes the object.
    pods.delete("web", &DeleteParams::default()).await?;
    wait::until("the pod object to be gone", TIMEOUT, || async {
        match pods.get_opt("web").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.name_any())))),
        }
    })
    .await?;
    assert!(
        pids_with(&format!("--bind {ip}")).is_empty(),
        "the process outlived its pod"
    );

    // Deleting the claim releases the volume: the PV and its directory go too.
    pvcs.delete("data", &DeleteParams::default()).await?;
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    wait::until("the released volume to be removed", TIMEOUT, || async {
        match pv_api.get_opt(&pv_name).await {
            Ok(None) if !dir.exists() => Ok(()),
            other => Err(format!(
                "{:?} dir exists: {}",
                other.map(|p| p.map(|p| p.status)),
                dir.exists()
            )),
        }
    })
    .await?;

    node.stop().await;
    ns.delete().await?;
    Ok(())
}
