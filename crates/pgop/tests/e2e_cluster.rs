//! End to end on one machine: a real API server, the operator, the local node running
//! `pgop instance run` (this crate's binary) and real PostgreSQL.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use pgop_api::PostgresCluster;
use pgop_api::cluster::ClusterPhase;
use pgop_testenv::node::{LocalNode, NodeOptions};
use pgop_testenv::{ControlPlane, Options, TestNamespace, wait};
use std::time::Duration;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const TIMEOUT: Duration = Duration::from_secs(180);

struct Env {
    plane: ControlPlane,
    client: Client,
    ns: TestNamespace,
    node: LocalNode,
    stop: tokio::sync::oneshot::Sender<()>,
    operator: tokio::task::JoinHandle<()>,
}

async fn start(prefix: &str) -> Result<Env> {
    let plane = ControlPlane::start(Options::default().with_controller_manager()).await?;
    let client = plane.client()?;
    pgop_testenv::crds::install(&client, pgop_api::crds()).await?;
    let ns = TestNamespace::create(plane.config(), prefix).await?;
    let node = LocalNode::start(
        &plane,
        NodeOptions {
            name: format!("node-{}", ns.name()),
            namespace: Some(ns.name().to_string()),
            image: "pgop:".into(),
            pgop_binary: env!("CARGO_BIN_EXE_pgop").into(),
            pod_ports: vec![5432, 8000],
        },
    )
    .await?;
    let (uid, gid) = pgop_testenv::node::local_user("postgres")
        .ok_or("no postgres user: apt-get install postgresql-15")?;
    let options = pgop_operator::Options {
        namespace: Some(ns.name().to_string()),
        settings: pgop_operator::Settings {
            run_as_user: i64::from(uid),
            run_as_group: i64::from(gid),
            ..pgop_operator::Settings::default()
        },
        ..pgop_operator::Options::default()
    };
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let op_client = client.clone();
    let operator = tokio::spawn(async move {
        pgop_operator::run(op_client, options, async move {
            let _ = rx.await;
        })
        .await;
    });
    Ok(Env {
        plane,
        client,
        ns,
        node,
        stop,
        operator,
    })
}

impl Env {
    fn n(&self) -> &str {
        self.ns.name()
    }

    async fn wait_ready(&self, name: &str, replicas: i32) -> Result<PostgresCluster> {
        let api: Api<PostgresCluster> = Api::namespaced(self.client.clone(), self.n());
        Ok(wait::until(
            &format!("{name} Ready with {replicas} instances"),
            TIMEOUT,
            || async {
                match api.get(name).await {
                    Ok(c)
                        if c.status.as_ref().is_some_and(|s| {
                            s.phase == Some(ClusterPhase::Ready)
                                && s.ready_replicas == replicas
                                && s.instances.len() == replicas as usize
                        }) =>
                    {
                        Ok(c)
                    }
                    other => Err(format!("{:?}", other.map(|c| c.status))),
                }
            },
        )
        .await?)
    }

    async fn password(&self, name: &str) -> Result<String> {
        let secret: Secret = Api::namespaced(self.client.clone(), self.n())
            .get(&format!("{name}-app"))
            .await?;
        let bytes = secret
            .data
            .and_then(|d| d.get("password").cloned())
            .ok_or("no password")?;
        Ok(String::from_utf8(bytes.0)?)
    }

    async fn pod_ips(&self, name: &str) -> Result<Vec<(String, String)>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.n());
        let list = pods
            .list(&ListParams::default().labels(&format!("database.example.com/cluster={name}")))
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|p| Some((p.name_any(), p.status?.pod_ip?)))
            .collect())
    }

    async fn stop(self) -> Result {
        let _ = self.stop.send(());
        let _ = self.operator.await;
        self.node.stop().await;
        self.ns.delete().await?;
        drop(self.plane);
        Ok(())
    }
}

