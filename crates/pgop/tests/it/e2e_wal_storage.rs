//! `spec.walStorage` end to end on the local node with real PostgreSQL: each instance gets a
//! second claim, `<instance>-wal`, and its `PGDATA/pg_wal` is a link to `pg_wal` on that
//! volume, whichever way its data directory was made (initdb on the first primary,
//! pg_basebackup on the standbys, pg_rewind of a failed primary). The WAL PostgreSQL writes
//! is in that directory. A cluster made without `walStorage` gets it later: the instances
//! are rolled one by one and each moves its WAL over at its start, with a writer committing
//! throughout and every acknowledged row still there. Removing `walStorage` again turns the
//! cluster Invalid and touches nothing. A second test takes the two other ways a data
//! directory is made: pg_upgrade's new cluster (15 to 18 in place) and a restore from the
//! backup the upgrade took first, into a new cluster with `walStorage`.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::PostParams;
use pgop_api::cluster::{ClusterPhase, MajorUpgradePhase};
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use serde_json::json;

/// Checks that `instance`'s `PGDATA/pg_wal` links to `pg_wal` on its WAL claim, and that
/// the WAL segment `segment` (when given) is there; returns the number of segments there.
async fn wal_on_its_volume(env: &Env, instance: &str, segment: Option<&str>) -> Result<usize> {
    let pg_wal = env.claim_dir(instance).await?.join("pgdata/pg_wal");
    let wal_dir = env
        .claim_dir(&pgop_api::labels::wal_claim(instance))
        .await?
        .join("pg_wal");
    let link = std::fs::read_link(&pg_wal)
        .map_err(|e| format!("{}: not a link ({e})", pg_wal.display()))?;
    assert_eq!(link, wal_dir, "{instance}: pg_wal links to its WAL volume");
    let segments = std::fs::read_dir(&wal_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.len() == 24 && name.chars().all(|c| c.is_ascii_hexdigit())
        })
        .count();
    assert!(
        segments > 0,
        "{instance}: no WAL segment in {}",
        wal_dir.display()
    );
    if let Some(segment) = segment {
        assert!(
            wal_dir.join(segment).is_file(),
            "{instance}: {segment} is not in {}",
            wal_dir.display()
        );
    }
    Ok(segments)
}

async fn claim_names(env: &Env) -> Result<Vec<String>> {
    let mut names: Vec<String> =
        Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), env.n())
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
    names.sort();
    Ok(names)
}

