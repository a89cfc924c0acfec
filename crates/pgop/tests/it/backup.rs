//! Backups against real PostgreSQL 15 and a real S3 server (`s3s-fs`, speaking S3 over
//! HTTP on loopback, started and stopped by the tests): WAL archiving through
//! `pgop instance wal-archive`, base backups, restore and point-in-time recovery through
//! `pgop instance wal-restore`, retention, a store that goes away, corrupt objects.
//!
//! A missing `s3s-fs` fails the tests with the command that installs it
//! (`hack/install-s3-server.sh`); `PGOP_S3_SERVER` names another binary.
//!
//! Why this file stays whole: backup18.rs compiles it again against PostgreSQL 18, so the
//! same scenarios run on both majors from one source.

use crate::common::{self, eventually, secret};
// `common::pg` (PostgreSQL 15) here; `common::pg18` where backup18.rs compiles this again.
use super::pg::{Node, S3Server, TempDir, flip_byte, free_port, make_dir, pgop_binary, tools};
use pgop_backup::{RestoreOptions, Store, StoreConfig, TakeOptions, Target};
use pgop_instance::Archiving;
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, SECRET_KEY};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static RESTORES: AtomicU32 = AtomicU32::new(0);

fn restore_options(dir: &Path, pgop: &Path, target: Target) -> RestoreOptions {
    RestoreOptions {
        backup_id: None,
        target,
        pgop_binary: pgop.to_path_buf(),
        store_config_file: dir.join(format!(
            "restore-store-{}.json",
            RESTORES.fetch_add(1, Ordering::Relaxed)
        )),
        timeout: Duration::from_secs(120),
        socket_dir: None,
    }
}

