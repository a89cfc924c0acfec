//! Volume size end to end on the local node with real PostgreSQL, on volumes of the
//! testenv class `pgop-local-sized`: a tmpfs of the claim's size per volume, which really
//! fills up and which the node's resizer grows online (see `pgop_testenv::node`'s
//! provisioner). Rows written into the cluster fill the volumes past
//! `storage.autoGrow.thresholdPercent`; the operator grows every claim by
//! `increasePercent`, the filesystems grow, the managers report it (`VolumesResized`
//! True), then again up to `maxSize`, where a volume over the threshold is a
//! `VolumeAutoGrowLimit` Warning and no growth. A larger `storage.size` grows them past
//! it; a smaller one than the volumes hold turns the cluster Invalid and shrinks nothing.
//! Every row is still there, on both instances. A standby whose volume is filled from the
//! host is named `VolumeFull` (status, Ready, an Event, `kubectl pgop status`) while the
//! primary keeps taking writes, and comes back once the space is freed, with an
//! `InstanceBack` Event.

use crate::common;

use common::*;
use pgop_api::conditions;
use serde_json::json;

fn condition(s: &pgop_api::PostgresClusterStatus, type_: &str) -> Option<(String, String, String)> {
    conditions::find_condition(&s.conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Inserts batches of 4 MiB of rows (1 KiB each, not compressible) until the filesystem
/// of `claim` is at least `percent` full, as `statvfs` shows it (and the manager reports
/// it); at most `limit` batches. Never more once there: a volume filled further while the
/// operator reacts could fill up, and PostgreSQL would stop.
async fn fill_to(
    env: &Env,
    app: &tokio_postgres::Client,
    claim: &str,
    percent: u64,
    limit: usize,
) -> Result {
    for batch in 0..=limit {
        let (request, _, fs_size, fs_used) = env.volume(claim).await?;
        if fs_used * 100 >= percent * fs_size {
            eprintln!(
                "{claim}: {fs_used} of {fs_size} MiB used after {batch} batches ({request} asked)"
            );
            return Ok(());
        }
        app.batch_execute(
            "insert into filler select g, repeat(md5(random()::text), 32) \
             from generate_series(1, 4096) g",
        )
        .await?;
    }
    Err(format!("{claim} not {percent}% full after {limit} batches").into())
}

#[tokio::test]
async fn e2e_volumes_grow_on_their_own_up_to_the_maximum_and_with_the_spec() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("volumes").await?;
    let name = "volumes";
    env.create(
        name,
        json!({"replicas": 2, "storage": {
            "size": "128Mi", "storageClassName": pgop_testenv::node::SIZED_STORAGE_CLASS,
            "autoGrow": {"thresholdPercent": 60, "increasePercent": 50, "maxSize": "256Mi"}
        }}),
    )
    .await?;
    let ready = env.wait_ready(name, 2).await?;
    let primary = env.current_primary(name).await?;
    let standby = if primary.ends_with("-1") {
        "volumes-2"
    } else {
        "volumes-1"
    };
    let status = ready.status.as_ref().ok_or("no status")?;
    let (ok, reason, _) =
        condition(status, conditions::VOLUMES_RESIZED).ok_or("no VolumesResized")?;
    assert_eq!((ok.as_str(), reason.as_str()), ("True", "Resized"));
    let (request, capacity, fs_size, fs_used) = env.volume(&primary).await?;
    eprintln!(
        "{primary} at the start: {request} asked, {capacity} given, {fs_used} of {fs_size} MiB used"
    );
    assert_eq!(
        (request.as_str(), capacity.as_str(), fs_size),
        ("128Mi", "128Mi", 128)
    );

    let ip = env.pod_ip(&primary).await?;
    let password = env.password(name).await?;
    let app = connect(&ip, &password).await?;
    app.batch_execute("create table filler (id int, body text)")
        .await?;

    // Past 60 %: every claim grows by half, the filesystems with them.
    fill_to(&env, &app, &primary, 61, 24).await?;
    let grown = env
        .wait_cluster(name, "grown to 192Mi and resized", TIMEOUT, |s| {
            s.auto_grow
                .as_ref()
                .is_some_and(|g| g.size == "192Mi" && g.count == 1)
                && condition(s, conditions::VOLUMES_RESIZED)
                    .is_some_and(|(ok, _, m)| ok == "True" && m.contains("192Mi"))
        })
        .await?;
    assert!(
        grown
            .status
            .as_ref()
            .and_then(|s| s.auto_grow.as_ref())
            .is_some_and(|g| g.grown_at.is_some() && !g.at_limit)
    );
    for claim in [primary.as_str(), standby] {
        let (request, capacity, fs_size, _) = env.volume(claim).await?;
        assert_eq!(
            (request.as_str(), capacity.as_str(), fs_size),
            ("192Mi", "192Mi", 192),
            "{claim}"
        );
    }
    let event = env.wait_event("VolumeAutoGrown").await?;
    assert!(
        event.contains("from 128Mi to 192Mi") && event.contains("threshold 60%"),
        "{event}"
    );

    // Again: 192 MiB and a half is more than the maximum, so 256Mi.
    fill_to(&env, &app, &primary, 61, 24).await?;
    env.wait_cluster(name, "grown to 256Mi and resized", TIMEOUT, |s| {
        s.auto_grow
            .as_ref()
            .is_some_and(|g| g.size == "256Mi" && g.count == 2)
            && condition(s, conditions::VOLUMES_RESIZED).is_some_and(|(ok, _, _)| ok == "True")
    })
    .await?;

    // At the maximum: over the threshold, reported, not grown.
    fill_to(&env, &app, &primary, 61, 24).await?;
    env.wait_cluster(name, "status.autoGrow.atLimit", TIMEOUT, |s| {
        s.auto_grow.as_ref().is_some_and(|g| g.at_limit)
    })
    .await?;
    let warning = env.wait_event("VolumeAutoGrowLimit").await?;
    assert!(warning.contains("maxSize (256Mi)"), "{warning}");
    let (request, _, fs_size, fs_used) = env.volume(&primary).await?;
    assert_eq!((request.as_str(), fs_size), ("256Mi", 256));
    assert!(fs_used * 100 >= 60 * 256, "{fs_used} MiB used");
    let rows: i64 = app
        .query_one("select count(*) from filler", &[])
        .await?
        .get(0);

    // A larger spec grows them past the maximum; below the threshold the limit is lifted.
    // (with a larger maximum: a spec above it is refused)
    env.patch(
        name,
        json!({"spec": {"storage": {"size": "512Mi", "autoGrow": {"maxSize": "1Gi"}}}}),
    )
    .await?;
    env.wait_cluster(name, "resized to 512Mi", TIMEOUT, |s| {
        condition(s, conditions::VOLUMES_RESIZED)
            .is_some_and(|(ok, _, m)| ok == "True" && m.contains("512Mi"))
            && s.auto_grow.as_ref().is_some_and(|g| !g.at_limit)
    })
    .await?;
    for claim in [primary.as_str(), standby] {
        let (request, capacity, fs_size, _) = env.volume(claim).await?;
        assert_eq!(
            (request.as_str(), capacity.as_str(), fs_size),
            ("512Mi", "512Mi", 512),
            "{claim}"
        );
    }

    // A spec below the volumes (what the webhook refuses, caught by the operator here):
    // Invalid, nothing shrinks, and the cluster comes back when it is raised again.
    env.patch(name, json!({"spec": {"storage": {"size": "256Mi"}}}))
        .await?;
    env.wait_cluster(name, "Invalid", TIMEOUT, |s| {
        s.phase == Some(pgop_api::cluster::ClusterPhase::Invalid)
    })
    .await?;
    assert_eq!(env.volume(&primary).await?.0, "512Mi");
    env.patch(name, json!({"spec": {"storage": {"size": "512Mi"}}}))
        .await?;
    env.wait_ready(name, 2).await?;

    // Every row, on both instances.
    let standby_ip = env.pod_ip(standby).await?;
    let replica = connect(&standby_ip, &password).await?;
    eventually("the standby has every row", TIMEOUT, || async {
        let n: i64 = replica
            .query_one("select count(*) from filler", &[])
            .await
            .ok()?
            .get(0);
        (n == rows).then_some(())
    })
    .await;
    env.stop().await
}

/// Fills the filesystem of `dir` from this machine (as root, as a disk fills up behind an
/// instance's back): one file of 1 MiB writes until the filesystem refuses (`ENOSPC`).
/// Returns the file, to be removed to free the space.
async fn fill_from_the_host(dir: std::path::PathBuf) -> Result<std::path::PathBuf> {
    let file = dir.join("pgop-e2e-filler");
    let path = file.clone();
    let written = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
        use std::io::Write;
        let mut f = std::fs::File::create(&path)?;
        let chunk = vec![0x5a_u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => return Ok(written),
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => return Ok(written),
                Err(e) => return Err(e),
            }
        }
    })
    .await??;
    eprintln!(
        "{}: {written} bytes written until the filesystem was full",
        file.display()
    );
    Ok(file)
}

