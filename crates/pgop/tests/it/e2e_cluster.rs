//! End to end on one machine: a real API server, the operator, the local node running
//! `pgop instance run` (this crate's binary) and real PostgreSQL.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use pgop_api::PostgresCluster;
use pgop_testenv::wait;

#[tokio::test]
async fn e2e_a_cluster_replicates_scales_and_is_deleted_without_leftovers() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e").await?;
    let n = env.n().to_string();
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "shop"},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}, "bootstrap": {"initdb": {"database": "app", "owner": "app"}},
                 // Restart-only parameters, in effect from each instance's first start.
                 "postgresql": {"parameters": {"max_connections": "150", "shared_buffers": "48MB"}}}
    }))?;
    let api: Api<PostgresCluster> = Api::namespaced(env.client.clone(), &n);
    api.create(&PostParams::default(), &cluster).await?;
    let ready = env.wait_ready("shop", 3).await?;
    // Each instance's PostgreSQL version, as its manager reports it (Debian's 15 here).
    env.wait_cluster(
        "shop",
        "every instance's PostgreSQL version",
        TIMEOUT,
        |s| {
            s.instances.len() == 3
                && s.instances.iter().all(|i| {
                    i.postgres_version
                        .as_deref()
                        .is_some_and(|v| v.starts_with("15."))
                })
        },
    )
    .await?;
    let primary = ready
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;

    // Write through the -rw Service name, resolved as the instances resolve it.
    let rw = env.rw("shop").ok_or("shop-rw does not resolve")?;
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
        wait_rows(name, ip, &password, "items", 1000).await?;
        started_with_the_spec(name, &c).await?;
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
        wait_rows(&name, &ip, &password, "items", 1000).await?;
        // A hot standby of a primary with max_connections 150 cannot start with less.
        started_with_the_spec(&name, &connect(&ip, &password).await?).await?;
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

/// A parameter the API server lets through but PostgreSQL refuses (a value of the wrong
/// type) is reported in `ConfigurationApplied=False` naming instance, parameter and reason,
/// with a Warning Event, while PostgreSQL keeps the last good value; removing it from the
/// spec turns the condition True again, with no Pod touched by hand.
#[tokio::test]
async fn e2e_a_refused_parameter_is_reported_in_a_condition_and_heals_when_removed() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-cfg").await?;
    env.create(
        "cfg",
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"},
            "postgresql": {"parameters": {"work_mem": "8MB"}}}),
    )
    .await?;
    env.wait_ready("cfg", 2).await?;
    let applied = |s: &pgop_api::PostgresClusterStatus| {
        pgop_api::conditions::is_true(&s.conditions, pgop_api::conditions::CONFIGURATION_APPLIED)
    };
    env.wait_cluster("cfg", "ConfigurationApplied True", TIMEOUT, applied)
        .await?;

    env.patch(
        "cfg",
        serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": "lots"}}}}),
    )
    .await?;
    let refused = env
        .wait_cluster(
            "cfg",
            "ConfigurationApplied False naming work_mem on both instances",
            TIMEOUT,
            |s| {
                pgop_api::conditions::find_condition(
                    &s.conditions,
                    pgop_api::conditions::CONFIGURATION_APPLIED,
                )
                .is_some_and(|c| {
                    c.status == "False"
                        && c.reason == "ParametersRefused"
                        && c.message.contains("cfg-1: work_mem = \"lots\"")
                        && c.message.contains("cfg-2: work_mem = \"lots\"")
                })
            },
        )
        .await?;
    let status = refused.status.ok_or("no status")?;
    let ready = pgop_api::conditions::find_condition(&status.conditions, "Ready").ok_or("Ready")?;
    assert!(
        ready.message.contains("ConfigurationApplied"),
        "Ready does not hide it: {}",
        ready.message
    );
    let events: Api<Event> = Api::namespaced(env.client.clone(), env.n());
    let warned = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("ConfigurationRefused")
                && e.note.as_deref().is_some_and(|n| n.contains("work_mem"))
        });
    assert!(warned, "a ConfigurationRefused Event names work_mem");
    // PostgreSQL keeps running on the last good value.
    let password = env.password("cfg").await?;
    for (name, ip) in env.pod_ips("cfg").await? {
        let c = connect(&ip, &password).await?;
        let work_mem: String = c.query_one("show work_mem", &[]).await?.get(0);
        assert_eq!(work_mem, "8MB", "{name}");
    }

    env.patch(
        "cfg",
        serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": null}}}}),
    )
    .await?;
    env.wait_cluster("cfg", "ConfigurationApplied True again", TIMEOUT, applied)
        .await?;
    env.wait_ready("cfg", 2).await?;
    env.stop().await
}

