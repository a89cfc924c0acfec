//! The first end-to-end test on real Kubernetes nodes: containerd + runc + kubelet +
//! kube-proxy on two nodes (`pgop_testenv::real_nodes`), CoreDNS, the images built by
//! `hack/build-images.sh` imported into every node, and pgop installed with its Helm
//! chart, its admission webhooks on: the API server calls them in the operator's Pod
//! (through testenv's tunnel into the nodes' network). Needs root (namespaces, cgroups,
//! mounts).

use crate::real;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use real::{RealEnv, Result, client_pod, eventually, finished};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_installed_pgop_runs_a_three_instance_cluster_on_two_real_nodes() -> Result {
    let env = RealEnv::start(2, false).await?;
    // The operator, installed by its chart, with the image imported into the nodes, and
    // its webhooks.
    env.install_operator(&["--set", "webhook.enabled=true"])
        .await?;

    // A namespace that enforces the restricted Pod Security Standard.
    let ns = "restricted";
    env.restricted_namespace(ns).await?;
    let clusters = env.clusters(ns);
    // The validating webhook, served by the operator's Pod, refuses what only it can see
    // (once the operator has written its certificate's authority into the configuration).
    let missing: pgop_api::PostgresCluster = serde_json::from_value(json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "db"},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}, "credentials": {"appSecret": "missing"}}
    }))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let refusal = eventually(
        "the validating webhook to refuse a missing Secret",
        Duration::from_secs(60),
        || async {
            match clusters.create(&dry_run, &missing).await {
                Err(kube::Error::Api(e)) if e.message.contains("denied the request") => {
                    Ok(e.message)
                }
                other => Err(format!("not refused by the webhook: {other:?}")),
            }
        },
    )
    .await;
    assert!(
        refusal.contains("spec.credentials.appSecret") && refusal.contains("\"missing\""),
        "{refusal}"
    );
    let mut valid = missing.clone();
    valid.spec.credentials.app_secret = None;
    eventually(
        "the defaulting webhook to write the bootstrap",
        Duration::from_secs(60),
        || async {
            let c = clusters
                .create(&dry_run, &valid)
                .await
                .map_err(|e| e.to_string())?;
            c.spec
                .bootstrap
                .map(drop)
                .ok_or_else(|| "no bootstrap written yet".to_string())
        },
    )
    .await;
    // With a PgBouncer pooler of two Pods (Debian's pgbouncer in the pgop image).
    env.create_cluster(
        ns,
        "db",
        json!({"replicas": 3, "storage": {"size": "1Gi"}, "poolers": [{"name": "rw", "instances": 2}]}),
    )
    .await?;
    // The defaulting webhook wrote the bootstrap in effect into the stored spec.
    let stored = clusters.get("db").await?;
    assert_eq!(
        serde_json::to_value(&stored.spec.bootstrap)?,
        json!({"initdb": {"database": "app", "owner": "app"}})
    );
    env.wait_ready(ns, "db", 3, Duration::from_secs(300)).await;
    println!("cluster Ready at {:.1?}", env.started.elapsed());
    let pods = env.pods(ns);
    let placed: BTreeSet<String> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=db"))
        .await?
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    assert_eq!(
        placed,
        env.nodes.names().into_iter().collect(),
        "the instances are spread over both nodes"
    );

    // A client Pod, same image, restricted: writes through -rw, reads back through -ro and
    // through the pooler's Service (TLS verify-full: the pooler serves the server
    // certificate, which names its Service).
    let script = "set -eu
rw=db-rw.restricted.svc.cluster.local
ro=db-ro.restricted.svc.cluster.local
pooler=db-pooler-rw.restricted.svc.cluster.local
# kube-proxy on this node may not have programmed the Services yet (No route to host):
# retry the first connection, as a client would.
for i in $(seq 60); do psql -h $rw -c 'select 1' >/dev/null 2>&1 && break; sleep 1; done
psql -v ON_ERROR_STOP=1 -h $rw -c 'create table t (id int primary key, v text)' \
     -c \"insert into t select g, 'row ' || g from generate_series(1, 100) g\"
for i in $(seq 60); do
  n=$(psql -At -h $ro -c 'select count(*) from t' 2>/dev/null || true)
  [ \"$n\" = 100 ] && break
  sleep 1
done
primary=$(psql -At -h $rw -c 'select pg_is_in_recovery()')
standby=$(psql -At -h $ro -c 'select pg_is_in_recovery()')
for i in $(seq 60); do psql -h $pooler -c 'select 1' >/dev/null 2>&1 && break; sleep 1; done
pooled=$(psql -At -h $pooler -c 'select pg_is_in_recovery()::text || count(*) from t')
echo \"rows=$n rw-recovery=$primary ro-recovery=$standby pooler=$pooled\" | tee /dev/termination-log";
    let client = client_pod("client", &env.images.pgop.name, "db-app", script, json!({}))?;
    pods.create(&PostParams::default(), &client).await?;
    let (code, message) = finished(&pods, "client", Duration::from_secs(180)).await;
    assert_eq!(
        (code, message.trim()),
        (0, "rows=100 rw-recovery=f ro-recovery=t pooler=false100"),
        "client: {message}"
    );

    // Deleting the cluster removes every child; uninstalling removes the operator.
    pods.delete("client", &DeleteParams::default()).await?;
    clusters.delete("db", &DeleteParams::default()).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), ns);
    let services: Api<Service> = Api::namespaced(env.client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), ns);
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
    env.helm(&["uninstall", "pgop", "--namespace", "pgop-system", "--wait"])?;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "pgop-system");
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
    Ok(())
}
