//! Replica clusters end to end, between two "sites": two control planes, each with its own
//! local node and its own operator, in one process. Site B's cluster follows site A's
//! (`spec.externalClusters` and `spec.replica`), reaching it at its primary's Pod address
//! (a loopback address the harness owns) with site A's replication certificate, as one
//! pgop cluster follows another across Kubernetes clusters.

use crate::common;

use common::*;
use pgop_api::instance_status::PgStatus;
use serde_json::json;

/// The instance's `/pg/status`, as its manager serves it on the Pod's address.
async fn pg_status(env: &Env, pod: &str) -> Result<PgStatus> {
    let ip = env.pod_ip(pod).await?;
    let url = format!(
        "http://{ip}:{}/pg/status",
        pgop_api::constants::MANAGER_PORT
    );
    Ok(serde_json::from_str(&http_get(&url).await?)?)
}

/// A plain HTTP GET (the manager's read-only port).
async fn http_get(url: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").ok_or("not http")?;
    let (host, path) = rest.split_once('/').ok_or("no path")?;
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let (_, body) = answer.split_once("\r\n\r\n").ok_or("no body")?;
    Ok(body.to_string())
}

/// Condition `type_` of a cluster's status: its status and reason.
fn condition(status: &pgop_api::PostgresClusterStatus, type_: &str) -> Option<(String, String)> {
    pgop_api::conditions::find_condition(&status.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// ReplicaFollowing of a cluster: its status and reason.
fn following(status: &pgop_api::PostgresClusterStatus) -> Option<(String, String)> {
    condition(status, pgop_api::conditions::REPLICA_FOLLOWING)
}

/// A replica cluster of site A that cannot follow it: its `site-a` entry as given.
async fn refused_replica(b: &Env, name: &str, entry: serde_json::Value) -> Result {
    b.create(
        name,
        json!({
            "replicas": 1,
            "storage": {"size": "1Gi"},
            "externalClusters": [entry],
            "replica": {"source": "site-a"},
        }),
    )
    .await
}

#[tokio::test]
async fn e2e_a_replica_cluster_in_another_site_follows_cascades_and_fails_over_as_a_replica()
-> Result {
    let _serial = SERIAL.lock().await;
    let a = start("site-a").await?;
    let b = start("site-b").await?;
    // The same cluster name in both sites, as a user would have it: the source must never
    // take the replica cluster's designated primary for one of its own standbys.
    let (password, source_ip) = sites::source(&a, "db", json!({})).await?;
    seed(&source_ip, &password).await?;

    // Site A's authority and replication certificate copied to site B, and a replica
    // cluster of 2 instances following site A's primary at its address.
    assert_eq!(sites::follow(&a, &b, "db", 2).await?, source_ip);
    let ready = b.wait_ready("db", 2).await?;
    let designated = b.current_primary("db").await?;
    let status = ready.status.clone().unwrap_or_default();
    let report = status.replica.clone().ok_or("no status.replica")?;
    assert_eq!(
        (report.source.as_str(), report.designated_primary.as_deref()),
        ("site-a", Some(designated.as_str()))
    );
    b.wait_cluster("db", "ReplicaFollowing True", TIMEOUT, |s| {
        following(s).is_some_and(|(status, _)| status == "True")
            && s.replica.as_ref().is_some_and(|r| r.streaming)
    })
    .await?;
    let screen = kubectl_pgop_status(&b, "db").await?;
    assert!(
        screen.contains(&format!("Replica of site-a ({source_ip}:5432): following")),
        "{screen}"
    );
    let status = pg_status(&b, &designated).await?;
    assert_eq!(
        serde_json::to_value(status.role)?,
        json!("designatedPrimary"),
        "{status:?}"
    );
    // Site A's rows everywhere in site B (its passwords are site A's: they are replicated).
    rows_everywhere(&b, "db", &password, "t", 100).await?;
    connect(&source_ip, &password)
        .await?
        .batch_execute("insert into t select generate_series(101, 200)")
        .await?;
    rows_everywhere(&b, "db", &password, "t", 200).await?;
    // Site B takes no writes.
    let refused = connect(&b.pod_ip(&designated).await?, &password)
        .await?
        .batch_execute("insert into t values (0)")
        .await;
    assert_eq!(
        refused.err().and_then(|e| e.code().cloned()),
        Some(tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );
    // Site A streams to it under a name none of its instances has.
    let names: Vec<String> = connect(&source_ip, &password)
        .await?
        .query("select application_name from pg_stat_replication", &[])
        .await
        .map(|rows| rows.iter().map(|r| r.get(0)).collect())
        .unwrap_or_default();
    assert!(
        names.iter().all(|n| n.starts_with("replica-cluster:")),
        "{names:?}"
    );

    // The designated primary's Pod is deleted: the standby becomes the designated
    // primary, re-pointed at site A, never promoted; the old one comes back as its standby.
    b.delete_pod(&designated).await?;
    let next = wait_new_primary(&b, "db", &designated).await?;
    b.wait_ready("db", 2).await?;
    let status = pg_status(&b, &next).await?;
    assert_eq!(
        serde_json::to_value(status.role)?,
        json!("designatedPrimary"),
        "{status:?}"
    );
    assert!(status.in_recovery, "{status:?}");
    connect(&source_ip, &password)
        .await?
        .batch_execute("insert into t select generate_series(201, 300)")
        .await?;
    rows_everywhere(&b, "db", &password, "t", 300).await?;

    // A replica cluster takes no backups while it follows: its WAL is its source's.
    let backup: pgop_api::PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresBackup",
        "metadata": {"name": "db-now"}, "spec": {"cluster": {"name": "db"}}}))?;
    let backups: kube::Api<pgop_api::PostgresBackup> =
        kube::Api::namespaced(b.client.clone(), b.n());
    backups.create(&Default::default(), &backup).await?;
    let backups = &backups;
    let error = pgop_testenv::wait::until("the backup refused", TIMEOUT, || async move {
        let b = backups.get("db-now").await.map_err(|e| e.to_string())?;
        let s = b.status.unwrap_or_default();
        match (s.phase, s.error) {
            (Some(pgop_api::backup::BackupPhase::Failed), Some(e)) => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    assert!(
        error.contains("is a replica cluster following site-a"),
        "{error}"
    );

    // Sources that refuse: each named by the condition and an Event, nothing cloned,
    // nothing crash-looping.
    let closed = std::net::TcpListener::bind((source_ip.as_str(), 0))?;
    let closed_port = closed.local_addr()?.port();
    drop(closed);
    let mut closed = sites::site_a(&source_ip);
    closed["connection"]["port"] = json!(closed_port);
    refused_replica(&b, "unreachable", closed).await?;
    // No client certificate: site A wants one from its replication user.
    let mut no_certificate = sites::site_a(&source_ip);
    if let Some(c) = no_certificate["connection"].as_object_mut() {
        c.remove("clientCertificateSecret");
    }
    refused_replica(&b, "no-certificate", no_certificate).await?;
    for (name, reason) in [
        ("unreachable", "SourceUnreachable"),
        ("no-certificate", "SourceAuthenticationFailed"),
    ] {
        b.wait_cluster(name, &format!("ReplicaFollowing {reason}"), TIMEOUT, |s| {
            following(s).is_some_and(|(status, r)| status == "False" && r == reason)
        })
        .await?;
        let note = b
            .wait_event_about("ReplicaNotFollowing", Some(name))
            .await?;
        assert!(note.contains("site-a"), "{note}");
        let cluster = b.clusters_v1beta1().get(name).await?;
        let status = cluster.status.unwrap_or_default();
        assert_ne!(status.phase, Some(pgop_api::cluster::ClusterPhase::Ready));
        assert!(status.current_primary.is_none() || status.replica.is_some_and(|r| !r.streaming));
    }
    // Promoting one that never cloned anything is refused: it would be an empty database.
    b.patch(
        "unreachable",
        json!({"spec": {"replica": {"enabled": false}}}),
    )
    .await?;
    b.wait_cluster(
        "unreachable",
        "ReplicaPromoted PromotionRefused",
        TIMEOUT,
        |s| {
            condition(s, pgop_api::conditions::REPLICA_PROMOTED)
                .is_some_and(|(status, r)| status == "False" && r == "PromotionRefused")
        },
    )
    .await?;
    b.wait_event_about("ReplicaPromotionRefused", Some("unreachable"))
        .await?;

    // Site A is lost: its operator, node (every PostgreSQL killed) and control plane
    // stopped. Site B is promoted without streaming (forced), and takes writes.
    a.stop().await?;
    let decided = std::time::Instant::now();
    let said = kubectl_pgop(&b, &["promote", "db"]).await?;
    assert!(
        said.contains("promotion of replica cluster db requested"),
        "{said}"
    );
    // Until its manager sets the cluster's own passwords (right after the promotion),
    // site A's (replicated) ones log in; then only site B's Secrets'.
    let own = b.password("db").await?;
    let written = loop {
        let rw = b.rw("db");
        let mut done = false;
        for p in [&password, &own] {
            if let Some(rw) = &rw
                && let Ok(c) = connect_within(rw, p, std::time::Duration::from_millis(500)).await
                && c.batch_execute("insert into t values (301)").await.is_ok()
            {
                done = true;
                break;
            }
        }
        if done {
            break decided.elapsed();
        }
        assert!(
            decided.elapsed() < TIMEOUT,
            "no write through -rw after the promotion"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    println!("site loss: promotion asked -> first write through -rw: {written:?}");
    let promoted = b
        .wait_cluster("db", "ReplicaPromoted True", TIMEOUT, |s| {
            condition(s, pgop_api::conditions::REPLICA_PROMOTED)
                .is_some_and(|(status, _)| status == "True")
        })
        .await?;
    let status = promoted.status.unwrap_or_default();
    let promotion = status
        .replica
        .clone()
        .and_then(|r| r.promotion)
        .ok_or("no status.replica.promotion")?;
    assert!(promotion.forced, "{promotion:?}");
    assert!(promotion.completed_at.is_some(), "{promotion:?}");
    assert!(condition(&status, pgop_api::conditions::REPLICA_FOLLOWING).is_none());
    let screen = kubectl_pgop_status(&b, "db").await?;
    assert!(screen.contains("Replica of site-a"), "{screen}");
    assert!(screen.contains(": promoted"), "{screen}");
    b.wait_event_about("ReplicaPromotionStarted", Some("db"))
        .await?;
    b.wait_event_about("ReplicaPromoted", Some("db")).await?;
    // Every commit site A acknowledged before it was lost is here (it was caught up), and
    // the standby follows the new primary.
    b.wait_ready("db", 2).await?;
    rows_everywhere(&b, "db", &own, "t", 301).await?;
    b.stop().await
}

/// Table `t` with rows 1 to 100 on site A's primary at `host`.
async fn seed(host: &str, password: &str) -> Result {
    connect(host, password)
        .await?
        .batch_execute(
            "create table t(id int primary key); insert into t select generate_series(1, 100)",
        )
        .await?;
    Ok(())
}

/// One row of `sql` on `host` as text.
async fn one(host: &str, password: &str, sql: &str) -> Result<String> {
    Ok(connect(host, password)
        .await?
        .query_one(sql, &[])
        .await?
        .get::<_, String>(0))
}

#[tokio::test]
async fn e2e_a_replica_cluster_reads_the_wal_its_source_removed_from_the_source_store() -> Result {
    let _serial = SERIAL.lock().await;
    let a = start("store-a").await?;
    let b = start("store-b").await?;
    let s3 = pgop_testenv::s3::S3Server::start(&a.plane.dir().join("s3"))?;
    let store = sites::s3_store(&s3, &[&a, &b]).await?;
    // The superuser over the network: the test switches WAL files and checkpoints.
    let spec = json!({"backup": {"store": store}, "credentials": {"superuserAccess": true}});
    let (password, source) = sites::source(&a, "db", spec).await?;
    seed(&source, &password).await?;
    // The entry: site A's server, and its store (the same bucket and path, cluster `db`).
    let mut entry_store = store.clone();
    entry_store["cluster"] = json!("db");
    sites::follow_with(&a, &b, "db", 1, json!({"store": entry_store})).await?;
    rows_everywhere(&b, "db", &password, "t", 100).await?;
    let designated = b.current_primary("db").await?;
    let replica_ip = b.pod_ip(&designated).await?;
    let needed = one(
        &source,
        &password,
        &format!(
            "select pg_walfile_name('{}')",
            one(
                &replica_ip,
                &password,
                "select pg_last_wal_replay_lsn()::text"
            )
            .await?
        ),
    )
    .await?;

    // Site B's designated primary is stopped (fenced) while site A writes, switches WAL
    // files and checkpoints past it: site A removes the WAL it needs (it keeps no slot for
    // it), after archiving it.
    b.patch("db", json!({"spec": {"fencedInstances": [designated]}}))
        .await?;
    b.wait_cluster("db", "the designated primary fenced", TIMEOUT, |s| {
        s.instances.iter().any(|i| i.fenced && !i.ready)
    })
    .await?;
    let su = sites::superuser(&a, &source).await?;
    for round in 0..4 {
        su.batch_execute(&format!(
            "insert into t select generate_series({}, {}); select pg_switch_wal(); checkpoint",
            101 + round * 1000,
            100 + (round + 1) * 1000
        ))
        .await?;
    }
    pgop_testenv::wait::until(
        "site A removed the WAL site B needs (archived)",
        TIMEOUT,
        || async {
            let row = su
                .query_one(
                    "select (select count(*) from pg_ls_waldir() where name = $1)::int, \
                        coalesce(last_archived_wal, '') >= $1 from pg_stat_archiver",
                    &[&needed],
                )
                .await
                .map_err(|e| e.to_string())?;
            let (kept, archived): (i32, bool) = (row.get(0), row.get(1));
            (kept == 0 && archived)
                .then_some(())
                .ok_or(format!("{needed}: in pg_wal {kept}, archived {archived}"))
        },
    )
    .await?;
    // Started again, site B reads it from site A's store, then streams again: the same
    // data directory (a re-clone would make a new one), every row.
    use std::os::unix::fs::MetadataExt;
    let pgdata = b.claim_dir(&designated).await?.join("pgdata");
    let inode = std::fs::metadata(&pgdata)?.ino();
    b.patch("db", json!({"spec": {"fencedInstances": []}}))
        .await?;
    rows_everywhere(&b, "db", &password, "t", 4100).await?;
    b.wait_cluster("db", "following again", TIMEOUT, |s| {
        following(s).is_some_and(|(status, _)| status == "True")
    })
    .await?;
    assert_eq!(b.current_primary("db").await?, designated);
    assert_eq!(
        std::fs::metadata(&pgdata)?.ino(),
        inode,
        "the data directory was made anew: re-cloned, not restored from the store"
    );
    drop(s3);
    b.stop().await?;
    a.stop().await
}

#[tokio::test]
async fn e2e_a_replica_cluster_follows_its_source_through_the_store_alone() -> Result {
    let _serial = SERIAL.lock().await;
    let a = start("archive-a").await?;
    let b = start("archive-b").await?;
    let s3 = pgop_testenv::s3::S3Server::start(&a.plane.dir().join("s3"))?;
    let store = sites::s3_store(&s3, &[&a, &b]).await?;
    // Site A archives to the store and has one base backup there. The superuser over the
    // network: the test switches WAL files.
    let spec = json!({"backup": {"store": store}, "credentials": {"superuserAccess": true},
        "postgresql": {"parameters": {"archive_timeout": "1h"}}});
    let (password, source) = sites::source(&a, "db", spec).await?;
    seed(&source, &password).await?;
    sites::base_backup(&a, "db-base").await?;
    let su = sites::superuser(&a, &source).await?;

    // Site B knows site A by its store alone: no connection, no certificate.
    let mut entry_store = store.clone();
    entry_store["cluster"] = json!("db");
    b.create(
        "db",
        json!({
            "replicas": 2,
            "storage": {"size": "1Gi"},
            "externalClusters": [{"name": "site-a", "store": entry_store}],
            "replica": {"source": "site-a"},
        }),
    )
    .await?;
    b.wait_ready("db", 2).await?;
    rows_everywhere(&b, "db", &password, "t", 100).await?;
    // Rows written on A reach B once their WAL file is archived (a switch closes it).
    su.batch_execute("insert into t select generate_series(101, 200)")
        .await?;
    su.batch_execute("select pg_switch_wal()").await?;
    rows_everywhere(&b, "db", &password, "t", 200).await?;
    let followed = b
        .wait_cluster("db", "following through the store", TIMEOUT, |s| {
            following(s).is_some_and(|(status, reason)| status == "True" && reason == "Archive")
                && s.replica
                    .as_ref()
                    .is_some_and(|r| r.last_restored_wal.is_some())
        })
        .await?;
    let report = followed
        .status
        .and_then(|s| s.replica)
        .ok_or("no status.replica")?;
    assert_eq!(report.mode.as_deref(), Some("archive"));
    assert!(!report.streaming);
    let designated = b.current_primary("db").await?;
    let status = pg_status(&b, &designated).await?;
    assert_eq!(
        status.role,
        pgop_api::instance_status::PgRole::DesignatedPrimary
    );
    let upstream = status.upstream.ok_or("no upstream on /pg/status")?;
    assert!(upstream.restored_wal.is_some(), "{upstream:?}");
    assert_eq!(upstream.receiver, None, "no WAL receiver: {upstream:?}");
    let screen = kubectl_pgop_status(&b, "db").await?;
    assert!(
        screen.contains("Replica of site-a (its store s3://pgop-test/site-a/db): following"),
        "{screen}"
    );

    // A gap in the store. Site A switches WAL files only when told (archive_timeout an
    // hour): once B has restored the last segment A archived (R), B needs R+1 next, which
    // A is still writing. B's designated primary fenced, A archives three more segments
    // (R+1..R+3) and R+1 is taken out of the store. Unfenced, B restores up to the gap
    // and says so; put back, it goes on.
    let archived = || async {
        let row = su
            .query_one(
                "select coalesce(last_archived_wal, '') from pg_stat_archiver",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok::<String, String>(row.get(0))
    };
    let restored = archived().await?;
    pgop_testenv::wait::until("B restored what A archived", TIMEOUT, || async {
        let status = pg_status(&b, &designated)
            .await
            .map_err(|e| e.to_string())?;
        let at = status.upstream.and_then(|u| u.restored_wal);
        (at.as_deref() == Some(restored.as_str()))
            .then_some(())
            .ok_or(format!("{at:?}, {restored} archived"))
    })
    .await?;
    let next = |name: &str| -> Result<String> {
        Ok(pgop_backup::WalName::parse(name)
            .and_then(|w| w.next())
            .ok_or(format!("no segment after {name}"))?
            .name)
    };
    let first = next(&restored)?;
    let last = next(&next(&first)?)?;
    b.patch("db", json!({"spec": {"fencedInstances": [designated]}}))
        .await?;
    b.wait_cluster("db", "the designated primary fenced", TIMEOUT, |s| {
        s.instances.iter().any(|i| i.fenced && !i.ready)
    })
    .await?;
    for round in 0..3 {
        su.batch_execute(&format!(
            "insert into t select generate_series({}, {})",
            201 + round * 100,
            300 + round * 100
        ))
        .await?;
        su.batch_execute("select pg_switch_wal()").await?;
    }
    pgop_testenv::wait::until("site A archived three segments", TIMEOUT, || async {
        let at = archived().await?;
        (at >= last).then_some(()).ok_or(at)
    })
    .await?;
    let object = s3.object_file(&format!("site-a/db/pgop-v1/wal/{}/{first}.gz", &first[..8]));
    let aside = object.with_extension("aside");
    std::fs::rename(&object, &aside)
        .map_err(|e| format!("taking {} out of the store: {e}", object.display()))?;
    b.patch("db", json!({"spec": {"fencedInstances": []}}))
        .await?;
    let gap = b
        .wait_cluster("db", "the gap named", TIMEOUT, |s| {
            following(s).is_some_and(|(status, reason)| status == "False" && reason == "ArchiveGap")
        })
        .await?;
    let message = pgop_api::conditions::find_condition(
        &gap.status.unwrap_or_default().conditions,
        pgop_api::conditions::REPLICA_FOLLOWING,
    )
    .map(|c| c.message.clone())
    .unwrap_or_default();
    assert!(message.contains(&first), "{message}");
    let event = b
        .wait_event_saying("ReplicaNotFollowing", Some("db"), &first)
        .await?;
    assert!(
        event.contains("ArchiveGap") || event.contains("lacks"),
        "{event}"
    );
    std::fs::rename(&aside, &object)?;
    rows_everywhere(&b, "db", &password, "t", 500).await?;
    b.wait_cluster("db", "following again", TIMEOUT, |s| {
        following(s).is_some_and(|(status, _)| status == "True")
    })
    .await?;

    // Promoted: caught up with the store (lag 0, published with the positions at most once
    // a minute), so not forced; writable, its standby following.
    b.wait_cluster("db", "at the end of the store", TIMEOUT, |s| {
        s.replica.as_ref().is_some_and(|r| r.lag_seconds == Some(0))
    })
    .await?;
    b.patch("db", json!({"spec": {"replica": {"enabled": false}}}))
        .await?;
    let promoted = b
        .wait_cluster("db", "promoted", TIMEOUT, |s| {
            s.replica
                .as_ref()
                .and_then(|r| r.promotion.as_ref())
                .is_some_and(|p| p.completed_at.is_some())
        })
        .await?;
    let promotion = promoted
        .status
        .and_then(|s| s.replica)
        .and_then(|r| r.promotion)
        .ok_or("no promotion")?;
    assert!(!promotion.forced, "{promotion:?}");
    // The cluster's own password once its manager set it, site A's until then.
    let own = b.password("db").await?;
    let since = std::time::Instant::now();
    loop {
        let mut done = false;
        if let Some(rw) = b.rw("db") {
            for p in [&own, &password] {
                if let Ok(c) = connect_within(&rw, p, std::time::Duration::from_millis(500)).await
                    && c.batch_execute("insert into t values (501)").await.is_ok()
                {
                    done = true;
                    break;
                }
            }
        }
        if done {
            break;
        }
        assert!(
            since.elapsed() < TIMEOUT,
            "no write through -rw after the promotion"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    b.wait_ready("db", 2).await?;
    rows_everywhere(&b, "db", &own, "t", 501).await?;
    drop(s3);
    b.stop().await?;
    a.stop().await
}