/// A generated Secret deleted by hand is generated anew, and PostgreSQL takes its new
/// password: the application logs in with it (not with the old one), and after the
/// replication Secret too is generated anew the standby still streams (with its
/// certificate: the replication role never logs in with a password).
#[tokio::test]
async fn e2e_a_deleted_secret_is_generated_anew_and_postgresql_takes_its_password() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("e2e-secret").await?;
    env.create(
        "sec",
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready("sec", 2).await?;
    let old = env.password("sec").await?;
    write_through_rw(&env, "sec", &old, "create table t(id int)").await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), env.n());
    let replication_password = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get("password"))
            .map(|p| String::from_utf8_lossy(&p.0).into_owned())
    };
    let old_replication = replication_password(&secrets.get("sec-replication").await?);

    for name in ["sec-app", "sec-replication"] {
        secrets.delete(name, &DeleteParams::default()).await?;
    }
    let new = wait::until("sec-app generated anew", TIMEOUT, || async {
        match env.password("sec").await {
            Ok(p) if p != old => Ok(p),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let new_replication = wait::until("sec-replication generated anew", TIMEOUT, || async {
        match secrets.get_opt("sec-replication").await {
            Ok(Some(s)) if replication_password(&s) != old_replication => {
                replication_password(&s).ok_or_else(|| "no password".to_string())
            }
            other => Err(format!("{:?}", other.map(|s| s.is_some()))),
        }
    })
    .await?;
    // The primary's manager sets the new passwords.
    let written = write_through_rw(&env, "sec", &new, "insert into t values (1)").await?;
    println!("the new app password works after {written:?}");
    let primary = env.current_primary("sec").await?;
    let ip = env.pod_ip(&primary).await?;
    assert!(
        connect(&ip, &old).await.is_err(),
        "the old password is gone"
    );
    let standby = env
        .pod_ips("sec")
        .await?
        .into_iter()
        .find(|(n, _)| *n != primary)
        .ok_or("no standby")?;
    wait_rows(&standby.0, &standby.1, &new, "t", 1).await?;
    // Replication logs in with its certificate only: no password opens it, not even the
    // Secret's (PostgreSQL asks for the client certificate this login lacks).
    let login = tokio_postgres::Config::new()
        .host(&ip)
        .port(5432)
        .user("streaming_replica")
        .dbname("postgres")
        .password(&new_replication)
        .connect_timeout(std::time::Duration::from_secs(5))
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect(pgop_tls::postgres::PostgresTls::without_verification()?)
        .await;
    let refused = login.err().map(|e| format!("{e:?}")).unwrap_or_default();
    assert!(
        refused.contains("requires a valid client certificate"),
        "the replication user logs in with a password: {refused}"
    );
    env.wait_ready("sec", 2).await?;

    // Rotation by the user: a password of their own, with every character that could
    // break a statement, a connection string or a URI. PostgreSQL takes it, refuses the
    // one before, and the Secret's `uri` follows it (percent-encoded).
    let chosen = r#"it's "mine" \ p@ss:w/rd%$(x) #1"#;
    let patch = serde_json::json!({"stringData": {"password": chosen}});
    secrets
        .patch(
            "sec-app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    write_through_rw(&env, "sec", chosen, "insert into t values (2)").await?;
    assert!(
        connect(&ip, &new).await.is_err(),
        "the password before the user's is refused"
    );
    let uri = wait::until("the uri follows the new password", TIMEOUT, || async {
        let secret = secrets.get("sec-app").await.map_err(|e| e.to_string())?;
        let uri = secret
            .data
            .and_then(|d| d.get("uri").cloned())
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .unwrap_or_default();
        if uri.contains("it%27s%20%22mine%22%20%5C%20p%40ss%3Aw%2Frd%25%24%28x%29%20%231@") {
            Ok(uri)
        } else {
            Err(uri)
        }
    })
    .await?;
    println!(
        "a user's password works and the uri follows it: {}",
        uri.len()
    );
    env.wait_ready("sec", 2).await?;
    env.stop().await
}

/// The instance runs with the spec's restart-only parameters and has none pending: it
/// started with them, no restart was needed.
async fn started_with_the_spec(name: &str, c: &tokio_postgres::Client) -> Result {
    let row = c
        .query_one(
            "select current_setting('max_connections'), current_setting('shared_buffers'),
                    (select count(*) from pg_settings where pending_restart)",
            &[],
        )
        .await?;
    let (max, buffers, pending): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (max.as_str(), buffers.as_str(), pending),
        ("150", "48MB", 0),
        "{name}"
    );
    Ok(())
}

/// Under constant writes a healthy cluster does not rewrite its status for every new WAL
/// position: the positions are published at most once a minute while nothing else about
/// the instances changes (`status.positionsObservedAt`). Counted from a watch on the
/// cluster over 45 s of writing; before, every pass (1 s) wrote new positions.
#[tokio::test]
async fn e2e_a_cluster_under_write_load_writes_its_status_at_most_once_a_minute() -> Result {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let _serial = SERIAL.lock().await;
    let env = start("e2e-quiet").await?;
    env.create(
        "quiet",
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready("quiet", 2).await?;
    let password = env.password("quiet").await?;
    write_through_rw(
        &env,
        "quiet",
        &password,
        "create table acked(id bigint primary key)",
    )
    .await?;
    let writer = Writer::start(&env, "quiet", &password);
    // Settle: the first positions after the table exist.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let config = watcher::Config::default().fields("metadata.name=quiet");
    let mut events = std::pin::pin!(watcher::watcher(env.clusters(), config));
    let mut versions = std::collections::BTreeSet::new();
    let window = tokio::time::sleep(std::time::Duration::from_secs(45));
    tokio::pin!(window);
    loop {
        tokio::select! {
            () = &mut window => break,
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) => {
                    versions.insert(c.metadata.resource_version.unwrap_or_default());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => break,
            }
        }
    }
    let acked = writer.stop().await?;
    assert!(acked.len() > 100, "the writer committed {}", acked.len());
    let status = env
        .clusters()
        .get("quiet")
        .await?
        .status
        .unwrap_or_default();
    assert!(status.positions_observed_at.is_some());
    // The version seen when the watch started, and at most one publication of positions.
    assert!(
        versions.len() <= 2,
        "{} versions of the cluster in 45 s of writes ({} commits)",
        versions.len(),
        acked.len()
    );
    println!(
        "{} versions of the cluster in 45 s of {} commits",
        versions.len(),
        acked.len()
    );
    env.stop().await
}