async fn insert(node: &Node, from: i32, to: i32) {
    node.exec(&format!(
        "INSERT INTO t SELECT i, md5(i::text) FROM generate_series({from}, {to}) i"
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_base_backup_and_archived_wal_restore_identical_data_and_pitr_stops_at_the_target() {
    let Primary {
        dir,
        s3: _s3,
        pgop,
        config,
        node,
    } = Primary::start("restore").await;
    insert(&node, 1, 50_000).await;
    let store = Store::open(&config).expect("open the store");

    let started = Instant::now();
    let manifest = pgop_backup::base::take(
        &store,
        &tools(),
        &node.source(),
        "src",
        &TakeOptions::default(),
    )
    .await
    .expect("base backup");
    let took = started.elapsed();
    println!(
        "base backup: {} bytes ({} stored) in {:?} = {:.1} MB/s; begin {} end {}",
        manifest.size_bytes,
        manifest.stored_bytes,
        took,
        manifest.size_bytes as f64 / 1e6 / took.as_secs_f64(),
        manifest.begin_lsn,
        manifest.end_lsn
    );
    assert_eq!(manifest.cluster, "src");
    assert!(manifest.size_bytes > 1_000_000);

    // Batch A, then a point in time, then batch B.
    insert(&node, 50_001, 60_000).await;
    let after_a = {
        let row = node
            .sql()
            .await
            .query_one(
                "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
                &[],
            )
            .await
            .expect("now");
        row.get::<_, String>(0)
    };
    let fingerprint_a = node.fingerprint().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    insert(&node, 60_001, 70_000).await;
    node.exec("UPDATE t SET v = 'changed' WHERE id % 7 = 0")
        .await;
    let fingerprint_b = node.fingerprint().await;
    let last = node.switch_wal().await;
    let started = Instant::now();
    node.wait_archived(&last, Duration::from_secs(60)).await;
    println!("WAL archived up to {last} in {:?}", started.elapsed());
    let archiving = node.status().await.archiving.expect("archiving status");
    assert!(archiving.configured && !archiving.failing, "{archiving:?}");
    assert_eq!(archiving.failed_count, 0);

    // To the end of the WAL: everything.
    let pgdata = dir.0.join("full/pgdata");
    make_dir(&dir.0.join("full"));
    let started = Instant::now();
    let restored = pgop_backup::restore::restore(
        &config,
        &tools(),
        &pgdata,
        &restore_options(&dir.0, &pgop, Target::EndOfWal),
    )
    .await
    .expect("restore to the end of the WAL");
    println!(
        "restore to the end of the WAL: {:?} (timeline {}, {})",
        started.elapsed(),
        restored.timeline,
        restored.lsn
    );
    assert_eq!(restored.backup.backup_id, manifest.backup_id);
    assert!(restored.timeline > 1, "a new timeline after promotion");
    let full = Node::start_restored(&dir.0, "full-1", pgdata).await;
    assert_eq!(full.fingerprint().await, fingerprint_b);
    drop(full);

    // To the point between the batches: exactly batch A.
    let pgdata = dir.0.join("pitr/pgdata");
    make_dir(&dir.0.join("pitr"));
    pgop_backup::restore::restore(
        &config,
        &tools(),
        &pgdata,
        &restore_options(&dir.0, &pgop, Target::Time(after_a.clone())),
    )
    .await
    .expect("point-in-time restore");
    let pitr = Node::start_restored(&dir.0, "pitr-1", pgdata).await;
    assert_eq!(pitr.fingerprint().await, fingerprint_a);
    assert_ne!(fingerprint_a, fingerprint_b);
    drop(pitr);

    // A target the WAL never reaches fails clearly and leaves nothing behind.
    let pgdata = dir.0.join("future/pgdata");
    make_dir(&dir.0.join("future"));
    let err = pgop_backup::restore::restore(
        &config,
        &tools(),
        &pgdata,
        &restore_options(&dir.0, &pgop, Target::Time("2999-01-01T00:00:00Z".into())),
    )
    .await
    .expect_err("a target after the end of the WAL");
    let shown = pgop_api::error_chain(&err);
    assert!(
        shown.contains("recovery ended before configured recovery target was reached"),
        "{shown}"
    );
    assert_eq!(
        std::fs::read_dir(&pgdata).expect("pgdata").count(),
        0,
        "a failed restore leaves an empty directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archiving_survives_the_store_going_away_and_catches_up_without_losing_a_segment() {
    let Primary {
        dir,
        mut s3,
        pgop,
        config,
        node,
    } = Primary::start("outage").await;
    insert(&node, 1, 1000).await;
    let store = Store::open(&config).expect("open the store");
    pgop_backup::base::take(
        &store,
        &tools(),
        &node.source(),
        "src",
        &TakeOptions::default(),
    )
    .await
    .expect("base backup");

    s3.stop();
    for round in 0..5 {
        insert(&node, 1001 + round * 1000, 2000 + round * 1000).await;
        node.switch_wal().await;
    }
    let start = Instant::now();
    let failing = loop {
        let archiving = node.status().await.archiving.expect("archiving status");
        if archiving.failing && archiving.failed_count > 0 {
            break archiving;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no archiving failure shown: {archiving:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!("while the store is down: {failing:?}");
    // PostgreSQL keeps running and accepting writes.
    insert(&node, 10_001, 11_000).await;
    assert_eq!(node.fingerprint().await.0, 7000);

    s3.resume();
    let resumed = Instant::now();
    insert(&node, 11_001, 12_000).await;
    let last = node.switch_wal().await;
    node.wait_archived(&last, Duration::from_secs(120)).await;
    println!("caught up {:?} after the store returned", resumed.elapsed());
    let archiving = node.status().await.archiving.expect("archiving status");
    assert!(!archiving.failing, "{archiving:?}");
    let expected = node.fingerprint().await;

    // Every segment is there, intact: a restore reproduces the data.
    let pgdata = dir.0.join("after/pgdata");
    make_dir(&dir.0.join("after"));
    pgop_backup::restore::restore(
        &config,
        &tools(),
        &pgdata,
        &restore_options(&dir.0, &pgop, Target::EndOfWal),
    )
    .await
    .expect("restore after the outage");
    let restored = Node::start_restored(&dir.0, "after-1", pgdata).await;
    assert_eq!(restored.fingerprint().await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corrupt_objects_are_detected_at_restore_naming_the_object() {
    let Primary {
        dir,
        s3,
        pgop,
        config,
        node,
    } = Primary::start("corrupt").await;
    insert(&node, 1, 1000).await;
    let store = Store::open(&config).expect("open the store");
    let manifest = pgop_backup::base::take(
        &store,
        &tools(),
        &node.source(),
        "src",
        &TakeOptions::default(),
    )
    .await
    .expect("base backup");
    insert(&node, 1001, 2000).await;
    let needed = node.switch_wal().await;
    node.wait_archived(&needed, Duration::from_secs(60)).await;
    drop(node);

    // A WAL file the recovery needs, one byte flipped.
    let wal = pgop_backup::WalName::parse(&needed).expect("wal name");
    let file = s3.object_file(&config, &wal.key());
    flip_byte(&file, Some(100));
    let restore_fails = |attempt: &'static str| {
        let (dir, config, pgop) = (&dir, &config, &pgop);
        async move {
            let pgdata = dir.0.join(attempt).join("pgdata");
            make_dir(&dir.0.join(attempt));
            let err = pgop_backup::restore::restore(
                config,
                &tools(),
                &pgdata,
                &restore_options(&dir.0, pgop, Target::EndOfWal),
            )
            .await
            .expect_err("a restore from a corrupt object");
            let shown = pgop_api::error_chain(&err);
            println!("{shown}");
            (shown, pgdata)
        }
    };
    let (shown, pgdata) = restore_fails("r1").await;
    assert!(
        shown.contains(&wal.key()) && shown.contains("corrupt"),
        "the error names the object: {shown}"
    );
    assert_eq!(std::fs::read_dir(&pgdata).expect("pgdata").count(), 0);

    // The base backup's tar, one byte flipped.
    flip_byte(&file, Some(100));
    let tar_key = format!("base/{}/base.tar.gz", manifest.backup_id);
    flip_byte(&s3.object_file(&config, &tar_key), None);
    let (shown, pgdata) = restore_fails("r2").await;
    assert!(
        shown.contains(&tar_key) && shown.contains("SHA-256"),
        "the error names the object: {shown}"
    );
    assert_eq!(std::fs::read_dir(&pgdata).expect("pgdata").count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archiving_is_idempotent_and_refuses_different_content_under_the_same_name() {
    let dir = TempDir::new("idempotent");
    let s3 = S3Server::start(&dir.0);
    let pgop = pgop_binary(&dir.0);
    let config = s3.config("idem");
    let store = Store::open(&config).expect("open the store");
    let pgdata = dir.0.join("pgdata");
    std::fs::create_dir_all(pgdata.join("pg_wal/archive_status")).expect("pg_wal");
    let name = "000000010000000000000003";
    let segment: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 97) as u8).collect();
    std::fs::write(pgdata.join("pg_wal").join(name), &segment).expect("segment");
    let wal_path = PathBuf::from("pg_wal").join(name);

    let started = Instant::now();
    let first = pgop_backup::wal::archive(&store, &pgdata, &wal_path)
        .await
        .expect("first upload");
    println!(
        "archived a 16 MiB segment in {:?} = {:.1} MB/s",
        started.elapsed(),
        16.8 / started.elapsed().as_secs_f64()
    );
    assert_eq!(first, pgop_backup::wal::Archived::Uploaded);
    let again = pgop_backup::wal::archive(&store, &pgdata, &wal_path)
        .await
        .expect("the same segment again");
    assert_eq!(again, pgop_backup::wal::Archived::AlreadyThere);

    let mut other = segment.clone();
    other[12345] ^= 1;
    std::fs::write(pgdata.join("pg_wal").join(name), &other).expect("other content");
    let err = pgop_backup::wal::archive(&store, &pgdata, &wal_path)
        .await
        .expect_err("different content under the same name");
    assert!(
        err.to_string().contains("different content"),
        "{}",
        pgop_api::error_chain(&err)
    );

    // The same through the CLI PostgreSQL runs: exit codes and messages.
    let config_file = dir.0.join("store.json");
    config.write(&config_file, None).expect("config file");
    let cli = |args: &[&str]| {
        Command::new(&pgop)
            .args(args)
            .current_dir(&pgdata)
            .output()
            .expect("run pgop")
    };
    let cfg = config_file.display().to_string();
    let out = cli(&[
        "instance",
        "wal-archive",
        "--store-config",
        &cfg,
        &wal_path.display().to_string(),
    ]);
    assert!(!out.status.success(), "a conflicting archive fails");
    assert!(String::from_utf8_lossy(&out.stderr).contains("different content"));
    let out = cli(&[
        "instance",
        "wal-restore",
        "--store-config",
        &cfg,
        name,
        "pg_wal/RECOVERYXLOG",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(pgdata.join("pg_wal/RECOVERYXLOG")).expect("restored") == segment);
    let out = cli(&[
        "instance",
        "wal-restore",
        "--store-config",
        &cfg,
        "00000002.history",
        "pg_wal/RECOVERYHISTORY",
    ]);
    assert_eq!(out.status.code(), Some(1), "a missing file exits 1");
    assert!(
        out.stderr.is_empty(),
        "quietly: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not secret: the credentials are nowhere in the output.
    for output in [&out.stdout, &out.stderr] {
        assert!(!String::from_utf8_lossy(output).contains(SECRET_KEY));
    }
    let file = s3.object_file(
        &config,
        &pgop_backup::WalName::parse(name).expect("name").key(),
    );
    let mut raw = std::fs::read(&file).expect("object");
    raw[50] ^= 1;
    std::fs::write(&file, raw).expect("corrupt");
    let out = cli(&[
        "instance",
        "wal-restore",
        "--store-config",
        &cfg,
        name,
        "pg_wal/RECOVERYXLOG",
    ]);
    assert_eq!(out.status.code(), Some(200), "corruption aborts recovery");
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupt"));
}

#[tokio::test]
async fn wal_restore_keeps_a_record_of_what_it_restored_and_of_a_gap() {
    let dir = TempDir::new("record");
    let s3 = S3Server::start(&dir.0);
    let pgop = pgop_binary(&dir.0);
    let config = s3.config("record");
    let store = Store::open(&config).expect("open the store");
    let pgdata = dir.0.join("pgdata");
    std::fs::create_dir_all(pgdata.join("pg_wal/archive_status")).expect("pg_wal");
    // Segments 3 and 5 in the store; 4 is not (a gap), nor anything after 5.
    for name in ["000000010000000000000003", "000000010000000000000005"] {
        std::fs::write(
            pgdata.join("pg_wal").join(name),
            vec![7u8; 16 * 1024 * 1024],
        )
        .expect("segment");
        pgop_backup::wal::archive(&store, &pgdata, &PathBuf::from("pg_wal").join(name))
            .await
            .expect("archived");
    }
    let config_file = dir.0.join("store.json");
    config.write(&config_file, None).expect("config file");
    let record = dir.0.join("archive.json");
    let restore = |name: &str| {
        Command::new(&pgop)
            .args(["instance", "wal-restore", "--store-config"])
            .arg(&config_file)
            .arg("--record")
            .arg(&record)
            .args([name, "pg_wal/RECOVERYXLOG"])
            .current_dir(&pgdata)
            .output()
            .expect("run pgop")
    };
    let read = || pgop_instance::external::ArchiveRecord::read(&record);
    assert!(restore("000000010000000000000003").status.success());
    let r = read();
    assert_eq!(r.restored.as_deref(), Some("000000010000000000000003"));
    assert!(r.restored_at.is_some() && r.missing.is_none());
    // History files are not recorded.
    assert_eq!(restore("00000002.history").status.code(), Some(1));
    assert_eq!(read(), r);
    // 4 is missing while 5 is there: a gap (once it lasts).
    let out = restore("000000010000000000000004");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = read();
    assert_eq!(r.missing.as_deref(), Some("000000010000000000000004"));
    assert!(r.later_present, "{r:?}");
    let since = r.missing_since.clone();
    assert!(restore("000000010000000000000004").status.code() == Some(1));
    assert_eq!(read().missing_since, since, "the first miss is kept");
    // 6 is missing and nothing after it: the end of the store.
    assert!(restore("000000010000000000000005").status.success());
    assert_eq!(restore("000000010000000000000006").status.code(), Some(1));
    let r = read();
    assert_eq!(
        (r.restored.as_deref(), r.missing.as_deref(), r.later_present),
        (
            Some("000000010000000000000005"),
            Some("000000010000000000000006"),
            false
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_keeps_the_last_backup_and_the_wal_it_needs() {
    let Primary {
        dir,
        s3: _s3,
        pgop,
        config,
        node,
    } = Primary::start("retention").await;
    let store = Store::open(&config).expect("open the store");
    let take = || async {
        pgop_backup::base::take(
            &store,
            &tools(),
            &node.source(),
            "src",
            &TakeOptions::default(),
        )
        .await
        .expect("base backup")
    };
    insert(&node, 1, 1000).await;
    let b1 = take().await;
    insert(&node, 1001, 2000).await;
    node.switch_wal().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let b2 = take().await;
    insert(&node, 2001, 3000).await;
    let last = node.switch_wal().await;
    node.wait_archived(&last, Duration::from_secs(60)).await;
    let expected = node.fingerprint().await;
    assert!(b1.begin_wal < b2.begin_wal);

    let end2: jiff::Timestamp = b2.end_time.parse().expect("end time");
    // An hour later, with one day of retention: both stay, only WAL before b1 goes.
    let plan = pgop_backup::retention::apply(&store, end2 + jiff::SignedDuration::from_hours(1), 1)
        .await
        .expect("retention");
    assert_eq!(
        plan.keep_backups,
        vec![b1.backup_id.clone(), b2.backup_id.clone()]
    );
    assert!(plan.delete_backups.is_empty(), "{plan:?}");
    for key in &plan.delete_wal {
        let name = pgop_backup::WalName::from_key(key).expect("wal key").name;
        assert!(
            name.get(8..24) < b1.begin_wal.get(8..24),
            "{name} is needed by b1"
        );
    }

    // Ten days later: both are too old; the newest stays with the WAL from its begin on.
    let wal_before = store.list("wal/").await.expect("list");
    let plan =
        pgop_backup::retention::apply(&store, end2 + jiff::SignedDuration::from_hours(240), 1)
            .await
            .expect("retention");
    assert_eq!(plan.keep_backups, vec![b2.backup_id.clone()]);
    assert_eq!(plan.delete_backups, vec![b1.backup_id.clone()]);
    let (left, _) = pgop_backup::base::list(&store).await.expect("list backups");
    assert_eq!(left.len(), 1);
    assert!(
        store
            .list(&format!("base/{}/", b1.backup_id))
            .await
            .expect("list")
            .is_empty()
    );
    let wal_after = store.list("wal/").await.expect("list");
    for object in &wal_before {
        let name = pgop_backup::WalName::from_key(&object.key).expect("wal key");
        let kept = wal_after.iter().any(|o| o.key == object.key);
        let needed = name.position.is_none() || name.name.get(8..24) >= b2.begin_wal.get(8..24);
        assert_eq!(kept, needed, "{} kept={kept}", name.name);
    }
    assert!(wal_after.len() < wal_before.len(), "old WAL went");

    // What is left still restores to the end.
    let pgdata = dir.0.join("r/pgdata");
    make_dir(&dir.0.join("r"));
    pgop_backup::restore::restore(
        &config,
        &tools(),
        &pgdata,
        &restore_options(&dir.0, &pgop, Target::EndOfWal),
    )
    .await
    .expect("restore after retention");
    let restored = Node::start_restored(&dir.0, "r-1", pgdata).await;
    assert_eq!(restored.fingerprint().await, expected);
}

/// One HTTP/1.1 request to the manager on loopback; (status, body).
/// What most tests here start from: a scratch directory, a real S3 server in it, the pgop
/// binary PostgreSQL's `archive_command` runs, and primary `src-1` of cluster `src`
/// archiving into that store, with an empty table `t (id int PRIMARY KEY, v text)`.
/// Destructure it in this field order: the bindings then drop node first, directory last.
struct Primary {
    dir: TempDir,
    s3: S3Server,
    pgop: PathBuf,
    config: StoreConfig,
    node: Node,
}

impl Primary {
    async fn start(prefix: &str) -> Self {
        let dir = TempDir::new(prefix);
        let s3 = S3Server::start(&dir.0);
        let pgop = pgop_binary(&dir.0);
        let config = s3.config("src");
        let archiving = Archiving {
            store: config.clone(),
            pgop_binary: pgop.clone(),
        };
        let node = Node::primary(&dir.0, "src-1", archiving).await;
        node.exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
            .await;
        Self {
            dir,
            s3,
            pgop,
            config,
            node,
        }
    }
}

/// Where a test request goes: a manager's plain read-only port, or its mutual-TLS port
/// with the client configuration of the operator's certificate.
#[derive(Clone)]
struct Endpoint {
    port: u16,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Endpoint {
    fn plain(port: u16) -> Self {
        Self { port, tls: None }
    }
}

/// The manager's endpoints of `node` on free loopback ports: the read-only plain port
/// (`http::bind`) and the mutual-TLS port (`http::bind_tls`), with a certificate
/// authority made for the test and a client certificate as the operator holds one.
struct Served {
    /// The TLS port, as the operator reaches it.
    target: Endpoint,
    /// The plain, read-only port.
    plain: u16,
    authority: pgop_tls::Authority,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
    servers: Vec<tokio::task::JoinHandle<Result<(), pgop_instance::http::Error>>>,
    _material: std::sync::Arc<pgop_instance::tls::Material>,
}

impl Served {
    async fn start(node: &Node) -> Self {
        let now = jiff::Timestamp::now();
        let authority = pgop_tls::Authority::generate(now).expect("an authority");
        let server = authority
            .issue(pgop_tls::Usage::ManagerServer, now, 1)
            .expect("a manager certificate");
        let (material, tls) = pgop_instance::tls::Material::new();
        material
            .load(&server.cert_pem, &server.key_pem, authority.cert_pem())
            .expect("load the manager certificate");
        let client = authority
            .issue(pgop_tls::Usage::OperatorClient, now, 1)
            .expect("an operator certificate");
        let client =
            pgop_tls::client_config(authority.cert_pem(), &client.cert_pem, &client.key_pem)
                .expect("the operator's client configuration");
        let (stop_tls, tls_stopped) = tokio::sync::oneshot::channel::<()>();
        let (tls_addr, tls_server) = pgop_instance::http::bind_tls(
            "127.0.0.1:0".parse().expect("address"),
            node.instance.clone(),
            tls,
            async move {
                let _ = tls_stopped.await;
            },
        )
        .await
        .expect("bind the manager's TLS endpoint");
        let (stop_plain, plain_stopped) = tokio::sync::oneshot::channel::<()>();
        let (plain_addr, plain_server) = pgop_instance::http::bind(
            "127.0.0.1:0".parse().expect("address"),
            node.instance.clone(),
            async move {
                let _ = plain_stopped.await;
            },
        )
        .await
        .expect("bind the manager's plain endpoint");
        Self {
            target: Endpoint {
                port: tls_addr.port(),
                tls: Some(client),
            },
            plain: plain_addr.port(),
            authority,
            stop: vec![stop_tls, stop_plain],
            servers: vec![tokio::spawn(tls_server), tokio::spawn(plain_server)],
            _material: material,
        }
    }

    async fn stop(self) {
        for stop in self.stop {
            let _ = stop.send(());
        }
        for server in self.servers {
            let _ = server.await;
        }
    }
}

async fn http(target: &Endpoint, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let host = format!("127.0.0.1:{}", target.port);
    let body = body.map(str::as_bytes);
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        match &target.tls {
            Some(tls) => {
                pgop_operator::cluster::probe::request_tls(tls, &host, method, path, body).await
            }
            None => pgop_operator::cluster::probe::request(&host, method, path, body).await,
        }
    })
    .await
    .expect("a response within 30 s");
    let (code, body) = answer.unwrap_or_else(|e| panic!("{method} {path} on {host}: {e}"));
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// `POST /pg/backups` is refused to every caller without the operator's certificate: on
/// the plain port there is no such route; on the TLS port the handshake fails for plain
/// HTTP, for a client without a certificate and for one of another authority; and no job
/// was started by any of them.
async fn refuses_unauthenticated_backups(served: &Served) {
    let body = Some(r#"{"name":"intruder"}"#);
    let (code, _) = http(&Endpoint::plain(served.plain), "POST", "/pg/backups", body).await;
    assert_eq!(code, 404, "the plain port has no state-changing route");
    let tls_host = format!("127.0.0.1:{}", served.target.port);
    let plain_to_tls = pgop_operator::cluster::probe::request(
        &tls_host,
        "POST",
        "/pg/backups",
        body.map(str::as_bytes),
    )
    .await;
    assert!(
        plain_to_tls.is_err(),
        "plain HTTP on the TLS port: {plain_to_tls:?}"
    );
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(
            served.authority.cert_pem().as_bytes(),
        )
    {
        roots
            .add(cert.expect("the authority's certificate"))
            .expect("a root");
    }
    let anonymous = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let now = jiff::Timestamp::now();
    let other = pgop_tls::Authority::generate(now).expect("another authority");
    let stranger = other
        .issue(pgop_tls::Usage::OperatorClient, now, 1)
        .expect("a certificate of another authority");
    let stranger = pgop_tls::client_config(
        served.authority.cert_pem(),
        &stranger.cert_pem,
        &stranger.key_pem,
    )
    .expect("a client configuration");
    for (who, config) in [
        ("no certificate", anonymous),
        ("another authority's", stranger),
    ] {
        let answer = pgop_operator::cluster::probe::request_tls(
            &config,
            &tls_host,
            "POST",
            "/pg/backups",
            body.map(str::as_bytes),
        )
        .await;
        assert!(answer.is_err(), "{who}: {answer:?}");
    }
    let (code, _) = http(&served.target, "GET", "/pg/backups/intruder", None).await;
    assert_eq!(code, 404, "no job was started");
}

fn job(body: &str) -> pgop_api::instance_status::BackupJob {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("a BackupJob ({e}): {body}"))
}

/// Polls `GET /pg/backups/<name>` until the job is no longer running.
async fn finished_job(port: &Endpoint, name: &str) -> pgop_api::instance_status::BackupJob {
    let start = Instant::now();
    loop {
        let (code, body) = http(port, "GET", &format!("/pg/backups/{name}"), None).await;
        assert_eq!(code, 200, "{body}");
        let job = job(&body);
        if job.phase != pgop_api::instance_status::BackupJobPhase::Running {
            return job;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "backup {name} still running: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_and_retention_on_request_through_the_managers_http_endpoint() {
    use pgop_api::instance_status::BackupJobPhase;
    let Primary {
        dir: _dir,
        s3: _s3,
        pgop,
        config,
        node,
    } = Primary::start("http").await;
    let archiving = Archiving {
        store: config.clone(),
        pgop_binary: pgop.clone(),
    };
    insert(&node, 1, 20_000).await;
    let served = Served::start(&node).await;
    let port = &served.target;

    // Nothing that changes state answers an unauthenticated caller.
    refuses_unauthenticated_backups(&served).await;

    let (code, _) = http(port, "GET", "/pg/backups/unknown", None).await;
    assert_eq!(code, 404, "a job this manager never ran");

    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b1"}"#)).await;
    assert_eq!(code, 202, "{body}");
    let started = job(&body);
    assert_eq!(started.name, "b1");
    assert_eq!(started.phase, BackupJobPhase::Running);
    assert!(started.started_at.parse::<jiff::Timestamp>().is_ok());

    // The same name again: the same job. Another name while it runs: 409.
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b1"}"#)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(job(&body).started_at, started.started_at);
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b2"}"#)).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("b1"), "names the running backup: {body}");

    let done = finished_job(port, "b1").await;
    assert_eq!(done.phase, BackupJobPhase::Completed, "{done:?}");
    let id = done.backup_id.clone().expect("backupId");
    assert!(
        done.begin_lsn.is_some() && done.end_lsn.is_some(),
        "{done:?}"
    );
    for time in [&done.begin_time, &done.end_time, &done.stopped_at] {
        let time = time.as_deref().expect("a time");
        assert!(time.parse::<jiff::Timestamp>().is_ok(), "RFC 3339: {time}");
    }
    assert_eq!(done.timeline, Some(1));
    assert!(done.size_bytes.unwrap_or(0) > 1_000_000, "{done:?}");
    assert!(done.stored_bytes.unwrap_or(0) > 0, "{done:?}");
    assert_eq!(done.error, None);
    let store = Store::open(&config).expect("open the store");
    assert!(
        store
            .footer(&format!("base/{id}/backup.manifest"))
            .await
            .expect("read the store")
            .is_some(),
        "the manifest of {id} is in the store"
    );
    let (completed, _) = pgop_backup::base::list(&store).await.expect("list");
    let manifest = completed
        .iter()
        .find(|m| m.backup_id == id)
        .expect("a completed backup");
    assert_eq!(done.end_lsn.as_deref(), Some(manifest.end_lsn.as_str()));
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b1"}"#)).await;
    assert_eq!(
        (code, job(&body)),
        (200, done.clone()),
        "idempotent once done"
    );

    // A logical backup through the same endpoint: pg_dump of every database.
    let (code, body) = http(
        port,
        "POST",
        "/pg/backups",
        Some(r#"{"name":"l1","method":"logical"}"#),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let dumped = finished_job(port, "l1").await;
    assert_eq!(dumped.phase, BackupJobPhase::Completed, "{dumped:?}");
    assert_eq!(dumped.method, pgop_api::backup::BackupMethod::Logical);
    assert!(
        dumped.databases.iter().any(|d| d == "postgres"),
        "{dumped:?}"
    );
    assert!(dumped.size_bytes.unwrap_or(0) > 0, "{dumped:?}");
    let logical_id = dumped.backup_id.clone().expect("backupId");
    let logical = pgop_backup::logical::list(&store).await.expect("list");
    assert!(
        logical.iter().any(|m| m.backup_id == logical_id),
        "{logical:?}"
    );

    // Retention through the manager: both backups are new, nothing goes; 0 days is refused.
    let (code, body) = http(
        port,
        "POST",
        "/pg/retention",
        Some(r#"{"retentionDays":1}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let removed: pgop_api::instance_status::RetentionDone =
        serde_json::from_str(&body).expect("a RetentionDone");
    // Only WAL from before the oldest backup's begin may go (the segments written while
    // the table was filled, before b1).
    assert!(
        removed.base_backups.is_empty() && removed.logical_backups.is_empty(),
        "{body}"
    );
    let (completed, _) = pgop_backup::base::list(&store).await.expect("list");
    assert!(completed.iter().any(|m| m.backup_id == id));
    let (code, body) = http(
        port,
        "POST",
        "/pg/retention",
        Some(r#"{"retentionDays":0}"#),
    )
    .await;
    assert_eq!(code, 400, "{body}");

    // A backup that fails: the error chain on the job.
    node.instance.set_archiving(Some(Archiving {
        store: StoreConfig::local("/proc/pgop-no-store-here", "src"),
        pgop_binary: pgop.clone(),
    }));
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b2"}"#)).await;
    assert_eq!(code, 202, "{body}");
    let failed = finished_job(port, "b2").await;
    assert_eq!(failed.phase, BackupJobPhase::Failed, "{failed:?}");
    assert!(
        failed.error.as_deref().is_some_and(|e| !e.is_empty()),
        "{failed:?}"
    );
    println!("a failed backup reports: {:?}", failed.error);

    // No store: 400 naming the field; a known name still answers its job.
    node.instance.set_archiving(None);
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b3"}"#)).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("spec.backup.store"), "{body}");
    let (code, _) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b1"}"#)).await;
    assert_eq!(code, 200);
    let (code, body) = http(
        port,
        "POST",
        "/pg/retention",
        Some(r#"{"retentionDays":1}"#),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("spec.backup.store"), "{body}");

    // PostgreSQL not running: 503.
    node.instance.set_archiving(Some(archiving));
    node.instance.stop().await.expect("stop PostgreSQL");
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"b3"}"#)).await;
    assert_eq!(code, 503, "{body}");

    served.stop().await;
}

/// `pgop instance run` as the pod `demo-1` of cluster `demo` (its PostgreSQL and its
/// process killed on drop), run from the copy of pgop PostgreSQL's user may execute.
struct RunningManager {
    child: Child,
    pgdata: PathBuf,
    http_port: u16,
    pg_port: u16,
}

impl RunningManager {
    fn spawn(plane: &pgop_testenv::ControlPlane, namespace: &str, dir: &Path, pgop: &Path) -> Self {
        let data = dir.join("demo-data");
        let run = dir.join("demo-run");
        make_dir(&data);
        make_dir(&run);
        let (http_port, pg_port) = (free_port(), free_port());
        let child = Command::new(pgop)
            .args(["instance", "run", "--resync", "1"])
            .env("KUBECONFIG", plane.kubeconfig())
            .env("POD_NAME", "demo-1")
            .env("POD_NAMESPACE", namespace)
            .env("POD_IP", "127.0.0.1")
            .env("PGOP_CLUSTER", "demo")
            .env("PGDATA", data.join("pgdata"))
            .env("PGOP_SOCKET_DIR", &run)
            .env("PGOP_PG_PORT", pg_port.to_string())
            .env("PGOP_LISTEN", format!("127.0.0.1:{http_port}"))
            .env("PGOP_STOP_TIMEOUT", "3")
            // The major of this target (the operator sets it in every Pod).
            .env("PGOP_POSTGRES_MAJOR", super::pg::major().to_string())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("PGOP_TEST_LOGS").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("start pgop instance run");
        Self {
            child,
            pgdata: data.join("pgdata"),
            http_port,
            pg_port,
        }
    }

    async fn pg_status(&self) -> Option<serde_json::Value> {
        let connected = tokio::net::TcpStream::connect(("127.0.0.1", self.http_port)).await;
        drop(connected.ok()?);
        let (code, body) = http(&Endpoint::plain(self.http_port), "GET", "/pg/status", None).await;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    async fn app(&self, password: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(self.pg_port)
            .user("app")
            .password(password)
            .dbname("app")
            .ssl_mode(tokio_postgres::config::SslMode::Require)
            .connect(
                pgop_tls::postgres::PostgresTls::without_verification()
                    .expect("a TLS configuration"),
            )
            .await?;
        tokio::spawn(connection);
        Ok(client)
    }
}

impl Drop for RunningManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let pid = std::fs::read_to_string(self.pgdata.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// The operator's part played by the test: the Secrets, a PostgresCluster `demo` with
/// `spec.bootstrap.recovery` from cluster `src` in the store (and its own archiving to the
/// same store under its own name), the status naming `demo-1` the primary, and, later,
/// `status.recoverySource`. The manager waits for it, fails on a target the WAL never
/// reaches (visible on /pg/status, the data directory left empty), and, once the spec's
/// target is a time between two transactions, restores exactly the first on a new
/// timeline, with this cluster's app password and its own archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_bootstraps_by_restoring_the_recovery_source_to_a_point_in_time() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::Api;
    use kube::api::{Patch, PatchParams, PostParams};
    use pgop_api::PostgresCluster;

    let dir = TempDir::new("bootstrap");
    let s3 = S3Server::start(&dir.0);
    let pgop = pgop_binary(&dir.0);
    let source_config = s3.config("src");

    // The source cluster: a base backup, batch A, a point in time, batch B, all archived.
    let source = Node::primary(
        &dir.0,
        "src-1",
        Archiving {
            store: source_config.clone(),
            pgop_binary: pgop.clone(),
        },
    )
    .await;
    source
        .exec("CREATE TABLE t (id int PRIMARY KEY, v text); ALTER TABLE t OWNER TO app")
        .await;
    insert(&source, 1, 1000).await;
    let source_store = Store::open(&source_config).expect("open the store");
    pgop_backup::base::take(
        &source_store,
        &tools(),
        &source.source(),
        "src",
        &TakeOptions::default(),
    )
    .await
    .expect("base backup");
    insert(&source, 1001, 2000).await;
    let fingerprint_a = source.fingerprint().await;
    let between: String = source
        .sql()
        .await
        .query_one(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            &[],
        )
        .await
        .expect("now")
        .get(0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    insert(&source, 2001, 3000).await;
    let last = source.switch_wal().await;
    source.wait_archived(&last, Duration::from_secs(60)).await;
    drop(source);

    let plane = pgop_testenv::shared().await.expect("testenv");
    let client = plane.client().expect("client");
    common::install_crds(&client).await.expect("CRDs");
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "restore-bootstrap")
        .await
        .expect("namespace");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
    let pp = PostParams::default();
    for s in [
        secret(
            "demo-app",
            &[
                ("username", "app"),
                ("password", "new-app-password"),
                ("dbname", "app"),
            ],
        ),
        secret(
            "demo-replication",
            &[("username", "streaming_replica"), ("password", "new-repl")],
        ),
        secret(
            "s3-creds",
            &[
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ],
        ),
    ]
    .into_iter()
    .chain(common::postgres_tls_secrets("demo").1)
    {
        secrets.create(&pp, &s).await.expect("a Secret");
    }
    let store = serde_json::json!({"s3": {
        "bucket": BUCKET, "endpoint": s3.endpoint(),
        "region": "us-east-1", "path": "tests/pgop",
        "credentialsSecret": {"name": "s3-creds"},
    }});
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), ns.name());
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "demo"},
        "spec": {
            "replicas": 1, "storage": {"size": "1Gi"},
            "backup": {"store": store},
            "bootstrap": {"recovery": {"store": store, "sourceCluster": "src",
                                       "targetTime": "2999-01-01T00:00:00Z"}},
        },
    }))
    .expect("a PostgresCluster");
    clusters.create(&pp, &cluster).await.expect("create demo");
    let status = |s: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch_status(
                    "demo",
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({ "status": s })),
                )
                .await
                .expect("patch the status");
        }
    };
    status(serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1"})).await;

    let manager = RunningManager::spawn(plane, ns.name(), &dir.0, &pgop);
    // Named the primary, but no recoverySource yet: it waits (no initdb).
    eventually("the manager's /pg/status", Duration::from_secs(30), || {
        manager.pg_status()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !manager.pgdata.join("PG_VERSION").exists(),
        "neither initdb nor a restore before status.recoverySource"
    );

    // The operator resolves the source; the target is after the end of the WAL: the
    // restore fails, visibly, and leaves no data.
    status(serde_json::json!({"recoverySource": {"cluster": "src", "store": store}})).await;
    let error = eventually(
        "bootstrapError on /pg/status",
        Duration::from_secs(120),
        || async {
            let status = manager.pg_status().await?;
            status["bootstrapError"].as_str().map(str::to_string)
        },
    )
    .await;
    assert!(
        error.contains("recovery ended before configured recovery target was reached"),
        "{error}"
    );
    assert!(
        !manager.pgdata.join("PG_VERSION").exists(),
        "a failed restore leaves no data directory to start"
    );

    // The target between the two batches: retried after the back-off, exactly batch A.
    let started = Instant::now();
    let target = serde_json::json!({"spec": {"bootstrap": {"recovery": {"targetTime": between}}}});
    clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(&target))
        .await
        .expect("patch the target");
    let status = eventually(
        "the restored primary, with the new app password",
        Duration::from_secs(180),
        || async {
            let status = manager.pg_status().await?;
            (status["role"] == "primary").then_some(())?;
            manager.app("new-app-password").await.ok()?;
            Some(status)
        },
    )
    .await;
    println!(
        "restored and running as the primary {:?} after the target was fixed",
        started.elapsed()
    );
    assert_eq!(status["timeline"], 2, "a new timeline: {status}");
    assert!(status.get("bootstrapError").is_none(), "{status}");
    let app = manager
        .app("new-app-password")
        .await
        .expect("the new cluster's app password works");
    let row = app
        .query_one(
            "SELECT count(*), md5(coalesce(string_agg(id::text || ':' || v, ',' ORDER BY id), '')) FROM t",
            &[],
        )
        .await
        .expect("fingerprint");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, String>(1)),
        fingerprint_a
    );
    assert!(
        manager.app("app-secret").await.is_err(),
        "the source's app password no longer works"
    );
    app.batch_execute("INSERT INTO t VALUES (5000, 'after the restore')")
        .await
        .expect("writes on the new primary");

    // Its own archive: the new timeline's history file and WAL under `demo`, nothing of
    // timeline 2 under the source's name.
    let own = Store::open(&s3.config("demo")).expect("open the store");
    let history = pgop_backup::WalName::parse("00000002.history").expect("history name");
    eventually(
        "00000002.history archived under demo",
        Duration::from_secs(60),
        || async {
            pgop_backup::wal::exists(&own, &history)
                .await
                .ok()
                .filter(|e| *e)
        },
    )
    .await;
    let switched: String = app
        .query_one("SELECT pg_walfile_name(pg_current_wal_lsn())", &[])
        .await
        .expect("current WAL")
        .get(0);
    drop(app);
    let superuser = tokio_postgres::Config::new()
        .host_path(dir.0.join("demo-run"))
        .port(manager.pg_port)
        .user("postgres")
        .dbname("postgres")
        .connect(tokio_postgres::NoTls)
        .await;
    let (c, connection) = superuser.expect("superuser over the socket");
    tokio::spawn(connection);
    c.batch_execute("SELECT pg_switch_wal()")
        .await
        .expect("switch");
    let segment = pgop_backup::WalName::parse(&switched).expect("segment name");
    eventually(
        "timeline 2 WAL archived under demo",
        Duration::from_secs(60),
        || async {
            pgop_backup::wal::exists(&own, &segment)
                .await
                .ok()
                .filter(|e| *e)
        },
    )
    .await;
    assert!(
        source_store
            .list("wal/00000002/")
            .await
            .expect("list the source's WAL")
            .is_empty(),
        "nothing of the new timeline in the source's archive"
    );

    drop(manager);
    ns.delete().await.expect("delete the namespace");
}

/// Processes whose command line mentions `needle` (the scratch server would).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(cmdline);
            }
        }
    }
    found
}

/// What is left next to PGDATA (only `pgdata` itself once a check is over).
fn next_to_pgdata(node_data: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(node_data)
        .expect("the data volume")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_requested_with_verify_is_restored_and_checked_before_it_completes() {
    use pgop_api::instance_status::BackupJobPhase;
    let Primary {
        dir,
        s3: _s3,
        pgop: _pgop,
        config: _config,
        node,
    } = Primary::start("verify-http").await;
    let node_data = dir.0.join("src-1-data");
    insert(&node, 1, 20_000).await;
    let served = Served::start(&node).await;
    let port = &served.target;

    // verify: true — the job stays running through the check, then completes verified.
    let start = Instant::now();
    let (code, body) = http(
        port,
        "POST",
        "/pg/backups",
        Some(r#"{"name":"v1","verify":true}"#),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let mut saw_checking = false;
    let done = loop {
        let (code, body) = http(port, "GET", "/pg/backups/v1", None).await;
        assert_eq!(code, 200, "{body}");
        let job = job(&body);
        if job.phase != BackupJobPhase::Running {
            break job;
        }
        if let Some(id) = &job.backup_id {
            // The backup is taken, the check runs: its scratch copy is next to PGDATA.
            saw_checking |= node_data.join(format!("verify-{id}")).exists();
        }
        assert!(start.elapsed() < Duration::from_secs(180), "{job:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = start.elapsed();
    println!("backup + restore check in {took:?}: {done:?}");
    assert_eq!(done.phase, BackupJobPhase::Completed, "{done:?}");
    assert_eq!(done.error, None);
    assert_eq!(done.verified, Some(true), "{done:?}");
    let summary = done.verification.clone().expect("a verification summary");
    let end_lsn = done.end_lsn.clone().expect("endLsn");
    assert!(
        summary.contains(&format!("restored to {end_lsn}")),
        "{summary}"
    );
    let blocks: u64 = summary
        .split(" blocks")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a block count: {summary}"));
    // 20 000 rows alone take > 100 pages; the catalog many more.
    assert!(blocks > 1000, "{summary}");
    assert!(summary.contains("no checksum failure"), "{summary}");
    println!("saw the scratch copy while the job ran: {saw_checking}");
    let id = done.backup_id.clone().expect("backupId");
    assert_eq!(next_to_pgdata(&node_data), vec!["pgdata".to_string()]);
    assert!(
        processes_mentioning(&format!("verify-{id}")).is_empty(),
        "no scratch server left running"
    );
    assert!(
        !node.socket_dir.join("pgop-verify-store.json").exists(),
        "the store configuration for restore_command is removed"
    );
    assert!(
        !node.socket_dir.join("pgop-verify").exists(),
        "the temporary server's socket directory is removed"
    );
    // The instance's own server was never disturbed.
    insert(&node, 20_001, 20_010).await;
    assert_eq!(node.fingerprint().await.0, 20_010);

    // verify absent (false): no check, `verified` stays unset.
    let start = Instant::now();
    let (code, body) = http(port, "POST", "/pg/backups", Some(r#"{"name":"v2"}"#)).await;
    assert_eq!(code, 202, "{body}");
    let plain = finished_job(port, "v2").await;
    println!("backup without check in {:?}", start.elapsed());
    assert_eq!(plain.phase, BackupJobPhase::Completed, "{plain:?}");
    assert_eq!((plain.verified, plain.verification), (None, None));
    let (code, body) = http(
        port,
        "POST",
        "/pg/backups",
        Some(r#"{"name":"v3","verify":false}"#),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let plain = finished_job(port, "v3").await;
    assert_eq!(plain.phase, BackupJobPhase::Completed, "{plain:?}");
    assert_eq!((plain.verified, plain.verification), (None, None));
    assert_eq!(next_to_pgdata(&node_data), vec!["pgdata".to_string()]);

    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_restore_check_of_a_corrupt_base_object_fails_naming_it() {
    let Primary {
        dir,
        s3,
        pgop: _pgop,
        config,
        node,
    } = Primary::start("verify-corrupt").await;
    let node_data = dir.0.join("src-1-data");
    insert(&node, 1, 5000).await;
    let store = Store::open(&config).expect("open the store");
    let manifest = pgop_backup::base::take(
        &store,
        &tools(),
        &node.source(),
        "src",
        &TakeOptions::default(),
    )
    .await
    .expect("base backup");
    let id = manifest.backup_id.clone();

    // A scratch copy left by an interrupted check is swept; the healthy backup passes.
    let stale = node_data.join("verify-19990101T000000Z");
    make_dir(&stale);
    std::fs::write(stale.join("junk"), b"x").expect("a stale file");
    let start = Instant::now();
    let verified = node
        .instance
        .verify_backup(&id)
        .await
        .unwrap_or_else(|e| panic!("{}", pgop_api::error_chain(&e)));
    println!(
        "restore check of a healthy backup in {:?}: {}",
        start.elapsed(),
        verified.summary()
    );
    assert!(verified.blocks > 0 && verified.files > 0, "{verified:?}");
    assert_eq!(next_to_pgdata(&node_data), vec!["pgdata".to_string()]);

    // One byte of the stored base tar flipped.
    let tar_key = format!("base/{id}/base.tar.gz");
    flip_byte(&s3.object_file(&config, &tar_key), None);
    let start = Instant::now();
    let err = node
        .instance
        .verify_backup(&id)
        .await
        .expect_err("a corrupt base tar");
    let shown = pgop_api::error_chain(&err);
    println!(
        "restore check of a corrupt backup in {:?}: {shown}",
        start.elapsed()
    );
    assert!(
        shown.contains(&tar_key) && shown.contains("SHA-256") && shown.contains(&id),
        "the reason names the object: {shown}"
    );
    assert_eq!(next_to_pgdata(&node_data), vec!["pgdata".to_string()]);
    assert!(processes_mentioning(&format!("verify-{id}")).is_empty());
    assert!(!node.socket_dir.join("pgop-verify").exists());

    // An id the store does not have.
    let err = node
        .instance
        .verify_backup("20000101T000000Z")
        .await
        .expect_err("an unknown backup");
    assert!(
        pgop_api::error_chain(&err).contains("20000101T000000Z"),
        "{err}"
    );
}

/// This target's PostgreSQL: 15, or 18 when compiled as the `*18` twin.
#[test]
fn the_binaries_are_of_the_major_this_module_names() {
    super::pg::check_binaries_of_this_module();
}