#[tokio::test]
async fn e2e_wal_storage_holds_the_wal_through_bootstrap_clone_rewind_and_a_later_move() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("walstorage").await?;

    // 1. Made with a WAL volume: initdb's primary and two clones.
    let name = "wal";
    env.create(
        name,
        json!({"replicas": 3, "storage": {"size": "1Gi"}, "walStorage": {"size": "512Mi"}}),
    )
    .await?;
    env.wait_ready(name, 3).await?;
    assert_eq!(
        claim_names(&env).await?,
        [
            "wal-1",
            "wal-1-wal",
            "wal-2",
            "wal-2-wal",
            "wal-3",
            "wal-3-wal"
        ]
    );
    let password = env.password(name).await?;
    let primary = env.current_primary(name).await?;
    let app = connect(&env.pod_ip(&primary).await?, &password).await?;
    app.batch_execute("create table t (id int); insert into t select generate_series(1, 100)")
        .await?;
    let row = app
        .query_one("select pg_walfile_name(pg_current_wal_lsn())", &[])
        .await?;
    let segment: String = row.get(0);
    for (pod, _) in env.pod_ips(name).await? {
        let segments = wal_on_its_volume(&env, &pod, (pod == primary).then_some(&*segment)).await?;
        eprintln!("{pod}: {segments} WAL segments on its WAL volume");
    }
    rows_everywhere(&env, name, &password, "t", 100).await?;

    // 2. A failover: the old primary is rewound (pg_rewind through the link) and follows.
    let (old, new) = fail_over_after_kill(&env, name, &password).await?;
    eprintln!("failed over from {old} to {new}");
    for (pod, _) in env.pod_ips(name).await? {
        wal_on_its_volume(&env, &pod, None).await?;
    }

    // 3. walStorage may not go: Invalid, nothing touched, and back once it is restored.
    env.patch(name, json!({"spec": {"walStorage": null}}))
        .await?;
    let invalid = env
        .wait_cluster(name, "Invalid without walStorage", TIMEOUT, |s| {
            s.phase == Some(ClusterPhase::Invalid)
        })
        .await?;
    let message = invalid
        .status
        .as_ref()
        .and_then(|s| {
            pgop_api::conditions::find_condition(&s.conditions, pgop_api::conditions::SPEC_VALID)
        })
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("spec.walStorage") && message.contains("may not be removed"),
        "{message}"
    );
    assert_eq!(claim_names(&env).await?.len(), 6, "no claim deleted");
    env.patch(name, json!({"spec": {"walStorage": {"size": "512Mi"}}}))
        .await?;
    env.wait_ready(name, 3).await?;
    rows_everywhere(&env, name, &password, "t", 101).await?;

    // 4. Added to a running cluster: rolled one instance at a time, under writes.
    let later = "later";
    env.create(later, json!({"replicas": 2, "storage": {"size": "1Gi"}}))
        .await?;
    env.wait_ready(later, 2).await?;
    let password = env.password(later).await?;
    let primary = env.current_primary(later).await?;
    let app = connect(&env.pod_ip(&primary).await?, &password).await?;
    app.batch_execute(
        "create table acked (id bigint primary key); \
         create table t (id int); insert into t select generate_series(1, 1000)",
    )
    .await?;
    for (pod, _) in env.pod_ips(later).await? {
        let pg_wal = env.claim_dir(&pod).await?.join("pgdata/pg_wal");
        assert!(
            std::fs::symlink_metadata(&pg_wal)?.is_dir(),
            "{pod}: pg_wal in PGDATA"
        );
    }
    let writer = Writer::start(&env, later, &password);
    env.patch(later, json!({"spec": {"walStorage": {"size": "512Mi"}}}))
        .await?;
    let pods = env.pods();
    let rolled = pgop_testenv::wait::until(
        "both instances rolled onto their WAL volumes",
        TIMEOUT,
        || {
            let env = &env;
            let pods = &pods;
            async move {
                for pod in ["later-1", "later-2"] {
                    let p = pods.get(pod).await.map_err(|e| e.to_string())?;
                    let wal_env = p
                        .spec
                        .iter()
                        .flat_map(|s| &s.containers)
                        .flat_map(|c| c.env.iter().flatten())
                        .any(|e| e.name == "PGOP_WAL_DIR");
                    if !wal_env {
                        return Err(format!("{pod} not rolled yet"));
                    }
                    let dir = env.claim_dir(pod).await.map_err(|e| e.to_string())?;
                    if std::fs::read_link(dir.join("pgdata/pg_wal")).is_err() {
                        return Err(format!("{pod}: pg_wal not moved yet"));
                    }
                }
                Ok(())
            }
        },
    );
    rolled.await?;
    env.wait_ready(later, 2).await?;
    // A few more commits after the roll, then every acknowledged one must be there.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let acked = writer.stop().await?;
    assert!(!acked.is_empty(), "the writer committed nothing");
    for (pod, _) in env.pod_ips(later).await? {
        wal_on_its_volume(&env, &pod, None).await?;
    }
    let max = *acked.iter().max().ok_or("no commit")?;
    let primary = env.current_primary(later).await?;
    let app = connect(&env.pod_ip(&primary).await?, &password).await?;
    let lost: i64 = app
        .query_one(
            "select count(*) from unnest($1::bigint[]) a(id) where not exists \
             (select 1 from acked where acked.id = a.id)",
            &[&acked],
        )
        .await?
        .get(0);
    eprintln!(
        "{} commits acknowledged while walStorage was added (last id {max}), {lost} lost",
        acked.len()
    );
    assert_eq!(lost, 0, "acknowledged commits lost");
    rows_everywhere(&env, later, &password, "t", 1000).await?;
    env.stop().await
}