/// Batches of 2048 rows (2 MiB) the primary takes while its standby's volume is full.
const BATCHES: i64 = 10;

#[tokio::test]
async fn e2e_a_standby_whose_volume_is_full_is_named_and_comes_back_once_space_is_freed() -> Result
{
    let _serial = SERIAL.lock().await;
    let env = start("volfull").await?;
    let name = "volfull";
    env.create(
        name,
        json!({"replicas": 2, "storage": {
            "size": "256Mi", "storageClassName": pgop_testenv::node::SIZED_STORAGE_CLASS
        }}),
    )
    .await?;
    env.wait_ready(name, 2).await?;
    let primary = env.current_primary(name).await?;
    let standby = if primary.ends_with("-1") {
        "volfull-2"
    } else {
        "volfull-1"
    };
    let password = env.password(name).await?;

    // The standby's volume fills up: the next WAL segment it receives cannot be written.
    let filler = fill_from_the_host(env.claim_dir(standby).await?).await?;
    // Meanwhile the primary keeps taking writes: 2 MiB of rows at a time, about 20 MiB of
    // WAL in all (more than a segment, which the standby cannot make room for).
    write_through_rw(
        &env,
        name,
        &password,
        "create table filler (id int, body text)",
    )
    .await?;
    for _ in 0..BATCHES {
        write_through_rw(
            &env,
            name,
            &password,
            "insert into filler select g, repeat(md5(random()::text), 32) \
             from generate_series(1, 2048) g",
        )
        .await?;
    }
    let status = env
        .wait_cluster(name, &format!("{standby} VolumeFull"), TIMEOUT, |s| {
            s.instances
                .iter()
                .any(|i| i.name == standby && i.reason.as_deref() == Some("VolumeFull"))
        })
        .await?
        .status
        .ok_or("no status")?;
    let instance = status
        .instances
        .iter()
        .find(|i| i.name == standby)
        .ok_or("no standby in status")?;
    let message = instance.message.clone().unwrap_or_default();
    println!("{standby}: {message}");
    // From the volume's use, or (should PostgreSQL have freed a segment meanwhile) from
    // its own words.
    const WORDS: [&str; 3] = [
        "the data volume is full",
        "No space left on device",
        "free disk space",
    ];
    assert!(WORDS.iter().any(|w| message.contains(w)), "{message}");
    assert!(instance.down_since.is_some());
    let event = env.wait_event("InstanceDown").await?;
    assert!(
        event.contains(standby) && event.contains("VolumeFull"),
        "{event}"
    );
    let ready =
        conditions::find_condition(&status.conditions, conditions::READY).ok_or("no Ready")?;
    assert!(
        ready.message.contains(&format!("{standby} (VolumeFull)")),
        "{}",
        ready.message
    );
    // `kubectl pgop status` names it too, with the words (read again: they may have moved
    // between the volume's use and PostgreSQL's own).
    let shown = kubectl_pgop_status(&env, name).await?;
    assert!(
        shown.contains(&format!("{standby} is down since ")) && shown.contains("VolumeFull"),
        "{shown}"
    );
    assert!(
        WORDS.iter().any(|w| shown.contains(w)),
        "none of {WORDS:?} in\n{shown}"
    );

    // Space freed: the standby comes back, catches up, and the reason is gone.
    std::fs::remove_file(&filler)?;
    env.wait_ready(name, 2).await?;
    env.wait_cluster(name, "no reason left", TIMEOUT, |s| {
        s.instances.iter().all(|i| i.reason.is_none())
    })
    .await?;
    let back = env.wait_event("InstanceBack").await?;
    assert!(back.contains(standby), "{back}");
    let standby_ip = env.pod_ip(standby).await?;
    wait_rows(standby, &standby_ip, &password, "filler", BATCHES * 2048).await?;
    env.stop().await
}
