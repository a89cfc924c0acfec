//! The in-place major upgrade end to end on the local node, PostgreSQL 15 to 18 (18 from
//! `hack/install-postgres18.sh`), with a real S3 store: a cluster of three with data, a
//! declared role and two extensions that both majors ship.
//! 1. Raised to 18 while a table has an `aclitem` column, which pg_upgrade refuses: the
//!    base backup is taken, the Pods go, the primary's manager reports the refusal, and the
//!    upgrade is `Failed`; the cluster runs 15 again with every row.
//! 2. The version set back to 15 (the failure cleared), the column dropped, raised again: a
//!    new backup, pg_upgrade `--link`, the standbys cloned; `Completed`, every instance on
//!    18 with the same rows (count and checksum), role and extensions; a base backup of 18
//!    is taken after.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use pgop_api::backup::{BackupPhase, PostgresBackup};
use pgop_api::cluster::{MajorUpgradeMode, MajorUpgradePhase};
use pgop_api::conditions;
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use pgop_testenv::wait;
use serde_json::json;
use std::time::{Duration, Instant};

const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);

/// Row count and a checksum of table `t`, and the declared role and the extensions, as
/// one instance answers.
async fn fingerprint(ip: &str, password: &str) -> Result<(i64, String, bool, Vec<String>)> {
    let c = connect(ip, password).await?;
    let row = c
        .query_one(
            "select count(*), md5(string_agg(id::text || ':' || v || ':' || (h -> 'k') || ':' || n::text, ',' order by id)) from t",
            &[],
        )
        .await?;
    let role = c
        .query_one(
            "select count(*) = 1 from pg_roles where rolname = 'reporting' and rolcanlogin",
            &[],
        )
        .await?;
    let extensions = c
        .query(
            "select extname::text from pg_extension where extname <> 'plpgsql' order by 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok((row.get(0), row.get(1), role.get(0), extensions))
}

/// Every instance's fingerprint is `expected`.
async fn same_everywhere(
    env: &Env,
    name: &str,
    password: &str,
    expected: &(i64, String, bool, Vec<String>),
) -> Result {
    for (pod, ip) in env.pod_ips(name).await? {
        let seen = wait::until(&format!("{pod}'s data"), TIMEOUT, || async {
            match fingerprint(&ip, password).await {
                Ok(f) if &f == expected => Ok(f),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
        assert_eq!(&seen, expected, "{pod}");
    }
    Ok(())
}

/// Every instance reports PostgreSQL `major` in the status and answers as it.
async fn every_instance_on(env: &Env, name: &str, password: &str, major: i32, n: usize) -> Result {
    let prefix = format!("{major}.");
    env.wait_cluster(
        name,
        &format!("{n} ready on {major}"),
        UPGRADE_TIMEOUT,
        |s| {
            s.instances.len() == n
                && s.instances.iter().all(|i| {
                    i.ready
                        && i.postgres_version
                            .as_deref()
                            .is_some_and(|v| v.starts_with(&prefix))
                })
        },
    )
    .await?;
    for (pod, ip) in env.pod_ips(name).await? {
        let c = connect(&ip, password).await?;
        let version: String = c.query_one("show server_version", &[]).await?.get(0);
        assert!(version.starts_with(&prefix), "{pod} runs {version}");
    }
    Ok(())
}

async fn backup_phase(env: &Env, name: &str) -> Option<BackupPhase> {
    let api: Api<PostgresBackup> = Api::namespaced(env.client.clone(), env.n());
    api.get_opt(name).await.ok()??.status?.phase
}

#[tokio::test]
async fn e2e_a_cluster_of_15_is_upgraded_in_place_to_18_after_a_refused_attempt() -> Result {
    if pgop_instance::Binaries::for_major(18, None).is_err() {
        return Err("PostgreSQL 18 is not installed: run hack/install-postgres18.sh".into());
    }
    let _serial = SERIAL.lock().await;
    let env = start("upgrade").await?;
    let s3 = S3Server::start(&env.plane.dir().join("s3-upgrade"))?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), env.n());
    for (name, data) in [
        (
            "s3",
            json!({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}),
        ),
        (
            "reporting-password",
            json!({"password": "reporting-secret"}),
        ),
    ] {
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data}))?;
        secrets.create(&PostParams::default(), &secret).await?;
    }
    let name = "db";
    env.create(
        name,
        json!({"replicas": 3, "storage": {"size": "1Gi"},
               "roles": [{"name": "reporting", "login": true,
                          "passwordSecret": {"name": "reporting-password"}}],
               "backup": {"store": {"s3": {
                   "bucket": BUCKET, "endpoint": s3.endpoint(), "region": "us-east-1",
                   "path": "upgrade", "credentialsSecret": {"name": "s3"}}}}}),
    )
    .await?;
    eprintln!("[upgrade test] cluster created");
    env.wait_ready(name, 3).await?;
    let password = env.password(name).await?;
    every_instance_on(&env, name, &password, 15, 3).await?;
    write_through_rw(
        &env,
        name,
        &password,
        "create extension hstore; create extension citext;
         create table t (id int primary key, v citext not null, h hstore, n numeric);
         insert into t select i, 'row ' || i, hstore('k', (i * 7)::text), i / 3.0
           from generate_series(1, 5000) i;
         create table grants (a aclitem); insert into grants values ('app=r/app')",
    )
    .await?;
    env.wait_cluster(name, "the role applied", TIMEOUT, |s| {
        s.roles.iter().any(|r| r.name == "reporting" && r.applied)
    })
    .await?;
    let primary_ip = env.pod_ip(&env.current_primary(name).await?).await?;
    let before = fingerprint(&primary_ip, &password).await?;
    assert_eq!(before.0, 5000);
    assert!(before.2, "the declared role exists");
    assert_eq!(before.3, ["citext", "hstore"]);
    same_everywhere(&env, name, &password, &before).await?;

    eprintln!("[upgrade test] data written and read everywhere");
    // 1. Refused by pg_upgrade (aclitem's format changed in 16): Failed, 15 again.
    env.patch(name, json!({"spec": {"postgresVersion": 18}}))
        .await?;
    let failed = env
        .wait_cluster(name, "the upgrade failed", UPGRADE_TIMEOUT, |s| {
            s.major_upgrade
                .as_ref()
                .is_some_and(|u| u.phase == MajorUpgradePhase::Failed)
        })
        .await?;
    eprintln!("[upgrade test] failed as expected");
    let status = failed.status.unwrap_or_default();
    let record = status.major_upgrade.clone().ok_or("no record")?;
    assert_eq!((record.from, record.to), (15, 18));
    assert_eq!(record.mode, MajorUpgradeMode::Link);
    let message = record.message.clone().unwrap_or_default();
    assert!(message.contains("aclitem"), "{message}");
    let first_backup = record.backup.clone().ok_or("no backup named")?;
    assert_eq!(
        backup_phase(&env, &first_backup).await,
        Some(BackupPhase::Completed)
    );
    let condition = conditions::find_condition(&status.conditions, conditions::MAJOR_UPGRADED)
        .ok_or("no MajorUpgraded condition")?;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        (conditions::FALSE, "Failed")
    );
    eprintln!("[upgrade test] waiting for the Failed event");
    env.wait_event("MajorUpgradeFailed").await?;
    eprintln!("[upgrade test] waiting for 15 again");
    env.wait_ready(name, 3).await?;
    every_instance_on(&env, name, &password, 15, 3).await?;
    same_everywhere(&env, name, &password, &before).await?;
    let s = env.clusters().get(name).await?.status.unwrap_or_default();
    assert_eq!(s.postgres_version, Some(15));
    eprintln!("[upgrade test] 15 again with every row");

    // 2. Back to 15 (the failed attempt is over), the column gone, raised again.
    env.patch(name, json!({"spec": {"postgresVersion": 15}}))
        .await?;
    // The failed attempt is over once a pass has seen the version back.
    env.wait_cluster(name, "the failure cleared", TIMEOUT, |s| {
        s.major_upgrade.is_none()
            && conditions::find_condition(&s.conditions, conditions::MAJOR_UPGRADED).is_none()
    })
    .await?;
    write_through_rw(&env, name, &password, "drop table grants").await?;
    // A second apart from the first attempt: the backup names carry the start second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.patch(name, json!({"spec": {"postgresVersion": 18}}))
        .await?;
    let started = Instant::now();
    let stopping = env
        .wait_cluster(name, "the Pods stopping", UPGRADE_TIMEOUT, |s| {
            s.major_upgrade.as_ref().is_some_and(|u| {
                u.backup.as_deref() != Some(first_backup.as_str())
                    && matches!(
                        u.phase,
                        MajorUpgradePhase::Stopping
                            | MajorUpgradePhase::Upgrading
                            | MajorUpgradePhase::Cloning
                            | MajorUpgradePhase::Completed
                    )
            })
        })
        .await?;
    let backed_up = started.elapsed();
    eprintln!("[upgrade test] backed up in {backed_up:?}");
    let done = env
        .wait_cluster(name, "the upgrade completed", UPGRADE_TIMEOUT, |s| {
            s.major_upgrade
                .as_ref()
                .is_some_and(|u| u.phase == MajorUpgradePhase::Completed)
        })
        .await?;
    // The write downtime is measured by `cargo bench -p pgop --bench upgrade`.
    eprintln!(
        "[upgrade test] upgrade 15 -> 18 (link): backup {backed_up:?}, completed after {:?}",
        started.elapsed()
    );
    let status = done.status.unwrap_or_default();
    let record = status.major_upgrade.clone().ok_or("no record")?;
    assert_eq!(status.postgres_version, Some(18));
    assert!(record.finished_at.is_some());
    let second_backup = record.backup.clone().ok_or("no backup named")?;
    assert_ne!(second_backup, first_backup);
    assert_eq!(
        stopping
            .status
            .and_then(|s| s.major_upgrade)
            .map(|u| u.mode),
        Some(MajorUpgradeMode::Link)
    );
    assert_eq!(
        backup_phase(&env, &second_backup).await,
        Some(BackupPhase::Completed)
    );
    let condition = conditions::find_condition(&status.conditions, conditions::MAJOR_UPGRADED)
        .ok_or("no MajorUpgraded condition")?;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        (conditions::TRUE, "Completed")
    );
    env.wait_event("MajorUpgradeCompleted").await?;
    eprintln!("[upgrade test] completed; checking the data");
    env.wait_ready(name, 3).await?;
    every_instance_on(&env, name, &password, 18, 3).await?;
    same_everywhere(&env, name, &password, &before).await?;
    // Replication runs on 18: a write reaches every instance.
    write_through_rw(
        &env,
        name,
        &password,
        "insert into t values (5001, 'after', hstore('k', 'v'), 1)",
    )
    .await?;
    rows_everywhere(&env, name, &password, "t", 5001).await?;
    // The first base backup of 18 (the older ones cannot be restored with 18's WAL).
    let after = pgop_operator::cluster::upgrade::after_backup_name(
        &env.clusters_v1beta1().get(name).await?,
        &record,
    );
    wait::until(
        &format!("backup {after} completed"),
        UPGRADE_TIMEOUT,
        || async {
            match backup_phase(&env, &after).await {
                Some(BackupPhase::Completed) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    env.stop().await
}
