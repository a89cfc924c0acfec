//! Backups on real nodes (issue 13): an S3 server (`s3s-fs`) in the nodes' network,
//! published as a Service; pgop installed by its chart; a 2-instance cluster archiving its
//! WAL continuously and taking a scheduled base backup on its standby; then a writer Pod
//! writes through `-rw` by DNS name, and a new cluster restored from that backup to a
//! point in time between two writes has exactly the writes before it; a logical backup,
//! and its `app` database restored by a Pod with `pgop backup logical restore` into a
//! third cluster. Every client is a Pod and reaches PostgreSQL and the store through
//! Services. Needs root.

use crate::real;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use pgop_api::backup::{BackupMethod, BackupPhase, PostgresBackup};
use pgop_api::conditions;
use pgop_backup::config::CONFIG_FORMAT;
use pgop_backup::{Location, S3Location, StoreConfig};
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, SECRET_KEY};
use real::{
    RealEnv, Result, SERIAL, client_pod, eventually, finished, infra_placement, psql_retrying,
};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const NS: &str = "backups";
/// The key prefix of every cluster's backups in the bucket.
const PREFIX: &str = "real";

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn store(endpoint: &str) -> serde_json::Value {
    json!({"s3": {"bucket": BUCKET, "endpoint": endpoint, "region": "us-east-1",
                  "path": PREFIX, "credentialsSecret": {"name": "s3"}}})
}

/// Runs a client Pod (pgop's image, on the infrastructure node, as `secret`'s user) that
/// runs `script` with its output in `/out`; returns the file `/out/result` once the Pod
/// exited 0.
async fn run_pod(env: &RealEnv, name: &str, secret: &str, script: &str) -> Result<String> {
    run_pod_with(
        env,
        client_pod(
            name,
            &env.images.pgop.name,
            secret,
            script,
            infra_placement(),
        )?,
    )
    .await
}

async fn run_pod_with(env: &RealEnv, pod: Pod) -> Result<String> {
    let pods = env.pods(NS);
    let created = pods.create(&PostParams::default(), &pod).await?;
    let name = created.metadata.name.clone().ok_or("no name")?;
    let uid = created.metadata.uid.ok_or("no uid")?;
    let (code, message) = finished(&pods, &name, Duration::from_secs(180)).await;
    if code != 0 {
        return Err(format!("{name} exited {code}: {message}").into());
    }
    let node = env.node_of(NS, &name).await?;
    let index = env.nodes.index_of(&node).ok_or("the client's node")?;
    Ok(std::fs::read_to_string(
        env.nodes.empty_dir(index, &uid, "out").join("result"),
    )?)
}

