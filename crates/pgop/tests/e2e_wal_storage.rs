//! `spec.walStorage` end to end on the local node with real PostgreSQL: each instance gets a
//! second claim, `<instance>-wal`, and its `PGDATA/pg_wal` is a link to `pg_wal` on that
//! volume, whichever way its data directory was made (initdb on the first primary,
//! pg_basebackup on the standbys, pg_rewind of a failed primary). The WAL PostgreSQL writes
//! is in that directory. A cluster made without `walStorage` gets it later: the instances
//! are rolled one by one and each moves its WAL over at its start, with a writer committing
//! throughout and every acknowledged row still there. Removing `walStorage` again turns the
//! cluster Invalid and touches nothing.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use pgop_api::cluster::ClusterPhase;
use serde_json::json;
use std::path::PathBuf;

/// The directory on this machine that backs the claim's volume.
async fn claim_dir(env: &Env, claim: &str) -> Result<PathBuf> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), env.n())
        .get(claim)
        .await?;
    let pv_name = pvc
        .spec
        .and_then(|s| s.volume_name)
        .ok_or_else(|| format!("{claim} is not bound"))?;
    let pv = Api::<PersistentVolume>::all(env.client.clone())
        .get(&pv_name)
        .await?;
    Ok(pgop_testenv::node::provisioner_host_path(&pv).ok_or("no host path")?)
}

/// Checks that `instance`'s `PGDATA/pg_wal` links to `pg_wal` on its WAL claim, and that
/// the WAL segment `segment` (when given) is there; returns the number of segments there.
async fn wal_on_its_volume(env: &Env, instance: &str, segment: Option<&str>) -> Result<usize> {
    let pg_wal = claim_dir(env, instance).await?.join("pgdata/pg_wal");
    let wal_dir = claim_dir(env, &pgop_api::labels::wal_claim(instance))
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
        let pg_wal = claim_dir(&env, &pod).await?.join("pgdata/pg_wal");
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
                    let dir = claim_dir(env, pod).await.map_err(|e| e.to_string())?;
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