async fn connect(host: &str, password: &str) -> Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::Config::new()
        .host(host)
        .port(5432)
        .user("app")
        .dbname("app")
        .password(password)
        .connect_timeout(Duration::from_secs(5))
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(conn);
    Ok(client)
}

async fn count_on(host: &str, password: &str) -> Result<i64> {
    let c = connect(host, password).await?;
    Ok(c.query_one("select count(*) from items", &[]).await?.get(0))
}

/// Waits until the instance at `ip` holds `rows` rows of the test table.
async fn wait_rows(name: &str, ip: &str, password: &str, rows: i64) -> Result {
    wait::until(&format!("{rows} rows on {name}"), TIMEOUT, || async {
        match count_on(ip, password).await {
            Ok(n) if n == rows => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn e2e_a_cluster_replicates_scales_and_is_deleted_without_leftovers() -> Result {
    let env = start("e2e").await?;
    let n = env.n().to_string();
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "shop"},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}, "bootstrap": {"initdb": {"database": "app", "owner": "app"}}}
    }))?;
    let api: Api<PostgresCluster> = Api::namespaced(env.client.clone(), &n);
    api.create(&PostParams::default(), &cluster).await?;
    let ready = env.wait_ready("shop", 3).await?;
    let primary = ready
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;

    // Write through the -rw Service name, resolved as the instances resolve it.
    let rw = pgop_testenv::node::resolve_host(env.node.hosts_file(), &format!("shop-rw.{n}.svc"))
        .ok_or("shop-rw does not resolve")?;
    let password = env.password("shop").await?;
    let db = connect(&rw, &password).await?;
    db.batch_execute("create table items(id int primary key, name text); insert into items select g, 'item ' || g from generate_series(1, 1000) g")
        .await?;
    let ips = env.pod_ips("shop").await?;
    assert_eq!(ips.len(), 3);
    assert!(
        ips.iter().any(|(name, ip)| *name == primary && *ip == rw),
        "-rw points at the primary"
    );
    for (name, ip) in &ips {
        let c = connect(ip, &password).await?;
        let in_recovery: bool = c.query_one("select pg_is_in_recovery()", &[]).await?.get(0);
        assert_eq!(in_recovery, *name != primary, "{name}");
        wait_rows(name, ip, &password, 1000).await?;
    }

    // Scale 3 -> 5 -> 2: new standbys clone and stream; the highest serials go.
    api.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
    )
    .await?;
    env.wait_ready("shop", 5).await?;
    for (name, ip) in env.pod_ips("shop").await? {
        wait_rows(&name, &ip, &password, 1000).await?;
    }
    api.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
    )
    .await?;
    let two = env.wait_ready("shop", 2).await?;
    let names: Vec<String> = two
        .status
        .map(|s| s.instances.into_iter().map(|i| i.name).collect())
        .unwrap_or_default();
    assert_eq!(names, vec!["shop-1".to_string(), "shop-2".to_string()]);
    db.execute("insert into items values (1001, 'after scaling')", &[])
        .await?;

    // Deleting the cluster removes every child.
    api.delete("shop", &DeleteParams::foreground()).await?;
    let sel = ListParams::default().labels("database.example.com/cluster=shop");
    let (pods, pvcs, svcs, secrets): (
        Api<Pod>,
        Api<PersistentVolumeClaim>,
        Api<Service>,
        Api<Secret>,
    ) = (
        Api::namespaced(env.client.clone(), &n),
        Api::namespaced(env.client.clone(), &n),
        Api::namespaced(env.client.clone(), &n),
        Api::namespaced(env.client.clone(), &n),
    );
    wait::until("every child of the cluster to be gone", TIMEOUT, || async {
        let left = (
            pods.list(&sel).await.map(|l| l.items.len()),
            pvcs.list(&sel).await.map(|l| l.items.len()),
            svcs.list(&sel).await.map(|l| l.items.len()),
            secrets.list(&sel).await.map(|l| l.items.len()),
        );
        match left {
            (Ok(0), Ok(0), Ok(0), Ok(0)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    env.stop().await
}
