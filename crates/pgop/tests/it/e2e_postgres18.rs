//! PostgreSQL 18 end to end on the local node (`hack/install-postgres18.sh` builds it from
//! the source tarball of Debian's `postgresql-18` into /var/cache/pgop/postgresql/18): a cluster
//! with `spec.postgresVersion: 18` bootstraps, replicates, fails over after kill -9 of its
//! primary, and the old primary rejoins through pg_rewind, every instance running 18 and
//! reporting it; a lower version on the running cluster is refused.

use crate::common;

use common::*;
use serde_json::json;

/// Every instance runs PostgreSQL `major`: as its manager reports it in the status, and as
/// the server itself answers.
async fn every_instance_runs(env: &Env, name: &str, password: &str, major: &str) -> Result {
    let prefix = format!("{major}.");
    env.wait_cluster(
        name,
        &format!("every instance reporting {major}"),
        TIMEOUT,
        |s| {
            !s.instances.is_empty()
                && s.instances.iter().all(|i| {
                    i.postgres_version
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

#[tokio::test]
async fn e2e_a_postgresql_18_cluster_replicates_fails_over_and_rewinds() -> Result {
    if pgop_instance::Binaries::for_major(18, None).is_err() {
        return Err("PostgreSQL 18 is not installed: run hack/install-postgres18.sh".into());
    }
    let _serial = SERIAL.lock().await;
    let env = start("pg18").await?;
    env.create(
        "new",
        json!({"replicas": 3, "postgresVersion": 18, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready("new", 3).await?;
    let password = env.password("new").await?;
    every_instance_runs(&env, "new", &password, "18").await?;
    write_through_rw(
        &env,
        "new",
        &password,
        "create table t(id int primary key); insert into t select generate_series(1, 100)",
    )
    .await?;
    rows_everywhere(&env, "new", &password, "t", 100).await?;

    // kill -9 of the primary's postmaster: a standby takes over, and the old primary
    // comes back as its standby through PostgreSQL 18's pg_rewind.
    fail_over_after_kill(&env, "new", &password).await?;
    every_instance_runs(&env, "new", &password, "18").await?;

    // A major below the data's is refused: 18 -> 15 would be a downgrade. The operator
    // holds the rule even without its admission webhook (none runs here): Invalid, and
    // nothing is rolled. (Raising is an in-place upgrade: e2e_major_upgrade.)
    env.patch("new", json!({"spec": {"postgresVersion": 15}}))
        .await?;
    let invalid = env
        .wait_cluster("new", "Invalid after lowering the version", TIMEOUT, |s| {
            s.phase == Some(pgop_api::cluster::ClusterPhase::Invalid)
        })
        .await?;
    let message = invalid
        .status
        .and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == pgop_api::conditions::SPEC_VALID)
        })
        .map(|c| c.message)
        .unwrap_or_default();
    assert!(
        message.contains("spec.postgresql.version") && message.contains("lowered to 15"),
        "{message}"
    );
    every_instance_runs(&env, "new", &password, "18").await?;
    env.patch("new", json!({"spec": {"postgresVersion": 18}}))
        .await?;
    env.wait_ready("new", 3).await?;
    env.stop().await
}