/// The ids of table `w`, read through `<cluster>-rw` by DNS name.
async fn ids_through_rw(env: &RealEnv, cluster: &str, pod: &str) -> Result<BTreeSet<u64>> {
    let out = run_pod(
        env,
        pod,
        &format!("{cluster}-app"),
        &psql_retrying(
            &format!("{cluster}-rw.{NS}.svc.cluster.local"),
            "-c 'select id from w order by id' > /out/result",
        ),
    )
    .await?;
    Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

async fn backups(env: &RealEnv) -> Result<Vec<PostgresBackup>> {
    let api: Api<PostgresBackup> = Api::namespaced(env.client.clone(), NS);
    Ok(api.list(&ListParams::default()).await?.items)
}

fn completed(b: &PostgresBackup) -> bool {
    b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Completed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archiving_a_scheduled_backup_pitr_and_a_logical_backup_on_real_nodes() -> Result {
    let _serial = SERIAL.lock().await;
    let env = RealEnv::start(2, true).await?;
    let infra = RealEnv::on_infra();
    let extra: Vec<&str> = infra.iter().map(String::as_str).collect();
    env.install_operator(&extra).await?;
    env.restricted_namespace(NS).await?;

    // The store: s3s-fs in the nodes' network, published as Service `s3` in the namespace,
    // and its keys in the Secret the cluster names.
    let step = Instant::now();
    let s3 = env.nodes.start_s3().await?;
    let endpoint = s3.publish(&env.client, NS, "s3").await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    println!(
        "S3 server at {} published as {endpoint} in {:.1?}",
        s3.endpoint(),
        step.elapsed()
    );

    // A cluster archiving into it, with a base backup every minute (the shortest cron
    // allows). archive_timeout 5s: a WAL file reaches the store at most 5 s after a commit.
    let step = Instant::now();
    env.create_cluster(
        NS,
        "src",
        json!({"replicas": 2, "storage": {"size": "1Gi"},
               "postgresql": {"parameters": {"archive_timeout": "5s"}},
               "backup": {"schedule": "* * * * *", "retentionDays": 7,
                          "store": store(&endpoint)}}),
    )
    .await?;
    env.wait_ready(NS, "src", 2, Duration::from_secs(300)).await;
    println!("src Ready in {:.1?}", step.elapsed());
    // A firing before both instances were ready (its backup made while the standby still
    // cloned) is taken on the primary, as designed: the test waits for one made after.
    let ready_at = jiff::Timestamp::now();

    // Continuous archiving: the condition, and WAL files in the store.
    let step = Instant::now();
    let clusters = env.clusters(NS);
    let wal_prefix = format!("{PREFIX}/src/pgop-v1/wal");
    eventually(
        "WAL archived (ContinuousArchiving True, WAL in the store)",
        Duration::from_secs(120),
        || async {
            let c = clusters.get("src").await.map_err(|e| e.to_string())?;
            let s = c.status.unwrap_or_default();
            let archived = s3.keys(&wal_prefix);
            if conditions::is_true(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
                && !archived.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "conditions {:?}, archived {archived:?}",
                    s.conditions
                ))
            }
        },
    )
    .await;
    println!(
        "ContinuousArchiving True with {} WAL objects in the store after {:.1?}",
        s3.keys(&wal_prefix).len(),
        step.elapsed()
    );

    // The schedule fires within a minute (two, when the first firing came before the
    // standby was ready); the backup is taken on the standby.
    let step = Instant::now();
    let scheduled = eventually(
        "a scheduled base backup completes",
        Duration::from_secs(300),
        || async {
            let all = backups(&env).await.map_err(|e| e.to_string())?;
            all.iter()
                .find(|b| {
                    completed(b)
                        && b.spec.cluster.name == "src"
                        && b.spec.method.unwrap_or_default() == BackupMethod::BaseBackup
                        && b.metadata.annotations.as_ref().is_some_and(|a| {
                            a.contains_key(pgop_api::constants::ANNOTATION_SCHEDULED)
                        })
                        && b.metadata
                            .creation_timestamp
                            .as_ref()
                            .is_some_and(|t| t.0 > ready_at)
                })
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "{:?}",
                        all.iter()
                            .map(|b| (
                                b.metadata.name.clone(),
                                b.status.as_ref().and_then(|s| s.phase)
                            ))
                            .collect::<Vec<_>>()
                    )
                })
        },
    )
    .await;
    // Every backup so far (the schedule may have fired before the one that completed).
    for b in backups(&env).await? {
        let s = b.status.unwrap_or_default();
        println!(
            "  PostgresBackup {:?}: {:?} on {:?}{}",
            b.metadata.name.unwrap_or_default(),
            s.phase,
            s.instance,
            s.error.map(|e| format!(", error: {e}")).unwrap_or_default()
        );
    }
    let backup_name = scheduled.metadata.name.clone().ok_or("no name")?;
    let bs = scheduled.status.clone().unwrap_or_default();
    let backup_id = bs.backup_id.clone().ok_or("no backupId")?;
    println!(
        "scheduled base backup {backup_name} ({backup_id}, {} bytes stored, on {:?}) completed {:.1?} after archiving was seen; it ran {:?} → {:?}",
        bs.stored_bytes.unwrap_or(0),
        bs.instance,
        step.elapsed(),
        bs.started_at.as_ref().map(|t| t.0.to_string()),
        bs.stopped_at.as_ref().map(|t| t.0.to_string()),
    );
    // The cluster's status follows on its next reconcile.
    let src = eventually(
        "src's status shows the backup",
        Duration::from_secs(60),
        || async {
            let s = clusters
                .get("src")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            if s.last_backup_time.is_some()
                && conditions::is_true(&s.conditions, conditions::BACKUP_SUCCEEDED)
            {
                Ok(s)
            } else {
                Err(format!(
                    "lastBackupTime {:?}, conditions {:?}",
                    s.last_backup_time, s.conditions
                ))
            }
        },
    )
    .await;
    // Taken on the standby: the instance was not the primary when the backup began. A
    // change of primary since (a loaded machine can make one: a manager whose Lease
    // renewal misses steps down) may have made it the primary now, so the primary of the
    // time is the one before any change after the start.
    let changed_after_start = match (&src.target_primary_since, &bs.started_at) {
        (Some(since), Some(started)) => since.0 > started.0,
        _ => false,
    };
    if changed_after_start {
        println!(
            "the primary changed after the backup began (targetPrimarySince {:?}): taken on {:?}, primary now {:?}",
            src.target_primary_since, bs.instance, src.current_primary
        );
        assert!(bs.instance.is_some(), "the backup names its instance");
    } else {
        assert_ne!(bs.instance, src.current_primary, "taken on the standby");
    }
    let manifest = format!("{PREFIX}/src/pgop-v1/base/{backup_id}/backup.manifest");
    assert!(
        s3.object_file(&manifest).is_file(),
        "{manifest} in the store: {:?}",
        s3.keys(&format!("{PREFIX}/src/pgop-v1/base"))
    );

    // Writes through src-rw from a Pod, and a point in time between two of them, the
    // writer going on across it.
    let step = Instant::now();
    let writer = real::start_writer(&env, NS, "src", "w").await?;
    println!("writer writing through src-rw after {:.1?}", step.elapsed());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let target_secs = now();
    let target = jiff::Timestamp::from_microsecond((target_secs * 1e6) as i64)?.to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    writer.stop(&env.nodes).await?;
    let attempts = writer.read(&env.nodes);
    let before: BTreeSet<u64> = attempts
        .iter()
        .filter(|a| a.ok && a.end < target_secs)
        .map(|a| a.id)
        .collect();
    let after: BTreeSet<u64> = attempts
        .iter()
        .filter(|a| a.start > target_secs)
        .map(|a| a.id)
        .collect();
    let straddling: Vec<u64> = attempts
        .iter()
        .filter(|a| a.start <= target_secs && a.end >= target_secs)
        .map(|a| a.id)
        .collect();
    assert!(
        !before.is_empty() && !after.is_empty(),
        "writes on both sides of {target}"
    );
    let source_ids = ids_through_rw(&env, "src", "read-src").await?;
    let acknowledged: BTreeSet<u64> = attempts.iter().filter(|a| a.ok).map(|a| a.id).collect();
    assert!(
        acknowledged.is_subset(&source_ids),
        "every acknowledged write is in src"
    );

    // The WAL up to the writes after the target must be in the store before restoring to
    // it. One more commit, in a table of its own, after the writer's last: its WAL file
    // holds every write before it, and archive_timeout switches it out within 5 s (a file
    // with nothing but background records in it would wait for the next real write).
    let step = Instant::now();
    let current = run_pod(
        &env,
        "wal-src",
        "src-app",
        &psql_retrying(
            &format!("src-rw.{NS}.svc.cluster.local"),
            "-c 'create table wal_marker (at timestamptz default now())' \
             -c 'insert into wal_marker default values' \
             -c 'select pg_walfile_name(pg_current_wal_lsn())' > /out/result",
        ),
    )
    .await?;
    let current = current
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    let timeline = current.get(..8).ok_or("a WAL file name")?.to_string();
    eventually(
        &format!("{current} archived"),
        Duration::from_secs(300),
        || async {
            let archived: Vec<String> = s3
                .keys(&format!("{wal_prefix}/{timeline}"))
                .into_iter()
                .filter_map(|k| {
                    let name = k.rsplit('/').next()?.split('.').next()?.to_string();
                    (name.len() == 24).then_some(name)
                })
                .collect();
            match archived.iter().max() {
                Some(last) if *last >= current => Ok(()),
                last => Err(format!("last archived {last:?}")),
            }
        },
    )
    .await;
    // When each WAL object reached the store, relative to the writer's stop.
    let stopped = now() - step.elapsed().as_secs_f64();
    let arrivals: Vec<String> = s3
        .keys(&format!("{wal_prefix}/{timeline}"))
        .iter()
        .filter_map(|k| {
            let t = std::fs::metadata(s3.object_file(k)).ok()?.modified().ok()?;
            let t = t.duration_since(UNIX_EPOCH).ok()?.as_secs_f64() - stopped;
            Some(format!("{}@{t:+.1}s", k.rsplit('/').next()?))
        })
        .collect();
    println!("WAL objects and their arrival relative to the writer's stop: {arrivals:?}");
    println!(
        "{} writes before {target}, {} after, {} straddling it; WAL through {current} archived {:.1?} after the writer stopped",
        before.len(),
        after.len(),
        straddling.len(),
        step.elapsed()
    );

    // A new cluster restored from the scheduled backup to that time: exactly the writes
    // committed before it.
    let step = Instant::now();
    env.create_cluster(
        NS,
        "pitr",
        json!({"replicas": 1, "storage": {"size": "1Gi"},
               "backup": {"store": store(&endpoint)},
               "bootstrap": {"recovery": {"backup": backup_name, "targetTime": target}}}),
    )
    .await?;
    let pitr = env
        .wait_ready(NS, "pitr", 1, Duration::from_secs(300))
        .await;
    let source = pitr
        .status
        .and_then(|s| s.recovery_source)
        .ok_or("no recovery source in pitr's status")?;
    assert_eq!(source.cluster, "src");
    assert_eq!(source.backup_id.as_deref(), Some(backup_id.as_str()));
    println!(
        "pitr restored to {target} and Ready in {:.1?}",
        step.elapsed()
    );
    let restored = ids_through_rw(&env, "pitr", "read-pitr").await?;
    let missing: Vec<&u64> = before.difference(&restored).collect();
    let too_late: Vec<&u64> = after.intersection(&restored).collect();
    let unknown: Vec<&u64> = restored.difference(&source_ids).collect();
    println!(
        "pitr has {} rows: {} missing of the writes acknowledged before the target, {} written after it, {} unknown",
        restored.len(),
        missing.len(),
        too_late.len(),
        unknown.len()
    );
    assert!(
        missing.is_empty(),
        "writes before the target missing: {missing:?}"
    );
    assert!(
        too_late.is_empty(),
        "writes after the target present: {too_late:?}"
    );
    assert!(unknown.is_empty(), "rows src never had: {unknown:?}");
    // It archives on a timeline of its own, under its own name.
    let pitr_wal = format!("{PREFIX}/pitr/pgop-v1/wal");
    eventually(
        "pitr archives its new timeline under its own name",
        Duration::from_secs(120),
        || async {
            let keys = s3.keys(&pitr_wal);
            if keys.iter().any(|k| k.contains("00000002.history")) {
                Ok(())
            } else {
                Err(format!("{keys:?}"))
            }
        },
    )
    .await;

    // A logical backup on demand (the writer has stopped: src's rows are fixed).
    let step = Instant::now();
    let logical: PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresBackup",
        "metadata": {"name": "src-dump"},
        "spec": {"cluster": {"name": "src"}, "method": "logical"}
    }))?;
    let api: Api<PostgresBackup> = Api::namespaced(env.client.clone(), NS);
    api.create(&PostParams::default(), &logical).await?;
    let logical = eventually(
        "the logical backup completes",
        Duration::from_secs(180),
        || async {
            let b = api.get("src-dump").await.map_err(|e| e.to_string())?;
            match b.status.as_ref().and_then(|s| s.phase) {
                Some(BackupPhase::Completed) => Ok(b),
                Some(BackupPhase::Failed) => Ok(b),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let ls = logical.status.clone().unwrap_or_default();
    assert_eq!(ls.phase, Some(BackupPhase::Completed), "{ls:?}");
    let logical_id = ls.backup_id.clone().ok_or("no backupId")?;
    assert!(ls.databases.iter().any(|d| d == "app"), "{ls:?}");
    let logical_dir = format!("{PREFIX}/src/pgop-v1/logical/{logical_id}");
    let keys = s3.keys(&logical_dir);
    assert!(
        keys.contains(&format!("{logical_dir}/manifest.json"))
            && keys.contains(&format!("{logical_dir}/db/app.dump")),
        "{keys:?}"
    );
    println!(
        "logical backup {logical_id} of {:?} ({} bytes dumped, {} stored) completed in {:.1?}",
        ls.databases,
        ls.size_bytes.unwrap_or(0),
        ls.stored_bytes.unwrap_or(0),
        step.elapsed()
    );

    // Restored by hand, as the docs say, from a Pod: `pgop backup logical restore` of
    // database `app` into a new cluster's (empty) `app`, through its -rw Service.
    let step = Instant::now();
    env.create_cluster(
        NS,
        "copy",
        json!({"replicas": 1, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready(NS, "copy", 1, Duration::from_secs(300))
        .await;
    let config = StoreConfig {
        format: CONFIG_FORMAT,
        location: Location::S3(S3Location {
            bucket: BUCKET.into(),
            endpoint: Some(endpoint.clone()),
            region: Some("us-east-1".into()),
            access_key_id: ACCESS_KEY.into(),
            secret_access_key: SECRET_KEY.into(),
            insecure_skip_tls_verify: false,
        }),
        prefix: Some(PREFIX.into()),
        cluster: "src".into(),
    };
    let store_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "src-store"},
        "stringData": {"store.json": serde_json::to_string(&config)?},
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(&PostParams::default(), &store_secret)
        .await?;
    let mut pod = client_pod(
        "restore-logical",
        &env.images.pgop.name,
        "copy-app",
        // First, as a client would, wait until the new -rw Service answers: kube-proxy
        // may not have programmed its endpoint yet on this Pod's node ("No route to
        // host"), see `psql_retrying`.
        &format!(
            "{} && pgop backup logical restore --store-config /store/store.json \
             --backup-id {logical_id} --database app \
             --host copy-rw.{NS}.svc.cluster.local --user \"$PGUSER\" --scratch-dir /out \
             > /out/result",
            psql_retrying(
                &format!("copy-rw.{NS}.svc.cluster.local"),
                "-d app -c 'select 1' >/dev/null"
            )
        ),
        infra_placement(),
    )?;
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes
            .get_or_insert_with(Vec::new)
            .push(serde_json::from_value(json!({
                "name": "store", "secret": {"secretName": "src-store", "defaultMode": 0o440}
            }))?);
        if let Some(container) = spec.containers.first_mut() {
            container
                .volume_mounts
                .get_or_insert_with(Vec::new)
                .push(serde_json::from_value(json!({
                    "name": "store", "mountPath": "/store", "readOnly": true
                }))?);
        }
    }
    let out = run_pod_with(&env, pod).await?;
    println!("logical restore: {}", out.trim());
    let copied = ids_through_rw(&env, "copy", "read-copy").await?;
    assert_eq!(copied, source_ids, "the logical copy has src's rows");
    println!(
        "copy Ready and {} rows restored from the logical backup in {:.1?}",
        copied.len(),
        step.elapsed()
    );

    // No secret value in any log, Event or status this whole test produced.
    let mut secrets = vec![("the S3 secret key".to_string(), SECRET_KEY.to_string())];
    for cluster in ["src", "pitr", "copy"] {
        secrets.extend(real::secret_values(&env, NS, cluster).await?);
    }
    real::assert_no_secret_in_logs_events_or_status(&env, NS, &secrets).await?;

    println!("whole test {:.1?}", env.started.elapsed());
    drop(s3);
    Ok(())
}