#[tokio::test]
async fn e2e_wal_storage_holds_the_wal_of_an_upgraded_cluster_and_of_a_restored_one() -> Result {
    if pgop_instance::Binaries::for_major(18, None).is_err() {
        return Err("PostgreSQL 18 is not installed: run hack/install-postgres18.sh".into());
    }
    let _serial = SERIAL.lock().await;
    let env = start("walupgrade").await?;
    let s3 = S3Server::start(&env.plane.dir().join("s3-walstorage"))?;
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "s3"}, "stringData":
        {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}}))?;
    Api::<Secret>::namespaced(env.client.clone(), env.n())
        .create(&PostParams::default(), &secret)
        .await?;
    let store = json!({"s3": {"bucket": BUCKET, "endpoint": s3.endpoint(), "region": "us-east-1",
        "path": "walstorage", "credentialsSecret": {"name": "s3"}}});
    let name = "upg";
    env.create(
        name,
        // archive_timeout 5s: the upgrade's backup waits for its last WAL file in the
        // store, which the default (60 s) leaves to the next minute on an idle primary; a
        // loaded CI machine once took past the backup's 120 s that way.
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "walStorage": {"size": "512Mi"},
               "postgresql": {"parameters": {"archive_timeout": "5s"}},
               "backup": {"store": store}}),
    )
    .await?;
    env.wait_ready(name, 2).await?;
    let password = env.password(name).await?;
    write_through_rw(
        &env,
        name,
        &password,
        "create table t (id int); insert into t select generate_series(1, 1000)",
    )
    .await?;

    // pg_upgrade's new cluster (its WAL in PGDATA) is moved onto the volume at its start;
    // the standby is cloned afresh at 18.
    env.patch(name, json!({"spec": {"postgresVersion": 18}}))
        .await?;
    let done = env
        .wait_cluster(
            name,
            "the upgrade completed",
            std::time::Duration::from_secs(300),
            |s| {
                if let Some(u) = s
                    .major_upgrade
                    .as_ref()
                    .filter(|u| u.phase == MajorUpgradePhase::Failed)
                {
                    panic!("the upgrade failed: {:?}", u.message);
                }
                s.major_upgrade
                    .as_ref()
                    .is_some_and(|u| u.phase == MajorUpgradePhase::Completed)
            },
        )
        .await?;
    let backup = done
        .status
        .and_then(|s| s.major_upgrade)
        .and_then(|u| u.backup)
        .ok_or("the upgrade named no backup")?;
    env.wait_ready(name, 2).await?;
    for (pod, ip) in env.pod_ips(name).await? {
        wal_on_its_volume(&env, &pod, None).await?;
        let version: String = connect(&ip, &password)
            .await?
            .query_one("show server_version_num", &[])
            .await?
            .get(0);
        assert!(version.starts_with("18"), "{pod} runs {version}");
    }
    rows_everywhere(&env, name, &password, "t", 1000).await?;

    // A restore (the base backup unpacked into PGDATA, then WAL replayed) into a new
    // cluster with walStorage: its WAL ends up on its volume too.
    env.create(
        "restored",
        json!({"replicas": 1, "storage": {"size": "1Gi"}, "walStorage": {"size": "512Mi"},
               "bootstrap": {"recovery": {"backup": backup}}}),
    )
    .await?;
    env.wait_ready("restored", 1).await?;
    wal_on_its_volume(&env, "restored-1", None).await?;
    let restored_password = env.password("restored").await?;
    let ip = env.pod_ip("restored-1").await?;
    assert_eq!(count_on(&ip, &restored_password, "t").await?, 1000);
    write_through_rw(
        &env,
        "restored",
        &restored_password,
        "insert into t values (1001)",
    )
    .await?;
    drop(s3);
    env.stop().await
}
