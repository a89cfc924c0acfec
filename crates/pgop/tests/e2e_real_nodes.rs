//! The first end-to-end test on real Kubernetes nodes: containerd + runc + kubelet +
//! kube-proxy on two nodes (`pgop_testenv::real_nodes`), CoreDNS, the images built by
//! `hack/build-images.sh` imported into every node, and pgop installed with its Helm
//! chart. Needs root (namespaces, cgroups, mounts).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use pgop_api::PostgresCluster;
use pgop_api::cluster::{ClusterPhase, InstanceRole};
use pgop_testenv::real_nodes::{NodesOptions, RealNodes};
use pgop_testenv::{ControlPlane, Options};
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn helm(plane: &ControlPlane, args: &[&str]) -> Result<String> {
    let helm = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Helm)?;
    let out = Command::new(helm)
        .args(args)
        .env("KUBECONFIG", plane.kubeconfig())
        .env("HELM_CACHE_HOME", plane.dir().join("helm/cache"))
        .env("HELM_CONFIG_HOME", plane.dir().join("helm/config"))
        .env("HELM_DATA_HOME", plane.dir().join("helm/data"))
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("helm {args:?} failed: {text}").into());
    }
    Ok(text)
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not within {timeout:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_installed_pgop_runs_a_three_instance_cluster_on_two_real_nodes() -> Result {
    let images = pgop_testenv::images::built()?;
    let plane = ControlPlane::start(
        Options::default()
            .with_controller_manager()
            .with_scheduler()
            .with_real_nodes(),
    )
    .await?;
    let t0 = Instant::now();
    let nodes = RealNodes::start(
        &plane,
        NodesOptions {
            count: 2,
            images: images.archives(),
            sandbox_image: images.pause.name.clone(),
            bin_dir: None,
            dns_image: Some(images.coredns.name.clone()),
        },
    )
    .await?;
    println!("2 real nodes and CoreDNS ready in {:.1?}", t0.elapsed());
    let client = plane.client()?;

    // The operator, installed by its chart, with the image imported into the nodes.
    let (repository, tag) = images
        .pgop
        .name
        .rsplit_once(':')
        .ok_or("the pgop image has no tag")?;
    let chart = repo().join("charts/pgop");
    helm(
        &plane,
        &[
            "install",
            "pgop",
            &chart.display().to_string(),
            "--namespace",
            "pgop-system",
            "--create-namespace",
            "--set",
            &format!("image.repository={repository}"),
            "--set",
            &format!("image.tag={tag}"),
            "--wait",
            "--timeout",
            "180s",
        ],
    )?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "pgop-system");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "pgop-system");
    eventually(
        "the operator holds the leader Lease",
        Duration::from_secs(120),
        || async {
            let lease = leases
                .get_opt("pgop-operator")
                .await
                .map_err(|e| e.to_string())?;
            let holder = lease
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .ok_or("no holder yet")?;
            if holder.starts_with("pgop") {
                Ok(holder)
            } else {
                Err(format!("held by {holder}"))
            }
        },
    )
    .await;
    println!("operator ready and leading at {:.1?}", t0.elapsed());

    // A namespace that enforces the restricted Pod Security Standard.
    let ns = "restricted";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": ns, "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest"
                }}
            }))?,
        )
        .await?;
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "database.example.com/v1alpha1",
                "kind": "PostgresCluster",
                "metadata": {"name": "db"},
                "spec": {"replicas": 3, "storage": {"size": "1Gi"}}
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually("the cluster is Ready", Duration::from_secs(300), || async {
        let c = clusters.get("db").await.map_err(|e| e.to_string())?;
        let status = c.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let roles_ok = status.instances.iter().all(|i| {
            let want = if status.current_primary.as_deref() == Some(i.name.as_str()) {
                InstanceRole::Primary
            } else {
                InstanceRole::Replica
            };
            i.role == Some(want)
        });
        if ready
            && status.phase == Some(ClusterPhase::Ready)
            && status.ready_replicas == 3
            && status.instances.len() == 3
            && status.current_primary == status.target_primary
            && roles_ok
        {
            Ok(())
        } else {
            let listed = pods
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|p| {
                            format!(
                                "{}: {:?}",
                                p.metadata.name.clone().unwrap_or_default(),
                                p.status.as_ref().map(|s| (&s.phase, &s.conditions))
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            Err(format!(
                "phase {:?}, ready {}, instances {:?}; pods {listed:?}",
                status.phase,
                status.ready_replicas,
                status
                    .instances
                    .iter()
                    .map(|i| (&i.name, &i.role))
                    .collect::<Vec<_>>()
            ))
        }
    })
    .await;
    println!("cluster Ready at {:.1?}", t0.elapsed());
    let placed: BTreeSet<String> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=db"))
        .await?
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    assert_eq!(
        placed,
        nodes.names().into_iter().collect(),
        "the instances are spread over both nodes"
    );

    // A client Pod, same image, restricted: writes through -rw, reads back through -ro.
    let script = "set -eu
rw=db-rw.restricted.svc.cluster.local
ro=db-ro.restricted.svc.cluster.local
psql -v ON_ERROR_STOP=1 -h $rw -c 'create table t (id int primary key, v text)' \
     -c \"insert into t select g, 'row ' || g from generate_series(1, 100) g\"
for i in $(seq 60); do
  n=$(psql -At -h $ro -c 'select count(*) from t' 2>/dev/null || true)
  [ \"$n\" = 100 ] && break
  sleep 1
done
primary=$(psql -At -h $rw -c 'select pg_is_in_recovery()')
standby=$(psql -At -h $ro -c 'select pg_is_in_recovery()')
echo \"rows=$n rw-recovery=$primary ro-recovery=$standby\" | tee /dev/termination-log";
    let client_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "client"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 26, "runAsGroup": 26,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "psql", "image": images.pgop.name, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "env": [
                    {"name": "PGUSER", "valueFrom": {"secretKeyRef": {"name": "db-app", "key": "username"}}},
                    {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": "db-app", "key": "password"}}},
                    {"name": "PGDATABASE", "value": "app"},
                    {"name": "PGCONNECT_TIMEOUT", "value": "5"}
                ],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))?;
    pods.create(&PostParams::default(), &client_pod).await?;
    let message = eventually(
        "the client Pod finishes",
        Duration::from_secs(180),
        || async {
            let p = pods.get("client").await.map_err(|e| e.to_string())?;
            let terminated = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.clone());
            match terminated {
                Some(t) => Ok((t.exit_code, t.message.unwrap_or_default())),
                None => Err(format!("{:?}", p.status.map(|s| s.phase))),
            }
        },
    )
    .await;
    assert_eq!(
        (message.0, message.1.trim()),
        (0, "rows=100 rw-recovery=f ro-recovery=t"),
        "client: {}",
        message.1
    );

    // Deleting the cluster removes every child; uninstalling removes the operator.
    pods.delete("client", &DeleteParams::default()).await?;
    clusters.delete("db", &DeleteParams::default()).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    eventually(
        "every child of the cluster is gone",
        Duration::from_secs(180),
        || async {
            let sel = ListParams::default().labels("app.kubernetes.io/instance=db");
            let left = (
                pods.list(&sel)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
                pvcs.list(&sel)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
                services
                    .list(&sel)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
                secrets
                    .list(&sel)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
            );
            let cluster_gone = clusters
                .get_opt("db")
                .await
                .map_err(|e| e.to_string())?
                .is_none();
            if left == (0, 0, 0, 0) && cluster_gone {
                Ok(())
            } else {
                Err(format!(
                    "pods, PVCs, Services, Secrets left: {left:?}, cluster gone: {cluster_gone}"
                ))
            }
        },
    )
    .await;
    helm(
        &plane,
        &["uninstall", "pgop", "--namespace", "pgop-system", "--wait"],
    )?;
    eventually("the operator is gone", Duration::from_secs(60), || async {
        let d = deployments
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if d.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} Deployments left", d.items.len()))
        }
    })
    .await;
    drop(nodes);
    Ok(())
}
